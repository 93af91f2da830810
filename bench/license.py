"""Benchmark: the license stage's scan, before and after its ScanCode work was cut (SPEC §4 stage 2).

Every pass decides the same files the same way the license stage does: for every shard of
every revision of a materialized snapshot, the shard's kept files
(``revisions/SOURCE/shards/SHARD/quality_kept.parquet``) with the revision's license files
(``license_texts.parquet``), through :func:`megacpp_core.license.scan_revision` with the
snapshot's policy and one :class:`~megacpp_core.license.Scanner` shared by every shard (as
one process runs them). ScanCode's index is loaded first and timed on its own
(:func:`megacpp_core.license_scancode.load`; ``index_load_seconds``, of which
``prefilter_tables_seconds``), then, in the same process:

``baseline``
    the scan as it was: ScanCode's own candidate ranking (prefilter off), no result store.
``ours_cold``
    the exact candidate prefilter on and an empty result store (a first run).
``ours_stored``
    the same with the store ``ours_cold`` filled (a re-run, another worker, another
    snapshot sharing notices): no ScanCode call at all.

``naive`` (``--naive``, slow: ScanCode needs ~50 s on a 1 MB file)
    ``scancode.api.get_licenses`` on every whole file, no cache; a file without a detected
    license falls back to the directory license (license files scanned once per file).

MB/s are megabytes (10^6) of kept code (UTF-8) per second after the index is loaded
(``*_mb_s`` per wall second, ``*_cpu_mb_s`` per CPU second of this process);
``goal_mb_s`` is issue #19's 3 MB/s and ``*_ratio_to_goal`` ours against it. Every pass
must give the same rows (``row_differences``, listed up to 20) and the ScanCode answers of
the prefilter pass must equal ScanCode's own (``scancode_answer_differences``: every
distinct text scanned, run both ways). Prints one JSON object.

Usage::

    python bench/license.py --data-root DATA_ROOT [--snapshot default] [--sources a,b] [--naive]
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from megacpp_core import acquire
from megacpp_core import license as lic
from megacpp_core import license_scancode as lsc
from megacpp_core.layout import SnapshotLayout
from megacpp_core.manifest import load_manifest

GOAL_MB_S = 3.0


def _get_licenses(text: str, tmpdir: str) -> str | None:
    from scancode.api import get_licenses

    path = os.path.join(tmpdir, "f.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return get_licenses(path).get("detected_license_expression_spdx") or None


def naive_revision(source: str, files: dict[str, str], candidates: list[str], policy: lic.LicensePolicy,
                   tmpdir: str) -> dict[str, tuple[str | None, str]]:
    """``{path: (spdx_expression, decision)}`` from whole-file ScanCode runs, no cache."""
    if source in policy.refused_sources:
        return {p: (None, "refuse") for p in candidates}
    by_dir: dict[str, list[str]] = {}
    for p in sorted(files):
        if lic.is_license_file(p):
            by_dir.setdefault(posixpath.dirname(p), []).append(p)
    scanned: dict[str, str | None] = {}
    dir_cache: dict[str, str | None] = {}

    def dir_license(d: str) -> str | None:
        if d not in dir_cache:
            found = None
            entries = by_dir.get(d, [])
            primary = [p for p in entries if lic._PRIMARY_NAME.match(posixpath.basename(p))]
            for group in (primary, [p for p in entries if p not in primary]):
                exprs = []
                for p in group:
                    if p not in scanned:
                        scanned[p] = lic.parse_expression(_get_licenses(files[p], tmpdir))
                    if lic._has_license(scanned[p], policy):
                        exprs.append(scanned[p])
                if exprs:
                    found = lic._combine_and(exprs)
                    break
            if found is None and d:
                found = dir_license(posixpath.dirname(d))
            dir_cache[d] = found
        return dir_cache[d]

    out = {}
    for p in sorted(candidates):
        expr = lic.parse_expression(_get_licenses(files[p], tmpdir))
        if not lic._has_license(expr, policy):
            expr = dir_license(posixpath.dirname(p))
        out[p] = (expr, lic.decide(lic.classify_expression(expr, policy), policy)[0])
    return out


def load_shards(layout: SnapshotLayout, source: str) -> list[tuple[dict[str, str], list[str]]]:
    """``[(files, candidates)]`` per shard of ``source``, as the license stage builds them."""
    rdir = layout.revision(source)
    lt = pq.read_table(rdir / "license_texts.parquet", columns=["path", "content", "size"]).to_pydict()
    out = []
    for sdir in sorted(p for p in (rdir / "shards").iterdir() if (p / "quality_kept.parquet").exists()):
        kept = pq.read_table(sdir / "quality_kept.parquet", columns=["path", "text"]).to_pydict()
        files = dict(zip(kept["path"], kept["text"]))
        for p, b, size in zip(lt["path"], lt["content"], lt["size"]):
            if p not in files and lic.is_license_file(p) and size <= acquire.MAX_LICENSE_FILE_BYTES:
                files[p] = b.decode("utf-8", errors="replace")
        out.append((files, sorted(kept["path"])))
    return out


def scan_pass(shards: dict[str, list], policy: lic.LicensePolicy, scanner: lic.Scanner) -> tuple[float, dict, float]:
    """Wall seconds, ``{(source, shard index, path): row}`` and CPU seconds of this process
    (what a shared, busy machine inflates less) of one pass over every shard."""
    rows = {}
    t0, c0 = time.perf_counter(), time.process_time()
    for name, parts in shards.items():
        for i, (files, cands) in enumerate(parts):
            for r in lic.scan_revision(name, files, cands, policy, scanner):
                rows[(name, i, r["path"])] = r
    return time.perf_counter() - t0, rows, time.process_time() - c0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-root", required=True, type=Path)
    ap.add_argument("--snapshot", default="default")
    ap.add_argument("--sources", default="", help="comma-separated subset of sources (default: all)")
    ap.add_argument("--naive", action="store_true", help="also time whole-file ScanCode runs (slow)")
    args = ap.parse_args(argv)
    layout = SnapshotLayout(args.data_root.resolve(), args.snapshot)
    manifest = load_manifest(layout.root / "manifest.yaml")
    from megacpp_core.stages.license import license_policy

    policy = license_policy(manifest.settings)
    names = [s.name for s in manifest.sources]
    if args.sources:
        names = [n for n in names if n in set(args.sources.split(","))]
    shards = {n: load_shards(layout, n) for n in names}
    code_bytes = sum(len(files[p].encode("utf-8", "surrogatepass")) for parts in shards.values()
                     for files, cands in parts for p in cands)
    mb = code_bytes / 1e6
    index_s = lsc.load()
    lic._scancode_categories()
    recorded: list[str] = []
    run = lsc.run_scancode

    def recording(text: str) -> dict:
        recorded.append(text)
        return run(text)

    result: dict = {"snapshot": args.snapshot, "sources": len(names), "shards": sum(map(len, shards.values())),
                    "code_bytes": code_bytes, "index_load_seconds": round(index_s, 2),
                    "prefilter_tables_seconds": round(lsc.LOAD["tables_seconds"] or 0.0, 2),
                    "scancode": lsc.scancode_version(), "goal_mb_s": GOAL_MB_S, "load_average": os.getloadavg()}
    passes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for on in (False, True):  # warm-up, untimed: ScanCode's lazily built parts
            lsc.install_prefilter(on)
            lsc.run_scancode("Licensed under the MIT License.")
        lsc.install_prefilter(False)
        base = lic.Scanner()
        passes["baseline"] = scan_pass(shards, policy, base) + (base,)
        print(f"baseline: {passes['baseline'][0]:.1f} s", file=sys.stderr, flush=True)
        lsc.install_prefilter(True)
        cold = lic.Scanner(lsc.ResultStore(Path(tmp) / "store"))
        lic.run_scancode = recording
        try:
            passes["ours_cold"] = scan_pass(shards, policy, cold) + (cold,)
        finally:
            lic.run_scancode = run
        print(f"ours (cold): {passes['ours_cold'][0]:.1f} s", file=sys.stderr, flush=True)
        stored = lic.Scanner(lsc.ResultStore(Path(tmp) / "store"))
        passes["ours_stored"] = scan_pass(shards, policy, stored) + (stored,)
        on = {t: lsc.run_scancode(t) for t in recorded}
        lsc.install_prefilter(False)
        answer_diffs = [t[:120] for t in recorded if lsc.run_scancode(t) != on[t]]
        lsc.install_prefilter(True)
        naive_s, naive = None, {}
        if args.naive:
            t0 = time.perf_counter()
            for n in names:
                for i, (files, cands) in enumerate(shards[n]):
                    for p, v in naive_revision(n, files, cands, policy, tmp).items():
                        naive[(n, i, p)] = v
            naive_s = time.perf_counter() - t0
    ref = passes["baseline"][1]
    diffs = [{"pass": k, "source": key[0], "shard": key[1], "path": key[2], "baseline": ref.get(key), "got": rows.get(key)}
             for k, (_, rows, _, _) in passes.items() for key in sorted(set(ref) | set(rows)) if ref.get(key) != rows.get(key)]
    for k, (secs, _, cpu, sc) in passes.items():
        result[f"{k}_seconds"] = round(secs, 3)
        result[f"{k}_mb_s"] = round(mb / secs, 2) if secs else None
        result[f"{k}_cpu_seconds"] = round(cpu, 3)
        result[f"{k}_cpu_mb_s"] = round(mb / cpu, 2) if cpu else None
        result[f"{k}_scancode_runs"] = sc.scans
        result[f"{k}_store_hits"] = sc.store_hits
    result.update({
        "files": len(ref),
        "speedup_cold": round(passes["baseline"][0] / passes["ours_cold"][0], 2),
        "speedup_stored": round(passes["baseline"][0] / passes["ours_stored"][0], 1),
        "ours_cold_ratio_to_goal": round(mb / passes["ours_cold"][0] / GOAL_MB_S, 2),
        "ours_stored_ratio_to_goal": round(mb / passes["ours_stored"][0] / GOAL_MB_S, 1),
        "baseline_ratio_to_goal": round(mb / passes["baseline"][0] / GOAL_MB_S, 2),
        "distinct_scancode_texts": len(recorded), "scancode_answer_differences": answer_diffs,
        "row_differences": len(diffs), "row_differences_first": diffs[:20],
    })
    if args.naive:
        decision_diffs = [k for k in sorted(ref) if ref[k]["decision"] != naive[k][1]]
        result.update({"naive_seconds": round(naive_s, 2), "naive_speedup_ours_cold": round(naive_s / passes["ours_cold"][0], 1),
                       "naive_decision_differences": len(decision_diffs),
                       "naive_expression_differences": sum(1 for k in ref if ref[k]["spdx_expression"] != naive[k][0])})
    print(json.dumps(result, indent=2, sort_keys=True, default=str))
    return result


if __name__ == "__main__":
    main()
