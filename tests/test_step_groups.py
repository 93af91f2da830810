"""Stages sharing one Dagster step (:func:`megacpp_core.stages.step_groups`): the cheap
per-file and per-shard stages of one partition run as one ``multi_asset`` step, each still
its own asset with its own blocking checks; a failed gate stops the stages after it in the
step, and a run can select any subset of a group."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, EventRecordsFilter

from megacpp_assets.definitions import build_definitions, defs
from megacpp_assets.factory import group_step_name
from megacpp_core.stage import Partitioning
from megacpp_core.stages import STAGES, phases, step_groups
from tests.conftest import copy_of_tiny, environ

SHARD = "tiny/lz4-4.4.5|000"


def test_every_stage_is_in_one_group_and_heavy_stages_keep_their_own_step():
    groups = step_groups()
    names = [s.name for g in groups for s in g]
    assert sorted(names) == sorted(s.name for s in STAGES) and len(names) == len(set(names))
    lane_of = {}
    for n, ph in enumerate(phases()):
        for lane, members in (("early", ph.early), ("shard", ph.shard), ("late", ph.late), ("snapshot", ph.snapshot)):
            lane_of.update({s.name: (n, lane) for s in members})
    for g in groups:
        assert len({lane_of[s.name] for s in g}) == 1, g  # one lane of one pass: one partitioning
        if len(g) > 1:
            assert not any(s.heavy for s in g) and g[0].partitioning is not Partitioning.SNAPSHOT, g
    assert all((s,) in groups for s in STAGES if s.heavy)
    shard_steps = {n.name for n in defs.resolve_job_def("shard_job").graph.nodes}
    assert shard_steps == {"quality__license__scrub", "minhash_signatures", "chunk__tokenize__family_chunks"}
    revision_steps = {n.name for n in defs.resolve_job_def("revision_job").graph.nodes}
    assert {"acquire__compile_commands", "repo_documents__structure_documents", "semantic_graph"} == revision_steps


def test_a_group_is_one_asset_and_one_check_set_per_stage():
    graph = defs.resolve_asset_graph()
    for g in step_groups():
        for s in g:
            ad = defs.resolve_assets_def(AssetKey(s.asset))
            assert ad.node_def.name == group_step_name(g)
            assert len(g) > 1 or group_step_name(g) == s.asset  # a stage alone: its asset's step
            assert graph.get(AssetKey(s.asset)).code_version == s.code_version
            mine = {c.key.name for c in ad.check_specs if c.asset_key == AssetKey(s.asset)}
            assert mine == set(s.check_names)
        if len(g) > 1:
            assert defs.resolve_assets_def(AssetKey(g[0].asset)).can_subset


@pytest.mark.integration
def test_the_tiny_run_materialized_each_asset_of_a_shared_step_with_its_checks(tiny_run):
    _, instance = tiny_run
    group = next(g for g in step_groups() if group_step_name(g) == "quality__license__scrub")
    for s in group:
        recs = instance.fetch_materializations(AssetKey(s.asset), limit=100).records
        assert {r.partition_key for r in recs} >= {SHARD}, s.asset
        evals = instance.get_event_records(EventRecordsFilter(DagsterEventType.ASSET_CHECK_EVALUATION), limit=10_000)
        done = {(e.event_log_entry.dagster_event.event_specific_data.asset_check_key.asset_key.path[-1],
                 e.event_log_entry.dagster_event.event_specific_data.check_name,
                 e.event_log_entry.dagster_event.event_specific_data.passed) for e in evals}
        assert {(s.asset, c, True) for c in s.check_names} <= done, s.asset
    run_id = next(r.run_id for r in instance.fetch_materializations(AssetKey("scrubbed_files"), limit=100).records
                  if r.partition_key == SHARD)
    starts = [e.step_key for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)]
    assert "quality__license__scrub" in starts and "scrubbed_files" not in starts  # one step, three assets


def _failing(ctx):
    """A gate that always fails (the test's hostile gate)."""
    return False, "failed on purpose"


@pytest.mark.integration
def test_a_failed_gate_stops_the_stages_after_it_in_the_step(tiny_run, tmp_path, capsys):
    from megacpp_assets.snapshot_run import report_failure

    variant = tuple(dataclasses.replace(s, gates=(*s.gates, _failing)) if s.name == "license" else s for s in STAGES)
    job = build_definitions(variant).resolve_job_def("shard_job")
    copy = copy_of_tiny(tiny_run, tmp_path)
    with environ(MEGACPP_DATA_ROOT=str(copy)), DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("repo_revision", ["tiny/lz4-4.4.5"])
        instance.add_dynamic_partitions("shard", ["000"])
        result = job.execute_in_process(instance=instance, partition_key=SHARD, raise_on_error=False,
                                        asset_selection=[AssetKey(a) for a in ("quality_files", "license_files", "scrubbed_files")])
        assert not result.success
        done = {e.asset_key.path[-1] for e in result.get_asset_materialization_events()}
        assert done == {"quality_files", "license_files"}  # scrub, after the failed gate, did not run
        evals = {(e.check_name, e.passed) for e in result.get_asset_check_evaluations()}
        assert ("_failing", False) in evals and ("every_file_decided", True) in evals
        lines = [e.user_message for e in instance.all_logs(result.run_id) if e.dagster_event is None]
        assert [x for x in lines if "gates" in x] == [x for x in lines if x.startswith(f"license_files {SHARD}: data version ")
                                                      and x.endswith("gates FAILED (_failing)")] != []
        # the failure report names the stage whose gate failed, not the one after it
        step = "quality__license__scrub"
        report_failure(result, SHARD, [(a, step) for a in ("quality_files", "license_files", "scrubbed_files")])
        err = capsys.readouterr().err
        assert f"step {step} (asset license_files)" in err and "check _failing failed on license_files" in err


@pytest.mark.integration
def test_the_checks_of_a_shared_step_do_not_run_without_their_asset(tiny_run, tmp_path):
    """A run selecting a grouped asset's checks alone (the shard job subset to them) is
    refused: a check evaluates what its stage commits, so it runs with its asset."""
    from dagster import AssetCheckKey

    copy = copy_of_tiny(tiny_run, tmp_path)
    check = AssetCheckKey(AssetKey("scrubbed_files"), "scrubbed_schema")
    job = defs.resolve_job_def("shard_job").get_subset(asset_selection=set(), asset_check_selection={check})
    with environ(MEGACPP_DATA_ROOT=str(copy)), DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("repo_revision", ["tiny/lz4-4.4.5"])
        instance.add_dynamic_partitions("shard", ["000"])
        result = job.execute_in_process(instance=instance, partition_key=SHARD, raise_on_error=False)
        assert not result.success  # not a silent success with nothing evaluated
        assert not result.get_asset_check_evaluations() and not result.get_asset_materialization_events()
        failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data.error
        assert "select the asset, not its checks alone" in failure.cause.message


@pytest.mark.integration
def test_a_run_can_select_one_stage_of_a_shared_step(tiny_run, tmp_path):
    copy = copy_of_tiny(tiny_run, tmp_path)
    with environ(MEGACPP_DATA_ROOT=str(copy)), DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("repo_revision", ["tiny/lz4-4.4.5"])
        instance.add_dynamic_partitions("shard", ["000"])
        result = defs.resolve_job_def("shard_job").execute_in_process(
            instance=instance, partition_key=SHARD, asset_selection=[AssetKey("scrubbed_files")])
        assert result.success
        assert [e.asset_key.path[-1] for e in result.get_asset_materialization_events()] \
            == ["scrubbed_files"]
        evals = {e.asset_key.path[-1] for e in result.get_asset_check_evaluations()}
        assert evals == {"scrubbed_files"}


@pytest.mark.integration
def test_each_check_targets_its_materialization_with_one_lookup(tiny_run, tmp_path):
    """Every check evaluation of a shared step points at the materialization of its own
    asset in the run, and Dagster looks that materialization up once per check (the asset
    bodies yield checks beside the MaterializeResult, not inside it, where each check is
    looked up twice: :func:`megacpp_assets.factory.to_result`)."""
    copy = copy_of_tiny(tiny_run, tmp_path)
    assets = ("quality_files", "license_files", "scrubbed_files")
    with environ(MEGACPP_DATA_ROOT=str(copy)), DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("repo_revision", ["tiny/lz4-4.4.5"])
        instance.add_dynamic_partitions("shard", ["000"])
        lookups: list[str] = []
        fetch = instance.fetch_materializations

        def counted(records_filter, *args, **kwargs):  # Dagster's lookups for check results
            if "asset_check" in sys._getframe(1).f_code.co_filename:
                lookups.append(getattr(records_filter, "asset_key", records_filter).path[-1])
            return fetch(records_filter, *args, **kwargs)

        instance.fetch_materializations = counted
        result = defs.resolve_job_def("shard_job").execute_in_process(
            instance=instance, partition_key=SHARD, asset_selection=[AssetKey(a) for a in assets])
        assert result.success
        mats = {r.asset_key.path[-1]: r.storage_id for r in
                (instance.fetch_materializations(AssetKey(a), limit=1).records[0] for a in assets)}
        evals = result.get_asset_check_evaluations()
        checks = {a: len(next(s for s in STAGES if s.asset == a).check_names) for a in assets}
        assert len(evals) == sum(checks.values()) and all(e.passed for e in evals)
        for e in evals:
            assert e.target_materialization_data.storage_id == mats[e.asset_key.path[-1]], e.check_name
        for a in assets:
            assert lookups.count(a) == checks[a], (a, lookups)


# ---------------------------------------------------------------- the materialization index


def test_the_materialization_index_follows_new_materializations():
    from dagster import AssetMaterialization

    from megacpp_assets.factory import LatestMaterializations

    with DagsterInstance.ephemeral() as instance:
        def mat(p: str, version: str) -> None:
            instance.report_runless_asset_event(AssetMaterialization("a", partition=p, tags={"dagster/data_version": version}))

        mat("s/x", "1")
        mat("s/y", "1")
        mat("s/w", "5")
        index = LatestMaterializations(instance, kept=True)
        assert index.data_versions("a", ["s/x", "s/w", "s/v"]) == {"s/x": "1", "s/w": "5", "s/v": None}
        got = index.get_many("a", ["s/x", "s/y", "s/z"])
        assert {p: m and m.tags["dagster/data_version"] for p, m in got.items()} == {"s/x": "1", "s/y": "1", "s/z": None}
        mat("s/x", "2")
        mat("s/z", "1")
        instance.report_runless_asset_event(AssetMaterialization("a", partition="s/w"))  # latest: no data version
        assert index.get("a", "s/x").tags["dagster/data_version"] == "1"  # until refreshed (one plan)
        assert index.get("a", "s/z") is None
        assert index.data_versions("a", ["s/x", "s/z", "s/w"]) == {"s/x": "1", "s/z": None, "s/w": "5"}
        index.refresh()
        # the latest materialization's tag, not the last one that had it
        assert index.data_versions("a", ["s/x", "s/z", "s/w", "s/x"]) == {"s/x": "2", "s/z": "1", "s/w": None}
        assert LatestMaterializations(instance).data_versions("a", ["s/x", "s/y"]) == {"s/x": "2", "s/y": "1"}
        assert index.get("a", "s/x").tags["dagster/data_version"] == "2"
        assert index.get("a", "s/z").tags["dagster/data_version"] == "1"
        assert index.get("a", "s/y").tags["dagster/data_version"] == "1" and index.get("b", "s/x") is None
        assert index.get_many("a", []) == {} and index.data_versions("a", []) == {}
        instance.wipe_assets([AssetKey("a")])  # a wiped asset reads as never materialized
        index.refresh()
        assert index.get_many("a", ["s/x", "s/y"]) == {"s/x": None, "s/y": None}
        assert LatestMaterializations(instance).get("a", "s/x") is None
        assert LatestMaterializations(instance).data_versions("a", ["s/x", "s/y"]) == {"s/x": None, "s/y": None}
        mat("s/x", "3")  # materialized again after the wipe
        index.refresh()
        assert index.data_versions("a", ["s/x", "s/y"]) == {"s/x": "3", "s/y": None}


@pytest.mark.integration
def test_the_materialization_index_agrees_with_one_query_per_partition(tiny_run):
    from dagster import AssetRecordsFilter

    from megacpp_assets.factory import LatestMaterializations

    _, instance = tiny_run
    index, once = LatestMaterializations(instance, kept=True), LatestMaterializations(instance)
    for s in STAGES:
        parts = sorted({r.partition_key for r in instance.fetch_materializations(AssetKey(s.asset), limit=10_000).records})
        assert parts, s.asset
        versions = LatestMaterializations(instance).data_versions(s.asset, parts + ["tiny/no-such-revision"])
        assert versions.pop("tiny/no-such-revision") is None
        got = index.get_many(s.asset, parts + ["tiny/no-such-revision"])
        assert got.pop("tiny/no-such-revision") is None
        for p in parts:
            want = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey(s.asset), asset_partitions=[p]),
                                                   limit=1).records[0].asset_materialization
            assert got[p] == want == once.get(s.asset, p), (s.asset, p)
            assert versions[p] == want.tags["dagster/data_version"] is not None, (s.asset, p)


