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
from collections.abc import Generator, Iterator
from typing import Any

from dagster import (
    AllPartitionMapping,
    AssetCheckResult,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    AssetRecordsFilter,
    AssetSpec,
    BetaWarning,
    DagsterEventType,
    DataVersion,
    DynamicPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    MultiPartitionsDefinition,
    MultiToSingleDimensionPartitionMapping,
    Nothing,
    asset,
    multi_asset,
)
from dagster._core.definitions.data_version import DATA_VERSION_TAG  # the tag of a data version (indexed)

from megacpp_assets import profiles
from megacpp_core import card, memo, plots
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


class LatestMaterializations:
    """The latest materialization of each (asset, partition) of one Dagster instance, read in
    bulk.

    Per call, one query gives the latest storage id of each requested partition
    (``get_latest_storage_id_by_partition``, which honours asset wipes, as
    ``fetch_materializations`` does). A materialization record never changes, so records
    are kept by storage id, and every record a call still lacks is fetched in one
    ``fetch_materializations`` by storage id. Freshness planning of one partition asks for
    about a dozen (asset, partition) pairs, and a snapshot step for every revision of each
    upstream asset; one query per pair cost ~8 ms each (SQLite), most of a no-op run's
    time. ``kept``: the index serves many plans (``megacpp run`` keeps one per process: a
    record read for one plan is read again by the plans of its sibling partitions;
    :meth:`refresh` starts each plan); an index used once reads a lone partition with one
    direct query instead. Nothing is assumed about the order in which storage ids become
    visible, so each plan is as current as one query per pair, on any storage (SQLite
    or PostgreSQL).

    A step's inputs fingerprint needs only its upstream partitions' data versions:
    :meth:`data_versions` reads them from the event log's tag index in one query, without
    reading (and deserializing) a record."""

    def __init__(self, instance, kept: bool = False):
        self.instance, self.kept = instance, kept
        self._latest: dict[tuple[str, str], int | None] = {}  # the latest id of each pair, as last read
        self._known: set[tuple[str, str]] = set()  # the pairs read since the last refresh()
        self._records: dict[int, Any] = {}
        self._versions: dict[tuple[str, str], str | None] = {}  # data versions read since the last refresh()

    def refresh(self) -> None:
        """Forget which storage id is the latest of each partition (records stay): the
        next reads see what was materialized since. Between two refreshes, a partition's
        latest id is read once (a plan asks for one pair several times)."""
        self._known.clear()
        self._versions.clear()

    def get_many(self, asset: str, partitions: list[str]) -> dict[str, Any]:
        """``{partition: its latest AssetMaterialization or None}``."""
        if not partitions:
            return {}
        if len(partitions) == 1 and not self.kept:
            recs = self.instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=partitions), limit=1).records
            return {partitions[0]: recs[0].asset_materialization if recs else None}
        unknown = {p for p in partitions if (asset, p) not in self._known}
        if unknown:
            ids = self.instance.get_latest_storage_id_by_partition(
                AssetKey(asset), DagsterEventType.ASSET_MATERIALIZATION, partitions=unknown)
            for p in unknown:
                old, new = self._latest.get((asset, p)), ids.get(p)
                if old is not None and old != new:
                    self._records.pop(old, None)  # replaced: not needed again
                self._latest[(asset, p)] = new
                self._known.add((asset, p))
        latest = {p: self._latest[(asset, p)] for p in partitions}
        want = sorted({i for i in latest.values() if i is not None and i not in self._records})
        if want:
            recs = self.instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey(asset), storage_ids=want), limit=len(want)).records
            self._records.update((r.storage_id, r.asset_materialization) for r in recs)
        return {p: None if i is None else self._records.get(i) for p, i in latest.items()}

    def get(self, asset: str, partition: str):
        """The latest AssetMaterialization of ``asset`` at ``partition``, or None."""
        return self.get_many(asset, [partition])[partition]

    def data_versions(self, asset: str, partitions: list[str]) -> dict[str, str | None]:
        """``{partition: the data version tag (``dagster/data_version``) of its latest
        materialization, None when it has none or was never materialized}``, as
        :meth:`get_many`'s records would give it. One query for the pairs not read since
        the last :meth:`refresh`: Dagster's ``get_latest_tags_by_partition`` over the
        event log's tag index (the data version is the one materialization tag Dagster
        indexes), which takes each partition's latest materialization as
        ``get_latest_storage_id_by_partition`` does (asset wipes honoured) and reads no
        record. A pair whose latest record this index holds since the refresh is answered
        from it. Kept until the next refresh (an index used once is not refreshed)."""
        out: dict[str, str | None] = {}
        ask = []
        for p in dict.fromkeys(partitions):
            k = (asset, p)
            if k in self._versions:
                out[p] = self._versions[k]
            elif k in self._known and (self._latest[k] is None or self._latest[k] in self._records):
                out[p] = _data_version(self._records.get(self._latest[k]))
            else:
                ask.append(p)
        if ask:
            tags = self.instance.event_log_storage.get_latest_tags_by_partition(
                AssetKey(asset), DagsterEventType.ASSET_MATERIALIZATION, [DATA_VERSION_TAG], asset_partitions=ask)
            for p in ask:
                out[p] = self._versions[(asset, p)] = tags.get(p, {}).get(DATA_VERSION_TAG)
        return out


