"""Pandera schema of the stage-9 packed rows (SPEC §6), validating every row.

Packed rows hold length-L lists, so the schema runs over a per-row *facts* frame
(:func:`row_facts`, one record per packed row, computed vectorized with numpy): list
lengths, max token id, first token, non-PAD tokens past ``valid_token_count``, BOS count,
``doc_ids``/``target_ids``/``loss_mask`` disagreements with the values the tokens imply,
bad chunk spans and edges, null values. :func:`packed_schema` declares the rule for each fact, so a
failure report lists every violating ``pack_id`` with the rule it broke.
:func:`validate_packed` backs the blocking ``row_contract`` asset check together with
:func:`megacpp_core.pack.check_rows` (the producer's assertion).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pandera.pandas as pa
import pyarrow as pa_arrow

from megacpp_core import pack

_LIST_COLUMNS = ("input_ids", "target_ids", "loss_mask", "doc_ids")


def _lists(table: pa_arrow.Table, column: str, L: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(per-row list lengths, (rows, L) matrix with rows of the wrong length zero-filled,
    per-row count of null values). The matrix keeps the values' own dtype (uint32 ids, uint8
    planes: a row of a 16,384-token family is 64 KiB of ids, not 128); a null value reads
    as 0 there and is counted."""
    col = table.column(column).combine_chunks()
    lengths = col.value_lengths().fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    ok = lengths == L
    flat = col.flatten()
    nulls = np.zeros(len(col), np.int64)
    if flat.null_count:
        owner = np.repeat(np.arange(len(col)), np.maximum(lengths, 0))
        nulls = np.bincount(owner[~flat.is_valid().to_numpy(zero_copy_only=False)], minlength=len(col)).astype(np.int64)
        flat = flat.fill_null(0)
    values = flat.to_numpy(zero_copy_only=False)
    if ok.all():
        return lengths, values.reshape(-1, L), nulls
    mat = np.zeros((len(col), L), dtype=values.dtype)
    for i in np.flatnonzero(ok):
        mat[i] = np.asarray(col[int(i)].values.fill_null(0))
    return lengths, mat, nulls


def row_facts(table: pa_arrow.Table, row_length: int, bos_id: int, pad_id: int) -> pd.DataFrame:
    """One record per packed row with the facts :func:`packed_schema` checks (int64)."""
    L = row_length
    n = table.num_rows
    facts: dict[str, np.ndarray] = {"pack_id": table.column("pack_id").to_numpy().astype(np.int64)}
    mats = {}
    null_values = np.zeros(n, np.int64)
    for c in _LIST_COLUMNS:
        facts[f"{c}_len"], mats[c], nulls = _lists(table, c, L)
        null_values += nulls
    inp, tgt, msk, dids = (mats[c] for c in _LIST_COLUMNS)
    valid = table.column("valid_token_count").to_numpy().astype(np.int64)
    ndocs = table.column("num_docs").to_numpy().astype(np.int64)
    facts.update(valid_token_count=valid, num_docs=ndocs,
                 slack_tokens=table.column("slack_tokens").to_numpy().astype(np.int64))
    facts["max_id"] = inp.max(axis=1).astype(np.int64) if n else np.zeros(0, np.int64)
    facts["first_id"] = inp[:, 0].astype(np.int64) if n else np.zeros(0, np.int64)
    in_valid = np.arange(L)[None, :] < valid[:, None]
    facts["non_pad_tail"] = ((inp != pad_id) & ~in_valid).sum(axis=1)
    is_bos = (inp == bos_id) & in_valid
    facts["bos_count"] = is_bos.sum(axis=1)
    expect_doc = np.where(in_valid, np.cumsum(is_bos, axis=1), 0)
    facts["doc_id_errors"] = (dids != expect_doc).sum(axis=1)
    nxt = np.zeros_like(in_valid)
    nxt[:, :-1] = in_valid[:, 1:] & (expect_doc[:, 1:] == expect_doc[:, :-1])
    exp_tgt = np.full_like(inp, pad_id)
    exp_tgt[:, :-1] = np.where(nxt[:, :-1], inp[:, 1:], pad_id)
    facts["target_errors"] = (tgt != exp_tgt).sum(axis=1)
    facts["loss_errors"] = ((msk > 1) | ((msk == 1) & ~nxt)).sum(axis=1)
    for c in ("doc_keys", "provenance"):
        facts[f"{c}_len"] = table.column(c).combine_chunks().value_lengths().fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    names = set(table.column_names)
    plane_errors = np.zeros(n, np.int64)
    for p in pack.PLANES:
        if p in names:
            lens, mat, nulls = _lists(table, p, L)
            plane_errors += (lens != L) + ((mat != 0) & ~in_valid).sum(axis=1)
            null_values += nulls
    facts["plane_errors"] = plane_errors
    span_errors = np.zeros(n, np.int64)
    nchunks = np.zeros(n, np.int64)
    if "chunk_boundaries" in names:
        rows, flat = pack._list_parts(table, "chunk_boundaries")
        nchunks = np.bincount(rows, minlength=n).astype(np.int64)
        if len(flat):
            s = flat.field("start").to_numpy(zero_copy_only=False).astype(np.int64)
            e = flat.field("end").to_numpy(zero_copy_only=False).astype(np.int64)
            bad = (s < 0) | (e <= s) | (e > valid[rows])
            se, ee = np.clip(s, 0, L - 1), np.clip(e - 1, 0, L - 1)
            bad |= dids[rows, se] != dids[rows, ee]
            span_errors += np.bincount(rows[bad], minlength=n)
    for ecol in pack.EDGE_COLUMNS:
        if ecol in names:
            rows, flat = pack._list_parts(table, ecol)
            if len(flat):
                f = flat.field("from").to_numpy(zero_copy_only=False).astype(np.int64)
                t = flat.field("to").to_numpy(zero_copy_only=False).astype(np.int64)
                bad = (f < 0) | (t < 0) | (f >= nchunks[rows]) | (t >= nchunks[rows])
                span_errors += np.bincount(rows[bad], minlength=n)
    facts["span_errors"] = span_errors
    facts["null_values"] = null_values
    facts["platform_ids_len"] = (table.column("platform_ids").combine_chunks().value_lengths().fill_null(-1)
                                 .to_numpy(zero_copy_only=False).astype(np.int64)
                                 if "platform_ids" in names else ndocs.copy())
    return pd.DataFrame(facts)


