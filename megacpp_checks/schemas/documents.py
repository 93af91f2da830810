"""Pandera schemas of the document tables of stages 6 and 8 (SPEC §4 rows 6 and 8).

- ``documents/chunks.parquet`` (stage 6, :func:`validate_documents`): every document
  within its bucket and the budget, a known kind, its text equal to its span; when
  enriched, one value per character in every ``char_*`` plane, chunk spans ordered and
  inside the document, edges between existing chunks, at most 20 platform labels.
- ``tokenized/documents.parquet`` (stage 8, :func:`validate_tokenized`): BOS first,
  one value per token in every plane and span column, token character spans covering
  the text exactly, chunk spans inside ``[1, n_tokens)`` in order, edges in range.

Both reduce each row to a few facts with numpy over the flattened Arrow lists (no Python
loop over tokens), then validate the facts frame with pandera; ``(passed, detail)``
never raises on bad rows.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pandera.pandas as pa
import pyarrow as pa_arrow
import pyarrow.compute as pc

from megacpp_core.chunk import BUCKETS, StructureCategory
from megacpp_core.platforms import MAX_LABELS_PER_DOCUMENT

from . import TEXT, validate_frame

_KINDS = [c.name for c in StructureCategory]
_PLANE_MAX = {"structure_ids": 8, "ast_depth": 63, "sibling_index": 63, "ast_node_type": 255, "dep_levels": 255}
_CHAR_PLANE_MAX = {"char_structure": 8, "char_ast_depth": 63, "char_sibling_index": 63, "char_ast_node_type": 255}


def _rows_of(arr: pa_arrow.Array) -> tuple[np.ndarray, np.ndarray]:
    """(row index of every flattened element, element count per row) of a list array."""
    arr = arr.combine_chunks() if isinstance(arr, pa_arrow.ChunkedArray) else arr
    n = arr.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    return np.repeat(np.arange(len(n)), n), n


def _binary_values(arr: pa_arrow.Array) -> np.ndarray:
    """All bytes of a (large_)binary array's values, as uint8, in row order."""
    buf = arr.buffers()[2]
    if buf is None or len(arr) == 0:
        return np.zeros(0, dtype=np.uint8)
    width = np.int64 if pa_arrow.types.is_large_binary(arr.type) else np.int32
    offs = np.frombuffer(arr.buffers()[1], dtype=width)[arr.offset:arr.offset + len(arr) + 1]
    return np.frombuffer(buf, dtype=np.uint8)[offs[0]:offs[-1]]


def _binary_rows(arr: pa_arrow.Array) -> tuple[np.ndarray, np.ndarray]:
    """(row index of every value byte, byte count per row) of a (large_)binary array."""
    n = pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    return np.repeat(np.arange(len(n)), n), n


def _row_any(rows: np.ndarray, bad: np.ndarray, nrows: int) -> np.ndarray:
    return np.bincount(rows[bad], minlength=nrows) > 0 if bad.size else np.zeros(nrows, dtype=bool)


