"""Stage 4 on columns (megacpp_core.dedup.deduplicate_columns): the per-document state is
numpy/arrow columns, not Python objects (a tracemalloc bound per document), the
signature matrix is not copied when the rows come in keep order, and the decisions
equal the record API's whatever the row order."""

from __future__ import annotations

import hashlib
import random
import tracemalloc

import numpy as np
import pyarrow as pa
import pytest

from megacpp_core import minhash as mh
from megacpp_core.dedup import DedupRecord, deduplicate, deduplicate_columns, keep_order_indices
from megacpp_core.dedup_tables import CLUSTERS_SCHEMA, DECISIONS_SCHEMA

#: Bytes of traced (Python and numpy) memory per document that deduplicate_columns may
#: allocate beyond its inputs: numpy columns of a few int64 each (about 110 measured). A
#: ``{doc_key: index}`` dict alone adds about 130, a record object or a decision dict more.
BYTES_PER_DOC = 192


def synthetic_docs(n: int, seed: int = 0) -> tuple[pa.Table, np.ndarray]:
    """``n`` documents of four sources (a fifth are exact copies) and random signatures."""
    rng = np.random.default_rng(seed)
    src = np.sort(rng.integers(0, 4, n))
    content = rng.integers(0, int(n * 0.8), n)
    pool = rng.integers(0, 2**32 - 1, (int(n * 0.8), 128), dtype=np.uint32)
    keys = [f"s{s}/dir{i % 31}/f{i:06d}.c" for i, s in enumerate(src.tolist())]
    docs = pa.table({"doc_key": keys, "source": [f"s{s}" for s in src.tolist()], "source_order": pa.array(src, pa.int32()),
                     "path": [k.split("/", 1)[1] for k in keys],
                     "license_class": [("permissive", "gpl2")[i % 7 == 0] for i in range(n)],
                     "content_sha256": [f"{x:064x}" for x in content.tolist()]})
    return docs, pool[content]


def test_per_document_state_is_columns_not_python_objects():
    n = 20_000
    docs, sig = synthetic_docs(n)
    perm = keep_order_indices(docs)
    docs, sig = docs.take(pa.array(perm)).combine_chunks(), sig[perm]  # the stage's order
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = deduplicate_columns(docs, sig, cross_pairs=np.zeros((0, 2), np.int64))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert out.figures["files_in"] == n and out.figures["exact_removed"] > n // 10
    assert peak / n < BYTES_PER_DOC, f"{peak / n:.0f} traced bytes per document"
    assert isinstance(out.decisions, pa.Table) and out.decisions.schema == DECISIONS_SCHEMA
    assert isinstance(out.clusters, pa.Table) and out.clusters.schema == CLUSTERS_SCHEMA
    assert out.decisions.num_rows == n and out.decisions.column("doc_key").num_chunks == 1


def test_signatures_in_keep_order_are_used_in_place():
    docs, sig = synthetic_docs(500)
    perm = keep_order_indices(docs)
    docs, sig = docs.take(pa.array(perm)), np.ascontiguousarray(sig[perm])
    have = np.ones(len(sig), bool)
    have[3] = False  # computed from its text and written into the caller's matrix
    texts = {docs.column("doc_key")[3].as_py(): "int main(void) { return 0; }"}
    deduplicate_columns(docs, sig, have, np.zeros((0, 2), np.int64), load_texts=lambda keys: iter(texts.items()))
    assert np.array_equal(sig[3], mh.signatures(["int main(void) { return 0; }"])[0])


def test_columns_equal_records_in_any_row_order():
    rng = random.Random(3)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
    base = [" ".join(rng.choice(words) + f"_{i}_{k}" for k in range(60)) for i in range(12)]
    recs = []
    for i in range(60):
        t = base[i % 12]
        if i % 4 == 1:
            t = t.replace("_3", f"_v{i}", 1)  # near copy
        s = rng.randrange(3)
        recs.append(DedupRecord(f"src{s}/f{i:02d}.c", f"src{s}", s, f"f{i % 7}.c",
                                rng.choice(["permissive", "gpl2", "weak_copyleft"]), t))
    key_pairs = [(a.doc_key, b.doc_key) for a in recs for b in recs if a.doc_key < b.doc_key]  # all candidates
    want = deduplicate(recs, cross_pairs=key_pairs)
    assert want.figures["exact_removed"] and want.figures["near_removed"] and want.figures["cross_source_removed"]
    texts = {r.doc_key: r.text for r in recs}
    for _ in range(3):
        rng.shuffle(recs)
        docs = pa.table({"doc_key": [r.doc_key for r in recs], "source": [r.source for r in recs],
                         "source_order": [r.source_order for r in recs], "path": [r.path for r in recs],
                         "license_class": [r.license_class for r in recs],
                         "content_sha256": [hashlib.sha256(r.text.encode()).hexdigest() for r in recs]})
        sig = mh.signatures([r.text for r in recs])
        row = {r.doc_key: i for i, r in enumerate(recs)}
        pairs = np.array([(row[b], row[a]) for a, b in key_pairs], np.int64)
        got = deduplicate_columns(docs, sig, cross_pairs=pairs,
                                  load_texts=lambda keys: ((k, texts[k]) for k in sorted(keys)))
        assert got.decisions.to_pylist() == want.decisions and got.clusters.to_pylist() == want.clusters
        assert got.figures == want.figures


