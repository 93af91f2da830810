"""Files parsed and enriched ahead of the chunk stage by an idle worker
(:mod:`megacpp_core.parse_ahead`, :data:`megacpp_core.memo.PARSED_AHEAD`): on the real
``tiny`` snapshot the chunk stage takes them instead of parsing and enriching, and writes
the bytes it writes alone; the worker's thread stops at its first unit; the memo fills in
order without evicting, and never holds anything in a process that does not keep values
across steps."""

from __future__ import annotations

import shutil
import threading

import pytest

from megacpp_core import chunk, enrich, memo, parse_ahead
from megacpp_core.manifest import load_manifest
from megacpp_core.storage import open_root

from .test_file_memo import _counting, across_steps  # noqa: F401 — a fixture used by name

SRC = "pybind11-3.1.0"
K = memo.text_key


def _run(root, instance):
    from megacpp_assets.snapshot_run import SnapshotRun

    return SnapshotRun(load_manifest(str(root / "snapshots" / "tiny" / "manifest.yaml")), open_root(str(root)), instance,
                       rerun=False)


def _scrubbed_files(root, shards) -> int:
    import pyarrow.parquet as pq

    return sum(sum(1 for t in pq.read_table(root / "snapshots" / "tiny" / "revisions" / src / "shards" / k /
                                            "scrubbed.parquet", columns=["text"]).column("text").to_pylist() if t)
               for src, k in shards)


def test_a_memo_that_does_not_evict_refuses_what_does_not_fit(across_steps):
    m = memo.ScopedMemo(10, len, evict=False)
    assert m.put("s1", K("c", "a"), "1234") and m.put("s2", K("c", "b"), "1234")
    assert not m.put("s3", K("c", "c"), "12345")  # 13 > 10: refused, nothing dropped for it
    assert m.scopes() == ["s1", "s2"] and m.take("s1", K("c", "a")) == "1234"
    assert m.put("s3", K("c", "c"), "12345")  # room once taken


def test_the_pass_shards_are_in_the_order_the_pass_starts_them(tiny_run):
    from megacpp_assets.snapshot_run import PassUnits, _pass_shards

    root, instance = tiny_run
    run = _run(root, instance)
    shards = _pass_shards(run, 2)
    units = PassUnits(run, 2).first()
    assert len(shards) >= 3
    assert [(run.manifest.sources[u[1][1] - 1].name, u[1][2]) for u in units if u[0] == "shard"] == shards


def test_files_made_ahead_are_what_the_chunk_stage_takes_and_the_bytes_are_the_same(tiny_run, tmp_path, monkeypatch,
                                                                                   across_steps):
    """Every scrubbed file of every shard made ahead; then the chunk stage of a revision
    parses and enriches none of its kept files (the figure says so), writes the session
    run's bytes, and leaves nothing of its shards in the memo."""
    from megacpp_assets.snapshot_run import _pass_shards
    from megacpp_core import stages

    root, instance = tiny_run
    shards = _pass_shards(_run(root, instance), 2)
    got = parse_ahead.parse_ahead(open_root(str(root)), "tiny", shards, True, threading.Event())
    assert got["ended"] == "done" and got["shards"] == len(shards)
    assert got["files"] == _scrubbed_files(root, shards) == len(memo.PARSED_AHEAD) > 50
    parsed, fe = next(iter(next(iter(memo.PARSED_AHEAD._scopes.values())).values()))[0]
    assert isinstance(parsed, chunk.ParsedSource) and isinstance(fe, enrich.FileEnrichment)

    shutil.copytree(root / "snapshots", tmp_path / "snapshots")
    manifest = load_manifest(str(tmp_path / "snapshots" / "tiny" / "manifest.yaml"))
    rev = tmp_path / "snapshots" / "tiny" / "revisions" / SRC
    want = {p: p.read_bytes() for p in sorted((rev / "shards").glob("*/chunks.parquet"))}
    assert want
    counts = _counting(monkeypatch)
    res = stages.run("chunk", str(tmp_path), manifest, SRC)
    assert res.ok
    assert counts["parse"].get("chunk", 0) == counts["enrich"].get("chunk", 0) == 0
    assert res.figures["files_parsed_ahead"] == res.figures["files"] > 10
    assert not [s for s in memo.PARSED_AHEAD.scopes() if s.startswith(f"tiny/{SRC}|")]  # taken or dropped
    for p, b in want.items():
        assert p.read_bytes() == b, p


