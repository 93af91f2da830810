"""Shared fixtures: the ``tiny`` snapshot materialized once per session through Dagster.

Downloaded sdists are cached under ``data/cache`` at the project root (the data root's
content-addressed cache), so only the first run of the suite reaches the package index.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
SHARED_CACHE = PROJECT / "data" / "cache"


@contextlib.contextmanager
def environ(**values: str):
    """Set environment variables for a block; the old values (or their absence) come back."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_instance_config(home: Path) -> None:
    """Give the Dagster home ``home`` the instance configuration ``megacpp run`` writes
    (SQLite storage with the pooled event log, :mod:`megacpp_assets.instance_storage`)."""
    from megacpp_assets.cli import DAGSTER_YAML

    (home / "dagster.yaml").write_text(DAGSTER_YAML)


def make_data_root(base: Path) -> Path:
    """A fresh data root whose ``cache`` is the shared, persistent sdist cache."""
    base.mkdir(parents=True, exist_ok=True)
    SHARED_CACHE.mkdir(parents=True, exist_ok=True)
    link = base / "cache"
    if not link.exists():
        link.symlink_to(SHARED_CACHE, target_is_directory=True)
    return base


def copy_of_tiny(tiny_run, tmp_path: Path) -> Path:
    """A data root at ``tmp_path/root`` holding a copy of the session ``tiny`` run's
    snapshots (symbolic links kept) and a link to its sdist cache, for tests that write."""
    import shutil

    root, _ = tiny_run
    copy = tmp_path / "root"
    shutil.copytree(root / "snapshots", copy / "snapshots", symlinks=True)
    (copy / "cache").symlink_to((root / "cache").resolve(), target_is_directory=True)
    return copy


@contextlib.contextmanager
def materialized_tiny(tmp_path_factory, label: str):
    """Run ``megacpp run --corpus tiny`` through Dagster into a fresh data root and
    Dagster home (named after ``label``); yields ``(data_root, instance)``."""
    from dagster import DagsterInstance

    from megacpp_assets.cli import run_snapshot

    root = make_data_root(tmp_path_factory.mktemp(f"{label}-root"))
    home = tmp_path_factory.mktemp(f"{label}-dagster-home")
    write_instance_config(home)
    saved = os.environ.get("MEGACPP_DATA_ROOT")
    with environ(DAGSTER_HOME=str(home)):
        try:
            with DagsterInstance.get() as instance:
                assert run_snapshot("tiny", str(root), instance=instance) == 0, "megacpp run --corpus tiny failed"
                yield root, instance
        finally:  # run_snapshot sets MEGACPP_DATA_ROOT for the process
            if saved is None:
                os.environ.pop("MEGACPP_DATA_ROOT", None)
            else:
                os.environ["MEGACPP_DATA_ROOT"] = saved


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The ``tiny`` snapshot materialized once per session; yields ``(data_root, instance)``."""
    with materialized_tiny(tmp_path_factory, "tiny") as run:
        yield run


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_run):
    """The session ``tiny`` snapshot's layout, its tokenizer (loaded and checked against
    its manifest's sha256) and that sha256: ``(SnapshotLayout, Tokenizer, str)``."""
    import json

    from megacpp_core import tokenizer as tk
    from megacpp_core.layout import SnapshotLayout

    lay = SnapshotLayout(tiny_run[0], "tiny")
    tdir = lay.stage_dir("tokenizer")
    sha = json.loads((tdir / "tokenizer_manifest.json").read_text())["tokenizer_sha256"]
    return lay, tk.load_tokenizer(tdir / "tokenizer.json", sha), sha


#: The bucket of the object-store tests (a moto server on 127.0.0.1).
S3_BUCKET = "megacpp-data"


@pytest.fixture(scope="session")
def s3_env():
    """A real S3 API: moto's ``ThreadedMotoServer`` on 127.0.0.1 with one bucket. Yields
    the environment a client needs (credentials and the endpoint, as a pod would get them)."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ACCESS_KEY_ID": "megacpp-test-key", "AWS_SECRET_ACCESS_KEY": "megacpp-test-secret",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}"}
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                 aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1").create_bucket(Bucket=S3_BUCKET)
    try:
        with environ(**env):
            yield env
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tiny_s3(s3_env, tmp_path_factory):
    """``megacpp run --corpus tiny --data-root s3://megacpp-data/ci`` through the CLI in a
    fresh process; yields ``(data root URL, DAGSTER_HOME)``."""
    import subprocess
    import sys

    home = tmp_path_factory.mktemp("s3-dagster-home")
    url = f"s3://{S3_BUCKET}/ci"
    env = {**os.environ, **s3_env, "DAGSTER_HOME": str(home), "MEGACPP_CACHE_DIR": str(SHARED_CACHE)}
    env.pop("MEGACPP_DATA_ROOT", None)
    r = subprocess.run([sys.executable, "-m", "megacpp_assets.cli", "run", "--corpus", "tiny", "--data-root", url],
                       cwd=PROJECT, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"{url}/snapshots/tiny/packed" in r.stdout
    yield url, home


@pytest.fixture(scope="session")
def fresh_tiny(tmp_path_factory):
    """A ``tiny`` snapshot of its own, for the tests that change code versions and settings
    and re-run it; yields ``(data_root, instance, DAGSTER_HOME)``."""
    with materialized_tiny(tmp_path_factory, "tiny-fresh") as (root, instance):
        yield root, instance, Path(instance.root_directory)
