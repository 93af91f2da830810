"""Stage 9 — best-fit-decreasing packing into fixed-length rows (SPEC §6).

Each document arrives BOS-prefixed (``ids[0] == BOS``) and no longer than the row
length ``L``. Documents are placed best-fit decreasing — longest first, each into the
open row with the least remaining room that still holds it — never truncated, and rows
are padded on the right with ``<PAD>``. Row columns (SPEC §6):

- ``input_ids`` list<uint32>[L]; ``[valid_token_count:]`` is PAD
- ``target_ids`` list<uint32>[L]: the next token of the same document, PAD elsewhere
- ``loss_mask`` list<uint8>[L]: 1 only where ``target_ids`` holds a real in-document
  token that no loss policy (e.g. the FIM documentation-comment policy) masked
- ``doc_ids`` list<uint32>[L]: cumulative count of BOS over the valid prefix, 0 on pad
- ``valid_token_count``, ``num_docs`` int32; ``pack_id`` int64; ``slack_tokens`` int32
- ``doc_keys`` list<string> and ``provenance`` list<struct{doc_key, source, revision,
  path, chunk_index}> in row order

Optional columns, present in the rows exactly when the tokenized documents carry them
(the enrichment lane, SPEC §4): the token-aligned planes :data:`PLANES` (list<uint8>[L],
0 on pad), ``chunk_boundaries`` (row token positions, end exclusive), ``call_edges`` /
``type_edges`` (indices into the row's ``chunk_boundaries``) and ``platform_ids`` (one
list per document, row order).

:func:`check_rows` asserts the contract and is run by the producer before writing and by
the verify gate after.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from . import PRODUCER_REVISION, SCHEMA_VERSION
from .tables import sha256_file, write_parquet

PROVENANCE_TYPE = pa.struct([
    ("doc_key", pa.string()), ("source", pa.string()), ("revision", pa.string()),
    ("path", pa.string()), ("chunk_index", pa.int32()),
])
#: Token-aligned uint8 planes of SPEC §6 ("optional planes").
PLANES = ("structure_ids", "dep_levels", "ast_depth", "sibling_index", "ast_node_type")
#: One chunk span; ``start``/``end`` are token positions (end exclusive), SPEC §4 enrichment.
CHUNK_TYPE = pa.struct([
    ("start", pa.int32()), ("end", pa.int32()), ("kind", pa.string()),
    ("name", pa.string()), ("dep_level", pa.int32()),
])
#: One edge between two chunks (indices into the chunk list), SPEC §4 enrichment.
EDGE_TYPE = pa.struct([("from", pa.int32()), ("to", pa.int32())])
EDGE_COLUMNS = ("call_edges", "type_edges")
#: Per-document platform labels (versioned platform vocabulary, < 2**16 labels).
PLATFORM_TYPE = pa.list_(pa.uint16())
OPTIONAL_TYPES: dict[str, pa.DataType] = {
    **{p: pa.list_(pa.uint8()) for p in PLANES},
    "chunk_boundaries": pa.list_(CHUNK_TYPE),
    "call_edges": pa.list_(EDGE_TYPE),
    "type_edges": pa.list_(EDGE_TYPE),
    "platform_ids": pa.list_(PLATFORM_TYPE),
}
OPTIONAL_COLUMNS = tuple(OPTIONAL_TYPES)
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
    """A document cannot be packed (longer than the row, empty, not BOS-prefixed, or a
    misaligned optional column); the message names the document."""


class RowContractError(ValueError):
    """A packed row violates the SPEC §6 contract; the message names the row and rule."""


class TokenizerMismatchError(ValueError):
    """An input was produced with a different tokenizer (sha256 or vocabulary size)."""


def row_schema(optional: Sequence[str] = ()) -> pa.Schema:
    """:data:`ROW_SCHEMA` plus the optional columns ``optional`` (in :data:`OPTIONAL_COLUMNS` order)."""
    unknown = sorted(set(optional) - set(OPTIONAL_TYPES))
    if unknown:
        raise ValueError(f"unknown optional columns {unknown}; known: {list(OPTIONAL_COLUMNS)}")
    schema = ROW_SCHEMA
    for name in OPTIONAL_COLUMNS:
        if name in optional:
            schema = schema.append(pa.field(name, OPTIONAL_TYPES[name]))
    return schema


class _CapacityTree:
    """Open rows indexed by remaining capacity 1..L in a segment tree of occupancy counts.

    ``find(n)`` returns the smallest capacity ≥ n held by some open row in O(log L);
    rows with equal capacity are kept in a min-heap so the lowest row index wins (ties
    deterministic). Memory O(L).
    """

    def __init__(self, capacity: int) -> None:
        self.size = 1 << max(1, capacity.bit_length())  # leaves 0..size-1 cover 0..L
        self.count = [0] * (2 * self.size)
        self.rows: dict[int, list[int]] = {}

    def _bump(self, cap: int, delta: int) -> None:
        i = cap + self.size
        while i:
            self.count[i] += delta
            i >>= 1

    def add(self, cap: int, row: int) -> None:
        import heapq

        heapq.heappush(self.rows.setdefault(cap, []), row)
        self._bump(cap, 1)

    def pop(self, cap: int) -> int:
        import heapq

        row = heapq.heappop(self.rows[cap])
        self._bump(cap, -1)
        return row

    def find(self, n: int) -> int:
        """Smallest capacity ≥ ``n`` with an open row, or -1."""
        c, size = self.count, self.size
        if n >= size:
            return -1
        i = n + size
        if c[i]:
            return n
        while i > 1:
            if not i & 1 and c[i + 1]:
                i += 1
                while i < size:
                    i = 2 * i if c[2 * i] else 2 * i + 1
                return i - size
            i >>= 1
        return -1


def best_fit_decreasing(lengths: Sequence[int], row_length: int, keys: Sequence[str] | None = None) -> list[list[int]]:
    """Assign documents to rows best-fit decreasing in O(N log N + N log L).

    ``lengths[i]`` is document i's token count including its BOS. Documents are taken
    longest first (ties by index); each goes to the open row with the least remaining
    capacity that still holds it (ties: lowest row index), found in O(log L) with a
    segment tree over capacities 1..L (:class:`_CapacityTree`); else a new row opens.
    Returns rows as lists of document indices in placement order (deterministic).
    Raises :class:`PackingError` naming the document when a length exceeds
    ``row_length`` (nothing is ever truncated) or is not positive.
    """
    for i, n in enumerate(lengths):
        if n > row_length or n <= 0:
            name = keys[i] if keys else f"document {i}"
            what = f"{n} tokens (with BOS) exceed the row length {row_length}" if n > 0 else "empty document"
            raise PackingError(f"{name}: {what}; documents are never truncated")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    tree = _CapacityTree(row_length)
    rows: list[list[int]] = []
    for i in order:
        n = int(lengths[i])
        cap = tree.find(n)
        if cap >= 0:
            r = tree.pop(cap)
            rows[r].append(i)
            room = cap - n
        else:
            r = len(rows)
            rows.append([i])
            room = row_length - n
        if room > 0:
            tree.add(room, r)
    return rows


@dataclass(frozen=True)
class PackInput:
    """One tokenized document: ``ids`` uint32 with BOS first, plus provenance.

    ``loss_keep`` (uint8, len(ids)) marks tokens that may be predicted (0 = masked by a
    loss policy); ``extras`` holds the optional enrichment values of this document:
    planes as arrays aligned with ``ids``, ``chunk_boundaries`` as a list of dicts with
    document token positions, ``call_edges``/``type_edges`` as lists of ``{"from", "to"}``
    chunk indices, ``platform_ids`` as a list of ints.
    """

    ids: np.ndarray
    doc_key: str
    source: str
    revision: str
    path: str
    chunk_index: int
    loss_keep: np.ndarray | None = None
    extras: dict = field(default_factory=dict)


def _check_input(d: PackInput, bos_id: int, optional: Sequence[str]) -> None:
    m = len(d.ids)
    if m == 0 or int(d.ids[0]) != bos_id:
        raise PackingError(f"{d.doc_key}: document does not start with BOS ({bos_id})")
    if d.loss_keep is not None and len(d.loss_keep) != m:
        raise PackingError(f"{d.doc_key}: loss_keep has {len(d.loss_keep)} entries for {m} tokens")
    for name in optional:
        if name not in d.extras:
            raise PackingError(f"{d.doc_key}: optional column {name} missing for this document")
    for p in PLANES:
        if p in optional:
            a = np.asarray(d.extras[p])
            if a.shape != (m,):
                raise PackingError(f"{d.doc_key}: plane {p} has {a.size} entries for {m} tokens")
            if a.dtype != np.uint8 and a.size and (a.min() < 0 or a.max() > 255):  # uint8 holds nothing else
                raise PackingError(f"{d.doc_key}: plane {p} values outside uint8")
    if "chunk_boundaries" in optional:
        for j, c in enumerate(d.extras["chunk_boundaries"]):
            if not 0 <= c["start"] < c["end"] <= m:
                raise PackingError(f"{d.doc_key}: chunk {j} span [{c['start']}, {c['end']}) outside [0, {m})")
        nchunks = len(d.extras["chunk_boundaries"])
        for e in EDGE_COLUMNS:
            for edge in d.extras.get(e) or []:
                if not (0 <= edge["from"] < nchunks and 0 <= edge["to"] < nchunks):
                    raise PackingError(f"{d.doc_key}: {e} {edge} points outside its {nchunks} chunks")


def build_rows(docs: Sequence[PackInput], row_length: int, bos_id: int, pad_id: int,
               optional: Sequence[str] = ()) -> pa.Table:
    """Pack documents into a :func:`row_schema` (``optional``) table ordered by ``pack_id``.

    ``optional`` names the optional columns to carry (every document must have them in
    ``extras``). Chunk spans move by the document's row offset; edges move by the number
    of chunks of the earlier documents of the row. Raises :class:`PackingError` naming
    the document for a missing BOS, an oversized document or a misaligned column.
    """
    optional = [c for c in OPTIONAL_COLUMNS if c in optional]
    for d in docs:
        _check_input(d, bos_id, optional)
    assignment = best_fit_decreasing([len(d.ids) for d in docs], row_length, [d.doc_key for d in docs])
    L = row_length
    n = len(assignment)
    input_ids = np.full((n, L), pad_id, dtype=np.uint32)
    target_ids = np.full((n, L), pad_id, dtype=np.uint32)
    loss_mask = np.zeros((n, L), dtype=np.uint8)
    doc_ids = np.zeros((n, L), dtype=np.uint32)
    planes = {p: np.zeros((n, L), dtype=np.uint8) for p in PLANES if p in optional}
    valid = np.zeros(n, dtype=np.int32)
    num_docs = np.zeros(n, dtype=np.int32)
    keys, prov = [], []
    # optional structure, built column-wise (one Python append per value, no dicts)
    cb = {f.name: [] for f in CHUNK_TYPE}
    cb_off = [0]
    edges: dict[str, tuple[list, list, list]] = {e: ([], [], [0]) for e in EDGE_COLUMNS if e in optional}
    plat_vals: list[int] = []
    plat_doc_off = [0]
    plat_row_off = [0]
    has_chunks, has_plat = "chunk_boundaries" in optional, "platform_ids" in optional
    for r, members in enumerate(assignment):
        pos = 0
        rk, rp = [], []
        for k, i in enumerate(members):
            d = docs[i]
            m = len(d.ids)
            input_ids[r, pos:pos + m] = d.ids
            target_ids[r, pos:pos + m - 1] = d.ids[1:]
            loss_mask[r, pos:pos + m - 1] = 1 if d.loss_keep is None else d.loss_keep[1:]
            doc_ids[r, pos:pos + m] = k + 1
            for p, a in planes.items():
                a[r, pos:pos + m] = d.extras[p]
            if has_chunks:
                base = len(cb["start"]) - cb_off[-1]
                for e, (fr, to, _) in edges.items():
                    for x in d.extras.get(e) or ():
                        fr.append(x["from"] + base)
                        to.append(x["to"] + base)
                for c in d.extras["chunk_boundaries"]:
                    cb["start"].append(c["start"] + pos)
                    cb["end"].append(c["end"] + pos)
                    cb["kind"].append(c["kind"])
                    cb["name"].append(c["name"])
                    cb["dep_level"].append(c["dep_level"])
            if has_plat:
                plat_vals.extend(int(x) for x in d.extras["platform_ids"])
                plat_doc_off.append(len(plat_vals))
            pos += m
            rk.append(d.doc_key)
            rp.append({"doc_key": d.doc_key, "source": d.source, "revision": d.revision,
                       "path": d.path, "chunk_index": d.chunk_index})
        valid[r] = pos
        num_docs[r] = len(members)
        keys.append(rk)
        prov.append(rp)
        cb_off.append(len(cb["start"]))
        plat_row_off.append(len(plat_doc_off) - 1)
        for fr, _, off in edges.values():
            off.append(len(fr))

    def lists(a: np.ndarray, typ) -> pa.Array:
        flat = pa.array(a.reshape(-1), type=typ)
        offsets = pa.array(np.arange(0, a.size + 1, L, dtype=np.int32))
        return pa.ListArray.from_arrays(offsets, flat)

    cols = {
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
    }
    for p, a in planes.items():
        cols[p] = lists(a, pa.uint8())
    if has_chunks:
        struct = pa.StructArray.from_arrays([pa.array(cb[f.name], type=f.type) for f in CHUNK_TYPE], fields=list(CHUNK_TYPE))
        cols["chunk_boundaries"] = pa.ListArray.from_arrays(pa.array(cb_off, pa.int32()), struct)
    for e, (fr, to, off) in edges.items():
        struct = pa.StructArray.from_arrays([pa.array(fr, pa.int32()), pa.array(to, pa.int32())], fields=list(EDGE_TYPE))
        cols[e] = pa.ListArray.from_arrays(pa.array(off, pa.int32()), struct)
    if has_plat:
        inner = pa.ListArray.from_arrays(pa.array(plat_doc_off, pa.int32()), pa.array(plat_vals, pa.uint16()))
        cols["platform_ids"] = pa.ListArray.from_arrays(pa.array(plat_row_off, pa.int32()), inner)
    schema = row_schema(optional)
    return pa.table({f.name: cols[f.name] for f in schema}, schema=schema)


def _matrix(table: pa.Table, column: str, L: int, where: str) -> np.ndarray:
    col = table.column(column).combine_chunks()
    if col.null_count:
        raise RowContractError(f"{where}: row {int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])}: {column} is null")
    lengths = col.value_lengths().to_numpy(zero_copy_only=False)
    bad = np.nonzero(lengths != L)[0]
    if len(bad):
        raise RowContractError(f"{where}: row {int(bad[0])}: {column} has length {int(lengths[bad[0]])}, expected {L}")
    if (flat := col.flatten()).null_count:  # rows of L values each: value k is in row k // L
        k = int(np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False))[0])
        raise RowContractError(f"{where}: row {k // L}: {column} holds a null")
    return flat.to_numpy(zero_copy_only=False).reshape(-1, L)


def _list_parts(table: pa.Table, column: str) -> tuple[np.ndarray, pa.Array]:
    """(row index of every list element, flattened values) of a list column."""
    col = table.column(column).combine_chunks()
    lengths = col.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    return np.repeat(np.arange(len(col)), lengths), col.flatten()


def _failer(where: str):
    def fail(mask: np.ndarray, rule: str) -> None:
        rows = np.nonzero(mask)[0]
        if len(rows):
            raise RowContractError(f"{where}: row {int(rows[0])}: {rule}")
    return fail


def check_token_arrays(inp: np.ndarray, tgt: np.ndarray, msk: np.ndarray, valid: np.ndarray, row_length: int,
                       vocab_size: int, bos_id: int, pad_id: int, where: str = "rows") -> tuple[np.ndarray, np.ndarray]:
    """The contract of the token columns on [n, L] matrices (``input_ids``, ``target_ids``,
    ``loss_mask``) and ``valid_token_count`` [n]: valid count in [1, L], ids < vocab, BOS
    first, PAD after the valid prefix, ``target_ids`` the next token of the same document
    (PAD elsewhere), ``loss_mask`` 0/1 and 1 only where the target is real. Returns the
    [n, L] bool masks ``(in_valid, is_bos)``; raises :class:`RowContractError` naming the
    first violating row and rule. The loader runs this alone (it derives ``doc_ids``)."""
    L = row_length
    fail = _failer(where)
    fail((valid < 1) | (valid > L), "valid_token_count outside [1, L]")
    fail(inp.max(axis=1) >= vocab_size, f"token id ≥ vocab size {vocab_size}")
    fail(inp[:, 0] != bos_id, "first token is not BOS")
    in_valid = np.arange(L)[None, :] < valid[:, None]
    fail(((inp != pad_id) & ~in_valid).any(axis=1), "non-PAD token after valid_token_count")
    is_bos = (inp == bos_id) & in_valid
    # the next position holds a token of the same document: valid and not a BOS
    nxt_same = np.zeros_like(in_valid)
    nxt_same[:, :-1] = in_valid[:, 1:] & ~is_bos[:, 1:]
    fail(((tgt[:, :-1] != np.where(nxt_same[:, :-1], inp[:, 1:], pad_id)).any(axis=1)) | (tgt[:, -1] != pad_id),
         "target_ids is not the next in-document token")
    bad = (msk > nxt_same).any(axis=1)  # one pass for both loss rules; the message after
    if bad.any():
        fail((msk > 1).any(axis=1), "loss_mask holds a value other than 0/1")
        fail(bad, "loss_mask is 1 where the target is not a real in-document token")
    return in_valid, is_bos


def check_row_arrays(inp: np.ndarray, tgt: np.ndarray, msk: np.ndarray, dids: np.ndarray, valid: np.ndarray,
                     ndocs: np.ndarray, slack: np.ndarray, row_length: int, vocab_size: int, bos_id: int, pad_id: int,
                     where: str = "rows") -> np.ndarray:
    """The token-level part of :func:`check_rows` on [n, L] matrices (``input_ids``,
    ``target_ids``, ``loss_mask``, ``doc_ids``) and [n] vectors (``valid_token_count``,
    ``num_docs``, ``slack_tokens``): :func:`check_token_arrays`, then the stored
    ``slack_tokens``, ``doc_ids`` and ``num_docs``. Returns the [n, L] bool mask of the
    valid prefixes; raises :class:`RowContractError` naming the first violating row and rule."""
    in_valid, is_bos = check_token_arrays(inp, tgt, msk, valid, row_length, vocab_size, bos_id, pad_id, where)
    fail = _failer(where)
    fail(slack != row_length - valid, "slack_tokens != L - valid_token_count")
    expect_doc = np.cumsum(is_bos, axis=1, dtype=np.int32)
    expect_doc[~in_valid] = 0
    fail((dids != expect_doc).any(axis=1), "doc_ids != cumsum(BOS) over the valid prefix")
    fail(ndocs != expect_doc.max(axis=1), "num_docs != count(BOS)")
    fail(ndocs < 1, "num_docs < 1")
    return in_valid


#: Rows checked at once by the callers of :func:`check_rows` on many rows (the packer, the
#: packed gate): its ``(rows, L)`` matrices are a few MiB each at L = 8,192 (implementation choice).
CHECK_ROWS = 128
def check_rows(table: pa.Table, row_length: int, vocab_size: int, bos_id: int, pad_id: int, where: str = "rows") -> dict:
    """Assert the SPEC §6 row contract on every row; return summary figures.

    Checks: list lengths == L; ids < vocab; BOS first; PAD tail after
    ``valid_token_count``; ``doc_ids == cumsum(BOS)`` over the valid prefix and 0 on pad;
    ``num_docs == count(BOS)`` ≥ 1; ``target_ids`` is the next in-document token and PAD
    elsewhere; ``loss_mask`` is 0/1 and 1 only where the target is a real in-document
    token (a loss policy may clear more); ``slack_tokens == L - valid``;
    ``len(doc_keys) == len(provenance) == num_docs``. Optional columns when present:
    planes of length L and 0 on pad; chunk spans non-empty, inside the valid prefix and
    inside one document; edges index existing chunks; one ``platform_ids`` list per
    document. Raises :class:`RowContractError` naming the first violating row and rule.
    """
    L = row_length
    if table.num_rows == 0:
        return {"rows": 0, "tokens": 0, "docs": 0, "loss_tokens": 0}
    inp = _matrix(table, "input_ids", L, where)
    tgt = _matrix(table, "target_ids", L, where)
    msk = _matrix(table, "loss_mask", L, where)
    dids = _matrix(table, "doc_ids", L, where)
    valid = table.column("valid_token_count").to_numpy()
    ndocs = table.column("num_docs").to_numpy()
    slack = table.column("slack_tokens").to_numpy()
    in_valid = check_row_arrays(inp, tgt, msk, dids, valid, ndocs, slack, L, vocab_size, bos_id, pad_id, where)
    fail = _failer(where)

    for col in ("doc_keys", "provenance"):
        n = table.column(col).combine_chunks().value_lengths().fill_null(-1).to_numpy(zero_copy_only=False)
        fail(n != ndocs, f"len({col}) != num_docs")
    names = set(table.column_names)
    for p in PLANES:
        if p in names:
            a = _matrix(table, p, L, where)
            fail((a.astype(np.int64) * ~in_valid).any(axis=1), f"{p} is not 0 on pad")
    nchunks = np.zeros(table.num_rows, dtype=np.int64)
    if "chunk_boundaries" in names:
        rows, flat = _list_parts(table, "chunk_boundaries")
        nchunks = np.bincount(rows, minlength=table.num_rows)
        if len(flat):
            s = flat.field("start").to_numpy(zero_copy_only=False).astype(np.int64)
            e = flat.field("end").to_numpy(zero_copy_only=False).astype(np.int64)
            bad = (s < 0) | (e <= s) | (e > valid[rows])
            fail(np.bincount(rows[bad], minlength=table.num_rows) > 0, "chunk span empty or outside the valid prefix")
            se, ee = np.clip(s, 0, L - 1), np.clip(e - 1, 0, L - 1)
            cross = dids[rows, se] != dids[rows, ee]
            fail(np.bincount(rows[cross], minlength=table.num_rows) > 0, "chunk span crosses a document boundary")
    for ecol in EDGE_COLUMNS:
        if ecol in names:
            rows, flat = _list_parts(table, ecol)
            if len(flat):
                f = flat.field("from").to_numpy(zero_copy_only=False).astype(np.int64)
                t = flat.field("to").to_numpy(zero_copy_only=False).astype(np.int64)
                bad = (f < 0) | (t < 0) | (f >= nchunks[rows]) | (t >= nchunks[rows])
                fail(np.bincount(rows[bad], minlength=table.num_rows) > 0, f"{ecol} index outside the row's chunk_boundaries")
    if "platform_ids" in names:
        n = table.column("platform_ids").combine_chunks().value_lengths().fill_null(-1).to_numpy(zero_copy_only=False)
        fail(n != ndocs, "len(platform_ids) != num_docs")
    return {"rows": int(table.num_rows), "tokens": int(valid.sum()), "docs": int(ndocs.sum()),
            "loss_tokens": int(msk.sum()),
            "padding_fraction": float(1 - valid.sum() / (table.num_rows * L))}


def plan_shards(rows: pa.Table, *, validation_fraction: float = 0.01, max_docs_per_shard: int = 50_000
                ) -> tuple[list[tuple[str, pa.Table, dict]], int]:
    """Split packed rows into shard files (SPEC §6): ``([(file name, rows, info)], n_val)``.

    The last ``ceil(validation_fraction × rows)`` rows (by ``pack_id``; none when there is
    a single row) go to ``validation-*.parquet``, the rest to ``train-*.parquet``; each file
    holds at most ``max_docs_per_shard`` documents (50,000, SPEC §6). ``info`` has
    ``split``, ``rows``, ``docs`` and ``tokens`` of the file.
    """
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
            part = tbl.slice(start, end - start)
            files.append((f"{split}-{shard:05d}.parquet", part,
                          {"split": split, "rows": end - start, "docs": int(acc),
                           "tokens": int(part.column("valid_token_count").to_numpy().sum())}))
            start, shard = end, shard + 1
    return files, n_val


def sentinel_fields(rows: pa.Table | int, files: list[tuple[str, Any, dict]], n_val: int, *, row_length: int,
                    vocab_size: int, tokenizer_sha256: str, extra: dict | None = None,
                    optional: Sequence[str] | None = None) -> dict:
    """The ``_SUCCESS`` sentinel of :func:`plan_shards` files, without the ``files`` list
    (counts, schema version, producer revision, tokenizer sha256, vocabulary size, row
    length, optional columns, and ``extra``). ``rows`` is the rows table, or its row
    count with the ``optional`` columns it carries (streamed packing)."""
    n_rows = rows if isinstance(rows, int) else rows.num_rows
    names = list(optional or []) if isinstance(rows, int) else rows.column_names
    return {
        "schema_version": SCHEMA_VERSION,
        "producer_revision": PRODUCER_REVISION,
        "tokenizer_sha256": tokenizer_sha256,
        "vocab_size": vocab_size,
        "row_length": row_length,
        "rows": n_rows,
        "validation_rows": n_val,
        "docs": int(sum(f[2]["docs"] for f in files)),
        "tokens": int(sum(f[2]["tokens"] for f in files)),
        "optional_columns": [c for c in OPTIONAL_COLUMNS if c in names],
        **(extra or {}),
    }


def write_shards(rows: pa.Table, out_dir: Path, *, row_length: int, vocab_size: int,
                 tokenizer_sha256: str, validation_fraction: float = 0.01,
                 max_docs_per_shard: int = 50_000, extra: dict | None = None,
                 row_group_size: int = 1024) -> dict:
    """Write packed rows as parquet shards plus the ``_SUCCESS`` sentinel into a local
    directory (:func:`plan_shards`, :func:`sentinel_fields`; 1,024-row row groups, SPEC §6).

    Any previous sentinel is removed first and then the old shards; the sentinel (with
    each file's sha256) is written atomically only after the last file is closed. Returns
    the sentinel dict. The pack stage commits the same files through the data root.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / SUCCESS).unlink(missing_ok=True)
    for old in out_dir.glob("*.parquet"):
        old.unlink()
    planned, n_val = plan_shards(rows, validation_fraction=validation_fraction, max_docs_per_shard=max_docs_per_shard)
    files = []
    for name, part, info in planned:
        write_parquet(part, out_dir / name, row_group_size=row_group_size)
        files.append({**info, "file": name, "sha256": sha256_file(out_dir / name)})
    sentinel = {**sentinel_fields(rows, planned, n_val, row_length=row_length, vocab_size=vocab_size,
                                  tokenizer_sha256=tokenizer_sha256, extra=extra), "files": files}
    tmp = out_dir / (SUCCESS + ".tmp")
    tmp.write_text(json.dumps(sentinel, sort_keys=True, indent=2) + "\n")
    os.replace(tmp, out_dir / SUCCESS)
    return sentinel


