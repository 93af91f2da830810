"""Pandera schema of the stage-2 ``license`` table (SPEC §4 row 2).

One row per file kept by stage 1: SPDX expression (null when nothing was found), license
class (:data:`megacpp_core.license.CLASS_ORDER`), decision
(:data:`megacpp_core.license.DECISIONS`), reason, origin
(:data:`megacpp_core.license.ORIGINS`) and the directory license file used (set exactly
when the origin is ``directory_license``); the second signal for Debian source packages:
ScanCode's expression, the ``debian/copyright`` (DEP-5) license and Files pattern, their
``agreement`` (:data:`megacpp_core.dep5.AGREEMENTS`) and which of the two decided. :func:`validate_license` backs the blocking
``license_schema`` asset check.
"""

from __future__ import annotations

import pandera.pandas as pa
import pyarrow as pa_arrow

from megacpp_core.dep5 import AGREEMENTS
from megacpp_core.license import CLASS_ORDER, DECISIONS, ORIGINS

from . import TEXT, validate_frame

LICENSE = pa.DataFrameSchema(
    {
        "doc_key": pa.Column(TEXT, unique=True),
        "source": pa.Column(TEXT, pa.Check.str_length(min_value=1)),
        "path": pa.Column(TEXT, pa.Check.str_length(min_value=1), unique=True),
        "spdx_expression": pa.Column(TEXT, nullable=True),
        "license_class": pa.Column(TEXT, pa.Check.isin(list(CLASS_ORDER))),
        "decision": pa.Column(TEXT, pa.Check.isin(list(DECISIONS))),
        "reason": pa.Column(TEXT, pa.Check.str_length(min_value=1)),
        "origin": pa.Column(TEXT, pa.Check.isin(list(ORIGINS))),
        "license_file": pa.Column(TEXT, nullable=True),
        "license_scancode": pa.Column(TEXT, nullable=True),
        "license_dep5": pa.Column(TEXT, nullable=True),
        "dep5_pattern": pa.Column(TEXT, nullable=True),
        "agreement": pa.Column(TEXT, pa.Check.isin(list(AGREEMENTS))),
        "decided_by": pa.Column(TEXT, pa.Check.isin(["scancode", "dep5"])),
    },
    checks=[
        pa.Check(lambda df: df["doc_key"] == df["source"] + "/" + df["path"], error="doc_key is SOURCE/PATH"),
        pa.Check(lambda df: (df["origin"] == "directory_license") == df["license_file"].notna(),
                 error="license_file is set exactly for directory licenses"),
        pa.Check(lambda df: (df["license_class"] != "refused") | (df["decision"] == "refuse"),
                 error="class 'refused' is always refused"),
        pa.Check(lambda df: (df["license_class"] != "permissive") | (df["decision"] == "accept")
                 | (df["origin"] == "refusal_list"), error="class 'permissive' is accepted"),
        pa.Check(lambda df: (df["origin"] != "refusal_list") | (df["decision"] == "refuse"),
                 error="sources on the refusal list are refused"),
        pa.Check(lambda df: df["spdx_expression"].notna() | df["license_class"].eq("unknown"),
                 error="a file without an expression is of class 'unknown'"),
        pa.Check(lambda df: (df["decided_by"] == "scancode") | df["license_dep5"].notna(),
                 error="a DEP-5 decision names the DEP-5 license"),
        pa.Check(lambda df: df["agreement"].isin(["no_dep5", "not_machine_readable"]) | df["dep5_pattern"].notna()
                 | df["agreement"].eq("no_stanza"), error="a DEP-5 comparison names the Files pattern"),
    ],
    strict=True,
    coerce=False,
)


def validate_license(table: pa_arrow.Table) -> tuple[bool, str]:
    """Validate a ``license`` table; ``(passed, detail)``, never raises on bad rows."""
    return validate_frame(LICENSE, table, "license")
