"""Orchestration overhead of a finished ``megacpp run``, read from the Dagster event log.

``megacpp run --corpus NAME`` (:mod:`megacpp_assets.cli`, :mod:`megacpp_assets.snapshot_run`)
launches one Dagster run per unit of work (a revision's early or late assets, a shard, the
snapshot assets of a pass) on the instance at ``DAGSTER_HOME``, on up to N worker
processes at once. This script reads the runs of one such invocation back from the
instance (public API only: ``DagsterInstance.from_config``, ``get_run_records``,
``all_logs``, ``DagsterEventType``) and prints one JSON object saying how much of the
invocation's wall time went to orchestration rather than to our stages' compute.

Command::

    DAGSTER_HOME=/path/to/dh python bench/orchestration.py [--dagster-home DIR]
        [--since-run-id ID | --last N] [--invocation-gap SECONDS] [--run-log run.log]

What is measured (all times in seconds, from event timestamps):

* **run interval**: a run's creation (the run record's ``create_timestamp``; Dagster's
  planning events precede ``RUN_START``) → its ``RUN_SUCCESS`` / ``RUN_FAILURE``;
  **span** ``S``: the first run's start → the last run's end. Work of ``megacpp run``
  before its first run (manifest, pins, worker spawn) and after its last is not in the
  event log; ``--run-log`` reads the ``Done in N s`` line to show that difference.
* **step interval**: ``STEP_START`` → ``STEP_SUCCESS`` / ``STEP_FAILURE``; its duration
  ``d``. **Union** ``U``: time at least one step was executing; **gaps** ``G = S − U``:
  time no step was executing (between runs: ``megacpp run``'s freshness planning and
  dispatch; inside runs: Dagster's run start-up and shut-down).
* **wall_seconds** ``w``: our compute's own time, which :func:`megacpp_core.runner.run_stage`
  reports as asset-materialization metadata (``wall_seconds``, next to ``max_rss_mb``;
  summed if a step materializes several assets). **In-step overhead** ``d − w``: the step's
  time outside ``run_stage`` (Dagster's step set-up, input fingerprinting, building the
  ``MaterializeResult``, events, checks). Steps without ``wall_seconds`` (the dataset
  card) get no overhead and count as compute.

The formula. With N workers, steps overlap, so summing in-step overheads would count the
same second of wall time once per worker, and would count overhead of one worker that is
hidden behind another worker's compute. Each unit of wall time is therefore counted once:
a step's **compute interval** is the ``w`` seconds ending when its op returned (its first
``STEP_OUTPUT`` / ``ASSET_MATERIALIZATION``, clipped to the step), and ``C`` is the union
of the compute intervals. Then::

    in_step_overhead_wall = U − C       # some step running, none of them computing
    orchestration_wall    = G + (U − C) = S − C
    orchestration_fraction = orchestration_wall / S

i.e. the share of the invocation's wall time during which no worker was running our
compute. It is a lower bound when several workers run (one worker's overhead while
another computes is not counted); ``orchestration_fraction_serial`` =
``min(1, (G + Σ(d − w)) / S)`` is the upper bound that counts every step's overhead in
full, as if no two steps overlapped. With one worker both agree (up to the placement of
the compute interval). The goal of the issue is ``orchestration_fraction ≤ 0.10``.

Selecting the runs of one invocation: ``megacpp run`` sets no tag of its own on its runs,
so by default the runs are sorted by start and split wherever a run starts more than
``--invocation-gap`` seconds after every earlier run has ended; the last group is the
most recent invocation. ``--since-run-id`` takes that run and every later one,
``--last N`` the N most recent runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Default split between invocations (s): longer than any pause inside one ``megacpp run``
#: seen so far (≈ 3 s between passes: the snapshot steps' planning and fresh workers).
INVOCATION_GAP = 30.0

#: The issue's goal for :func:`figures`' ``orchestration_fraction``.
GOAL = 0.10


@dataclass(frozen=True)
class Step:
    """One executed step: ``start``/``end`` (``STEP_START`` → ``STEP_SUCCESS``/``STEP_FAILURE``),
    our compute's ``wall_seconds`` (None when not reported) and ``compute_end``, the time
    the op returned (None: ``end``); ``parts``, for a step materializing several assets,
    each one's ``(materialization time, wall_seconds)`` (empty: one compute interval)."""

    step: str
    start: float
    end: float
    wall_seconds: float | None = None
    compute_end: float | None = None
    run_id: str = ""
    job: str = ""
    partition: str = ""
    ok: bool = True
    parts: tuple[tuple[float, float], ...] = ()

    @property
    def duration(self) -> float:
        """``end − start``."""
        return self.end - self.start

    @property
    def overhead(self) -> float | None:
        """``duration − wall_seconds`` (None without ``wall_seconds``)."""
        return None if self.wall_seconds is None else self.duration - self.wall_seconds

    def compute_interval(self) -> tuple[float, float]:
        """The ``wall_seconds`` ending at ``compute_end``, clipped to the step (the whole
        step without ``wall_seconds``)."""
        if self.wall_seconds is None:
            return self.start, self.end
        return self._clip(self.compute_end, self.wall_seconds)

    def _clip(self, end: float | None, wall: float) -> tuple[float, float]:
        hi = max(min(self.end, end if end is not None else self.end), self.start)
        return max(self.start, hi - wall), hi

    def compute_intervals(self) -> list[tuple[float, float]]:
        """One compute interval per asset the step materialized (``parts``: ``(time of its
        materialization, its wall_seconds)``; a step shared by several stages computes them
        one after another), else :meth:`compute_interval`."""
        if not self.parts:
            return [self.compute_interval()]
        return [self._clip(t, w) for t, w in self.parts]


