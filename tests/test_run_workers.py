"""``megacpp run --workers N``: revisions of a pass on worker processes sharing the instance.

Byte-identity of the outputs across worker counts is checked on real input in
``tests/test_shards.py`` (its many-shard snapshot runs on 2 workers and is compared with
the session's ``tiny`` run on 1). Here: the default, a worker's output reaching the
caller, and a failure inside a worker stopping the run with its step named.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from tests.conftest import environ, make_data_root, write_instance_config


def test_default_workers_is_cores_within_memory():
    from megacpp_assets.run_workers import WORKER_MEMORY, default_workers

    n = default_workers()
    assert 1 <= n <= len(os.sched_getaffinity(0))
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    assert n == 1 or n <= avail // WORKER_MEMORY


def broken_scrub(ctx):
    """A scrub stage whose compute fails (module level: the workers unpickle it by name)."""
    raise RuntimeError("scrub broken on purpose")


def test_a_failing_step_in_a_worker_stops_the_run(tmp_path, capsys):
    from dagster import AssetKey, DagsterInstance

    from megacpp_assets.cli import run_snapshot
    from megacpp_core.stages import STAGES

    stages = tuple(dataclasses.replace(s, compute=broken_scrub) if s.name == "scrub" else s for s in STAGES)
    root = make_data_root(tmp_path / "root")
    home = tmp_path / "home"
    home.mkdir()
    write_instance_config(home)
    saved = os.environ.get("MEGACPP_DATA_ROOT")
    with environ(DAGSTER_HOME=str(home)):
        try:
            with DagsterInstance.get() as instance:
                assert run_snapshot("tiny", str(root), instance=instance, stages=stages, workers=2) == 1
                out, err = capsys.readouterr()
                # the workers' lines reach this process's stdout/stderr through the queue
                assert "repo_revision tiny/" in out and "  quality      tiny/" in out
                # the failed step is the one scrub shares with quality and license; the report names scrub's asset
                assert "megacpp run: FAILED at tiny/" in err and "step quality__license__scrub (asset scrubbed_files)" in err
                # runs of the workers are the instance's: quality was materialized per shard
                recs = instance.fetch_materializations(AssetKey("quality_files"), limit=10).records
                assert recs and all("|" in r.partition_key for r in recs)
                # the first failure stops the pass: no snapshot step ran
                assert not instance.fetch_materializations(AssetKey("dedup_decisions"), limit=1).records
                assert not (root / "snapshots" / "tiny" / "documents").exists()
        finally:
            if saved is None:
                os.environ.pop("MEGACPP_DATA_ROOT", None)
            else:
                os.environ["MEGACPP_DATA_ROOT"] = saved


def test_workers_must_be_positive(capsys):
    from megacpp_assets.cli import main

    with pytest.raises(SystemExit) as e:
        main(["run", "--corpus", "tiny", "--workers", "0"])
    assert e.value.code == 2
    assert "--workers must be at least 1" in capsys.readouterr().err


class _PidWorker:
    """A worker state for the pool test: reports its process."""

    def pid(self, i: int) -> tuple[int, int]:
        return i, os.getpid()


def test_a_started_pool_has_every_worker_up_before_its_first_unit():
    """:meth:`WorkerPool.start` spawns all N processes at once (``megacpp run`` starts the
    next pass's pool while a pass's snapshot steps run); the units then run on them."""
    import multiprocessing

    from megacpp_assets.run_workers import WorkerPool

    before = {p.pid for p in multiprocessing.active_children()}
    with WorkerPool(2, _PidWorker, ()).start() as pool:
        started = {p.pid for p in multiprocessing.active_children()} - before
        assert len(started) == 2
        got = []
        assert pool.run_units([("pid", (i,)) for i in range(4)], lambda m, a, r: (got.append(r), (True, []))[1])
        assert sorted(i for i, _ in got) == [0, 1, 2, 3] and {p for _, p in got} <= started


class _ProbeWorker:
    """A worker state that reports where its process came from and what it was given."""

    def probe(self, var: str) -> dict:
        import gc
        import sys

        from megacpp_assets import run_workers

        return {"pid": os.getpid(), "ppid": os.getppid(), "var": os.environ.get(var), "cwd": os.getcwd(),
                "preloaded": "detect_secrets" in sys.modules,  # nothing here imports detect-secrets
                "frozen": gc.get_freeze_count(),  # objects out of the collector's full collections
                "collecting": gc.isenabled(),  # the server imports with it off (fork_preload)
                "frozen_at_start": run_workers.FROZEN_AT_START}  # those the fork server froze


def _probe(pool, var: str) -> list[dict]:
    got: list[dict] = []
    assert pool.run_units([("probe", (var,)) for _ in range(2)], lambda m, a, r: (got.append(r), (True, []))[1])
    return got


def test_workers_fork_from_the_preloaded_server_with_the_callers_environment(tmp_path, monkeypatch):
    """Workers are forked from the fork server, not from this process, with
    :data:`PRELOAD` already imported; each takes the environment and working directory
    this process has when the pool is made, even those set after the server started."""
    from megacpp_assets.run_workers import WorkerPool, start_fork_server

    start_fork_server()
    monkeypatch.setenv("MEGACPP_PROBE", "set after the fork server started")
    monkeypatch.chdir(tmp_path)
    with WorkerPool(2, _ProbeWorker, ()).start() as pool:
        got = _probe(pool, "MEGACPP_PROBE")
    assert all(g["ppid"] != os.getpid() and g["pid"] != os.getpid() for g in got)  # the server's children
    assert all(g["preloaded"] for g in got)
    assert all(g["frozen_at_start"] > 100_000 for g in got)  # the preloaded modules' objects, frozen in the server
    assert all(g["frozen"] > g["frozen_at_start"] for g in got)  # and the worker's own state, once built
    assert all(g["collecting"] for g in got)  # on again in every worker
    assert all(g["var"] == "set after the fork server started" and g["cwd"] == str(tmp_path) for g in got)
    monkeypatch.delenv("MEGACPP_PROBE")
    with WorkerPool(1, _ProbeWorker, ()) as pool:  # a variable removed since: gone in the worker too
        assert [g["var"] for g in _probe(pool, "MEGACPP_PROBE")] == [None, None]


def test_workers_can_be_spawned_instead(monkeypatch):
    from megacpp_assets.run_workers import WorkerPool, start_method

    monkeypatch.setenv("MEGACPP_WORKER_START", "spawn")
    monkeypatch.setenv("MEGACPP_PROBE", "spawned")
    with WorkerPool(1, _ProbeWorker, ()) as pool:
        got = _probe(pool, "MEGACPP_PROBE")
    assert all(g["ppid"] == os.getpid() and not g["preloaded"] and g["var"] == "spawned" for g in got)
    assert all(g["frozen_at_start"] == 0 and g["frozen"] > 0 for g in got)  # its own state only, frozen once built
    monkeypatch.setenv("MEGACPP_WORKER_START", "fork")
    with pytest.raises(ValueError, match="MEGACPP_WORKER_START must be forkserver or spawn"):
        start_method()


def test_every_preloaded_module_imports():
    """The fork server skips a module that fails to import; a renamed module would
    silently cost every worker its import again."""
    import importlib

    from megacpp_assets.run_workers import PRELOAD

    for name in PRELOAD:
        importlib.import_module(name)


class _BrokenWorker:
    """A worker state whose start-up fails (the instance or the definitions cannot load)."""

    def __init__(self):
        raise RuntimeError("start-up broken on purpose")


def test_a_started_pool_whose_workers_failed_to_start_fails_the_units_cleanly(capsys):
    """A pool started early whose workers died in their start-up: the first unit is not
    run, the failure is printed and ``run_units`` returns False (no traceback escapes)."""
    from megacpp_assets.run_workers import WorkerPool

    with WorkerPool(2, _BrokenWorker, ()).start() as pool:
        for f in pool._ready:
            f.exception(timeout=120)  # the start-up has failed
        assert not pool.run_units([("pid", (0,))], lambda m, a, r: (True, []))
    assert "megacpp run: worker failed" in capsys.readouterr().err


def test_snapshot_units_release_groups_in_dependency_order_and_stop_at_a_failure(tmp_path):
    """The last pass's snapshot steps as units: the groups that read nothing planned start
    first, a group starts once those it reads from are done, the card after every group,
    and a failed group releases nothing (the workers then start no further unit)."""
    import types

    from megacpp_assets.snapshot_run import CARD, SnapshotUnits
    from megacpp_core.stages import STAGES, phases
    from megacpp_core.storage import open_root

    run = types.SimpleNamespace(stages=STAGES, manifest=types.SimpleNamespace(name="snap"), root=open_root(str(tmp_path)))
    plan = [s.asset for s in phases()[1].snapshot] + [CARD]
    u = SnapshotUnits(run, 2, plan)
    names = lambda units: sorted(a for _, (_, assets) in units for a in assets)  # noqa: E731
    first = u.first()
    assert names(first) == ["chunk_dedup", "p2_file_dataset", "p3_repo_dataset", "p4_structure_dataset"]
    ok, more = u.done("snapshot_group", (2, ("chunk_dedup",)), True)
    assert ok and names(more) == ["megatron_dataset", "p1_docrich_dataset", "p1_simple_dataset", "packed_rows"]
    for g in (("p2_file_dataset",), ("p3_repo_dataset",), ("p4_structure_dataset",), ("p1_simple_dataset",)):
        assert u.done("snapshot_group", (2, g), True) == (True, [])
    ok, more = u.done("snapshot_group", (2, ("p1_docrich_dataset",)), True)
    assert ok and names(more) == ["blends"]
    assert u.done("snapshot_group", (2, ("blends",)), True) == (True, [])
    ok, more = u.done("snapshot_group", (2, ("packed_rows", "megatron_dataset")), True)
    assert ok and more == [("snapshot_group", (2, (CARD,)))] and u.runs == len(u.groups)
    # a failure releases nothing
    u = SnapshotUnits(run, 2, plan)
    u.first()
    assert u.done("snapshot_group", (2, ("chunk_dedup",)), False) == (False, [])
    # the last group released once every other has ended carries the card in its run
    u = SnapshotUnits(run, 2, plan)
    u.first()
    u.done("snapshot_group", (2, ("chunk_dedup",)), True)
    for g in (("p2_file_dataset",), ("p3_repo_dataset",), ("p4_structure_dataset",), ("packed_rows", "megatron_dataset"),
              ("p1_simple_dataset",)):
        assert u.done("snapshot_group", (2, g), True) == (True, [])
    ok, more = u.done("snapshot_group", (2, ("p1_docrich_dataset",)), True)
    assert ok and more == [("snapshot_group", (2, ("blends", CARD)))]
    assert u.priority(more[0]) == u.priority(("snapshot_group", (2, ("blends",))))
    assert u.done("snapshot_group", (2, ("blends", CARD)), True) == (True, [])  # nothing left: the card ran
    assert u.runs == len(u.groups) - 1
    u = SnapshotUnits(run, 2, plan)
    u.first()
    u.done("snapshot_group", (2, ("chunk_dedup",)), True)
    for g in (("p2_file_dataset",), ("p3_repo_dataset",), ("p4_structure_dataset",), ("packed_rows", "megatron_dataset"),
              ("p1_simple_dataset",)):
        u.done("snapshot_group", (2, g), True)
    assert u.done("snapshot_group", (2, ("p1_docrich_dataset",)), True)[1] == [("snapshot_group", (2, ("blends", CARD)))]
    assert u.done("snapshot_group", (2, ("blends", CARD)), False) == (False, [])  # a failed merged run stops the pass
    # a plan without the card (the card current) never merges; the card alone is one group
    u = SnapshotUnits(run, 2, [s.asset for s in phases()[1].snapshot])
    assert all(CARD not in assets for _, (_, assets) in u.first())
    u = SnapshotUnits(run, 2, [CARD])
    assert u.first() == [("snapshot_group", (2, (CARD,)))] and u.done("snapshot_group", (2, (CARD,)), True) == (True, [])


def test_snapshot_groups_that_may_start_go_largest_first_by_the_bytes_their_stages_read(tmp_path):
    """Of the snapshot groups that may start, the one whose stages read the most bytes of
    per-revision and per-shard files starts first (files of every source and shard, a
    stage reading a file twice counts it twice; snapshot files do not count), ties in
    group order; a pool with ``priority`` starts its waiting units in that order."""
    import types

    from megacpp_assets.snapshot_run import CARD, SnapshotUnits
    from megacpp_core.stages import STAGES, phases
    from megacpp_core.storage import open_root

    snap = tmp_path / "snapshots" / "snap"
    sizes = {"revisions/a/shards/000/families/p2_file.parquet": 50, "revisions/b/shards/000/families/p2_file.parquet": 60,
             "revisions/a/families/p4_structure.parquet": 100, "revisions/b/families/p3_repo.parquet": 20,
             "revisions/a/shards/001/chunks.parquet": 70, "revisions/a/shards/000/tokenized.parquet": 10,
             "revisions/a/shards/000/families/p1_simple.parquet": 10, "revisions/b/shards/000/families/p1_docrich.parquet": 10,
             "families/p3_repo/megatron/x.bin": 999, "tokenizer/tokenizer.json": 999}  # snapshot files: not counted
    for key, n in sizes.items():
        (snap / key).parent.mkdir(parents=True, exist_ok=True)
        (snap / key).write_bytes(b"x" * n)
    run = types.SimpleNamespace(stages=STAGES, manifest=types.SimpleNamespace(name="snap"), root=open_root(str(tmp_path)))
    u = SnapshotUnits(run, 2, [s.asset for s in phases()[1].snapshot] + [CARD])
    got = {assets: u.priority(("snapshot_group", (2, assets)))[0] for assets, _ in u.groups}
    assert got == {("chunk_dedup",): 70, ("packed_rows", "megatron_dataset"): 20, ("p1_simple_dataset",): 10,
                   ("p1_docrich_dataset",): 10, ("p2_file_dataset",): 110, ("p3_repo_dataset",): 20,
                   ("p4_structure_dataset",): 100, ("blends",): 0, (CARD,): 0}
    first = sorted(u.first(), key=u.priority, reverse=True)
    assert [assets for _, (_, assets) in first] == [("p2_file_dataset",), ("p4_structure_dataset",), ("chunk_dedup",),
                                                    ("p3_repo_dataset",)]
    assert u.priority(("snapshot_group", (2, ("p1_simple_dataset",)))) > u.priority(
        ("snapshot_group", (2, ("p1_docrich_dataset",))))  # a tie: group order

    def refuse(prefix):
        raise PermissionError(f"listing {prefix} refused")

    # a listing that fails leaves the order to the groups' order; the steps report the error
    broken = types.SimpleNamespace(stages=STAGES, manifest=run.manifest, root=types.SimpleNamespace(sizes=refuse))
    u = SnapshotUnits(broken, 2, [s.asset for s in phases()[1].snapshot] + [CARD])
    assert [u.priority(("snapshot_group", (2, a)))[0] for a, _ in u.groups] == [0] * len(u.groups)

    from megacpp_assets.run_workers import WorkerPool

    order = []

    def done(method, args, result):
        order.append(args[0])
        return True, ([("pid", (k,)) for k in (7, 9, 8)] if args[0] == 5 else [])

    with WorkerPool(1, _PidWorker, ()) as pool:  # one worker: units start in the order they are picked
        assert pool.run_units([("pid", (k,)) for k in (1, 5, 3)], done, priority=lambda unit: unit[1][0])
    assert order == [5, 9, 8, 7, 3, 1]  # the largest waiting first, released units included


def test_a_pass_without_early_units_starts_its_largest_shards_first_across_revisions(tmp_path):
    """Pass 2 (no early units): every revision's shards are known at its start, and they
    start largest first whatever their revision (the plans' bytes; ties by revision, then
    key); a revision's late unit comes when its last shard is done; a revision without
    shards is released at once. Pass 1 starts its revisions' early units largest cached
    archive first, the uncached ones after in manifest order."""
    import hashlib
    import json
    import types

    from megacpp_assets.snapshot_run import PassUnits
    from megacpp_core import layout
    from megacpp_core.catalog import SCRUBBED
    from megacpp_core.sharding import shard_key
    from megacpp_core.stage import Partition
    from megacpp_core.stages import STAGES, phases
    from megacpp_core.storage import open_root

    sizes = {"a": [10, 300], "b": [200], "c": [], "d": [300, 5]}
    names = list(sizes)
    for name, b in sizes.items():
        path = tmp_path / layout.shard_plan_key("snap", name)
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"shards": len(b), "bytes": b}))

    def pass_assets(n):
        return ([], ["chunked_documents"], ["p3_repo_documents"]) if n == 2 else (["source_files"], ["quality_files"], [])

    pins = {n: hashlib.sha256(n.encode()).hexdigest() for n in names}
    run = types.SimpleNamespace(
        n_sources=4, root=open_root(str(tmp_path)), pass_assets=pass_assets, _tag=lambda i: f"[{i}/4]",
        passes=phases(STAGES),
        manifest=types.SimpleNamespace(name="snap", sources=[types.SimpleNamespace(name=n, sha256=pins[n]) for n in names]),
        shard_keys=lambda i: [shard_key(k) for k in range(len(sizes[names[i - 1]]))])
    u = PassUnits(run, 2)  # nothing of pass 1 written: the plans' bytes
    assert u.first() == [("shard", (2, 1, "001", 2)), ("shard", (2, 4, "000", 2)), ("shard", (2, 2, "000", 1)),
                         ("shard", (2, 1, "000", 2)), ("shard", (2, 4, "001", 2)), ("late", (2, 3))]
    assert u.done("shard", (2, 1, "001", 2), "ran") == (True, [])
    assert u.done("shard", (2, 1, "000", 2), "ran") == (True, [("late", (2, 1))])
    assert PassUnits(run, 1).first() == [("early", (1, i)) for i in range(1, 5)]  # nothing cached: manifest order
    for name, n in (("b", 10), ("d", 30)):  # archives in the content-addressed cache (a partial download does not count)
        d = run.root.cache_dir / "sha256" / pins[name][:2] / pins[name]
        d.mkdir(parents=True)
        (d / f"{name}.tar.gz").write_bytes(b"x" * n)
        (d / f"{name}.tar.gz.part").write_bytes(b"x" * 1000)
    assert PassUnits(run, 1).first() == [("early", (1, i)) for i in (4, 2, 1, 3)]
    # once pass 1 wrote the scrubbed files pass 2 reads, their bytes order it (the sources'
    # bytes counted files that quality dropped)
    scrubbed = {("a", "000"): 50, ("a", "001"): 20, ("b", "000"): 70, ("d", "000"): 10, ("d", "001"): 60}
    for (name, k), n in scrubbed.items():
        path = tmp_path / SCRUBBED.key(Partition("snap", name, k))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * n)
    assert PassUnits(run, 2).first() == [("shard", (2, 2, "000", 1)), ("shard", (2, 4, "001", 2)),
                                         ("shard", (2, 1, "000", 2)), ("shard", (2, 1, "001", 2)),
                                         ("shard", (2, 4, "000", 2)), ("late", (2, 3))]


class _LibraryWorker:
    """A worker state that runs each library with a thread pool of its own (a fork-safety check)."""

    def work(self) -> list:
        import numpy as np
        import polars as pl
        import pyarrow as pa
        import pyarrow.compute as pc

        a = np.arange(400 * 400, dtype=np.float64).reshape(400, 400)
        t = pa.table({"k": pa.array(np.arange(200_000) % 7), "v": pa.array(np.arange(200_000))})
        grouped = t.group_by("k").aggregate([("v", "sum")]).sort_by("k")
        frame = pl.DataFrame({"k": np.arange(100_000) % 5, "v": np.arange(100_000)}).group_by("k").agg(pl.col("v").sum())
        from tokenizers import Tokenizer, models, pre_tokenizers

        tok = Tokenizer(models.WordLevel({"int": 0, "x": 1, ";": 2, "[UNK]": 3}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        ids = [e.ids for e in tok.encode_batch([f"int x ; y{i}" for i in range(5000)])]
        return [float((a @ a).trace()), grouped.column("v_sum").to_pylist(), int(pc.sum(t.column("v")).as_py()),
                sorted(frame.get_column("v").to_list()), ids[:3], len(ids)]


def test_libraries_with_thread_pools_work_in_forked_workers():
    """numpy (OpenBLAS), Arrow, polars and a ``tokenizers`` batch run in workers forked
    from the fork server, twice per worker, with the results of this process."""
    from megacpp_assets.run_workers import WorkerPool, _call

    want = _LibraryWorker().work()
    with WorkerPool(2, _LibraryWorker, ()).start() as pool:
        futures = [pool._pool.submit(_call, "work") for _ in range(4)]
        assert [f.result(timeout=300) for f in futures] == [want] * 4


def test_a_preload_module_that_fails_is_reported_and_the_server_lives(tmp_path):
    """``fork_preload`` imports each module of ``PRELOAD`` guarded: one raising at import
    (not an ``ImportError``, which would kill Python's fork server) is reported on
    standard error and the others are imported."""
    import subprocess
    import sys

    (tmp_path / "broken_at_import.py").write_text("raise RuntimeError('broken on purpose')\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from megacpp_assets import run_workers; "
            "run_workers.PRELOAD = ('broken_at_import', 'json'); import megacpp_assets.fork_preload; "
            "assert 'json' in sys.modules; print('alive')")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "alive", r.stderr
    assert "could not import broken_at_import (RuntimeError: broken on purpose)" in r.stderr


def test_an_unknown_worker_start_method_is_a_usage_error(monkeypatch, capsys):
    from megacpp_assets.cli import main

    monkeypatch.setenv("MEGACPP_WORKER_START", "fork")
    with pytest.raises(SystemExit) as e:
        main(["run", "--corpus", "tiny", "--workers", "2"])
    assert e.value.code == 2 and "MEGACPP_WORKER_START must be forkserver or spawn" in capsys.readouterr().err


@pytest.mark.integration
def test_warm_writes_nothing_and_never_raises(tiny_run, monkeypatch):
    """``SnapshotRun.warm`` (what ``megacpp run`` and each worker do ahead of their first
    run) stores no run or event and leaves the data root as it was; with every asset run
    again it plans nothing; an error in it is left for the run to meet."""
    from megacpp_assets import freshness
    from megacpp_assets.snapshot_run import SnapshotRun
    from megacpp_core.manifest import load_manifest
    from megacpp_core.storage import open_root

    root, instance = tiny_run
    manifest = load_manifest(root / "snapshots" / "tiny" / "manifest.yaml")

    def state():
        files = sorted((p.relative_to(root).as_posix(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file())
        return instance.get_runs_count(), instance.event_log_storage.get_maximum_record_id(), files

    before = state()
    planned = []
    real_plan = freshness.plan
    monkeypatch.setattr(freshness, "plan", lambda *a, **k: (planned.append(a[4].key), real_plan(*a, **k))[1])
    run = SnapshotRun(manifest, open_root(str(root)), instance, rerun=False)
    run.warm(run.selections(1, snapshot="one"))
    assert planned == [f"tiny/{manifest.sources[0].name}"]
    # the subsets of pass 1's runs are built and kept for them
    assert {(job, frozenset(a)) for job, a in run.selections(1, snapshot="one")} == \
        {(job, frozenset(k.to_user_string() for k in keys)) for job, keys in run.subsets.kept()}
    SnapshotRun(manifest, open_root(str(root)), instance, rerun=True).warm()
    assert len(planned) == 1  # nothing to plan when everything runs again
    assert state() == before

    def broken(*a, **k):
        raise OSError("storage unreachable")

    monkeypatch.setattr(freshness, "plan", broken)
    assert SnapshotRun(manifest, open_root(str(root)), instance, rerun=False).warm() is None
    run = SnapshotRun(manifest, open_root(str(root)), instance, rerun=False)
    assert run.warm([("snapshot_job", ("no_such_asset",))]) is None and not run.subsets.kept()


@pytest.mark.integration
def test_the_selections_warmed_are_the_runs_of_a_fresh_pass(tiny_run):
    """:meth:`SnapshotRun.selections` names the asset selections of the runs a fresh
    ``megacpp run`` makes: per pass its revisions' early and late assets and its shards'
    (:meth:`SnapshotRun.pass_assets`), and its snapshot assets as one run, or as the
    last pass's :class:`SnapshotUnits` groups with the card alone."""
    from megacpp_assets.snapshot_run import CARD, SnapshotRun, SnapshotUnits
    from megacpp_core.manifest import load_manifest
    from megacpp_core.storage import open_root

    root, instance = tiny_run
    manifest = load_manifest(root / "snapshots" / "tiny" / "manifest.yaml")
    run = SnapshotRun(manifest, open_root(str(root)), instance, rerun=False)
    last = len(run.passes)
    assert last >= 2
    for n in range(1, last + 1):
        early, shard, late = run.pass_assets(n)
        snap = [s.asset for s in run.passes[n - 1].snapshot] + [CARD] * (n == last)
        units = [(j, tuple(a)) for j, a in (("revision_job", early), ("shard_job", shard), ("revision_job", late)) if a]
        assert run.selections(n) == units
        assert run.selections(n, snapshot="one") == units + [("snapshot_job", tuple(snap))]
        assert run.selections(n, units=False, snapshot="one") == [("snapshot_job", tuple(snap))]
    units = SnapshotUnits(run, last, [s.asset for s in run.passes[-1].snapshot] + [CARD])
    groups = [assets for assets, _ in units.groups]
    read = {i for _, after in units.groups[:-1] for i in after}
    sinks = [assets + (CARD,) for i, (assets, _) in enumerate(units.groups[:-1]) if i not in read]
    assert [a for _, a in run.selections(last, units=False, snapshot="groups")] == groups + sinks
    assert groups[-1] == (CARD,) and ("blends", CARD) in sinks
    assert run.selections(1) and ("shard_job", tuple(run.pass_assets(1)[1])) in run.selections(1)


class _PassProbe:
    """A worker state built by ``SnapshotRun.in_worker`` (as ``megacpp run`` builds its
    workers'), asked which of the later passes' libraries its process has imported."""

    def __init__(self, *args):
        from megacpp_assets.snapshot_run import SnapshotRun

        self.run = SnapshotRun.in_worker(*args)

    def later_libraries(self) -> tuple[list[str], int]:
        """The later passes' libraries this process has imported, and its niceness."""
        import sys

        from megacpp_assets.run_workers import LATER_PASS_MODULES

        return sorted(m for m in LATER_PASS_MODULES if m in sys.modules), os.nice(0)


@pytest.mark.integration
def test_only_a_later_pass_worker_imports_the_later_pass_libraries(tiny_run):
    """The fork server does not import networkx and matplotlib (only passes after the
    first use them, and the first pass's workers wait for the server's imports), nor does
    any module it preloads pull them in; a worker of a later pass imports them as it
    starts, so its stages find them imported, at the lowest priority (it starts while the
    calling process runs the earlier pass's snapshot steps); a first pass's worker keeps
    the priority it was forked with."""
    from megacpp_assets.run_workers import LATER_PASS_MODULES, LATER_PASS_NICE, WorkerPool, start_fork_server
    from megacpp_core.storage import open_root

    root, instance = tiny_run
    start_fork_server()
    args = (str(root / "snapshots" / "tiny" / "manifest.yaml"), open_root(str(root)).url, instance.get_ref(), False, None)
    base = os.nice(0)
    for later, expected in ((False, ([], base)), (True, (sorted(LATER_PASS_MODULES), max(base, LATER_PASS_NICE)))):
        got: list = []
        with WorkerPool(1, _PassProbe, args + (later,)).start() as pool:
            assert pool.run_units([("later_libraries", ())], lambda m, a, r: (got.append(r), (True, []))[1])
        assert got == [expected], later


def test_lower_priority_only_raises_the_niceness():
    """In a child process (the niceness of this one is left alone): raised to the level
    asked, never lowered back."""
    import subprocess
    import sys

    code = ("import os; from megacpp_assets.run_workers import lower_priority as lp; "
            "print(os.nice(0), lp(5), lp(3), lp(), os.nice(0))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    base = int(out[0])
    assert [int(x) for x in out[1:]] == [max(base, 5), max(base, 5), max(base, 19), max(base, 19)]


def test_a_later_pass_module_that_fails_to_import_is_reported(monkeypatch, capsys):
    import gc

    from megacpp_assets import run_workers

    monkeypatch.setattr(run_workers, "LATER_PASS_MODULES", ("megacpp_no_such_module", "json"))
    enabled = gc.isenabled()
    assert run_workers.import_for_later_pass() == ["megacpp_no_such_module"]
    assert "could not import megacpp_no_such_module" in capsys.readouterr().err
    assert gc.isenabled() == enabled  # the collector as it was
