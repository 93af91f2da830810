"""Dagster's SQLite instance storage with its event-log connections kept open.

``megacpp run`` and ``make ui`` use a local Dagster instance on SQLite. Dagster's
:class:`~dagster._core.storage.event_log.SqliteEventLogStorage` opens a new SQLAlchemy
engine and a new ``sqlite3`` connection for every read and every write (``NullPool``), and
a stored event takes several of them: the run's database, then the cross-run index for an
asset or asset-check event (``store_event``, ``store_asset_check_event``). A ``default``
run stores about 3,000 events, so connection set-up and tear-down is a large part of
Dagster's per-event cost here (SQLAlchemy documents the cost of ``NullPool`` on SQLite
in its issue #7490). :class:`PooledSqliteEventLogStorage` keeps one engine with one pooled
connection per database instead; everything else, the files, their schema and the
queries, is Dagster's own, so a home written by one class is read by the other.

Two behaviours of the stock class are kept on purpose:

- **Live run views.** ``dagster dev`` follows a running run by watching the run's ``.db``
  file for changes (``SqliteEventLogStorageWatchdog``). In WAL mode a write reaches the
  ``.db`` file only when the WAL is checkpointed, which the stock class does at every
  write (it closes its connection). A kept run connection checkpoints at SQLite's
  default (every 1,000 WAL pages, and when the connection closes) and after the event
  that ends the run, and the storage's own :meth:`~PooledSqliteEventLogStorage.watch`
  follows the run's WAL file as well as its ``.db`` file, so the UI still sees each
  write as it is committed. A checkpoint at every commit costs a write of the database
  file and its ``fsync``: 0.67 ms a commit here against 0.04 ms without, and a
  ``default`` run commits about 3,000 events to run databases. (A process that watches
  with the stock class, or copies the ``.db`` files alone, sees a running run's events
  at its checkpoints and the whole run once it ended.)
- **Threads and processes.** Every use of a connection holds the storage's own lock, as the
  stock class does. SQLite forbids carrying an open connection across ``fork``, which the
  stock class never has outside a call: before any ``fork`` (``os.register_at_fork``),
  every pooled storage of the process takes its lock and closes its connections, so a
  forked child opens its own. A database file replaced or deleted under a kept connection
  (``wipe``, here or in another process) is noticed at the next use by its inode, and the
  connection reopened, so it fails or succeeds as the stock class would; ``wipe``,
  ``upgrade`` and ``dispose`` close the connections too.
- **Schema checks.** ``has_table`` and the ``asset_keys`` column checks answer as the
  stock class does; a table or column found is remembered while the index database is
  the same file (tables and columns are added, never dropped).

The run storage (``history/runs.db``) is kept open the same way
(:class:`PooledSqliteRunStorage`): the stock class builds a new engine for every read and
write, and reflects the ``runs`` table's columns at every run it creates or updates.

Two settings differ from the stock class: the checkpoints of run databases (above), and
the ``synchronous`` level. The event-log connections use SQLite's
``PRAGMA synchronous=NORMAL`` (configurable: ``synchronous``, default
:data:`DEFAULT_SYNCHRONOUS`) instead of ``FULL``. In WAL mode, SQLite documents NORMAL as
safe from corruption; a commit is not flushed to disk by itself, so the last events
before a power loss or an operating-system crash (not a killed process) can be lost,
and ``megacpp run`` then runs their steps again (outputs are deterministic). Under FULL
every commit waits for an ``fsync``: about 0.4 ms here, against 0.03 ms under NORMAL,
and a ``default`` run commits several thousand times.

The instance configuration that selects it (``storage: custom:``, see
:data:`megacpp_assets.cli.DAGSTER_YAML`) keeps Dagster's layout under ``DAGSTER_HOME``:
``history/`` (runs), ``history/runs/`` (event logs), ``schedules/``. Its ``base_dir`` is
read from the ``DAGSTER_HOME`` environment variable (so a home can be moved or copied), so
a tool that opens the instance with ``DagsterInstance.from_config(path)`` sets
``DAGSTER_HOME`` to that path first, as ``bench/orchestration.py`` does.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import dagster_shared.seven as seven
import sqlalchemy as sa
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from dagster import AssetKey, DagsterEventType, Enum, EnumValue, Field, StringSource
from dagster import _check as check
from dagster._core.event_api import AssetRecordsFilter, EventRecordsResult
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log.base import AssetDetails, EventLogCursor, EventLogRecord
from dagster._core.storage.event_log.schema import (
    AssetEventTagsTable,
    AssetKeyTable,
    DynamicPartitionsTable,
    SqlEventLogStorageMetadata,
    SqlEventLogStorageTable,
)
from dagster._core.storage.event_log.sql_event_log import enforce_max_records_limit
from dagster._core.storage.event_log.sqlite import sqlite_event_log
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    INDEX_SHARD_NAME,
    SQLITE_BUSY_TIMEOUT_SECONDS,
    SqliteEventLogStorage,
    SqliteEventLogStorageWatchdog,
)
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.sql import get_alembic_config
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage, _event_logs_directory
from dagster._serdes import ConfigurableClassData, deserialize_value
from watchdog.observers import Observer

#: The events that end a run (its WAL is then checkpointed: ``store_event``).
_RUN_ENDS = frozenset({DagsterEventType.RUN_SUCCESS, DagsterEventType.RUN_FAILURE, DagsterEventType.RUN_CANCELED})
#: Run databases whose engine a process keeps (least recently used closed first). A
#: process writes one run at a time (``megacpp run`` executes a job in process; a worker
#: runs one job after another), and reads a few; the index database is always kept.
KEPT_RUN_SHARDS = 4
#: SQLite ``synchronous`` levels the event log accepts, and its default (module docstring).
SYNCHRONOUS_LEVELS = ("OFF", "NORMAL", "FULL", "EXTRA")
DEFAULT_SYNCHRONOUS = "NORMAL"


class _TrueAnswers:
    """Schema questions of one database answered true, remembered while the database is
    the same file: known by device, inode and status-change time (an inode number can be
    reused, and a checkpoint changes the time, so a file put in its place or rewritten is
    asked again). Dagster adds tables and columns (``upgrade``, its migrations) and never
    drops one, so a true answer holds for the file; a false one is asked each time."""

    def __init__(self):
        self._file: tuple[int, int, int] | None = None
        self._names: frozenset[str] = frozenset()

    def ask(self, path: str | None, name: str, ask) -> bool:
        """``ask()``, or True without asking when it was true before for ``path``'s file."""
        try:
            st = os.stat(path)
            file = (st.st_dev, st.st_ino, st.st_ctime_ns)
        except (FileNotFoundError, TypeError):
            file = None
        if file is not None and file == self._file and name in self._names:
            return True
        ok = ask()
        if ok and file is not None:
            self._names = (self._names if file == self._file else frozenset()) | {name}
            self._file = file
        return ok