def _groups(planned):
    from megacpp_core.stages import snapshot_groups

    return [(g.assets, sorted(g.after)) for g in snapshot_groups(planned)]


def test_snapshot_groups_wait_only_for_what_they_read():
    """The snapshot steps of a pass as groups (``megacpp run`` runs groups that do not
    depend on each other at once): each group waits only for the groups it reads from, a
    chain stays one group, and every group comes after the groups it waits for."""
    from megacpp_core.stages import producers, snapshot_groups

    second = [s.asset for s in phases()[1].snapshot]
    assert _groups(second) == [
        (("chunk_dedup",), []),
        (("packed_rows", "megatron_dataset"), [0]),
        (("p1_simple_dataset",), [0]),
        (("p1_docrich_dataset",), [0]),
        (("p2_file_dataset",), []),
        (("p3_repo_dataset",), []),
        (("p4_structure_dataset",), []),
        (("blends",), [2, 3, 4, 5, 6]),
    ]
    first = [s.asset for s in phases()[0].snapshot]
    assert _groups(first) == [(("lsh_bands_00_07",), []), (("lsh_bands_07_14",), []),
                              (("dedup_decisions", "tokenizer"), [0, 1])]
    # every dependency among planned stages is kept (directly or through an earlier group)
    prod = producers()
    for planned in (second, first, second[3:], ["p2_file_dataset", "blends"]):
        groups = snapshot_groups(planned)
        where = {a: i for i, g in enumerate(groups) for a in g.assets}
        for i, g in enumerate(groups):
            assert all(j < i for j in g.after)
        for a in planned:
            stage = next(s for s in STAGES if s.asset == a)
            for d in stage.inputs:
                up = prod[d.name].asset
                if up in where and where[up] != where[a]:
                    seen, todo = set(), [where[a]]
                    while todo:
                        k = todo.pop()
                        seen |= set(groups[k].after)
                        todo += list(groups[k].after)
                    assert where[up] in seen, (a, up)


