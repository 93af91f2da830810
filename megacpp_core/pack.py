"""Stage 9 — best-fit-decreasing packing into fixed-length rows (SPEC §6).

Each document arrives BOS-prefixed (``ids[0] == BOS``) and no longer than the row
length ``L``. Documents are placed best-fit decreasing — longest first, each into the
open row with the least remaining room that still holds it — never truncated, and rows
are padded on the right with ``<PAD>``. Row columns (SPEC §6):

- ``input_ids`` list<uint32>[L]; ``[valid_token_count:]`` is PAD
- ``target_ids`` list<uint32>[L]: the next token of the same document, PAD elsewhere
- ``loss_mask`` list<uint8>[L]: 1 exactly where ``target_ids`` holds a real token
- ``doc_ids`` list<uint32>[L]: cumulative count of BOS over the valid prefix, 0 on pad
- ``valid_token_count``, ``num_docs`` int32; ``pack_id`` int64; ``slack_tokens`` int32
- ``doc_keys`` list<string> and ``provenance`` list<struct{doc_key, source, revision,
  path, chunk_index}> in row order

:func:`check_rows` asserts the contract and is run by the producer before writing and by
the verify gate after.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa

from . import PRODUCER_REVISION, SCHEMA_VERSION
from .tables import sha256_file, write_parquet

PROVENANCE_TYPE = pa.struct([
    ("doc_key", pa.string()), ("source", pa.string()), ("revision", pa.string()),
    ("path", pa.string()), ("chunk_index", pa.int32()),
])
ROW_SCHEMA = pa.schema([
    ("pack_id", pa.int64()),
    ("input_ids", pa.list_(pa.uint32())),
    ("target_ids", pa.list_(pa.uint32())),
    ("loss_mask", pa.list_(pa.uint8())),
    ("doc_ids", pa.list_(pa.uint32())),
    ("valid_token_count", pa.int32()),
    ("num_docs", pa.int32()),
    ("slack_tokens", pa.int32()),
    ("doc_keys", pa.list_(pa.string())),
    ("provenance", pa.list_(PROVENANCE_TYPE)),
])
SUCCESS = "_SUCCESS"


class PackingError(ValueError):
    """A document cannot be packed (longer than the row, or not BOS-prefixed)."""


class RowContractError(ValueError):
    """A packed row violates the SPEC §6 contract; the message names the row and rule."""


def best_fit_decreasing(lengths: Sequence[int], row_length: int, keys: Sequence[str] | None = None) -> list[list[int]]:
    """Assign documents to rows best-fit decreasing.

    ``lengths[i]`` is document i's token count including its BOS. Returns rows as lists
    of document indices in placement order. Ties are broken by document index, so the
    result is deterministic. O(N log N) search with a sorted list of (room, row).
    Raises :class:`PackingError` naming the document when a length exceeds ``row_length``.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    room: list[tuple[int, int]] = []  # sorted (remaining capacity, row index)
    for i in order:
        n = lengths[i]
        if n > row_length:
            name = keys[i] if keys else f"document {i}"
            raise PackingError(f"{name}: {n} tokens (with BOS) exceed the row length {row_length}")
        if n <= 0:
            raise PackingError(f"{keys[i] if keys else i}: empty document")
        j = bisect.bisect_left(room, (n, -1))
        if j < len(room):
            r_room, r = room.pop(j)
            rows[r].append(i)
            r_room -= n
        else:
            r = len(rows)
            rows.append([i])
            r_room = row_length - n
        if r_room > 0:
            bisect.insort(room, (r_room, r))
    return rows


@dataclass(frozen=True)
class PackInput:
    """One tokenized document: ``ids`` uint32 with BOS first, plus provenance."""

    ids: np.ndarray
    doc_key: str
    source: str
    revision: str
    path: str
    chunk_index: int