#: :meth:`PooledSqliteEventLogStorage.has_dynamic_partition`'s query (Dagster's own, with
#: bound parameters ``name`` and ``key``), built and compiled once per process.
_HAS_DYNAMIC_PARTITION = (
    sa.select(DynamicPartitionsTable.c.partition)
    .where(sa.and_(DynamicPartitionsTable.c.partitions_def_name == sa.bindparam("name"),
                   DynamicPartitionsTable.c.partition == sa.bindparam("key")))
    .limit(1))

#: :meth:`PooledSqliteEventLogStorage._get_assets_details`'s query (Dagster's own, the asset
#: keys an expanding parameter ``keys``), built and compiled once per process.
_ASSET_DETAILS = (
    sa.select(AssetKeyTable.c.asset_key, AssetKeyTable.c.asset_details)
    .where(AssetKeyTable.c.asset_key.in_(sa.bindparam("keys", expanding=True))))


#: :meth:`PooledSqliteEventLogStorage.get_latest_tags_by_partition`'s query (Dagster's own
#: for named partitions of one event type and no cursor: each partition's latest event of
#: ``asset_key`` and ``event_type``, joined to its indexed tags named in ``tag_keys``),
#: built and compiled once per process.
_LATEST_EVENT_BY_PARTITION = (
    sa.select(SqlEventLogStorageTable.c.partition, sa.func.max(SqlEventLogStorageTable.c.id).label("id"))
    .where(SqlEventLogStorageTable.c.asset_key == sa.bindparam("asset_key"),
           SqlEventLogStorageTable.c.partition.in_(sa.bindparam("partitions", expanding=True)),
           SqlEventLogStorageTable.c.dagster_event_type == sa.bindparam("event_type"))
    .group_by(SqlEventLogStorageTable.c.partition)
    .subquery())
_LATEST_TAGS_BY_PARTITION = (
    sa.select(_LATEST_EVENT_BY_PARTITION.c.partition, AssetEventTagsTable.c.key, AssetEventTagsTable.c.value)
    .select_from(_LATEST_EVENT_BY_PARTITION.join(AssetEventTagsTable,
                                                 AssetEventTagsTable.c.event_id == _LATEST_EVENT_BY_PARTITION.c.id))
    .where(AssetEventTagsTable.c.key.in_(sa.bindparam("tag_keys", expanding=True))))


