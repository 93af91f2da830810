"""Pandera schema of the stage-3 ``scrubbed`` table (SPEC §4 row 3).

One row per license-accepted file with its scrubbed text, the sha256 of that text's UTF-8
bytes (what exact dedup compares, so dedup never reads texts) and its license provenance.
No row may carry a ``refuse`` decision. :func:`validate_scrubbed` backs the blocking
``scrub_schema`` asset check; the leak re-scan itself is the separate
``rescan_finds_nothing`` check.
"""

from __future__ import annotations

import pandera.pandas as pa
import pyarrow as pa_arrow

from megacpp_core.license import CLASS_ORDER

from . import TEXT, validate_frame

#: The source revision: archive sha256, git commit sha (40 hex) or local content hash.
_REVISION = r"^([0-9a-f]{40}|[0-9a-f]{64})$"

SCRUBBED = pa.DataFrameSchema(
    {
        "doc_key": pa.Column(TEXT, unique=True),
        "source": pa.Column(TEXT, pa.Check.str_length(min_value=1)),
        "source_order": pa.Column("int32", pa.Check.ge(0)),
        "path": pa.Column(TEXT, pa.Check.str_length(min_value=1), unique=True),
        "language": pa.Column(TEXT, nullable=True),
        "archive_sha256": pa.Column(TEXT, pa.Check.str_matches(_REVISION), nullable=True),
        "license_class": pa.Column(TEXT, pa.Check.isin([c for c in CLASS_ORDER if c != "refused"])),
        "license_decision": pa.Column(TEXT, pa.Check.isin(["accept", "accept_tagged"])),
        "spdx_expression": pa.Column(TEXT, nullable=True),
        "content_sha256": pa.Column(TEXT, pa.Check.str_matches(r"^[0-9a-f]{64}$")),
        "text": pa.Column(TEXT),
    },
    checks=[
        pa.Check(lambda df: df["doc_key"] == df["source"] + "/" + df["path"], error="doc_key is SOURCE/PATH"),
    ],
    strict=False,
    coerce=False,
)


def validate_scrubbed(table: pa_arrow.Table) -> tuple[bool, str]:
    """Validate a ``scrubbed`` table; ``(passed, detail)``, never raises on bad rows.

    Extra columns are allowed (later issues may add provenance columns)."""
    return validate_frame(SCRUBBED, table, "scrubbed")
