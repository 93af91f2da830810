"""The production instance on a real PostgreSQL server (from Debian's packages) on 127.0.0.1.

Materializes the ``tiny`` snapshot with run, event-log and schedule storage in PostgreSQL,
using ``k8s/dagster.yaml`` as the instance configuration.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import free_port, make_data_root

PROJECT = Path(__file__).resolve().parent.parent


def _pg_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    assert found, "PostgreSQL server binaries not installed (make test installs Debian's postgresql)"
    return found[-1].parent


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    bin_dir = _pg_bin()
    # The server runs as the `postgres` user when we are root (PostgreSQL refuses root), so
    # its directories live in a fresh directory under the system temp dir it can reach.
    base = Path(tempfile.mkdtemp(prefix="megacpp-pg-"))
    base.chmod(0o755)
    data, sock = base / "data", base / "sock"
    data.mkdir()
    sock.mkdir()
    port = free_port()
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_pg:
        for p in (base, data, sock):
            shutil.chown(p, "postgres")
    subprocess.run(as_pg + [str(bin_dir / "initdb"), "-D", str(data), "-U", "dagster", "--auth=trust"],
                   check=True, capture_output=True)
    subprocess.run(as_pg + [str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(data / "log"), "-w", "start",
                            "-o", f"-h 127.0.0.1 -p {port} -k {sock}"], check=True, capture_output=True)
    try:
        subprocess.run(as_pg + [str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "dagster", "dagster"], check=True, capture_output=True)
        yield port
    finally:
        subprocess.run(as_pg + [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_tiny_snapshot_on_postgres_storage(postgres, tmp_path, monkeypatch):
    from dagster import AssetKey, DagsterInstance

    from megacpp_assets.cli import run_snapshot

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT / "k8s" / "dagster.yaml", home / "dagster.yaml")
    for k, v in {"DAGSTER_HOME": str(home), "DAGSTER_PG_USERNAME": "dagster", "DAGSTER_PG_PASSWORD": "unused",
                 "DAGSTER_PG_HOST": "127.0.0.1", "DAGSTER_PG_DB": "dagster", "DAGSTER_PG_PORT": str(postgres)}.items():
        monkeypatch.setenv(k, v)
    root = make_data_root(tmp_path / "root")
    with DagsterInstance.get() as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
        assert run_snapshot("tiny", str(root), instance=instance) == 0
        # pass 1 per revision: its own assets (with the libclang lane, off in tiny), its one
        # shard, then the snapshot steps; pass 2 per revision: its one shard (chunk, tokenize,
        # family chunks), then its assets reading that shard (repo and structure documents),
        # then the snapshot steps
        assert instance.get_runs_count() == 3 * 2 + 1 + 3 * 2 + 1
        rec = instance.fetch_materializations(AssetKey("megatron_dataset"), limit=1).records
        assert rec and rec[0].event_log_entry.dagster_event.partition == "tiny"
        assert set(instance.get_dynamic_partitions("repo_revision")) >= {"tiny/lz4-4.4.5", "tiny/xxhash-4.1.0"}
