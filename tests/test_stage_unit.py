"""The Stage unit: a new stage is one module plus one registration line; declarations are
enforced at run time (inputs, settings, outputs, figures); the registry checks lineage."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
from dagster import AssetKey, AssetRecordsFilter, RunsFilter

from megacpp_core import catalog, layout, stages
from megacpp_core.manifest import load_manifest
from megacpp_core.runner import run_stage
from megacpp_core.stage import Dataset, Partition, Partitioning, Result, Stage, StageError
from megacpp_core.stages import STAGES
from megacpp_core.storage import DataRoot
from tests import stage_example

WITH_EXAMPLE = STAGES + (stage_example.STAGE,)  # the one registration line


@pytest.fixture
def tiny_root(tiny_run):
    """The shared ``tiny`` snapshot; what the example and probe stages write into it is
    removed afterwards, so other tests still find exactly the registry's outputs."""
    yield tiny_run
    snap = tiny_run[0] / "snapshots" / "tiny"
    for pattern in ("revisions/*/shards/*/line_stats.parquet", "revisions/*/shards/*/probe.parquet", "figures/line_stats",
                    "figures/probe"):
        for p in snap.glob(pattern):
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def test_the_example_stage_becomes_an_asset_with_its_checks():
    from megacpp_assets.definitions import build_definitions

    defs = build_definitions(WITH_EXAMPLE)
    graph = defs.resolve_asset_graph()
    node = graph.get(AssetKey("line_stats"))
    assert node.parent_keys == {AssetKey("scrubbed_files")} and node.partitions_def == graph.get(AssetKey("scrubbed_files")).partitions_def
    assert node.code_version == "1"
    specs = {s.key.name: s for s in defs.resolve_assets_def(AssetKey("line_stats")).check_specs}
    assert set(specs) == {"every_file_counted", "line_stats_schema"} and all(s.blocking for s in specs.values())
    assert AssetKey("line_stats") in {k for k in defs.resolve_job_def("shard_job").asset_layer.executable_asset_keys}


def _count(instance, asset: str) -> int:
    return len(instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey(asset)), limit=1000).records)


def test_a_new_stage_on_a_materialized_snapshot_runs_only_itself(tiny_root):
    from megacpp_assets.cli import run_snapshot

    root, instance = tiny_root
    before = {s.asset: _count(instance, s.asset) for s in STAGES}
    runs_before = len(instance.get_runs(filters=RunsFilter(job_name="snapshot_job")))
    assert run_snapshot("tiny", str(root), instance=instance, stages=WITH_EXAMPLE) == 0
    assert {s.asset: _count(instance, s.asset) for s in STAGES} == before  # nothing else re-ran
    assert len(instance.get_runs(filters=RunsFilter(job_name="snapshot_job"))) == runs_before
    assert _count(instance, "line_stats") == 3
    for src in ("pybind11-3.1.0", "lz4-4.4.5", "xxhash-4.1.0"):
        path = root / "snapshots" / "tiny" / "revisions" / src / "shards" / "000" / "line_stats.parquet"
        assert path.stat().st_size > 0
    assert run_snapshot("tiny", str(root), instance=instance, stages=WITH_EXAMPLE) == 0
    assert _count(instance, "line_stats") == 3  # current now: skipped


def _tiny_stage(compute, partitioning=Partitioning.REVISION_SHARD, **kw) -> Stage:
    path = ("revisions/{source}/shards/{shard}/probe.parquet" if partitioning is Partitioning.REVISION_SHARD
            else "revisions/{source}/probe.parquet")
    out = Dataset("probe", partitioning, path)
    return Stage(name="probe", asset="probe", partitioning=partitioning, compute=compute, code_version="1",
                 description="probe", inputs=kw.pop("inputs", (catalog.SCRUBBED,)), outputs=(out,), **kw)


def test_declarations_are_enforced_at_run_time(tiny_root):
    import pyarrow as pa

    root = DataRoot(tiny_root[0])
    m = load_manifest("tiny")
    part = Partition("tiny", "lz4-4.4.5", "000")
    table = pa.table({"x": [1]})

    def reads_undeclared(ctx):
        ctx.input("license")
        return Result({"probe": table})

    with pytest.raises(StageError, match="did not declare as an input"):
        run_stage(_tiny_stage(reads_undeclared), root, m, part)

    def reads_undeclared_setting(ctx):
        return Result({"probe": table}, {"n": ctx.settings.row_length})

    with pytest.raises(AttributeError, match="probe did not declare setting 'row_length'"):
        run_stage(_tiny_stage(reads_undeclared_setting, figures=("n",)), root, m, part)
    assert run_stage(_tiny_stage(reads_undeclared_setting, figures=("n",), settings=("row_length",)),
                     root, m, part).figures["n"] == 8192
    with pytest.raises(StageError, match="undeclared figures"):
        run_stage(_tiny_stage(lambda ctx: Result({"probe": table}, {"surprise": 1})), root, m, part)
    with pytest.raises(StageError, match="returned outputs"):
        run_stage(_tiny_stage(lambda ctx: Result({})), root, m, part)
    with pytest.raises(ValueError, match="per snapshot but writes"):
        Stage(name="bad", asset="bad", partitioning=Partitioning.SNAPSHOT, compute=reads_undeclared, code_version="1",
              description="", outputs=(catalog.SCRUBBED,))


