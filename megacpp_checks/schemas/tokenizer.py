"""Pandera schema of the tokenizer stage's ``tokenizer_sample_ids`` table
(:mod:`megacpp_core.sample_ids`): one row per training-sample file, sorted by ``doc_key``,
with the sha256 of its text and its ids (``uint32``, no BOS). :func:`validate_sample_ids`
backs the generated ``tokenizer_sample_ids_schema`` blocking check."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pandera.pandas as pa
import pyarrow as pa_arrow

from . import TEXT, validate_frame

SAMPLE_IDS = pa.DataFrameSchema(
    {
        "doc_key": pa.Column(TEXT, unique=True),
        "content_sha256": pa.Column(TEXT, pa.Check.str_matches(r"^[0-9a-f]{64}$")),
        "n_tokens": pa.Column("int64", pa.Check.ge(0)),
        "n_ids": pa.Column("int64"),
    },
    checks=[pa.Check(lambda df: df["n_tokens"] == df["n_ids"], error="n_tokens == len(ids)"),
            pa.Check(lambda df: bool(df["doc_key"].is_monotonic_increasing), error="rows sorted by doc_key")],
    strict=True,
)


def validate_sample_ids(table: pa_arrow.Table) -> tuple[bool, str]:
    """Validate a ``tokenizer_sample_ids`` table: unique keys in ascending order, a hex
    sha256 each, ``n_tokens`` equal to the length of ``ids``; ``(passed, detail)``."""
    ids = table.column("ids").combine_chunks() if table.num_rows else None
    n_ids = (np.diff(ids.offsets.to_numpy()).astype(np.int64) if ids is not None else np.zeros(0, np.int64))
    facts = pd.DataFrame({
        "doc_key": pd.Series(table.column("doc_key").to_pylist(), dtype=str),
        "content_sha256": pd.Series(table.column("content_sha256").to_pylist(), dtype=str),
        "n_tokens": table.column("n_tokens").to_numpy().astype(np.int64),
        "n_ids": n_ids,
    })
    return validate_frame(SAMPLE_IDS, facts, "tokenizer sample ids")
