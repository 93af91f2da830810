"""The running-pod alert (SPEC §5): a sensor and an asset check on ``k8s_workers``.

Every minute the sensor lists the pods dagster-k8s created for runs and steps, counts
them by phase, and compares with the runs in progress in the instance. When running
pods stay at zero past the grace period while runs are in progress (every pod Pending in
``ImagePullBackOff``, say), it alerts three ways: a POST to the configured webhook, an
error in the sensor log, and a failed ``running_pods_nonzero`` check on the
``k8s_workers`` asset, visible in the UI. Running and scheduled counts are reported
separately. The sensor is stopped by default (it needs a cluster); the production
profile turns it on.
"""

import json
import time

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetKey,
    AssetSpec,
    DagsterRunStatus,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset_check,
    sensor,
)

from megacpp_assets import profiles
from megacpp_core.pod_health import DEFAULT_GRACE_SECONDS, count_pods, evaluate
from megacpp_resources.kubernetes import AlertSinkResource, KubernetesResource

K8S_WORKERS = AssetKey("k8s_workers")
CHECK_NAME = "running_pods_nonzero"
IN_PROGRESS = [DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]

k8s_workers = AssetSpec(K8S_WORKERS, group_name="operations",
                        description="The Kubernetes run and step pods of this deployment (observed, not materialized).")


def _runs_in_progress(instance) -> int:
    return instance.get_runs_count(RunsFilter(statuses=IN_PROGRESS))


def _metadata(counts, runs: int, message: str) -> dict:
    return {"running_pods": counts.running, "scheduled_pods": counts.scheduled, "pending_pods": counts.pending,
            "runs_in_progress": runs, "waiting_reasons": counts.waiting_reasons, "detail": message}


@asset_check(asset=K8S_WORKERS, name=CHECK_NAME,
             description="Fails when no run/step pod is Running while runs are in progress.")
def running_pods_nonzero(context: AssetCheckExecutionContext, kubernetes: KubernetesResource) -> AssetCheckResult:
    counts = count_pods(kubernetes.list_worker_pods())
    runs = _runs_in_progress(context.instance)
    d = evaluate(counts, runs, time.time(), stalled_since=0.0, grace_seconds=0.0)
    return AssetCheckResult(passed=not d.alert, metadata=_metadata(counts, runs, d.message))


@sensor(name="running_pods_sensor", minimum_interval_seconds=60, default_status=profiles.sensor_status(),
        description="Alerts when running pods are zero while runs are in progress past a grace period.")
def running_pods_sensor(context: SensorEvaluationContext, kubernetes: KubernetesResource, alerts: AlertSinkResource):
    state = json.loads(context.cursor) if context.cursor else {}
    counts = count_pods(kubernetes.list_worker_pods())
    runs = _runs_in_progress(context.instance)
    d = evaluate(counts, runs, time.time(), state.get("stalled_since"), alerts.grace_seconds)
    md = _metadata(counts, runs, d.message)
    events = []
    if d.alert and not state.get("alerted"):
        context.log.error(f"running-pod alert: {d.message}")
        delivered = alerts.send({"alert": "megacpp_running_pods_zero", **md})
        events.append(AssetCheckEvaluation(asset_key=K8S_WORKERS, check_name=CHECK_NAME, passed=False,
                                           metadata={**md, "webhook_delivered": delivered}))
    elif not d.alert and state.get("alerted"):
        context.log.info(f"running-pod alert cleared: {d.message}")
        events.append(AssetCheckEvaluation(asset_key=K8S_WORKERS, check_name=CHECK_NAME, passed=True, metadata=md))
    else:
        context.log.info(d.message)
    cursor = json.dumps({"stalled_since": d.stalled_since, "alerted": d.alert,
                         "running": counts.running, "scheduled": counts.scheduled}, sort_keys=True)
    if events:
        return SensorResult(asset_events=events, cursor=cursor)
    context.update_cursor(cursor)
    return SkipReason(d.message)


__all__ = ["k8s_workers", "running_pods_nonzero", "running_pods_sensor", "DEFAULT_GRACE_SECONDS"]