def test_snapshot_groups_of_a_partial_plan_and_a_wrong_name():
    """An asset that is current is not waited for: the format step of a plan without the
    packed rows waits for the chunk dedup alone, and joins its group; a blend whose
    families are current starts at once. A name that is not a snapshot asset is refused."""
    assert _groups(["chunk_dedup", "megatron_dataset"]) == [(("chunk_dedup", "megatron_dataset"), [])]
    assert _groups(["blends"]) == [(("blends",), [])]
    assert _groups([]) == []
    with pytest.raises(KeyError, match="chunked_documents"):
        _groups(["chunked_documents"])


@pytest.mark.integration
def test_a_shared_step_leaves_no_memo_behind(tiny_run, tmp_path):
    """p3_repo run alone in its shared step (p4_structure not selected) keeps its parses for
    a p4 that does not come: the step empties the memos when it ends."""
    from megacpp_core import memo

    copy = copy_of_tiny(tiny_run, tmp_path)
    with environ(MEGACPP_DATA_ROOT=str(copy)), DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("repo_revision", ["tiny/lz4-4.4.5"])
        instance.add_dynamic_partitions("shard", ["000"])
        seen: list[int] = []
        real_put = memo.PARSED.put

        def put(scope, text, value):
            ok = real_put(scope, text, value)
            seen.append(len(memo.PARSED))
            return ok

        memo.PARSED.put = put
        try:
            result = defs.resolve_job_def("revision_job").execute_in_process(
                instance=instance, partition_key="tiny/lz4-4.4.5", asset_selection=[AssetKey("p3_repo_documents")])
        finally:
            del memo.PARSED.put
        assert result.success and seen and max(seen) > 0  # p3 held parses during the step
        assert len(memo.PARSED) == 0  # and none outlive it