#: :meth:`PooledSqliteEventLogStorage.fetch_materializations`'s query (Dagster's own for an
#: asset's events of one type in named partitions, newest or oldest first, at most
#: ``limit``), built and compiled once per process, one per order.
_EVENTS_IN_PARTITIONS = {
    ascending: (sa.select(SqlEventLogStorageTable.c.id, SqlEventLogStorageTable.c.event)
                .where(SqlEventLogStorageTable.c.dagster_event_type == sa.bindparam("event_type"),
                       SqlEventLogStorageTable.c.asset_key == sa.bindparam("asset_key"),
                       SqlEventLogStorageTable.c.partition.in_(sa.bindparam("partitions", expanding=True)))
                .limit(sa.bindparam("limit"))
                .order_by(SqlEventLogStorageTable.c.id.asc() if ascending else SqlEventLogStorageTable.c.id.desc()))
    for ascending in (False, True)}


class PooledSqliteEventLogStorage(SqliteEventLogStorage):
    """:class:`SqliteEventLogStorage` with one kept engine and connection per database.

    Same configuration as the stock class (``base_dir``: the directory of the per-run
    ``RUN_ID.db`` files and ``index.db``), plus ``synchronous`` (one of
    :data:`SYNCHRONOUS_LEVELS`, default :data:`DEFAULT_SYNCHRONOUS`; ``ValueError``
    otherwise). Engines: the index database's for the life of the storage, and up to
    :data:`KEPT_RUN_SHARDS` run databases'. Raises what the stock class raises
    (``sqlite3`` / SQLAlchemy errors; ``database is locked`` after Dagster's busy timeout).
    """

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None,
                 synchronous: str = DEFAULT_SYNCHRONOUS):
        if synchronous not in SYNCHRONOUS_LEVELS:
            raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS_LEVELS)}, got {synchronous!r}")
        self.synchronous = synchronous
        #: shard -> (engine, (st_dev, st_ino) of its database file when opened)
        self._engines: OrderedDict[str, tuple[sa.Engine, tuple[int, int] | None]] = OrderedDict()
        #: (the index database file's (st_dev, st_ino, st_ctime_ns), the tables found in it)
        self._schema_answers = _TrueAnswers()  # has_table and the asset_keys column checks
        super().__init__(base_dir, inst_data=inst_data)
        _LIVE.add(self)

    @classmethod
    def from_config_value(cls, inst_data, config_value) -> PooledSqliteEventLogStorage:  # noqa: D102
        return cls(inst_data=inst_data, **config_value)

    def _file_id(self, shard: str) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path_for_shard(shard))
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def _engine(self, shard: str) -> sa.Engine:
        """The kept engine of ``shard`` (created on first use, or again when its database
        file was replaced or deleted since); call with ``_db_lock`` held."""
        kept = self._engines.get(shard)
        if kept is not None:
            engine, opened = kept
            if opened is not None and opened == self._file_id(shard):
                self._engines.move_to_end(shard)
                return engine
            self._engines.pop(shard)
            engine.dispose()
        # pool_size 1 is the kept connection; Dagster's _initdb reflects through a second one
        engine = sa.create_engine(self.conn_string_for_shard(shard), poolclass=sa.pool.QueuePool, pool_size=1,
                                  max_overflow=2, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS})
        pragmas = [f"PRAGMA synchronous={self.synchronous}"]
        sa.event.listen(engine, "connect", functools.partial(_on_connect, pragmas))
        self._engines[shard] = (engine, None)
        runs = [s for s in self._engines if s != INDEX_SHARD_NAME]
        for old in runs[:-KEPT_RUN_SHARDS] if len(runs) > KEPT_RUN_SHARDS else ():
            self._engines.pop(old)[0].dispose()
        return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[sa.Connection]:
        with self._db_lock:
            engine = self._engine(shard)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                if self._engines[shard][1] is None:  # the file exists now: remember which one
                    self._engines[shard] = (engine, self._file_id(shard))
                yield conn

    def _initdb(self, engine: sa.Engine, for_index_shard: bool = False) -> None:
        """Create a new run database as the stock ``_initdb`` does — Dagster's event-log
        tables, WAL mode, the alembic version table stamped at Dagster's head revision —
        by writing a copy of a database made so once per process tree (:func:`run_template`):
        the stock method reads Dagster's ~90 alembic migration modules at each new database
        (about 70 ms a run here, the largest part of a run's start); with the tables
        created instead of copied, a new run database and its first event took about
        40 ms, and take about 5 ms copied.
        The copy is placed with a hard link, which never replaces a file: when the
        database appeared meanwhile (another process), it is opened as it is. A database
        already stamped is left as it is, as the stock class does. The index database,
        and any error, go to the stock method, which retries."""
        if for_index_shard:
            super()._initdb(engine, for_index_shard=True)
            return
        path = engine.url.database
        try:
            if path and not os.path.exists(path) and _place_run_template(path):
                return
            with engine.connect() as conn:
                context = MigrationContext.configure(conn)
                if context.get_current_revision() is not None:
                    return
                if sa.inspect(conn).get_table_names():  # tables without a stamp: the stock rules
                    raise _Fallback
                _create_run_tables(conn, context)
        except (_Fallback, sa.exc.DatabaseError, OSError):
            super()._initdb(engine)

    def watch(self, run_id: str, cursor: str | None, callback) -> None:
        """Call ``callback(event, cursor)`` for each new event of run ``run_id`` after
        ``cursor``, as the stock method does, when the run's ``.db`` file or its WAL file
        changes (the stock watch follows the ``.db`` file only; see the module docstring)."""
        if not self._obs:
            self._obs = Observer()
            self._obs.start()
        handler = _RunWalWatchdog(self, run_id, callback, cursor)
        self._watchers[run_id][callback] = (handler, self._obs.schedule(handler, self._base_dir, recursive=True))

    def end_watch(self, run_id: str, handler) -> None:  # noqa: D102 (the stock method, plus the re-read's end)
        kept = self._watchers[run_id].get(handler)
        super().end_watch(run_id, handler)
        if kept is not None and isinstance(kept[0], _RunWalWatchdog):
            kept[0].stop()

    def store_event(self, event) -> None:
        """Store ``event`` as the stock method does; after the event that ends a run
        (success, failure, cancellation), checkpoint the run's WAL into its ``.db`` file
        (``PRAGMA wal_checkpoint(PASSIVE)``: it waits for no reader), so a process that
        reads or watches the ``.db`` file alone has the whole run, though this process
        keeps the connection open (see the module docstring)."""
        super().store_event(event)
        if event.is_dagster_event and event.dagster_event_type in _RUN_ENDS:
            with self._db_lock:
                with self._engine(event.run_id).connect() as conn:
                    conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    def has_dynamic_partition(self, partitions_def_name: str, partition_key: str) -> bool:
        """Whether ``partition_key`` is a partition of the dynamic partitions definition
        ``partitions_def_name``: the stock query (the ``dynamic_partitions`` row of that
        name and key, ``LIMIT 1``) as one statement built once (:data:`_HAS_DYNAMIC_PARTITION`)
        instead of at every call. Dagster asks it for every dimension of a partition key
        it checks (the run's key, each partitioned input's subset): about 1,700 times in a
        ``default`` run, 0.15–0.28 ms a call with the statement built each time against
        0.04 ms. Nothing is cached; each call reads the table."""
        self._check_partitions_table()
        with self.index_connection() as conn:
            row = conn.execute(_HAS_DYNAMIC_PARTITION, {"name": partitions_def_name, "key": partition_key}).first()
        return row is not None

    def _get_assets_details(self, asset_keys):
        """The ``AssetDetails`` (last wipe time) of each of ``asset_keys`` (None for a key
        with no row or no details), in their order: the stock query (``asset_key`` and
        ``asset_details`` of the ``asset_keys`` rows with those keys) as one statement built
        once (:data:`_ASSET_DETAILS`, the keys an expanding parameter), and the stock
        reading of its rows. Every read of an asset's events asks it first, for the wipe
        filter (the latest materialization of a partition, a check's target, the data
        versions of a step's inputs): about 1,500 times in a ``default`` run. Nothing is
        cached; each call reads the table."""
        check.sequence_param(asset_keys, "asset_key", AssetKey)  # the stock method's argument check
        names = [k.to_string() for k in asset_keys]
        with self.index_connection() as conn:
            rows = conn.execute(_ASSET_DETAILS, {"keys": names}).fetchall()
        details = {key: deserialize_value(value, AssetDetails) if value else None for key, value in rows}
        return [details.get(name) for name in names]

    def _wiped(self, asset_key: AssetKey) -> bool:
        """Whether ``asset_key`` has a wipe time (its events before it are filtered out):
        the statements built once leave such an asset to the stock methods."""
        details = self._get_assets_details([asset_key])[0]
        return details is not None and bool(details.last_wipe_timestamp)

    def get_latest_tags_by_partition(self, asset_key, event_type, tag_keys, asset_partitions=None,
                                     before_cursor=None, after_cursor=None):
        """``{partition: {tag: value}}`` of the latest ``event_type`` event of each of
        ``asset_partitions`` of ``asset_key``, for the indexed ``tag_keys``, as the stock
        method answers it. Named partitions without a cursor, of an asset never wiped (the
        asked case: a step's input data versions, Dagster's and ours) are read with one
        statement built once (:data:`_LATEST_TAGS_BY_PARTITION`; Dagster's own query for
        that case): about 800 calls in a ``default`` run, 0.58 ms each with the statement
        built at each call against 0.16 ms with the wipe details. Any other case is the
        stock method's (which also refuses tags Dagster does not index). Nothing is cached."""
        check.inst_param(asset_key, "asset_key", AssetKey)  # the stock method's argument checks
        check.inst_param(event_type, "event_type", DagsterEventType)
        check.sequence_param(tag_keys, "tag_keys", of_type=str)
        check.opt_nullable_sequence_param(asset_partitions, "asset_partitions", of_type=str)
        if (not asset_partitions or before_cursor is not None or after_cursor is not None or not tag_keys
                or len(tag_keys) != len(self.get_asset_tags_to_index(set(tag_keys)))):
            return super().get_latest_tags_by_partition(asset_key, event_type, tag_keys, asset_partitions,
                                                        before_cursor, after_cursor)
        if self._wiped(asset_key):
            return super().get_latest_tags_by_partition(asset_key, event_type, tag_keys, asset_partitions)
        with self.index_connection() as conn:
            rows = conn.execute(_LATEST_TAGS_BY_PARTITION, {
                "asset_key": asset_key.to_string(), "partitions": list(asset_partitions),
                "event_type": event_type.value, "tag_keys": list(tag_keys)}).fetchall()
        out: dict[str, dict[str, str]] = {}
        for partition, key, value in rows:
            out.setdefault(partition, {})[key] = value
        return out

    def fetch_materializations(self, records_filter, limit: int, cursor: str | None = None, ascending: bool = False):
        """The materialization records of ``records_filter``, as the stock method returns
        them (records, cursor, ``has_more``). An ``AssetRecordsFilter`` naming partitions
        and nothing else, without a cursor, of an asset never wiped (the asked case: each
        asset check's target, the latest materialization of a step's partition) is read
        with one statement built once (:data:`_EVENTS_IN_PARTITIONS`; Dagster's own query
        for that case) and each row read back as the stock method reads it: about 500
        calls in a ``default`` run. Any other case is the stock method's. Nothing is cached."""
        f = records_filter
        if (not isinstance(f, AssetRecordsFilter) or cursor is not None or not f.asset_partitions
                or not isinstance(limit, int) or not isinstance(ascending, bool) or not limit
                or any(x is not None for x in (f.after_timestamp, f.before_timestamp, f.after_storage_id,
                                               f.before_storage_id, f.storage_ids))):
            return super().fetch_materializations(records_filter, limit, cursor, ascending)
        enforce_max_records_limit(limit)
        if self._wiped(f.asset_key):
            return super().fetch_materializations(records_filter, limit, cursor, ascending)
        with self.index_connection() as conn:
            rows = conn.execute(_EVENTS_IN_PARTITIONS[bool(ascending)], {
                "event_type": DagsterEventType.ASSET_MATERIALIZATION.value, "asset_key": f.asset_key.to_string(),
                "partitions": list(f.asset_partitions), "limit": limit}).fetchall()
        return _records_result(rows, limit)

    def has_secondary_index(self, name: str) -> bool:
        """Whether Dagster's data migration ``name`` of the index database is complete, as
        the stock class answers it (a row of ``secondary_indexes`` with a completion time),
        a true answer remembered as :meth:`has_table` remembers a table: a completed
        migration stays complete (Dagster's PostgreSQL and consolidated SQLite storages
        keep every answer for the process). Asked at every asset record read and asset
        event stored; about 380 times in a ``default`` run."""
        return self._remembered(f"secondary index {name}",
                                lambda: super(PooledSqliteEventLogStorage, self).has_secondary_index(name))

    def has_table(self, table_name: str) -> bool:
        """Whether the index database has ``table_name``, as the stock class answers it (a
        new engine and an inspection of the schema), with each table found remembered
        while the index database is the same file: Dagster adds tables (``upgrade``, its
        migrations) and never drops one (``wipe`` deletes rows), and it asks for several
        tables per stored event (``store_event``: the partitions and asset-event tag
        tables). The file is known by device, inode and status-change time, so a file
        put in its place (even on a reused inode) or changed by a checkpoint is asked
        again; so is a table not found."""
        return self._remembered(f"table {table_name}", lambda: super(PooledSqliteEventLogStorage, self).has_table(table_name))

    def _has_asset_key_col_on_connection(self, conn, column_name: str) -> bool:
        """Whether the index database's ``asset_keys`` table has ``column_name``, as the
        stock class answers it (an inspection of the table's columns), remembered as
        :meth:`has_table` remembers a table: Dagster asks it at every asset record read and
        asset event stored (whether the asset status cache and the materialization
        columns exist), about 10 ms of schema reflection each time here."""
        return self._remembered(f"asset_keys.{column_name}", lambda: super(PooledSqliteEventLogStorage, self)
                                ._has_asset_key_col_on_connection(conn, column_name))

    def _remembered(self, name: str, ask) -> bool:
        """:meth:`_TrueAnswers.ask` for the index database (see :meth:`has_table`)."""
        return self._schema_answers.ask(self.path_for_shard(INDEX_SHARD_NAME), name, ask)

    def _close_engines_locked(self) -> None:
        while self._engines:
            self._engines.popitem()[1][0].dispose()

    def _close_engines(self) -> None:
        with self._db_lock:
            self._close_engines_locked()

    def wipe(self) -> None:  # the stock wipe deletes the run databases' files
        self._close_engines()
        super().wipe()

    def upgrade(self) -> None:
        self._close_engines()
        super().upgrade()

    def dispose(self) -> None:
        super().dispose()  # the file watcher first: a running callback may still read
        self._close_engines()


