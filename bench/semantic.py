"""Benchmark of the libclang semantic lane on llama.cpp (prints one JSON object).

    .venv/bin/python bench/semantic.py [--limit N] [--workers 2] [--timeout 60]
                                       [--data-root DATA_ROOT | --cache data/cache]

Input: the ``llama-cpp-python-0.3.36`` source of the ``large`` corpus manifest, read through
``megacpp_core.acquire`` from the content-addressed cache (fetched when missing; the cache is
``DATA_ROOT/cache`` with ``--data-root``, else ``--cache``). Its compile command database is
built over the whole source (:func:`megacpp_core.compile_commands.build_database`: no
``compile_commands.json`` is shipped, so it is synthesized), the C/C++ files are
materialized in a temporary directory, and the lane (:func:`megacpp_core.semantic.run_semantic`)
parses the translation units under ``vendor/llama.cpp/`` (``--prefix``) — all of them, or
with ``--limit N`` a deterministic spread of N (every k-th in path order).

Reported: ``tus_per_second_per_process`` (TUs / wall seconds / workers, worker start-up
included), ``tus_per_parse_second`` (TUs / summed worker parse-and-walk seconds),
``tu_coverage`` (share of TUs without fatal error, timeout or crash), ``call_coverage``
(resolved / seen call sites) and ``call_coverage_tree`` (resolved into the tree),
``peak_rss_mb_per_worker`` (peak ``ru_maxrss`` of each worker process, MiB), timeouts,
crashes, statuses, edges by kind, a per-area breakdown (first directory under the prefix)
and the most frequent first error of fatal TUs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from megacpp_core import acquire  # noqa: E402
from megacpp_core import compile_commands as cc  # noqa: E402
from megacpp_core import semantic  # noqa: E402
from megacpp_core.manifest import load_manifest  # noqa: E402


def spread(entries: list[dict], limit: int) -> list[dict]:
    """Every k-th entry (path order) so that at most ``limit`` remain; all when limit ≤ 0."""
    if limit <= 0 or limit >= len(entries):
        return entries
    step = len(entries) / limit
    return [entries[int(i * step)] for i in range(limit)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default="large")
    ap.add_argument("--source", default="llama-cpp-python-0.3.36")
    ap.add_argument("--prefix", default="vendor/llama.cpp/")
    ap.add_argument("--data-root", default=None, help="use DATA_ROOT/cache as the archive cache")
    ap.add_argument("--cache", default=str(PROJECT / "data" / "cache"))
    ap.add_argument("--limit", type=int, default=0, help="parse a deterministic spread of N TUs (0: all)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0, help="per-TU timeout, seconds")
    ap.add_argument("--cuda-mode", default="c++", choices=sorted(cc.CUDA_MODES))
    args = ap.parse_args(argv)

    cache = Path(args.data_root) / "cache" if args.data_root else Path(args.cache)
    src = next(s for s in load_manifest(args.corpus).sources if s.name == args.source)
    got = acquire.acquire_source(src, cache)
    db = cc.build_database(got.files, got.revision, cuda_mode=args.cuda_mode)
    in_prefix = [e for e in db.entries if e["file"].startswith(args.prefix)]
    chosen = spread(in_prefix, args.limit)
    run_db = dataclasses.replace(db, entries=chosen)

    tmp = Path(tempfile.mkdtemp(prefix="megacpp-semantic-bench-"))
    try:
        tree = tmp / "tree"
        written = semantic.materialize_tree(got.files, tree, db)
        t0 = time.monotonic()
        res = semantic.run_semantic(tree, run_db, workers=args.workers, timeout_s=args.timeout)
        wall = time.monotonic() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    f = res.figures
    rows = res.build_info.to_pylist()
    areas: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        rest = r["file"][len(args.prefix):]
        area = rest.split("/", 1)[0] if "/" in rest else "."
        if area == "ggml":  # ggml/src/<backend>/…: one area per backend
            parts = rest.split("/")
            area = "/".join(parts[:3]) if len(parts) > 3 else "/".join(parts[:2])
        a = areas[area]
        a["tus"] += 1
        a["covered"] += r["status"] in ("ok", "errors")
        a["call_sites"] += r["call_sites"]
        a["calls_resolved"] += r["calls_resolved"]
    fatal_reasons = Counter((r["message"] or "")[:90] for r in rows if r["status"] == "fatal")
    parse_s = f["parse_seconds"]
    out = {
        "source": args.source,
        "revision": got.revision,
        "prefix": args.prefix,
        "database": {"shipped": db.shipped, "entries": len(db.entries), "include_dirs": db.figures.get("include_dirs"),
                     "inputs_sha256": db.inputs_sha256, "cuda_mode": args.cuda_mode},
        "files_materialized": len(written),
        "tus_under_prefix": len(in_prefix),
        "tus_run": len(chosen),
        "limit": args.limit or None,
        "workers": args.workers,
        "timeout_s": args.timeout,
        "wall_seconds": round(wall, 2),
        "tus_per_second_per_process": f["tus_per_second_per_process"],
        "tus_per_parse_second": round(len(chosen) / parse_s, 4) if parse_s else None,
        "tu_coverage": f["tu_coverage"],
        "call_coverage": f["call_coverage"],
        "call_coverage_tree": f["call_coverage_tree"],
        "call_sites": f["call_sites"],
        "calls_resolved": f["calls_resolved"],
        "calls_resolved_tree": f["calls_resolved_tree"],
        "peak_rss_mb_per_worker": f["peak_rss_mb_per_worker"],
        "peak_rss_mb_max": f["peak_rss_mb_max"],
        "statuses": {s: f[f"tus_{s}"] for s in semantic.STATUSES},
        "timeouts": f["tus_timeout"],
        "crashes": f["tus_crashed"],
        "worker_processes": f["worker_processes"],
        "edges": {"total": f["edges"], "call": f["edges_call"], "type": f["edges_type"], "include": f["edges_include"]},
        "areas": {k: {"tus": v["tus"], "tu_coverage": round(v["covered"] / v["tus"], 3),
                      "call_coverage": round(v["calls_resolved"] / v["call_sites"], 3) if v["call_sites"] else None}
                  for k, v in sorted(areas.items())},
        "top_fatal_first_errors": fatal_reasons.most_common(8),
        "system_include_dirs": f["system_include_dirs"],
        "cuda_include_dirs": f["cuda_include_dirs"],
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
