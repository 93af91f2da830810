"""Dagster code location: the SPEC §4 asset graph, partitions, jobs and Definitions.

Per-revision assets are partitioned by the dynamic ``repo_revision`` partitions (keys
``SNAPSHOT/SOURCE``); snapshot-wide assets are partitioned by the dynamic ``snapshot``
partitions and fan in from every revision. Each asset is a thin wrapper around a
``megacpp_core.pipeline.run_*`` function; its gate is a blocking asset check, so a failed
gate stops everything downstream in the run.
"""


import os
from typing import Any, Callable

from dagster import (
    AllPartitionMapping,
    AssetCheckResult,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetSelection,
    Definitions,
    DynamicPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
    define_asset_job,
)

from megacpp_core import card, pipeline
from megacpp_core.pipeline import StageResult
from megacpp_assets import pod_sensor, profiles, sensors as snapshot_sensors
from megacpp_resources import DataRootResource, ScanCodeResource
from megacpp_resources.kubernetes import AlertSinkResource, KubernetesResource

repo_revision = DynamicPartitionsDefinition(name="repo_revision")
snapshot_partitions = DynamicPartitionsDefinition(name="snapshot")

#: Blocking checks of each asset (SPEC §4 "gate" column).
CHECKS: dict[str, tuple[str, ...]] = {
    "source_files": ("hash_matches_pin", "source_files_schema"),
    "quality_files": ("counts_add_up", "every_rejection_has_reason", "quality_schema"),
    "license_files": ("every_file_decided", "license_schema"),
    "scrubbed_files": ("no_refused_license_downstream", "rescan_finds_nothing", "scrub_schema"),
    "minhash_signatures": ("one_signature_per_file",),
    "compile_commands": ("database_current",),
    "semantic_graph": ("every_tu_accounted", "semantic_schema"),
    "lsh_bands_00_07": ("pairs_cross_source",),
    "lsh_bands_07_14": ("pairs_cross_source",),
    "dedup_decisions": ("each_drop_names_kept_twin",),
    "tokenizer": ("vocab_size_exact", "fixed_special_ids", "round_trip_every_document"),
    "chunked_documents": ("budgets_hold", "documents_schema"),
    "chunk_dedup": ("only_whitelisted_kinds_dropped",),
    "tokenized_documents": ("bos_first_ids_in_vocab_round_trip", "tokenized_schema"),
    "packed_rows": ("row_contract",),
    "megatron_dataset": ("verify_gate",),
}


def _specs(name: str) -> list[AssetCheckSpec]:
    return [AssetCheckSpec(c, asset=name, blocking=True) for c in CHECKS[name]]


def _metadata(value: Any) -> Any:
    if isinstance(value, bool):
        return MetadataValue.bool(value)
    if isinstance(value, int):
        return MetadataValue.int(value)
    if isinstance(value, float):
        return MetadataValue.float(value)
    if isinstance(value, (dict, list)):
        return MetadataValue.json(value)
    return MetadataValue.text(str(value))


def to_result(name: str, res: StageResult, extra: dict[str, Any] | None = None) -> MaterializeResult:
    """Turn a stage result into asset metadata plus the asset's check results."""
    md: dict[str, Any] = {k: _metadata(v) for k, v in sorted(res.figures.items())}
    md.update({f"path_{k}": MetadataValue.path(v) for k, v in res.outputs.items()})
    md.update(extra or {})
    checks = [AssetCheckResult(check_name=c, passed=bool(res.checks.get(c, (False, "not evaluated"))[0]),
                               metadata={"detail": res.checks.get(c, (False, "not evaluated"))[1]})
              for c in CHECKS[name]]
    return MaterializeResult(metadata=md, check_results=checks)


def _revision_asset(name: str, stage: Callable[..., StageResult], deps: list[str], description: str):
    @asset(name=name, partitions_def=repo_revision, group_name="per_revision", deps=deps,
           check_specs=_specs(name), kinds={"parquet"}, description=description)
    def _a(context: AssetExecutionContext, data_root: DataRootResource) -> MaterializeResult:
        layout, manifest, source = data_root.for_revision(context.partition_key)
        res = stage(layout, manifest, source)
        context.log.info(f"{name} {context.partition_key}: {res.figures.get('files_out', res.figures.get('files'))} files")
        return to_result(name, res)

    return _a


source_files = _revision_asset("source_files", pipeline.run_acquire, [],
                               "Stage 0: the pinned sdist fetched (hash-checked, never built) and read safely into the source_files table.")
