"""Pandera schemas, one module per stage table (SPEC §2: ``megacpp_checks`` holds the
schemas of every table). Each module exposes a pandera ``DataFrameModel`` or
``DataFrameSchema`` and a ``validate_*`` helper used by the blocking asset checks."""

import pandas as pd
import pandera.pandas as pa
import pyarrow as pa_arrow
from pandera import dtypes
from pandera.engines import pandas_engine


@dtypes.immutable(init=True)
class Text(pandas_engine.STRING):
    """pandera's dtype of a ``str`` column (pandas' arrow-backed ``StringDtype``, what
    ``pyarrow.Table.to_pandas`` makes of ``string`` and ``large_string`` columns), answering
    its dtype check for the whole column when the column has that dtype.

    The stock dtype answers such a column with one ``True`` per element, and pandera then
    builds an (empty) table of failure cases and formats it into a message, per column and
    per validation: about 1 ms a string column, about half of the time of a validation of
    a shard's tables on ``default``. Any other column dtype is checked as the stock dtype
    checks it (element by element for an object column: strings, bytes, mixed values; one
    ``False`` for numbers and the rest), so the verdicts and failure cases are the same
    either way (``tests/test_schemas.py``). Use :data:`TEXT` where pandera takes ``str``."""

    def check(self, pandera_dtype, data_container=None):
        """True when ``pandera_dtype`` is this string dtype; otherwise the stock answer."""
        try:
            same = pandas_engine.Engine.dtype(pandera_dtype).type == self.type
        except TypeError:
            same = False
        return True if same else super().check(pandera_dtype, data_container)


#: The dtype of every string column of the schemas (:class:`Text`).
TEXT = Text()


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
