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
    assert keys == set(ORDER) | {"k8s_workers", "minhash_signatures", "lsh_bands_00_07", "lsh_bands_07_14",
                                 "compile_commands", "semantic_graph"}
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


def test_production_profile_uses_k8s_job_executor():
    import os
    import subprocess
    import sys

    code = ("from megacpp_assets.definitions import defs; "
            "print(defs.resolve_job_def('revision_job').executor_def.name, defs.resolve_job_def('snapshot_job').executor_def.name)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={**os.environ, "MEGACPP_PROFILE": "production"}).stdout.split()
    assert out == ["k8s", "k8s"]
    local = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "MEGACPP_PROFILE"}).stdout.split()
    assert local == ["multiprocess", "multiprocess"]


def test_minhash_steps_have_their_own_pod_resources_and_band_split():
    import json

    from megacpp_assets.definitions import LSH_BAND_RANGES

    graph = defs.resolve_asset_graph()
    assert graph.get(AssetKey("minhash_signatures")).partitions_def.name == "repo_revision"
    assert sorted(b for lo, hi in LSH_BAND_RANGES for b in range(lo, hi)) == list(range(14))
    for name in ("minhash_signatures", "lsh_bands_00_07", "lsh_bands_07_14"):
        op = defs.resolve_assets_def(AssetKey(name)).op
        cfg = op.tags["dagster-k8s/config"]  # Dagster stores dict tags as JSON text
        res = (json.loads(cfg) if isinstance(cfg, str) else cfg)["container_config"]["resources"]
        assert res["requests"]["cpu"] and res["limits"]["memory"], name
    for name in ("lsh_bands_00_07", "lsh_bands_07_14"):
        assert AssetKey(name) in graph.get(AssetKey("dedup_decisions")).parent_keys
        assert AssetKey("minhash_signatures") in graph.get(AssetKey(name)).parent_keys