def build_rows(docs: Sequence[PackInput], row_length: int, bos_id: int, pad_id: int) -> pa.Table:
    """Pack documents into a ROW_SCHEMA table (rows ordered by ``pack_id``)."""
    for d in docs:
        if len(d.ids) == 0 or int(d.ids[0]) != bos_id:
            raise PackingError(f"{d.doc_key}: document does not start with BOS ({bos_id})")
    assignment = best_fit_decreasing([len(d.ids) for d in docs], row_length, [d.doc_key for d in docs])
    L = row_length
    n = len(assignment)
    input_ids = np.full((n, L), pad_id, dtype=np.uint32)
    target_ids = np.full((n, L), pad_id, dtype=np.uint32)
    loss_mask = np.zeros((n, L), dtype=np.uint8)
    doc_ids = np.zeros((n, L), dtype=np.uint32)
    valid = np.zeros(n, dtype=np.int32)
    num_docs = np.zeros(n, dtype=np.int32)
    keys, prov = [], []
    for r, members in enumerate(assignment):
        pos = 0
        rk, rp = [], []
        for k, i in enumerate(members):
            d = docs[i]
            m = len(d.ids)
            input_ids[r, pos:pos + m] = d.ids
            target_ids[r, pos:pos + m - 1] = d.ids[1:]
            loss_mask[r, pos:pos + m - 1] = 1
            doc_ids[r, pos:pos + m] = k + 1
            pos += m
            rk.append(d.doc_key)
            rp.append({"doc_key": d.doc_key, "source": d.source, "revision": d.revision,
                       "path": d.path, "chunk_index": d.chunk_index})
        valid[r] = pos
        num_docs[r] = len(members)
        keys.append(rk)
        prov.append(rp)

    def lists(a: np.ndarray, typ) -> pa.Array:
        flat = pa.array(a.reshape(-1), type=typ)
        offsets = pa.array(np.arange(0, a.size + 1, L, dtype=np.int32))
        return pa.ListArray.from_arrays(offsets, flat)

    return pa.table({
        "pack_id": pa.array(np.arange(n, dtype=np.int64)),
        "input_ids": lists(input_ids, pa.uint32()),
        "target_ids": lists(target_ids, pa.uint32()),
        "loss_mask": lists(loss_mask, pa.uint8()),
        "doc_ids": lists(doc_ids, pa.uint32()),
        "valid_token_count": pa.array(valid),
        "num_docs": pa.array(num_docs),
        "slack_tokens": pa.array((L - valid).astype(np.int32)),
        "doc_keys": pa.array(keys, type=pa.list_(pa.string())),
        "provenance": pa.array(prov, type=pa.list_(PROVENANCE_TYPE)),
    }, schema=ROW_SCHEMA)


def _matrix(table: pa.Table, column: str, L: int, where: str) -> np.ndarray:
    col = table.column(column).combine_chunks()
    lengths = col.value_lengths().to_numpy(zero_copy_only=False)
    bad = np.nonzero(lengths != L)[0]
    if len(bad):
        raise RowContractError(f"{where}: row {int(bad[0])}: {column} has length {int(lengths[bad[0]])}, expected {L}")
    return col.flatten().to_numpy(zero_copy_only=False).reshape(-1, L)


def check_rows(table: pa.Table, row_length: int, vocab_size: int, bos_id: int, pad_id: int, where: str = "rows") -> dict:
    """Assert the SPEC §6 row contract on every row; return summary figures.

    Checks: list lengths == L; ids < vocab; BOS first; PAD tail after
    ``valid_token_count``; ``doc_ids == cumsum(BOS)`` over the valid prefix and 0 on pad;
    ``num_docs == count(BOS)`` ≥ 1; ``target_ids``/``loss_mask`` consistent with the next
    in-document token; ``slack_tokens == L - valid``. Raises :class:`RowContractError`
    naming the first violating row and rule.
    """
    L = row_length
    if table.num_rows == 0:
        return {"rows": 0, "tokens": 0, "docs": 0}
    inp = _matrix(table, "input_ids", L, where)
    tgt = _matrix(table, "target_ids", L, where)
    msk = _matrix(table, "loss_mask", L, where)
    dids = _matrix(table, "doc_ids", L, where)
    valid = table.column("valid_token_count").to_numpy()
    ndocs = table.column("num_docs").to_numpy()
    slack = table.column("slack_tokens").to_numpy()

    def fail(mask: np.ndarray, rule: str):
        rows = np.nonzero(mask)[0]
        if len(rows):
            raise RowContractError(f"{where}: row {int(rows[0])}: {rule}")

    fail((valid < 1) | (valid > L), "valid_token_count outside [1, L]")
    fail(slack != L - valid, "slack_tokens != L - valid_token_count")
    fail(inp.max(axis=1) >= vocab_size, f"token id ≥ vocab size {vocab_size}")
    fail(inp[:, 0] != bos_id, "first token is not BOS")
    pos = np.arange(L)[None, :]
    in_valid = pos < valid[:, None]
    fail(((inp != pad_id) & ~in_valid).any(axis=1), "non-PAD token after valid_token_count")
    is_bos = (inp == bos_id) & in_valid
    expect_doc = np.where(in_valid, np.cumsum(is_bos, axis=1), 0)
    fail((dids != expect_doc).any(axis=1), "doc_ids != cumsum(BOS) over the valid prefix")
    fail(ndocs != is_bos.sum(axis=1), "num_docs != count(BOS)")
    fail(ndocs < 1, "num_docs < 1")
    nxt_same = np.zeros_like(in_valid)
    nxt_same[:, :-1] = in_valid[:, 1:] & (expect_doc[:, 1:] == expect_doc[:, :-1])
    exp_tgt = np.full_like(inp, pad_id)
    exp_tgt[:, :-1] = np.where(nxt_same[:, :-1], inp[:, 1:], pad_id)
    fail((tgt != exp_tgt).any(axis=1), "target_ids is not the next in-document token")
    fail((msk != nxt_same.astype(np.uint8)).any(axis=1), "loss_mask disagrees with target_ids")
    keys = table.column("doc_keys").combine_chunks().value_lengths().to_numpy(zero_copy_only=False)
    fail(keys != ndocs, "len(doc_keys) != num_docs")
    return {"rows": int(table.num_rows), "tokens": int(valid.sum()), "docs": int(ndocs.sum()),
            "padding_fraction": float(1 - valid.sum() / (table.num_rows * L))}


