"""Pandera schema of the stage-0 ``source_files`` table (SPEC §3, §4 row 0).

One row per file of one source revision: provenance (snapshot, source, kind, version or
tag or label, revision = archive sha256 / commit sha / local content hash), the path inside
the source, size, content sha256, language and the stable ``doc_key`` = ``SOURCE/PATH``.
:func:`validate_source_files` backs the blocking ``source_files_schema`` asset check.
"""

from __future__ import annotations

import hashlib

import pandera.pandas as pa
import pyarrow as pa_arrow

from megacpp_core.manifest import KNOWN_KINDS

from . import TEXT, validate_frame

_HEX64 = r"^[0-9a-f]{64}$"
_REVISION = r"^([0-9a-f]{40}|[0-9a-f]{64})$"
_LANGUAGES = ["c", "cpp", "header", "cuda"]

SOURCE_FILES = pa.DataFrameSchema(
    {
        "snapshot": pa.Column(TEXT, pa.Check.str_length(min_value=1)),
        "source": pa.Column(TEXT, pa.Check.str_length(min_value=1)),
        "kind": pa.Column(TEXT, pa.Check.isin(list(KNOWN_KINDS))),
        "version": pa.Column(TEXT, pa.Check.str_length(min_value=1)),
        "revision": pa.Column(TEXT, pa.Check.str_matches(_REVISION)),
        "archive_sha256": pa.Column(TEXT, pa.Check.str_matches(_HEX64), nullable=True),
        "path": pa.Column(TEXT, [pa.Check.str_length(min_value=1),
                                pa.Check(lambda s: ~s.str.startswith("/") & ~s.str.contains(r"(?:^|/)\.\.(?:/|$)"),
                                         element_wise=False, error="path is absolute or has '..'")]),
        "size": pa.Column("int64", pa.Check.ge(0)),
        "content_sha256": pa.Column(TEXT, pa.Check.str_matches(_HEX64)),
        "language": pa.Column(TEXT, pa.Check.isin(_LANGUAGES), nullable=True),
        "doc_key": pa.Column(TEXT, unique=True),
    },
    checks=[
        pa.Check(lambda df: df["doc_key"] == df["source"] + "/" + df["path"], error="doc_key is SOURCE/PATH"),
        pa.Check(lambda df: (df["kind"].isin(["pypi", "archive", "debian"])) == df["archive_sha256"].notna(),
                 error="archive_sha256 is set exactly for pypi, archive and debian sources"),
        pa.Check(lambda df: df["snapshot"].nunique() <= 1 and df["source"].nunique() <= 1 and df["revision"].nunique() <= 1,
                 error="one snapshot, source and revision per table"),
    ],
    strict=False,
    coerce=False,
)


def validate_source_files(table: pa_arrow.Table) -> tuple[bool, str]:
    """Validate a ``source_files`` table (without its ``content`` column) and re-hash the content.

    Returns ``(passed, detail)``; ``detail`` lists the first failure cases when it fails.
    ``size`` and ``content_sha256`` must match the bytes of ``content``.
    """
    meta = table.drop_columns(["content"]).to_pandas()
    ok, detail = validate_frame(SOURCE_FILES, meta, "source_files")
    if not ok:
        return ok, detail
    content = (v.as_buffer() for v in table.column("content"))  # zero-copy views of the bytes
    bad = [k for k, b, n, h in zip(meta["doc_key"], content, meta["size"], meta["content_sha256"])
           if len(b) != n or hashlib.sha256(b).hexdigest() != h]
    if bad:
        return False, f"{len(bad)} rows whose size or sha256 do not match their content, first {bad[0]}"
    return True, f"{len(meta)} rows valid"


__all__ = ["SOURCE_FILES", "validate_source_files"]
