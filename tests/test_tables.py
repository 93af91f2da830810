"""The project's parquet writer: which columns carry min/max statistics; arrow's memory pool."""

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from megacpp_core.tables import ParquetStream, statistics_columns, write_parquet


def _table():
    return pa.table({
        "doc_key": pa.array(["b", "a"], pa.string()),
        "content": pa.array([b"\x00\xff" * 5000, b"x"], pa.large_binary()),
        "text": pa.array(["z" * 9000, "y"], pa.large_string()),
        "tokens": pa.array([[3, 1], [2]], pa.list_(pa.int32())),
        "spans": pa.array([[5], []], pa.large_list(pa.int64())),
        "meta": pa.array([{"n": 1, "tags": ["q"]}, {"n": 2, "tags": []}]),
        "counts": pa.array([[("k", 1)], []], pa.map_(pa.string(), pa.int64())),
    })


def _stats(path):
    md = pq.ParquetFile(path).metadata
    rg = md.row_group(0)
    return {md.schema.column(i).path: rg.column(i).statistics for i in range(md.num_columns)}


def test_statistics_on_every_leaf_but_the_payload_columns(tmp_path):
    t = _table()
    stats = _stats(write_parquet(t, tmp_path / "t.parquet"))
    assert set(statistics_columns(t.schema)) == set(stats) - {"content", "text"}
    for path, st in stats.items():
        if path in ("content", "text"):
            assert st is None or not st.has_min_max, path
        else:
            assert st is not None and st.has_min_max, path
    assert stats["doc_key"].min == "a" and stats["tokens.list.element"].max == 3
    assert pq.read_table(tmp_path / "t.parquet").to_pylist() == t.to_pylist()


def test_stream_and_one_shot_writes_give_the_same_bytes(tmp_path):
    t = _table()
    one = write_parquet(t, tmp_path / "one.parquet")
    with ParquetStream(tmp_path / "two.parquet", t.schema) as s:
        s.write(t)
    assert one.read_bytes() == (tmp_path / "two.parquet").read_bytes()


def test_a_table_of_payloads_only_writes_no_statistics(tmp_path):
    t = pa.table({"text": pa.array(["a", "b"], pa.large_string())})
    assert statistics_columns(t.schema) == []
    assert _stats(write_parquet(t, tmp_path / "p.parquet"))["text"] is None



def _backend(**env):
    """The arrow pool of a fresh process that imports the package, the environment
    without ``ARROW_DEFAULT_MEMORY_POOL`` plus ``env``."""
    base = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    code = "import megacpp_core.runner, pyarrow as pa; print(pa.default_memory_pool().backend_name)"
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_package_runs_arrow_on_jemalloc_unless_the_environment_names_a_pool():
    assert _backend() == "jemalloc"
    assert _backend(ARROW_DEFAULT_MEMORY_POOL="system") == "system"