def write_shards(rows: pa.Table, out_dir: Path, *, row_length: int, vocab_size: int,
                 tokenizer_sha256: str, validation_fraction: float = 0.01,
                 max_docs_per_shard: int = 50_000, extra: dict | None = None) -> dict:
    """Write packed rows as parquet shards plus the ``_SUCCESS`` sentinel (SPEC §6).

    The last ``ceil(validation_fraction × rows)`` rows (by ``pack_id``; none when there
    is a single row) go to ``validation-*.parquet``, the rest to ``train-*.parquet``;
    each file holds at most ``max_docs_per_shard`` documents in 1,024-row row groups.
    Any previous sentinel and shards are removed first; the sentinel (counts, file
    sha256s, schema version, producer revision, tokenizer sha256) is written only after
    the last file is closed. Returns the sentinel dict.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / SUCCESS).unlink(missing_ok=True)
    for old in out_dir.glob("*.parquet"):
        old.unlink()
    n = rows.num_rows
    n_val = math.ceil(n * validation_fraction) if n > 1 else 0
    splits = {"train": rows.slice(0, n - n_val), "validation": rows.slice(n - n_val, n_val)}
    files = []
    for split, tbl in splits.items():
        docs = tbl.column("num_docs").to_numpy() if tbl.num_rows else np.zeros(0, dtype=np.int32)
        start, shard = 0, 0
        while start < tbl.num_rows:
            end, acc = start, 0
            while end < tbl.num_rows and (acc + docs[end] <= max_docs_per_shard or end == start):
                acc += docs[end]
                end += 1
            name = f"{split}-{shard:05d}.parquet"
            write_parquet(tbl.slice(start, end - start), out_dir / name)
            files.append({"file": name, "split": split, "rows": end - start, "docs": int(acc),
                          "tokens": int(tbl.slice(start, end - start).column("valid_token_count").to_numpy().sum()),
                          "sha256": sha256_file(out_dir / name)})
            start, shard = end, shard + 1
    sentinel = {
        "schema_version": SCHEMA_VERSION,
        "producer_revision": PRODUCER_REVISION,
        "tokenizer_sha256": tokenizer_sha256,
        "vocab_size": vocab_size,
        "row_length": row_length,
        "rows": n,
        "validation_rows": n_val,
        "docs": int(sum(f["docs"] for f in files)),
        "tokens": int(sum(f["tokens"] for f in files)),
        "files": files,
        **(extra or {}),
    }
    tmp = out_dir / (SUCCESS + ".tmp")
    tmp.write_text(json.dumps(sentinel, sort_keys=True, indent=2) + "\n")
    os.replace(tmp, out_dir / SUCCESS)
    return sentinel


class IncompleteShardsError(RuntimeError):
    """A packed-shard directory has no ``_SUCCESS`` sentinel or a file does not match it."""


def read_success(out_dir: Path) -> dict:
    """Load the ``_SUCCESS`` sentinel; readers refuse a directory without it."""
    p = Path(out_dir) / SUCCESS
    if not p.exists():
        raise IncompleteShardsError(f"{out_dir}: no {SUCCESS} sentinel; the shards are incomplete and must not be read")
    return json.loads(p.read_text())


def shard_digest(sentinel: dict) -> str:
    """A short digest of a sentinel's file hashes (for provenance labels)."""
    return hashlib.sha256("".join(f["sha256"] for f in sentinel["files"]).encode()).hexdigest()[:16]