def _records_result(rows, limit: int):
    """``(id, event)`` rows of the event log as the stock storage returns them
    (``SqlEventLogStorage._get_event_records`` and ``_get_event_records_result`` without a
    cursor): each event read back (a row that is not an event, or not JSON, skipped with
    the stock warning), the cursor after the last record (or the stock empty cursor), and
    ``has_more`` when the limit was reached."""
    records = []
    for row_id, json_str in rows:
        try:
            entry = deserialize_value(json_str, NamedTuple)
            if not isinstance(entry, EventLogEntry):
                logging.warning("Could not resolve event record as EventLogEntry for id `%s`.", row_id)
                continue
            records.append(EventLogRecord(storage_id=row_id, event_log_entry=entry))
        except seven.JSONDecodeError:
            logging.warning("Could not parse event record id `%s`.", row_id)
    cursor = EventLogCursor.from_storage_id(records[-1].storage_id if records else -1).to_string()
    return EventRecordsResult(records, cursor=cursor, has_more=len(records) == limit)


class PooledSqliteRunStorage(SqliteRunStorage):
    """:class:`SqliteRunStorage` (``history/runs.db``) with one kept engine and pooled
    connection instead of a new engine and connection for every read and write (the stock
    ``connect`` builds an engine each time: about 1.4 s of CPU over a ``default`` run's
    74 runs here), and its schema checks remembered.

    Same database, schema and queries as the stock class. Every use of the connection
    holds the storage's lock; before any ``fork`` the connection is closed (as the event
    log's, :func:`_before_fork`), and a database file replaced or deleted under it is
    noticed by its inode at the next use and opened again. A run's end checkpoints the
    WAL (:meth:`handle_run_event`). ``has_run_stats_index_cols``
    and ``has_backfill_id_column`` (a reflection of the ``runs`` table's columns, asked
    at every run created and updated) remember a true answer while the database is the
    same file (device, inode and status-change time; Dagster's migrations add columns
    and never drop one); ``upgrade``, ``wipe`` and ``dispose`` close the connection and
    forget the answers."""

    def __init__(self, conn_string: str, inst_data: ConfigurableClassData | None = None):
        super().__init__(conn_string, inst_data)
        self._db_lock = threading.RLock()
        self._kept: tuple[sa.Engine, tuple[int, int] | None] | None = None
        self._schema_answers = _TrueAnswers()
        _LIVE.add(self)

    def _file_id(self) -> tuple[int, int] | None:
        try:
            st = os.stat(sa.engine.make_url(self._conn_string).database)
        except (FileNotFoundError, TypeError):
            return None
        return st.st_dev, st.st_ino

    @contextmanager
    def connect(self) -> Iterator[sa.Connection]:  # noqa: D102 (the stock method, on a kept engine)
        with self._db_lock:
            fid = self._file_id()
            if self._kept is not None and (fid is None or self._kept[1] != fid):
                self._close_engines_locked()
            if self._kept is None:
                self._kept = (sa.create_engine(self._conn_string, poolclass=sa.pool.QueuePool, pool_size=1,
                                               max_overflow=2), fid)
            engine = self._kept[0]
            with engine.connect() as conn, conn.begin():
                if self._kept[1] is None:
                    self._kept = (engine, self._file_id())
                yield conn

    def _remembered(self, name: str, ask) -> bool:
        return self._schema_answers.ask(sa.engine.make_url(self._conn_string).database, name, ask)

    def handle_run_event(self, run_id: str, event, update_timestamp=None) -> None:
        """As the stock method; after the event that ends a run (success, failure,
        cancellation) the WAL is checkpointed into ``runs.db`` (``PASSIVE``: it waits for no
        reader), so a copy of the ``.db`` file alone has every finished run although the
        connection stays open (the stock class checkpoints whenever its last connection
        closes, after every call)."""
        super().handle_run_event(run_id, event, update_timestamp)
        if event.event_type in _RUN_ENDS:
            with self.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    def has_run_stats_index_cols(self) -> bool:  # noqa: D102 (the stock answer, remembered: class docstring)
        return self._remembered("runs.start_time+end_time", super().has_run_stats_index_cols)

    def has_backfill_id_column(self) -> bool:  # noqa: D102 (the stock answer, remembered: class docstring)
        return self._remembered("runs.backfill_id", super().has_backfill_id_column)

    def _close_engines_locked(self) -> None:
        if self._kept is not None:
            self._kept[0].dispose()
            self._kept = None

    def _close_engines(self) -> None:
        with self._db_lock:
            self._close_engines_locked()
            self._schema_answers = _TrueAnswers()

    def upgrade(self) -> None:  # noqa: D102
        self._close_engines()
        super().upgrade()

    def wipe(self) -> None:  # noqa: D102
        super().wipe()
        self._close_engines()

    def dispose(self) -> None:  # noqa: D102
        super().dispose()
        self._close_engines()


