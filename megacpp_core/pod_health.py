"""Running-pod health for Kubernetes execution (SPEC §5, the ImagePullBackOff case).

The pipeline alerts on the number of *running* pods, never on the scheduled count: a
cluster whose every pod sits in ``Pending`` with ``ImagePullBackOff`` reports a healthy
number of scheduled pods while producing nothing. Pods are the ones dagster-k8s creates
for runs and steps; it labels them ``dagster/run-id`` and
``app.kubernetes.io/component`` = ``run_worker`` | ``step_worker``
(dagster_k8s.launcher / dagster_k8s.executor).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

#: Label that dagster-k8s puts on every run and step pod (value: the run id).
RUN_ID_LABEL = "dagster/run-id"
COMPONENT_LABEL = "app.kubernetes.io/component"
WORKER_COMPONENTS = ("run_worker", "step_worker")
#: Seconds that "zero running pods while runs are in progress" must last before alerting.
DEFAULT_GRACE_SECONDS = 300.0


@dataclass(frozen=True)
class PodCounts:
    """Pods of dagster runs by phase.

    ``running``: phase Running; ``scheduled``: every pod not yet finished (Pending +
    Running + Unknown) — the number a naive dashboard shows; ``waiting_reasons``: counts of
    container waiting reasons (``ImagePullBackOff``, ``ErrImagePull``, …); ``run_ids``:
    runs that own at least one pod.
    """

    running: int = 0
    pending: int = 0
    succeeded: int = 0
    failed: int = 0
    unknown: int = 0
    waiting_reasons: dict[str, int] = field(default_factory=dict)
    run_ids: tuple[str, ...] = ()

    @property
    def scheduled(self) -> int:
        return self.running + self.pending + self.unknown


def _get(obj: Any, *path: str) -> Any:
    for name in path:
        if obj is None:
            return None
        obj = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return obj


def count_pods(pods: Iterable[Any]) -> PodCounts:
    """Count dagster worker pods by phase.

    ``pods`` are kubernetes ``V1Pod`` objects (or dicts of the same shape). Pods without
    the ``dagster/run-id`` label, or whose component is not a run/step worker, are ignored.
    """
    phases: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    runs: set[str] = set()
    for pod in pods:
        labels = _get(pod, "metadata", "labels") or {}
        if RUN_ID_LABEL not in labels:
            continue
        comp = labels.get(COMPONENT_LABEL)
        if comp is not None and comp not in WORKER_COMPONENTS:
            continue
        runs.add(labels[RUN_ID_LABEL])
        phases[_get(pod, "status", "phase") or "Unknown"] += 1
        for cs in _get(pod, "status", "container_statuses") or _get(pod, "status", "containerStatuses") or []:
            reason = _get(cs, "state", "waiting", "reason")
            if reason:
                reasons[reason] += 1
    return PodCounts(running=phases["Running"], pending=phases["Pending"], succeeded=phases["Succeeded"],
                     failed=phases["Failed"], unknown=phases["Unknown"],
                     waiting_reasons=dict(sorted(reasons.items())), run_ids=tuple(sorted(runs)))


@dataclass(frozen=True)
class HealthDecision:
    """Outcome of :func:`evaluate`: whether to alert now, and the new "stalled since" time."""

    alert: bool
    stalled_since: float | None
    message: str


def evaluate(counts: PodCounts, runs_in_progress: int, now: float, stalled_since: float | None,
             grace_seconds: float = DEFAULT_GRACE_SECONDS) -> HealthDecision:
    """Decide whether the running-pod alert fires.

    Stalled means ``runs_in_progress > 0`` and ``counts.running == 0``. The alert fires
    once the stall has lasted ``grace_seconds`` (``now`` and ``stalled_since`` are epoch
    seconds); any running pod, or no run in progress, clears it.
    """
    if runs_in_progress <= 0 or counts.running > 0:
        return HealthDecision(False, None, f"healthy: {counts.running} running / {counts.scheduled} scheduled pods, "
                                           f"{runs_in_progress} runs in progress")
    since = stalled_since if stalled_since is not None else now
    waited = now - since
    why = ", ".join(f"{k} {v}" for k, v in counts.waiting_reasons.items()) or "no worker pods"
    msg = (f"0 running pods ({counts.scheduled} scheduled, {counts.pending} pending: {why}) while "
           f"{runs_in_progress} runs are in progress, for {waited:.0f}s (grace {grace_seconds:.0f}s)")
    return HealthDecision(waited >= grace_seconds, since, msg)
