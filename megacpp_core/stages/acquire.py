"""Stage 0 — acquire: the pinned source fetched by kind, hash-checked, read safely (SPEC §3).

Per repo revision; this stage decides the revision's shards (:mod:`megacpp_core.sharding`,
``settings.shard_bytes``). Outputs: ``source_files`` per shard (one row per file with
provenance and raw bytes), ``license_texts`` (the revision's license files, which every
shard's license scan reads) and the ``shard_plan``. The domain logic (kinds, cache, safe
extraction) is :mod:`megacpp_core.acquire`; the shards are streamed to local files in
bounded batches (:mod:`megacpp_core.acquire_stream`: names and sizes first, then the
contents shard by shard), which the runner commits. Nothing from the source is built or
run. A fetch, pin or safe-extraction failure, or a source without a single C/C++ file (an
empty directory, an archive of other files), raises before anything is committed for the
partition.
"""

from __future__ import annotations

import pyarrow as pa

from .. import acquire, acquire_stream, catalog, sharding
from ..stage import Partitioning, PerShard, Result, Stage, StageError
from ..tables import value_counts


def compute(ctx) -> Result:
    source = ctx.source
    work = ctx.workdir("acquire-")
    with acquire_stream.open_tree(source, ctx.cache_dir, work / "spill") as (tree, got):
        if not any(acquire.language_of(p) for p in tree.paths):
            exts = " ".join(sorted(acquire.LANGUAGE_BY_EXTENSION))
            raise StageError(f"source {source.name!r} ({source.kind} {got.origin}) holds no C/C++ file: "
                             f"{len(tree.paths)} files, none with an extension of {exts}; refused at stage 0")
        shards = acquire_stream.write_shards(tree, ctx.snapshot, source, got, ctx.settings.shard_bytes, work / "shards")
        license_texts = acquire_stream.license_texts(tree)
        languages = value_counts(pa.array([acquire.language_of(p) for p in tree.paths], pa.string()))
        files, nbytes = len(tree.paths), sum(tree.sizes)
    plan = sharding.plan(source.name, got.revision, ctx.settings.shard_bytes, shards.n, shards.shard_files,
                         shards.shard_bytes)
    figures = {
        "source": source.name, "kind": source.kind, "version": source.version,
        "archive": got.origin, "revision": got.revision,
        "archive_sha256": got.archive_sha256 or got.revision,
        "from_cache": got.from_cache, "pin_ok": got.pin_ok, "source_pin": source.settings_key(),
        "files": files, "bytes": nbytes, "languages": languages,
        "shards": shards.n, "shard_bytes": ctx.settings.shard_bytes, "largest_shard_bytes": max(shards.shard_bytes),
    }
    return Result({"source_files": PerShard(dict(shards.files)), "license_texts": license_texts, "shard_plan": plan},
                  figures)


def hash_matches_pin(g):
    """The fetched bytes (or resolved commit) are the pinned ones."""
    f = g.figures
    return bool(f["pin_ok"]), f"{f['kind']} revision {f['revision']}"


STAGE = Stage(
    name="acquire", asset="source_files", partitioning=Partitioning.REVISION, compute=compute, code_version="1",
    description="Stage 0: the pinned source fetched by kind (pypi sdist, git tag, archive, local directory), "
                "hash-checked, cached by content and read under safe-extraction rules; never built.",
    outputs=(catalog.SOURCE_FILES, catalog.LICENSE_TEXTS, catalog.SHARD_PLAN), gates=(hash_matches_pin,),
    reads_source_pin=True, settings=("shard_bytes",),
    figures=("source", "kind", "version", "archive", "revision", "archive_sha256", "from_cache", "pin_ok",
             "source_pin", "files", "bytes", "languages", "shards", "shard_bytes", "largest_shard_bytes"),
)
