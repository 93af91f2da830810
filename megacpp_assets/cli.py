"""The ``megacpp`` command line (SPEC §9).

``megacpp run [--corpus NAME|PATH] [--data-root DIR]`` materializes a whole snapshot
through Dagster (one run per ``repo_revision`` partition, then one run of the
snapshot-wide assets), recording the runs in ``DAGSTER_HOME`` so ``dagster dev`` shows
them afterwards. ``megacpp verify PATH`` runs the verify gate. ``megacpp inspect PATH``
prints one packed row decoded. Exit codes: 0 success, 1 a stage or gate failed, 2 usage
or manifest error.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

DAGSTER_YAML = """# Local instance for `megacpp run` and `dagster dev` (SQLite storage under this directory).
telemetry:
  enabled: false
"""
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s  %(message)s", "%H:%M:%S"))
    lg = logging.getLogger("megacpp")
    if not lg.handlers:
        lg.addHandler(handler)
    lg.setLevel(logging.INFO)
    lg.propagate = False


def prepare_environment(data_root: str | None) -> tuple[Path, Path]:
    """Fix the data root and ``DAGSTER_HOME`` (default ``DATA_ROOT/dagster_home``) in the environment."""
    root = Path(data_root or os.environ.get("MEGACPP_DATA_ROOT", "data")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.environ["MEGACPP_DATA_ROOT"] = str(root)
    home = Path(os.environ.get("DAGSTER_HOME") or root / "dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        (home / "dagster.yaml").write_text(DAGSTER_YAML)
    os.environ["DAGSTER_HOME"] = str(home)
    return root, home


def revision_is_current(instance, layout, manifest, source) -> bool:
    """True when every per-revision asset (``REVISION_ASSETS``) of ``source``'s partition is materialized in
    ``instance`` and the recorded pin (source fields + settings) equals the manifest's now.

    The pin is read from the ``source_files`` materialization metadata and from the stage-0
    figures under the data root; the scrubbed output must still exist on disk; for a
    ``local`` source the directory's current content hash must equal the recorded revision.
    """
    from dagster import AssetRecordsFilter

    key = manifest.partition_key(source)
    pin = manifest.revision_pin(source)
    fig = layout.read_figures("acquire", source.name) or {}
    if fig.get("pin") != pin or not (layout.revision(source.name) / "scrubbed.parquet").exists():
        return False
    if source.kind == "local":  # a directory can change under the same label: compare the content hash
        from megacpp_core.acquire_local import acquire_local

        if acquire_local(source).revision != fig.get("revision"):
            return False
    from megacpp_assets.definitions import REVISION_ASSETS

    for asset_key in [a.key for a in REVISION_ASSETS]:
        asset_name = asset_key.to_user_string()
        recs = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=asset_key, asset_partitions=[key]), limit=1).records
        if not recs:
            return False
        if asset_name == "source_files":
            md = recs[0].asset_materialization.metadata if recs[0].asset_materialization else {}
            if getattr(md.get("pin"), "value", None) != pin:
                return False
    return True


def run_snapshot(corpus: str, data_root: str | None = None, instance=None, rerun: bool = False) -> int:
    """Materialize every asset of a snapshot through Dagster; return an exit code.

    Revisions already materialized under the same pin (see :func:`revision_is_current`)
    are skipped unless ``rerun``; the snapshot-wide assets always run. Pins are checked
    against the index / remote before any run starts (:func:`megacpp_core.acquire.check_pins`).
    """
    from megacpp_core.acquire import check_pins
    from megacpp_core.layout import SnapshotLayout
    from megacpp_core.manifest import ManifestError, load_manifest
    from megacpp_core.pipeline import save_manifest_copy

    root, home = prepare_environment(data_root)
    try:
        manifest = load_manifest(corpus)
        check_pins(manifest, SnapshotLayout(root, manifest.name).cache)
    except ManifestError as e:
        print(f"megacpp run: {e}", file=sys.stderr)
        return 2
    from dagster import DagsterInstance

    from megacpp_assets.definitions import defs
    from megacpp_assets.sensors import register_partitions

    instance = instance or DagsterInstance.get()
    layout = SnapshotLayout(root, manifest.name)
    save_manifest_copy(layout, manifest)
    keys = [manifest.partition_key(s) for s in manifest.sources]
    register_partitions(instance, {manifest.name: manifest})
    print(f"megacpp run: snapshot {manifest.name!r} ({len(keys)} sources) from {manifest.path}")
    print(f"  data root    {root}\n  DAGSTER_HOME {home}")
    t0 = time.perf_counter()
    revision_job = defs.resolve_job_def("revision_job")
    for i, (source, key) in enumerate(zip(manifest.sources, keys), 1):
        if not rerun and revision_is_current(instance, layout, manifest, source):
            print(f"[{i}/{len(keys)}] repo_revision {key} (already materialized with this pin; skipped)")
            continue
        print(f"[{i}/{len(keys)}] repo_revision {key}")
        result = revision_job.execute_in_process(instance=instance, partition_key=key, run_config=QUIET, raise_on_error=False)
        if not result.success:
            _report_failure(result, key)
            return 1
    print(f"[snapshot] {manifest.name}: dedup → tokenizer → chunk → chunk dedup → tokenize → pack → format")
    result = defs.resolve_job_def("snapshot_job").execute_in_process(
        instance=instance, partition_key=manifest.name, run_config=QUIET, raise_on_error=False)
    if not result.success:
        _report_failure(result, manifest.name)
        return 1
    print(f"\nDone in {time.perf_counter() - t0:.1f}s. Outputs of snapshot {manifest.name!r}:")
    for sub in ("packed", "megatron", "tokenizer"):
        print(f"  {sub:<10} {layout.stage_dir(sub)}")
    print(f"  card       {layout.card}")
    print(f"  UI         make ui   (dagster dev with DAGSTER_HOME={home} MEGACPP_DATA_ROOT={root})")
    return 0


def _report_failure(result, what: str) -> None:
    print(f"megacpp run: FAILED at {what}", file=sys.stderr)
    for ev in result.all_events:
        if ev.is_step_failure:
            err = ev.step_failure_data.error
            cause = err.cause.message if err and err.cause else ""
            print(f"  step {ev.step_key}: {err.message.strip() if err else ''} {cause.strip()}", file=sys.stderr)
        elif ev.event_type_value == "ASSET_CHECK_EVALUATION":
            data = ev.event_specific_data
            if data is not None and not data.passed:
                print(f"  check {data.asset_check_key.name} failed on {data.asset_key.to_user_string()}", file=sys.stderr)


def inspect_row(path: str, row: int, tokenizer_path: str | None = None) -> int:
    """Print packed row ``row`` of a shard directory decoded, with document boundaries and the loss mask."""
    import pyarrow.parquet as pq

    from megacpp_core import pack
    from megacpp_core import tokenizer as tk

    d = Path(path)
    sentinel = pack.read_success(d)
    tok_path = Path(tokenizer_path) if tokenizer_path else d.parent / "tokenizer" / "tokenizer.json"
    tok = tk.load_tokenizer(tok_path, sentinel["tokenizer_sha256"])
    seen = 0
    for f in sentinel["files"]:
        if row < seen + f["rows"]:
            r = pq.read_table(d / f["file"]).slice(row - seen, 1).to_pylist()[0]
            break
        seen += f["rows"]
    else:
        print(f"megacpp inspect: row {row} out of range ({seen} rows)", file=sys.stderr)
        return 2
    valid = r["valid_token_count"]
    print(f"row {row} (pack_id {r['pack_id']}): {valid} valid tokens, {r['num_docs']} documents, {r['slack_tokens']} pad")
    ids, doc_ids, mask = r["input_ids"], r["doc_ids"], r["loss_mask"]
    start = 0
    for k in range(1, r["num_docs"] + 1):
        end = start
        while end < valid and doc_ids[end] == k:
            end += 1
        text = tk.decode(tok, ids[start + 1:end])
        print(f"--- document {k}: {r['doc_keys'][k - 1]} tokens [{start}, {end}) loss on {sum(mask[start:end])}")
        print(text[:2000] + ("…" if len(text) > 2000 else ""))
        start = end
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="megacpp", description="MegaCpp data platform")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="materialize a whole snapshot through Dagster")
    p_run.add_argument("--corpus", default="default", help="shipped manifest name (corpora/NAME.yaml) or a manifest path")
    p_run.add_argument("--data-root", default=None, help="data root (default $MEGACPP_DATA_ROOT or ./data)")
    p_run.add_argument("--rerun", action="store_true", help="re-materialize revisions even when already current")
    p_ver = sub.add_parser("verify", help="verify gate for a Megatron prefix or a packed-shard directory")
    p_ver.add_argument("path")
    p_ins = sub.add_parser("inspect", help="print one packed row decoded")
    p_ins.add_argument("path")
    p_ins.add_argument("--row", type=int, default=0)
    p_ins.add_argument("--tokenizer", default=None)
    args = parser.parse_args(argv)
    _setup_logging()
    if args.command == "run":
        return run_snapshot(args.corpus, args.data_root, rerun=args.rerun)
    if args.command == "verify":
        from megacpp_checks.verify import main_verify

        return main_verify(args.path)
    return inspect_row(args.path, args.row, args.tokenizer)


if __name__ == "__main__":
    sys.exit(main())
