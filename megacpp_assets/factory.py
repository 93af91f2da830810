"""The asset factory: Dagster assets and blocking asset checks generated from the stage
declarations of :mod:`megacpp_core.stages` (one factory for every stage).

For each :class:`~megacpp_core.stage.Stage` the factory builds one asset named
``stage.asset``: partitioned by the dynamic ``repo_revision`` partitions (keys
``SNAPSHOT/SOURCE``), the revision × ``shard`` grid (keys ``SNAPSHOT/SOURCE|SHARD``) or the
``snapshot`` partitions; its dependencies are the stages that
write the datasets it reads (a snapshot stage reading a per-revision dataset fans in with
``AllPartitionMapping``); its ``code_version`` is the stage's; its blocking asset checks
are the stage's gates plus one schema check per output table; heavy stages carry their
pod resources and concurrency pool; declared tools become required resources. The
asset body only calls :func:`megacpp_core.runner.run_stage` and turns the result into a
``MaterializeResult``: figures as metadata (a stage's ``plots`` as markdown with inline
PNG images), check results, the partition's data version (a hash of the output files, so
an unchanged output leaves everything downstream in sync) and tags recording the
settings fingerprint and the input versions it read.
"""


import hashlib
import json
import warnings
from typing import Any

from dagster import (
    AllPartitionMapping,
    AssetCheckResult,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    AssetRecordsFilter,
    BetaWarning,
    DataVersion,
    DynamicPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    MultiPartitionsDefinition,
    MultiToSingleDimensionPartitionMapping,
    asset,
)

from megacpp_assets import profiles
from megacpp_core import card, plots
from megacpp_core import stages as stage_registry
from megacpp_core.runner import StageResult, output_uris, revision_shards, run_stage
from megacpp_core.stage import Partition, Partitioning, Stage
from megacpp_core.storage import MissingOutputError

repo_revision = DynamicPartitionsDefinition(name="repo_revision")
snapshot_partitions = DynamicPartitionsDefinition(name="snapshot")
#: Shard keys ``000``, ``001``, … (registered up to the largest shard count of any
#: revision; :mod:`megacpp_core.sharding`).
shard_partitions = DynamicPartitionsDefinition(name="shard")
#: The per-document stages: a grid of revisions × shards (key ``SNAPSHOT/SOURCE|SHARD``).
revision_shard = MultiPartitionsDefinition({"revision": repo_revision, "shard": shard_partitions})

PARTITIONS = {Partitioning.REVISION: repo_revision, Partitioning.REVISION_SHARD: revision_shard,
              Partitioning.SNAPSHOT: snapshot_partitions}
GROUPS = {Partitioning.REVISION: "per_revision", Partitioning.REVISION_SHARD: "per_shard", Partitioning.SNAPSHOT: "snapshot"}
#: Materialization tags the CLI compares to decide what is out of date.
SETTINGS_TAG = "megacpp/settings"
INPUTS_TAG = "megacpp/inputs"
#: Code version of the ``dataset_card`` asset (the card is not a stage).
CARD_CODE_VERSION = "2"
GATES_TAG = "megacpp/gates"


def metadata_value(value: Any) -> Any:
    """A figure as typed Dagster metadata (bool, int, float, JSON, text)."""
    if isinstance(value, bool):
        return MetadataValue.bool(value)
    if isinstance(value, int):
        return MetadataValue.int(value)
    if isinstance(value, float):
        return MetadataValue.float(value)
    if isinstance(value, (dict, list)):
        return MetadataValue.json(value)
    return MetadataValue.text(str(value))


def upstream_partitions(stage: Stage, up: Stage, partition_key: str, sources: list[str], root=None) -> list[str]:
    """The partitions of ``up`` that ``stage``'s partition ``partition_key`` reads, within
    its own snapshot (``sources``: the snapshot's source names; ``root``: the data root,
    whose shard plans name a revision's shards)."""
    part = Partition.parse(partition_key, stage.partitioning)
    if up.partitioning is stage.partitioning:
        return [partition_key]
    if up.partitioning is Partitioning.SNAPSHOT:
        return [part.snapshot]
    mine = [part.source] if part.source is not None else sources
    if up.partitioning is Partitioning.REVISION:
        return [Partition(part.snapshot, s).key for s in mine]
    return [Partition(part.snapshot, s, k).key for s in mine for k in _shards(root, part.snapshot, s)]


def _shards(root, snapshot: str, source: str) -> list[str]:
    try:
        return revision_shards(root, snapshot, source) if root is not None else []
    except MissingOutputError:
        return []


