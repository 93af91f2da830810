"""The vectorized MinHash and banded LSH of stage 4 (megacpp_core.minhash): bit-identical
to datasketch with the same hash, batching-independent, split-band LSH equal to one pass,
compact uint32 storage, and the stage-4 table schemas on hostile rows."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from datasketch import MinHash

from megacpp_core import acquire, dedup
from megacpp_core import minhash as mh
from megacpp_core.dedup import DedupRecord, deduplicate, shingles
from megacpp_core.manifest import load_manifest
from megacpp_core.signatures import read_signatures, signatures_table
from megacpp_core.stages.dedup import CLUSTERS_SCHEMA, DECISIONS_SCHEMA
from megacpp_checks.schemas.dedup import validate_decisions

from .conftest import SHARED_CACHE

HOSTILE = ["", "   ;;; /* */ \n", "x", "int x;", "a b c d e", "a b c d e f", "é ü_x ñ日本 a+b",
           "z" * 50_000, "tok " * 3000, "\u00e9t\u00e9 caf\u00e9_1 caf\u00e9_2", "a\x00b c\td\re f"]


@pytest.fixture(scope="module")
def lz4_texts():
    src = next(s for s in load_manifest("tiny").sources if s.name == "lz4-4.4.5")
    got = acquire.acquire_source(src, SHARED_CACHE)
    return [d.decode("utf-8") for p, d in got.files if acquire.language_of(p)]


def reference(text: str, num_perm: int = 128, seed: int = 1) -> np.ndarray:
    m = MinHash(num_perm=num_perm, seed=seed, scheme="affine32", hashfunc=mh.shingle_hash32)
    sh = list(shingles(text))
    if sh:
        m.update_batch(sh)
    return m.hashvalues


def test_signatures_bit_identical_to_datasketch_with_the_same_hash(lz4_texts):
    texts = lz4_texts + HOSTILE
    sig = mh.signatures(texts)
    assert sig.dtype == np.uint32 and sig.shape == (len(texts), 128)
    for i, t in enumerate(texts):
        assert np.array_equal(sig[i], reference(t)), i
    assert np.array_equal(mh.is_empty(sig), np.array([not list(shingles(t)) for t in texts]))
    small = mh.signatures(HOSTILE[:4], num_perm=112, seed=7)
    assert all(np.array_equal(small[i], reference(t, 112, 7)) for i, t in enumerate(HOSTILE[:4]))


def test_permutations_are_datasketchs_for_every_seed_and_size():
    """The affine32 parameters drawn without datasketch equal datasketch's own."""
    for num_perm in (1, 2, 7, 112, 128, 256, 1000):
        for seed in (0, 1, 7, 2**31 - 1, 2**32 - 1):
            a, b = mh.permutations(num_perm, seed)
            want_a, want_b = MinHash(num_perm=num_perm, seed=seed, scheme="affine32").permutations
            assert a.dtype == b.dtype == np.uint32 and a.flags.c_contiguous and b.flags.c_contiguous
            assert np.array_equal(a, want_a) and np.array_equal(b, want_b), (num_perm, seed)
            assert (a % 2 == 1).all()
    with pytest.raises(ValueError):
        mh.permutations(0)


def test_near_lsh_params_are_the_pair_datasketch_picks():
    """``(b, r)`` by exact polynomial integration equals datasketch ``MinHashLSH``'s (scipy
    ``quad``) over thresholds across [0, 1] and several permutation counts; a bad
    threshold or size is refused as datasketch refuses it."""
    from datasketch import MinHashLSH

    dedup.near_lsh_params.cache_clear()
    refused = 0
    for num_perm in (2, 16, 64, 128, 256):
        for t in [0.0, 0.05, 0.3, 0.5, 0.55, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.99, 1.0]:
            try:
                lsh = MinHashLSH(threshold=t, num_perm=num_perm, weights=dedup.LSH_WEIGHTS)
            except ValueError:  # datasketch refuses (b < 2): so do we
                refused += 1
                with pytest.raises(ValueError, match="b < 2"):
                    dedup.near_lsh_params(t, num_perm)
                continue
            assert dedup.near_lsh_params(t, num_perm) == (lsh.b, lsh.r), (t, num_perm)
    assert 0 < refused < 20
    assert dedup.near_lsh_params() == (20, 6)  # the SPEC defaults (module doc)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError):
            MinHashLSH(threshold=bad, num_perm=128)
        with pytest.raises(ValueError):
            dedup.near_lsh_params(bad, 128)
    for few in (0, 1):
        with pytest.raises(ValueError):
            MinHashLSH(threshold=0.7, num_perm=few)
        with pytest.raises(ValueError):
            dedup.near_lsh_params(0.7, few)


