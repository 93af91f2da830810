"""The ``megacpp`` command line (SPEC §9).

``megacpp run [--corpus NAME|PATH] [--data-root DIR]`` materializes a whole snapshot
through Dagster (per ``repo_revision`` partition one run of its revision assets, then one
run per revision × shard partition of the per-document assets; then one run of the
snapshot-wide assets), recording the runs in ``DAGSTER_HOME`` so ``dagster dev`` shows
them afterwards. ``megacpp verify PATH`` runs the verify gate. ``megacpp inspect PATH``
prints one packed row decoded. Exit codes: 0 success, 1 a stage or gate failed, 2 usage
or manifest error.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from megacpp_core.storage import DataRoot

_POOLED_STORAGE = """# Local instance for `megacpp run` and `dagster dev` (SQLite storage under this directory,
# Dagster's layout; its event log keeps its connections: megacpp_assets.instance_storage).
storage:
  custom:
    module: megacpp_assets.instance_storage
    class: PooledSqliteStorage
    config:
      base_dir:
        env: DAGSTER_HOME
"""
_TELEMETRY_OFF = """telemetry:
  enabled: false
"""
#: The instance configuration ``megacpp run`` writes: Dagster's SQLite storage with the
#: pooled event log (:mod:`megacpp_assets.instance_storage`), step logs captured in process
#: (:mod:`megacpp_assets.compute_logs`), telemetry off.
DAGSTER_YAML = _POOLED_STORAGE + """compute_logs:
  module: megacpp_assets.compute_logs
  class: TeeComputeLogManager
  config:
    base_dir:
      env: DAGSTER_HOME
""" + _TELEMETRY_OFF

#: What earlier versions wrote as ``dagster.yaml``; a home that still has one of them
#: exactly is given :data:`DAGSTER_YAML` (the same files on disk, read through the pooled
#: event log; step logs where Dagster's default capture puts them).
_EARLIER_DAGSTER_YAMLS = (
    "# Local instance for `megacpp run` and `dagster dev` (SQLite storage under this directory).\n" + _TELEMETRY_OFF,
    _POOLED_STORAGE + _TELEMETRY_OFF,
)


def _setup_logging() -> None:
    from megacpp_assets.run_workers import stdout_handler

    lg = logging.getLogger("megacpp")
    if not lg.handlers:
        lg.addHandler(stdout_handler())
    lg.setLevel(logging.INFO)
    lg.propagate = False


def prepare_environment(data_root: str | None) -> tuple["DataRoot", Path]:
    """Fix the data root and ``DAGSTER_HOME`` in the environment; return ``(root, home)``.

    ``data_root``: a local path (created) or a URL such as ``s3://bucket/prefix``; default
    ``$MEGACPP_DATA_ROOT`` or ``./data``. ``DAGSTER_HOME`` defaults to
    ``DATA_ROOT/dagster_home`` for a local root; for an object store, Dagster's instance and
    the content cache stay on this machine under ``$MEGACPP_STATE_DIR`` (default
    ``~/.cache/megacpp/<hash of the URL>``).
    """
    import hashlib

    from megacpp_core.storage import is_url, local_location, open_root

    loc = data_root or os.environ.get("MEGACPP_DATA_ROOT") or "data"
    if is_url(loc):
        loc = loc.rstrip("/")
        state = Path(os.environ.get("MEGACPP_STATE_DIR")
                     or Path.home() / ".cache" / "megacpp" / hashlib.sha256(loc.encode()).hexdigest()[:12])
        os.environ.setdefault("MEGACPP_CACHE_DIR", str(state / "cache"))
    else:
        loc = local_location(loc)  # a path or file:// URL
        Path(loc).mkdir(parents=True, exist_ok=True)
        state = Path(loc)
    os.environ["MEGACPP_DATA_ROOT"] = loc
    home = Path(os.environ.get("DAGSTER_HOME") or state / "dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists() or cfg.read_text() in _EARLIER_DAGSTER_YAMLS:  # atomic: a concurrent run never reads half of it
        tmp = home / f"dagster.yaml.tmp-{os.getpid()}"
        tmp.write_text(DAGSTER_YAML)
        os.replace(tmp, cfg)
    os.environ["DAGSTER_HOME"] = str(home)
    return open_root(loc), home


@contextlib.contextmanager
def run_lock(path: Path, what: str):
    """Hold an exclusive lock on ``path`` (``fcntl.flock``, released by the kernel when the
    process ends, even on SIGKILL) for the whole run. A second ``megacpp run`` on the same
    data root and Dagster home waits for the first with a message naming its pid, then
    finds the snapshot current: runs serialize instead of racing on the instance's creation
    or on the outputs.

    The lock is a file of the Dagster home, so it serializes the runs of one machine (or
    one shared home): ``megacpp run`` processes with different homes on one object-store
    root, and runs the Dagster daemon launches, do not take it — a deployment serializes
    those with the instance's run queue (``QueuedRunCoordinator`` in the Helm values)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            print(f"megacpp run: another megacpp run (pid {holder}) is materializing {what}; "
                  "waiting for it to finish…", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def startup_gc():
    """The garbage collector of a ``megacpp run`` process: off while it starts (imports
    Dagster, the stage libraries and the asset graph, opens the instance), then, at the
    call of the function this yields (once the run's state is built, before the first
    pass), one collection, the objects that exist then frozen (``gc.freeze``: out of every
    later full collection) and the collector on again; on exit the frozen objects are
    given back (``gc.unfreeze``) and the collector's earlier state restored.

    Start-up makes millions of long-lived objects and few garbage cycles, so the full
    collections its allocations triggered walked ever more objects for little: on
    ``default``, four of them (0.23 s) before the first pass, on the way to the first
    worker's start, and each later one in this process (the pass-1 snapshot steps and the
    tokenizer run here) walked them all again (two, 0.29 s). The one collection is of the
    youngest generation only (``gc.collect(0)``): CPython's generational collector puts
    every new object in generation 0 and only a collection moves it on, and none runs
    during start-up (the collector is off and nothing calls it), so generation 0 holds
    everything start-up made. On ``default`` it finds start-up's garbage (about 14,000
    objects) in 0.16 s; a full collection also walks the older generations (what existed
    before the block) for 0.2–0.3 s more, on the way to the first worker's start, for
    about 18 more objects: garbage cycles that reach older objects, which stay frozen with
    the rest until the block ends. A process that has not
    called the function when the block ends just gets its collector back. A process that
    had frozen objects of its own before the block (``gc.unfreeze`` would thaw those too)
    is left frozen as it was: the block neither freezes nor unfreezes there."""
    enabled = gc.isenabled()
    ours = gc.get_freeze_count() == 0  # nothing frozen yet: what is frozen below is ours to give back
    frozen = []
    gc.disable()

    def settled() -> None:
        if frozen:
            return
        gc.collect(0)  # start-up's objects: all still in the youngest generation
        if ours:
            gc.freeze()
        frozen.append(True)
        if enabled:
            gc.enable()

    try:
        yield settled
    finally:
        if frozen and ours:
            gc.unfreeze()
        if enabled:
            gc.enable()


