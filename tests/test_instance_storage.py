"""The local instance's pooled SQLite event log (:mod:`megacpp_assets.instance_storage`):
what it writes is Dagster's own format, a live run view still sees each write, open
connections stay bounded, and several processes (forked or spawned) share one home."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from tests.conftest import environ, write_instance_config

pytestmark = pytest.mark.filterwarnings("ignore::dagster.BetaWarning", "ignore::dagster.PreviewWarning")


def _entry(run_id: str, message: str):
    from dagster._core.events.log import EventLogEntry

    return EventLogEntry(error_info=None, level=20, user_message=message, run_id=run_id, timestamp=time.time(),
                         step_key=None, job_name="job", dagster_event=None)


def _open_run_databases(base_dir: Path) -> set[str]:
    """Run databases (``RUN_ID.db``) under ``base_dir`` this process holds open."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        target = target.removesuffix(" (deleted)")
        if target.startswith(str(base_dir)) and target.endswith(".db") and not target.endswith("index.db"):
            found.add(Path(target).stem)
    return found


def _assets():
    import dagster as dg

    @dg.asset(check_specs=[dg.AssetCheckSpec("positive", asset="numbers")])
    def numbers():
        yield dg.MaterializeResult(metadata={"n": 3})
        yield dg.AssetCheckResult(passed=True, check_name="positive")

    @dg.asset(deps=[numbers])
    def doubled():
        return dg.MaterializeResult(metadata={"n": 6})

    return [numbers, doubled]


def test_the_cli_instance_uses_the_pooled_event_log_in_dagsters_layout(tmp_path):
    from dagster import DagsterInstance

    from megacpp_assets.instance_storage import PooledSqliteEventLogStorage

    write_instance_config(tmp_path)
    with environ(DAGSTER_HOME=str(tmp_path)), DagsterInstance.get() as instance:
        assert isinstance(instance.event_log_storage, PooledSqliteEventLogStorage)
        assert instance.event_log_storage._base_dir == str(tmp_path / "history" / "runs")
    assert (tmp_path / "history" / "runs.db").exists() and (tmp_path / "history" / "runs" / "index.db").exists()
    assert (tmp_path / "schedules" / "schedules.db").exists()


def _pragmas(storage, shard: str) -> tuple[int, int, str]:
    """``(synchronous, wal_autocheckpoint, journal_mode)`` of ``storage``'s kept connection to ``shard``."""
    import sqlalchemy as sa

    with storage._connect(shard) as conn:
        return tuple(conn.execute(sa.text(f"PRAGMA {p}")).scalar() for p in ("synchronous", "wal_autocheckpoint",
                                                                              "journal_mode"))


@pytest.mark.parametrize("level,code", [(None, 1), ("FULL", 2), ('"OFF"', 0)])  # YAML reads a bare OFF as false
def test_the_synchronous_level_is_normal_unless_configured(tmp_path, level, code):
    """The event log commits with ``synchronous=NORMAL`` by default (no fsync per commit in
    WAL mode), or the level the instance configuration names; run databases and the index
    checkpoint at SQLite's default (1,000 WAL pages), not at every commit."""
    from dagster import DagsterInstance

    from megacpp_assets.cli import DAGSTER_YAML

    yaml = DAGSTER_YAML if level is None else DAGSTER_YAML.replace(
        "        env: DAGSTER_HOME\n", f"        env: DAGSTER_HOME\n      synchronous: {level}\n")
    assert level is None or f"synchronous: {level}" in yaml
    (tmp_path / "dagster.yaml").write_text(yaml)
    with environ(DAGSTER_HOME=str(tmp_path)), DagsterInstance.get() as instance:
        events = instance.event_log_storage
        events.store_event(_entry("run-a", "first"))
        assert _pragmas(events, "run-a") == (code, 1000, "wal")
        assert _pragmas(events, "index") == (code, 1000, "wal")
        assert [e.user_message for e in events.get_logs_for_run("run-a")] == ["first"]


def test_an_unknown_synchronous_level_is_refused(tmp_path):
    from dagster import DagsterInstance
    from dagster._core.errors import DagsterInvalidConfigError

    from megacpp_assets.cli import DAGSTER_YAML
    from megacpp_assets.instance_storage import PooledSqliteEventLogStorage

    (tmp_path / "dagster.yaml").write_text(DAGSTER_YAML.replace("        env: DAGSTER_HOME\n",
                                                                "        env: DAGSTER_HOME\n      synchronous: SOMETIMES\n"))
    with environ(DAGSTER_HOME=str(tmp_path)), pytest.raises(DagsterInvalidConfigError, match="synchronous"):
        DagsterInstance.get()
    with pytest.raises(ValueError, match="synchronous must be one of"):
        PooledSqliteEventLogStorage(str(tmp_path / "runs"), synchronous="normal")


def test_what_it_writes_reads_back_through_dagsters_stock_storage(tmp_path):
    """Runs, materializations and check evaluations written through the pooled storage are
    read identically by an instance on Dagster's stock SQLite storage (the same home)."""
    import dagster as dg
    from dagster import AssetKey, DagsterInstance
    from dagster._core.storage.event_log import SqliteEventLogStorage

    write_instance_config(tmp_path)
    with environ(DAGSTER_HOME=str(tmp_path)), DagsterInstance.get() as pooled:
        results = [dg.materialize(_assets(), instance=pooled) for _ in range(3)]
        assert all(r.success for r in results)
        seen = {r.run_id: [(e.storage_id, e.event_log_entry.dagster_event_type) for e in
                           pooled.get_records_for_run(r.run_id).records] for r in results}
        latest = pooled.fetch_materializations(AssetKey("doubled"), limit=1).records[0].storage_id
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")  # Dagster's default storage
    with environ(DAGSTER_HOME=str(tmp_path)), DagsterInstance.get() as stock:
        assert type(stock.event_log_storage) is SqliteEventLogStorage
        for run_id, events in seen.items():
            assert [(e.storage_id, e.event_log_entry.dagster_event_type) for e in
                    stock.get_records_for_run(run_id).records] == events
            assert stock.get_run_by_id(run_id).is_success
        assert stock.fetch_materializations(AssetKey("doubled"), limit=1).records[0].storage_id == latest
        assert len(stock.fetch_materializations(AssetKey("numbers"), limit=10).records) == 3
        check = stock.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(AssetKey("numbers"), "positive"), limit=5)
        assert len(check) == 3 and all(c.status.value == "SUCCEEDED" for c in check)


