"""Benchmark of the project's parquet writer settings (prints one JSON object).

    python bench/parquet_writer.py --data-root DIR [--snapshot default] [--repeat 3]

Input: every parquet file under ``snapshots/SNAPSHOT`` of ``--data-root`` (a data root
after ``megacpp run --corpus NAME``), read into memory before any timing.

Each file's table is written to memory by :func:`megacpp_core.tables.write_parquet_to`
(1,024-row row groups, the pipeline's default) twice per round, wall seconds, best of
``--repeat`` rounds per file:

``baseline``
    the writer as it was before: parquet-cpp's dictionary encoding on every column
    (``use_dictionary=True``, pyarrow's default);
``ours``
    the project's writer as it is (:func:`megacpp_core.tables.dictionary_columns`: the
    dictionary on the flat, non-payload columns alone).

Reported per output kind (the file name) and in total: seconds and bytes of both, and
``ours_over_baseline`` = baseline seconds / ours seconds (> 1: ours is faster),
``bytes_ratio`` = ours bytes / baseline bytes (< 1: ours is smaller). Every file written
by ours must read back to the table it was written from (``same_tables``).
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megacpp_core import tables  # noqa: E402


def _write(table, dictionary: bool) -> tuple[float, bytes]:
    """Seconds to write ``table`` with the project's writer, and the bytes; with
    ``dictionary`` the dictionary is on for every column (the baseline)."""
    sink = io.BytesIO()
    saved = tables.dictionary_columns
    if dictionary:
        tables.dictionary_columns = lambda schema: True
    try:
        t = time.perf_counter()
        tables.write_parquet_to(table, sink)
        return time.perf_counter() - t, sink.getvalue()
    finally:
        tables.dictionary_columns = saved


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-root", required=True)
    ap.add_argument("--snapshot", default="default")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    snap = Path(a.data_root) / "snapshots" / a.snapshot
    files = sorted(snap.rglob("*.parquet"))
    if not files:
        raise SystemExit(f"no parquet files under {snap}: run `megacpp run --corpus {a.snapshot}` first")
    loaded = [(f.name, pq.read_table(f)) for f in files]
    kinds: dict[str, dict] = collections.defaultdict(lambda: {"files": 0, "baseline_seconds": 0.0, "ours_seconds": 0.0,
                                                               "baseline_bytes": 0, "ours_bytes": 0})
    same = True
    for name, table in loaded:
        base_runs = [_write(table, True) for _ in range(a.repeat)]
        ours_runs = [_write(table, False) for _ in range(a.repeat)]
        base, ours = min(t for t, _ in base_runs), min(t for t, _ in ours_runs)
        base_bytes, ours_bytes = base_runs[0][1], ours_runs[0][1]  # the same bytes every run (deterministic)
        back = pq.read_table(io.BytesIO(ours_bytes))
        same = same and back.replace_schema_metadata(None).equals(table.replace_schema_metadata(None))
        k = kinds[name if "-0" not in name else name.split("-0")[0] + "-*.parquet"]
        k["files"] += 1
        k["baseline_seconds"] += base
        k["ours_seconds"] += ours
        k["baseline_bytes"] += len(base_bytes)
        k["ours_bytes"] += len(ours_bytes)

    def figures(k: dict) -> dict:
        out = {key: round(v, 4) if isinstance(v, float) else v for key, v in k.items()}
        out["ours_over_baseline"] = round(k["baseline_seconds"] / k["ours_seconds"], 3) if k["ours_seconds"] else None
        out["bytes_ratio"] = round(k["ours_bytes"] / k["baseline_bytes"], 3) if k["baseline_bytes"] else None
        return out

    total = {key: sum(k[key] for k in kinds.values()) for key in ("files", "baseline_seconds", "ours_seconds",
                                                                   "baseline_bytes", "ours_bytes")}
    result = {"snapshot": a.snapshot, "repeat": a.repeat, "same_tables": same, "total": figures(total),
              "by_kind": {name: figures(k) for name, k in sorted(kinds.items(), key=lambda x: -x[1]["baseline_bytes"])}}
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
