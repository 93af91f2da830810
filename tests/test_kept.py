"""Keep order in arrow: ``tables.lookup_codes`` and the two sort orders against Python's own sort."""

from __future__ import annotations

import random

import numpy as np
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


def test_greedy_fit_takes_every_file_that_still_fits_in_hash_order():
    from megacpp_core.kept import _fits

    rng = np.random.default_rng(2)
    for trial in range(200):
        n = rng.integers(0 if trial % 2 else 1, 50, int(rng.integers(0, 400))).astype(np.int64)  # odd: 0-byte files
        room = int(rng.integers(0, 3000))
        want, left = [], room
        for i, x in enumerate(n.tolist()):  # the reference: one file at a time
            if x <= left:
                want.append(i)
                left -= x
        got, used = _fits(n, room, 7)
        assert got.tolist() == want and used == 7 + room - left, trial
    assert _fits(np.array([5, 3, 0], np.int64), 5, 0)[0].tolist() == [0, 2]  # budget used up: 0 bytes still fit
    assert _fits(np.array([0, 1], np.int64), 0, 0)[0].tolist() == [0]


def test_sample_streams_with_tiny_buckets_and_a_decisions_reference(tmp_path):
    """The sample is the same whatever the spill's bucket size, from a decisions table or
    a decisions file read per shard."""
    import hashlib

    import pyarrow.parquet as pq

    from megacpp_core import catalog
    from megacpp_core.kept import sample
    from megacpp_core.runner import InputRef
    from megacpp_core.stage import Partition
    from megacpp_core.storage import DataRoot
    from megacpp_core.tables import write_parquet

    root = DataRoot(tmp_path / "root")
    rng = np.random.default_rng(0)
    refs, keys, keep = [], [], []
    for s, name in enumerate(("b-src", "a-src")):
        for k in range(3):
            n = 40
            paths = [f"d/f{s}{k}{i:03d}.c" for i in range(n)]
            t = pa.table({"doc_key": [f"{name}/{p}" for p in paths], "license_class": ["permissive", "gpl2"] * (n // 2),
                          "source_order": pa.array([s] * n, pa.int32()), "path": paths,
                          "text": ["x" * int(rng.integers(1, 300)) + "\n" for _ in range(n)]})
            p = Partition("snap", name, f"{k:03d}")
            write_parquet(t, root.local_path(catalog.SCRUBBED.key(p)))
            refs.append(InputRef(root, catalog.SCRUBBED, p))
            keys += t.column("doc_key").to_pylist()
            keep += (rng.random(n) < 0.8).tolist()
    decisions = pa.table({"doc_key": keys, "keep": keep})
    write_parquet(decisions, root.local_path("snapshots/snap/dedup/decisions.parquet"))
    dec_ref = InputRef(root, catalog.DECISIONS, Partition("snap"))
    total = sum(len(t) for ref in refs for t, k in zip(ref.read().column("text").to_pylist(), ref.read().column("doc_key").to_pylist())
                if dict(zip(keys, keep))[k])
    for budget in (1 << 40, total // 3, 0):
        base = sample(refs, decisions, budget)
        assert sample(refs, dec_ref, budget, bucket_rows=3).equals(base)
        assert sample(list(reversed(refs)), decisions, budget, bucket_rows=1).equals(base)
        got = base.column("doc_key").to_pylist()
        if budget == 0:
            assert got == []
        elif budget == total // 3:  # in ascending sha256 of the key while it fits, then in keep order
            text = {k: x for ref in refs for k, x in zip(ref.read().column("doc_key").to_pylist(),
                                                          ref.read().column("text").to_pylist())}
            left, want = budget, set()
            for k in sorted((k for k, kp in zip(keys, keep) if kp), key=lambda k: hashlib.sha256(k.encode()).digest()):
                if len(text[k]) <= left:
                    want.add(k)
                    left -= len(text[k])
            assert set(got) == want
        assert pq.read_table(root.local_path("snapshots/snap/dedup/decisions.parquet")).num_rows == len(keys)