#: Seconds after a change of a run's WAL file at which its watch reads the run again:
#: SQLite writes a commit's pages to the WAL (the change the watch sees) before it makes
#: the commit visible in the WAL index (shared memory: no file change), so a read right at
#: the change can miss that commit.
WAL_RECHECK_SECONDS = 0.25


class _RunWalWatchdog(SqliteEventLogStorageWatchdog):
    """Dagster's run watchdog, fired by changes of the run's ``.db`` file or of its
    write-ahead log (``.db-wal``): a commit reaches the log at once and the ``.db`` file
    at the next checkpoint. Each change is read at once and once more
    :data:`WAL_RECHECK_SECONDS` later (one pending re-read at a time); reads are serialized."""

    def __init__(self, storage: SqliteEventLogStorage, run_id: str, callback, cursor: str | None):
        super().__init__(storage, run_id, callback, cursor)
        self._patterns = [self._log_path, self._log_path + "-wal"]
        self._read_lock = threading.Lock()
        self._timer_lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.stopped = False

    def _read(self) -> None:
        with self._read_lock:
            if not self.stopped:
                self._process_log()

    def _reread(self) -> None:
        with self._timer_lock:
            self._timer = None
        self._read()

    def on_modified(self, event) -> None:  # the stock handler asserts the .db path
        self._read()
        with self._timer_lock:
            if self._timer is None and not self.stopped:
                self._timer = threading.Timer(WAL_RECHECK_SECONDS, self._reread)
                self._timer.daemon = True
                self._timer.start()

    def stop(self) -> None:
        """No further read (the watch ended); a pending re-read is cancelled."""
        with self._timer_lock:
            self.stopped = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None