def register_shards(instance, root, snapshot: str, source: str) -> list[str]:
    """Add the shard keys of a revision's plan missing from the ``shard`` partitions; returns them."""
    from sqlalchemy.exc import DBAPIError

    keys = _shards(root, snapshot, source)
    for attempt in range(3):  # workers of one run register the same shard keys at once
        have = set(instance.get_dynamic_partitions(shard_partitions.name))
        new = [k for k in keys if k not in have]
        if not new:
            break
        try:
            instance.add_dynamic_partitions(shard_partitions.name, new)
            break
        except DBAPIError:  # unique key taken by another process (or the database busy): read again
            if attempt == 2:
                raise
    return keys


def current_data_version(instance, asset: str, partition: str) -> str | None:
    """The data version of the latest materialization of ``asset`` at ``partition``."""
    recs = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[partition]), limit=1).records
    if not recs:
        return None
    mat = recs[0].asset_materialization
    return (mat.tags or {}).get("dagster/data_version") if mat else None


def inputs_fingerprint(instance, stage: Stage, partition_key: str, sources: list[str],
                       producers: dict[str, Stage], root=None, enabled: bool = True) -> str:
    """Hex sha256 (16 chars) over the current data versions of every upstream partition
    ``stage``'s partition reads (restricted to its snapshot); ``"off"`` for a stage its
    ``enabled`` setting switches off, which reads nothing."""
    if not enabled:
        return "off"
    lines = []
    for up in _upstream_stages(stage, producers):
        for p in upstream_partitions(stage, up, partition_key, sources, root):
            lines.append(f"{up.asset}@{p}={current_data_version(instance, up.asset, p)}")
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:16]


def _upstream_stages(stage: Stage, producers: dict[str, Stage]) -> list[Stage]:
    seen: dict[str, Stage] = {}
    for d in stage.inputs:
        up = producers[d.name]
        seen.setdefault(up.asset, up)
    return list(seen.values())


def to_result(stage: Stage, res: StageResult, root, extra_tags: dict[str, str] | None = None) -> MaterializeResult:
    """A stage result as asset metadata, check results, data version and tags."""
    md: dict[str, Any] = {k: metadata_value(v) for k, v in sorted(res.figures.items())}
    md.update({f"path_{k}": MetadataValue.path(v) for k, v in output_uris(root, res).items()})
    md["settings_fingerprint"] = MetadataValue.text(res.settings_fingerprint)
    if stage.plots is not None and res.ok:
        md["plots"] = MetadataValue.md(plots.markdown_images(stage.plots(res.figures)))
    checks = [AssetCheckResult(check_name=c, passed=bool(res.checks.get(c, (False, "not evaluated"))[0]),
                               metadata={"detail": str(res.checks.get(c, (False, "not evaluated"))[1])})
              for c in stage.check_names]
    tags = {SETTINGS_TAG: res.settings_fingerprint, GATES_TAG: "passed" if res.ok else "failed", **(extra_tags or {})}
    return MaterializeResult(metadata=md, check_results=checks, data_version=DataVersion(res.data_version), tags=tags)


def partition_mapping(up: Partitioning, down: Partitioning):
    """How a ``down`` partition maps to the ``up`` partitions it reads: the same key, all
    of them (a snapshot step fanning in, or a revision/shard step reading a snapshot-wide
    dataset), or the ``revision`` dimension of the revision × shard grid (either way)."""
    if up is down:
        return None
    if down is Partitioning.SNAPSHOT:
        return AllPartitionMapping()
    if up is Partitioning.SNAPSHOT:
        # a per-revision or per-shard asset reading a snapshot-wide one (the chunk shards
        # read the dedup decisions and the tokenizer): no built-in mapping takes the
        # revision key SNAPSHOT/SOURCE to SNAPSHOT, so every snapshot partition is upstream
        # in the graph; the runner reads the partition's own snapshot
        return AllPartitionMapping()
    with warnings.catch_warnings():  # beta in Dagster, and the one mapping that takes a shard to its revision
        warnings.simplefilter("ignore", BetaWarning)
        return MultiToSingleDimensionPartitionMapping(partition_dimension_name="revision")


