"""The Dagster code location: the asset graph generated from the stage declarations
(SPEC §4), partitions, blocking checks, code versions, jobs."""

from __future__ import annotations

import dataclasses

from dagster import AssetKey, Definitions, DynamicPartitionsDefinition

from megacpp_assets.definitions import build_definitions, defs
from megacpp_core import stages
from megacpp_core.stage import Partitioning
from megacpp_core.stages import STAGES

ORDER = ["source_files", "quality_files", "license_files", "scrubbed_files", "dedup_decisions", "tokenizer",
         "chunked_documents", "tokenized_documents", "packed_rows", "megatron_dataset"]


def test_definitions_load_and_graph_is_the_stage_chain():
    Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == {s.asset for s in STAGES} | {"k8s_workers", "dataset_card"}
    assert set(ORDER) | {"chunk_dedup", "minhash_signatures", "lsh_bands_00_07", "lsh_bands_07_14", "compile_commands",
                         "semantic_graph", "phase1_phase2_documents", "p3_repo_documents", "p4_structure_documents",
                         "p1_simple_dataset", "p1_docrich_dataset", "p2_file_dataset", "p3_repo_dataset",
                         "p4_structure_dataset", "blends"} == {s.asset for s in STAGES}
    for up, down in zip(ORDER, ORDER[1:]):
        assert AssetKey(up) in graph.get(AssetKey(down)).parent_keys, (up, down)
    assert AssetKey("megatron_dataset") in graph.get(AssetKey("dataset_card")).parent_keys
    # the chunk-level dedup decides on the chunk shards; pack and format leave its drops out
    assert AssetKey("chunked_documents") in graph.get(AssetKey("chunk_dedup")).parent_keys
    assert AssetKey("chunk_dedup") in graph.get(AssetKey("packed_rows")).parent_keys
    # the curriculum families (SPEC 5b) build on the tokenized documents
    for up, down in (("tokenized_documents", "phase1_phase2_documents"), ("tokenized_documents", "p3_repo_documents"),
                     ("phase1_phase2_documents", "p1_simple_dataset"), ("phase1_phase2_documents", "p2_file_dataset"),
                     ("p3_repo_documents", "p3_repo_dataset"), ("p3_repo_documents", "p4_structure_documents"),
                     ("semantic_graph", "p4_structure_documents"), ("p4_structure_documents", "p4_structure_dataset")):
        assert AssetKey(up) in graph.get(AssetKey(down)).parent_keys, (up, down)
    # the blends point Megatron at every family's dataset; the card waits for them
    fams = {AssetKey(f"{f}_dataset") for f in ("p1_simple", "p1_docrich", "p2_file", "p3_repo", "p4_structure")}
    assert set(graph.get(AssetKey("blends")).parent_keys) == fams
    assert AssetKey("blends") in graph.get(AssetKey("dataset_card")).parent_keys


def test_every_dependency_is_a_declared_input():
    """The generated deps are exactly the producers of each stage's declared inputs."""
    graph = defs.resolve_asset_graph()
    producers = stages.producers()
    for s in STAGES:
        want = {AssetKey(producers[d.name].asset) for d in s.inputs}
        assert set(graph.get(AssetKey(s.asset)).parent_keys) == want, s.name


def test_partitions_and_fan_in():
    graph = defs.resolve_asset_graph()
    for s in STAGES:
        pd = graph.get(AssetKey(s.asset)).partitions_def
        if s.partitioning is Partitioning.REVISION_SHARD:  # the revision × shard grid
            dims = {d.name: d.partitions_def for d in pd.partitions_defs}
            assert dims["revision"].name == "repo_revision" and dims["shard"].name == "shard", s.asset
            continue
        want = "repo_revision" if s.partitioning is Partitioning.REVISION else "snapshot"
        assert isinstance(pd, DynamicPartitionsDefinition) and pd.name == want, s.asset
    mapping = graph.get_partition_mapping(AssetKey("dedup_decisions"), AssetKey("scrubbed_files"))
    assert type(mapping).__name__ == "AllPartitionMapping"


def test_every_stage_has_its_blocking_checks_and_code_version():
    graph = defs.resolve_asset_graph()
    for s in STAGES:
        ad = defs.resolve_assets_def(AssetKey(s.asset))
        specs = {spec.key.name: spec for spec in ad.check_specs if spec.asset_key == AssetKey(s.asset)}  # a shared step holds several
        assert set(specs) == set(s.check_names) and all(x.blocking for x in specs.values()), s.asset
        assert graph.get(AssetKey(s.asset)).code_version == s.code_version
        for d in s.outputs:  # every output table with a schema has its schema check
            assert (d.schema is None) == (d.schema_check is None) and (d.schema_check is None or d.schema_check in specs)
    assert {j.name for j in defs.resolve_all_job_defs()} >= {"revision_job", "shard_job", "snapshot_job"}


def test_a_new_code_version_reaches_the_asset():
    bumped = tuple(dataclasses.replace(s, code_version="2") if s.name == "tokenize" else s for s in STAGES)
    graph = build_definitions(bumped).resolve_asset_graph()
    assert graph.get(AssetKey("tokenized_documents")).code_version == "2"
    assert graph.get(AssetKey("packed_rows")).code_version == stages.by_name("pack").code_version


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

    from megacpp_core.stages.lsh_bands import BAND_RANGES

    graph = defs.resolve_asset_graph()
    assert [d.name for d in graph.get(AssetKey("minhash_signatures")).partitions_def.partitions_defs] == ["revision", "shard"]
    assert sorted(b for lo, hi in BAND_RANGES for b in range(lo, hi)) == list(range(14))
    for name in ("minhash_signatures", "lsh_bands_00_07", "lsh_bands_07_14"):
        op = defs.resolve_assets_def(AssetKey(name)).op
        cfg = op.tags["dagster-k8s/config"]  # Dagster stores dict tags as JSON text
        res = (json.loads(cfg) if isinstance(cfg, str) else cfg)["container_config"]["resources"]
        assert res["requests"]["cpu"] and res["limits"]["memory"], name
    for name in ("lsh_bands_00_07", "lsh_bands_07_14"):
        assert AssetKey(name) in graph.get(AssetKey("dedup_decisions")).parent_keys
        assert AssetKey("minhash_signatures") in graph.get(AssetKey(name)).parent_keys
