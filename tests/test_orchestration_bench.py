"""bench/orchestration.py on synthetic step intervals: the union, the gaps, the in-step
overhead counted once per unit of wall time with parallel steps, the fraction and the
grouping of runs into invocations (no instance, no time of this machine)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def orch():
    """The benchmark script as a module."""
    spec = importlib.util.spec_from_file_location("orchestration_bench", BENCH / "orchestration.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


def test_union_and_overlap(orch):
    assert orch.union_length([(0, 2), (1, 3), (5, 6), (6, 7), (8, 8)]) == 5
    assert orch.union_length([]) == 0
    assert orch.max_overlap([(0, 2), (1, 3), (2, 4)]) == 2  # (0, 2) ends as (2, 4) starts


def test_serial_steps(orch):
    # one worker: two steps in a 10 s span, 2 s of gaps, 1 s of in-step overhead
    f = orch.figures([("a", 1, 5, 3.5), ("b", 5, 9, 3.5)], span=(0, 10), runs=[(0, 10)])
    assert f["steps"] == 2 and f["runs"] == 1 and f["max_parallel_steps"] == 1
    assert f["steps_union_seconds"] == 8 and f["gaps_seconds"] == 2
    assert f["sum_in_step_overhead_seconds"] == 1
    assert f["in_step_overhead_wall_seconds"] == 1
    assert f["orchestration_seconds"] == 3
    assert f["orchestration_fraction"] == pytest.approx(0.3)
    assert f["orchestration_fraction_serial"] == pytest.approx(0.3)
    assert f["between_runs_seconds"] == 0
    assert f["goal_met"] is False


def test_parallel_overhead_counted_once(orch):
    # two workers: the overhead of "b" (its first 2 s) is hidden behind "a"'s compute, and
    # the last second of both steps is overhead at the same time: counted once
    steps = [("a", 0, 10, 9.0, 9.0),   # computes 0..9, overhead 9..10
             ("b", 0, 10, 7.0, 9.0)]   # computes 2..9, overhead 0..2 and 9..10
    f = orch.figures(steps, span=(0, 10))
    assert f["max_parallel_steps"] == 2
    assert f["sum_in_step_overhead_seconds"] == 4
    assert f["compute_union_seconds"] == 9
    assert f["in_step_overhead_wall_seconds"] == 1
    assert f["orchestration_fraction"] == pytest.approx(0.1)
    assert f["orchestration_fraction_serial"] == pytest.approx(0.4)
    assert f["goal_met"] is True


def test_gaps_between_runs_and_top(orch):
    runs = [(0, 4), (6, 10)]
    steps = [("x", 1, 4, 2.0), ("y", 6.5, 9.5, 2.5), ("card", 9.5, 10, None)]
    f = orch.figures(steps, runs=runs, top=2)
    assert f["span_seconds"] == 10 and f["between_runs_seconds"] == 2
    assert f["gaps_seconds"] == pytest.approx(10 - 6.5)
    assert f["steps_without_wall_seconds"] == ["card"]  # counts as compute, no overhead
    assert f["compute_union_seconds"] == pytest.approx(2 + 2.5 + 0.5)
    assert f["orchestration_seconds"] == pytest.approx(5)
    assert [t["step"] for t in f["top_overhead_steps"]] == ["x", "y"]
    assert f["top_overhead_steps"][0]["overhead"] == pytest.approx(1)


def test_compute_interval_clipped(orch):
    s = orch.Step("s", 10, 12, wall_seconds=5.0, compute_end=11.5)
    assert s.compute_interval() == (10, 11.5)
    assert orch.Step("t", 0, 4, 1.0).compute_interval() == (3, 4)  # no compute_end: the step's end


def test_a_shared_step_computes_each_asset_before_its_materialization(orch):
    # one step, three stages: computes 1..3, 4..5 and 6..9 (overhead 0..1, 3..4, 5..6, 9..10)
    s = orch.Step("q__l__s", 0, 10, 6.0, 3.0, parts=((3.0, 2.0), (5.0, 1.0), (9.0, 3.0)))
    assert s.compute_intervals() == [(1.0, 3.0), (4.0, 5.0), (6.0, 9.0)]
    f = orch.figures([s])
    assert f["compute_union_seconds"] == 6 and f["in_step_overhead_wall_seconds"] == 4


def test_group_invocations(orch):
    spans = [(0, 5), (1, 3), (6, 8), (100, 110), (111, 112)]
    runs = [orch.Run(str(i), "j", "", a, b) for i, (a, b) in enumerate(spans)]
    groups = orch.group_invocations(runs, gap=30)
    assert [[r.run_id for r in g] for g in groups] == [["0", "1", "2"], ["3", "4"]]
    chosen, _ = orch.select(runs)
    assert [r.run_id for r in chosen] == ["3", "4"]
    assert [r.run_id for r in orch.select(runs, last=2)[0]] == ["3", "4"]
    assert [r.run_id for r in orch.select(runs, since_run_id="2")[0]] == ["2", "3", "4"]


def test_done_seconds(orch, tmp_path):
    log = tmp_path / "run.log"
    log.write_text("pass 1: revisions and shards on 2 workers in 34.1s\n\nDone in 96.8s. Outputs of snapshot 'x':\n")
    assert orch.done_seconds(str(log)) == 96.8
