"""``megacpp run`` re-materializes only what changed, decided from Dagster's code and data
versions: a new code version, a changed setting of a stage's slice, a missing output; an
upstream re-run that writes identical bytes changes nothing downstream."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import yaml
from dagster import AssetKey, AssetRecordsFilter

from megacpp_assets.cli import run_snapshot
from megacpp_assets.freshness import plan
from megacpp_core.manifest import load_manifest
from megacpp_core.stage import Partition
from megacpp_core.stages import STAGES
from megacpp_core.storage import DataRoot

pytestmark = pytest.mark.integration

ALL = [s.asset for s in STAGES] + ["dataset_card"]


def _counts(instance) -> dict[str, int]:
    return {a: len(instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey(a)), limit=10_000).records)
            for a in ALL}


def _changed(before: dict, after: dict) -> dict[str, int]:
    return {a: after[a] - before[a] for a in ALL if after[a] != before[a]}


def _data_hashes(root) -> dict[str, str]:
    base = root / "snapshots" / "tiny"
    return {p.relative_to(base).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(base.rglob("*"))
            if p.is_file() and not p.relative_to(base).as_posix().startswith(("figures/", "card.md"))}


def test_a_new_code_version_reruns_that_stage_and_what_depends_on_it(fresh_tiny):
    root, instance, _ = fresh_tiny
    bumped = tuple(dataclasses.replace(s, code_version="next") if s.name == "chunk_dedup" else s for s in STAGES)
    was = next(s.code_version for s in STAGES if s.name == "chunk_dedup")
    todo = plan(instance, bumped, DataRoot(root), load_manifest("tiny"), Partition("tiny"))
    assert [(t.asset, t.reason) for t in todo][:2] == [("chunk_dedup", f"code version {was} → next"),
                                                      ("packed_rows", "downstream of chunk_dedup")]
    before, data = _counts(instance), _data_hashes(root)
    assert run_snapshot("tiny", str(root), instance=instance, stages=bumped) == 0
    assert _changed(before, _counts(instance)) == {"chunk_dedup": 1, "packed_rows": 1, "megatron_dataset": 1,
                                                   "p1_simple_dataset": 1, "p1_docrich_dataset": 1, "blends": 1,
                                                   "dataset_card": 1}
    assert _data_hashes(root) == data  # same code, same bytes
    before = _counts(instance)
    assert run_snapshot("tiny", str(root), instance=instance, stages=bumped) == 0
    assert _changed(before, _counts(instance)) == {}


def test_a_setting_reruns_only_the_stages_that_read_it(fresh_tiny, tmp_path):
    root, instance, _ = fresh_tiny
    doc = yaml.safe_load(load_manifest("tiny").path.read_text())
    doc["settings"] = {**(doc.get("settings") or {}), "fim_seed": 7}
    changed = tmp_path / "tiny.yaml"
    changed.write_text(yaml.safe_dump(doc))
    assert run_snapshot("tiny", str(root), instance=instance) == 0  # current under the registry's code versions
    before = _counts(instance)
    assert run_snapshot(str(changed), str(root), instance=instance) == 0
    # fim_seed is in the slices of pack, format and the families with FIM only (the blends and the card follow them)
    fim = ("packed_rows", "megatron_dataset", "p1_simple_dataset", "p1_docrich_dataset", "p2_file_dataset", "blends",
           "dataset_card")
    assert _changed(before, _counts(instance)) == dict.fromkeys(fim, 1)
    assert run_snapshot("tiny", str(root), instance=instance) == 0  # back to the shipped settings
    assert _changed(before, _counts(instance)) == dict.fromkeys(fim, 2)


def test_identical_bytes_leave_downstream_current(fresh_tiny):
    """A missing output is re-made; since the re-made file has the same bytes (the same data
    version), nothing that reads it runs again."""
    root, instance, _ = fresh_tiny
    (root / "snapshots" / "tiny" / "revisions" / "lz4-4.4.5" / "shards" / "000" / "minhash.parquet").unlink()
    todo = plan(instance, STAGES, DataRoot(root), load_manifest("tiny"), Partition("tiny", "lz4-4.4.5", "000"))
    assert [(t.asset, t.reason) for t in todo] == [("minhash_signatures", "output minhash is missing from the data root")]
    before = _counts(instance)
    assert run_snapshot("tiny", str(root), instance=instance) == 0
    assert _changed(before, _counts(instance)) == {"minhash_signatures": 1}


def test_changed_bytes_flow_downstream(fresh_tiny):
    """A re-made output with other bytes gives a new data version: the snapshot assets that
    read it are out of date ("upstream data changed") and run."""
    import pyarrow.parquet as pq

    root, instance, _ = fresh_tiny
    m = load_manifest("tiny")
    path = root / "snapshots" / "tiny" / "revisions" / "xxhash-4.1.0" / "shards" / "000" / "minhash.parquet"
    pq.write_table(pq.read_table(path), path, compression="gzip")  # same rows, other bytes
    from dagster import AssetMaterialization, DataVersion  # record it as a new materialization, as a rerun would
    from megacpp_assets.factory import GATES_TAG, INPUTS_TAG, SETTINGS_TAG

    last = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey("minhash_signatures"),
                                                              asset_partitions=["tiny/xxhash-4.1.0|000"]), limit=1).records[0]
    tags = dict(last.asset_materialization.tags)
    assert {SETTINGS_TAG, INPUTS_TAG, GATES_TAG} <= set(tags)
    tags["dagster/data_version"] = DataVersion(hashlib.sha256(path.read_bytes()).hexdigest()).value
    instance.report_runless_asset_event(AssetMaterialization("minhash_signatures", partition="tiny/xxhash-4.1.0|000", tags=tags))
    todo = plan(instance, STAGES, DataRoot(root), m, Partition("tiny"))
    assert todo[0].asset == "lsh_bands_00_07" and todo[0].reason == "upstream data changed"
    assert {t.asset for t in todo} >= {"dedup_decisions", "tokenizer", "packed_rows", "megatron_dataset"}


def test_a_multi_file_output_without_its_commit_marker_is_out_of_date(fresh_tiny):
    """The Megatron export commits its sidecar last: a directory holding the .bin but not
    the sidecar (a run killed mid-commit) is not current."""
    root, instance, _ = fresh_tiny
    sidecar = root / "snapshots" / "tiny" / "megatron" / "tiny_text_document.json"
    saved = sidecar.read_bytes()
    sidecar.unlink()
    try:
        from megacpp_assets.freshness import stage_staleness
        from megacpp_core import stages

        why = stage_staleness(instance, stages.by_name("format"), DataRoot(root), load_manifest("tiny"),
                              Partition("tiny"), stages.producers())
        assert why == "output megatron is missing from the data root"
    finally:
        sidecar.write_bytes(saved)


def test_a_plan_of_one_pass_looks_at_that_pass_alone(fresh_tiny):
    """``plan(only=…)`` (``megacpp run`` plans one pass's assets of a partition) plans those
    assets by the same rules, and does not look at the others: a stage of an earlier pass
    that is out of date (not re-run yet) makes nothing of the later pass downstream of it,
    since each of those is out of date by its own rules (its inputs' data versions
    included); the earlier pass's own plan finds it. It reads fewer materializations."""
    from megacpp_assets.factory import LatestMaterializations
    from megacpp_core.stages import phases

    root, instance, _ = fresh_tiny
    shard = Partition("tiny", "lz4-4.4.5", "000")
    first, second = ([s.asset for s in ph.shard] for ph in phases()[:2])
    bumped = tuple(dataclasses.replace(s, code_version="next") if s.name == "scrub" else s for s in STAGES)
    was = next(s.code_version for s in STAGES if s.name == "scrub")
    m = load_manifest("tiny")
    whole = [(t.asset, t.reason) for t in plan(instance, bumped, DataRoot(root), m, shard)]
    assert whole[0] == ("scrubbed_files", f"code version {was} → next")
    assert {a for a, _ in whole} >= {"minhash_signatures", "chunked_documents", "tokenized_documents"}
    got = [(t.asset, t.reason) for t in plan(instance, bumped, DataRoot(root), m, shard, only=first)]
    assert got == [x for x in whole if x[0] in first]
    assert plan(instance, bumped, DataRoot(root), m, shard, only=second) == []  # current by their own rules
    assert plan(instance, STAGES, DataRoot(root), m, shard, only=second) == []

    class Counted(LatestMaterializations):
        reads = 0

        def get_many(self, asset, partitions):
            Counted.reads += len(partitions)
            return super().get_many(asset, partitions)

    plan(instance, STAGES, DataRoot(root), m, shard, latest=Counted(instance, kept=True))
    every = Counted.reads
    Counted.reads = 0
    plan(instance, STAGES, DataRoot(root), m, shard, latest=Counted(instance, kept=True), only=second)
    assert 0 < Counted.reads < every
