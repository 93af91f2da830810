"""The license stage's ScanCode layer (megacpp_core.license_scancode): the result store never
answers for another text or another ScanCode, survives hostile texts and concurrent
workers; the candidate prefilter gives ScanCode's own candidates and answers; the index
loads once per process, in a spawned worker as in the calling process."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import random

import pytest

from megacpp_core import license as lic
from megacpp_core import license_scancode as lsc

from .test_license import MIT_TEXT

ANSWER = {"detected_license_expression_spdx": "MIT",
          "license_detections": [{"matches": [{"match_coverage": 100.0, "license_expression_spdx": "MIT"}]}]}
HOSTILE = ["", " ", "\x00" * 16, "../../../etc/passwd", "a\udcffb", "\r\n\u2028\u2029\x0c", '"}]}' * 50,
           "é" * 5000, "x" * 1_000_000, "SPDX-License-Identifier: MIT\n" * 100]


def test_store_round_trip_and_misses(tmp_path):
    store = lsc.ResultStore(tmp_path, ns="format=1;scancode-toolkit-mini==32.5.0;index=a:1:1")
    assert store.get("Licensed under MIT.") is None
    store.put("Licensed under MIT.", ANSWER)
    assert store.get("Licensed under MIT.") == ANSWER and store.hits == 1
    # another text, even one character away, is a miss
    assert store.get("Licensed under MIT") is None and store.get("Licensed under MIT. ") is None
    # another ScanCode version or another index file reads another namespace: a miss
    for ns in ("format=1;scancode-toolkit-mini==32.6.0;index=a:1:1", "format=1;scancode-toolkit-mini==32.5.0;index=a:2:1",
               "format=2;scancode-toolkit-mini==32.5.0;index=a:1:1"):
        assert lsc.ResultStore(tmp_path, ns=ns).get("Licensed under MIT.") is None


def test_namespace_follows_scancode_version_and_index_file(tmp_path, monkeypatch):
    index = tmp_path / "index_cache"
    index.write_bytes(b"x" * 10)
    monkeypatch.setattr(lsc, "_index_file", lambda: index)
    first = lsc.namespace()
    assert "scancode" in first and str(index) in first
    index.write_bytes(b"y" * 11)  # a rebuilt index
    assert lsc.namespace() != first
    second = lsc.namespace()
    monkeypatch.setattr(lsc, "scancode_version", lambda: "scancode-toolkit==33.0.0")
    assert lsc.namespace() != second
    index.unlink()
    assert lsc.namespace().endswith("index=none")


def test_store_rejects_foreign_and_damaged_files(tmp_path):
    store = lsc.ResultStore(tmp_path, ns="ns")
    store.put("text A", ANSWER)
    path_a = store._path(lsc.text_key("text A"))
    path_b = store._path(lsc.text_key("text B"))
    path_b.parent.mkdir(parents=True, exist_ok=True)
    good = json.loads(path_a.read_text())
    bad = [
        path_a.read_text(),  # text A's record under text B's name: names another text
        "{not json", "", "null", "[]",
        json.dumps({**good, "sha256": lsc.text_key("text B"), "ns": "other"}),
        json.dumps({**good, "sha256": lsc.text_key("text B"), "result": {**ANSWER, "extra": 1}}),
        json.dumps({**good, "sha256": lsc.text_key("text B"), "result": {**ANSWER, "detected_license_expression_spdx": 3}}),
        json.dumps({**good, "sha256": lsc.text_key("text B"), "result": {
            "detected_license_expression_spdx": None,
            "license_detections": [{"matches": [{"match_coverage": True, "license_expression_spdx": "MIT"}]}]}}),
        json.dumps({**good, "sha256": lsc.text_key("text B"), "result": {
            "detected_license_expression_spdx": None, "license_detections": [{"matches": "MIT"}]}}),
    ]
    for content in bad:
        path_b.write_text(content)
        assert store.get("text B") is None, content
    path_b.write_bytes(b"\xff\xfe\x00")
    assert store.get("text B") is None
    assert store.get("text A") == ANSWER


def test_store_on_hostile_texts(tmp_path):
    store = lsc.ResultStore(tmp_path, ns="ns")
    for i, text in enumerate(HOSTILE):
        store.put(text, {**ANSWER, "detected_license_expression_spdx": f"E{i}"})
    for i, text in enumerate(HOSTILE):
        assert store.get(text)["detected_license_expression_spdx"] == f"E{i}"
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == len(HOSTILE) and all(p.parent.parent == store.dir for p in files)
    assert not any(p.name.endswith(".tmp") for p in files)


def test_store_that_cannot_be_written_is_skipped(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = lsc.ResultStore(blocker, ns="ns")
    store.put("text", ANSWER)
    assert store.errors == 1 and store.get("text") is None


def _write_many(directory: str, seed: int) -> int:
    store = lsc.ResultStore(directory, ns="ns")
    rng = random.Random(seed)
    order = list(range(40))
    rng.shuffle(order)
    bad = 0
    for i in order:
        store.put(f"notice {i}", {**ANSWER, "detected_license_expression_spdx": f"E{i}"})
        got = store.get(f"notice {rng.randrange(40)}")
        bad += got is not None and not got["detected_license_expression_spdx"].startswith("E")
    return bad


def test_store_with_concurrent_workers(tmp_path):
    from concurrent.futures import ProcessPoolExecutor

    # ProcessPoolExecutor, not multiprocessing.Pool: Pool.terminate (its __exit__) can wait
    # forever for a worker it started again while terminating (seen once on a loaded machine)
    with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("spawn")) as pool:
        assert list(pool.map(_write_many, [str(tmp_path)] * 4, range(4))) == [0, 0, 0, 0]
    store = lsc.ResultStore(tmp_path, ns="ns")
    assert all(store.get(f"notice {i}")["detected_license_expression_spdx"] == f"E{i}" for i in range(40))
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_scanner_reads_the_store_and_never_a_stale_answer(tmp_path, monkeypatch):
    calls = []

    def fake(text):
        calls.append(text)
        return {**ANSWER, "detected_license_expression_spdx": "Zlib" if "zlib" in text else "MIT"}

    monkeypatch.setattr(lic, "run_scancode", fake)
    first = lic.Scanner(lsc.ResultStore(tmp_path, ns="v1"))
    assert first.scan("Licensed under the MIT License.") == "MIT" and len(calls) == 1
    again = lic.Scanner(lsc.ResultStore(tmp_path, ns="v1"))
    assert again.scan("Licensed under the MIT License.") == "MIT"
    assert (len(calls), again.scans, again.store_hits) == (1, 0, 1)
    assert again.scan("Licensed under the zlib License.") == "Zlib" and len(calls) == 2  # another text
    other = lic.Scanner(lsc.ResultStore(tmp_path, ns="v2"))  # another ScanCode
    assert other.scan("Licensed under the MIT License.") == "MIT" and (len(calls), other.scans) == (3, 1)
    same_dir = lic.Scanner(lsc.ResultStore(tmp_path, ns="v1"))
    same_dir.use_store(tmp_path)  # the same folder: the scanner keeps its store
    assert same_dir.store.ns == "v1"


# -- real ScanCode ----------------------------------------------------------------------

def _rule_texts(idx, n: int) -> list[str]:
    """``n`` perturbed texts of ScanCode's own rules (deterministic): words dropped and
    shuffled, rules glued together, project prose around them."""
    rng = random.Random(19)
    rules = [r for r in idx.rules_by_rid if r.text and 20 < len(r.text) < 6000]
    out = []
    for _ in range(n):
        words = " ".join(rng.choice(rules).text for _ in range(rng.randint(1, 3))).split()
        words = [w for w in words if rng.random() > 0.08]
        if rng.random() < 0.3:
            i = rng.randrange(len(words))
            words[i:i] = "This module frobnicates widgets for the parser".split()
        out.append(" ".join(words))
    return out


@pytest.fixture(scope="module")
def index():
    lsc.load()
    from licensedcode.cache import get_index

    return get_index()


def test_prefilter_gives_scancode_own_candidates(index, monkeypatch):
    from licensedcode.match_set import build_set_and_mset
    from licensedcode.query import build_query

    # pyproject pins scancode-toolkit-mini 32.5.0, whose candidate step the prefilter knows
    assert lsc.install_prefilter(), f"no prefilter for {lsc.scancode_version()}"
    original = lsc._ORIGINAL["compute_candidates"]
    seen = []

    def spy(run, idx, matchable, *rest):
        seen.append((idx, matchable))
        return original(run, idx, matchable, *rest)

    monkeypatch.setitem(lsc._ORIGINAL, "compute_candidates", spy)
    texts = [MIT_TEXT, MIT_TEXT[:300] + " GPL " + MIT_TEXT[300:], "int main(void) { return 0; }", *HOSTILE[:7]]
    texts += _rule_texts(index, 15)
    compared = ties = 0
    for text in texts:
        query = build_query(query_string=text, idx=index) if text else None
        if query is None:
            continue
        runs = [(query.whole_query_run(), 10, True)] + [(r, 70, False) for r in query.query_runs]
        for run, top, high in runs:
            want = original(run, index, index.approx_matchable_rids, top, high, 0.8, False)
            seen.clear()
            got = lsc._compute_candidates(run, index, index.approx_matchable_rids, top, high, 0.8, False)
            # the same candidates in the same order: score vectors, rule ids of the index,
            # the rules themselves and their token intersections
            assert [(c[0], c[1], c[3]) for c in got] == [(c[0], c[1], c[3]) for c in want], text[:200]
            assert all(g[2] is w[2] is index.rules_by_rid[w[1]] for g, w in zip(got, want))
            qset, _ = build_set_and_mset(run.matchable_tokens())
            kept = lsc._survivors(lsc._tables(index), qset, index.approx_matchable_rids, top, high, 0.8)
            assert set(kept) <= index.approx_matchable_rids
            # ScanCode's function is given the kept rules alone, not the whole index to skip through
            (view, matchable), = seen
            assert len(view.rules_by_rid) == len(kept) and list(matchable) == list(range(len(kept)))
            assert all(v is index.rules_by_rid[r] for v, r in zip(view.rules_by_rid, kept))
            compared += bool(want)
            ties += len({c[0] for c in want}) < len(want)
    assert compared >= 10 and ties  # some answers rank rules with equal score vectors (broken by rule id)


def test_prefilter_gives_scancode_own_answers(index):
    texts = [MIT_TEXT, *_rule_texts(index, 5), "Copyright (c) 2024 Jane Doe\n\n" + MIT_TEXT.replace("MIT", "Zlib")]
    on = [lsc.run_scancode(t) for t in texts]
    lsc.install_prefilter(False)
    try:
        off = [lsc.run_scancode(t) for t in texts]
    finally:
        lsc.install_prefilter(True)
    assert on == off
    assert on[0]["detected_license_expression_spdx"] == "MIT"


def test_index_loads_once_per_process(index):
    loads = lsc.LOAD["loads"]
    assert loads == 1 and lsc.LOAD["seconds"] > 0
    assert lsc.load() == 0.0
    lic.Scanner().scan("Licensed under the Apache License, Version 2.0.")
    assert lsc.LOAD["loads"] == 1


_FRESH_LOAD = """
import gc, json, sys
from megacpp_core import license as lic, license_scancode as lsc
from licensedcode.cache import get_index
if sys.argv[1] == "categories":
    assert lic._scancode_categories()["mit"] == "Permissive"
