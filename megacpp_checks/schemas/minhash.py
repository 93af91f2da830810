"""Pandera schemas of the MinHash tables (SPEC §4 row 4): per-revision ``minhash``
signatures and the cross-source LSH candidate ``pairs`` of a band range.

``minhash``: one row per scrubbed file, its ``doc_key`` and ``signature`` (a list of
``num_perm`` uint32 hash minima; every row the same length). ``pairs``: one row per
candidate pair as two rows of the snapshot's minhash inputs concatenated in input order,
``row_a < row_b``, sorted and unique. :func:`validate_signatures`
and :func:`validate_pairs` back the blocking ``minhash_schema`` and ``lsh_pairs_*_schema``
checks.
"""

from __future__ import annotations

import pandera.pandas as pa
import pyarrow as pa_arrow
import pyarrow.compute as pc

from . import TEXT, validate_frame

SIGNATURE_KEYS = pa.DataFrameSchema({"doc_key": pa.Column(TEXT, unique=True)}, strict=True, coerce=False)

PAIRS = pa.DataFrameSchema(
    {"row_a": pa.Column("int64", pa.Check.ge(0)), "row_b": pa.Column("int64")},
    checks=[
        pa.Check(lambda df: df["row_a"] < df["row_b"], error="row_a < row_b"),
        pa.Check(lambda df: ~df.duplicated(["row_a", "row_b"]), error="pairs are unique"),
    ],
    strict=True,
    coerce=False,
)


def validate_signatures(table: pa_arrow.Table) -> tuple[bool, str]:
    """Validate a ``minhash`` table: unique ``doc_key`` s and one uint32 signature of the
    same length on every row (no nulls). ``(passed, detail)``; never raises on bad rows."""
    if table.column_names != ["doc_key", "signature"]:
        return False, f"minhash: columns {table.column_names}, expected ['doc_key', 'signature']"
    ok, detail = validate_frame(SIGNATURE_KEYS, table.select(["doc_key"]), "minhash")
    if not ok:
        return ok, detail
    sig = table.column("signature")
    if table.num_rows == 0:
        return True, "minhash: 0 rows valid"
    vtype = sig.type.value_type
    if vtype != pa_arrow.uint32():
        return False, f"minhash: signature values are {vtype}, expected uint32"
    if sig.null_count:
        return False, f"minhash: {sig.null_count} null signatures"
    lengths = pc.list_value_length(sig)
    lo, hi = pc.min(lengths).as_py(), pc.max(lengths).as_py()
    if lo != hi or not lo:
        return False, f"minhash: signature lengths range {lo}..{hi}, expected one positive length"
    return True, f"minhash: {table.num_rows} signatures of {lo} uint32"


def validate_pairs(table: pa_arrow.Table) -> tuple[bool, str]:
    """Validate an LSH ``pairs`` table; ``(passed, detail)``, never raises on bad rows."""
    return validate_frame(PAIRS, table, "lsh_pairs")


def validate_pairs_file(pf) -> tuple[bool, str]:
    """Validate a committed LSH ``pairs`` file one row group at a time: :data:`PAIRS` on each
    and the pairs strictly ascending as ``(row_a, row_b)`` across the file (so unique).
    ``(passed, detail)``; never raises on bad rows."""
    import numpy as np

    last, rows = None, 0
    for i in range(pf.num_row_groups):
        t = pf.read_row_group(i, use_threads=False)
        ok, detail = validate_frame(PAIRS, t, "lsh_pairs")
        if not ok:
            return ok, detail
        code = (t.column("row_a").to_numpy() << 32) | t.column("row_b").to_numpy()
        if (np.diff(code) <= 0).any() or (last is not None and len(code) and code[0] <= last):
            return False, "lsh_pairs: pairs not strictly ascending"
        last = code[-1] if len(code) else last
        rows += t.num_rows
    return True, f"lsh_pairs: {rows} rows valid"
