"""Snapshots (SPEC §5): partitions from manifests by a sensor, scheduled backfills, growing a
snapshot by one source, and byte-identical outputs across two full runs of ``tiny``."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    DagsterInstance,
    RunsFilter,
    SensorResult,
    SkipReason,
    build_schedule_context,
    build_sensor_context,
)

from megacpp_assets import sensors
from megacpp_core.manifest import load_manifest
from megacpp_resources import DataRootResource
from tests.conftest import materialized_tiny


def _output_hashes(root: Path, snapshot: str = "tiny") -> dict[str, str]:
    """sha256 of every output file of a snapshot except figures/ (wall times) and the
    recorded manifest copy."""
    base = root / "snapshots" / snapshot
    out = {}
    for p in sorted(base.rglob("*")):
        rel = p.relative_to(base).as_posix()
        if p.is_file() and not rel.startswith("figures/") and rel not in ("card.md", "manifest.yaml", "manifest.origin.json"):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="session")
def tiny_run_b(tmp_path_factory):
    """A second, independent ``megacpp run --corpus tiny`` into another data root and
    Dagster home. Yields ``(data_root, instance, hashes of its outputs right after the run)``."""
    with materialized_tiny(tmp_path_factory, "tiny-b") as (root, instance):
        yield root, instance, _output_hashes(root)


def test_two_runs_are_byte_identical(tiny_run, tiny_run_b):
    a = _output_hashes(tiny_run[0])
    b = tiny_run_b[2]
    kinds = {Path(k).suffix for k in a}
    assert {".parquet", ".json", ".bin", ".idx"} <= kinds and "tokenizer/tokenizer.json" in a
    assert any(k.startswith("packed/") for k in a) and any(k.startswith("revisions/") for k in a)
    assert sorted(a) == sorted(b)
    differ = [k for k in a if a[k] != b[k]]
    assert not differ, f"outputs differ between two runs: {differ}"


def _runs(instance, job: str) -> list:
    return instance.get_runs(filters=RunsFilter(job_name=job))


def test_adding_one_source_materializes_only_that_revision(tiny_run_b, tmp_path):
    """Re-running the same snapshot skips every revision; adding one line re-runs pass 1
    (acquire … minhash) on the new revision only, pass 2 (chunk … repo and structure
    documents) on every revision, since the snapshot tokenizer is retrained with the new
    files, and the snapshot-wide assets."""
    from megacpp_assets.cli import run_snapshot

    root, instance, _ = tiny_run_b
    before_rev, before_snap = len(_runs(instance, "revision_job")), len(_runs(instance, "snapshot_job"))
    before_shard = len(_runs(instance, "shard_job"))
    old_ids = {k: instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey("scrubbed_files"), asset_partitions=[k]),
                                                  limit=1).records[0].storage_id
               for k in (f"{rev}|000" for rev in instance.get_dynamic_partitions("repo_revision") if rev.startswith("tiny/"))}
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "LICENSE").write_text("Permission is hereby granted, free of charge, to any person obtaining a copy of this software "
                                   "(the MIT License).\n")
    (extra / "ring.c").write_text("/* SPDX-License-Identifier: MIT */\n#include <stddef.h>\n" + "".join(
        f"int ring_get_{i}(const int *buf, size_t cap, size_t head) {{ return buf[(head + {i}) % cap]; }}\n" for i in range(12)))
    grown = tmp_path / "tiny.yaml"
    grown.write_text(load_manifest("tiny").path.read_text() +
                     f"  - {{name: extra-ring, kind: local, path: '{extra}', label: 'r1'}}\n")
    assert run_snapshot(str(grown), str(root), instance=instance) == 0
    new_rev = _runs(instance, "revision_job")[: len(_runs(instance, "revision_job")) - before_rev]
    revisions = sorted(k for k in instance.get_dynamic_partitions("repo_revision") if k.startswith("tiny/"))
    # pass 1: the new revision's own assets (before and after its shards: the libclang lane);
    # pass 2: once per revision, the repo and structure documents read from its re-tokenized shard
    pass2_rev = {AssetKey("p3_repo_documents"), AssetKey("p4_structure_documents")}
    assert {r.tags["dagster/partition"] for r in new_rev if not r.asset_selection & pass2_rev} == {"tiny/extra-ring"}
    assert sorted(r.tags["dagster/partition"] for r in new_rev if r.asset_selection & pass2_rev) == revisions
    assert all(r.asset_selection == pass2_rev for r in new_rev if r.asset_selection & pass2_rev)
    # pass 1 (quality … minhash) runs on the new revision's shard only; pass 2 (chunk,
    # tokenize, family chunks) on every shard, since the snapshot tokenizer is retrained
    # with the new files
    new_shard = _runs(instance, "shard_job")[: len(_runs(instance, "shard_job")) - before_shard]
    pass1 = {AssetKey(a) for a in ("quality_files", "license_files", "scrubbed_files", "minhash_signatures")}
    assert [r.tags["dagster/partition"] for r in new_shard if r.asset_selection & pass1] == ["tiny/extra-ring|000"]
    assert {r.tags["dagster/partition"] for r in new_shard} == {f"{k}|000" for k in revisions}
    assert len(_runs(instance, "snapshot_job")) == before_snap + 2  # the snapshot steps of both passes
    for k, sid in old_ids.items():  # old revisions untouched
        assert instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey("scrubbed_files"), asset_partitions=[k]),
                                               limit=1).records[0].storage_id == sid
    card = (root / "snapshots" / "tiny" / "card.md").read_text()
    assert "extra-ring" in card
    # the local directory changes under the same label: only that revision is out of date
    from megacpp_assets.freshness import plan
    from megacpp_core.stage import Partition
    from megacpp_core.stages import STAGES
    from megacpp_core.storage import DataRoot

    m, data_root = load_manifest(grown), DataRoot(root)

    def out_of_date() -> dict[str, list]:
        return {s.name: todo for s in m.sources if (todo := plan(instance, STAGES, data_root, m, Partition("tiny", s.name)))}

    assert out_of_date() == {}
    (extra / "ring.c").write_text((extra / "ring.c").read_text() + "int ring_cap(void) { return 64; }\n")
    stale = out_of_date()
    assert list(stale) == ["extra-ring"]
    assert stale["extra-ring"][0].asset == "source_files" and "content changed" in stale["extra-ring"][0].reason


def _write_manifest(root: Path, name: str, sources: list[str], schedule: str | None = None) -> Path:
    p = root / "snapshots" / name / "manifest.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    body = f"name: {name}\n" + (f"schedule: '{schedule}'\n" if schedule else "") + "sources:\n"
    body += "".join(f"  - {{name: {s}, kind: local, path: /srv/{s}, label: v1}}\n" for s in sources)
    p.write_text(body)
    return p


def test_sensor_registers_partitions_from_manifests(tmp_path):
    root = tmp_path / "root"
    _write_manifest(root, "grown", ["a", "b"])
    with DagsterInstance.ephemeral() as instance:
        ctx = build_sensor_context(instance=instance, resources={"data_root": DataRootResource(data_root=str(root))})
        result = sensors.manifest_partitions_sensor(ctx)
        assert isinstance(result, SensorResult)
        reqs = {r.partitions_def_name: list(r.partition_keys) for r in result.dynamic_partitions_requests}
        shipped = {p.stem: load_manifest(p) for p in sorted(Path(sensors.__file__).resolve().parents[1].glob("corpora/*.yaml"))}
        assert set(reqs["snapshot"]) == set(shipped) | {"grown"}
        want = {m.partition_key(s) for m in shipped.values() for s in m.sources} | {"grown/a", "grown/b"}
        assert set(reqs["repo_revision"]) == want
        for r in result.dynamic_partitions_requests:
            instance.add_dynamic_partitions(r.partitions_def_name, list(r.partition_keys))
        assert isinstance(sensors.manifest_partitions_sensor(ctx), SkipReason)  # nothing new
        _write_manifest(root, "grown", ["a", "b", "c"])  # add one line
        again = sensors.manifest_partitions_sensor(ctx)
        assert [(r.partitions_def_name, list(r.partition_keys)) for r in again.dynamic_partitions_requests] == [
            ("repo_revision", ["grown/c"])]


def test_schedule_backfills_each_snapshot_on_its_cron(tmp_path):
    root = tmp_path / "root"
    _write_manifest(root, "nightly", ["x", "y"], schedule="30 1 * * *")
    scheds = {s.name: s for s in sensors.build_schedules(root)}
    assert {"backfill_default", "backfill_large", "backfill_nightly"} <= set(scheds) and "backfill_tiny" not in scheds
    default = load_manifest("default")
    assert scheds["backfill_default"].cron_schedule == default.schedule and scheds["backfill_nightly"].cron_schedule == "30 1 * * *"
    assert scheds["backfill_default"].job_name == "revision_job"
    (tmp_path / "home").mkdir()
    with DagsterInstance.local_temp(tempdir=str(tmp_path / "home")) as instance:  # schedules need a persistent instance
        from megacpp_assets.definitions import defs

        ctx = build_schedule_context(instance=instance, repository_def=defs.get_repository_def(),
                                     scheduled_execution_time=datetime(2026, 11, 22, 3, 0, tzinfo=timezone.utc))
        data = scheds["backfill_default"].evaluate_tick(ctx)
        keys = [r.partition_key for r in data.run_requests]
        assert keys == [default.partition_key(s) for s in default.sources]
        assert set(keys) <= set(instance.get_dynamic_partitions("repo_revision"))
        assert "default" in instance.get_dynamic_partitions("snapshot")
        nightly = scheds["backfill_nightly"].evaluate_tick(ctx)
        assert [r.partition_key for r in nightly.run_requests] == ["nightly/x", "nightly/y"]


def test_snapshot_job_requested_once_all_revisions_are_newer(tmp_path):
    root = tmp_path / "root"
    _write_manifest(root, "grown", ["a", "b"])
    with DagsterInstance.ephemeral() as instance:
        ctx = build_sensor_context(instance=instance, resources={"data_root": DataRootResource(data_root=str(root))})
        instance.add_dynamic_partitions("snapshot", ["grown"])

        def materialize(asset: str, partition: str) -> None:
            instance.report_runless_asset_event(AssetMaterialization(asset_key=asset, partition=partition))

        def requested() -> list:
            r = sensors.snapshot_after_revisions_sensor(ctx)
            return [] if isinstance(r, SkipReason) else [(q.partition_key, q.run_key) for q in r.run_requests]

        materialize("scrubbed_files", "grown/a")
        assert requested() == []  # grown/b is missing
        materialize("scrubbed_files", "grown/b")
        first = requested()
        assert [p for p, _ in first] == ["grown"]
        materialize("megatron_dataset", "grown")
        assert requested() == []  # snapshot newer than every revision
        materialize("scrubbed_files", "grown/a")  # the backfill re-materialized a revision
        second = requested()
        assert [p for p, _ in second] == ["grown"] and second[0][1] != first[0][1]