@dataclass
class Run:
    """One Dagster run of the invocation: ``start`` (creation) → ``end`` and its steps."""

    run_id: str
    job: str
    partition: str
    start: float
    end: float
    status: str = "SUCCESS"
    steps: list[Step] = field(default_factory=list)


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals (empty ones ignored)."""
    total, cur_lo, cur_hi = 0.0, None, None
    for lo, hi in sorted((a, b) for a, b in intervals if b > a):
        if cur_hi is None or lo > cur_hi:
            if cur_hi is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_hi is not None:
        total += cur_hi - cur_lo
    return total


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """Largest number of ``(start, end)`` intervals open at one time (touching ends do not overlap)."""
    events = sorted([(a, 1) for a, b in intervals if b > a] + [(b, -1) for a, b in intervals if b > a],
                    key=lambda e: (e[0], e[1]))
    best = cur = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def _steps_from(items: Sequence) -> list[Step]:
    out = []
    for it in items:
        out.append(it if isinstance(it, Step) else Step(*it))
    return out


def figures(steps: Sequence, span: tuple[float, float] | None = None,
            runs: Sequence[tuple[float, float]] = (), top: int = 10, goal: float = GOAL) -> dict:
    """The overhead figures (module docstring) of ``steps``: :class:`Step` objects or tuples
    ``(step, start, end, wall_seconds[, compute_end])``. ``span``: ``(first start, last end)``
    of the invocation (default: the runs' extent, else the steps'); ``runs``: the runs'
    ``(start, end)`` intervals, for the time between runs. Pure: no clock, no instance."""
    steps = _steps_from(steps)
    intervals = [(s.start, s.end) for s in steps]
    runs = list(runs)
    if span is None:
        ends = runs or intervals
        span = (min(a for a, _ in ends), max(b for _, b in ends)) if ends else (0.0, 0.0)
    s = span[1] - span[0]
    u = union_length(intervals)
    c = union_length(iv for s_ in steps for iv in s_.compute_intervals())
    gaps = s - u
    with_wall = [x for x in steps if x.wall_seconds is not None]
    sum_overhead = sum(x.overhead for x in with_wall)
    sum_wall = sum(x.wall_seconds for x in with_wall)
    orch = gaps + (u - c)
    frac = orch / s if s > 0 else 0.0
    serial = min(1.0, (gaps + sum_overhead) / s) if s > 0 else 0.0
    out = {
        "span_seconds": round(s, 3),
        "runs": len(runs),
        "steps": len(steps),
        "steps_failed": sum(not x.ok for x in steps),
        "steps_with_wall_seconds": len(with_wall),
        "steps_without_wall_seconds": sorted({x.step for x in steps if x.wall_seconds is None}),
        "max_parallel_steps": max_overlap(intervals),
        "runs_union_seconds": round(union_length(runs), 3) if runs else None,
        "between_runs_seconds": round(s - union_length(runs), 3) if runs else None,
        "steps_union_seconds": round(u, 3),
        "gaps_seconds": round(gaps, 3),
        "compute_union_seconds": round(c, 3),
        "in_step_overhead_wall_seconds": round(u - c, 3),
        "sum_step_seconds": round(sum(x.duration for x in steps), 3),
        "sum_wall_seconds": round(sum_wall, 3),
        "sum_in_step_overhead_seconds": round(sum_overhead, 3),
        "orchestration_seconds": round(orch, 3),
        "orchestration_fraction": round(frac, 4),
        "orchestration_fraction_serial": round(serial, 4),
        "goal": goal,
        "goal_met": frac <= goal,
        "top_overhead_steps": [
            {"step": x.step, "job": x.job, "partition": x.partition, "run_id": x.run_id[:8],
             "start_offset": round(x.start - span[0], 3), "duration": round(x.duration, 3),
             "wall_seconds": x.wall_seconds, "overhead": round(x.overhead, 3)}
            for x in sorted(with_wall, key=lambda x: -x.overhead)[:top]],
    }
    return out


# -- reading the instance ------------------------------------------------------------------


def _ts(value) -> float:
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


def load_runs(instance) -> list[Run]:
    """Every finished run of ``instance`` (steps not loaded yet), sorted by start (creation)."""
    runs = []
    for rec in instance.get_run_records():
        if rec.end_time is None:
            continue  # not finished
        r = rec.dagster_run
        runs.append(Run(r.run_id, r.job_name, r.tags.get("dagster/partition", ""),
                        _ts(rec.create_timestamp), float(rec.end_time), r.status.value))
    runs.sort(key=lambda r: (r.start, r.run_id))
    return runs


def load_steps(instance, run: Run) -> None:
    """Fill ``run.steps`` from the run's event log; the run's start becomes its first event
    if that is earlier than the record's creation time."""
    from dagster import DagsterEventType as T

    start, end, wall, returned, failed, parts = {}, {}, {}, {}, set(), {}
    first = None
    for e in instance.all_logs(run.run_id):
        first = e.timestamp if first is None else min(first, e.timestamp)
        ev = e.dagster_event
        if ev is None or e.step_key is None:
            continue
        k, t = e.step_key, ev.event_type
        if t == T.STEP_START:
            start[k] = e.timestamp
        elif t in (T.STEP_SUCCESS, T.STEP_FAILURE):
            end[k] = e.timestamp
            if t == T.STEP_FAILURE:
                failed.add(k)
        elif t in (T.STEP_OUTPUT, T.ASSET_MATERIALIZATION):
            returned.setdefault(k, e.timestamp)
            if t == T.ASSET_MATERIALIZATION:
                v = e.asset_materialization.metadata.get("wall_seconds")
                v = getattr(v, "value", v)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    wall[k] = wall.get(k, 0.0) + float(v)
                    parts.setdefault(k, []).append((e.timestamp, float(v)))
    if first is not None:
        run.start = min(run.start, first)
    run.steps = [Step(k, start[k], end[k], wall.get(k), returned.get(k), run.run_id, run.job, run.partition,
                      k not in failed, tuple(parts[k]) if len(parts.get(k, ())) > 1 else ())
                 for k in sorted(start, key=start.get) if k in end]