def _data_version(mat) -> str | None:
    return (mat.tags or {}).get(DATA_VERSION_TAG) if mat else None


def inputs_fingerprint(instance, stage: Stage, partition_key: str, sources: list[str],
                       producers: dict[str, Stage], root=None, enabled: bool = True,
                       latest: LatestMaterializations | None = None) -> str:
    """Hex sha256 (16 chars) over the current data versions of every upstream partition
    ``stage``'s partition reads (restricted to its snapshot); ``"off"`` for a stage its
    ``enabled`` setting switches off, which reads nothing. ``latest``: the index to read
    them from (default a new one on ``instance``)."""
    if not enabled:
        return "off"
    latest = latest or LatestMaterializations(instance)
    lines = []
    for up in _upstream_stages(stage, producers):
        parts = upstream_partitions(stage, up, partition_key, sources, root)
        versions = latest.data_versions(up.asset, parts)
        lines.extend(f"{up.asset}@{p}={versions[p]}" for p in parts)
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:16]


def _upstream_stages(stage: Stage, producers: dict[str, Stage]) -> list[Stage]:
    seen: dict[str, Stage] = {}
    for d in stage.inputs:
        up = producers[d.name]
        seen.setdefault(up.asset, up)
    return list(seen.values())


def to_result(stage: Stage, res: StageResult, root,
              extra_tags: dict[str, str] | None = None) -> tuple[MaterializeResult, list[AssetCheckResult]]:
    """A stage result as ``(its MaterializeResult: asset metadata, data version and tags;
    one AssetCheckResult per declared check)``. The asset bodies yield the checks after the
    result, each naming its asset and check, rather than inside it
    (``MaterializeResult(check_results=...)``): for a check inside the result, Dagster
    resolves the check's target materialization twice (one event-log query each time,
    once to count the step's outputs and once to store the evaluation); for one yielded
    with its asset key and check name, once. The stored events are the same."""
    md: dict[str, Any] = {k: metadata_value(v) for k, v in sorted(res.figures.items())}
    md.update({f"path_{k}": MetadataValue.path(v) for k, v in output_uris(root, res).items()})
    md["settings_fingerprint"] = MetadataValue.text(res.settings_fingerprint)
    if res.plots:  # drawn by run_stage when every gate passed
        md["plots"] = MetadataValue.md(plots.markdown_images(res.plots))
    checks = [AssetCheckResult(asset_key=stage.asset, check_name=c, passed=bool(res.checks.get(c, (False, "not evaluated"))[0]),
                               metadata={"detail": str(res.checks.get(c, (False, "not evaluated"))[1])})
              for c in stage.check_names]
    tags = {SETTINGS_TAG: res.settings_fingerprint, GATES_TAG: "passed" if res.ok else "failed", **(extra_tags or {})}
    return MaterializeResult(asset_key=stage.asset, metadata=md, data_version=DataVersion(res.data_version), tags=tags), checks


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


def _asset_deps(stage: Stage, producers: dict[str, Stage]) -> list[AssetDep]:
    deps, seen = [], set()
    for up in _upstream_stages(stage, producers):
        if up.asset in seen:
            continue
        seen.add(up.asset)
        deps.append(AssetDep(up.asset, partition_mapping=partition_mapping(up.partitioning, stage.partitioning)))
    return deps


def _check_specs(stage: Stage) -> list[AssetCheckSpec]:
    gate_docs = {g.__name__: (g.__doc__ or "").strip() for g in stage.gates}
    schema_docs = {d.schema_check: f"pandera schema of {d.name}: {d.description}" for d in stage.outputs if d.schema_check}
    return [AssetCheckSpec(c, asset=stage.asset, blocking=True, description=gate_docs.get(c) or schema_docs.get(c))
            for c in stage.check_names]


def _asset_metadata(stage: Stage) -> dict:
    return {"stage": stage.name, "inputs": [d.name for d in stage.inputs], "outputs": [d.name for d in stage.outputs],
            "settings": list(stage.settings)}


