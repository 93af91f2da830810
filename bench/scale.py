"""Peak memory and throughput of every step as the input grows: ×1, ×4 and ×16 slices.

A slice ×k is the first sources of a corpus manifest (manifest order) whose raw bytes
reach ``k × --base-mb`` MB (the same sources in every slice, so ×4 contains ×1). Each
slice is its own snapshot under ``--data-root`` (names ``scale-x1``, ``scale-x4``,
``scale-x16``; settings from the manifest, ``--shard-mb`` sets ``shard_bytes``). Every
step runs in a **fresh process** per partition (per revision for acquire, per revision ×
shard for the per-document stages, once per snapshot for the global steps), in the
graph's order, through :func:`megacpp_core.runner.run_stage` — no Dagster — and its peak
RSS is the child's own high-water mark (``VmHWM`` of ``/proc/self/status``, read by the
child as it ends). Not ``ru_maxrss`` from ``os.wait4``: Linux carries the parent's
high-water mark at fork into the child's ``ru_maxrss`` across ``exec``, so every step
would read at least this script's own RSS.

Prints one JSON object: per slice the sources, raw MB and, per step, ``peak_rss_mb`` (the
largest over its partitions), ``seconds`` (sum), ``partitions`` and ``mb_per_s`` (the
slice's raw MB over the step's seconds); then per step ``rss_growth_x16`` = peak RSS at
×16 / peak RSS at ×1 (the issue's bound: ≤ 1.25, and every peak ≤ 2 GiB).

The tokenizer's memory is set by ``tokenizer_sample_bytes`` (it trains on a deterministic
sample of at most that many bytes of kept text; default 64 MiB), not by the corpus. On
small slices the sample is the whole kept text, so its memory grows with the slice until
the cap: ``--tokenizer-sample-mb`` sets the setting for every slice to a value below the
×1 slice's kept text, so every slice trains on a sample of the same size and the growth
shown is what the corpus adds beyond the sample. Each slice's ``tokenizer_training_mb``
(the sample's size) is printed with it. Without the flag the manifest's setting is used.

The pack step's memory is likewise one packing group of at most ``pack_group_tokens``
tokens (default 8 Mi), plus the plan's lengths and the rows buffered for one 1,024-row
row group of the packed files (SPEC §6; about 290 MB of arrow at L = 8,192):
``--pack-group-tokens`` sets a group size below the ×1 slice's tokens for every slice, so
each slice packs groups of the same size. A slice with fewer than 1,024 rows never fills
the row-group buffer, so the growth shown up to that size includes the buffer's. Each
slice's ``packing_groups`` is printed.

Steps other than acquire run only when named in ``--steps``; the upstream steps of the
named ones must have run on the slices (name them on the first invocation, e.g.
``--steps quality,license,scrub,minhash,lsh_bands_00_07,lsh_bands_07_14,dedup,tokenizer``).

Usage::

    python bench/scale.py [--corpus xl] [--base-mb 4] [--shard-mb 64] [--data-root /tmp/scale]
                          [--factors 1,4,16] [--steps quality,minhash,...] [--tokenizer-sample-mb 1]
                          [--pack-group-tokens 262144]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def vm_hwm_mb() -> float:
    """This process's peak resident set (``VmHWM`` of ``/proc/self/status``), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError("/proc/self/status has no VmHWM line")


def child(stage: str, key: str, root: str, manifest: str, peak_file: str) -> None:
    """Run one stage on one partition (in this fresh process); write its peak RSS (MiB)
    to ``peak_file``. ``stage`` may name several, comma-separated: they run one after
    another in this process, as the stages sharing one step do
    (:func:`megacpp_core.stages.step_groups`), and the peak is the whole step's."""
    from megacpp_core.manifest import load_manifest
    from megacpp_core.runner import run_stage
    from megacpp_core.stage import Partition
    from megacpp_core.stages import by_name
    from megacpp_core.storage import open_root

    data_root, m = open_root(root), load_manifest(manifest)
    for name in stage.split(","):
        st = by_name(name)
        res = run_stage(st, data_root, m, Partition.parse(key, st.partitioning))
        if not res.ok:
            bad = {k: v for k, v in res.checks.items() if not v[0]}
            raise SystemExit(f"{name} {key}: gates failed {bad}")
    Path(peak_file).write_text(f"{vm_hwm_mb():.1f}")