class IncompleteShardsError(RuntimeError):
    """A packed-shard directory has no ``_SUCCESS`` sentinel or a file does not match it."""


def read_success(out_dir: Path, tokenizer_sha256: str | None = None, vocab_size: int | None = None) -> dict:
    """Load the ``_SUCCESS`` sentinel; readers refuse a directory without it.

    When ``tokenizer_sha256`` / ``vocab_size`` are given they must equal the sentinel's,
    else :class:`TokenizerMismatchError` naming both values. Raises
    :class:`IncompleteShardsError` when the sentinel is absent.
    """
    p = Path(out_dir) / SUCCESS
    if not p.exists():
        raise IncompleteShardsError(f"{out_dir}: no {SUCCESS} sentinel; the shards are incomplete and must not be read")
    sentinel = json.loads(p.read_text())
    check_tokenizer(sentinel, tokenizer_sha256, vocab_size, str(p))
    return sentinel


def check_tokenizer(recorded: dict, tokenizer_sha256: str | None, vocab_size: int | None, where: str) -> None:
    """Refuse an artifact whose recorded ``tokenizer_sha256``/``vocab_size`` differ from the
    expected ones (``None`` = not checked). Raises :class:`TokenizerMismatchError`."""
    if tokenizer_sha256 is not None and recorded.get("tokenizer_sha256") != tokenizer_sha256:
        raise TokenizerMismatchError(
            f"{where}: produced with tokenizer sha256 {recorded.get('tokenizer_sha256')}, "
            f"but the snapshot tokenizer is {tokenizer_sha256}; re-run the stages after the tokenizer")
    if vocab_size is not None and recorded.get("vocab_size") != vocab_size:
        raise TokenizerMismatchError(
            f"{where}: produced for vocabulary size {recorded.get('vocab_size')}, "
            f"but the snapshot tokenizer has {vocab_size}")


def shard_digest(sentinel: dict) -> str:
    """A short digest of a sentinel's file hashes (for provenance labels)."""
    return hashlib.sha256("".join(f["sha256"] for f in sentinel["files"]).encode()).hexdigest()[:16]
