"""The Dagster code location: asset graph of SPEC §4, partitions, blocking checks, jobs."""

from __future__ import annotations

from dagster import AssetKey, Definitions, DynamicPartitionsDefinition

from megacpp_assets.definitions import CHECKS, defs

ORDER = ["source_files", "quality_files", "license_files", "scrubbed_files", "dedup_decisions", "tokenizer",
         "chunked_documents", "chunk_dedup", "tokenized_documents", "packed_rows", "megatron_dataset"]


def test_definitions_load_and_graph_is_the_stage_chain():
    Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == set(ORDER)
    for up, down in zip(ORDER, ORDER[1:]):
        assert AssetKey(up) in graph.get(AssetKey(down)).parent_keys, (up, down)


def test_partitions_and_fan_in():
    graph = defs.resolve_asset_graph()
    for name in ORDER[:4]:
        pd = graph.get(AssetKey(name)).partitions_def
        assert isinstance(pd, DynamicPartitionsDefinition) and pd.name == "repo_revision"
    for name in ORDER[4:]:
        pd = graph.get(AssetKey(name)).partitions_def
        assert isinstance(pd, DynamicPartitionsDefinition) and pd.name == "snapshot"
    mapping = graph.get_partition_mapping(AssetKey("dedup_decisions"), AssetKey("scrubbed_files"))
    assert type(mapping).__name__ == "AllPartitionMapping"


def test_every_stage_has_blocking_checks():
    graph = defs.resolve_asset_graph()
    for name in ORDER:
        specs = {s.key.name: s for s in graph.get(AssetKey(name)).check_keys and
                 defs.resolve_assets_def(AssetKey(name)).check_specs}
        assert set(specs) == set(CHECKS[name]) and all(s.blocking for s in specs.values()), name
    assert {j.name for j in defs.resolve_all_job_defs()} >= {"revision_job", "snapshot_job"}