else:
    lsc.load()
index = get_index()
tracked = {id(o) for o in gc.get_objects()}
rules = index.rules_by_rid
postings = [p for p in index.high_postings_by_rid[::97] if p is not None]
print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(), "rules": len(rules),
                  "rules_tracked": gc.is_tracked(rules[0]), "postings": len(postings),
                  "rules_collected": sum(id(r) in tracked for r in rules[::97]),
                  "postings_collected": sum(id(p) in tracked for p in postings),
                  "table_collected": id(index.rules_by_id) in tracked}))
"""


@pytest.mark.parametrize("first", ["load", "categories"])
def test_real_index_is_out_of_the_collectors_reach(first):
    """ScanCode's real index, loaded in a fresh process as a worker loads it (or first
    reached through ScanCode's license categories): its rules and postings are frozen
    (``gc.get_objects`` lists the collected generations, not the frozen one) and the
    collector is on again."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FRESH_LOAD, first], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["enabled"] and got["rules"] > 30_000 and got["rules_tracked"] and got["postings"] > 100
    assert got["frozen"] > 1_000_000  # the index's objects
    assert got["rules_collected"] == 0 and got["postings_collected"] == 0 and not got["table_collected"]


def _stub_index_load(monkeypatch, index_file):
    """``load`` with a fresh per-process state, ScanCode's ``get_index`` stubbed to record
    whether the collector is on while it runs and to make 20,000 objects, the prefilter
    off and the index file at ``index_file``; returns the record."""
    from licensedcode import cache

    seen = {}

    def get_index():
        seen["collector_on"] = gc.isenabled()
        seen["made"] = [[i] for i in range(20_000)]
        return object()

    monkeypatch.setattr(cache, "get_index", get_index)
    monkeypatch.setattr(lsc, "install_prefilter", lambda on=True: False)
    monkeypatch.setattr(lsc, "_index_file", lambda: index_file)
    monkeypatch.setitem(lsc.LOAD, "seconds", None)
    monkeypatch.setitem(lsc.LOAD, "loads", 0)
    return seen


