"""Peak memory of the snapshot-wide dedup steps (LSH band steps and dedup) as the number
of files grows far beyond the shipped corpora: ours against the in-memory baseline.

A synthetic snapshot ×k has ``k × --files`` files in sources of ``--files-per-source``
files (more sources as it grows, as a real corpus grows by repositories), split into
shards of ``--files-per-shard``. Its scrubbed and minhash shards are written straight to
a data root (no acquire): most files are unique, with random signatures and a short
text; a tenth are exact copies of a pooled text (about twenty copies of each, across
sources), one file in 2,000 a copy of one "vendored header" (a key group quadratic in
pairs), and a few percent near copies (a few tokens changed) within and across sources,
with real texts and signatures, so every pass (exact buckets, near within a source,
cross-source union-find, the exact-Jaccard verification of candidate texts) has work.

Each step runs in a **fresh process** on the snapshot, its peak RSS the child's
``VmHWM``: ``lsh_bands_00_07`` and ``dedup`` through :func:`megacpp_core.runner.run_stage`
(ours, with the manifest's ``dedup_bucket_rows``), and ``baseline``: the previous
snapshot step — every file's metadata and signature read into memory and
:func:`megacpp_core.dedup.deduplicate_columns` run on them (the same decisions; checked
byte for byte when both run) — on slices up to ``--baseline-max-files``.

Prints one JSON object: per slice the files and, per step, ``peak_rss_mb`` and
``seconds``; then ``growth`` (peak at the largest slice / peak at ×1, per step) and
``ours_over_baseline`` (peak RSS ratio per slice where both ran).

Usage::

    python bench/dedup_scale.py [--files 100000] [--factors 1,16] [--data-root /tmp/dedup-scale]
                                [--bucket-rows 1048576] [--baseline-max-files 2000000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from scale import vm_hwm_mb  # noqa: E402  (bench/scale.py, same directory)

WORDS = [f"tok{i}" for i in range(2000)]


def write_snapshot(root: Path, name: str, files: int, per_source: int, per_shard: int, bucket_rows: int, seed: int = 0) -> Path:
    """Write the synthetic snapshot ``name`` (module doc) under ``root``; returns its manifest."""
    import pyarrow as pa
    import yaml

    from megacpp_core import catalog, sharding
    from megacpp_core import minhash as mh
    from megacpp_core.layout import shard_plan_key
    from megacpp_core.signatures import signatures_table
    from megacpp_core.stage import Partition
    from megacpp_core.storage import DataRoot
    from megacpp_core.tables import write_parquet

    rng = np.random.default_rng(seed)
    data = DataRoot(root)
    n_src = -(-files // per_source)
    names = [f"src{s:05d}" for s in range(n_src)]
    # texts copied across sources: about twenty copies of each whatever the size, and one
    # copied into 1 file in 2,000 (a vendored header: its LSH keys are shared quadratically)
    pool = [" ".join(rng.choice(WORDS, 120).tolist()) + "\n" for _ in range(max(512, files // 200))]
    heavy = " ".join(rng.choice(WORDS, 120).tolist()) + "\n"

    def near(text: str) -> str:
        toks = text.split()
        for at in rng.choice(len(toks), 3, replace=False).tolist():
            toks[at] = "x" + toks[at]
        return " ".join(toks) + "\n"

    for s, src in enumerate(names):
        n = min(per_source, files - s * per_source)
        kinds = rng.random(n)
        texts, real = [], np.zeros(n, bool)
        for i in range(n):
            if kinds[i] < 0.0005:
                texts.append(heavy)
                real[i] = True
            elif kinds[i] < 0.10:  # exact copy of a pooled text (other sources hold it too)
                texts.append(pool[int(rng.integers(0, len(pool)))])
                real[i] = True
            elif kinds[i] < 0.13:  # near copy of a pooled text (across sources)
                texts.append(near(pool[int(rng.integers(0, len(pool)))]))
                real[i] = True
            elif kinds[i] < 0.16 and i:  # near copy of this source's previous file
                texts.append(near(texts[i - 1]) if real[i - 1] else f"unique {src} {i} {rng.integers(1 << 62)}\n")
                real[i] = real[i - 1]
            else:
                texts.append(f"unique {src} {i} {rng.integers(1 << 62)}\n")
        sig = rng.integers(0, 2**32 - 1, (n, 128), dtype=np.uint32)
        at = np.flatnonzero(real)
        if len(at):
            sig[at] = mh.signatures([texts[i] for i in at])
        paths = [f"d{i % 97}/f{i:07d}.c" for i in range(n)]
        shards = -(-n // per_shard)
        for k in range(shards):
            lo, hi = k * per_shard, min(n, (k + 1) * per_shard)
            p = Partition(name, src, f"{k:03d}")
            t = pa.table({"doc_key": [f"{src}/{q}" for q in paths[lo:hi]], "source": [src] * (hi - lo),
                          "source_order": pa.array([s] * (hi - lo), pa.int32()), "path": paths[lo:hi],
                          "license_class": [("permissive", "gpl2", "weak_copyleft")[i % 3] for i in range(lo, hi)],
                          "content_sha256": [hashlib.sha256(x.encode()).hexdigest() for x in texts[lo:hi]],
                          "text": texts[lo:hi]})
            write_parquet(t, data.local_path(catalog.SCRUBBED.key(p)))
            write_parquet(signatures_table(t.column("doc_key").to_pylist(), sig[lo:hi]),
                          data.local_path(catalog.MINHASH.key(p)))
        data.write_json(shard_plan_key(name, src), sharding.plan(src, "synthetic", 1 << 26, shards,
                                                                  [min(per_shard, n - k * per_shard) for k in range(shards)],
                                                                  [0] * shards))
    manifest = root / f"{name}.yaml"
    manifest.write_text(yaml.safe_dump({"name": name, "settings": {"dedup_bucket_rows": bucket_rows},
                                        "sources": [{"name": src, "kind": "local", "path": str(root), "label": "synthetic"}
                                                    for src in names]}))
    return manifest


def child(step: str, root: str, manifest: str, out: str) -> None:
    """Run ``step`` in this fresh process; write ``{"peak": MiB, "sha": {...}}`` to ``out``."""
    from megacpp_core.manifest import load_manifest
    from megacpp_core.stage import Partition
    from megacpp_core.storage import open_root

    m, data = load_manifest(manifest), open_root(root)
    base = Path(root) / "snapshots" / m.name / "dedup"
    if step == "baseline":
        result = baseline(data, m)
    else:
        from megacpp_core.runner import run_stage
        from megacpp_core.stages import by_name

        res = run_stage(by_name(step), data, m, Partition(m.name))
        if not res.ok:
            raise SystemExit(f"{step}: gates failed {[k for k, v in res.checks.items() if not v[0]]}")
        result = {n: hashlib.sha256((base / f"{n}.parquet").read_bytes()).hexdigest()
                  for n in ("decisions", "duplicate_clusters")} if step == "dedup" else {}
    Path(out).write_text(json.dumps({"peak": round(vm_hwm_mb(), 1), "sha": result}))


def baseline(data, m) -> dict:
    """The previous dedup step: every file's metadata and signature in memory, then
    :func:`megacpp_core.dedup.deduplicate_columns`; returns the sha256 of the tables it
    writes (as the runner wrote them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from megacpp_core import catalog, dedup, lsh_stream
    from megacpp_core.runner import InputRef, revision_shards
    from megacpp_core.signatures import read_ref_signatures
    from megacpp_core.stage import Partition
    from megacpp_core.tables import write_parquet

    refs = [(InputRef(data, catalog.SCRUBBED, Partition(m.name, s.name, k)), InputRef(data, catalog.MINHASH, Partition(m.name, s.name, k)))
            for s in m.sources for k in revision_shards(data, m.name, s.name)]
    cols = ["doc_key", "source", "source_order", "path", "license_class", "content_sha256"]
    docs = pa.concat_tables([r.read(columns=cols) for r, _ in refs])
    perm = dedup.keep_order_indices(docs)
    docs = docs.take(pa.array(perm)).combine_chunks()
    keys = docs.column("doc_key").chunk(0)
    sig = np.zeros((docs.num_rows, 128), np.uint32)
    mh_keys = []
    for _, ref in refs:
        k, s = read_ref_signatures(ref)
        at = pc.index_in(k, value_set=keys).to_numpy(zero_copy_only=False).astype(np.int64)
        sig[at] = s
        mh_keys.append(at)
    row_to_doc = np.concatenate(mh_keys)
    pairs = [row_to_doc[b] for lo, hi in catalog.LSH_PAIRS
             for b in lsh_stream.read_pairs(InputRef(data, catalog.LSH_PAIRS[(lo, hi)], Partition(m.name)))]

    def load(want):
        for r, _ in refs:
            t = r.read(columns=["doc_key", "text"])
            hit = t.filter(pc.is_in(t.column("doc_key"), value_set=pa.array(sorted(want), pa.string())))
            yield from zip(hit.column(0).to_pylist(), hit.column(1).to_pylist())

    out = dedup.deduplicate_columns(docs, sig, None, np.concatenate(pairs) if pairs else None, load_texts=load)
    with tempfile.TemporaryDirectory() as tmp:
        return {n: hashlib.sha256(write_parquet(t, Path(tmp) / f"{n}.parquet").read_bytes()).hexdigest()
                for n, t in (("decisions", out.decisions), ("duplicate_clusters", out.clusters))}


def run_child(step: str, root: Path, manifest: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        t0 = time.perf_counter()
        code = subprocess.call([sys.executable, __file__, "--child", step, str(root), str(manifest), str(out)])
        if code != 0:
            raise SystemExit(f"step {step} failed with exit code {code}")
        return {"seconds": round(time.perf_counter() - t0, 2), **json.loads(out.read_text())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=4, metavar=("STEP", "ROOT", "MANIFEST", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--files", type=int, default=100_000, help="files of the x1 slice (xl has about 102,000)")
    ap.add_argument("--factors", default="1,16")
    ap.add_argument("--files-per-source", type=int, default=20_000)
    ap.add_argument("--files-per-shard", type=int, default=5_000)
    ap.add_argument("--bucket-rows", type=int, default=1 << 20, help="the dedup_bucket_rows setting")
    ap.add_argument("--baseline-max-files", type=int, default=2_000_000)
    ap.add_argument("--data-root", default=None)
    args = ap.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    root = Path(args.data_root or tempfile.mkdtemp(prefix="dedup-scale-"))
    report: dict = {"files_per_source": args.files_per_source, "bucket_rows": args.bucket_rows, "slices": {}}
    for f in [int(x) for x in args.factors.split(",")]:
        files = f * args.files
        t0 = time.perf_counter()
        manifest = write_snapshot(root, f"synth-x{f}", files, args.files_per_source, args.files_per_shard, args.bucket_rows)
        steps = {"write_seconds": round(time.perf_counter() - t0, 1), "files": files}
        for step in ("lsh_bands_00_07", "lsh_bands_07_14", "dedup"):
            steps[step] = run_child(step, root, manifest)
            fig = root / "snapshots" / f"synth-x{f}" / "figures" / f"{step}.json"
            if fig.exists():
                got = json.loads(fig.read_text())
                steps[step].update({k: got[k] for k in ("candidate_pairs", "pair_buckets", "files_out", "exact_removed",
                                                        "near_removed", "cross_source_removed") if k in got})
        if files <= args.baseline_max_files:
            steps["baseline"] = run_child("baseline", root, manifest)
            steps["same_tables_as_baseline"] = steps["baseline"].pop("sha") == steps["dedup"]["sha"]
        steps["dedup"].pop("sha", None)
        report["slices"][f"x{f}"] = steps
        print(json.dumps({f"x{f}": steps}), file=sys.stderr)
    first, last = report["slices"][f"x{args.factors.split(',')[0]}"], report["slices"][f"x{args.factors.split(',')[-1]}"]
    report["growth"] = {s: round(last[s]["peak"] / first[s]["peak"], 3) for s in first if isinstance(first[s], dict)
                        and s in last}
    report["ours_over_baseline"] = {k: round(v["dedup"]["peak"] / v["baseline"]["peak"], 3)
                                    for k, v in report["slices"].items() if "baseline" in v}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
