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
  ``.db`` file when the WAL is checkpointed, which the stock class gets by closing its
  connection after each write. A kept run connection is set to checkpoint after every
  commit (``PRAGMA wal_autocheckpoint=1``), so the watcher sees each write as before.
- **Threads and processes.** Every use of a connection holds the storage's own lock, as the
  stock class does; a process that inherits the storage by ``fork`` opens its own
  connections (engines are per process id); ``wipe``, ``upgrade`` and ``dispose`` close
  them first.

The instance configuration that selects it (``storage: custom:``, see
:data:`megacpp_assets.cli.DAGSTER_YAML`) keeps Dagster's layout under ``DAGSTER_HOME``:
``history/`` (runs), ``history/runs/`` (event logs), ``schedules/``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
import yaml
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    INDEX_SHARD_NAME,
    SQLITE_BUSY_TIMEOUT_SECONDS,
    SqliteEventLogStorage,
)
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage, _event_logs_directory
from dagster._serdes import ConfigurableClassData

#: Run databases whose engine a process keeps (least recently used closed first). A
#: process writes one run at a time (``megacpp run`` executes a job in process; a worker
#: runs one job after another), and reads a few; the index database is always kept.
KEPT_RUN_SHARDS = 4


class PooledSqliteEventLogStorage(SqliteEventLogStorage):
    """:class:`SqliteEventLogStorage` with one kept engine and connection per database.

    Same configuration as the stock class (``base_dir``: the directory of the per-run
    ``RUN_ID.db`` files and ``index.db``). Engines: the index database's for the life of
    the storage, and up to :data:`KEPT_RUN_SHARDS` run databases'. Raises what the stock
    class raises (``sqlite3`` / SQLAlchemy errors; ``database is locked`` after
    Dagster's busy timeout).
    """

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self._engines: OrderedDict[str, sa.Engine] = OrderedDict()
        self._engines_pid = os.getpid()
        super().__init__(base_dir, inst_data=inst_data)

    @classmethod
    def from_config_value(cls, inst_data, config_value) -> PooledSqliteEventLogStorage:  # noqa: D102
        return cls(inst_data=inst_data, **config_value)

    def _engine(self, shard: str) -> sa.Engine:
        """The kept engine of ``shard`` (created on first use); call with ``_db_lock`` held."""
        if self._engines_pid != os.getpid():  # a forked copy: its parent's connections are not ours
            for engine in self._engines.values():
                engine.dispose(close=False)
            self._engines.clear()
            self._engines_pid = os.getpid()
        engine = self._engines.get(shard)
        if engine is not None:
            self._engines.move_to_end(shard)
            return engine
        # pool_size 1 is the kept connection; Dagster's _initdb reflects through a second one
        engine = sa.create_engine(self.conn_string_for_shard(shard), poolclass=sa.pool.QueuePool, pool_size=1,
                                  max_overflow=2, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS})
        if shard != INDEX_SHARD_NAME:
            sa.event.listen(engine, "connect", _checkpoint_each_commit)
        self._engines[shard] = engine
        runs = [s for s in self._engines if s != INDEX_SHARD_NAME]
        for old in runs[:-KEPT_RUN_SHARDS] if len(runs) > KEPT_RUN_SHARDS else ():
            self._engines.pop(old).dispose()
        return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[sa.Connection]:
        with self._db_lock:
            engine = self._engine(shard)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def _close_engines(self) -> None:
        with self._db_lock:
            while self._engines:
                self._engines.popitem()[1].dispose()

    def wipe(self) -> None:  # the stock wipe deletes the run databases' files
        self._close_engines()
        super().wipe()

    def upgrade(self) -> None:
        self._close_engines()
        super().upgrade()

    def dispose(self) -> None:
        self._close_engines()
        super().dispose()


def _checkpoint_each_commit(dbapi_connection, _record) -> None:
    """Checkpoint a run database's WAL into its ``.db`` file after every commit, which the
    stock storage gets by closing its connection (see the module docstring)."""
    dbapi_connection.execute("PRAGMA wal_autocheckpoint=1")


class PooledSqliteStorage(DagsterSqliteStorage):
    """Dagster's SQLite instance storage (runs, event logs, schedules under ``base_dir``,
    Dagster's layout) with :class:`PooledSqliteEventLogStorage` as its event log.

    Configured as ``storage: custom: {module: megacpp_assets.instance_storage, class:
    PooledSqliteStorage, config: {base_dir: {env: DAGSTER_HOME}}}``.
    """

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        super().__init__(base_dir, inst_data=inst_data)
        self._event_log_storage.dispose()
        self._event_log_storage = PooledSqliteEventLogStorage(_event_logs_directory(base_dir))

    @classmethod
    def from_config_value(cls, inst_data, config_value) -> PooledSqliteStorage:  # noqa: D102
        return cls.from_local(inst_data=inst_data, **config_value)

    @property
    def event_storage_data(self) -> ConfigurableClassData:  # noqa: D102
        return ConfigurableClassData(__name__, PooledSqliteEventLogStorage.__name__,
                                     yaml.dump({"base_dir": _event_logs_directory(self.base_dir)}, default_flow_style=False))
