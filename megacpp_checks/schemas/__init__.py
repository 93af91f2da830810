"""Pandera schemas, one module per stage table (SPEC §2: ``megacpp_checks`` holds the
schemas of every table). Each module exposes a pandera ``DataFrameModel`` or
``DataFrameSchema`` and a ``validate_*`` helper used by the blocking asset checks."""

import pandas as pd
import pandera.pandas as pa
import pyarrow as pa_arrow


def validate_frame(schema: pa.DataFrameSchema, table: pa_arrow.Table | pd.DataFrame, what: str) -> tuple[bool, str]:
    """Validate ``table`` lazily against ``schema``; return ``(passed, detail)``.

    Never raises on bad rows: ``detail`` names the table (``what``), the number of failure
    cases and the first five of them, or the number of valid rows.
    """
    df = table if isinstance(table, pd.DataFrame) else table.to_pandas()
    try:
        schema.validate(df, lazy=True)
    except pa.errors.SchemaErrors as e:
        cases = e.failure_cases.head(5).to_dict("records")
        return False, f"{what}: {len(e.failure_cases)} schema failures, first: {cases}"
    return True, f"{what}: {len(df)} rows valid"
