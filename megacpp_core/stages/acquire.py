"""Stage 0 — acquire: the pinned source fetched by kind, hash-checked, read safely (SPEC §3).

Per repo revision. Output: ``source_files`` (one row per file with provenance and raw
bytes). The domain logic (kinds, cache, safe extraction) is :mod:`megacpp_core.acquire`;
nothing from the source is built or run. A fetch, pin or safe-extraction failure, or a
source without a single C/C++ file (an empty directory, an archive of other files),
raises before anything is committed for the partition.
"""

from __future__ import annotations

import pyarrow.compute as pc

from .. import acquire, catalog
from ..stage import Partitioning, Result, Stage, StageError
from ..tables import value_counts


def compute(ctx) -> Result:
    source = ctx.source
    acquired = acquire.acquire_source(source, ctx.cache_dir)
    if not any(acquire.language_of(p) for p, _ in acquired.files):
        exts = " ".join(sorted(acquire.LANGUAGE_BY_EXTENSION))
        raise StageError(f"source {source.name!r} ({source.kind} {acquired.origin}) holds no C/C++ file: "
                         f"{len(acquired.files)} files, none with an extension of {exts}; refused at stage 0")
    table = acquire.source_files_table(ctx.snapshot, source, acquired)
    figures = {
        "source": source.name, "kind": source.kind, "version": source.version,
        "archive": acquired.origin, "revision": acquired.revision,
        "archive_sha256": acquired.archive_sha256 or acquired.revision,
        "from_cache": acquired.from_cache, "pin_ok": acquired.pin_ok, "source_pin": source.settings_key(),
        "files": table.num_rows, "bytes": int(pc.sum(table.column("size")).as_py() or 0),
        "languages": value_counts(table.column("language")),
    }
    return Result({"source_files": table}, figures)


def hash_matches_pin(g):
    """The fetched bytes (or resolved commit) are the pinned ones."""
    f = g.figures
    return bool(f["pin_ok"]), f"{f['kind']} revision {f['revision']}"


STAGE = Stage(
    name="acquire", asset="source_files", partitioning=Partitioning.REVISION, compute=compute, code_version="1",
    description="Stage 0: the pinned source fetched by kind (pypi sdist, git tag, archive, local directory), "
                "hash-checked, cached by content and read under safe-extraction rules; never built.",
    outputs=(catalog.SOURCE_FILES,), gates=(hash_matches_pin,), reads_source_pin=True,
    figures=("source", "kind", "version", "archive", "revision", "archive_sha256", "from_cache", "pin_ok",
             "source_pin", "files", "bytes", "languages"),
)
