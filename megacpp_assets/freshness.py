"""Which assets of a snapshot are out of date, from Dagster's code and data versions.

A partition of a stage asset is **out of date** when one of these holds (first reason
wins, so the CLI can say why):

1. it was never materialized;
2. its recorded ``dagster/code_version`` differs from the stage's ``code_version`` (the
   same rule that makes the UI show it "unsynced");
3. its recorded settings fingerprint (``megacpp/settings``: the stage's settings slice,
   and the source pin for acquire) differs from the manifest's now;
4. its last materialization failed a gate;
5. the data versions of the upstream partitions it reads, within its own snapshot, differ
   from the ones it read (``megacpp/inputs``) — data versions are hashes of the output
   files, so an upstream re-run that wrote identical bytes changes nothing downstream;
6. one of its outputs is gone from the data root;
7. for a ``local`` source, the directory's content hash differs from the recorded revision.

``megacpp run`` materializes, per partition, the out-of-date assets and everything
downstream of them in the same job, and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from megacpp_assets.factory import GATES_TAG, INPUTS_TAG, SETTINGS_TAG, LatestMaterializations, inputs_fingerprint
from megacpp_core import stages as stage_registry
from megacpp_core.manifest import Manifest
from megacpp_core.runner import InputRef, revision_shards, settings_fingerprint
from megacpp_core.stage import Partition, Partitioning, Stage
from megacpp_core.storage import DataRoot, MissingOutputError


@dataclass(frozen=True)
class Staleness:
    """An out-of-date asset partition and why."""

    asset: str
    partition: str
    reason: str


def _version_staleness(mat, code_version: str) -> str | None:
    """Rules 1 and 2 for any asset: never materialized, or another code version recorded."""
    if mat is None:
        return "never materialized"
    recorded = (mat.tags or {}).get("dagster/code_version")
    return None if recorded == code_version else f"code version {recorded} → {code_version}"


def stage_staleness(instance, stage: Stage, root: DataRoot, manifest: Manifest, partition: Partition,
                    producers: dict[str, Stage], latest: LatestMaterializations | None = None) -> str | None:
    """Why ``stage``'s ``partition`` is out of date (module docstring), or None when current.
    ``latest``: the materialization index to read (default a new one on ``instance``)."""
    latest = latest or LatestMaterializations(instance)
    mat = latest.get(stage.asset, partition.key)
    if reason := _version_staleness(mat, stage.code_version):
        return reason
    tags = mat.tags or {}
    if tags.get(SETTINGS_TAG) != settings_fingerprint(stage, manifest, partition):
        return "settings changed"
    if tags.get(GATES_TAG) != "passed":
        return "a gate failed on the last materialization"
    sources = [s.name for s in manifest.sources]
    enabled = stage.enabled is None or bool(getattr(manifest.settings, stage.enabled))
    if tags.get(INPUTS_TAG) != inputs_fingerprint(instance, stage, partition.key, sources, producers, root, enabled, latest):
        return "upstream data changed"
    if enabled:
        for d in stage.outputs:
            if d.scope is Partitioning.REVISION_SHARD and partition.shard is None:  # acquire's shards
                try:
                    parts = [Partition(partition.snapshot, partition.source, k)
                             for k in revision_shards(root, partition.snapshot, partition.source)]
                except MissingOutputError:
                    return "its shard plan is missing from the data root"
            else:
                parts = [partition]
            if not all(InputRef(root, d, p).exists() for p in parts):
                return f"output {d.name} is missing from the data root"
    if stage.reads_source_pin and partition.source:
        source = manifest.source(partition.source)
        if source.kind == "local":
            from megacpp_core.acquire_local import acquire_local

            recorded = getattr(mat.metadata.get("revision"), "value", None)
            if acquire_local(source).revision != recorded:
                return "the local directory's content changed"
    return None


def plan(instance, stages: tuple[Stage, ...], root: DataRoot, manifest: Manifest, partition: Partition,
         extra: dict[str, tuple[str, list[str], Callable[[], bool]]] | None = None,
         latest: LatestMaterializations | None = None, only: Collection[str] | None = None) -> list[Staleness]:
    """The assets of ``stages`` with ``partition``'s partitioning to materialize for it: the
    out-of-date ones and everything downstream of them (registry order). ``extra``: assets
    outside the registry, ``{asset: (code_version, upstream assets, exists())}`` (the
    dataset card). ``latest``: a materialization index kept across plans (``megacpp run``
    keeps one per process); it is refreshed here, so what runs materialized since the
    last plan counts. ``only``: the assets to plan (``megacpp run`` plans the assets of
    one pass; those of earlier passes were planned, and made current, by those passes):
    the others are not looked at, so none of them makes one of these downstream of it
    (each is still out of date by its own rules, upstream data versions included). It
    is for a caller that has just run the earlier passes of the same snapshot; a plan
    meant to say everything that is out of date (a status) passes no ``only``."""
    if latest is None:
        latest = LatestMaterializations(instance, kept=True)
    latest.refresh()
    producers = stage_registry.producers(stages)
    mine = [s for s in stages if s.partitioning is partition.partitioning and (only is None or s.asset in only)]
    out: list[Staleness] = []
    chosen: set[str] = set()
    for s in mine:
        ups = {producers[d.name].asset for d in s.inputs if producers[d.name].partitioning is s.partitioning}
        hit = sorted(ups & chosen)
        reason = f"downstream of {', '.join(hit)}" if hit else stage_staleness(instance, s, root, manifest, partition, producers, latest)
        if reason:
            chosen.add(s.asset)
            out.append(Staleness(s.asset, partition.key, reason))
    for asset, (code_version, ups, exists) in (extra or {}).items():
        hit = sorted(set(ups) & chosen)
        if hit:
            reason = f"downstream of {', '.join(hit)}"
        else:
            reason = _version_staleness(latest.get(asset, partition.key), code_version)
            if reason is None and not exists():
                reason = "output missing from the data root"
        if reason:
            chosen.add(asset)
            out.append(Staleness(asset, partition.key, reason))
    return out