def run_snapshot(corpus: str, data_root: str | None = None, instance=None, rerun: bool = False,
                 stages=None, workers: int = 1) -> int:
    """Materialize every out-of-date asset of a snapshot through Dagster; return an exit code.

    Per ``repo_revision`` partition, then for the ``snapshot`` partition, the assets that
    are out of date (:mod:`megacpp_assets.freshness`: never materialized, a new code
    version, changed settings, changed upstream data, a failed gate, missing outputs) and
    everything downstream of them run in one job run; the rest is skipped with its reason
    printed. ``rerun`` materializes everything. Pins are checked against the index /
    remote before any run starts (:func:`megacpp_core.acquire.check_pins`).
    ``stages``: the stage declarations to run (default the registry; tests pass a variant,
    e.g. with one stage's ``code_version`` bumped). ``workers``: processes running the
    revisions of a pass at once (:mod:`megacpp_assets.snapshot_run`; the CLI's default is
    :func:`megacpp_assets.run_workers.default_workers`). Runs on the same Dagster home
    serialize (:func:`run_lock`).
    """
    with startup_gc() as settled:
        root, home = prepare_environment(data_root)
        if workers > 1:  # the workers' fork server imports while this process does (run_workers)
            from megacpp_assets.run_workers import start_fork_server

            start_fork_server()
        with run_lock(home / ".megacpp-run.lock", f"data root {root.url}"):
            root.sweep_scratch()
            return _run_locked(corpus, root, home, instance, rerun, stages, workers, settled)


