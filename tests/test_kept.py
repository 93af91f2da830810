"""Keep order in arrow: ``tables.lookup_codes`` and the two sort orders against Python's own sort."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from megacpp_core import kept
from megacpp_core.dedup import LICENSE_RANK
from megacpp_core.tables import lookup_codes


def _documents(n: int, seed: int = 7) -> pa.Table:
    rnd = random.Random(seed)
    classes, sources = sorted(LICENSE_RANK), ["zlib-1.3", "boost-1.81", "lz4-4.4.5"]
    rows = [{"doc_key": f"k{i}", "license_class": rnd.choice(classes), "source": rnd.choice(sources),
             "path": rnd.choice(["a.h", "b/c.cpp", "é.c", "B.h"]), "chunk_index": rnd.randrange(4)} for i in range(n)]
    # three record batches, so every column is a chunked array of several chunks
    return pa.Table.from_batches([pa.RecordBatch.from_pylist(rows[i::3]) for i in range(3)])


def test_document_order_is_pythons_sort_of_the_keep_key():
    t = _documents(500)
    order = {"boost-1.81": 0, "lz4-4.4.5": 1, "zlib-1.3": 2}
    got = kept.document_order(t, order).column("doc_key").to_pylist()
    want = sorted(t.to_pylist(), key=lambda r: (LICENSE_RANK[r["license_class"]], order[r["source"]], r["path"],
                                                r["chunk_index"]))
    # ties (same class, source, path, chunk) keep their input order: the sort is stable
    assert got == [r["doc_key"] for r in want]


def test_keep_order_of_files():
    t = _documents(200).append_column("source_order", pa.array([i % 5 for i in range(200)], pa.int32()))
    got = kept.keep_order(t).column("doc_key").to_pylist()
    want = sorted(t.to_pylist(), key=lambda r: (LICENSE_RANK[r["license_class"]], r["source_order"], r["path"]))
    assert got == [r["doc_key"] for r in want]


def test_codes_of_an_unknown_value_name_it():
    col = pa.chunked_array([["permissive", "gpl2"], ["proprietary"]])
    with pytest.raises(ValueError, match="unknown license_class 'proprietary'"):
        lookup_codes(col, LICENSE_RANK, "license_class")
    with pytest.raises(ValueError, match="^s/c.h: unknown license_class 'proprietary'"):
        lookup_codes(col, LICENSE_RANK, "license_class", keys=pa.chunked_array([["s/a.h", "s/b.h"], ["s/c.h"]]))
    assert lookup_codes(pa.chunked_array([], pa.string()), LICENSE_RANK, "license_class").to_pylist() == []
    assert lookup_codes(col[:2], LICENSE_RANK, "license_class").to_pylist() == [0, 2]


def test_rows_already_in_document_order_are_not_copied():
    order = {"boost-1.81": 0, "lz4-4.4.5": 1, "zlib-1.3": 2}
    t = kept.document_order(_documents(300), order)
    assert kept.document_order_indices(t, order) is None
    assert kept.document_order(t, order) is t  # no copy of the columns
    shuffled = t.take(pa.array(list(range(299, -1, -1))))
    idx = kept.document_order_indices(shuffled, order)
    assert idx is not None
    def keys(table):
        return [(LICENSE_RANK[r["license_class"]], order[r["source"]], r["path"], r["chunk_index"]) for r in table.to_pylist()]
    assert keys(shuffled.take(idx)) == keys(t) == sorted(keys(t))  # ties may swap: the sort is stable


def test_pack_inputs_walked_in_an_order_equal_those_of_the_sorted_table():
    import numpy as np

    from megacpp_core import pack, pack_inputs
    rnd = random.Random(3)
    n = 40
    ids = [[2] + [rnd.randrange(64, 900) for _ in range(rnd.randrange(1, 30))] for _ in range(n)]
    docs = pa.table({
        "doc_key": [f"s/f{i}.c#0" for i in range(n)], "source": ["s"] * n, "revision": ["r"] * n,
        "path": [f"f{i}.c" for i in range(n)], "chunk_index": [0] * n,
        "input_ids": pa.array(ids, pa.list_(pa.uint32())), "text": [f"text {i}" for i in range(n)],
        "structure_ids": pa.array([[rnd.randrange(8) for _ in x] for x in ids], pa.list_(pa.uint8())),
    })
    order = pa.array(rnd.sample(range(n), n), pa.uint64())
    _, optional = pack_inputs.columns_to_read(docs.column_names)
    walked = pack_inputs.pack_inputs(docs, optional, order)
    copied = pack_inputs.pack_inputs(docs.take(order), optional)
    assert [d.doc_key for d in walked] == [d.doc_key for d in copied]
    for a, b in zip(walked, copied):
        assert np.array_equal(a.ids, b.ids) and np.array_equal(a.extras["structure_ids"], b.extras["structure_ids"])
    texts = pack_inputs.TextsInOrder(docs.column("text"), order)
    assert len(texts) == n and [texts[i] for i in range(n)] == docs.take(order).column("text").to_pylist()
    assert "structure_ids" in pack.PLANES
