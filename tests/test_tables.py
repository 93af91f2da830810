"""The project's parquet writer: which columns carry min/max statistics and dictionary
encoding; arrow's memory pool."""

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from megacpp_core import tables
from megacpp_core.tables import ParquetStream, dictionary_columns, statistics_columns, write_parquet


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



def _dictionary_pages(path) -> dict[str, bool]:
    md = pq.ParquetFile(path).metadata
    pages: dict[str, bool] = {}
    for r in range(md.num_row_groups):
        rg = md.row_group(r)
        for i in range(md.num_columns):
            c = rg.column(i)
            pages[c.path_in_schema] = pages.get(c.path_in_schema, False) or c.has_dictionary_page
    return pages


def test_dictionary_on_the_flat_columns_alone(tmp_path):
    t = _table().append_column("source", pa.array(["zlib", "zlib"], pa.string())) \
        .append_column("n_tokens", pa.array([7, 7], pa.int32()))
    assert dictionary_columns(t.schema) == ["doc_key", "source", "n_tokens"]
    pages = _dictionary_pages(write_parquet(t, tmp_path / "t.parquet"))
    assert {p for p, has in pages.items() if has} == {"doc_key", "source", "n_tokens"}
    assert pq.read_table(tmp_path / "t.parquet").to_pylist() == t.to_pylist()
    # payloads and nested columns only: no dictionary anywhere
    only = t.select(["text", "content", "tokens", "meta", "counts"])
    assert dictionary_columns(only.schema) == []
    assert not any(_dictionary_pages(write_parquet(only, tmp_path / "n.parquet")).values())


def test_real_token_ids_written_without_a_dictionary_are_smaller(tiny_run, tmp_path, monkeypatch):
    """The tiny run's tokenized shards and packed rows: token ids, offsets and per-token
    planes carry no dictionary page, and the files are smaller than with a dictionary on
    every column (what the writer did before), the same tables read back."""
    root, _ = tiny_run
    snap = root / "snapshots" / "tiny"
    files = sorted(snap.glob("revisions/*/shards/*/tokenized.parquet")) + sorted(snap.glob("packed/*.parquet"))
    assert files
    ours = base = 0
    for i, f in enumerate(files):
        table = pq.read_table(f)
        pages = _dictionary_pages(f)  # as the pipeline wrote it
        assert not any(has for path, has in pages.items() if "." in path), f  # every nested column
        assert pages.get("input_ids.list.element") is False
        ours += write_parquet(table, tmp_path / f"ours{i}.parquet").stat().st_size
        with monkeypatch.context() as m:
            m.setattr(tables, "dictionary_columns", lambda schema: True)
            base += write_parquet(table, tmp_path / f"base{i}.parquet").stat().st_size
        assert pq.read_table(tmp_path / f"ours{i}.parquet").equals(pq.read_table(tmp_path / f"base{i}.parquet"))
    assert ours < base


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