def _schema(path: Path) -> tuple:
    import sqlite3

    with sqlite3.connect(path) as c:
        return (sorted(c.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()),
                c.execute("SELECT version_num FROM alembic_version").fetchall(),
                c.execute("PRAGMA journal_mode").fetchall())


def test_a_new_run_database_is_the_one_the_stock_storage_creates(tmp_path, monkeypatch):
    """A run database the pooled storage creates (its alembic scripts read once per process)
    has the stock class's tables, indexes, alembic revision and WAL mode; one the stock
    class created is opened as it is; a database with tables but no stamp is left to the
    stock method."""
    import sqlite3

    from dagster._core.storage.event_log import SqliteEventLogStorage

    from megacpp_assets.instance_storage import PooledSqliteEventLogStorage

    base = tmp_path / "runs"
    stock, pooled = SqliteEventLogStorage(str(base)), PooledSqliteEventLogStorage(str(base))
    stock_initdb, left_to_stock = SqliteEventLogStorage._initdb, []

    def spy(self, engine, for_index_shard=False):
        if self is pooled:  # the pooled class left this database to the stock method
            left_to_stock.append(engine.url.database)
        return stock_initdb(self, engine, for_index_shard)

    monkeypatch.setattr(SqliteEventLogStorage, "_initdb", spy)
    try:
        stock.store_event(_entry("made-by-stock", "a"))
        pooled.store_event(_entry("made-by-pooled", "b"))
        pooled.store_event(_entry("made-by-pooled", "c"))
        want = _schema(base / "made-by-stock.db")
        assert want[1] and want[2] == [("wal",)]
        assert _schema(base / "made-by-pooled.db") == want
        pooled.store_event(_entry("made-by-stock", "d"))  # a stock database, written by the pooled class
        assert [e.user_message for e in stock.get_logs_for_run("made-by-stock")] == ["a", "d"]
        assert [e.user_message for e in stock.get_logs_for_run("made-by-pooled")] == ["b", "c"]
        with sqlite3.connect(base / "unstamped.db") as c:  # tables, no alembic stamp: the stock rules apply
            c.execute("CREATE TABLE other (x INTEGER)")
        pooled.store_event(_entry("unstamped", "e"))
        assert [e.user_message for e in stock.get_logs_for_run("unstamped")] == ["e"]
        assert _schema(base / "unstamped.db")[1] == want[1]
        made = [Path(p).stem for p in left_to_stock]
        assert "unstamped" in made and "made-by-pooled" not in made and "made-by-stock" not in made
    finally:
        stock.dispose()
        pooled.dispose()


def test_new_run_databases_are_copies_of_one_template_per_process_tree(tmp_path, monkeypatch):
    """The tables are created once per process tree (the template, kept in memory: a worker
    forked from the fork server runs no exit handler); each new run database is a copy,
    placed without replacing a file another process put there first, and no temporary
    file or directory is left behind."""
    import tempfile

    from megacpp_assets import instance_storage
    from megacpp_assets.instance_storage import PooledSqliteEventLogStorage

    created = []
    real = instance_storage._create_run_tables
    monkeypatch.setattr(instance_storage, "_create_run_tables", lambda *a: (created.append(1), real(*a)))
    monkeypatch.setattr(instance_storage, "_TEMPLATE", [])
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where the template is made
    (tmp_path / "tmp").mkdir()
    base = tmp_path / "runs"
    pooled = PooledSqliteEventLogStorage(str(base))
    try:
        for i in range(5):
            pooled.store_event(_entry(f"run-{i}", f"m{i}"))
        assert len(created) == 1  # the template's, in this process
        assert all(_schema(base / f"run-{i}.db") == _schema(base / "run-0.db") for i in range(5))
        assert [e.user_message for e in pooled.get_logs_for_run("run-3")] == ["m3"]
        taken = base / "taken.db"
        taken.write_bytes(b"placed by another process")
        assert instance_storage._place_run_template(str(taken)) is False
        assert taken.read_bytes() == b"placed by another process"
        assert not [p.name for p in base.iterdir() if ".tmp-" in p.name]
        assert not list((tmp_path / "tmp").iterdir())  # nothing left for an exit handler to remove
    finally:
        pooled.dispose()


