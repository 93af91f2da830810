"""Runs of an asset selection through :class:`megacpp_assets.job_subsets.JobSubsets` (the
selection's in-process job built once per process) are the runs Dagster's
``execute_in_process(asset_selection=…, partition_key=…)`` stores: same job, selection,
tags, snapshots, steps, events and materializations; and the same errors before a run."""

from __future__ import annotations

import pytest
from dagster import AssetKey, DagsterInstance
from dagster._core.snap.job_snapshot import JobSnap

from megacpp_assets.definitions import defs
from megacpp_assets.job_subsets import JobSubsets
from megacpp_assets.snapshot_run import QUIET
from tests.conftest import copy_of_tiny, environ

SHARD = "tiny/lz4-4.4.5|000"
ASSETS = ("quality_files", "license_files", "scrubbed_files")


def _instance():
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("repo_revision", ["tiny/lz4-4.4.5"])
    instance.add_dynamic_partitions("shard", ["000"])
    instance.add_dynamic_partitions("snapshot", ["tiny"])
    return instance


def _run_facts(instance, result):
    """What a run stores, without what differs between any two runs (ids, times, values
    computed from timestamps)."""
    run = instance.get_run_by_id(result.run_id)
    events = [e.dagster_event for e in instance.all_logs(result.run_id) if e.dagster_event is not None]
    mats = sorted((e.asset_key.to_user_string(), e.partition) for e in events
                  if e.event_type_value == "ASSET_MATERIALIZATION")
    checks = sorted((e.asset_check_evaluation_data.asset_key.to_user_string(), e.asset_check_evaluation_data.check_name,
                     e.asset_check_evaluation_data.passed)
                    for e in events if e.event_type_value == "ASSET_CHECK_EVALUATION")
    return {
        "job": run.job_name, "status": run.status, "selection": run.asset_selection,
        "check_selection": run.asset_check_selection, "tags": dict(run.tags),
        "job_snapshot": run.job_snapshot_id, "plan_snapshot": run.execution_plan_snapshot_id,
        "parent": instance.get_job_snapshot(run.job_snapshot_id).lineage_snapshot,
        "events": [(e.event_type_value, e.step_key) for e in events],
        "materializations": mats, "checks": checks,
    }


@pytest.mark.integration
@pytest.mark.parametrize("job_name, key, assets", [
    ("shard_job", SHARD, ASSETS),
    ("revision_job", "tiny/lz4-4.4.5", ("compile_commands", "semantic_graph")),
    ("snapshot_job", "tiny", ("blends", "dataset_card")),  # the last snapshot group with the card
])
def test_a_kept_subset_stores_the_run_execute_in_process_stores(tiny_run, tmp_path, monkeypatch, job_name, key, assets):
    copy = copy_of_tiny(tiny_run, tmp_path)
    job = defs.resolve_job_def(job_name)
    with environ(MEGACPP_DATA_ROOT=str(copy)):
        with _instance() as instance:
            stock = job.execute_in_process(instance=instance, partition_key=key, run_config=QUIET,
                                           raise_on_error=False, asset_selection=[AssetKey(a) for a in assets])
            want = _run_facts(instance, stock)
        with _instance() as instance:
            subsets = JobSubsets(instance)
            first = subsets.execute(job, key, list(assets), QUIET)
            kept = subsets.subset(job, frozenset(AssetKey(a) for a in assets))
            built = []
            real = JobSnap.from_job_def
            with monkeypatch.context() as m:  # the second run builds no job snapshot: its subset and Dagster's re-subset are kept
                m.setattr(JobSnap, "from_job_def", staticmethod(lambda *a, **k: built.append(1) or real(*a, **k)))
                again = subsets.execute(job, key, list(reversed(assets)), QUIET)  # the same selection, another order
            assert built == []
            assert subsets.subset(job, frozenset(AssetKey(a) for a in assets)) is kept  # built once
            got = [_run_facts(instance, r) for r in (first, again)]
    assert stock.success and first.success and again.success
    assert want["selection"] == {AssetKey(a) for a in assets} and want["tags"]["dagster/partition"] == key
    assert want["materializations"] == [(a, key) for a in sorted(assets)]
    assert got[0] == want
    assert got[1] == want


def test_the_same_job_name_in_other_definitions_is_another_job():
    """Subsets are kept per job definition, not per name: a variant of the registry (its
    own definitions, the same job names) gets its own subset."""
    import dataclasses

    from megacpp_assets.definitions import build_definitions
    from megacpp_core.stages import STAGES

    variant = build_definitions(tuple(dataclasses.replace(s, code_version="other") if s.name == "scrub" else s
                                      for s in STAGES)).resolve_job_def("shard_job")
    job = defs.resolve_job_def("shard_job")
    selection = frozenset(AssetKey(a) for a in ASSETS)
    with DagsterInstance.ephemeral() as instance:
        subsets = JobSubsets(instance)
        ours, theirs = subsets.subset(job, selection), subsets.subset(variant, selection)
        assert ours is not theirs and subsets.subset(job, selection) is ours
        code = {s.key.to_user_string(): s.code_version for s in theirs.asset_layer.asset_graph.asset_nodes}
        assert code["scrubbed_files"] == "other"


@pytest.mark.integration
def test_a_run_of_a_partition_or_asset_the_job_lacks_fails_as_execute_in_process_does(tiny_run, tmp_path):
    copy = copy_of_tiny(tiny_run, tmp_path)
    job = defs.resolve_job_def("shard_job")
    cases = [("tiny/no-such-revision|000", ["scrubbed_files"]), (SHARD, ["no_such_asset"]),
             (SHARD, ["source_files"])]  # a revision asset: not in the shard job
    with environ(MEGACPP_DATA_ROOT=str(copy)), _instance() as instance:
        subsets = JobSubsets(instance)
        for key, assets in cases:
            with pytest.raises(Exception) as stock:
                job.execute_in_process(instance=instance, partition_key=key, run_config=QUIET, raise_on_error=False,
                                       asset_selection=[AssetKey(a) for a in assets])
            with pytest.raises(Exception) as ours:
                subsets.execute(job, key, assets, QUIET)
            assert type(ours.value) is type(stock.value), (key, assets)
            assert str(ours.value) == str(stock.value), (key, assets)
        assert not instance.get_run_records()  # no run was stored by either