quality_files = _revision_asset("quality_files", pipeline.run_quality, ["source_files"],
                                "Stage 1: extension whitelist and quality heuristics; rejected files go to the exclusions table.")


@asset(partitions_def=repo_revision, group_name="per_revision", deps=["quality_files"],
       check_specs=_specs("license_files"), kinds={"parquet"},
       description="Stage 2: ScanCode license detection; SPDX expression, class and decision per file.")
def license_files(context: AssetExecutionContext, data_root: DataRootResource, scancode: ScanCodeResource) -> MaterializeResult:
    layout, manifest, source = data_root.for_revision(context.partition_key)
    res = pipeline.run_license(layout, manifest, source, scancode.scanner())
    return to_result("license_files", res)


scrubbed_files = _revision_asset("scrubbed_files", pipeline.run_scrub, ["license_files"],
                                 "Stage 3: PII and secret scrub of license-accepted files; fail-closed re-scan.")

#: Pod resources of the MinHash steps under the k8s_job_executor (SPEC §5: per-asset
#: ``dagster-k8s/config`` tags give the MinHash steps their own pods), and their pool.
MINHASH_OP_TAGS = profiles.HEAVY_STEP_TAGS["minhash"]
MINHASH_POOL = profiles.POOLS["minhash"]

#: Cross-source LSH band ranges (of 14 bands × 8 rows), one step (pod) each; merged by
#: union-find in ``dedup_decisions``.
LSH_BAND_RANGES = ((0, 7), (7, 14))


@asset(partitions_def=repo_revision, group_name="per_revision", deps=["scrubbed_files"],
       check_specs=_specs("minhash_signatures"), kinds={"parquet"}, op_tags=MINHASH_OP_TAGS, pool=MINHASH_POOL,
       description="Stage 4a: MinHash signatures (uint32[128] per file, 5-token shingles) of one revision.")
def minhash_signatures(context: AssetExecutionContext, data_root: DataRootResource) -> MaterializeResult:
    layout, manifest, source = data_root.for_revision(context.partition_key)
    return to_result("minhash_signatures", pipeline.run_minhash(layout, manifest, source))


compile_commands = _revision_asset(
    "compile_commands", pipeline.run_compile_commands, ["source_files"],
    "libclang lane: the revision's compile command database — the shipped compile_commands.json made relative "
    "to the tree, or one synthesized from the file tree (nothing from the corpus runs); no-op unless "
    "settings.semantic_graph.")

#: Pod resources and pool of the libclang step (SPEC §5: heavy steps get their own pods).
LIBCLANG_OP_TAGS = profiles.HEAVY_STEP_TAGS["libclang"]
LIBCLANG_POOL = profiles.POOLS["libclang"]


@asset(partitions_def=repo_revision, group_name="per_revision", deps=["compile_commands", "scrubbed_files"],
       check_specs=_specs("semantic_graph"), kinds={"parquet"}, op_tags=LIBCLANG_OP_TAGS, pool=LIBCLANG_POOL,
       description="libclang lane (optional layer 5): every kept translation unit parsed by libclang in a process "
                   "pool with a per-TU timeout; USR-resolved call/type/include edges and build_info provenance. "
                   "No-op unless settings.semantic_graph.")
def semantic_graph(context: AssetExecutionContext, data_root: DataRootResource) -> MaterializeResult:
    layout, manifest, source = data_root.for_revision(context.partition_key)
    res = pipeline.run_semantic_graph(layout, manifest, source, log=context.log.info)
    if res.figures.get("enabled"):
        context.log.info(f"semantic_graph {context.partition_key}: {res.figures.get('tus')} TUs, "
                         f"TU coverage {res.figures.get('tu_coverage')}, call coverage {res.figures.get('call_coverage')}")
    return to_result("semantic_graph", res)


def _lsh_band_asset(lo: int, hi: int):
    name = f"lsh_bands_{lo:02d}_{hi:02d}"

    @asset(name=name, partitions_def=snapshot_partitions, group_name="snapshot",
           deps=[AssetDep("minhash_signatures", partition_mapping=AllPartitionMapping())],
           check_specs=_specs(name), op_tags=MINHASH_OP_TAGS, pool=MINHASH_POOL,
           description=f"Stage 4b: cross-source LSH candidate pairs of bands {lo}-{hi - 1} (14 x 8 over 112 permutations).")
    def _a(context: AssetExecutionContext, data_root: DataRootResource) -> MaterializeResult:
        layout, manifest = data_root.for_snapshot(context.partition_key)
        return to_result(name, pipeline.run_lsh_bands(layout, manifest, lo, hi))

    return _a


