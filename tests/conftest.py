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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_data_root(base: Path) -> Path:
    """A fresh data root whose ``cache`` is the shared, persistent sdist cache."""
    base.mkdir(parents=True, exist_ok=True)
    SHARED_CACHE.mkdir(parents=True, exist_ok=True)
    link = base / "cache"
    if not link.exists():
        link.symlink_to(SHARED_CACHE, target_is_directory=True)
    return base


@contextlib.contextmanager
def materialized_tiny(tmp_path_factory, label: str):
    """Run ``megacpp run --corpus tiny`` through Dagster into a fresh data root and
    Dagster home (named after ``label``); yields ``(data_root, instance)``."""
    from dagster import DagsterInstance

    from megacpp_assets.cli import run_snapshot

    root = make_data_root(tmp_path_factory.mktemp(f"{label}-root"))
    home = tmp_path_factory.mktemp(f"{label}-dagster-home")
    old = {k: os.environ.get(k) for k in ("DAGSTER_HOME", "MEGACPP_DATA_ROOT")}
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        with DagsterInstance.get() as instance:
            assert run_snapshot("tiny", str(root), instance=instance) == 0, "megacpp run --corpus tiny failed"
            yield root, instance
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The ``tiny`` snapshot materialized once per session; yields ``(data_root, instance)``."""
    with materialized_tiny(tmp_path_factory, "tiny") as run:
        yield run