def group_invocations(runs: Sequence[Run], gap: float = INVOCATION_GAP) -> list[list[Run]]:
    """``runs`` (sorted by start) split wherever a run starts more than ``gap`` seconds
    after every earlier run ended."""
    groups: list[list[Run]] = []
    last_end = None
    for r in runs:
        if last_end is None or r.start - last_end > gap:
            groups.append([])
        groups[-1].append(r)
        last_end = r.end if last_end is None else max(last_end, r.end)
    return groups


def select(runs: Sequence[Run], since_run_id: str | None = None, last: int | None = None,
           gap: float = INVOCATION_GAP) -> tuple[list[Run], str]:
    """The runs of one invocation and how they were chosen (see the module docstring)."""
    if since_run_id:
        idx = [i for i, r in enumerate(runs) if r.run_id.startswith(since_run_id)]
        if len(idx) != 1:
            raise SystemExit(f"orchestration: run id {since_run_id!r} matches {len(idx)} runs")
        return list(runs[idx[0]:]), f"since run {runs[idx[0]].run_id}"
    if last:
        return list(runs[-last:]), f"last {last} runs"
    groups = group_invocations(runs, gap)
    how = f"most recent invocation (runs split at gaps > {gap:g}s; {len(groups)} found)"
    return (groups[-1] if groups else []), how