def test_parse_ahead_stops_when_asked_when_full_when_off_and_on_a_missing_shard(tiny_run, monkeypatch):
    from megacpp_assets.snapshot_run import _pass_shards

    root, instance = tiny_run
    data = open_root(str(root))
    shards = _pass_shards(_run(root, instance), 2)
    assert parse_ahead.parse_ahead(data, "tiny", shards, True, threading.Event())["ended"] == "off"  # not kept
    memo.keep_across_steps()
    try:
        stop = threading.Event()
        stop.set()
        assert parse_ahead.parse_ahead(data, "tiny", shards, True, stop) == {"files": 0, "shards": 0, "seconds": 0.0,
                                                                               "ended": "stopped"}
        small = memo.ScopedMemo(3_000_000, memo.ahead_bytes, evict=False)
        monkeypatch.setattr(memo, "PARSED_AHEAD", small)
        got = parse_ahead.parse_ahead(data, "tiny", shards, False, threading.Event())  # parses only
        assert got["ended"] == "full" and 0 < got["files"] == len(small) and small._used <= 3_000_000
        assert all(fe is None for scope in small._scopes.values() for (_, fe), _ in scope.values())
        assert small.scopes()[0] == f"tiny/{shards[0][0]}|{shards[0][1]}"  # the first shard to start, first
        got = parse_ahead.parse_ahead(data, "tiny", [("no-such-source", "000")], True, threading.Event())
        assert got["ended"] == "unreadable" and got["files"] == 0
    finally:
        memo.keep_across_steps(False)
    assert len(memo.PARSED_AHEAD) == 0


def test_a_worker_stops_parsing_ahead_before_its_first_unit_and_drops_what_started_before(tiny_run, across_steps):
    """``before_unit`` ends the thread (the worker's parsers are then its unit's alone);
    a shard unit drops what was made for the shards that started before it, and its own
    when its chunk stage will not run."""
    from megacpp_assets import run_workers

    root, instance = tiny_run
    run = _run(root, instance)
    run.parse_ahead(2)
    thread = run._ahead[0]
    run._ahead[0].join()  # let it finish: every shard made ahead
    assert run.ahead_figures["ended"] == "done" and thread.name == "parse-ahead"
    order = list(run._ahead_order)
    assert memo.PARSED_AHEAD.scopes() == [s for s in order if memo.PARSED_AHEAD._scopes.get(s)]
    assert len(order) >= 3 and all(memo.PARSED_AHEAD._scopes.get(s) for s in order)
    run._drop_ahead(order[1], keep=True)
    assert memo.PARSED_AHEAD.scopes() == order[1:]
    run._drop_ahead(order[1], keep=False)  # its stage is current: nothing takes its files
    assert memo.PARSED_AHEAD.scopes() == order[2:] == run._ahead_order
    run._drop_ahead(None, keep=False)  # the pass's snapshot steps: nothing is left
    assert len(memo.PARSED_AHEAD) == 0 and run._ahead_order == []

    run.parse_ahead(2)  # again, and stopped at once by the first unit through the worker's call
    calls = []
    run.probe = lambda: calls.append((run._ahead, run.ahead_figures))
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(run_workers, "_WORKER", run)
    try:
        run_workers._call("probe")
    finally:
        monkeypatch.undo()
    assert calls[0][0] is None and calls[0][1]["ended"] in ("stopped", "done")
    run.before_unit()  # nothing running: a no-op
    assert not [t for t in threading.enumerate() if t.name == "parse-ahead"]


def test_no_parse_ahead_for_a_pass_that_chunks_nothing(tiny_run, across_steps):
    root, instance = tiny_run
    run = _run(root, instance)
    for n in (0, 1, 3):
        run.parse_ahead(n)
        assert getattr(run, "_ahead", None) is None and run.ahead_figures == {}
