"""Verify gate for a packed-shard directory (SPEC §6).

Refuses a directory without ``_SUCCESS``; checks every listed file exists with the
recorded sha256, that no unlisted shard is present, and that every row of every file
satisfies the row contract (:func:`megacpp_core.pack.check_rows`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from megacpp_core import pack
from megacpp_core import tokenizer as tk
from megacpp_core.tables import sha256_file

from .verify import VerifyReport


def verify_packed_dir(path: Path, out: Callable[[str], None] = print) -> VerifyReport:
    """Run the packed-shard gate; every failure names the file and the rule."""
    path = Path(path)
    failures: list[str] = []
    try:
        sentinel = pack.read_success(path)
    except pack.IncompleteShardsError as e:
        return VerifyReport(False, [str(e)])
    listed = {f["file"] for f in sentinel["files"]}
    for extra in sorted(p.name for p in path.glob("*.parquet") if p.name not in listed):
        failures.append(f"{path / extra}: shard not listed in {pack.SUCCESS}")
    rows = tokens = 0
    for f in sentinel["files"]:
        fp = path / f["file"]
        if not fp.exists():
            failures.append(f"{fp}: missing (listed in {pack.SUCCESS})")
            continue
        if sha256_file(fp) != f["sha256"]:
            failures.append(f"{fp}: sha256 differs from {pack.SUCCESS}")
            continue
        try:
            s = pack.check_rows(pq.read_table(fp), sentinel["row_length"], sentinel["vocab_size"], tk.BOS_ID, tk.PAD_ID, where=str(fp))
            rows += s["rows"]
            tokens += s["tokens"]
        except pack.RowContractError as e:
            failures.append(str(e))
    if rows != sentinel["rows"] and not failures:
        failures.append(f"{path}: {rows} rows found, {pack.SUCCESS} records {sentinel['rows']}")
    for msg in failures:
        out(f"FAIL {msg}")
    if not failures:
        out(f"OK {path}: {rows} rows, {tokens} tokens, row length {sentinel['row_length']}, vocab {sentinel['vocab_size']}")
    return VerifyReport(not failures, failures, {"rows": rows, "tokens": tokens})