class _Fallback(Exception):
    """A database :meth:`PooledSqliteEventLogStorage._initdb` leaves to the stock method."""


_SCRIPTS: list[ScriptDirectory] = []


def _scripts() -> ScriptDirectory:
    """Dagster's alembic revision scripts for the event log (the configuration the stock
    ``_initdb`` builds), loaded once per process; alembic keeps the revision map it reads
    on the object."""
    if not _SCRIPTS:
        _SCRIPTS.append(ScriptDirectory.from_config(get_alembic_config(sqlite_event_log.__file__)))
    return _SCRIPTS[0]


def _create_run_tables(conn: sa.Connection, context: MigrationContext) -> None:
    """Dagster's event-log tables, WAL mode and the alembic stamp at Dagster's head, as
    the stock ``_initdb`` makes a run database, on the empty database of ``conn``."""
    SqlEventLogStorageMetadata.create_all(conn)
    conn.execute(sa.text("PRAGMA journal_mode=WAL;"))
    context.stamp(_scripts(), "head")
    conn.commit()


#: The bytes of the empty run database (:func:`run_template`), once made.
_TEMPLATE: list[bytes] = []


def run_template() -> bytes:
    """The bytes of an empty run database (:func:`_create_run_tables`; WAL mode is recorded
    in its header, and no ``-wal`` file is left), made in a temporary directory removed at
    once and kept in memory (about 110 kB): a worker forked from the fork server ends with
    ``os._exit``, so nothing may be left for exit handlers. Made once per process tree:
    the bytes depend on Dagster's schema alone, so a forked child uses its parent's. The
    fork server makes them before its first fork (:mod:`megacpp_assets.fork_preload`), and
    ``megacpp run`` while it waits for the server: without them, the first run of each
    process made them on its way to its first step (about 35 ms, and more than half of the
    first run's start in a worker). Raises what SQLite and alembic raise."""
    if _TEMPLATE:
        return _TEMPLATE[0]
    with tempfile.TemporaryDirectory(prefix="megacpp-rundb-") as d:
        path = os.path.join(d, "run.db")
        engine = sa.create_engine(f"sqlite:///{path}", poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as conn:
                _create_run_tables(conn, MigrationContext.configure(conn))
        finally:
            engine.dispose()
        with open(path, "rb") as f:
            data = f.read()
    _TEMPLATE[:] = [data]
    return data


def _place_run_template(path: str) -> bool:
    """Write the process's run-database template to ``path`` unless a file is there: the
    copy is written beside it, then hard-linked to ``path`` (``FileExistsError`` when
    another process placed one first). True when this call placed it."""
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "wb") as f:
        f.write(run_template())
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


