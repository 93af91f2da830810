"""Shared fixtures: the ``tiny`` snapshot materialized once per session through Dagster.

Downloaded sdists are cached under ``data/cache`` at the project root (the data root's
content-addressed cache), so only the first run of the suite reaches the package index.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
SHARED_CACHE = PROJECT / "data" / "cache"


def make_data_root(base: Path) -> Path:
    """A fresh data root whose ``cache`` is the shared, persistent sdist cache."""
    base.mkdir(parents=True, exist_ok=True)
    SHARED_CACHE.mkdir(parents=True, exist_ok=True)
    link = base / "cache"
    if not link.exists():
        link.symlink_to(SHARED_CACHE, target_is_directory=True)
    return base


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """Run ``megacpp run --corpus tiny`` through Dagster into a temporary data root.

    Yields ``(data_root, instance)``; the instance holds the runs and materializations.
    """
    from dagster import DagsterInstance

    from megacpp_assets.cli import run_snapshot

    root = make_data_root(tmp_path_factory.mktemp("tiny-root"))
    home = tmp_path_factory.mktemp("dagster-home")
    old = {k: os.environ.get(k) for k in ("DAGSTER_HOME", "MEGACPP_DATA_ROOT")}
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        with DagsterInstance.get() as instance:
            rc = run_snapshot("tiny", str(root), instance=instance)
            assert rc == 0, "megacpp run --corpus tiny failed"
            yield root, instance
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
