"""The garbage collector of a ``megacpp run`` process and of its fork server: off while
they import and build their state, those objects then frozen out of later full
collections, the collector on again for the run and in every worker
(:func:`megacpp_assets.cli.startup_gc`, :mod:`megacpp_assets.fork_preload`)."""

from __future__ import annotations

import gc
import os

import pytest

from .conftest import environ, make_data_root, write_instance_config


@pytest.fixture(autouse=True)
def _collector_restored():
    enabled = gc.isenabled()
    gc.unfreeze()  # each test starts with nothing frozen (a test before may have loaded ScanCode's index)
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_startup_gc_is_off_until_settled_then_freezes_and_gives_everything_back():
    from megacpp_assets.cli import startup_gc

    gc.enable()
    with startup_gc() as settled:
        assert not gc.isenabled()  # start-up: no automatic collection
        kept = [[i] for i in range(5_000)]  # long-lived start-up state
        settled()
        assert gc.isenabled()
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)  # out of every later full collection
        later = [[i] for i in range(2_000)]  # made after the freeze: a second freeze would take them
        settled()  # a second call changes nothing: no second freeze, no thaw
        # (reference counting may still free a few frozen objects meanwhile, e.g. those other
        # threads of the test process drop; a freeze would grow the count, a thaw empty it)
        assert gc.isenabled() and frozen - 1000 < gc.get_freeze_count() <= frozen and len(later) == 2_000
    assert gc.isenabled() and gc.get_freeze_count() == 0  # given back to the collector


def test_startup_gc_collects_start_ups_garbage_before_the_freeze():
    """A garbage cycle start-up made is collected when settling (the youngest generation
    holds all of start-up's objects), not frozen for the rest of the run."""
    import weakref

    from megacpp_assets.cli import startup_gc

    class Node:
        pass

    gc.enable()
    with startup_gc() as settled:
        kept, dropped = Node(), Node()
        kept.me, dropped.me = kept, dropped  # two cycles; only the second becomes garbage
        alive, gone = weakref.ref(kept), weakref.ref(dropped)
        del dropped
        assert gone() is not None  # the collector is off: the cycle is still there
        settled()
        assert gone() is None and alive() is kept


def test_startup_gc_restores_the_collector_after_an_error_or_without_settling():
    from megacpp_assets.cli import startup_gc

    gc.enable()
    with pytest.raises(RuntimeError):
        with startup_gc():
            raise RuntimeError("start-up failed")
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()  # a caller that had it off keeps it off, settled or not
    with startup_gc() as settled:
        settled()
        assert not gc.isenabled() and gc.get_freeze_count() > 0
    assert not gc.isenabled() and gc.get_freeze_count() == 0


def test_startup_gc_leaves_a_process_that_froze_its_own_objects_as_it_was():
    from megacpp_assets.cli import startup_gc

    gc.enable()
    gc.freeze()  # the process's own frozen state (a fork server's, an embedding program's)
    before = gc.get_freeze_count()
    assert before > 0
    # refcounting may still free a few frozen objects (the count shrinks by them); a thaw
    # (gc.unfreeze) would empty the permanent generation, a freeze would grow it
    with startup_gc() as settled:
        settled()
        assert gc.isenabled() and before - 1000 < gc.get_freeze_count() <= before
    assert gc.isenabled() and before - 1000 < gc.get_freeze_count() <= before  # not thawed by the block


def test_run_snapshot_runs_its_passes_with_the_start_up_frozen_and_leaves_the_collector_as_found(
        tmp_path, monkeypatch):
    """The passes start with the collector on and Dagster's objects (the asset graph, the
    instance) frozen; afterwards the process's collector is as it was, nothing frozen."""
    from dagster import DagsterInstance

    from megacpp_assets import snapshot_run
    from megacpp_assets.cli import run_snapshot

    seen = {}

    def passes(run, workers):
        seen.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count(), jobs=run.snapshot_job is not None)
        return True

    monkeypatch.setattr(snapshot_run, "run_passes", passes)
    root = make_data_root(tmp_path / "root")
    home = tmp_path / "home"
    home.mkdir()
    write_instance_config(home)
    saved = os.environ.get("MEGACPP_DATA_ROOT")
    gc.enable()
    try:
        with environ(DAGSTER_HOME=str(home)), DagsterInstance.get() as instance:
            assert run_snapshot("tiny", str(root), instance=instance) == 0
    finally:
        if saved is None:
            os.environ.pop("MEGACPP_DATA_ROOT", None)
        else:
            os.environ["MEGACPP_DATA_ROOT"] = saved
    assert seen["jobs"] and seen["enabled"]
    assert seen["frozen"] > 100_000  # Dagster, the stages and the asset graph
    assert gc.isenabled() and gc.get_freeze_count() == 0
