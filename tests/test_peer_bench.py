"""bench/peer_datatrove.py without datatrove: the inputs it selects from a finished
snapshot are the ones our stages read, its parquet export is what datatrove's reader
expects, and our side's child runs the dedup steps on a linked copy of the snapshot and
reports the figures the comparison prints (no time is asserted)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def peer():
    """The benchmark script as a module (``bench/`` on ``sys.path`` for its helpers)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("peer_datatrove", BENCH / "peer_datatrove.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(BENCH))


def test_missing_outputs_name_every_required_file(peer, tmp_path):
    missing = peer.missing_outputs(tmp_path, "tiny")
    assert set(peer.REQUIRED) <= set(missing)
    with pytest.raises(FileNotFoundError, match="megacpp run --corpus tiny"):
        peer.input_texts(tmp_path, "tiny")


def test_inputs_are_what_our_stages_read(peer, tiny_run, tmp_path):
    root, _ = tiny_run
    snap = root / "snapshots" / "tiny"
    assert peer.missing_outputs(root, "tiny") == []
    got = peer.input_texts(root, "tiny")
    for table in got.values():
        assert table.column_names == ["doc_key", "text"]
        assert table.column("text").null_count == 0

    scrubbed = sorted(snap.glob("revisions/*/shards/*/scrubbed.parquet"))
    assert got["scrubbed"].num_rows == sum(pq.ParquetFile(p).metadata.num_rows for p in scrubbed)
    dedup_figures = json.loads((snap / "figures" / "dedup.json").read_text())
    assert got["scrubbed"].num_rows == dedup_figures["files_in"]

    decisions = pq.read_table(snap / "dedup" / "decisions.parquet", columns=["doc_key", "keep"])
    kept_keys = pc.filter(decisions.column("doc_key"), decisions.column("keep")).to_pylist()
    assert sorted(got["kept"].column("doc_key").to_pylist()) == sorted(kept_keys)
    assert got["kept"].num_rows == dedup_figures["files_out"]

    chunk_files = sorted(snap.glob("revisions/*/shards/*/chunks.parquet"))
    assert got["chunks"].num_rows == sum(pq.ParquetFile(p).metadata.num_rows for p in chunk_files)
    # the chunks are the kept files cut into pieces: the same text, byte for byte
    by_file: dict[str, list] = {}
    chunks = pq.read_table(chunk_files[0], columns=["file_key", "chunk_index", "text"]).to_pylist()
    for c in chunks:
        by_file.setdefault(c["file_key"], []).append((c["chunk_index"], c["text"]))
    kept = dict(zip(got["kept"].column("doc_key").to_pylist(), got["kept"].column("text").to_pylist()))
    for key, parts in by_file.items():
        assert "".join(t for _, t in sorted(parts)) == kept[key]

    stats = peer.text_stats(got["kept"])
    assert stats["documents"] == got["kept"].num_rows and stats["mb"] > 0
    folder = peer.export_for_peer(got["scrubbed"], tmp_path / "scrubbed")
    exported = pq.read_table(folder)
    assert exported.column_names == ["id", "text"]
    assert exported.column("id").to_pylist() == got["scrubbed"].column("doc_key").to_pylist()


def test_our_dedup_child_on_a_linked_copy(peer, tiny_run, tmp_path):
    root, _ = tiny_run
    from megacpp_core.manifest import load_manifest
    from megacpp_core.storage import open_root

    snap = root / "snapshots" / "tiny"
    manifest = load_manifest(str(snap / "manifest.yaml"))
    steps = peer.our_steps("dedup", open_root(str(root)), manifest)
    names = [st.name for st, _ in steps]
    shards = len(sorted(snap.glob("revisions/*/shards/*/scrubbed.parquet")))
    assert names == ["minhash"] * shards + ["lsh_bands_00_07", "lsh_bands_07_14", "dedup"]
    # shard by shard, as a step runs them (tokenize then takes chunk's whole-file ids), snapshot stages last
    e2e = peer.our_steps("end_to_end", open_root(str(root)), manifest)
    assert [st.name for st, _ in e2e] == ["chunk", "tokenize"] * shards + ["chunk_dedup", "pack", "format"]
    assert [p.key for _, p in e2e[:2 * shards:2]] == [p.key for _, p in e2e[1:2 * shards:2]]
    with pytest.raises(KeyError):
        peer.our_steps("nothing", open_root(str(root)), manifest)

    before = {p: p.stat().st_mtime_ns for p in snap.rglob("*") if p.is_file()}
    copy = peer._link_snapshot(root, "tiny", tmp_path / "root")
    # our side encodes every file, as datatrove's: the untimed tokenizer stage's ids are left out
    assert (snap / "tokenizer" / "sample_ids.parquet").exists()
    assert not (copy / "snapshots" / "tiny" / "tokenizer" / "sample_ids.parquet").exists()
    out = tmp_path / "ours.json"
    peer.ours_child("dedup", str(copy), "tiny", str(out))
    res = json.loads(out.read_text())
    assert res["steps"] == len(steps) and res["peak_rss_mib"] > 0
    assert res["cpu_seconds"] >= 0  # the steps' CPU time, for the full-cores ceiling
    # what a worker has imported before its first step is imported before the timing
    assert not {m.split(".")[0] for m in peer.OUR_PRELOAD} & set(res["timed_imports"])
    assert set(res["stage_seconds"]) == {"minhash", "lsh_bands_00_07", "lsh_bands_07_14", "dedup"}
    want = json.loads((snap / "figures" / "dedup.json").read_text())
    for k in ("files_in", "files_out", "exact_removed", "near_removed", "cross_source_removed", "clusters"):
        assert res["figures"][k] == want[k], k
    assert len(res["removed"]) == want["files_in"] - want["files_out"]
    # the snapshot it read is untouched
    assert {p: p.stat().st_mtime_ns for p in snap.rglob("*") if p.is_file()} == before


def test_the_preloads_are_importable_and_ours_are_what_workers_have(peer):
    """Our child imports only modules ``megacpp run``'s fork server preloads for its
    workers (so the timing matches a worker's), and ``timed_imports`` names the packages
    imported after its snapshot was taken."""
    from megacpp_assets.run_workers import PRELOAD

    assert set(peer.OUR_PRELOAD) <= set(PRELOAD)
    peer.preload(peer.OUR_PRELOAD)
    sys.modules.pop("colorsys", None)  # earlier tests may have imported it
    before = set(sys.modules)
    assert peer.timed_imports(before) == []
    import colorsys  # noqa: F401  (a standard-library module imported after the snapshot)

    assert peer.timed_imports(before) == ["colorsys"]


def test_full_cores_ceiling(peer, tmp_path):
    """The ceiling divides our CPU seconds over the cores: 6 CPU-s on 2 cores take at
    least 3 s, so against a peer's 2 s the speed ratio cannot pass 2/3. The usable cores
    are the affinity capped by a cgroup CPU quota (v2 ``cpu.max``, v1 ``cfs_quota_us``)."""
    got = peer.full_cores(2.0, 6.0, 2)
    assert got == {"cores": 2, "ours_cpu_seconds": 6.0, "floor_seconds": 3.0, "speed_ratio_ceiling": 0.667}
    assert peer.full_cores(4.0, 6.0, 3)["speed_ratio_ceiling"] == 2.0
    assert peer.full_cores(4.0, 0.0, 2)["speed_ratio_ceiling"] is None  # no CPU measured: no ceiling
    import os

    import timing  # bench/timing.py, on sys.path while the fixture holds the module

    assert 1 <= timing.usable_cores() <= len(os.sched_getaffinity(0))
    assert timing.full_cores_floor(6.0, 2) == 3.0
    v2 = tmp_path / "v2"
    v2.mkdir()
    assert timing.cgroup_cpu_limit(str(v2)) is None  # no file: no quota
    for text, want in (("150000 100000\n", 1.5), ("max 100000\n", None), ("garbage", None), ("0 100000", None)):
        (v2 / "cpu.max").write_text(text)
        assert timing.cgroup_cpu_limit(str(v2)) == want, text
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    for quota, want in (("250000\n", 2.5), ("-1\n", None)):
        (v1 / "cpu" / "cpu.cfs_quota_us").write_text(quota)
        assert timing.cgroup_cpu_limit(str(v1)) == want, quota


def test_cpu_seconds_counts_a_waited_for_child(peer):
    """``cpu_seconds`` takes in the CPU time a child used once it has been waited for: at
    least what the child read of its own CPU time just before it exited (no figure of
    the machine's speed is assumed)."""
    import subprocess

    before = peer.cpu_seconds()
    code = ("import hashlib, os\nfor _ in range(200): hashlib.sha256(b'x' * (1 << 20))\n"
            "t = os.times()\nprint(t.user + t.system)")
    child = float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    assert child > 0
    assert peer.cpu_seconds() - before >= child - 1e-6  # float sums of clock ticks