def _chunk_facts(table: pa_arrow.Table, column: str, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(chunks inside [lo, hi) and in order, number of chunks) per row."""
    col = table.column(column).combine_chunks()
    rows, n = _rows_of(col)
    flat = col.flatten()
    s = flat.field("start").to_numpy(zero_copy_only=False).astype(np.int64)
    e = flat.field("end").to_numpy(zero_copy_only=False).astype(np.int64)
    kinds_ok = pc.is_in(flat.field("kind"), pa_arrow.array(_KINDS)).to_numpy(zero_copy_only=False)
    dep = flat.field("dep_level").fill_null(-1).to_numpy(zero_copy_only=False)
    bad = (s < lo[rows]) | (e > hi[rows]) | (s >= e) | ~kinds_ok | (dep < 0)
    if s.size > 1:  # each chunk starts at or after the previous one's end, within a row
        same = rows[1:] == rows[:-1]
        bad[1:] |= same & (s[1:] < e[:-1])
    return ~_row_any(rows, bad, table.num_rows), n


def _edge_facts(table: pa_arrow.Table, nchunks: np.ndarray) -> np.ndarray:
    ok = np.ones(table.num_rows, dtype=bool)
    for column in ("call_edges", "type_edges"):
        col = table.column(column).combine_chunks()
        rows, _ = _rows_of(col)
        flat = col.flatten()
        a = flat.field("from").to_numpy(zero_copy_only=False).astype(np.int64)
        b = flat.field("to").to_numpy(zero_copy_only=False).astype(np.int64)
        bad = (a < 0) | (b < 0) | (a >= nchunks[rows]) | (b >= nchunks[rows]) | (a == b)
        ok &= ~_row_any(rows, bad, table.num_rows)
    return ok


def _platform_facts(table: pa_arrow.Table) -> np.ndarray:
    col = table.column("platform_ids").combine_chunks()
    rows, n = _rows_of(col)
    v = col.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    bad = v == 0
    if v.size > 1:
        bad[1:] |= (rows[1:] == rows[:-1]) & (v[1:] <= v[:-1])  # sorted, unique
    return (n <= MAX_LABELS_PER_DOCUMENT) & ~_row_any(rows, bad, table.num_rows)


def _graph_facts(table: pa_arrow.Table, facts: pd.DataFrame, chunk_column: str, lo: np.ndarray, hi: np.ndarray) -> None:
    """Set ``chunks_inside`` (spans in [lo, hi), in order), ``edges_in_range`` and
    ``platforms_ok`` on ``facts`` (one row per document)."""
    chunks_ok, nchunks = _chunk_facts(table, chunk_column, lo, hi)
    facts["chunks_inside"] = chunks_ok
    facts["edges_in_range"] = _edge_facts(table, nchunks)
    facts["platforms_ok"] = _platform_facts(table)


#: Facts present only for enriched tables.
_GRAPH_COLUMNS = {name: pa.Column(bool, pa.Check.eq(True), required=False)
                  for name in ("chunks_inside", "edges_in_range", "platforms_ok")}


def document_facts(table: pa_arrow.Table) -> pd.DataFrame:
    """One row of facts per stage-6 document (see :data:`DOCUMENTS`)."""
    text_len = pc.utf8_length(table.column("text")).to_numpy(zero_copy_only=False).astype(np.int64)
    start = table.column("start").to_numpy().astype(np.int64)
    end = table.column("end").to_numpy().astype(np.int64)
    facts = pd.DataFrame({
        "doc_key": pd.Series(table.column("doc_key").to_pylist(), dtype=str),  # typed even when empty
        "kind": pd.Series(table.column("kind").to_pylist(), dtype=str),
        "n_text_tokens": table.column("n_text_tokens").to_numpy().astype(np.int64),
        "bucket": table.column("bucket").to_numpy().astype(np.int64),
        "span_is_text": (end - start) == text_len,
    })
    if "char_structure" in table.column_names:
        ok = np.ones(table.num_rows, dtype=bool)
        for col, vmax in _CHAR_PLANE_MAX.items():
            c = table.column(col).combine_chunks()
            n = pc.binary_length(c).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
            ok &= n == text_len
            r, _ = _binary_rows(c)
            v = _binary_values(c)
            ok &= ~_row_any(r, v > vmax, table.num_rows)
        facts["planes_per_character"] = ok
        _graph_facts(table, facts, "char_chunk_boundaries", np.zeros_like(text_len), text_len)
    return facts


DOCUMENTS = pa.DataFrameSchema(
    {
        "doc_key": pa.Column(TEXT, unique=True),
        "kind": pa.Column(TEXT, pa.Check.isin(_KINDS)),
        "n_text_tokens": pa.Column("int64", pa.Check.ge(1)),
        "bucket": pa.Column("int64", pa.Check.isin(list(BUCKETS))),
        "span_is_text": pa.Column(bool, pa.Check.eq(True)),
        "planes_per_character": pa.Column(bool, pa.Check.eq(True), required=False),
        **_GRAPH_COLUMNS,
    },
    checks=[pa.Check(lambda df: df["n_text_tokens"] + 1 <= df["bucket"], error="document (with BOS) within its bucket")],
    strict=True,
)


def validate_documents(table: pa_arrow.Table) -> tuple[bool, str]:
    """Validate the stage-6 documents table (``documents/chunks.parquet``)."""
    return validate_frame(DOCUMENTS, document_facts(table), "documents")


def _planes_ok(table: pa_arrow.Table, n_ids: np.ndarray) -> np.ndarray:
    """Per row: every token plane has one value per id, each within its range."""
    ok = np.ones(table.num_rows, dtype=bool)
    for p, vmax in _PLANE_MAX.items():
        col = table.column(p).combine_chunks()
        r, n = _rows_of(col)
        ok &= (n == n_ids) & ~_row_any(r, col.flatten().to_numpy(zero_copy_only=False) > vmax, table.num_rows)
    return ok


def tokenized_facts(table: pa_arrow.Table, bos_id: int) -> pd.DataFrame:
    """One row of facts per stage-8 document (see :data:`TOKENIZED`)."""
    ids = table.column("input_ids").combine_chunks()
    rows, n_ids = _rows_of(ids)
    facts = pd.DataFrame({
        "doc_key": pd.Series(table.column("doc_key").to_pylist(), dtype=str),  # typed even when empty
        "n_tokens": table.column("n_tokens").to_numpy().astype(np.int64),
        "n_ids": n_ids,
        "bos_first": (pc.list_element(ids, 0).to_numpy(zero_copy_only=False) == bos_id) if len(ids) else np.zeros(0, bool),
    })
    if "structure_ids" not in table.column_names:
        return facts
    text_len = pc.utf8_length(table.column("text")).to_numpy(zero_copy_only=False).astype(np.int64)
    facts["planes_per_token"] = _planes_ok(table, n_ids)
    cs_col = table.column("token_char_start").combine_chunks()
    ce_col = table.column("token_char_end").combine_chunks()
    r, n = _rows_of(cs_col)
    cs = cs_col.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    ce = ce_col.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    spans_ok = (n == n_ids) & (_rows_of(ce_col)[1] == n_ids)
    first = np.concatenate([[0], np.cumsum(n)[:-1]]) if n.size else n
    is_bos = np.zeros(cs.size, dtype=bool)
    is_bos[first[n > 0]] = True
    bad = is_bos & ((cs != 0) | (ce != 0))
    bad |= ~is_bos & ((ce <= cs) | (cs < 0) | (ce > text_len[r]))
    if cs.size > 1:  # consecutive tokens abut, or share one split character
        nxt = np.zeros(cs.size, dtype=bool)
        nxt[1:] = (r[1:] == r[:-1]) & ~is_bos[1:] & ~is_bos[:-1]
        gap = np.zeros(cs.size, dtype=np.int64)
        gap[1:] = ce[:-1] - cs[1:]
        bad |= nxt & ~((gap == 0) | (gap == 1))
    spans_ok &= ~_row_any(r, bad, table.num_rows)
    # the first real token starts at 0 and the last one ends at the text's end
    last = np.cumsum(n) - 1
    has_body = n > 1
    body_first = np.where(has_body, first + 1, 0)
    spans_ok &= np.where(has_body, (cs[body_first] == 0) & (ce[np.maximum(last, 0)] == text_len), text_len == 0)
    facts["spans_cover_text"] = spans_ok
    _graph_facts(table, facts, "chunk_boundaries", np.ones_like(n_ids), n_ids)
    return facts


TOKENIZED = pa.DataFrameSchema(
    {
        "doc_key": pa.Column(TEXT, unique=True),
        "n_tokens": pa.Column("int64", pa.Check.ge(1)),
        "n_ids": pa.Column("int64"),
        "bos_first": pa.Column(bool, pa.Check.eq(True)),
        "planes_per_token": pa.Column(bool, pa.Check.eq(True), required=False),
        "spans_cover_text": pa.Column(bool, pa.Check.eq(True), required=False),
        **_GRAPH_COLUMNS,
    },
    checks=[pa.Check(lambda df: df["n_tokens"] == df["n_ids"], error="n_tokens == len(input_ids)")],
    strict=True,
)


def validate_tokenized(table: pa_arrow.Table, bos_id: int) -> tuple[bool, str]:
    """Validate the stage-8 tokenized documents table (``tokenized/documents.parquet``)."""
    return validate_frame(TOKENIZED, tokenized_facts(table, bos_id), "tokenized documents")


def validate_tokenized_documents(table: pa_arrow.Table) -> tuple[bool, str]:
    """:func:`validate_tokenized` with the tokenizer's fixed ``<BOS>`` id (SPEC §4: id 2)."""
    from megacpp_core.tokenizer import BOS_ID

    return validate_tokenized(table, BOS_ID)


def family_facts(table: pa_arrow.Table, bos_id: int, row_length: int) -> pd.DataFrame:
    """One row of facts per curriculum-family document (see :data:`FAMILY`): the stage-8
    facts less the character spans, plus the BOS count and the family's row length."""
    ids = table.column("input_ids").combine_chunks()
    rows, n_ids = _rows_of(ids)
    flat = ids.flatten().to_numpy(zero_copy_only=False) if len(ids) else np.zeros(0, np.uint32)
    facts = pd.DataFrame({
        "doc_key": pd.Series(table.column("doc_key").to_pylist(), dtype=str),
        "n_tokens": table.column("n_tokens").to_numpy().astype(np.int64),
        "n_ids": n_ids,
        "bos_first": (pc.list_element(ids, 0).to_numpy(zero_copy_only=False) == bos_id) if len(ids) else np.zeros(0, bool),
        "one_bos": np.bincount(rows[flat == bos_id], minlength=table.num_rows) == 1 if table.num_rows else np.zeros(0, bool),
        "fits_row": n_ids <= row_length,
    })
    if "structure_ids" in table.column_names:
        facts["planes_per_token"] = _planes_ok(table, n_ids)
    if "chunk_boundaries" in table.column_names:
        facts["chunks_inside"], nchunks = _chunk_facts(table, "chunk_boundaries", np.ones_like(n_ids), n_ids)
        facts["edges_in_range"] = _edge_facts(table, nchunks)
    if "platform_ids" in table.column_names:
        facts["platforms_ok"] = _platform_facts(table)
    return facts


FAMILY = pa.DataFrameSchema(
    {
        "doc_key": pa.Column(TEXT, unique=True),
        "n_tokens": pa.Column("int64", pa.Check.ge(2)),
        "n_ids": pa.Column("int64"),
        "bos_first": pa.Column(bool, pa.Check.eq(True)),
        "one_bos": pa.Column(bool, pa.Check.eq(True)),
        "fits_row": pa.Column(bool, pa.Check.eq(True)),
        "planes_per_token": pa.Column(bool, pa.Check.eq(True), required=False),
        **_GRAPH_COLUMNS,
    },
    checks=[pa.Check(lambda df: df["n_tokens"] == df["n_ids"], error="n_tokens == len(input_ids)")],
    strict=True,
)


def validate_family_documents(table: pa_arrow.Table, row_length: int) -> tuple[bool, str]:
    """Validate the documents of a curriculum family with rows of ``row_length`` tokens
    (:func:`family_validator`); ``(passed, detail)``."""
    from megacpp_core.tokenizer import BOS_ID

    return validate_frame(FAMILY, family_facts(table, BOS_ID, row_length), "family documents")


def family_validator(row_length: int):
    """``validate(table) -> (passed, detail)`` for the documents of a curriculum family
    with rows of ``row_length`` tokens: unique keys, one BOS and it first, at least one
    token after it, ``n_tokens == len(input_ids) <= row_length``, planes one value per
    token, the chunk graph in range and at most 20 sorted platform labels when present
    (SPEC §5b, §6). A ``functools.partial`` of a module function, so stage declarations
    holding it pickle by name (``megacpp run --workers`` sends them to its workers)."""
    return functools.partial(validate_family_documents, row_length=row_length)


#: Documents :func:`validate_family_documents_file` validates at once (as Python objects).
FILE_BATCH_DOCS = 64


def validate_family_documents_file(pf, row_length: int) -> tuple[bool, str]:
    """Validate a committed family documents file (``pyarrow.parquet.ParquetFile``)
    :data:`FILE_BATCH_DOCS` documents at a time: :func:`validate_family_documents` on each
    batch, and ``doc_key`` unique across the file (a set of the keys is the only state).
    ``(passed, detail)``; never raises on bad rows."""
    seen: set[str] = set()
    rows = 0
    for batch in pf.iter_batches(batch_size=FILE_BATCH_DOCS, use_threads=False):
        t = pa_arrow.Table.from_batches([batch])
        ok, detail = validate_family_documents(t, row_length)
        if not ok:
            return ok, f"{detail} (documents from {rows})"
        keys = t.column("doc_key").to_pylist()
        again = seen.intersection(keys)
        if again:
            return False, f"family documents: doc_key {sorted(again)[0]!r} appears twice"
        seen.update(keys)
        rows += t.num_rows
    return True, f"family documents: {rows} documents valid"


def family_file_validator(row_length: int):
    """:func:`validate_family_documents_file` for rows of ``row_length`` tokens (a
    ``functools.partial``, so stage declarations pickle by name)."""
    return functools.partial(validate_family_documents_file, row_length=row_length)