def done_seconds(run_log: str) -> float | None:
    """The ``N`` of the last ``Done in Ns`` line of a ``megacpp run`` log (None if absent)."""
    got = None
    with open(run_log, errors="replace") as f:
        for line in f:
            m = re.match(r"\s*Done in ([0-9.]+)\s*s", line)
            if m:
                got = float(m.group(1))
    return got


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, read the instance, print the JSON object; exit code 0."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dagster-home", default=os.environ.get("DAGSTER_HOME"),
                   help="the instance's directory (default: $DAGSTER_HOME)")
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--since-run-id", help="this run (id or unique prefix) and every later one")
    sel.add_argument("--last", type=int, help="the N most recent runs")
    p.add_argument("--invocation-gap", type=float, default=INVOCATION_GAP,
                   help=f"split invocations at pauses longer than this (s; default {INVOCATION_GAP:g})")
    p.add_argument("--run-log", help="megacpp run's output, for its 'Done in N s' (optional)")
    p.add_argument("--top", type=int, default=10, help="steps listed by overhead (default 10)")
    a = p.parse_args(argv)
    if not a.dagster_home:
        p.error("no --dagster-home and DAGSTER_HOME is not set")

    from dagster import DagsterInstance

    os.environ["DAGSTER_HOME"] = str(Path(a.dagster_home).resolve())  # the CLI's dagster.yaml reads it (base_dir)
    instance = DagsterInstance.from_config(a.dagster_home)
    runs, how = select(load_runs(instance), a.since_run_id, a.last, a.invocation_gap)
    if not runs:
        print("orchestration: no finished runs selected", file=sys.stderr)
        return 1
    for r in runs:
        load_steps(instance, r)
    span = (min(r.start for r in runs), max(r.end for r in runs))
    out = {"dagster_home": os.path.abspath(a.dagster_home), "selection": how,
           "first_run_id": runs[0].run_id, "last_run_id": runs[-1].run_id,
           "runs_failed": sum(r.status != "SUCCESS" for r in runs),
           "jobs": {j: sum(r.job == j for r in runs) for j in sorted({r.job for r in runs})}}
    out.update(figures([s for r in runs for s in r.steps], span, [(r.start, r.end) for r in runs], a.top))
    if a.run_log:
        done = done_seconds(a.run_log)
        out["run_log_done_seconds"] = done
        out["outside_runs_seconds"] = None if done is None else round(done - out["span_seconds"], 3)
    print(json.dumps(out, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
