"""Stage 4 on real sdists of the default corpus, fetched through ``megacpp_core.acquire``
into the shared cache (``data/cache``): cross-source pairs, the band-split LSH, recall and
precision against exact shingle-set Jaccard, and the Dagster run of the ``tiny`` snapshot.

Files enter as records without the quality/license/scrub stages (all tagged permissive):
those stages do not change which pairs are duplicates, and skipping ScanCode keeps the
test fast. Only C/C++ files (``language`` set) that decode as UTF-8 are used.
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from megacpp_core import dedup
from megacpp_core import minhash as mh
from megacpp_core.dedup import DedupRecord, cross_source_candidates, deduplicate, raw_source_records, shingles
from megacpp_core.layout import SnapshotLayout
from megacpp_core.manifest import load_manifest
from megacpp_core.tables import read_parquet

from .conftest import SHARED_CACHE

DEFAULT = load_manifest("default")


def corpus_records(names: list[str] | None = None) -> list[DedupRecord]:
    """C/C++ files of the named default-corpus sources (all when None), manifest order."""
    return raw_source_records(DEFAULT, SHARED_CACHE, names)


def exact_jaccard(a: str, b: str) -> float:
    sa, sb = set(shingles(a)), set(shingles(b))
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


@pytest.fixture(scope="module")
def lz4_xxhash():
    return corpus_records(["lz4-4.4.5", "lz4-4.3.3", "xxhash-4.1.0"])


def test_real_cross_source_pairs_lz4_versions(lz4_xxhash):
    res = deduplicate(lz4_xxhash)
    d = {x["doc_key"]: x for x in res.decisions}
    # lz4's bundled C library is byte-identical in 4.3.3 and 4.4.5: the exact pass takes it.
    for f in ("lz4libs/lz4.c", "lz4libs/lz4hc.c", "lz4libs/lz4frame.c", "lz4libs/xxhash.c", "lz4libs/xxhash.h"):
        assert d[f"lz4-4.3.3/{f}"] | {"dup_kind": "exact", "kept_twin": f"lz4-4.4.5/{f}", "jaccard": 1.0} == d[f"lz4-4.3.3/{f}"]
    # The Python binding sources changed between releases: cross-source near duplicates.
    texts = {r.doc_key: r.text for r in lz4_xxhash}
    for f in ("lz4/block/_block.c", "lz4/frame/_frame.c", "lz4/stream/_stream.c"):
        old, new = f"lz4-4.3.3/{f}", f"lz4-4.4.5/{f}"
        assert texts[old] != texts[new]
        assert d[old]["dup_kind"] == "cross_source" and d[old]["kept_twin"] == new and d[new]["keep"]
        assert d[old]["jaccard"] >= 0.7 and exact_jaccard(texts[old], texts[new]) >= 0.7
        rows = [c for c in res.clusters if c["cluster_id"] == d[old]["cluster_id"]]
        assert {(c["doc_key"], c["is_kept"], c["kept_doc_key"]) for c in rows} == {(new, True, new), (old, False, new)}
    assert res.figures["cross_source_removed"] >= 3 and res.figures["exact_removed"] >= 8
    assert abs(res.figures["cross_effective_threshold"] - 0.719) < 0.001


def test_lz4_bundled_xxhash_is_another_version_than_the_xxhash_sdist(lz4_xxhash):
    """lz4 bundles xxHash 0.6.5 (XXH32/XXH64 only); the xxhash sdist bundles 0.8.x with
    XXH3. Measured: exact shingle Jaccard ~0.02, so they are not near duplicates at the
    file level and must both be kept."""
    texts = {r.doc_key: r.text for r in lz4_xxhash}
    lz4_h, xx_h = texts["lz4-4.4.5/lz4libs/xxhash.h"], texts["xxhash-4.1.0/deps/xxhash/xxhash.h"]
    assert "XXH_VERSION_MINOR    6" in lz4_h and "XXH_VERSION_MINOR    8" in xx_h
    assert exact_jaccard(lz4_h, xx_h) < 0.1
    assert exact_jaccard(texts["lz4-4.4.5/lz4libs/xxhash.c"], xx_h) < 0.1
    d = {x["doc_key"]: x for x in deduplicate(lz4_xxhash).decisions}
    for k in ("lz4-4.4.5/lz4libs/xxhash.h", "lz4-4.4.5/lz4libs/xxhash.c", "xxhash-4.1.0/deps/xxhash/xxhash.h"):
        assert d[k]["keep"], k
    # The same 0.6.5 copy in the two lz4 releases is found (exact pass).
    assert d["lz4-4.3.3/lz4libs/xxhash.h"]["kept_twin"] == "lz4-4.4.5/lz4libs/xxhash.h"


def test_band_split_lsh_gives_the_single_process_clusters_on_the_default_corpus():
    recs = corpus_records()
    assert len({r.source for r in recs}) == len(DEFAULT.sources)
    order = sorted(recs, key=dedup.keep_key)
    sig = mh.signatures([r.text for r in order])
    src = np.array([r.source_order for r in order])
    single = cross_source_candidates(sig, src)
    assert len(single) > 0
    for ranges in ([(0, 7), (7, 14)], [(0, 1), (1, 5), (5, 13), (13, 14)], [(b, b + 1) for b in range(14)]):
        split = mh.merge_pairs(cross_source_candidates(sig, src, lo, hi) for lo, hi in ranges)
        assert np.array_equal(split, single), ranges
    keys = [r.doc_key for r in order]
    whole = deduplicate(recs)
    halves = mh.merge_pairs(cross_source_candidates(sig, src, lo, hi) for lo, hi in [(0, 7), (7, 14)])
    pairs = [(keys[i], keys[j]) for i, j in halves.tolist()]
    split_run = deduplicate(list(reversed(recs)), signatures=dict(zip(keys, sig)), cross_pairs=pairs)
    assert split_run.decisions == whole.decisions and split_run.clusters == whole.clusters
    assert split_run.figures == whole.figures
    assert whole.figures["cross_source_clusters"] > 0


def _mutate(text: str, frac: float, rng: random.Random) -> str:
    """Replace a fraction ``frac`` of the identifier/number tokens by fresh ones."""
    import re

    toks = list(re.finditer(r"[A-Za-z0-9_]+", text))
    chosen = set(rng.sample(range(len(toks)), int(round(frac * len(toks)))))
    out, last = [], 0
    for i, m in enumerate(toks):
        if i in chosen:
            out += [text[last:m.start()], f"mut{rng.randrange(1 << 40):x}"]
            last = m.end()
    return "".join(out) + text[last:]


def test_recall_and_precision_against_exact_jaccard():
    rng = random.Random(7)
    recs = [r for r in corpus_records(["lz4-4.4.5", "xxhash-4.1.0", "zstandard-0.25.0", "pybind11-3.1.0"])
            if 2_000 <= len(r.text) <= 60_000]
    seen, base = set(), []
    for r in recs:
        if r.text not in seen:
            seen.add(r.text)
            base.append(r)
    base = rng.sample(base, 40)
    # Token replacement fractions spanning J ~ 0.3 ... 0.97 (one mutated token spoils <= 5 shingles).
    fracs = [0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15]
    pairs = []  # (exact J, flagged within a source, flagged across sources)
    for r in base:
        for f in fracs:
            m = _mutate(r.text, f, rng)
            j = exact_jaccard(r.text, m)
            within = deduplicate([r, DedupRecord("m/" + r.doc_key, r.source, r.source_order, r.path + ".m", r.license_class, m)])
            across = deduplicate([r, DedupRecord("m/" + r.doc_key, "mutants", 99, r.path, r.license_class, m)])
            assert within.figures["cross_source_removed"] == 0 and across.figures["near_removed"] == 0
            pairs.append((j, within.figures["near_removed"] == 1, across.figures["cross_source_removed"] == 1))
    assert sum(j >= 0.8 for j, _, _ in pairs) >= 100 and sum(j < 0.7 for j, _, _ in pairs) >= 60
    for col in (1, 2):
        hi = [p for p in pairs if p[0] >= 0.8]
        recall = sum(p[col] for p in hi) / len(hi)
        flagged = [p for p in pairs if p[col]]
        precision = sum(p[0] >= 0.7 for p in flagged) / len(flagged)
        assert recall >= 0.95 and precision >= 0.95, (col, recall, precision)
    # Unrelated real files are never merged: a run over the originals drops nothing near.
    res = deduplicate([DedupRecord(r.doc_key, f"s{i}", i, r.path, r.license_class, r.text) for i, r in enumerate(base)])
    assert res.figures["near_removed"] == res.figures["cross_source_removed"] == 0


def test_tiny_run_band_steps_match_the_in_process_dedup(tiny_run):
    root, _ = tiny_run
    layout = SnapshotLayout(root, "tiny")
    manifest = load_manifest("tiny")
    fig = layout.read_figures("dedup")
    assert fig["signatures_precomputed"] and fig["cross_pairs_from_band_steps"]
    docs = pa.concat_tables([read_parquet(layout.shard(s.name) / "scrubbed.parquet") for s in manifest.sources]).to_pydict()
    recs = [DedupRecord(docs["doc_key"][i], docs["source"][i], docs["source_order"][i], docs["path"][i],
                        docs["license_class"][i], docs["text"][i]) for i in range(len(docs["doc_key"]))]
    res = deduplicate(recs)
    stored = read_parquet(layout.stage_dir("dedup") / "decisions.parquet").to_pylist()
    assert stored == res.decisions
    assert read_parquet(layout.stage_dir("dedup") / "duplicate_clusters.parquet").to_pylist() == res.clusters
    sig = read_parquet(layout.shard("lz4-4.4.5") / "minhash.parquet")
    assert str(sig.schema.field("signature").type.value_type) == "uint32"
