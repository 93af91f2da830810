"""Benchmark of stage 4's MinHash signatures and LSH index (prints one JSON object).

    .venv/bin/python bench/dedup.py [--corpus large] [--cache data/cache] [--baseline-mb 12]

Input: the C/C++ files (UTF-8) of every source of the corpus manifest, read through
``megacpp_core.acquire`` from the content-addressed cache (fetched when missing). The
``large`` corpus is used when its manifest exists, else ``default``.

Measured in this one process, CPU seconds (``time.process_time``, one core; numpy's
element-wise kernels are single-threaded) for *shingling plus signatures* of 128
permutations over 5-token shingles:

* ``ours`` — :func:`megacpp_core.minhash.signatures` (vectorized shingle hashing and
  datasketch's affine32 permutations), on the whole corpus and on the baseline sample;
* ``datasketch_update`` — ``MinHash.update`` once per shingle (SHA-1 hash, affine32);
* ``datasketch_update_batch`` — ``MinHash.update_batch`` per document;
* ``rensa`` — ``rensa.RMinHash(128, seed=1).update`` per document, when rensa is
  installed (the ``bench`` extra); shingle strings built with the same tokenizer.

The baselines run on a deterministic sample (every k-th file, about ``--baseline-mb``
MB); ratios compare MB/s on that same sample. Also reported: peak RSS of the process
(``ru_maxrss``) after the full-corpus run of our stage (signatures, both LSH passes and
the full :func:`megacpp_core.dedup.deduplicate`), and bytes of LSH index per document —
ours (64-bit band keys plus the per-band sort permutation, measured ``nbytes``) and
datasketch ``MinHashLSH`` with the same b × r (``tracemalloc`` around the inserts).
Goals (issue 5): ours ≥ 3× ``update_batch``, within 2× of rensa, ≤ 0.6 KB index/doc.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import tracemalloc
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import numpy as np  # noqa: E402
from datasketch import MinHash, MinHashLSH  # noqa: E402

from megacpp_core import dedup  # noqa: E402
from megacpp_core import minhash as mh  # noqa: E402
from megacpp_core.manifest import load_manifest  # noqa: E402


def load_records(corpus: str, cache: Path) -> list[dedup.DedupRecord]:
    return dedup.raw_source_records(load_manifest(corpus), cache)


def cpu(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def run_datasketch_update(texts):
    for t in texts:
        m = MinHash(num_perm=128, seed=1, scheme="affine32")
        for sh in dedup.shingles(t):
            m.update(sh)


def run_datasketch_batch(texts):
    for t in texts:
        m = MinHash(num_perm=128, seed=1, scheme="affine32")
        sh = list(dedup.shingles(t))
        if sh:
            m.update_batch(sh)


def run_rensa(texts):
    import rensa

    for t in texts:
        m = rensa.RMinHash(num_perm=128, seed=1)
        sh = [s.decode("utf-8") for s in dedup.shingles(t)]
        if sh:
            m.update(sh)
        m.digest()


def datasketch_index_bytes(sig: np.ndarray, bands: int, rows: int) -> float:
    """Bytes per document allocated by datasketch MinHashLSH inserts with the given b × r."""
    lsh = MinHashLSH(num_perm=sig.shape[1], params=(bands, rows))
    hs = [MinHash(num_perm=sig.shape[1], seed=1, scheme="affine32", hashvalues=s) for s in sig]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i, m in enumerate(hs):
        lsh.insert(i, m, check_duplication=False)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used / len(hs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default="large" if (PROJECT / "corpora" / "large.yaml").exists() else "default")
    ap.add_argument("--cache", default=str(PROJECT / "data" / "cache"))
    ap.add_argument("--baseline-mb", type=float, default=12.0)
    args = ap.parse_args(argv)

    recs = load_records(args.corpus, Path(args.cache))
    texts = [r.text for r in recs]
    total = sum(len(t.encode("utf-8")) for t in texts)
    step = max(1, int(round(total / (args.baseline_mb * 1e6))))
    sample = texts[::step]
    sample_mb = sum(len(t.encode("utf-8")) for t in sample) / 1e6
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    sig_holder = {}
    t_ours_full = cpu(lambda: sig_holder.setdefault("sig", mh.signatures(texts)))
    sig = sig_holder["sig"]
    t_dedup = cpu(lambda: sig_holder.setdefault("res", dedup.deduplicate(recs, signatures=dict(zip((r.doc_key for r in recs), sig)))))
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    rates = {"ours": sample_mb / cpu(lambda: mh.signatures(sample))}
    rates["datasketch_update"] = sample_mb / cpu(lambda: run_datasketch_update(sample))
    rates["datasketch_update_batch"] = sample_mb / cpu(lambda: run_datasketch_batch(sample))
    try:
        import rensa  # noqa: F401

        rates["rensa"] = sample_mb / cpu(lambda: run_rensa(sample))
    except ImportError:
        rates["rensa"] = None

    n = len(texts)
    b, r = dedup.near_lsh_params()
    near_keys = mh.band_keys(sig, r, 0, b)
    cross_keys = mh.band_keys(sig, dedup.CROSS_ROWS, 0, dedup.CROSS_BANDS)
    perm_bytes = np.argsort(near_keys[:, 0], kind="stable").nbytes  # one band's sort at a time
    sample_sig = sig[::max(1, n // 5000)]
    res = sig_holder["res"]
    out = {
        "corpus": args.corpus,
        "documents": n,
        "mb": round(total / 1e6, 3),
        "baseline_sample": {"documents": len(sample), "mb": round(sample_mb, 3), "every_kth_file": step},
        "mb_per_s_per_core": {k: (round(v, 3) if v is not None else None) for k, v in rates.items()},
        "ours_full_corpus_mb_per_s_per_core": round(total / 1e6 / t_ours_full, 3),
        "ratio_ours_vs_update_batch": round(rates["ours"] / rates["datasketch_update_batch"], 3),
        "ratio_ours_vs_update": round(rates["ours"] / rates["datasketch_update"], 3),
        "ratio_ours_vs_rensa": round(rates["ours"] / rates["rensa"], 3) if rates["rensa"] else None,
        "dedup_full_cpu_seconds": round(t_dedup, 3),
        "peak_rss_mb": round(rss_peak, 1),
        "rss_after_loading_texts_mb": round(rss_loaded, 1),
        "signature_bytes_per_document": sig.shape[1] * 4,
        "lsh_index_bytes_per_document": {
            "ours_near_20x6": round((near_keys.nbytes + perm_bytes) / n, 1),
            "ours_cross_14x8": round((cross_keys.nbytes + perm_bytes) / n, 1),
            "datasketch_near_20x6": round(datasketch_index_bytes(sample_sig, b, r), 1),
            "datasketch_cross_14x8": round(datasketch_index_bytes(sample_sig[:, :112], dedup.CROSS_BANDS, dedup.CROSS_ROWS), 1),
        },
        "dedup_figures": {k: res.figures[k] for k in ("files_in", "exact_removed", "near_removed", "cross_source_removed",
                                                      "files_out", "clusters", "cross_source_clusters")},
        "goals": {"ours_ge_3x_update_batch": rates["ours"] >= 3 * rates["datasketch_update_batch"],
                  "within_2x_of_rensa": (rates["ours"] * 2 >= rates["rensa"]) if rates["rensa"] else None,
                  "index_le_600_bytes_per_doc": (near_keys.nbytes + perm_bytes) / n <= 600},
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