def _run_locked(corpus: str, root, home: Path, instance, rerun: bool, stages, workers: int, settled) -> int:
    from megacpp_core.acquire import check_pins
    from megacpp_core.manifest import ManifestError, load_manifest

    try:
        manifest = load_manifest(corpus)
        check_pins(manifest, root.cache_dir)
    except ManifestError as e:
        print(f"megacpp run: {e}", file=sys.stderr)
        return 2
    from dagster import DagsterInstance

    if instance is None:  # opened here, closed here: its databases' connections end (WAL checkpointed)
        with DagsterInstance.get() as instance:
            return _run_on(manifest, root, home, instance, rerun, stages, workers, settled)
    return _run_on(manifest, root, home, instance, rerun, stages, workers, settled)


def _run_on(manifest, root, home: Path, instance, rerun: bool, stages, workers: int, settled) -> int:
    from megacpp_assets.sensors import register_partitions
    from megacpp_assets.snapshot_run import SnapshotRun, run_passes
    from megacpp_core import layout
    from megacpp_core.snapshots import record_manifest
    from megacpp_core.storage import StorageError

    try:
        record_manifest(root, manifest)
    except (StorageError, OSError) as e:
        print(f"megacpp run: data root {root.url} cannot be written: {e}", file=sys.stderr)
        return 2
    register_partitions(instance, {manifest.name: manifest})
    print(f"megacpp run: snapshot {manifest.name!r} ({len(manifest.sources)} sources) from {manifest.path}")
    print(f"  data root    {root.url}\n  DAGSTER_HOME {home}\n  workers      {workers}", flush=True)
    t0 = time.perf_counter()
    run = SnapshotRun(manifest, root, instance, rerun, stages)
    # what its first runs would do lazily, done while the fork server imports: with workers,
    # this process runs the snapshot steps of every pass but the last; alone, all of pass 1
    run.warm([x for n in range(1, len(run.passes)) for x in run.selections(n, units=False, snapshot="one")]
             if workers > 1 else run.selections(1, snapshot="one"))
    settled()  # start-up is done (startup_gc); the fork server still imports meanwhile
    if not run_passes(run, workers):
        return 1
    print(f"\nDone in {time.perf_counter() - t0:.1f}s. Outputs of snapshot {manifest.name!r}:")
    prefix = layout.snapshot_prefix(manifest.name)
    for sub in ("packed", "megatron", "tokenizer"):
        print(f"  {sub:<10} {root.uri(f'{prefix}/{sub}')}")
    print(f"  card       {root.uri(layout.card_key(manifest.name))}")
    print(f"  UI         make ui   (dagster dev with DAGSTER_HOME={home} MEGACPP_DATA_ROOT={root.url})")
    return 0


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
    p_run.add_argument("--workers", type=int, default=None,
                       help="processes running the revisions of a pass at once (default: one per core, "
                            "within 3 GiB of available memory each)")
    p_run.add_argument("--rerun", action="store_true", help="re-materialize every asset of the snapshot (revisions, snapshot stages, the card) even when current")
    p_ver = sub.add_parser("verify", help="verify gate for a Megatron prefix or a packed-shard directory")
    p_ver.add_argument("path")
    p_ins = sub.add_parser("inspect", help="print one packed row decoded")
    p_ins.add_argument("path")
    p_ins.add_argument("--row", type=int, default=0)
    p_ins.add_argument("--tokenizer", default=None)
    args = parser.parse_args(argv)
    _setup_logging()
    if args.command == "run":
        from megacpp_assets.run_workers import default_workers, start_method

        workers = args.workers if args.workers is not None else default_workers()
        if workers < 1:
            parser.error("--workers must be at least 1")
        try:
            start_method()
        except ValueError as e:
            parser.error(str(e))
        return run_snapshot(args.corpus, args.data_root, rerun=args.rerun, workers=workers)
    if args.command == "verify":
        from megacpp_checks.verify import main_verify

        return main_verify(args.path)
    return inspect_row(args.path, args.row, args.tokenizer)


def entry(argv: list[str] | None = None) -> None:
    """The ``megacpp`` console script: :func:`main`, then the process ends with its exit
    code without the interpreter's finalization. Once ``megacpp run`` has imported Dagster,
    the stages' libraries and the asset graph, finalizing them (clearing every module,
    collecting millions of objects) took 0.8–1.0 s after the last line was printed, and
    nothing needs it: every output is written and closed, the instance's databases are
    committed. The exit handlers (``atexit``: logging's flush, multiprocessing's clean-up)
    still run, and standard output and error are flushed, before ``os._exit``. An
    exception leaves the normal way (``argparse``'s ``SystemExit`` included)."""
    import atexit

    code = main(argv)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # as the interpreter exits when it cannot flush standard streams
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    entry()
