"""Benchmark of the stage-2 quality filters against their per-character reference
(prints one JSON object).

    python bench/quality.py [--data-root DIR] [--corpus default] [--repeat 3]

Input: the quality stage's input, every ``revisions/*/shards/*/source_files.parquet`` of
the snapshot under ``--data-root`` (a data root after ``megacpp run --corpus NAME``).

Timed in this one process on the same files, wall seconds, best of ``--repeat``:

``reference``
    :func:`megacpp_core.quality.filter_files` with the character counts done as their
    definitions read, one Python generator step per character
    (``sum(1 for ch in text if not ch.isspace())``, ``… if ch.isalpha()``), and every
    encoded-data pattern run over the whole of every text: what the stage did before.
``ours``
    :func:`megacpp_core.quality.filter_files` as it is (``bytes.translate`` counts on
    ASCII text, the ``\\u`` prefilter; on ASCII text the base64 runs found with numpy and
    the hex-bytes pattern run only where a match can lie).
``counts``
    The two character counts alone over every decodable text, reference and ours.
``encoded_runs``
    The encoded-data runs alone over every decodable text: the three regexes over the
    whole text behind their prefilter (``_regex_runs``, what the stage did before) against
    ours (``_runs``); ``same_runs``: the same run lengths for every text.

Both runs must keep and reject the same files with the same measured values
(``same_decisions``); ``ours_over_reference`` = reference seconds / ours seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megacpp_core import quality  # noqa: E402
from megacpp_core.manifest import load_manifest  # noqa: E402
from timing import best_of  # noqa: E402  (bench/timing.py)


def _reference_nonspace(text: str) -> int:
    return sum(1 for ch in text if not ch.isspace())


def _reference_alpha(text: str) -> int:
    return sum(1 for ch in text if ch.isalpha())


class _Reference:
    """The per-character counts and unfiltered pattern scans in place of ours, for a ``with`` block."""

    def __enter__(self):
        self.saved = (quality.count_nonspace, quality.count_alpha, quality._ENCODED_NEEDS, quality._runs)
        quality.count_nonspace, quality.count_alpha = _reference_nonspace, _reference_alpha
        quality._ENCODED_NEEDS = (None,) * len(quality.ENCODED_PATTERNS)
        quality._runs = quality._regex_runs
        return self

    def __exit__(self, *exc):
        quality.count_nonspace, quality.count_alpha, quality._ENCODED_NEEDS, quality._runs = self.saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-root", default="data")
    ap.add_argument("--corpus", default="default")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    snap = Path(a.data_root) / "snapshots" / a.corpus
    files = sorted(snap.glob("revisions/*/shards/*/source_files.parquet"))
    if not files:
        sys.exit(f"no source_files.parquet under {snap}/revisions: run `megacpp run --corpus {a.corpus}` first")
    tables = [pq.read_table(f) for f in files]
    settings = load_manifest(str(snap / "manifest.yaml")).settings
    run = lambda: [quality.filter_files(t, settings) for t in tables]  # noqa: E731
    ours_out = run()
    with _Reference():
        ref_out = run()
        ref_s = best_of(run, a.repeat)
    ours_s = best_of(run, a.repeat)
    same = all(k1.equals(k2) and e1.equals(e2) for (k1, e1, _), (k2, e2, _) in zip(ours_out, ref_out))
    texts = []
    for t in tables:
        for data in t.column("content").to_pylist() if "content" in t.column_names else []:
            try:
                texts.append(data.decode("utf-8"))
            except (UnicodeDecodeError, AttributeError):
                pass
    count_ref = best_of(lambda: [(_reference_nonspace(x), _reference_alpha(x)) for x in texts], a.repeat)
    count_ours = best_of(lambda: [(quality.count_nonspace(x), quality.count_alpha(x)) for x in texts], a.repeat)
    enc_same = all(sorted(quality._runs(x)) == sorted(quality._regex_runs(x)) for x in texts)
    enc_regex = best_of(lambda: [quality._regex_runs(x) for x in texts], a.repeat)
    enc_ours = best_of(lambda: [quality._runs(x) for x in texts], a.repeat)
    size = sum(pa.compute.sum(t.column("size")).as_py() or 0 for t in tables)
    print(json.dumps({
        "files": sum(t.num_rows for t in tables), "megabytes": round(size / 1e6, 3), "shards": len(files),
        "reference": {"seconds": round(ref_s, 3), "mb_per_s": round(size / 1e6 / ref_s, 3)},
        "ours": {"seconds": round(ours_s, 3), "mb_per_s": round(size / 1e6 / ours_s, 3)},
        "ours_over_reference": round(ref_s / ours_s, 3), "same_decisions": same,
        "counts": {"texts": len(texts), "reference_seconds": round(count_ref, 3), "ours_seconds": round(count_ours, 3),
                   "ours_over_reference": round(count_ref / count_ours, 2) if count_ours else None},
        "encoded_runs": {"texts": len(texts), "regexes_seconds": round(enc_regex, 3), "ours_seconds": round(enc_ours, 3),
                         "ours_over_regexes": round(enc_regex / enc_ours, 2) if enc_ours else None,
                         "same_runs": enc_same},
    }))


if __name__ == "__main__":
    main()
