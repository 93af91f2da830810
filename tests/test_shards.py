"""The revision × shard dimension (megacpp_core.sharding): deterministic shards, the
Dagster grid, and the same snapshot with one shard per revision and with many.

The integration test materializes ``tiny`` a second time with ``shard_bytes`` small
enough to split every revision into many shards, and compares it with the session's
one-shard-per-revision run — and on 2 worker processes (``megacpp run --workers 2``)
where the session's run used 1, so revisions finish in another order: the same files in the same shards' union, the same dedup
decisions and documents, byte-identical packed parquet shards and Megatron ``.bin/.idx``,
and the row contract on every row.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from megacpp_core import pack, sharding
from megacpp_core.layout import SnapshotLayout
from megacpp_core.stage import Partition, Partitioning

from .conftest import environ, make_data_root, write_instance_config

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- sharding rules


def test_shard_count_follows_size_and_setting():
    assert sharding.shard_count(0, 64) == 1
    assert sharding.shard_count(64, 64) == 1
    assert sharding.shard_count(65, 64) == 2
    assert sharding.shard_count(10 * 64, 64) == 10
    with pytest.raises(ValueError, match="positive"):
        sharding.shard_count(10, 0)
    with pytest.raises(ValueError, match="raise settings.shard_bytes"):
        sharding.shard_count(10 ** 6, 10)


def test_shard_of_is_a_stable_hash_of_the_path():
    paths = [f"src/dir{i % 7}/file{i}.cc" for i in range(2000)]
    n = 8
    a = [sharding.shard_of(p, n) for p in paths]
    assert a == [sharding.shard_of(p, n) for p in reversed(paths)][::-1]  # order of work does not matter
    assert a[0] == int(hashlib.sha256(paths[0].encode()).hexdigest()[:16], 16) % n  # the documented rule
    counts = [a.count(i) for i in range(n)]
    assert min(counts) > 2000 / n * 0.7, counts  # balanced within 30 %
    assert sharding.shard_of("x", 1) == 0
    # a path with a lone surrogate (undecodable file name) still hashes
    assert 0 <= sharding.shard_of("bad\udcff.c", 3) < 3


def test_shard_keys_and_partition_keys_round_trip():
    assert sharding.shard_key(7) == "007" and sharding.shard_index("007") == 7
    for bad in ("7", "0007", "a01"):
        with pytest.raises(ValueError):
            sharding.shard_index(bad)
    with pytest.raises(ValueError):
        sharding.shard_key(1000)
    p = Partition("tiny", "lz4-4.4.5", "003")
    assert p.key == "tiny/lz4-4.4.5|003"
    assert Partition.parse(p.key, Partitioning.REVISION_SHARD) == p
    assert Partition.parse("tiny/lz4-4.4.5", Partitioning.REVISION) == Partition("tiny", "lz4-4.4.5")
    assert Partition.parse("tiny", Partitioning.SNAPSHOT) == Partition("tiny")
    for key, kind in (("tiny/lz4", Partitioning.REVISION_SHARD), ("tiny/lz4|003", Partitioning.REVISION),
                      ("tiny|003", Partitioning.REVISION_SHARD), ("tiny/a/b|001", Partitioning.REVISION_SHARD),
                      ("tiny/lz4", Partitioning.SNAPSHOT)):
        with pytest.raises(ValueError):
            Partition.parse(key, kind)
    with pytest.raises(sharding.ShardPlanError):
        sharding.shard_keys({"shards": 2, "keys": ["000"]})


# ---------------------------------------------------------------- the Dagster grid


def test_per_document_assets_are_a_revision_by_shard_grid():
    from dagster import AssetKey, MultiPartitionsDefinition, MultiToSingleDimensionPartitionMapping

    from megacpp_assets.definitions import defs
    from megacpp_core.stages import STAGES

    graph = defs.resolve_asset_graph()
    per_shard = [s for s in STAGES if s.partitioning is Partitioning.REVISION_SHARD]
    assert {s.name for s in per_shard} >= {"quality", "license", "scrub", "minhash"}
    for s in per_shard:
        node = graph.get(AssetKey(s.asset))
        pdef = node.partitions_def
        assert isinstance(pdef, MultiPartitionsDefinition)
        assert [d.name for d in pdef.partitions_defs] == ["revision", "shard"]
    quality = defs.resolve_assets_def("quality_files")
    dep = quality.get_partition_mapping(AssetKey("source_files"))
    assert isinstance(dep, MultiToSingleDimensionPartitionMapping) and dep.partition_dimension_name == "revision"
    assert defs.resolve_job_def("shard_job").partitions_def is not None


# ---------------------------------------------------------------- 1 shard vs many on real input


SMALL_SHARDS = 150_000  # bytes: tiny's revisions split into 3 to 20 shards
GROUP_TOKENS = 120_000  # tokens: tiny's ~0.5 M tokens pack in about four groups


#: What the many-shard run did, in order: ("start", k) when the k-th worker pool starts its
#: processes, ("release", k) when its workers are told to end, ("pool", k) when they have
#: ended, ("snapshot", n) when the snapshot steps of pass n are planned.
RUN_EVENTS: list[tuple[str, int]] = []


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    """``tiny`` (same name and sources) with ``shard_bytes`` = 150 kB, through ``megacpp run``
    on 2 workers; the ends of its worker pools and its snapshot steps are recorded in
    :data:`RUN_EVENTS`."""
    from dagster import DagsterInstance

    from megacpp_assets import run_workers
    from megacpp_assets.cli import run_snapshot
    from megacpp_assets.snapshot_run import SnapshotRun

    class RecordingPool(run_workers.WorkerPool):
        def start(self):
            RUN_EVENTS.append(("start", sum(1 for e in RUN_EVENTS if e[0] == "start") + 1))
            return super().start()

        def release(self):
            RUN_EVENTS.append(("release", sum(1 for e in RUN_EVENTS if e[0] == "release") + 1))
            return super().release()

        def __exit__(self, *exc):
            super().__exit__(*exc)
            RUN_EVENTS.append(("pool", sum(1 for e in RUN_EVENTS if e[0] == "pool") + 1))

    original = SnapshotRun.snapshot_plan

    def snapshot_plan(self, n):
        RUN_EVENTS.append(("snapshot", n))
        return original(self, n)

    patch = pytest.MonkeyPatch()
    patch.setattr(run_workers, "WorkerPool", RecordingPool)
    patch.setattr(SnapshotRun, "snapshot_plan", snapshot_plan)

    manifest = yaml.safe_load((ROOT / "corpora" / "tiny.yaml").read_text())
    manifest.setdefault("settings", {})["shard_bytes"] = SMALL_SHARDS
    mpath = tmp_path_factory.mktemp("manifest") / "tiny.yaml"
    mpath.write_text(yaml.safe_dump(manifest))
    root = make_data_root(tmp_path_factory.mktemp("shards-root"))
    home = tmp_path_factory.mktemp("shards-home")
    write_instance_config(home)
    saved = os.environ.get("MEGACPP_DATA_ROOT")
    with environ(DAGSTER_HOME=str(home)):
        try:
            with DagsterInstance.get() as instance:
                try:
                    assert run_snapshot(str(mpath), str(root), instance=instance, workers=2) == 0  # many shards on 2 workers
                finally:
                    patch.undo()
                yield root, instance
        finally:
            if saved is None:
                os.environ.pop("MEGACPP_DATA_ROOT", None)
            else:
                os.environ["MEGACPP_DATA_ROOT"] = saved


def _plan(root: Path, source: str) -> dict:
    import json

    return json.loads((root / "snapshots" / "tiny" / "revisions" / source / "shards.json").read_text())


def _union(root: Path, source: str, name: str, columns: list[str]) -> pa.Table:
    plan = _plan(root, source)
    parts = [pq.read_table(root / "snapshots" / "tiny" / "revisions" / source / "shards" / k / name, columns=columns)
             for k in plan["keys"]]
    t = pa.concat_tables(parts)
    return t.sort_by([(columns[0], "ascending")])


def test_many_shards_split_every_revision_deterministically(tiny_run, many_shards):
    one, _ = tiny_run
    many, _ = many_shards
    for source in ("pybind11-3.1.0", "lz4-4.4.5", "xxhash-4.1.0"):
        p1, pn = _plan(one, source), _plan(many, source)
        assert p1["shards"] == 1
        assert pn["shards"] == sharding.shard_count(sum(pn["bytes"]), SMALL_SHARDS) > 1
        assert sum(pn["bytes"]) == sum(p1["bytes"]) and sum(pn["files"]) == sum(p1["files"])
        for k in pn["keys"]:  # every file sits in the shard its path hashes to
            paths = pq.read_table(many / "snapshots" / "tiny" / "revisions" / source / "shards" / k / "source_files.parquet",
                                  columns=["path"]).column("path").to_pylist()
            assert all(sharding.shard_of(p, pn["shards"]) == int(k) for p in paths)
        for name, cols in (("source_files.parquet", ["doc_key", "content_sha256"]),
                           ("quality_kept.parquet", ["doc_key", "text"]),
                           ("license.parquet", ["doc_key", "spdx_expression", "decision", "origin"]),
                           ("scrubbed.parquet", ["doc_key", "content_sha256", "text"]),
                           ("minhash.parquet", ["doc_key", "signature"]),
                           ("chunks.parquet", ["doc_key", "kind", "text", "n_text_tokens"]),
                           ("tokenized.parquet", ["doc_key", "input_ids"])):
            assert _union(many, source, name, cols).equals(_union(one, source, name, cols)), (source, name)


def test_many_shards_give_the_same_documents_and_byte_identical_rows(tiny_run, many_shards):
    from megacpp_checks.packed import verify_packed_dir

    one, _ = tiny_run
    many, _ = many_shards
    snap1, snapn = one / "snapshots" / "tiny", many / "snapshots" / "tiny"
    d1 = pq.read_table(snap1 / "dedup" / "decisions.parquet")
    dn = pq.read_table(snapn / "dedup" / "decisions.parquet")
    assert dn.equals(d1)
    docs = lambda s: SnapshotLayout(s.parent.parent, "tiny").documents("tokenized", ["doc_key"]).column("doc_key").to_pylist()
    assert docs(snapn) == docs(snap1) and len(docs(snap1)) > 100
    assert (snapn / "tokenizer" / "tokenizer.json").read_bytes() == (snap1 / "tokenizer" / "tokenizer.json").read_bytes()
    shards = sorted(p.name for p in (snap1 / "packed").glob("*.parquet"))
    assert shards and shards == sorted(p.name for p in (snapn / "packed").glob("*.parquet"))
    for name in shards:
        assert (snapn / "packed" / name).read_bytes() == (snap1 / "packed" / name).read_bytes(), name
    # the Megatron dataset is merged from one part per tokenized shard: the same sequence per
    # document, in an order that follows the shards (read back with the raw reader)
    from megacpp_core import megatron

    def sequences(snap):
        prefix = snap / "megatron" / "tiny_text_document"
        index = megatron.read_index(f"{prefix}.idx")
        flat = np.fromfile(f"{prefix}.bin", dtype=index.dtype)
        keys = pq.read_table(f"{prefix}.documents.parquet", columns=["doc_key"]).column("doc_key").to_pylist()
        ptr = np.concatenate([[0], np.cumsum(index.sequence_lengths)])
        return {k: flat[ptr[i]:ptr[i + 1]].tobytes() for i, k in enumerate(keys)}

    s1, sn = sequences(snap1), sequences(snapn)
    assert sn == s1 and len(s1) == len(docs(snap1))
    fig = SnapshotLayout(many, "tiny").read_figures("format")
    total = sum(_plan(many, s)["shards"] for s in ("pybind11-3.1.0", "lz4-4.4.5", "xxhash-4.1.0"))
    assert 3 < fig["parts"] <= total  # one part per shard with documents (a shard may keep none)
    gate = verify_packed_dir(str(snapn / "packed"), out=lambda m: None)
    assert gate.ok, gate.failures
    assert gate.figures["rows"] > 0


def test_each_pass_has_fresh_workers_and_pass_1s_end_with_its_snapshot_steps(many_shards):
    """Pass 1's workers (ScanCode's index loaded) are told to end before its snapshot steps
    and pass 2's are started then (shut-down and start-up overlap the tokenizer's
    training); pass 1's have ended when those steps are done; the last pass's snapshot
    steps run on its own workers."""
    assert RUN_EVENTS == [("start", 1), ("release", 1), ("start", 2), ("snapshot", 1), ("pool", 1), ("snapshot", 2),
                          ("pool", 2)]


def test_the_last_snapshot_steps_run_as_groups_that_wait_only_for_what_they_read(many_shards):
    """With 2 workers the snapshot steps of the last pass are one ``snapshot_job`` run per
    group of :func:`megacpp_core.stages.snapshot_groups`, each started after the runs of
    the groups it reads from ended, and the card last: in the run of the last group when
    that run started after every other had ended (a group no other reads from), else in
    a run of its own; pass 1's are one run."""
    from dagster import AssetKey, DagsterRunStatus, RunsFilter

    from megacpp_core.stages import phases, snapshot_groups

    _, instance = many_shards
    runs = instance.get_run_records(filters=RunsFilter(job_name="snapshot_job", tags={"dagster/partition": "tiny"}))
    assert all(r.dagster_run.status == DagsterRunStatus.SUCCESS for r in runs)
    by_selection = {frozenset(k.path[-1] for k in r.dagster_run.asset_selection): r for r in runs}
    card = next(r for sel, r in by_selection.items() if "dataset_card" in sel)
    with_card = frozenset(k.path[-1] for k in card.dagster_run.asset_selection)
    by_selection[with_card - {"dataset_card"} or with_card] = by_selection.pop(with_card)
    first, last = phases()
    groups = snapshot_groups([s.asset for s in last.snapshot])
    wanted = [frozenset(s.asset for s in first.snapshot)] + [frozenset(g.assets) for g in groups]
    if with_card == {"dataset_card"}:
        wanted.append(with_card)
    else:  # the card ran with a group no other group reads from
        sink = next(i for i, g in enumerate(groups) if frozenset(g.assets) == with_card - {"dataset_card"})
        assert not any(sink in g.after for g in groups)
    assert sorted(map(sorted, by_selection)) == sorted(map(sorted, wanted)) and len(runs) == len(wanted)
    for g in groups:
        for j in g.after:
            assert by_selection[frozenset(groups[j].assets)].end_time <= by_selection[frozenset(g.assets)].start_time
    assert all(r.end_time <= card.start_time for r in runs if r is not card)
    assert AssetKey("dataset_card") in card.dagster_run.asset_selection


