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
