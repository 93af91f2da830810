"""Measure the raw C/C++ bytes of a corpus snapshot manifest (before any stage-1 filter).

Every source is acquired through :func:`megacpp_core.acquire.acquire_source` (the same
fetch, pin check, cache and safe reading as stage 0; cached sources need no network) and
its files are counted by the manifest's extension whitelist (``settings.extensions``,
SPEC §4 default ``.c .h .cc .cpp .cxx .c++ .hh .hpp .hxx .h++ .inl .ipp .tpp .cu .cuh``,
matched case-insensitively as the quality stage does). Sources are read one at a time and
dropped after counting, so memory holds one revision at most.

Prints one JSON object: ``manifest``, ``sources`` (per source: ``name``, ``kind``,
``version``, ``revision``, ``files``, ``bytes`` — every file of the revision —,
``cpp_files``, ``cpp_bytes``, ``default_limits_ok``; ``error`` instead of the counts when
the source cannot be acquired; and, when the default
:class:`~megacpp_core.acquire.ArchiveLimits` refuse the revision, ``refused`` with the
rule; such a source is then measured with the limits raised by ``--max-entries`` /
``--max-total-bytes``), and the totals ``cpp_bytes``, ``cpp_files``, ``bytes``, ``files``.

Usage::

    python bench/corpus_size.py MANIFEST [--cache DIR] [--sources a,b] [--max-entries N] [--max-total-bytes N]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path

from megacpp_core import acquire
from megacpp_core.manifest import PROJECT_ROOT, load_manifest


def measure(manifest: str, cache: Path, only: set[str] | None, raised: acquire.ArchiveLimits) -> dict:
    """The JSON document described in the module docstring."""
    m = load_manifest(manifest)
    exts = tuple(e.lower() for e in m.settings.extensions)
    rows = []
    for s in m.sources:
        if only and s.name not in only:
            continue
        row = {"name": s.name, "kind": s.kind, "version": s.version, "default_limits_ok": True}
        try:
            try:
                got = acquire.acquire_source(s, cache)
            except acquire.UnsafeArchiveError as e:
                row["default_limits_ok"], row["refused"] = False, str(e)
                got = acquire.acquire_source(s, cache, raised)
        except acquire.AcquireError as e:  # not fetchable here: reported, not counted
            row["error"] = str(e)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            continue
        cpp = [len(b) for p, b in got.files if os.path.splitext(p)[1].lower() in exts]
        row.update(revision=got.revision, files=len(got.files), bytes=sum(len(b) for _, b in got.files),
                   cpp_files=len(cpp), cpp_bytes=sum(cpp))
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        del got, cpp
        gc.collect()
    total = {k: sum(r.get(k, 0) for r in rows) for k in ("cpp_bytes", "cpp_files", "bytes", "files")}
    return {"manifest": m.name, "sources": rows, **total}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("manifest", help="shipped manifest name or path")
    ap.add_argument("--cache", default=str(PROJECT_ROOT / "data" / "cache"), help="content-addressed cache directory")
    ap.add_argument("--sources", default="", help="comma-separated source names (default: all)")
    ap.add_argument("--max-entries", type=int, default=1_000_000, help="entry limit when the default refuses a source")
    ap.add_argument("--max-total-bytes", type=int, default=8 << 30, help="size limit when the default refuses a source")
    a = ap.parse_args(argv)
    raised = acquire.ArchiveLimits(max_entries=a.max_entries, max_total_bytes=a.max_total_bytes)
    only = {x for x in a.sources.split(",") if x} or None
    print(json.dumps(measure(a.manifest, Path(a.cache), only, raised), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
