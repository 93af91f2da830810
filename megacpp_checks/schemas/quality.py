"""Pandera schemas of the stage-1 tables (SPEC §4 row 1): ``quality_kept`` and ``exclusions``.

``quality_kept``: one row per kept file with its decoded text. ``exclusions``: one row per
rejected file with the filter that rejected it (one of
:data:`megacpp_core.quality.FILTERS`), the measured value and the threshold.
:func:`validate_kept` and :func:`validate_exclusions` back the blocking
``quality_schema`` asset check.
"""

from __future__ import annotations

import pandera.pandas as pa
import pyarrow as pa_arrow

from megacpp_core.quality import FILTERS

from . import TEXT, validate_frame

_HEX64 = r"^[0-9a-f]{64}$"

KEPT = pa.DataFrameSchema(
    {
        "doc_key": pa.Column(TEXT, unique=True),
        "source": pa.Column(TEXT, pa.Check.str_length(min_value=1)),
        "path": pa.Column(TEXT, pa.Check.str_length(min_value=1), unique=True),
        "language": pa.Column(TEXT, nullable=True),
        "size": pa.Column("int64", pa.Check.ge(0)),
        "content_sha256": pa.Column(TEXT, pa.Check.str_matches(_HEX64)),
        "text": pa.Column(TEXT),
    },
    checks=[
        pa.Check(lambda df: df["doc_key"] == df["source"] + "/" + df["path"], error="doc_key is SOURCE/PATH"),
        pa.Check(lambda df: df["text"].str.len() <= df["size"], error="text has at most size characters"),
    ],
    strict=True,
    coerce=False,
)

EXCLUSIONS = pa.DataFrameSchema(
    {
        "doc_key": pa.Column(TEXT, unique=True),
        "source": pa.Column(TEXT, pa.Check.str_length(min_value=1)),
        "path": pa.Column(TEXT, pa.Check.str_length(min_value=1)),
        "size": pa.Column("int64", pa.Check.ge(0)),
        "stage": pa.Column(TEXT, pa.Check.eq("quality")),
        "filter": pa.Column(TEXT, pa.Check.isin(list(FILTERS))),
        "value": pa.Column(float),
        "threshold": pa.Column(TEXT, pa.Check.str_length(min_value=1)),
    },
    strict=True,
    coerce=False,
)


def validate_kept(table: pa_arrow.Table) -> tuple[bool, str]:
    """Validate a ``quality_kept`` table; ``(passed, detail)``, never raises on bad rows."""
    return validate_frame(KEPT, table, "quality_kept")


def validate_exclusions(table: pa_arrow.Table) -> tuple[bool, str]:
    """Validate an ``exclusions`` table; ``(passed, detail)``, never raises on bad rows."""
    return validate_frame(EXCLUSIONS, table, "exclusions")