@pytest.mark.parametrize("collector_on", [True, False])
def test_index_unpickled_with_the_collector_off_then_frozen(tmp_path, monkeypatch, collector_on):
    index_file = tmp_path / "index_cache"
    index_file.write_bytes(b"x")
    seen = _stub_index_load(monkeypatch, index_file)
    gc.enable() if collector_on else gc.disable()
    frozen = gc.get_freeze_count()
    try:
        lsc.load()
        assert seen["collector_on"] is False
        assert gc.isenabled() is collector_on  # the caller's state, restored
        assert gc.get_freeze_count() >= frozen + 20_000
        tracked = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in tracked for o in seen["made"][::100])
    finally:
        if not frozen:
            gc.unfreeze()  # what the stubbed load froze of this test process
        gc.enable()


def test_index_built_with_the_collector_on(tmp_path, monkeypatch):
    """No index file yet: ScanCode builds it (minutes, once per install) with the collector on."""
    seen = _stub_index_load(monkeypatch, tmp_path / "missing" / "index_cache")
    gc.enable()
    frozen = gc.get_freeze_count()
    try:
        lsc.load()
        assert seen["collector_on"] is True and gc.isenabled()
    finally:
        if not frozen:
            gc.unfreeze()


class _StubWorker:
    """A ``megacpp run`` worker's view of the license tools, with ScanCode's index load stubbed."""

    def __init__(self):
        from licensedcode import cache

        self.index_loads = 0

        def get_index():
            self.index_loads += 1
            return object()

        cache.get_index = get_index
        lsc.install_prefilter = lambda on=True: False

    def unit(self, n: int):
        from megacpp_core.stages.license import shared_scanner

        lsc.load()
        return os.getpid(), self.index_loads, lsc.LOAD["loads"], id(shared_scanner())


def test_index_loads_once_per_worker():
    from megacpp_assets.run_workers import WorkerPool

    got = []

    def done(method, args, result):
        got.append(result)
        return True, []

    with WorkerPool(1, _StubWorker, ()) as pool:
        assert pool.run_units([("unit", (i,)) for i in range(3)], done)
    assert len({g[0] for g in got}) == 1 and len({g[3] for g in got}) == 1
    assert [g[1:3] for g in got] == [(1, 1)] * 3