def test_the_stages_of_a_run_do_not_import_datasketch(tmp_path):
    """MinHash signatures, band keys and the near-duplicate LSH settings of a run come
    without datasketch and the scipy it imports (a process of ``megacpp run`` does not
    pay for them; datasketch stays the tests' reference)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from megacpp_core import dedup, dedup_stream, minhash\n"
            "from megacpp_core.stages import STAGES\n"
            "sig = minhash.signatures(['int main(void) { return a + b * c; }', 'x'] * 3)\n"
            "minhash.band_pairs(sig, 8, 0, 14)\n"
            "assert dedup.near_lsh_params() == (20, 6)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('datasketch', 'scipy')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


def test_shingle_hashes_follow_the_documented_tokenizer(lz4_texts):
    texts = lz4_texts[:5] + HOSTILE
    hv, off = mh.shingle_hashes(texts)
    for i, t in enumerate(texts):
        expect = [mh.shingle_hash32(s) for s in shingles(t)]
        assert hv[off[i]:off[i + 1]].tolist() == expect, i
    assert mh.shingle_hash32(b"a b c") == mh.shingle_hash32([b"a", b"b", b"c"]) != mh.shingle_hash32(b"a bc")
    with pytest.raises(ValueError):
        mh.shingle_hashes(["a"], k=0)
    with pytest.raises(UnicodeEncodeError):
        mh.signatures(["bad \ud800 surrogate"])


def _token_hash(token: bytes) -> int:
    h, p = 0, 1
    for byte in token:
        h = (h + byte * p) % (1 << 64)
        p = p * mh.P_TOKEN % (1 << 64)
    return h


def test_token_hashes_are_the_documented_polynomial_for_short_and_very_long_tokens():
    """Horner's rule over the tokens sorted by length equals ``Σ byte_j · P^j`` token by
    token, in the order given: tokens shorter than, equal to and longer than
    :data:`HORNER_STEPS` (their tails summed at once), and one past 65,535 bytes (lengths
    that do not fit the radix sort's ``uint16``)."""
    rng = random.Random(7)
    sizes = [1, 2, mh.HORNER_STEPS - 1, mh.HORNER_STEPS, mh.HORNER_STEPS + 1, 3 * mh.HORNER_STEPS, 70_000]
    sizes += [rng.randint(1, 2 * mh.HORNER_STEPS) for _ in range(200)]
    rng.shuffle(sizes)
    tokens = [bytes(rng.choice(b"azAZ09_") for _ in range(n)) for n in sizes]
    buf = np.frombuffer(b" ".join(tokens), dtype=np.uint8)
    starts = np.cumsum([0] + [len(t) + 1 for t in tokens[:-1]]).astype(np.int64)
    got = mh.token_hashes(buf, starts, np.array(sizes, dtype=np.int64))
    assert got.dtype == np.uint64 and got.tolist() == [_token_hash(t) for t in tokens]
    assert mh.token_hashes(buf, starts[:0], starts[:0]).size == 0
    text = "x " * 4 + "y" * (mh.HORNER_STEPS + 5) + " z"  # one shingle through a long token
    hv, off = mh.shingle_hashes([text])
    assert hv.tolist() == [mh.shingle_hash32(s) for s in shingles(text)]


def test_batching_does_not_change_signatures(lz4_texts, monkeypatch):
    whole = mh.signatures(lz4_texts)
    monkeypatch.setattr(mh, "BATCH_BYTES", 1000)
    monkeypatch.setattr(mh, "SHINGLE_BLOCK", 7)
    assert np.array_equal(mh.signatures(lz4_texts), whole)
    one_by_one = np.concatenate([mh.signatures([t]) for t in lz4_texts[:6]])
    assert np.array_equal(one_by_one, whole[:6])


def test_band_split_equals_one_pass_and_filters():
    rng = np.random.default_rng(0)
    base = rng.integers(0, 1 << 32, size=(40, 128), dtype=np.uint32)
    sig = np.concatenate([base, base.copy()])
    # Copies 40-59 differ in bands 0-6, copies 60-79 in bands 7-13: each half of a split finds some.
    sig[40:60, 0:56] = rng.integers(0, 1 << 32, size=(20, 56), dtype=np.uint32)
    sig[60:80, 56:112] = rng.integers(0, 1 << 32, size=(20, 56), dtype=np.uint32)
    sig[5] = mh.EMPTY
    sig[45] = mh.EMPTY
    src = np.array([0] * 40 + [1] * 40)
    one = dedup.cross_source_candidates(sig, src)
    assert len(one) > 0 and all(src[i] != src[j] for i, j in one)
    assert not any(5 in p or 45 in p for p in one.tolist())  # empty signatures never pair
    assert {(i, j) for i, j in one.tolist()} == {(i, i + 40) for i in range(40) if i != 5}
    first = dedup.cross_source_candidates(sig, src, 0, 7)
    assert 0 < len(first) < len(one)
    for ranges in ([(0, 7), (7, 14)], [(0, 2), (2, 3), (3, 14)]):
        assert np.array_equal(mh.merge_pairs(dedup.cross_source_candidates(sig, src, lo, hi) for lo, hi in ranges), one)
    within = mh.candidate_pairs(mh.band_keys(sig, 6, 0, 20), group=src, cross_group=False)
    assert all(src[i] == src[j] for i, j in within)
    with pytest.raises(ValueError):
        mh.band_keys(sig, 8, 0, 17)


def test_union_find_roots_are_smallest_members_whatever_the_order():
    pairs = [(5, 3), (3, 9), (1, 2), (9, 4), (2, 7)]
    for seed in range(4):
        random.Random(seed).shuffle(pairs)
        uf = mh.UnionFind(10)
        for a, b in pairs:
            uf.union(a, b)
        assert uf.groups() == {1: [1, 2, 7], 3: [3, 4, 5, 9]}


def test_lsh_figures_report_thresholds_and_candidate_probabilities():
    f = deduplicate([DedupRecord("a/x.c", "a", 0, "x.c", "permissive", "int x = 1; int y = 2;")]).figures
    assert (f["lsh_bands"], f["lsh_rows"]) == (20, 6) and (f["cross_lsh_bands"], f["cross_lsh_rows"]) == (14, 8)
    assert f["effective_threshold"] == pytest.approx((1 / 20) ** (1 / 6))
    assert f["cross_effective_threshold"] == pytest.approx((1 / 14) ** (1 / 8)) and 0.71 < f["cross_effective_threshold"] < 0.73
    for j in ("0.6", "0.7", "0.8", "0.9"):
        assert f["candidate_probability"][j] == pytest.approx(1 - (1 - float(j) ** 6) ** 20, abs=1e-6)
        assert f["cross_candidate_probability"][j] == pytest.approx(1 - (1 - float(j) ** 8) ** 14, abs=1e-6)
    assert f["candidate_probability"]["0.8"] > 0.99 and f["cross_candidate_probability"]["0.9"] > 0.99


def test_signature_storage_is_uint32_and_round_trips(tmp_path, lz4_texts):
    from megacpp_core.tables import write_parquet

    sig = mh.signatures(lz4_texts[:9])
    keys = [f"k{i}" for i in range(9)]
    path = write_parquet(signatures_table(keys, sig), tmp_path / "minhash.parquet")
    got_keys, got = read_signatures(path)
    assert got_keys == keys and got.dtype == np.uint32 and np.array_equal(got, sig)
    assert signatures_table(keys, sig).column("signature").type.value_type == pa.uint32()


def test_stage4_schema_catches_bad_tables():
    t = "static int f(int a, int b) { return a * b + 17 - a / b; }\n" * 3
    res = deduplicate([DedupRecord("a/x.c", "a", 0, "x.c", "permissive", t),
                       DedupRecord("b/x.c", "b", 1, "x.c", "permissive", t)])
    dec = pa.Table.from_pylist(res.decisions, schema=DECISIONS_SCHEMA)
    cl = pa.Table.from_pylist(res.clusters, schema=CLUSTERS_SCHEMA)
    assert validate_decisions(dec, cl)[0]
    bad_twin = pa.Table.from_pylist([d | {"kept_twin": "nowhere"} if not d["keep"] else d for d in res.decisions],
                                    schema=DECISIONS_SCHEMA)
    assert not validate_decisions(bad_twin, cl)[0]
    no_kind = pa.Table.from_pylist([d | {"dup_kind": None} for d in res.decisions], schema=DECISIONS_SCHEMA)
    assert not validate_decisions(no_kind, cl)[0]
    two_kept = pa.Table.from_pylist([c | {"is_kept": True} for c in res.clusters], schema=CLUSTERS_SCHEMA)
    assert not validate_decisions(dec, two_kept)[0]
    assert not validate_decisions(dec, cl.slice(0, 1))[0]