def test_a_forked_child_copies_its_parents_template(tmp_path, monkeypatch):
    """A process forked after the template was made (a worker of the fork server) creates
    no tables of its own: its run databases are copies of the inherited bytes, with
    Dagster's schema."""
    from megacpp_assets import instance_storage
    from megacpp_assets.instance_storage import PooledSqliteEventLogStorage

    created = []
    real = instance_storage._create_run_tables
    monkeypatch.setattr(instance_storage, "_create_run_tables", lambda *a: (created.append(1), real(*a)))
    monkeypatch.setattr(instance_storage, "_TEMPLATE", [])
    template = instance_storage.run_template()
    assert created == [1] and instance_storage.run_template() is template
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one new run database, then report how many times it made tables
        code = 1
        try:
            os.close(read)
            pooled = PooledSqliteEventLogStorage(str(tmp_path / "child"))
            pooled.store_event(_entry("run-child", "from the child"))
            ok = [e.user_message for e in pooled.get_logs_for_run("run-child")] == ["from the child"]
            pooled.dispose()
            os.write(write, f"{len(created)} {ok}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        report = f.read()
    assert os.waitpid(pid, 0)[1] == 0
    assert report == "1 True"  # the parent's one creation, none in the child
    base = tmp_path / "base"
    pooled = PooledSqliteEventLogStorage(str(base))
    try:
        pooled.store_event(_entry("run-parent", "m"))
    finally:
        pooled.dispose()
    assert _schema(tmp_path / "child" / "run-child.db") == _schema(base / "run-parent.db")


def test_the_fork_server_makes_the_template_before_its_first_fork():
    """``megacpp_assets.fork_preload`` (what the fork server imports) leaves the template
    made, so every worker forked from it inherits the bytes."""
    import subprocess
    import sys

    code = ("import megacpp_assets.fork_preload\n"
            "from megacpp_assets import instance_storage\n"
            "print(len(instance_storage._TEMPLATE), len(instance_storage._TEMPLATE[0]) > 10_000)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "True"], out.stdout + out.stderr
    assert "run-database template" not in out.stderr


def test_a_table_found_is_remembered_while_the_index_is_the_same_file(tmp_path, monkeypatch):
    """``has_table`` answers as the stock class; a table it found is not looked up again
    until the index database is replaced; a table not found is looked up each time."""
    import shutil

    from dagster._core.storage.event_log import SqliteEventLogStorage

    from megacpp_assets.instance_storage import PooledSqliteEventLogStorage

    base = tmp_path / "runs"
    pooled = PooledSqliteEventLogStorage(str(base))
    looked: list[str] = []
    stock_has_table = SqliteEventLogStorage.has_table

    def counting(self, name):
        looked.append(name)
        return stock_has_table(self, name)

    monkeypatch.setattr(SqliteEventLogStorage, "has_table", counting)
    try:
        assert pooled.has_table("dynamic_partitions") and pooled.has_table("dynamic_partitions")
        assert not pooled.has_table("no_such_table") and not pooled.has_table("no_such_table")
        assert looked == ["dynamic_partitions", "no_such_table", "no_such_table"]
        index = base / "index.db"
        shutil.copy(index, base / "copy.db")
        os.replace(base / "copy.db", index)  # another file under the same name
        assert pooled.has_table("dynamic_partitions")
        assert looked[-1] == "dynamic_partitions" and len(looked) == 4
    finally:
        pooled.dispose()


def _wait_for(got: list, n: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while len(got) < n and time.monotonic() < deadline:
        time.sleep(0.1)


@contextlib.contextmanager
def _watching(watcher, run_id: str):
    """The messages ``watcher``'s watch of ``run_id`` delivers (from the run's start), as a
    list that grows while the block runs; the watch ends and ``watcher`` is disposed after."""
    got: list[str] = []
    watcher.watch(run_id, None, lambda event, cursor: got.append(event.user_message))
    try:
        yield got
    finally:
        watcher.end_watch(run_id, next(iter(watcher._watchers[run_id]), None))
        watcher.dispose()


def test_a_live_watch_on_the_run_sees_every_write(tmp_path):
    """``dagster dev`` follows a run by watching its files; each write through the kept
    connection reaches the run's WAL at its commit, and the storage's watch follows the
    WAL, so the watcher sees every write while the writer keeps its connection open (no
    checkpoint in between: the ``.db`` file does not change)."""
    from megacpp_assets.instance_storage import PooledSqliteEventLogStorage

    base = tmp_path / "runs"
    writer = PooledSqliteEventLogStorage(str(base))
    writer.store_event(_entry("run-a", "first"))  # the run's database exists before the watch
    db = base / "run-a.db"
    before = db.stat().st_mtime_ns, db.stat().st_size
    try:
        with _watching(PooledSqliteEventLogStorage(str(base)), "run-a") as got:
            for i in range(12):
                writer.store_event(_entry("run-a", f"m{i}"))
                time.sleep(0.05)
            _wait_for(got, 13)
            assert got == ["first"] + [f"m{i}" for i in range(12)]
            assert (db.stat().st_mtime_ns, db.stat().st_size) == before  # seen through the WAL alone
    finally:
        writer.dispose()


def test_a_stock_watch_sees_the_run_when_its_log_is_checkpointed(tmp_path):
    """A process watching with Dagster's stock storage (the ``.db`` file only) sees the
    events when the WAL reaches the ``.db`` file: at the latest when the writer closes its
    connection (the end of the process, or :data:`KEPT_RUN_SHARDS` later runs)."""
    from dagster._core.storage.event_log import SqliteEventLogStorage

    from megacpp_assets.instance_storage import PooledSqliteEventLogStorage

    base = tmp_path / "runs"
    writer = PooledSqliteEventLogStorage(str(base))
    writer.store_event(_entry("run-a", "first"))
    with _watching(SqliteEventLogStorage(str(base)), "run-a") as got:
        for i in range(5):
            writer.store_event(_entry("run-a", f"m{i}"))
        writer.dispose()  # closes the run's connection: its WAL is checkpointed into the .db file
        _wait_for(got, 6)
        assert got == ["first"] + [f"m{i}" for i in range(5)]  # from the start: the watch's cursor is None


def test_open_run_databases_stay_bounded_and_every_run_stays_readable(tmp_path):
    from megacpp_assets.instance_storage import KEPT_RUN_SHARDS, PooledSqliteEventLogStorage

    base = tmp_path / "runs"
    storage = PooledSqliteEventLogStorage(str(base))
    runs = [f"run-{i}" for i in range(KEPT_RUN_SHARDS + 3)]
    for run in runs:
        for i in range(3):
            storage.store_event(_entry(run, f"{run}-{i}"))
        assert len(_open_run_databases(base)) <= KEPT_RUN_SHARDS
    assert _open_run_databases(base) == set(runs[-KEPT_RUN_SHARDS:])
    for run in runs:  # the closed ones reopen
        assert [r.event_log_entry.user_message for r in storage.get_records_for_run(run).records] == \
            [f"{run}-{i}" for i in range(3)]
    storage.dispose()
    assert not _open_run_databases(base)


def test_wipe_closes_and_deletes_the_run_databases_then_writes_again(tmp_path):
    from megacpp_assets.instance_storage import PooledSqliteEventLogStorage

    base = tmp_path / "runs"
    storage = PooledSqliteEventLogStorage(str(base))
    storage.store_event(_entry("run-w", "before"))
    storage.wipe()
    assert not (base / "run-w.db").exists() and not _open_run_databases(base)
    storage.store_event(_entry("run-w", "after"))
    assert [r.event_log_entry.user_message for r in storage.get_records_for_run("run-w").records] == ["after"]
    storage.dispose()


def _integrity(db: Path) -> str:
    import sqlite3

    with sqlite3.connect(db) as c:
        return c.execute("PRAGMA integrity_check").fetchone()[0]


def test_a_wipe_by_another_process_fails_as_it_does_with_the_stock_storage(tmp_path):
    """A run database deleted under a kept connection (``wipe`` elsewhere) is not written
    to a deleted file: the next write fails exactly as the stock storage's does."""
    import sqlalchemy as sa
    from dagster._core.storage.event_log import SqliteEventLogStorage

    from megacpp_assets.instance_storage import PooledSqliteEventLogStorage

    outcomes = {}
    for cls in (SqliteEventLogStorage, PooledSqliteEventLogStorage):
        base = tmp_path / cls.__name__
        writer, other = cls(str(base)), SqliteEventLogStorage(str(base))
        writer.store_event(_entry("run-x", "before"))
        other.wipe()
        try:
            writer.store_event(_entry("run-x", "after"))
            outcomes[cls.__name__] = [r.event_log_entry.user_message for r in other.get_records_for_run("run-x").records]
        except sa.exc.OperationalError as e:
            outcomes[cls.__name__] = str(e.orig)
        writer.dispose()
    assert outcomes["PooledSqliteEventLogStorage"] == outcomes["SqliteEventLogStorage"] == "no such table: event_logs"


def _forked_child(base: str, run_id: str, n: int, go) -> None:
    db = os.path.join(base, f"{run_id}.db")
    inherited = [fd for fd in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{fd}") == db]
    go.set()
    for i in range(n):
        _INHERITED.store_event(_entry(run_id, f"child-{i}"))
    os._exit(3 if inherited else 0)  # SQLite: no connection may be carried across fork


_INHERITED = None


def test_a_forked_child_and_its_parent_write_one_run_at_once_without_loss(tmp_path):
    """Fork while connections are kept: the child inherits none open, and parent and child
    then write the same run database at once (the parent closing and reopening its
    connections midway) with every row kept and the database intact."""
    global _INHERITED
    from megacpp_assets.instance_storage import PooledSqliteEventLogStorage

    base = tmp_path / "runs"
    _INHERITED = storage = PooledSqliteEventLogStorage(str(base))
    try:
        storage.store_event(_entry("run-f", "parent-start"))
        ctx = multiprocessing.get_context("fork")
        go = ctx.Event()
        child = ctx.Process(target=_forked_child, args=(str(base), "run-f", 200, go))
        child.start()
        assert go.wait(60)
        for i in range(200):
            storage.store_event(_entry("run-f", f"parent-{i}"))
            if i == 100:
                storage.dispose()  # the parent's connections close while the child writes
        child.join(120)
        assert child.exitcode == 0
        messages = [r.event_log_entry.user_message for r in storage.get_records_for_run("run-f").records]
        assert len(messages) == 401 and sorted(messages) == sorted(
            ["parent-start"] + [f"parent-{i}" for i in range(200)] + [f"child-{i}" for i in range(200)])
        storage.dispose()
        assert _integrity(base / "run-f.db") == "ok"
    finally:
        _INHERITED = None
        storage.dispose()


def _instance_writes(home: str, asset: str, n: int) -> None:
    from dagster import AssetKey, AssetMaterialization, DagsterInstance

    os.environ["DAGSTER_HOME"] = home
    with DagsterInstance.get() as instance:
        for i in range(n):
            instance.report_runless_asset_event(AssetMaterialization(AssetKey(asset), metadata={"i": i}))


def test_two_processes_write_one_homes_index_at_once(tmp_path):
    """Asset events go to the cross-run index database both processes keep open."""
    from dagster import AssetKey, DagsterInstance

    write_instance_config(tmp_path)
    with environ(DAGSTER_HOME=str(tmp_path)), DagsterInstance.get():
        pass  # the home's databases exist before the writers start, as for megacpp run's workers
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_instance_writes, args=(str(tmp_path), a, 150)) for a in ("x", "y")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    assert [p.exitcode for p in procs] == [0, 0]
    with environ(DAGSTER_HOME=str(tmp_path)), DagsterInstance.get() as instance:
        for a in ("x", "y"):
            records = instance.fetch_materializations(AssetKey(a), limit=1000).records
            assert sorted(r.asset_materialization.metadata["i"].value for r in records) == list(range(150))
    assert _integrity(tmp_path / "history" / "runs" / "index.db") == "ok"


def test_the_cli_writes_its_config_upgrades_its_earlier_one_and_keeps_a_users(tmp_path):
    from megacpp_assets.cli import _EARLIER_DAGSTER_YAMLS, DAGSTER_YAML, prepare_environment

    saved = os.environ.get("MEGACPP_DATA_ROOT")
    earlier = [(f"earlier{i}", text, DAGSTER_YAML) for i, text in enumerate(_EARLIER_DAGSTER_YAMLS)]
    try:
        for name, before, after in [("fresh", None, DAGSTER_YAML), *earlier,
                                    ("users", "telemetry:\n  enabled: true\n", "telemetry:\n  enabled: true\n")]:
            home = tmp_path / name / "home"
            home.mkdir(parents=True)
            if before is not None:
                (home / "dagster.yaml").write_text(before)
            with environ(DAGSTER_HOME=str(home)):
                prepare_environment(str(tmp_path / name / "root"))
            assert (home / "dagster.yaml").read_text() == after, name
    finally:
        if saved is None:
            os.environ.pop("MEGACPP_DATA_ROOT", None)
        else:
            os.environ["MEGACPP_DATA_ROOT"] = saved


def _run_end(run_id: str):
    from dagster import DagsterEvent, DagsterEventType
    from dagster._core.events.log import EventLogEntry

    event = DagsterEvent(event_type_value=DagsterEventType.RUN_SUCCESS.value, job_name="job", message="done")
    return EventLogEntry(error_info=None, level=20, user_message="", run_id=run_id, timestamp=time.time(),
                         step_key=None, job_name="job", dagster_event=event)


def test_a_finished_run_is_whole_in_its_db_file_while_its_connection_stays_open(tmp_path):
    """Commits stay in the WAL while the run goes on; the event that ends the run
    checkpoints them into the ``.db`` file, so a copy of that file alone (or a stock
    watcher of it) has the whole run although the writer keeps its connection."""
    import shutil

    from dagster._core.storage.event_log import SqliteEventLogStorage

    from megacpp_assets.instance_storage import PooledSqliteEventLogStorage

    base = tmp_path / "runs"
    writer = PooledSqliteEventLogStorage(str(base))
    try:
        for i in range(5):
            writer.store_event(_entry("run-a", f"m{i}"))
        (tmp_path / "early").mkdir()
        shutil.copy(base / "run-a.db", tmp_path / "early" / "run-a.db")
        early = [e.user_message for e in SqliteEventLogStorage(str(tmp_path / "early")).get_logs_for_run("run-a")]
        assert len(early) < 5  # still in the WAL: no checkpoint per commit
        writer.store_event(_run_end("run-a"))
        (tmp_path / "late").mkdir()
        shutil.copy(base / "run-a.db", tmp_path / "late" / "run-a.db")
        got = SqliteEventLogStorage(str(tmp_path / "late")).get_logs_for_run("run-a")
        assert [e.user_message for e in got][:5] == [f"m{i}" for i in range(5)] and len(got) == 6
        assert got[-1].dagster_event.event_type_value == "PIPELINE_SUCCESS"
    finally:
        writer.dispose()


def test_a_wal_change_is_read_at_once_and_once_more_later(tmp_path, monkeypatch):
    """A commit's WAL pages are written (the change the watch sees) before the commit is
    visible, so each change is read at once and re-read once shortly after; changes
    while a re-read is pending add none, and an ended watch reads nothing more."""
    from megacpp_assets import instance_storage
    from megacpp_assets.instance_storage import PooledSqliteEventLogStorage

    monkeypatch.setattr(instance_storage, "WAL_RECHECK_SECONDS", 0.2)
    base = tmp_path / "runs"
    storage = PooledSqliteEventLogStorage(str(base))
    storage.store_event(_entry("run-a", "first"))
    handler = instance_storage._RunWalWatchdog(storage, "run-a", lambda event, cursor: None, None)
    reads: list[float] = []
    monkeypatch.setattr(handler, "_process_log", lambda: reads.append(time.monotonic()))
    try:
        handler.on_modified(None)
        handler.on_modified(None)
        assert len(reads) == 2
        time.sleep(0.6)
        assert len(reads) == 3 and reads[2] - reads[0] >= 0.2
        handler.on_modified(None)
        handler.stop()
        time.sleep(0.4)
        assert len(reads) == 4  # the one at once; the pending re-read was cancelled
        handler.on_modified(None)
        assert len(reads) == 4
    finally:
        storage.dispose()


def test_the_run_storage_keeps_one_connection_and_reads_back_through_the_stock_class(tmp_path):
    """The instance's run storage is the pooled one on Dagster's ``history/runs.db``: runs it
    writes (materialized assets, their tags) are read back by the stock class, and it holds
    one connection to the file across calls, none in a forked child."""
    import dagster as dg
    from dagster import DagsterInstance
    from dagster._core.storage.runs import SqliteRunStorage

    from megacpp_assets.instance_storage import PooledSqliteRunStorage

    write_instance_config(tmp_path)
    runs_db = str(tmp_path / "history" / "runs.db")

    def open_to_runs_db() -> int:
        return sum(1 for fd in os.listdir("/proc/self/fd")
                   if os.path.realpath(f"/proc/self/fd/{fd}") == runs_db)

    with environ(DAGSTER_HOME=str(tmp_path)), DagsterInstance.get() as instance:
        assert isinstance(instance.run_storage, PooledSqliteRunStorage)
        for _ in range(3):
            assert dg.materialize(_assets(), instance=instance).success
        assert open_to_runs_db() == 1  # one kept connection, not one per call
        ids = sorted(r.run_id for r in instance.get_runs())
        alone = tmp_path / "copy"
        alone.mkdir()
        (alone / "runs.db").write_bytes((tmp_path / "history" / "runs.db").read_bytes())  # the .db file without its WAL
        assert sorted(r.run_id for r in SqliteRunStorage.from_local(str(alone)).get_runs()) == ids  # checkpointed at each run's end
        ctx = multiprocessing.get_context("fork")
        child = ctx.Process(target=lambda: os._exit(3 if open_to_runs_db() else 0))
        child.start()
        child.join(60)
        assert child.exitcode == 0  # closed before the fork
        assert dg.materialize(_assets(), instance=instance).success  # and opened again after it
    stock = SqliteRunStorage.from_local(str(tmp_path / "history"))
    got = stock.get_runs()
    assert len(got) == 4 and set(ids) <= {r.run_id for r in got}
    assert all(r.is_success for r in got)
    assert _integrity(tmp_path / "history" / "runs.db") == "ok"


def test_run_storage_schema_answers_are_remembered_while_runs_db_is_the_same_file(tmp_path, monkeypatch):
    """``has_run_stats_index_cols`` and ``has_backfill_id_column`` answer as the stock class;
    a true answer is not asked again until ``runs.db`` is another file, and a false one is
    asked each time."""
    import shutil

    from dagster._core.storage.runs import SqliteRunStorage
    from dagster._core.storage.runs.sql_run_storage import SqlRunStorage

    from megacpp_assets.instance_storage import PooledSqliteRunStorage

    stock = SqliteRunStorage.from_local(str(tmp_path))
    pooled = PooledSqliteRunStorage(stock._conn_string)
    asked: list[str] = []
    real_stats, real_backfill = SqlRunStorage.has_run_stats_index_cols, SqlRunStorage.has_backfill_id_column
    answer = {"backfill": False}
    monkeypatch.setattr(SqlRunStorage, "has_run_stats_index_cols", lambda self: (asked.append("stats"), real_stats(self))[1])
    monkeypatch.setattr(SqlRunStorage, "has_backfill_id_column",
                        lambda self: (asked.append("backfill"), answer["backfill"] and real_backfill(self))[1])
    try:
        assert pooled.has_run_stats_index_cols() and pooled.has_run_stats_index_cols()
        assert not pooled.has_backfill_id_column() and not pooled.has_backfill_id_column()
        assert asked == ["stats", "backfill", "backfill"]
        answer["backfill"] = True
        assert pooled.has_backfill_id_column() and pooled.has_backfill_id_column()
        assert asked == ["stats", "backfill", "backfill", "backfill"]
        shutil.copy(tmp_path / "runs.db", tmp_path / "copy.db")
        os.replace(tmp_path / "copy.db", tmp_path / "runs.db")  # another file under the same name
        assert pooled.has_run_stats_index_cols() and asked[-1] == "stats" and len(asked) == 5
        assert pooled.get_runs() == []  # the kept connection follows the new file
    finally:
        pooled.dispose()


def test_asset_key_column_answers_are_remembered_while_the_index_is_the_same_file(tmp_path, monkeypatch):
    """The ``asset_keys`` column checks of the event log answer as the stock class and are
    asked once while the index database is the same file."""
    from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

    from megacpp_assets.instance_storage import PooledSqliteEventLogStorage

    pooled = PooledSqliteEventLogStorage(str(tmp_path / "runs"))
    asked: list[str] = []
    real = SqlEventLogStorage._has_asset_key_col_on_connection
    monkeypatch.setattr(SqlEventLogStorage, "_has_asset_key_col_on_connection",
                        lambda self, conn, name: (asked.append(name), real(self, conn, name))[1])
    try:
        assert pooled.has_asset_key_index_cols() and pooled.has_asset_key_index_cols()
        assert pooled.can_read_asset_status_cache() and pooled.can_read_asset_status_cache()
        assert not pooled.has_asset_key_col("no_such_column") and not pooled.has_asset_key_col("no_such_column")
        assert asked == ["last_materialization_timestamp", "cached_status_data", "no_such_column", "no_such_column"]
    finally:
        pooled.dispose()


def test_dynamic_partition_membership_is_read_at_each_call_as_the_stock_storage_reads_it(tmp_path):
    """``has_dynamic_partition`` (one statement built once) answers as Dagster's stock
    SQLite storage on the same home, for keys added and deleted by another instance
    between two calls (nothing is cached), names and keys that only share a prefix or
    differ in case, and an unknown definition."""
    from dagster import DagsterInstance
    from dagster._core.storage.event_log import SqliteEventLogStorage

    from megacpp_assets.instance_storage import PooledSqliteEventLogStorage

    write_instance_config(tmp_path)
    index = str(tmp_path / "history" / "runs")
    asks = [("repo_revision", "s/a"), ("repo_revision", "s/a|000"), ("repo_revision", "S/A"), ("repo_revision", "s/"),
            ("shard", "s/a"), ("shard", "000"), ("no_such_definition", "000"), ("repo_revision", "ünï/ç'\"%_")]
    with environ(DAGSTER_HOME=str(tmp_path)), DagsterInstance.get() as pooled, DagsterInstance.get() as writer:
        assert isinstance(pooled.event_log_storage, PooledSqliteEventLogStorage)
        stock = SqliteEventLogStorage(index)
        answers = lambda: [pooled.has_dynamic_partition(n, k) for n, k in asks]  # noqa: E731
        assert answers() == [stock.has_dynamic_partition(n, k) for n, k in asks] == [False] * len(asks)
        writer.add_dynamic_partitions("repo_revision", ["s/a", "ünï/ç'\"%_"])
        writer.add_dynamic_partitions("shard", ["000"])
        assert answers() == [stock.has_dynamic_partition(n, k) for n, k in asks] \
            == [True, False, False, False, False, True, False, True]
        writer.delete_dynamic_partition("repo_revision", "s/a")
        assert answers() == [stock.has_dynamic_partition(n, k) for n, k in asks] \
            == [False, False, False, False, False, True, False, True]
        stock.dispose()


def test_asset_details_and_secondary_indexes_answer_as_the_stock_storage(tmp_path):
    """The wipe details of asset keys (read at every asset query, one statement built
    once) are the stock storage's, in the keys' order, for keys never seen, materialized,
    wiped, repeated and empty lists; a wipe by another instance is seen at the next call,
    so a wiped asset's materializations are gone for both. A completed secondary index is
    remembered; one not completed is asked again, and seen once another instance
    completes it."""
    import dagster as dg
    from dagster import AssetKey, DagsterInstance
    from dagster._core.storage.event_log import SqliteEventLogStorage

    write_instance_config(tmp_path)
    with environ(DAGSTER_HOME=str(tmp_path)), DagsterInstance.get() as pooled, DagsterInstance.get() as writer:
        assert dg.materialize(_assets(), instance=writer).success
        stock = SqliteEventLogStorage(str(tmp_path / "history" / "runs"))
        keys = [AssetKey("doubled"), AssetKey("never"), AssetKey("numbers"), AssetKey("doubled"), AssetKey(["a", "b"])]
        ours = pooled.event_log_storage
        for _ in range(2):
            assert ours._get_assets_details(keys) == stock._get_assets_details(keys)
            assert ours._get_assets_details([]) == stock._get_assets_details([]) == []
            writer.wipe_assets([AssetKey("numbers")])
        got = ours._get_assets_details(keys)
        assert got == stock._get_assets_details(keys) and got[2].last_wipe_timestamp and got[0] is None
        assert pooled.fetch_materializations(AssetKey("numbers"), limit=5).records == []
        assert len(pooled.fetch_materializations(AssetKey("doubled"), limit=5).records) == 1

        assert ours.has_secondary_index("megacpp_test_index") is stock.has_secondary_index("megacpp_test_index") is False
        writer.event_log_storage.enable_secondary_index("megacpp_test_index")
        assert ours.has_secondary_index("megacpp_test_index") is stock.has_secondary_index("megacpp_test_index") is True
        name = next(n for n in ("asset_key_table", "asset_key_index_columns") if stock.has_secondary_index(n))
        assert ours.has_secondary_index(name) is True
        asked = []
        real = SqliteEventLogStorage.has_secondary_index
        try:
            SqliteEventLogStorage.has_secondary_index = lambda self, n: asked.append(n) or real(self, n)
            assert all(ours.has_secondary_index(name) for _ in range(5))
            assert ours.has_secondary_index("megacpp_not_done") is False and ours.has_secondary_index("megacpp_not_done") is False
        finally:
            SqliteEventLogStorage.has_secondary_index = real
        assert asked == ["megacpp_not_done", "megacpp_not_done"]  # a true answer from before; a false one each time
        stock.dispose()


def test_latest_tags_by_partition_answer_as_the_stock_storage(tmp_path):
    """The indexed tags of each partition's latest event (read for every step's input data
    versions; one statement built once) are the stock storage's: several partitions, one
    never seen, a latest event without the tag (an older event's tag is not used),
    observations apart from materializations, two indexed tag keys (one absent), an empty list, a
    cursor, a wiped and re-materialized asset with an event from before the wipe left in
    the index (the stock method then), and the same refusal of a tag Dagster does not index."""
    import sqlite3

    from dagster import AssetKey, AssetMaterialization, AssetObservation, DagsterEventType, DagsterInstance
    from dagster._check import CheckError
    from dagster._core.storage.event_log import SqliteEventLogStorage

    write_instance_config(tmp_path)
    V, D = "dagster/data_version", "dagster/partition/revision"
    with environ(DAGSTER_HOME=str(tmp_path)), DagsterInstance.get() as pooled:
        report = pooled.report_runless_asset_event
        for p, v in (("s/a", "1"), ("s/b", "1"), ("s/a", "2"), ("s/c", "1")):
            report(AssetMaterialization("x", partition=p, tags={V: v}))
        report(AssetMaterialization("x", partition="s/c"))  # latest of s/c: no tags
        report(AssetObservation("x", partition="s/b", tags={V: "obs"}))
        stock = SqliteEventLogStorage(str(tmp_path / "history" / "runs"))
        ours = pooled.event_log_storage
        M, O = DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_OBSERVATION
        parts = ["s/a", "s/b", "s/c", "s/never", "s/a"]

        def both(*args, **kwargs):
            got = ours.get_latest_tags_by_partition(*args, **kwargs)
            assert got == stock.get_latest_tags_by_partition(*args, **kwargs), (args, kwargs)
            return got

        assert both(AssetKey("x"), M, [V], asset_partitions=parts) == {"s/a": {V: "2"}, "s/b": {V: "1"}}
        assert both(AssetKey("x"), M, [V, D], asset_partitions=parts) == {"s/a": {V: "2"}, "s/b": {V: "1"}}
        assert both(AssetKey("x"), O, [V], asset_partitions=parts) == {"s/b": {V: "obs"}}
        assert both(AssetKey("y"), M, [V], asset_partitions=parts) == {}
        assert both(AssetKey("x"), M, [V], asset_partitions=[]) == {}
        both(AssetKey("x"), M, [V])
        cursor = pooled.fetch_materializations(AssetKey("x"), limit=10).records[-1].storage_id
        both(AssetKey("x"), M, [V], asset_partitions=parts, after_cursor=cursor)
        both(AssetKey("x"), M, [V], asset_partitions=parts, before_cursor=cursor + 2)
        index = tmp_path / "history" / "runs" / "index.db"
        with sqlite3.connect(index) as c:
            before = c.execute("SELECT event, timestamp FROM event_logs WHERE partition = 's/a' AND "
                               "dagster_event_type = 'ASSET_MATERIALIZATION' ORDER BY id LIMIT 1").fetchone()
        pooled.wipe_assets([AssetKey("x")])
        report(AssetMaterialization("x", partition="s/b", tags={V: "3"}))
        with sqlite3.connect(index) as c:  # an event from before the wipe left in the index, with its tag
            row = c.execute("INSERT INTO event_logs (run_id, event, dagster_event_type, timestamp, asset_key, partition) "
                            "VALUES ('', ?, 'ASSET_MATERIALIZATION', ?, '[\"x\"]', 's/a')", before).lastrowid
            c.execute("INSERT INTO asset_event_tags (event_id, asset_key, key, value, event_timestamp) "
                      "VALUES (?, '[\"x\"]', ?, 'old', ?)", (row, V, before[1]))
        assert both(AssetKey("x"), M, [V], asset_partitions=parts) == {"s/b": {V: "3"}}
        for storage in (ours, stock):
            with pytest.raises(CheckError):
                storage.get_latest_tags_by_partition(AssetKey("x"), M, ["megacpp/not-indexed"], asset_partitions=parts)
        stock.dispose()


def test_materializations_of_named_partitions_read_as_the_stock_storage_reads_them(tmp_path):
    """An asset's materializations in named partitions (each check's target; one statement
    built once) are the stock storage's records, cursor and ``has_more``: newest or oldest
    first, limits under and over the count, partitions never seen, a row that is not
    JSON and one that is not an event (skipped by both), and the stock method's cases
    (a cursor, storage ids, timestamps, a bare asset key, a wiped asset) left to it."""
    import sqlite3

    from dagster import AssetKey, AssetMaterialization, AssetRecordsFilter, DagsterInstance
    from dagster._core.storage.event_log import SqliteEventLogStorage

    write_instance_config(tmp_path)
    with environ(DAGSTER_HOME=str(tmp_path)), DagsterInstance.get() as pooled:
        for i, p in enumerate(("s/a", "s/b", "s/a", "s/c", "s/a")):
            pooled.report_runless_asset_event(AssetMaterialization("x", partition=p, metadata={"i": i}))
        pooled.report_runless_asset_event(AssetMaterialization("y", partition="s/a"))
        index = tmp_path / "history" / "runs" / "index.db"
        with sqlite3.connect(index) as c:  # two hostile rows, in partition s/a of x
            c.execute("INSERT INTO event_logs (run_id, event, dagster_event_type, timestamp, asset_key, partition) "
                      "VALUES ('', '{not json', 'ASSET_MATERIALIZATION', '2026-01-01 00:00:00', '[\"x\"]', 's/a')")
            c.execute("INSERT INTO event_logs (run_id, event, dagster_event_type, timestamp, asset_key, partition) "
                      "VALUES ('', '{\"__class__\": \"AssetKey\", \"path\": [\"z\"]}', 'ASSET_MATERIALIZATION', "
                      "'2026-01-01 00:00:00', '[\"x\"]', 's/a')")
        stock = SqliteEventLogStorage(str(tmp_path / "history" / "runs"))
        ours = pooled.event_log_storage
        parts = ["s/a", "s/c", "s/never"]
        newest = None
        for limit in (1, 2, 3, 50):
            for ascending in (False, True):
                f = AssetRecordsFilter(asset_key=AssetKey("x"), asset_partitions=parts)
                got = ours.fetch_materializations(f, limit, ascending=ascending)
                assert got == stock.fetch_materializations(f, limit, ascending=ascending), (limit, ascending)
                if limit == 50 and not ascending:
                    newest = got
        assert [r.asset_materialization.metadata["i"].value for r in newest.records] == [4, 3, 2, 0]
        assert not newest.has_more
        cursor = newest.cursor
        x, a = AssetKey("x"), ["s/a"]
        for f, kw in ((AssetRecordsFilter(asset_key=x, asset_partitions=a), {"cursor": cursor}),
                      (AssetRecordsFilter(asset_key=x, asset_partitions=a, storage_ids=[1, 3]), {}),
                      (AssetRecordsFilter(asset_key=x, asset_partitions=a, after_storage_id=1), {}),
                      (AssetRecordsFilter(asset_key=x, asset_partitions=a, before_timestamp=4e9), {}),
                      (AssetRecordsFilter(asset_key=x), {}), (x, {}),
                      (AssetRecordsFilter(asset_key=AssetKey("y"), asset_partitions=["s/a", "s/b"]), {})):
            assert ours.fetch_materializations(f, 10, **kw) == stock.fetch_materializations(f, 10, **kw), f
        with sqlite3.connect(index) as c:
            before = c.execute("SELECT event, timestamp FROM event_logs WHERE asset_key = '[\"x\"]' AND partition = 's/a' "
                               "AND event LIKE '{%' ORDER BY id LIMIT 1").fetchone()
        pooled.wipe_assets([x])
        pooled.report_runless_asset_event(AssetMaterialization("x", partition="s/a", metadata={"i": 9}))
        with sqlite3.connect(index) as c:  # an event from before the wipe left in the index: filtered by its time
            c.execute("INSERT INTO event_logs (run_id, event, dagster_event_type, timestamp, asset_key, partition) "
                      "VALUES ('', ?, 'ASSET_MATERIALIZATION', ?, '[\"x\"]', 's/a')", before)
        f = AssetRecordsFilter(asset_key=x, asset_partitions=parts)
        got = ours.fetch_materializations(f, 10)
        assert got == stock.fetch_materializations(f, 10)
        assert [r.asset_materialization.metadata["i"].value for r in got.records] == [9]
        stock.dispose()


def test_wrong_arguments_are_refused_as_the_stock_storage_refuses_them(tmp_path):
    """The event-log reads with a statement built once check their arguments as the stock
    methods do: a string where a list of partitions is expected, a set of asset keys, a
    string event type and a non-boolean order are refused, not read."""
    from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance
    from dagster._check import CheckError
    from dagster._core.storage.event_log import SqliteEventLogStorage

    write_instance_config(tmp_path)
    with environ(DAGSTER_HOME=str(tmp_path)), DagsterInstance.get() as pooled:
        stock = SqliteEventLogStorage(str(tmp_path / "history" / "runs"))
        V, M = "dagster/data_version", DagsterEventType.ASSET_MATERIALIZATION
        calls = [lambda s: s.get_latest_tags_by_partition(AssetKey("x"), M, [V], asset_partitions="ab"),
                 lambda s: s.get_latest_tags_by_partition(AssetKey("x"), "ASSET_MATERIALIZATION", [V], asset_partitions=["a"]),
                 lambda s: s.get_latest_tags_by_partition("x", M, [V], asset_partitions=["a"]),
                 lambda s: s._get_assets_details({AssetKey("x")}),
                 lambda s: s.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey("x"), asset_partitions=["a"]),
                                                   1, ascending=None)]
        for call in calls:
            for storage in (pooled.event_log_storage, stock):
                with pytest.raises(CheckError):
                    call(storage)
        stock.dispose()
