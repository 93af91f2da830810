"""Verify gate for a packed-shard directory (SPEC §6).

Refuses a directory without ``_SUCCESS``; checks the sentinel's tokenizer sha256 and
vocabulary size against the snapshot tokenizer (given, or found in the sibling
``tokenizer/tokenizer_manifest.json`` of a snapshot layout); checks every listed file
exists with the recorded sha256, that no unlisted shard is present, and that every row of
every file satisfies the row contract twice: the pandera schema
(:mod:`megacpp_checks.schemas.packed`) and :func:`megacpp_core.pack.check_rows`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from megacpp_core import pack
from megacpp_core import tokenizer as tk
from megacpp_core.tables import sha256_file

from .schemas.packed import validate_packed
from .verify import VerifyReport


def snapshot_tokenizer(path: Path) -> tuple[str | None, int | None]:
    """(sha256, vocab size) from ``PATH/../tokenizer/tokenizer_manifest.json`` or (None, None)."""
    m = Path(path).parent / "tokenizer" / tk.MANIFEST_FILE
    if not m.is_file():
        return None, None
    info = json.loads(m.read_text())
    return info.get("tokenizer_sha256"), info.get("vocab_size")


def verify_packed_dir(path: Path, out: Callable[[str], None] = print, *,
                      tokenizer_sha256: str | None = None, vocab_size: int | None = None) -> VerifyReport:
    """Run the packed-shard gate; every failure names the file and the rule.

    ``tokenizer_sha256``/``vocab_size`` default to the snapshot's tokenizer manifest next
    to ``path`` (when there is one); a sentinel recording another tokenizer fails.
    """
    path = Path(path)
    failures: list[str] = []
    if tokenizer_sha256 is None and vocab_size is None:
        tokenizer_sha256, vocab_size = snapshot_tokenizer(path)
    try:
        sentinel = pack.read_success(path, tokenizer_sha256, vocab_size)
    except (pack.IncompleteShardsError, pack.TokenizerMismatchError) as e:
        out(f"FAIL {e}")
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
        table = pq.read_table(fp)
        ok, detail = validate_packed(table, sentinel["row_length"], sentinel["vocab_size"], tk.BOS_ID, tk.PAD_ID, where=str(fp))
        if not ok:
            failures.append(detail)
            continue
        try:
            s = pack.check_rows(table, sentinel["row_length"], sentinel["vocab_size"], tk.BOS_ID, tk.PAD_ID, where=str(fp))
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
