"""Pandera schema of the libclang lane's ``semantic_edges.parquet`` (SPEC §4, optional layer 5).

One row per unique resolved edge: clang USRs at both ends (``file:PATH`` for includes),
``kind`` in call/type/include, tree-relative POSIX paths (never absolute, never ``..``),
1-based lines, and ``from_chunk``/``to_chunk`` — the file unit holding each end, null when
the file is not a kept file. :func:`validate_edges` backs the blocking ``semantic_schema``
asset check.
"""

from __future__ import annotations

import pandera.pandas as pa
import pyarrow as pa_arrow

from megacpp_core.semantic import STATUSES

from . import TEXT, validate_frame

_REL_PATH = r"^(?!/)(?!.*(^|/)\.\.(/|$)).+$"

EDGES = pa.DataFrameSchema(
    {
        "from_usr": pa.Column(TEXT, pa.Check.str_length(min_value=1)),
        "to_usr": pa.Column(TEXT, pa.Check.str_length(min_value=1)),
        "kind": pa.Column(TEXT, pa.Check.isin(["call", "type", "include"])),
        "from_file": pa.Column(TEXT, pa.Check.str_matches(_REL_PATH)),
        "to_file": pa.Column(TEXT, pa.Check.str_matches(_REL_PATH)),
        "from_line": pa.Column("int32", pa.Check.ge(1)),
        "to_line": pa.Column("int32", pa.Check.ge(1)),
        "from_chunk": pa.Column("Int32", pa.Check.ge(0), nullable=True),
        "to_chunk": pa.Column("Int32", pa.Check.ge(0), nullable=True),
    },
    checks=[
        pa.Check(lambda df: ~df.duplicated(["from_usr", "to_usr", "kind", "from_file", "to_file", "from_line", "to_line"]),
                 error="edges are unique"),
        pa.Check(lambda df: (df["kind"] != "include") | (df["from_usr"].str.startswith("file:") & df["to_usr"].str.startswith("file:")),
                 error="include edges name files"),
    ],
    strict=True,
)


def validate_edges(table: pa_arrow.Table) -> tuple[bool, str]:
    """Validate a ``semantic_edges`` table; ``(passed, detail)``, never raises on bad rows."""
    df = table.to_pandas(types_mapper={pa_arrow.int32(): None}.get)
    for c in ("from_chunk", "to_chunk"):
        if c in df:
            df[c] = df[c].astype("Int32")
    return validate_frame(EDGES, df, "semantic_edges")


BUILD_INFO = pa.DataFrameSchema(
    {
        "file": pa.Column(TEXT, [pa.Check.str_matches(_REL_PATH)], unique=True),
        "arguments": pa.Column(object),
        "shipped": pa.Column(bool),
        "status": pa.Column(TEXT, pa.Check.isin(list(STATUSES))),
        "errors": pa.Column("int32", pa.Check.ge(0)),
        "fatal": pa.Column("int32", pa.Check.ge(0)),
        "call_sites": pa.Column("int32", pa.Check.ge(0)),
        "calls_resolved": pa.Column("int32", pa.Check.ge(0)),
        "calls_resolved_tree": pa.Column("int32", pa.Check.ge(0)),
        "edges": pa.Column("int32", pa.Check.ge(0)),
        "seconds": pa.Column(float, pa.Check.ge(0.0)),
        "peak_rss_mb": pa.Column(float, nullable=True),
        "message": pa.Column(TEXT, nullable=True),
    },
    checks=[pa.Check(lambda df: df["calls_resolved"] <= df["call_sites"], error="resolved calls ≤ call sites"),
            pa.Check(lambda df: df["calls_resolved_tree"] <= df["calls_resolved"], error="tree-resolved ≤ resolved")],
    strict=True,
    coerce=False,
)


def validate_build_info(table: pa_arrow.Table) -> tuple[bool, str]:
    """Validate a ``build_info`` table (one row per translation unit: its arguments, whether
    the database was shipped, status in :data:`megacpp_core.semantic.STATUSES`, counts);
    ``(passed, detail)``, never raises on bad rows."""
    return validate_frame(BUILD_INFO, table.to_pandas(types_mapper={pa_arrow.int32(): None}.get), "build_info")
