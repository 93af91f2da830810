"""Pandera schema of the stage-7 ``chunk_drops`` table (SPEC §4 row 7).

One row per dropped chunk: its ``doc_key``, its ``kind`` — only the whitelisted kinds
(:data:`megacpp_core.chunk_dedup.WHITELIST`) may ever be dropped — and the ``kept_twin``
it duplicates. :func:`validate_drops` backs the blocking ``chunk_drops_schema`` check.
"""

from __future__ import annotations

import pandera.pandas as pa
import pyarrow as pa_arrow

from megacpp_core.chunk_dedup import WHITELIST

from . import TEXT, validate_frame

DROPS = pa.DataFrameSchema(
    {
        "doc_key": pa.Column(TEXT, unique=True),
        "kind": pa.Column(TEXT, pa.Check.isin(sorted(WHITELIST))),
        "kept_twin": pa.Column(TEXT),
    },
    checks=[pa.Check(lambda df: df["doc_key"] != df["kept_twin"], error="a chunk is not its own twin")],
    strict=True,
    coerce=False,
)


def validate_drops(table: pa_arrow.Table) -> tuple[bool, str]:
    """Validate a ``chunk_drops`` table; ``(passed, detail)``, never raises on bad rows."""
    return validate_frame(DROPS, table, "chunk_drops")
