"""Verify gate for a packed-shard directory (SPEC §6), on a local path or any data-root URL.

Refuses a directory without ``_SUCCESS``; checks the sentinel's tokenizer sha256 and
vocabulary size against the snapshot tokenizer (given, or found in the sibling
``tokenizer/tokenizer_manifest.json`` of a snapshot layout); checks every listed file
exists with the recorded sha256, that no unlisted shard is present, and that every row of
every file satisfies the row contract twice: the pandera schema
(:mod:`megacpp_checks.schemas.packed`) and :func:`megacpp_core.pack.check_rows`.

Memory is :data:`CHECK_ROWS` rows of at most 8,192 tokens (fewer rows when rows are
longer: :func:`megacpp_core.pack_stream.check_batch_rows`), not a file or a row group (SPEC §6:
1,024 rows): the sha256 is streamed and the rows are read and checked that many at a time
(record batches of one row group at a time; the checks build ``(rows, L)`` matrices);
``pack_id`` uniqueness, the one rule across rows, is checked over the whole directory from
the ids alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from megacpp_core import pack, pack_stream
from megacpp_core import tokenizer as tk
from megacpp_core.storage import DataRoot, is_url

from .report import VerifyReport
from .schemas.packed import validate_packed

#: Rows checked at once (:data:`megacpp_core.pack.CHECK_ROWS`): the schema's ``(rows, L)``
#: int64 matrices are 8 MiB each at L = 8,192; a whole 1,024-row group took some 600 MiB.
CHECK_ROWS = pack.CHECK_ROWS


def snapshot_tokenizer(path: str | os.PathLike) -> tuple[str | None, int | None]:
    """(sha256, vocab size) from ``PATH/../tokenizer/tokenizer_manifest.json`` or (None, None)."""
    s = os.fspath(path).rstrip("/")
    parent, _, _ = s.rpartition("/")
    root = DataRoot(parent or ".")
    key = f"tokenizer/{tk.MANIFEST_FILE}"
    if not root.exists(key):
        return None, None
    info = root.read_json(key)
    return info.get("tokenizer_sha256"), info.get("vocab_size")


def verify_packed_dir(path: str | os.PathLike, out: Callable[[str], None] = print, *,
                      tokenizer_sha256: str | None = None, vocab_size: int | None = None) -> VerifyReport:
    """Run the packed-shard gate on a directory (local path or URL such as
    ``s3://bucket/prefix/snapshots/S/packed``); every failure names the file and the rule.

    ``tokenizer_sha256``/``vocab_size`` default to the snapshot's tokenizer manifest next
    to ``path`` (when there is one); a sentinel recording another tokenizer fails.
    """
    where = os.fspath(path) if is_url(path) else str(Path(path))
    d = DataRoot(where)
    failures: list[str] = []
    if tokenizer_sha256 is None and vocab_size is None:
        tokenizer_sha256, vocab_size = snapshot_tokenizer(where)
    if not d.exists(pack.SUCCESS):
        msg = f"{where}: no {pack.SUCCESS} sentinel; the shards are incomplete and must not be read"
        out(f"FAIL {msg}")
        return VerifyReport(False, [msg])
    sentinel = d.read_json(pack.SUCCESS)
    try:
        pack.check_tokenizer(sentinel, tokenizer_sha256, vocab_size, d.uri(pack.SUCCESS))
    except pack.TokenizerMismatchError as e:
        out(f"FAIL {e}")
        return VerifyReport(False, [str(e)])
    listed = {f["file"] for f in sentinel["files"]}
    present = d.list("")
    for extra in sorted(p for p in present if p.endswith(".parquet") and "/" not in p and p not in listed):
        failures.append(f"{d.uri(extra)}: shard not listed in {pack.SUCCESS}")
    rows = tokens = 0
    ids: list[np.ndarray] = []
    for f in sentinel["files"]:
        fp = d.uri(f["file"])
        if not d.exists(f["file"]):
            failures.append(f"{fp}: missing (listed in {pack.SUCCESS})")
            continue
        if d.sha256(f["file"]) != f["sha256"]:
            failures.append(f"{fp}: sha256 differs from {pack.SUCCESS}")
            continue
        pf = d.parquet_file(f["file"])
        batch_rows = pack_stream.check_batch_rows(sentinel["row_length"], CHECK_ROWS)
        for g in range(pf.num_row_groups):
            where_g = f"{fp} (row group {g})" if pf.num_row_groups > 1 else fp
            n_g, bad, a = pf.metadata.row_group(g).num_rows, len(failures), 0
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[g], use_threads=False):
                part = pa.Table.from_batches([batch])
                where_p = where_g if n_g <= batch_rows else f"{where_g} rows {a}..{a + part.num_rows - 1}"
                a += part.num_rows
                ok, detail = validate_packed(part, sentinel["row_length"], sentinel["vocab_size"], tk.BOS_ID,
                                             tk.PAD_ID, where=where_p)
                if not ok:
                    failures.append(detail)
                    break
                try:
                    s = pack.check_rows(part, sentinel["row_length"], sentinel["vocab_size"], tk.BOS_ID, tk.PAD_ID,
                                        where=where_p)
                except pack.RowContractError as e:
                    failures.append(str(e))
                    break
                rows += s["rows"]
                tokens += s["tokens"]
                ids.append(part.column("pack_id").to_numpy())
            if len(failures) > bad:
                break
    if ids and not failures:
        every = np.concatenate(ids)
        uniq, counts = np.unique(every, return_counts=True)
        if (counts > 1).any():
            failures.append(f"{where}: pack_id repeated across rows: {uniq[counts > 1][:5].tolist()}")
    if rows != sentinel["rows"] and not failures:
        failures.append(f"{where}: {rows} rows found, {pack.SUCCESS} records {sentinel['rows']}")
    for msg in failures:
        out(f"FAIL {msg}")
    if not failures:
        out(f"OK {where}: {rows} rows, {tokens} tokens, row length {sentinel['row_length']}, vocab {sentinel['vocab_size']}")
    return VerifyReport(not failures, failures, {"rows": rows, "tokens": tokens})