#: Every pooled event log of this process, for the fork hooks below.
_LIVE: weakref.WeakSet[PooledSqliteEventLogStorage | PooledSqliteRunStorage] = weakref.WeakSet()
_HELD: list[PooledSqliteEventLogStorage | PooledSqliteRunStorage] = []


def _before_fork() -> None:
    """Close every kept connection before ``fork`` (SQLite: an open connection must not be
    carried into a child); each storage's lock is held until the fork is done."""
    for storage in list(_LIVE):
        storage._db_lock.acquire()
        _HELD.append(storage)
        storage._close_engines_locked()


def _after_fork() -> None:
    while _HELD:
        _HELD.pop()._db_lock.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)


def _on_connect(pragmas: list[str], dbapi_connection, _record) -> None:
    """Set a new connection's ``pragmas`` (the ``synchronous`` level)."""
    for pragma in pragmas:
        dbapi_connection.execute(pragma)


class PooledSqliteStorage(DagsterSqliteStorage):
    """Dagster's SQLite instance storage (runs, event logs, schedules under ``base_dir``,
    Dagster's layout) with :class:`PooledSqliteEventLogStorage` as its event log and
    :class:`PooledSqliteRunStorage` as its run storage.

    Configured as ``storage: custom: {module: megacpp_assets.instance_storage, class:
    PooledSqliteStorage, config: {base_dir: {env: DAGSTER_HOME}}}``; an optional
    ``synchronous: FULL`` (or ``EXTRA``, or ``"OFF"`` quoted: YAML reads a bare ``OFF`` as
    false) replaces the event log's default :data:`DEFAULT_SYNCHRONOUS`.
    """

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None,
                 synchronous: str = DEFAULT_SYNCHRONOUS):
        events = PooledSqliteEventLogStorage(_event_logs_directory(base_dir), synchronous=synchronous)
        super().__init__(base_dir, inst_data=inst_data)  # creates or migrates runs.db as the stock class does
        self._event_log_storage.dispose()
        self._event_log_storage = events
        stock = self._run_storage
        self._run_storage = PooledSqliteRunStorage(stock._conn_string, stock.inst_data)
        stock.dispose()

    @classmethod
    def config_type(cls):  # noqa: D102
        return {"base_dir": StringSource,
                "synchronous": Field(Enum("SqliteSynchronous", [EnumValue(v) for v in SYNCHRONOUS_LEVELS]),
                                     is_required=False, default_value=DEFAULT_SYNCHRONOUS)}

    @classmethod
    def from_config_value(cls, inst_data, config_value) -> PooledSqliteStorage:  # noqa: D102
        config = dict(config_value)
        base_dir, synchronous = config.pop("base_dir"), config.pop("synchronous", DEFAULT_SYNCHRONOUS)
        os.makedirs(base_dir, exist_ok=True)  # as the stock from_local
        return cls(base_dir, inst_data=inst_data, synchronous=synchronous)