def test_a_shard_beyond_the_revision_count_is_empty_and_writes_nothing(many_shards):
    from megacpp_core.manifest import load_manifest
    from megacpp_core.runner import run_stage
    from megacpp_core.stages import by_name
    from megacpp_core.storage import open_root

    root, _ = many_shards
    data = open_root(str(root))
    manifest = load_manifest(str(root / "snapshots" / "tiny" / "manifest.yaml"))
    res = run_stage(by_name("quality"), data, manifest, Partition("tiny", "xxhash-4.1.0", "999"))
    assert res.figures.get("empty_shard") is True and res.ok
    assert not (root / "snapshots" / "tiny" / "revisions" / "xxhash-4.1.0" / "shards" / "999").exists()


def test_dedup_reads_no_text_but_candidate_texts(many_shards):
    """Dedup's decisions come from hashes and signatures; only the texts of candidate pairs
    whose estimate reaches the threshold are streamed for the exact-Jaccard check."""
    import json

    root, _ = many_shards
    f = json.loads((root / "snapshots" / "tiny" / "figures" / "dedup.json").read_text())
    assert f["shards_in"] > 3
    assert f["texts_read_for_verification"] < f["files_in"] / 2


def test_streamed_packing_groups_are_byte_identical_across_shard_counts(tiny_run, many_shards, tmp_path):
    """Packing in several groups (``pack_group_tokens`` far below the snapshot) gives the
    same files from 1 shard per revision and from many; every row passes the contract and
    best-fit decreasing fills each group to ≥ 99 % of its bound."""
    import dataclasses
    import math
    import shutil

    from megacpp_checks.packed import verify_packed_dir
    from megacpp_core import pack_stream, stages
    from megacpp_core.manifest import load_manifest
    from megacpp_core.storage import DataRoot

    m = load_manifest("tiny")
    m = dataclasses.replace(m, settings=dataclasses.replace(m.settings, pack_group_tokens=GROUP_TOKENS))
    out = {}
    for name, (root, _) in (("one", tiny_run), ("many", many_shards)):
        dst = tmp_path / name
        shutil.copytree(root / "snapshots" / "tiny", dst / "snapshots" / "tiny")
        res = stages.run("pack", DataRoot(dst), m)
        assert all(ok for ok, _ in res.checks.values()), res.checks
        assert res.figures["packing_groups"] >= 3
        out[name] = (dst / "snapshots" / "tiny" / "packed", res.figures)
        gate = verify_packed_dir(str(out[name][0]), out=lambda x: None)
        assert gate.ok, gate.failures
    names = sorted(p.name for p in out["one"][0].iterdir())
    assert names == sorted(p.name for p in out["many"][0].iterdir()) and "_SUCCESS" in names
    for n in names:
        assert (out["one"][0] / n).read_bytes() == (out["many"][0] / n).read_bytes(), n
    # the same documents and tokens as packing the snapshot in one group
    one_group = pack.read_success(tiny_run[0] / "snapshots" / "tiny" / "packed")
    streamed = pack.read_success(out["one"][0])
    assert (streamed["docs"], streamed["tokens"]) == (one_group["docs"], one_group["tokens"])
    # fill per group, from the plan (lengths only)
    lay = SnapshotLayout(tiny_run[0], "tiny")
    drops = pq.read_table(lay.stage_dir("documents") / "chunk_drops.parquet").column("doc_key").combine_chunks()
    order = {s.name: i for i, s in enumerate(m.sources)}
    p = pack_stream.plan(lay._shard_refs("tokenized"), order, drops, m.settings, group_tokens=GROUP_TOKENS)
    lengths = p.docs.column("length").to_numpy()
    L = m.settings.row_length
    for (a, b), rows in zip(p.groups, p.group_rows):
        # a lower bound on the rows: the tokens over L, and one row per document over L/2
        bound = max(math.ceil(int(lengths[a:b].sum()) / L), int((lengths[a:b] > L // 2).sum()))
        assert bound / rows >= 0.99 or rows - bound <= 1, (a, b, rows, bound)  # groups of ~15 rows here
    assert sum(p.group_rows) == streamed["rows"]


def test_merged_figures_weight_shares_but_sum_nested_counts():
    """A top-level ``*_share`` is token-weighted; a nested count whose name ends in
    ``_share`` (the quality filter ``encoded_share``) adds up like every other count."""
    from megacpp_core.sharding import merge_figures

    a = {"tokens": 100, "comment_share": 0.5, "rejected": {"encoded_share": 2, "extension": 10}}
    b = {"tokens": 300, "comment_share": 0.1, "rejected": {"encoded_share": 0, "extension": 5}}
    c = {"tokens": 0, "comment_share": 0.9, "rejected": {"encoded_share": 1}}
    m = merge_figures([a, b, c])
    assert m["rejected"] == {"encoded_share": 3, "extension": 15}
    assert m["tokens"] == 400
    assert m["comment_share"] == round((0.5 * 100 + 0.1 * 300 + 0.9 * 1) / 401, 4)
