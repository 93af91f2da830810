"""Snapshot orchestration (SPEC §5): partitions from manifests, scheduled backfills.

* :data:`manifest_partitions_sensor` registers one ``snapshot`` partition per manifest
  and one ``repo_revision`` partition (``SNAPSHOT/SOURCE``) per source, from the shipped
  manifests (``corpora/*.yaml``) and the manifests recorded under the data root
  (``snapshots/NAME/manifest.yaml``; a recorded manifest wins over a shipped one of the
  same name). Adding a line to a manifest adds exactly one partition.
* One schedule per manifest that has a ``schedule:`` cron, named
  ``backfill_SNAPSHOT``, requests a ``revision_job`` run for every revision partition of
  that snapshot.
* :data:`snapshot_after_revisions_sensor` requests the ``snapshot_job`` run of a snapshot
  once every one of its revisions has a ``scrubbed_files`` materialization newer than the
  snapshot's last ``megatron_dataset`` materialization and no ``revision_job`` run of the
  snapshot is queued or running — so the snapshot-wide assets run once, after the
  backfill's revisions, and not before.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dagster import (
    AddDynamicPartitionsRequest,
    AssetKey,
    AssetRecordsFilter,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from megacpp_core import snapshots
from megacpp_core.manifest import Manifest, ManifestError, load_manifest, shipped_manifests
from megacpp_core.storage import DataRoot, StorageError, open_root
from megacpp_resources import DataRootResource

log = logging.getLogger("megacpp.sensors")

#: How often the sensors evaluate, in seconds.
SENSOR_INTERVAL_SECONDS = 60


def known_manifests(data_root: DataRoot | str | Path) -> dict[str, Manifest]:
    """Every loadable manifest by snapshot name: shipped ones, then those recorded under
    the data root's ``snapshots/*/manifest.yaml`` (which win). A manifest that does not
    load is logged and left out (it cannot be partitioned), never raised; an unreachable
    data root leaves only the shipped ones (logged)."""
    root = data_root if isinstance(data_root, DataRoot) else open_root(data_root)
    try:
        return snapshots.known_manifests(root)
    except (StorageError, OSError) as e:
        log.warning("data root %s unreachable, using the shipped manifests only: %s", root.url, e)
        found = {}
        for p in shipped_manifests():
            try:
                m = load_manifest(p)
            except ManifestError:
                continue
            found[m.name] = m
        return dict(sorted(found.items()))


def partition_requests(instance, manifests: dict[str, Manifest]) -> list[AddDynamicPartitionsRequest]:
    """The ``AddDynamicPartitionsRequest`` s that bring ``instance`` up to the manifests
    (only missing keys; empty when nothing is new)."""
    want_snap = list(manifests)
    want_rev = [m.partition_key(s) for m in manifests.values() for s in m.sources]
    out = []
    for pdef_name, wanted in (("snapshot", want_snap), ("repo_revision", want_rev)):
        have = set(instance.get_dynamic_partitions(pdef_name))
        missing = [k for k in wanted if k not in have]
        if missing:
            out.append(AddDynamicPartitionsRequest(partitions_def_name=pdef_name, partition_keys=missing))
    return out


def register_partitions(instance, manifests: dict[str, Manifest]) -> None:
    """Add every missing ``snapshot`` and ``repo_revision`` key of ``manifests`` to ``instance`` now."""
    for req in partition_requests(instance, manifests):
        instance.add_dynamic_partitions(req.partitions_def_name, req.partition_keys)


@sensor(name="manifest_partitions_sensor", minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
        default_status=DefaultSensorStatus.RUNNING,
        description="Registers snapshot and repo_revision partitions from the shipped and recorded manifests.")
def manifest_partitions_sensor(context: SensorEvaluationContext, data_root: DataRootResource):
    manifests = known_manifests(data_root.root())
    requests = partition_requests(context.instance, manifests)
    if not requests:
        return SkipReason(f"{len(manifests)} manifests, no new partitions")
    return SensorResult(dynamic_partitions_requests=requests)


def _latest_storage_id(instance, asset: str, partition: str) -> int | None:
    recs = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[partition]), limit=1).records
    return recs[0].storage_id if recs else None


def snapshot_ready(instance, manifest: Manifest) -> tuple[bool, str, int | None]:
    """Whether the snapshot-wide assets of ``manifest`` should run now.

    Returns ``(ready, reason, newest revision storage id)``.
    """
    keys = [manifest.partition_key(s) for s in manifest.sources]
    ids = {k: _latest_storage_id(instance, "scrubbed_files", k) for k in keys}
    missing = [k for k, v in ids.items() if v is None]
    if missing:
        return False, f"{len(missing)} revisions not materialized yet (first {missing[0]})", None
    active = instance.get_runs(filters=RunsFilter(
        job_name="revision_job", tags={"dagster/partition": keys},
        statuses=[DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]),
        limit=1)
    if active:
        return False, "revision runs still in progress", None
    newest = max(ids.values())
    last = _latest_storage_id(instance, "megatron_dataset", manifest.name)
    if last is not None and last > newest:
        return False, "snapshot is newer than all its revisions", newest
    return True, f"{len(keys)} revisions materialized", newest


@sensor(name="snapshot_after_revisions_sensor", job_name="snapshot_job", minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
        default_status=DefaultSensorStatus.RUNNING,
        description="Runs a snapshot's snapshot-wide assets once all its revisions are materialized and newer.")
def snapshot_after_revisions_sensor(context: SensorEvaluationContext, data_root: DataRootResource):
    manifests = known_manifests(data_root.root())
    registered = set(context.instance.get_dynamic_partitions("snapshot"))
    runs, reasons = [], []
    for name, m in manifests.items():
        ready, why, newest = snapshot_ready(context.instance, m)
        if ready and name in registered:
            runs.append(RunRequest(partition_key=name, run_key=f"{name}:{newest}"))
        else:
            reasons.append(f"{name}: {why if not ready else 'partition not registered yet'}")
    if not runs:
        return SkipReason("; ".join(reasons) or "no manifests")
    return SensorResult(run_requests=runs)


def backfill_schedule(manifest: Manifest) -> ScheduleDefinition:
    """The ``backfill_SNAPSHOT`` schedule on the manifest's cron: one ``revision_job`` run
    per source partition (partitions missing from the instance are registered first)."""
    keys = [manifest.partition_key(s) for s in manifest.sources]

    def _requests(context: ScheduleEvaluationContext):
        register_partitions(context.instance, {manifest.name: manifest})
        tick = context.scheduled_execution_time.isoformat() if context.scheduled_execution_time else "manual"
        for k in keys:  # one run per revision and tick (a run_key per request is required)
            yield RunRequest(partition_key=k, run_key=f"{k}@{tick}", tags={"megacpp/snapshot": manifest.name})

    return ScheduleDefinition(name=f"backfill_{manifest.name.replace('-', '_').replace('.', '_')}",
                              cron_schedule=manifest.schedule, job_name="revision_job",
                              execution_fn=_requests, execution_timezone="UTC",
                              description=f"Backfill of snapshot {manifest.name!r} ({len(keys)} revisions) on {manifest.schedule}")


def build_schedules(data_root: DataRoot | str | Path | None = None) -> list[ScheduleDefinition]:
    """One backfill schedule per known manifest with a ``schedule:`` cron, sorted by name."""
    return [backfill_schedule(m) for m in known_manifests(data_root or open_root()).values() if m.schedule]


SENSORS = [manifest_partitions_sensor, snapshot_after_revisions_sensor]
