"""Dagster code location: the SPEC §4 asset graph generated from the stage declarations,
partitions, jobs, sensors, schedules and Definitions.

Every stage asset and its blocking checks come from :mod:`megacpp_assets.factory` over
:data:`megacpp_core.stages.STAGES`; per-revision assets are partitioned by the dynamic
``repo_revision`` partitions (keys ``SNAPSHOT/SOURCE``), per-document assets by the
revision × ``shard`` multi-partitions (keys ``SNAPSHOT/SOURCE|SHARD``), snapshot-wide assets by the
dynamic ``snapshot`` partitions and fan in from every revision. A failed gate is a failed
blocking check, so nothing downstream runs in that run.
"""

import os

from dagster import AssetKey, AssetSelection, Definitions, define_asset_job

from megacpp_assets import pod_sensor, profiles
from megacpp_assets import sensors as snapshot_sensors
from megacpp_assets.factory import (build_assets, dataset_card_asset, repo_revision, revision_shard, shard_partitions,
                                    snapshot_partitions)
from megacpp_core.stage import Partitioning
from megacpp_core.stages import STAGES, sinks
from megacpp_resources import DataRootResource, ScanCodeResource
from megacpp_resources.kubernetes import AlertSinkResource, KubernetesResource

__all__ = ["defs", "build_definitions", "repo_revision", "revision_shard", "shard_partitions", "snapshot_partitions"]


def build_definitions(stages=STAGES) -> Definitions:
    """The code location's Definitions for ``stages`` (the registry by default; tests pass
    a variant, e.g. with one stage's ``code_version`` bumped)."""
    assets = build_assets(stages)
    card = dataset_card_asset(sinks(stages))
    revision_keys = [AssetKey(s.asset) for s in stages if s.partitioning is Partitioning.REVISION]
    shard_keys = [AssetKey(s.asset) for s in stages if s.partitioning is Partitioning.REVISION_SHARD]
    snapshot_keys = [AssetKey(s.asset) for s in stages if s.partitioning is Partitioning.SNAPSHOT] + [card.key]
    revision_job = define_asset_job("revision_job", selection=AssetSelection.assets(*revision_keys),
                                    partitions_def=repo_revision, executor_def=profiles.executor(),
                                    description="The per-revision stages for one repo_revision partition.")
    shard_job = define_asset_job("shard_job", selection=AssetSelection.assets(*shard_keys),
                                 partitions_def=revision_shard, executor_def=profiles.executor(),
                                 description="The per-document stages for one revision × shard partition (SNAPSHOT/SOURCE|SHARD).")
    snapshot_job = define_asset_job("snapshot_job", selection=AssetSelection.assets(*snapshot_keys),
                                    partitions_def=snapshot_partitions, executor_def=profiles.executor(),
                                    description="The snapshot-wide stages for one snapshot, fanning in from its revisions.")
    return Definitions(
        assets=[*assets, card, pod_sensor.k8s_workers],
        asset_checks=[pod_sensor.running_pods_nonzero],
        jobs=[revision_job, shard_job, snapshot_job],
        sensors=[pod_sensor.running_pods_sensor, *snapshot_sensors.SENSORS],
        schedules=snapshot_sensors.build_schedules(),
        resources={"data_root": DataRootResource(), "scancode": ScanCodeResource(),
                   "kubernetes": KubernetesResource(), "alerts": AlertSinkResource(
                       webhook_url=os.environ.get("MEGACPP_ALERT_WEBHOOK", ""))},
    )


defs = build_definitions()