def packed_schema(row_length: int, vocab_size: int, bos_id: int) -> pa.DataFrameSchema:
    """The SPEC §6 row rules over :func:`row_facts` for rows of ``row_length`` tokens."""
    L = row_length
    zero = pa.Check.eq(0)
    return pa.DataFrameSchema(
        {
            "pack_id": pa.Column("int64", pa.Check.ge(0), unique=True),
            **{f"{c}_len": pa.Column("int64", pa.Check.eq(L), title=f"len({c}) == L") for c in _LIST_COLUMNS},
            "valid_token_count": pa.Column("int64", pa.Check.in_range(1, L)),
            "num_docs": pa.Column("int64", pa.Check.ge(1)),
            "max_id": pa.Column("int64", pa.Check.lt(vocab_size), title="ids < vocab"),
            "first_id": pa.Column("int64", pa.Check.eq(bos_id), title="BOS first"),
            "non_pad_tail": pa.Column("int64", zero, title="PAD after valid_token_count"),
            "doc_id_errors": pa.Column("int64", zero, title="doc_ids == cumsum(BOS)"),
            "target_errors": pa.Column("int64", zero, title="target = next in-document token"),
            "loss_errors": pa.Column("int64", zero, title="loss only on real in-document targets"),
            "plane_errors": pa.Column("int64", zero, title="planes length L, 0 on pad"),
            "span_errors": pa.Column("int64", zero, title="spans inside valid prefix and one document"),
            "null_values": pa.Column("int64", zero, title="no null id, mask, doc id or plane value"),
        },
        checks=[
            pa.Check(lambda df: df["num_docs"] == df["bos_count"], error="num_docs == count(BOS)"),
            pa.Check(lambda df: df["slack_tokens"] == L - df["valid_token_count"], error="slack_tokens == L - valid"),
            pa.Check(lambda df: df["doc_keys_len"] == df["num_docs"], error="len(doc_keys) == num_docs"),
            pa.Check(lambda df: df["provenance_len"] == df["num_docs"], error="len(provenance) == num_docs"),
            pa.Check(lambda df: df["platform_ids_len"] == df["num_docs"], error="len(platform_ids) == num_docs"),
        ],
        strict=False,
        coerce=False,
    )


def validate_packed(table: pa_arrow.Table, row_length: int, vocab_size: int, bos_id: int, pad_id: int,
                    where: str = "packed") -> tuple[bool, str]:
    """Validate every row of a packed table; ``(passed, detail)``, never raises on bad rows.

    The detail names the failing ``pack_id``s and rules (first five failure cases)."""
    missing = [c for c in pack.ROW_SCHEMA.names if c not in table.column_names]
    if missing:
        return False, f"{where}: required columns missing: {missing}"
    df = row_facts(table, row_length, bos_id, pad_id)
    try:
        packed_schema(row_length, vocab_size, bos_id).validate(df, lazy=True)
    except pa.errors.SchemaErrors as e:
        fc = e.failure_cases
        idx = [int(i) for i in fc["index"].dropna().unique()[:5]] if "index" in fc else []
        ids = df["pack_id"].iloc[idx].tolist() if idx else []
        rules = sorted({str(k) if ctx == "DataFrameSchema" else f"{c}: {k}"
                        for ctx, c, k in zip(fc["schema_context"], fc["column"], fc["check"])})[:20]
        return False, f"{where}: {len(fc)} row-contract failures in pack_ids {ids}: {rules}"
    return True, f"{where}: {len(df)} rows valid"
