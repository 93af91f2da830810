"""Benchmark: our license stage vs a naive per-file ScanCode pass (SPEC §4 stage 2).

Both passes decide the same files: every file the quality stage kept
(``revisions/SOURCE/quality_kept.parquet``) of every revision of a materialized snapshot,
with the same policy (the snapshot's settings) and the same directory rule (nearest
ancestor's LICENSE/COPYING files, else its NOTICE/README files).

``ours``
    :func:`megacpp_core.license.scan_revision` with a fresh :class:`~megacpp_core.license.Scanner`
    (empty cache): SPDX identifier, else ScanCode on the normalized leading comment block
    once per distinct header hash, else the directory license.
``naive``
    ``scancode.api.get_licenses`` on every whole file, no cache; a file without a
    detected license falls back to the directory license (license files also scanned with
    ``get_licenses``, once per file).

ScanCode's license index is loaded before either pass is timed, so neither pays it.
Prints one JSON object: ``files``, ``ours_seconds``, ``naive_seconds``, ``speedup``
(naive / ours), ``decision_differences`` (up to 20 listed with both expressions) and
``expression_differences`` (files whose SPDX expression differs; up to 20 listed).

Usage::

    python bench/license.py --data-root DATA_ROOT [--snapshot default] [--sources a,b]
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

from megacpp_core import license as lic
from megacpp_core.layout import SnapshotLayout
from megacpp_core.manifest import load_manifest


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


def load_revision(layout: SnapshotLayout, source: str) -> tuple[dict[str, str], list[str]]:
    """``(files, candidates)`` as the license stage builds them from the stage-1 tables."""
    rdir = layout.shard(source)  # one shard per revision at the default shard_bytes
    kept = pq.read_table(rdir / "quality_kept.parquet", columns=["path", "text"]).to_pydict()
    kept_text = dict(zip(kept["path"], kept["text"]))
    src = pq.read_table(rdir / "source_files.parquet", columns=["path", "content", "size"]).to_pydict()
    files: dict[str, str] = {}
    for p, b, size in zip(src["path"], src["content"], src["size"]):
        if p in kept_text:
            files[p] = kept_text[p]
        elif lic.is_license_file(p) and size <= 1_000_000:
            files[p] = b.decode("utf-8", errors="replace")
    return files, sorted(kept_text)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-root", required=True, type=Path)
    ap.add_argument("--snapshot", default="default")
    ap.add_argument("--sources", default="", help="comma-separated subset of sources (default: all)")
    args = ap.parse_args(argv)
    layout = SnapshotLayout(args.data_root.resolve(), args.snapshot)
    manifest = load_manifest(layout.root / "manifest.yaml")
    from megacpp_core.stages.license import license_policy

    policy = license_policy(manifest.settings)
    names = [s.name for s in manifest.sources]
    if args.sources:
        names = [n for n in names if n in set(args.sources.split(","))]
    revisions = {n: load_revision(layout, n) for n in names}
    with tempfile.TemporaryDirectory() as tmpdir:
        _get_licenses("Licensed under the MIT License.", tmpdir)  # load ScanCode's index, untimed
        lic._scancode_categories()
        t0 = time.perf_counter()
        scanner = lic.Scanner()
        ours = {}
        for n in names:
            files, cands = revisions[n]
            for r in lic.scan_revision(n, files, cands, policy, scanner):
                ours[(n, r["path"])] = (r["spdx_expression"], r["decision"])
        ours_s = time.perf_counter() - t0
        print(f"ours: {len(ours)} files in {ours_s:.1f} s ({scanner.scans} scans)", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        naive = {}
        for n in names:
            t1 = time.perf_counter()
            files, cands = revisions[n]
            for p, v in naive_revision(n, files, cands, policy, tmpdir).items():
                naive[(n, p)] = v
            print(f"naive: {n} {len(cands)} files {time.perf_counter() - t1:.1f} s", file=sys.stderr, flush=True)
        naive_s = time.perf_counter() - t0
    diffs = [{"source": k[0], "path": k[1], "ours": ours[k], "naive": naive[k]}
             for k in sorted(ours) if ours[k][1] != naive[k][1]]
    result = {
        "snapshot": args.snapshot, "sources": len(names), "files": len(ours),
        "ours_seconds": round(ours_s, 2), "naive_seconds": round(naive_s, 2),
        "speedup": round(naive_s / ours_s, 1) if ours_s else None,
        "scancode_runs_ours": scanner.scans, "scancode_cache_hits_ours": scanner.cache_hits,
        "decision_differences": len(diffs), "differences": diffs[:20],
        "expression_differences": sum(1 for k in ours if ours[k][0] != naive[k][0]),
        "expression_differences_first": [{"source": k[0], "path": k[1], "ours": ours[k][0], "naive": naive[k][0]}
                                         for k in sorted(ours) if ours[k][0] != naive[k][0]][:20],
    }
    print(json.dumps(result, indent=2, sort_keys=True))
    return result


if __name__ == "__main__":
    main()