def run_child(stage: str, key: str, root: Path, manifest: Path) -> tuple[float, float]:
    """``(seconds, peak RSS MB)`` of one step partition in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        peak = Path(tmp) / "peak"
        t0 = time.perf_counter()
        code = subprocess.call([sys.executable, __file__, "--child", stage, key, str(root), str(manifest), str(peak)])
        if code != 0:
            raise SystemExit(f"step {stage} {key} failed with exit code {code}")
        return time.perf_counter() - t0, float(peak.read_text())


def source_bytes(manifest_path: str, cache: Path) -> list[tuple[str, int]]:
    """``[(source name, raw bytes)]`` in manifest order (every file of the revision)."""
    from megacpp_core import acquire
    from megacpp_core.manifest import load_manifest

    out = []
    for s in load_manifest(manifest_path).sources:
        got = acquire.acquire_source(s, cache)
        out.append((s.name, sum(len(b) for _, b in got.files)))
        del got
    return out


def slice_manifest(base: dict, names: list[str], name: str, shard_bytes: int, path: Path,
                   tokenizer_sample_bytes: int | None = None, pack_group_tokens: int | None = None) -> Path:
    """Write the manifest of one slice: ``base`` restricted to the sources ``names``, with
    ``shard_bytes`` (and ``tokenizer_sample_bytes``, ``pack_group_tokens`` when given) set."""
    m = dict(base)
    m["name"] = name
    m["settings"] = {**(base.get("settings") or {}), "shard_bytes": shard_bytes}
    if tokenizer_sample_bytes is not None:
        m["settings"]["tokenizer_sample_bytes"] = tokenizer_sample_bytes
    if pack_group_tokens is not None:
        m["settings"]["pack_group_tokens"] = pack_group_tokens
    m["sources"] = [s for s in base["sources"] if s["name"] in names]
    path.write_text(yaml.safe_dump(m, sort_keys=False))
    return path


def run_slice(manifest_path: Path, root: Path, only: set[str] | None) -> dict:
    """Every step of the graph on one slice, each partition in a fresh process."""
    from megacpp_core.manifest import load_manifest
    from megacpp_core.runner import revision_shards
    from megacpp_core.snapshots import record_manifest
    from megacpp_core.stage import Partition, Partitioning
    from megacpp_core.stages import STAGES
    from megacpp_core.storage import open_root

    m = load_manifest(str(manifest_path))
    data = open_root(str(root))
    record_manifest(data, m)
    steps: dict[str, dict] = {}

    def account(stage: str, key: str) -> None:
        if only and stage not in only and stage != "acquire":
            return
        sec, rss = run_child(stage, key, root, manifest_path)
        s = steps.setdefault(stage, {"peak_rss_mb": 0.0, "seconds": 0.0, "partitions": 0})
        s["peak_rss_mb"] = round(max(s["peak_rss_mb"], rss), 1)
        s["seconds"] = round(s["seconds"] + sec, 2)
        s["partitions"] += 1
        print(f"  {stage:<16} {key:<40} {sec:7.1f}s {rss:8.1f} MB", file=sys.stderr, flush=True)

    for st in STAGES:
        if st.partitioning is Partitioning.REVISION:
            for src in m.sources:
                account(st.name, Partition(m.name, src.name).key)
        elif st.partitioning is Partitioning.REVISION_SHARD:
            for src in m.sources:
                for k in revision_shards(data, m.name, src.name):
                    account(st.name, Partition(m.name, src.name, k).key)
        else:
            account(st.name, m.name)
    return steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", nargs=5, metavar=("STAGE", "KEY", "ROOT", "MANIFEST", "PEAK_FILE"), help=argparse.SUPPRESS)
    ap.add_argument("--corpus", default="xl")
    ap.add_argument("--base-mb", type=float, default=4.0)
    ap.add_argument("--shard-mb", type=float, default=64.0)
    ap.add_argument("--factors", default="1,4,16")
    ap.add_argument("--steps", default="", help="comma-separated stage names to measure (default: all)")
    ap.add_argument("--tokenizer-sample-mb", type=float, default=None,
                    help="tokenizer_sample_bytes of every slice, in MiB (default: the manifest's)")
    ap.add_argument("--pack-group-tokens", type=int, default=None,
                    help="pack_group_tokens of every slice (default: the manifest's)")
    ap.add_argument("--data-root", default="/tmp/megacpp-scale")
    ap.add_argument("--cache", default=os.environ.get("MEGACPP_CACHE_DIR", "data/cache"))
    a = ap.parse_args(argv)
    if a.child:
        child(*a.child)
        return 0
    from megacpp_core.manifest import load_manifest

    mpath = load_manifest(a.corpus).path
    base = yaml.safe_load(Path(mpath).read_text())
    sizes = source_bytes(str(mpath), Path(a.cache))
    root = Path(a.data_root)
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "cache").exists():
        (root / "cache").symlink_to(Path(a.cache).resolve(), target_is_directory=True)
    only = set(filter(None, a.steps.split(","))) or None
    sample_bytes = None if a.tokenizer_sample_mb is None else int(a.tokenizer_sample_mb * 1024 * 1024)
    out: dict = {"corpus": a.corpus, "base_mb": a.base_mb, "shard_mb": a.shard_mb,
                 "tokenizer_sample_mb": a.tokenizer_sample_mb, "pack_group_tokens": a.pack_group_tokens, "slices": {}}
    for k in (int(x) for x in a.factors.split(",")):
        names, total = [], 0
        for name, n in sizes:
            if total >= k * a.base_mb * 1e6:
                break
            names.append(name)
            total += n
        if total < k * a.base_mb * 1e6:
            raise SystemExit(f"corpus {a.corpus} has {total / 1e6:.1f} MB, less than ×{k} of {a.base_mb} MB")
        path = slice_manifest(base, names, f"scale-x{k}", int(a.shard_mb * 1024 * 1024), root / f"scale-x{k}.yaml",
                              sample_bytes, a.pack_group_tokens)
        print(f"×{k}: {len(names)} sources, {total / 1e6:.1f} MB", file=sys.stderr, flush=True)
        steps = run_slice(path, root, only)
        for s in steps.values():
            s["mb_per_s"] = round(total / 1e6 / s["seconds"], 3) if s["seconds"] else None
        out["slices"][f"x{k}"] = {"sources": names, "raw_mb": round(total / 1e6, 2), "steps": steps}
        if "tokenizer" in steps:
            info = json.loads((root / "snapshots" / f"scale-x{k}" / "tokenizer" / "tokenizer_manifest.json").read_text())
            out["slices"][f"x{k}"]["tokenizer_training_mb"] = round(info["training_bytes"] / 2**20, 3)
        if "pack" in steps:
            pack = json.loads((root / "snapshots" / f"scale-x{k}" / "figures" / "pack.json").read_text())
            out["slices"][f"x{k}"]["packing_groups"] = pack["packing_groups"]
    fs = list(out["slices"])
    first, last = out["slices"][fs[0]]["steps"], out["slices"][fs[-1]]["steps"]
    out[f"rss_growth_{fs[-1]}_over_{fs[0]}"] = {s: round(last[s]["peak_rss_mb"] / first[s]["peak_rss_mb"], 3)
                                               for s in first if s in last and first[s]["peak_rss_mb"]}
    out["max_peak_rss_mb"] = max(s["peak_rss_mb"] for sl in out["slices"].values() for s in sl["steps"].values())
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