def test_columns_reject_bad_input():
    docs, sig = synthetic_docs(20)
    with pytest.raises(ValueError, match="duplicate doc_key"):
        deduplicate_columns(pa.concat_tables([docs, docs.slice(0, 1)]))
    with pytest.raises(ValueError, match="license_class"):
        deduplicate_columns(docs.set_column(4, "license_class", pa.array(["mit"] * 20)), sig)
    with pytest.raises(ValueError, match="shape"):
        deduplicate_columns(docs, sig[:, :64])
    with pytest.raises(ValueError, match="outside"):
        deduplicate_columns(docs, sig, cross_pairs=np.array([[0, 20]]))
    with pytest.raises(ValueError, match="no text loader"):
        deduplicate_columns(docs)  # every signature missing, no texts


def test_band_pairs_equal_the_all_band_index():
    rng = np.random.default_rng(1)
    sig = rng.integers(0, 4, (300, 128), dtype=np.uint32)  # few values: many shared bands
    group = rng.integers(0, 3, 300)
    for cross in (False, True):
        one = mh.candidate_pairs(mh.band_keys(sig, 6, 0, 20), group=group, cross_group=cross)
        assert len(one) and np.array_equal(mh.band_pairs(sig, 6, 0, 20, group=group, cross_group=cross), one)
    with pytest.raises(ValueError, match="do not fit"):
        mh.band_pairs(sig, 8, 0, 17)


def test_band_pair_blocks_give_each_candidate_once(monkeypatch):
    monkeypatch.setattr(mh, "PAIR_BLOCK", 7)  # the earlier-band test runs over many small slices
    rng = np.random.default_rng(2)
    sig = rng.integers(0, 3, (400, 128), dtype=np.uint32)  # few values: pairs share many bands
    group = rng.integers(0, 4, 400)
    skip = rng.random(400) < 0.1
    for cross in (False, True):
        one = mh.candidate_pairs(mh.band_keys(sig, 6, 2, 19), group=group, cross_group=cross, skip=skip)
        blocks = list(mh.band_pair_blocks(sig, 6, 2, 19, group=group, cross_group=cross, skip=skip))
        assert len(blocks) == 17 and all(len(b) == len(np.unique(b, axis=0)) for b in blocks)
        every = np.concatenate(blocks)
        per_band = sum(len(mh.candidate_pairs(mh.band_keys(sig, 6, b, b + 1), group=group, cross_group=cross,
                                              skip=skip)) for b in range(2, 19))
        assert per_band > len(one) > 200  # some pairs share several bands ...
        assert len(every) == len(one)  # ... and come in one block only ...
        assert np.array_equal(np.unique(every, axis=0), one)  # ... whose union is the index's pairs
        assert not skip[every].any() and (every[:, 0] < every[:, 1]).all()
        for beta, b in enumerate(blocks, start=2):  # sorted, and in the first band the pair shares
            codes = (b[:, 0] << 32) | b[:, 1]
            assert (np.diff(codes) > 0).all()
            ki, kj = mh.band_keys(sig[b[:, 0]], 6, 2, beta + 1), mh.band_keys(sig[b[:, 1]], 6, 2, beta + 1)
            assert (ki[:, -1] == kj[:, -1]).all() and not (ki[:, :-1] == kj[:, :-1]).any()


def _near_texts(n_families: int, per_family: int, seed: int) -> list[DedupRecord]:
    """Families of texts of 300 random identifiers, each member a copy of its family's base
    with 0.3–3 % of the tokens replaced: Jaccard of 5-shingles from about 0.6 to 1, so some
    pairs pass the 0.7 estimate and fail the exact check."""
    rng = random.Random(seed)
    words = [f"id{k}" for k in range(5000)]
    out = []
    for f in range(n_families):
        base = [rng.choice(words) for _ in range(300)]
        for m in range(per_family):
            toks = list(base)
            for p in rng.sample(range(300), int(300 * rng.uniform(0.003, 0.03))):
                toks[p] = rng.choice(words)
            src = (f + m // 4) % 2  # each family in both sources: near pairs within, cross pairs across
            out.append(DedupRecord(f"s{src}/f{f:03d}_{m}.c", f"s{src}", src, f"f{f:03d}_{m}.c", "permissive",
                                   " ".join(toks) + "\n"))
    return out


def test_verification_in_blocks_decides_as_one_block(monkeypatch):
    from megacpp_core import dedup as dd

    records = _near_texts(12, 8, seed=3)
    calls = []

    def run(block: int):
        monkeypatch.setattr(dd, "VERIFY_BLOCK_RECORDS", block)
        given = {r.doc_key: r.text for r in records}

        def load(keys):
            calls.append(len(keys))
            return ((k, given[k]) for k in sorted(keys))

        bare = [DedupRecord(r.doc_key, r.source, r.source_order, r.path, r.license_class, None,
                            hashlib.sha256(r.text.encode()).hexdigest()) for r in records]
        return dd.deduplicate(bare, signatures={r.doc_key: s for r, s in zip(records, mh.signatures([r.text for r in records]))},
                              load_texts=load)

    one = run(10**6)
    one_calls, calls[:] = list(calls), []
    monkeypatch.setattr(mh, "PAIR_BLOCK", 5)  # estimates and pair slices cut mid-group too
    small = run(3)
    assert one.figures["near_removed"] > 0 and one.figures["near_rejected_by_exact"] > 0
    assert one.figures["cross_source_removed"] > 0
    assert len(calls) > len(one_calls) and max(calls) <= 3  # several blocks of at most 3 records
    assert small.decisions == one.decisions and small.clusters == one.clusters
    assert {k: v for k, v in small.figures.items()} == one.figures