LSH_BAND_ASSETS = [_lsh_band_asset(lo, hi) for lo, hi in LSH_BAND_RANGES]


def _snapshot_asset(name: str, stage: Callable[..., StageResult], deps: list, description: str, final: bool = False):
    @asset(name=name, partitions_def=snapshot_partitions, group_name="snapshot", deps=deps,
           check_specs=_specs(name), description=description)
    def _a(context: AssetExecutionContext, data_root: DataRootResource) -> MaterializeResult:
        layout, manifest = data_root.for_snapshot(context.partition_key)
        res = stage(layout, manifest)
        extra = {}
        if final:
            text = card.write_card(layout, manifest)
            extra = {"card": MetadataValue.md(text), "path_card": MetadataValue.path(str(layout.card))}
        return to_result(name, res, extra)

    return _a


dedup_decisions = _snapshot_asset(
    "dedup_decisions", lambda layout, manifest: pipeline.run_dedup(layout, manifest, list(LSH_BAND_RANGES)),
    [AssetDep("scrubbed_files", partition_mapping=AllPartitionMapping())] + [a.key for a in LSH_BAND_ASSETS],
    "Stage 4: SHA-256 exact dedup, MinHash-LSH near dedup within each source, then the cross-source "
    "union-find pass over the merged band-range candidate pairs; writes duplicate_clusters.")
tokenizer = _snapshot_asset("tokenizer", pipeline.run_tokenizer, ["dedup_decisions"],
                            "Stage 5: byte-level BPE trained on the deduplicated snapshot; special tokens at IDs 0-63.")
chunked_documents = _snapshot_asset(
    "chunked_documents", pipeline.run_chunk,
    ["tokenizer", AssetDep("semantic_graph", partition_mapping=AllPartitionMapping())],
    "Stage 6: tree-sitter split at declaration boundaries under an exact token budget (brace-balanced fallback for "
    "files with ERROR nodes), buckets, and enrichment: structure/AST planes, chunk graph, platform labels; the "
    "libclang lane's edges replace tree-sitter's for the files it covers.")
chunk_dedup = _snapshot_asset("chunk_dedup", pipeline.run_chunk_dedup, ["chunked_documents"],
                              "Stage 7: exact dedup of FUNC_BODY, CLASS_DECL, TYPEDEF and NAMESPACE chunks only.")
tokenized_documents = _snapshot_asset("tokenized_documents", pipeline.run_tokenize, ["chunk_dedup"],
                                      "Stage 8: BOS + uint32 ids per document, round trip checked; enrichment "
                                      "planes aligned token-for-token (fails closed).")
packed_rows = _snapshot_asset("packed_rows", pipeline.run_pack, ["tokenized_documents"],
                              "Stage 9: best-fit-decreasing packing into parquet shards with the _SUCCESS sentinel.")
megatron_dataset = _snapshot_asset("megatron_dataset", pipeline.run_format, ["packed_rows"],
                                   "Stage 10: Megatron .bin/.idx (int32 ids) and the verify gate; writes the dataset card.",
                                   final=True)

REVISION_ASSETS = [source_files, quality_files, license_files, scrubbed_files, minhash_signatures,
                   compile_commands, semantic_graph]
SNAPSHOT_ASSETS = [*LSH_BAND_ASSETS, dedup_decisions, tokenizer, chunked_documents, chunk_dedup, tokenized_documents, packed_rows, megatron_dataset]

revision_job = define_asset_job("revision_job", selection=AssetSelection.groups("per_revision"),
                                partitions_def=repo_revision, executor_def=profiles.executor(),
                                description="Stages 0-3 for one repo_revision partition.")
snapshot_job = define_asset_job("snapshot_job", selection=AssetSelection.groups("snapshot"),
                                partitions_def=snapshot_partitions, executor_def=profiles.executor(),
                                description="Stages 4-10 for one snapshot, fanning in from its revisions.")

defs = Definitions(
    assets=REVISION_ASSETS + SNAPSHOT_ASSETS + [pod_sensor.k8s_workers],
    asset_checks=[pod_sensor.running_pods_nonzero],
    jobs=[revision_job, snapshot_job],
    sensors=[pod_sensor.running_pods_sensor, *snapshot_sensors.SENSORS],
    schedules=snapshot_sensors.build_schedules(),
    resources={"data_root": DataRootResource(), "scancode": ScanCodeResource(),
               "kubernetes": KubernetesResource(), "alerts": AlertSinkResource(
                   webhook_url=os.environ.get("MEGACPP_ALERT_WEBHOOK", ""))},
)