def test_a_failing_gate_is_reported_not_raised(tiny_root):
    import pyarrow as pa

    def gate_that_fails(g):
        return False, "always"

    def gate_that_raises(g):
        raise RuntimeError("boom")

    res = run_stage(_tiny_stage(lambda ctx: Result({"probe": pa.table({"x": [1]})}),
                                gates=(gate_that_fails, gate_that_raises)),
                    DataRoot(tiny_root[0]), load_manifest("tiny"), Partition("tiny", "lz4-4.4.5", "000"))
    assert not res.ok and res.checks["gate_that_fails"] == (False, "always")
    assert res.checks["gate_that_raises"][0] is False and "RuntimeError: boom" in res.checks["gate_that_raises"][1]


def test_plots_are_drawn_by_the_runner_inside_the_stage_time_when_the_gates_pass(tiny_root):
    """A stage's ``plots`` of its figures are drawn by :func:`run_stage` (so its
    ``wall_seconds`` includes them) when every gate passes, and the asset's metadata
    embeds them; with a failed gate none is drawn."""
    import pyarrow as pa

    from megacpp_assets.factory import to_result

    drawn = []

    def plots(figures):
        drawn.append(dict(figures))
        return {"probe_plot": b"\x89PNG fake"}

    def gate(ok):
        def probe_gate(g):
            return ok, "as set"
        return probe_gate

    root, m, part = DataRoot(tiny_root[0]), load_manifest("tiny"), Partition("tiny", "lz4-4.4.5", "000")
    compute = lambda ctx: Result({"probe": pa.table({"x": [1]})}, {"n": 3})  # noqa: E731
    res = run_stage(_tiny_stage(compute, figures=("n",), gates=(gate(True),), plots=plots), root, m, part)
    # drawn before the stage's time was taken (no wall_seconds yet): inside that time
    assert res.ok and res.plots == {"probe_plot": b"\x89PNG fake"} and drawn == [{"n": 3}]
    assert "wall_seconds" in res.figures
    result, _ = to_result(_tiny_stage(compute, plots=plots), res, root)
    assert "data:image/png;base64," in result.metadata["plots"].value and len(drawn) == 1  # embedded, not drawn again
    failed = run_stage(_tiny_stage(compute, figures=("n",), gates=(gate(False),), plots=plots), root, m, part)
    assert not failed.ok and failed.plots == {} and len(drawn) == 1
    assert "plots" not in to_result(_tiny_stage(compute, plots=plots), failed, root)[0].metadata

    def broken(figures):
        raise RuntimeError("cannot draw")

    fig_key = layout.figures_key("tiny", "probe", "lz4-4.4.5", "000")
    root.delete(fig_key)
    with pytest.raises(RuntimeError, match="cannot draw"):  # the stage fails, its figures persisted first
        run_stage(_tiny_stage(compute, figures=("n",), gates=(gate(True),), plots=broken), root, m, part)
    assert root.read_json(fig_key)["n"] == 3


def test_registry_refuses_broken_lineage():
    orphan = dataclasses.replace(stages.by_name("chunk"), name="orphan", asset="orphan", outputs=())
    with pytest.raises(ValueError, match="reads scrubbed, which no earlier stage writes"):
        stages.producers((orphan,))
    twice = dataclasses.replace(stages.by_name("quality"), name="quality2", asset="quality2")
    with pytest.raises(ValueError, match="written by quality and quality2"):
        stages.producers(STAGES + (twice,))


def test_outputs_are_removed_before_a_stage_recomputes(tmp_path):
    """A stage that fails leaves no older output of its partition behind."""
    import pyarrow as pa

    root = DataRoot(tmp_path)
    m = load_manifest("tiny")
    part = Partition("tiny", "lz4-4.4.5")
    stage = _tiny_stage(lambda ctx: Result({"probe": pa.table({"x": [1]})}), Partitioning.REVISION, inputs=())
    run_stage(stage, root, m, part)
    key = "snapshots/tiny/revisions/lz4-4.4.5/probe.parquet"
    assert root.exists(key)

    def fails(ctx):
        raise StageError("bad input")

    with pytest.raises(StageError):
        run_stage(dataclasses.replace(stage, compute=fails), root, m, part)
    assert not root.exists(key)


def test_each_step_reports_its_own_peak_rss(tiny_root):
    """``max_rss_mb`` is the step's own peak: a step that holds 200 MB reports at least that,
    and the next, small step in the same process reports less (the peak is reset per step)."""
    import numpy as np
    import pyarrow as pa

    def big(ctx):
        a = np.ones(200_000_000 // 8)  # 200 MB, touched
        return Result({"probe": pa.table({"x": [float(a.sum())]})})

    root, m, part = DataRoot(tiny_root[0]), load_manifest("tiny"), Partition("tiny", "lz4-4.4.5", "000")
    heavy = run_stage(_tiny_stage(big), root, m, part).figures["max_rss_mb"]
    light = run_stage(_tiny_stage(lambda ctx: Result({"probe": pa.table({"x": [1.0]})})), root, m, part).figures["max_rss_mb"]
    assert heavy >= 200 and 0 < light < heavy - 150, (light, heavy)
