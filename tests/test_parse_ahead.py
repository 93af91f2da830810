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
                                                                               "ended": "stopped", "unreadable": []}
        small = memo.ScopedMemo(3_000_000, memo.ahead_bytes, evict=False)
        monkeypatch.setattr(memo, "PARSED_AHEAD", small)
        got = parse_ahead.parse_ahead(data, "tiny", shards, False, threading.Event())  # parses only
        assert got["ended"] == "full" and 0 < got["files"] == len(small) and small._used <= 3_000_000
        assert all(fe is None for scope in small._scopes.values() for (_, fe), _ in scope.values())
        assert small.scopes()[0] == f"tiny/{shards[0][0]}|{shards[0][1]}"  # the first shard to start, first
        roomy = memo.ScopedMemo(1 << 30, memo.ahead_bytes, evict=False)
        monkeypatch.setattr(memo, "PARSED_AHEAD", roomy)
        got = parse_ahead.parse_ahead(data, "tiny", [("no-such-source", "000"), shards[-1]], False, threading.Event())
        assert got["ended"] == "done" and got["unreadable"] == ["tiny/no-such-source|000"]  # skipped, not the end
        assert got["shards"] == 1 and got["files"] == len(roomy) > 0
        again = parse_ahead.parse_ahead(data, "tiny", [shards[-1]], False, threading.Event())
        assert again["ended"] == "done" and again["files"] == 0 and len(roomy) == got["files"]  # held: skipped
    finally:
        memo.keep_across_steps(False)
    assert len(roomy) == 0  # emptied when the process stops keeping values across steps


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

    # again, with the thread held inside its first parse: the first unit, through the
    # worker's call, stops it there; the unit runs once the thread has ended
    entered, gate, real = threading.Event(), threading.Event(), chunk.parse_source
    monkeypatch = pytest.MonkeyPatch()

    def held(text, language):
        entered.set()
        gate.wait(10)
        return real(text, language)

    monkeypatch.setattr(chunk, "parse_source", held)
    monkeypatch.setattr(run_workers, "_WORKER", run)
    calls = []
    run.probe = lambda: calls.append((run._ahead, dict(run.ahead_figures), thread2.is_alive()))
    try:
        run.parse_ahead(2)
        thread2 = run._ahead[0]
        assert entered.wait(10)
        threading.Timer(0.2, gate.set).start()  # the parse in progress finishes; no further file starts
        run_workers._call("probe")
    finally:
        monkeypatch.undo()
    assert calls == [(None, {**calls[0][1], "ended": "stopped"}, False)]
    assert calls[0][1]["files"] == 1 == len(memo.PARSED_AHEAD)
    run.before_unit()  # nothing running: a no-op
    assert not [t for t in threading.enumerate() if t.name == "parse-ahead"]


def test_no_parse_ahead_for_a_pass_that_chunks_nothing(tiny_run, across_steps):
    root, instance = tiny_run
    run = _run(root, instance)
    for n in (0, 1, 3):
        run.parse_ahead(n)
        assert getattr(run, "_ahead", None) is None and run.ahead_figures == {}


def test_parse_ahead_stops_when_the_pass_begins_and_reports_an_error(tiny_run, monkeypatch, across_steps, capsys):
    """``started`` set (the calling process began the pass): a worker still without a unit
    makes nothing more; an error making the shard list ends the thread with it in the
    figures, and the worker's first unit prints the line."""
    from megacpp_assets import snapshot_run

    root, instance = tiny_run
    run = _run(root, instance)
    started = threading.Event()
    started.set()
    run.parse_ahead(2, started)
    run._ahead[0].join()
    assert run.ahead_figures["ended"] == "stopped" and run.ahead_figures["files"] == 0 and len(memo.PARSED_AHEAD) == 0

    def broken(*a, **k):
        raise OSError("storage unreachable")

    monkeypatch.setattr(snapshot_run, "_pass_shards", broken)
    run.parse_ahead(2)
    run._ahead[0].join()
    run.before_unit()
    assert run.ahead_figures == {"ended": "error: OSError: storage unreachable"}
    assert "parse ahead: 0 files of 0 whole shards in 0.0s (error: OSError: storage unreachable)" in capsys.readouterr().out


def test_a_parse_without_its_enrichment_made_ahead_gives_the_same_documents(tiny_tokenizer, across_steps):
    """Files made ahead by a parse-only worker (settings without enrichment) and taken by an
    enriching chunk stage: each file is enriched there, and the columns are those of a stage
    that made everything itself."""
    from megacpp_core import kept, catalog
    from megacpp_core.runner import InputRef
    from megacpp_core.stage import Partition
    from megacpp_core.stages import chunk as chunk_stage

    lay, tok, sha = tiny_tokenizer
    root = open_root(str(lay.data_root))
    manifest = load_manifest(str(lay.root / "manifest.yaml"))
    part = Partition("tiny", SRC, "000")
    d = kept.shard_kept(InputRef(root, catalog.SCRUBBED, part), InputRef(root, catalog.DECISIONS, Partition("tiny"))
                        ).to_pydict()
    budget = manifest.settings.row_length - 1
    want, _ = chunk_stage.chunk_rows(d, tok, sha, budget, True)
    got = parse_ahead.parse_ahead(root, "tiny", [(SRC, "000")], False, threading.Event())
    assert got["ended"] == "done" and got["files"] > 10
    cols, tally = chunk_stage.chunk_rows(d, tok, sha, budget, True, ahead=chunk_stage.ahead_taker(part.key))
    assert tally["files_parsed_ahead"] == got["files"] and tally["enrich_seconds"] > 0
    assert cols == want


class _AheadProbe:
    """A worker state built by ``SnapshotRun.in_worker`` as ``megacpp run`` builds the
    second pass's, asked what its parse-ahead did once its first unit stopped it."""

    def __init__(self, *args):
        from megacpp_assets.snapshot_run import SnapshotRun

        self.run = SnapshotRun.in_worker(*args)

    def after_init(self):
        self.run.after_init()

    def before_unit(self):
        self.run.before_unit()

    def ahead(self) -> tuple[dict, int]:
        return dict(self.run.ahead_figures), len(getattr(self.run, "_ahead_order", []) or [])


@pytest.mark.integration
@pytest.mark.parametrize("switch", ["1", "0"])
def test_a_second_pass_worker_parses_ahead_unless_switched_off(tiny_run, monkeypatch, switch):
    """Through the real fork server and ``WorkerPool``: a worker given ``ahead=2`` starts
    the thread once built and its first unit stops it (figures and the shard order are
    there); with ``MEGACPP_PARSE_AHEAD=0`` nothing starts."""
    from megacpp_assets.run_workers import WorkerPool, start_fork_server

    root, instance = tiny_run
    monkeypatch.setenv("MEGACPP_PARSE_AHEAD", switch)
    start_fork_server()
    args = (str(root / "snapshots" / "tiny" / "manifest.yaml"), open_root(str(root)).url, instance.get_ref(), False, None,
            True, 2, None)
    got: list = []
    with WorkerPool(1, _AheadProbe, args).start() as pool:
        assert pool.run_units([("ahead", ())], lambda m, a, r: (got.append(r), (True, []))[1])
    figures, shards = got[0]
    if switch == "0":
        assert figures == {} and shards == 0
    else:
        assert figures["ended"] in ("stopped", "done") and "files" in figures