def _materialize(context: AssetExecutionContext, stage: Stage,
                 producers: dict[str, Stage]) -> Generator[MaterializeResult | AssetCheckResult, None, bool]:
    """Run ``stage`` on the context's partition and yield its MaterializeResult, then its
    check results (:func:`to_result`). The body of every generated asset, alone or in a
    group; returns whether the stage's gates passed."""
    root, manifest, partition = context.resources.data_root.resolve(context.partition_key, stage.partitioning)
    tools = {name: getattr(context.resources, name).tool() for name in stage.tools}
    sources = [s.name for s in manifest.sources]
    enabled = stage.enabled is None or bool(getattr(manifest.settings, stage.enabled))
    inputs = inputs_fingerprint(context.instance, stage, partition.key, sources, producers, root, enabled)
    res = run_stage(stage, root, manifest, partition, tools=tools, log_fn=context.log.info)
    if any(d.scope is Partitioning.REVISION_SHARD for d in stage.outputs) and partition.shard is None:
        keys = register_shards(context.instance, root, partition.snapshot, partition.source)
        context.log.info(f"{stage.asset} {partition.key}: {len(keys)} shard(s) {', '.join(keys)}")
    if not res.ok:  # a pass shows as the materialization's data version and its checks (no event of its own)
        context.log.info(f"{stage.asset} {context.partition_key}: data version {res.data_version[:12]}, gates FAILED "
                         f"({', '.join(c for c, (ok, _) in sorted(res.checks.items()) if not ok)})")
    result, checks = to_result(stage, res, root, {INPUTS_TAG: inputs})
    yield result
    yield from checks
    return res.ok


def stage_asset(stage: Stage, producers: dict[str, Stage]):
    """The asset (with its blocking checks) of one declared stage that has a step of its own."""
    heavy = dict(op_tags=profiles.HEAVY_STEP_TAGS[stage.heavy], pool=profiles.POOLS[stage.heavy]) if stage.heavy else {}

    @asset(name=stage.asset, partitions_def=PARTITIONS[stage.partitioning], group_name=GROUPS[stage.partitioning],
           deps=_asset_deps(stage, producers), check_specs=_check_specs(stage), code_version=stage.code_version,
           kinds=set(stage.kinds), description=stage.description, required_resource_keys={"data_root", *stage.tools},
           metadata=_asset_metadata(stage), dagster_type=Nothing, **heavy)  # a generator: no type from its annotation
    def _asset(context: AssetExecutionContext) -> Iterator[MaterializeResult | AssetCheckResult]:
        yield from _materialize(context, stage, producers)

    return _asset


def group_step_name(group: tuple[Stage, ...]) -> str:
    """The op (step) name of a group of :func:`megacpp_core.stages.step_groups`: a stage
    alone is its asset's step; stages sharing one step are their stage names joined by
    ``__`` (``quality__license__scrub``)."""
    return group[0].asset if len(group) == 1 else "__".join(s.name for s in group)


def stage_group_asset(group: tuple[Stage, ...], producers: dict[str, Stage]):
    """One step for several stages of one partitioning (:func:`megacpp_core.stages.step_groups`):
    a subsettable ``multi_asset`` with one asset and its blocking checks per stage, so a run
    can select any of them. The selected stages run in registry order on the step's
    partition; when one's gates fail, its result (with the failed checks) is the step's
    last: the stages after it do not run, and Dagster fails the step on the blocking check
    as it does for a single asset. ``AssertionError`` for a group mixing partitionings or
    holding a ``heavy`` stage (those keep their own pod). Whatever a stage handed a later
    one in memory (:mod:`megacpp_core.memo`) is dropped when the step ends, however it ends."""
    assert len({s.partitioning for s in group}) == 1 and not any(s.heavy for s in group), group
    specs = [AssetSpec(s.asset, deps=_asset_deps(s, producers), code_version=s.code_version, kinds=set(s.kinds),
                       description=s.description, metadata=_asset_metadata(s), group_name=GROUPS[s.partitioning],
                       skippable=True)
             for s in group]

    @multi_asset(name=group_step_name(group), specs=specs, check_specs=[c for s in group for c in _check_specs(s)],
                 partitions_def=PARTITIONS[group[0].partitioning], can_subset=True,
                 required_resource_keys={"data_root", *(t for s in group for t in s.tools)})
    def _group(context: AssetExecutionContext):
        selected = context.selected_asset_keys
        alone = sorted({k.asset_key.to_user_string() for k in context.selected_asset_check_keys} -
                       {k.to_user_string() for k in selected})
        if alone:  # a check evaluates the outputs its stage commits: it runs with its asset
            raise ValueError(f"the checks of {', '.join(alone)} run when the asset is materialized; "
                             "select the asset, not its checks alone")
        try:
            for stage in group:
                if AssetKey(stage.asset) not in selected:
                    continue
                ok = yield from _materialize(context, stage, producers)
                if not ok:
                    return
        finally:
            memo.clear_all()  # what one stage handed the next is not kept past the step

    return _group


def build_assets(stages: tuple[Stage, ...] = stage_registry.STAGES) -> list:
    """Every stage's asset, in registry order (see the module docstring): a stage with a
    step of its own is an ``asset``; stages sharing a step
    (:func:`megacpp_core.stages.step_groups`) are one ``multi_asset``."""
    producers = stage_registry.producers(stages)
    return [stage_asset(g[0], producers) if len(g) == 1 else stage_group_asset(g, producers)
            for g in stage_registry.step_groups(stages)]


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
