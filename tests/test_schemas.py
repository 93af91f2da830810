"""The schemas' string dtype (:class:`megacpp_checks.schemas.Text`): the same verdicts as
pandera's own ``str`` on real and hostile columns, and used by every string column."""

from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pandas as pd
import pandera.pandas as pa
import pyarrow as pa_arrow
import pytest

from megacpp_checks import schemas
from megacpp_checks.schemas import TEXT, Text


def _verdict(schema, df):
    try:
        schema.validate(df, lazy=True)
        return "valid"
    except pa.errors.SchemaErrors as e:
        return sorted(set(e.failure_cases["check"].astype(str))), len(e.failure_cases)


HOSTILE = {
    "python strings": pd.DataFrame({"a": ["x", "y"], "b": ["z", None]}),
    "arrow string": pa_arrow.table({"a": ["x", "y"], "b": ["z", None]}).to_pandas(),
    "arrow large_string": pa_arrow.table({"a": pa_arrow.array(["x", "ü"], pa_arrow.large_string()),
                                          "b": pa_arrow.array([None, "z"], pa_arrow.large_string())}).to_pandas(),
    "object of strings": pd.DataFrame({"a": pd.Series(["x", "y"], dtype=object), "b": ["z", None]}),
    "object with a number": pd.DataFrame({"a": pd.Series(["x", 3], dtype=object), "b": ["z", None]}),
    "binary (invalid UTF-8)": pa_arrow.table({"a": pa_arrow.array([b"\xff\xfe", b"x"]), "b": ["z", None]}).to_pandas(),
    "integers": pd.DataFrame({"a": np.array([1, 2], np.int64), "b": ["z", None]}),
    "null where not nullable": pd.DataFrame({"a": ["x", None], "b": ["z", None]}),
    "no rows": pa_arrow.table({"a": pa_arrow.array([], pa_arrow.string()), "b": pa_arrow.array([], pa_arrow.string())}).to_pandas(),
    "column missing": pd.DataFrame({"b": ["z"]}),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_text_gives_the_stock_str_verdicts(name):
    df = HOSTILE[name]
    stock = pa.DataFrameSchema({"a": pa.Column(str, pa.Check.str_length(min_value=1)), "b": pa.Column(str, nullable=True)})
    ours = pa.DataFrameSchema({"a": pa.Column(TEXT, pa.Check.str_length(min_value=1)), "b": pa.Column(TEXT, nullable=True)})
    assert _verdict(ours, df) == _verdict(stock, df)
    assert str(TEXT) == str(pa.Column(str).dtype)  # the same check name in the UI


def test_text_answers_a_string_column_without_an_element_check():
    s = pa_arrow.table({"a": ["x"] * 1000}).to_pandas()["a"]
    from pandera.engines import pandas_engine

    assert TEXT.check(pandas_engine.Engine.dtype(s.dtype), s) is True  # one answer, not 1,000
    obj = pd.Series(["x", 3], dtype=object)
    assert list(TEXT.check(pandas_engine.Engine.dtype(obj.dtype), obj)) == [True, False]  # element by element, as stock


def _schemas():
    for info in pkgutil.iter_modules(schemas.__path__):
        mod = importlib.import_module(f"megacpp_checks.schemas.{info.name}")
        for name, obj in vars(mod).items():
            if isinstance(obj, pa.DataFrameSchema):
                yield f"{info.name}.{name}", obj


def test_every_string_column_of_the_schemas_is_text():
    from pandera.engines import pandas_engine

    found = 0
    for where, schema in _schemas():
        for col, c in schema.columns.items():
            if isinstance(c.dtype, pandas_engine.STRING):
                found += 1
                assert isinstance(c.dtype, Text), f"{where}.{col} uses pandera's str: use megacpp_checks.schemas.TEXT"
    assert found >= 60


@pytest.mark.integration
def test_real_scrubbed_shards_validate_and_a_corrupted_one_fails(tiny_run):
    """Every ``scrubbed`` shard of the session's ``tiny`` run is valid; the same table with
    a text column of bytes, or a null path, is not, as with pandera's own ``str``."""
    import pyarrow.parquet as pq

    from megacpp_checks.schemas.scrub import SCRUBBED, validate_scrubbed

    root, _ = tiny_run
    shards = sorted((root / "snapshots" / "tiny" / "revisions").glob("*/shards/*/scrubbed.parquet"))
    assert shards
    stock = pa.DataFrameSchema({k: pa.Column(str, c.checks, nullable=c.nullable, unique=c.unique)
                                if isinstance(c.dtype, Text) else c for k, c in SCRUBBED.columns.items()},
                               checks=SCRUBBED.checks, strict=False, coerce=False)
    for path in shards:
        table = pq.read_table(path)
        ok, detail = validate_scrubbed(table)
        assert ok, detail
        bad_text = table.set_column(table.schema.get_field_index("text"), "text",
                                    pa_arrow.array([t.encode() for t in table.column("text").to_pylist()]))
        null_path = table.set_column(table.schema.get_field_index("path"), "path",
                                     pa_arrow.array([None] * table.num_rows, pa_arrow.string()))
        for broken in (bad_text, null_path):
            assert not validate_scrubbed(broken)[0]
            assert _verdict(SCRUBBED, broken.to_pandas()) == _verdict(stock, broken.to_pandas())