def stage_asset(stage: Stage, producers: dict[str, Stage]):
    """The asset (with its blocking checks) of one declared stage."""
    deps, seen = [], set()
    for up in _upstream_stages(stage, producers):
        if up.asset in seen:
            continue
        seen.add(up.asset)
        deps.append(AssetDep(up.asset, partition_mapping=partition_mapping(up.partitioning, stage.partitioning)))
    gate_docs = {g.__name__: (g.__doc__ or "").strip() for g in stage.gates}
    schema_docs = {d.schema_check: f"pandera schema of {d.name}: {d.description}" for d in stage.outputs if d.schema_check}
    specs = [AssetCheckSpec(c, asset=stage.asset, blocking=True, description=gate_docs.get(c) or schema_docs.get(c))
             for c in stage.check_names]
    heavy = dict(op_tags=profiles.HEAVY_STEP_TAGS[stage.heavy], pool=profiles.POOLS[stage.heavy]) if stage.heavy else {}
    resources = {"data_root", *stage.tools}

    @asset(name=stage.asset, partitions_def=PARTITIONS[stage.partitioning], group_name=GROUPS[stage.partitioning],
           deps=deps, check_specs=specs, code_version=stage.code_version, kinds=set(stage.kinds),
           description=stage.description, required_resource_keys=resources,
           metadata={"stage": stage.name, "inputs": [d.name for d in stage.inputs],
                     "outputs": [d.name for d in stage.outputs], "settings": list(stage.settings)},
           **heavy)
    def _asset(context: AssetExecutionContext) -> MaterializeResult:
        root, manifest, partition = context.resources.data_root.resolve(context.partition_key, stage.partitioning)
        tools = {name: getattr(context.resources, name).tool() for name in stage.tools}
        sources = [s.name for s in manifest.sources]
        enabled = stage.enabled is None or bool(getattr(manifest.settings, stage.enabled))
        inputs = inputs_fingerprint(context.instance, stage, partition.key, sources, producers, root, enabled)
        res = run_stage(stage, root, manifest, partition, tools=tools, log_fn=context.log.info)
        if any(d.scope is Partitioning.REVISION_SHARD for d in stage.outputs) and partition.shard is None:
            keys = register_shards(context.instance, root, partition.snapshot, partition.source)
            context.log.info(f"{stage.asset} {partition.key}: {len(keys)} shard(s) {', '.join(keys)}")
        context.log.info(f"{stage.asset} {context.partition_key}: data version {res.data_version[:12]}, "
                         f"gates {'passed' if res.ok else 'FAILED'}")
        return to_result(stage, res, root, {INPUTS_TAG: inputs})

    return _asset


def build_assets(stages: tuple[Stage, ...] = stage_registry.STAGES) -> list:
    """Every stage's asset, in registry order (see the module docstring)."""
    producers = stage_registry.producers(stages)
    return [stage_asset(s, producers) for s in stages]


def dataset_card_asset(finals: list[Stage]):
    """The ``dataset_card`` asset: renders ``card.md`` from every stage's figures after
    the ``finals`` (the snapshot stages nothing else reads:
    :func:`megacpp_core.stages.sinks`; the card is the only reader of figures), and shows
    it in the UI."""

    @asset(name="dataset_card", partitions_def=snapshot_partitions, group_name="snapshot", deps=[s.asset for s in finals],
           code_version=CARD_CODE_VERSION, kinds={"markdown"}, required_resource_keys={"data_root"},
           description="The dataset card: a markdown summary of the snapshot, stage by stage (SPEC §9).")
    def _card(context: AssetExecutionContext) -> MaterializeResult:
        root, manifest, _ = context.resources.data_root.resolve(context.partition_key, Partitioning.SNAPSHOT)
        text, images = card.write_card_and_plots(root, manifest)
        from megacpp_core import layout

        key = layout.card_key(manifest.name)
        md = {"card": MetadataValue.md(text), "path_card": MetadataValue.path(root.uri(key))}
        if images:
            md["plots"] = MetadataValue.md(plots.markdown_images(images, card.PLOT_TITLES))
        digest = hashlib.sha256(text.encode() + b"".join(images.values())).hexdigest()
        return MaterializeResult(metadata=md, data_version=DataVersion(digest))

    return _card


def describe(stages: tuple[Stage, ...] = stage_registry.STAGES) -> str:
    """A JSON summary of the generated graph (asset, partitioning, deps, checks), for docs."""
    producers = stage_registry.producers(stages)
    return json.dumps([{"asset": s.asset, "partitioning": s.partitioning.value,
                        "deps": sorted({producers[d.name].asset for d in s.inputs}), "checks": list(s.check_names),
                        "code_version": s.code_version} for s in stages], indent=2)
