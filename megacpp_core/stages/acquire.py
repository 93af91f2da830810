"""Stage 0 — acquire: the pinned source fetched by kind, hash-checked, read safely (SPEC §3).

Per repo revision; this stage decides the revision's shards (:mod:`megacpp_core.sharding`,
``settings.shard_bytes``). Outputs: ``source_files`` per shard (one row per file with
provenance and raw bytes), ``license_texts`` (the revision's license files, which every
shard's license scan reads) and the ``shard_plan``. The domain logic (kinds, cache, safe extraction) is :mod:`megacpp_core.acquire`;
nothing from the source is built or run. A fetch, pin or safe-extraction failure, or a
source without a single C/C++ file (an empty directory, an archive of other files),
raises before anything is committed for the partition.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from .. import acquire, catalog, sharding
from ..stage import Partitioning, PerShard, Result, Stage, StageError
from ..tables import value_counts

def compute(ctx) -> Result:
    source = ctx.source
    acquired = acquire.acquire_source(source, ctx.cache_dir)
    if not any(acquire.language_of(p) for p, _ in acquired.files):
        exts = " ".join(sorted(acquire.LANGUAGE_BY_EXTENSION))
        raise StageError(f"source {source.name!r} ({source.kind} {acquired.origin}) holds no C/C++ file: "
                         f"{len(acquired.files)} files, none with an extension of {exts}; refused at stage 0")
    table = acquire.source_files_table(ctx.snapshot, source, acquired)
    n, shard_of = sharding.assign(table.column("path").to_pylist(), table.column("size").to_pylist(),
                                  ctx.settings.shard_bytes)
    shard_col = pa.array(shard_of, type=pa.int32())
    shards, files, nbytes = {}, [], []
    for i in range(n):
        part = table.filter(pc.equal(shard_col, i))
        shards[sharding.shard_key(i)] = part
        files.append(part.num_rows)
        nbytes.append(int(pc.sum(part.column("size")).as_py() or 0))
    revision = table.column("revision")[0].as_py() if table.num_rows else ""
    plan = sharding.plan(source.name, revision, ctx.settings.shard_bytes, n, files, nbytes)
    figures = {
        "source": source.name, "kind": source.kind, "version": source.version,
        "archive": acquired.origin, "revision": acquired.revision,
        "archive_sha256": acquired.archive_sha256 or acquired.revision,
        "from_cache": acquired.from_cache, "pin_ok": acquired.pin_ok, "source_pin": source.settings_key(),
        "files": table.num_rows, "bytes": int(pc.sum(table.column("size")).as_py() or 0),
        "languages": value_counts(table.column("language")),
        "shards": n, "shard_bytes": ctx.settings.shard_bytes, "largest_shard_bytes": max(nbytes),
    }
    return Result({"source_files": PerShard(shards), "license_texts": acquire.license_texts_table(table), "shard_plan": plan},
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
