"""Files' facts kept across the steps of one process (:mod:`megacpp_core.memo`, "Across
steps"): the chunk stage leaves each kept file's ``#include`` spellings and enrichment, the
revision's ``p3_repo`` and ``p4_structure`` stages take them instead of parsing and
enriching the files again, and the bytes they write are those they write alone. On the
real ``tiny`` snapshot; the memo itself on hostile sizes and scopes."""

from __future__ import annotations

import json
import shutil

import pytest

from megacpp_core import chunk, enrich, memo

SRC = "pybind11-3.1.0"


@pytest.fixture
def across_steps():
    """This process keeps values across steps for the test, and not afterwards."""
    memo.keep_across_steps()
    try:
        yield
    finally:
        memo.keep_across_steps(False)


K = memo.text_key


def test_a_scoped_memo_holds_nothing_unless_the_process_keeps_values_across_steps():
    m = memo.ScopedMemo(10, len)
    assert not memo.across_steps()
    assert not m.put("r1", K("c", "a"), "1") and len(m) == 0


def test_a_scoped_memo_drops_the_oldest_other_revisions_to_fit_and_gives_each_value_once(across_steps):
    m = memo.ScopedMemo(10, len)
    assert m.put("r1", K("c", "a"), "1234") and m.put("r2", K("c", "b"), "1234")
    assert not m.put("r1", K("c", "a"), "1")  # held already
    assert m.put("r3", K("c", "c"), "12345")  # 13 > 10: r1, the oldest other scope, goes
    assert m.scopes() == ["r2", "r3"] and m.take("r1", K("c", "a")) is None
    assert m.take("r2", K("cpp", "b")) is None  # the same text of another language is another key
    assert m.take("r2", K("c", "b")) == "1234" and m.take("r2", K("c", "b")) is None
    assert not m.put("r4", K("c", "d"), "x" * 11)  # alone over the limit: nothing dropped for it
    assert m.scopes() == ["r3"]
    assert m.put("r3", K("c", "e"), "12345")  # exactly the limit
    assert not m.put("r3", K("c", "f"), "1")  # its own scope is never dropped to make room
    m.drop("r3")
    assert len(m) == 0 and m.put("r3", K("c", "f"), "1")


def test_a_put_that_cannot_fit_drops_no_other_revision(across_steps):
    m = memo.ScopedMemo(10, len)
    assert m.put("r1", K("c", "a"), "12") and m.put("r2", K("c", "b"), "12345678")
    assert not m.put("r2", K("c", "c"), "12345")  # r2 alone would hold 13: refused, r1 kept
    assert m.scopes() == ["r1", "r2"] and m.take("r1", K("c", "a")) == "12"
    assert m.put("r3", K("c", "d"), "123")  # 8 + 3 > 10: r2 (the oldest other) goes
    assert m.scopes() == ["r3"]


def test_the_memo_keys_by_digest_and_holds_no_text():
    text = "int x;\n" * 1000
    key = memo.text_key("c", text)
    assert key == ("c", __import__("hashlib").sha256(text.encode()).digest())
    assert key != memo.text_key("cpp", text) and memo.text_key("c", "\udcff") != memo.text_key("c", "?")


def test_keeping_stops_empties_the_file_memos_and_a_step_end_does_not(across_steps):
    text = "int f(void) { return g(); }\n"
    assert memo.FILE_ENRICHMENT.put("rev", K("c", text), enrich.enrich_file(text, "c"))
    assert memo.FILE_INCLUDES.put("rev", K("c", "#include <a.h>\n"), ["a.h"])
    memo.clear_all()  # a step's end: the step memos only
    assert len(memo.FILE_ENRICHMENT) == len(memo.FILE_INCLUDES) == 1
    memo.keep_across_steps(False)
    assert len(memo.FILE_ENRICHMENT) == len(memo.FILE_INCLUDES) == 0


def test_the_estimates_grow_with_what_a_value_holds():
    small = enrich.enrich_file("int x;\n", "c")
    big = enrich.enrich_file("".join(f"int f{i}(void) {{ return g{i}(); }}\n" for i in range(50)), "c")
    assert memo.enrichment_bytes(small) >= 4 * 7
    assert memo.enrichment_bytes(big) > 50 * (250 + 160) + 4 * 50 * 30
    assert memo.includes_bytes([]) == 56 and memo.includes_bytes(["a.h", "bb.h"]) == 56 + 57 + 3 + 57 + 4


def _counting(monkeypatch) -> dict[str, int]:
    """Calls of ``enrich_file`` and parses (``ParsedSource`` made), under ``counts["now"]``."""
    counts = {"now": "chunk", "enrich": {}, "parse": {}}
    real_enrich, real_parse = enrich.enrich_file, chunk.ParsedSource.__init__

    def enrich_file(*a, **k):
        counts["enrich"][counts["now"]] = counts["enrich"].get(counts["now"], 0) + 1
        return real_enrich(*a, **k)

    def parse(self, text, language):
        counts["parse"][counts["now"]] = counts["parse"].get(counts["now"], 0) + 1
        real_parse(self, text, language)

    monkeypatch.setattr(enrich, "enrich_file", enrich_file)
    monkeypatch.setattr(chunk.ParsedSource, "__init__", parse)
    return counts


@pytest.mark.parametrize("keep", [True, False])
def test_p3_and_p4_take_the_chunk_steps_facts_and_write_the_same_bytes(tiny_run, tmp_path, monkeypatch, keep):
    """Kept across steps, p3 parses no file and p4 enriches none (every file's facts came
    from chunk, and the figures say so); not kept (a step alone), chunk leaves nothing and
    both do the work themselves. The bytes are the session run's either way, and the
    revision leaves nothing in the memos."""
    from megacpp_core import stages
    from megacpp_core.manifest import load_manifest

    shutil.copytree(tiny_run[0] / "snapshots", tmp_path / "snapshots")
    manifest = load_manifest(str(tmp_path / "snapshots" / "tiny" / "manifest.yaml"))
    rev = tmp_path / "snapshots" / "tiny" / "revisions" / SRC
    want = {p: p.read_bytes() for p in [rev / "families" / "p3_repo.parquet", rev / "families" / "p4_structure.parquet",
                                         *sorted((rev / "shards").glob("*/chunks.parquet"))]}
    assert len(want) > 2
    memo.keep_across_steps(keep)
    try:
        counts = _counting(monkeypatch)
        assert stages.run("chunk", str(tmp_path), manifest, SRC).ok
        files = counts["enrich"]["chunk"]
        assert files > 10 and len(memo.FILE_ENRICHMENT) == (files if keep else 0)
        assert len(memo.FILE_INCLUDES) == (files if keep else 0)
        counts["now"] = "p3"
        p3 = stages.run("repo_documents", str(tmp_path), manifest, SRC)
        counts["now"] = "p4"
        p4 = stages.run("structure_documents", str(tmp_path), manifest, SRC)
        assert p3.ok and p4.ok
        assert p3.figures["files"] == files
        assert p3.figures["files_with_held_includes"] == (files if keep else 0)
        assert p4.figures["files_with_held_enrichment"] == (files if keep else 0)
        assert counts["parse"].get("p3", 0) == (0 if keep else files)
        assert counts["enrich"].get("p4", 0) == (0 if keep else files)
        assert counts["parse"].get("p4", 0) == 0  # p3's parses, when it made them, went to p4 within the step
        assert len(memo.FILE_ENRICHMENT) == len(memo.FILE_INCLUDES) == 0
    finally:
        memo.keep_across_steps(False)
    for p, b in want.items():
        assert p.read_bytes() == b, p


def test_the_other_revisions_facts_stay_until_their_own_p4(tiny_run, tmp_path, across_steps):
    """p3 and p4 of one revision drop only that revision's leftovers: another revision
    chunked in this process keeps its facts for its own later step."""
    enrich_fe = enrich.enrich_file("int x;\n", "c")
    memo.FILE_ENRICHMENT.put("tiny/other-1.0", K("c", "int x;\n"), enrich_fe)
    memo.FILE_INCLUDES.put("tiny/other-1.0", K("c", "int x;\n"), [])
    memo.FILE_INCLUDES.put(f"tiny/{SRC}", K("c", "not a file of the revision\n"), ["x.h"])
    memo.FILE_ENRICHMENT.put(f"tiny/{SRC}", K("c", "not a file of the revision\n"), enrich_fe)
    from megacpp_core import stages
    from megacpp_core.manifest import load_manifest

    shutil.copytree(tiny_run[0] / "snapshots", tmp_path / "snapshots")
    manifest = load_manifest(str(tmp_path / "snapshots" / "tiny" / "manifest.yaml"))
    assert stages.run("repo_documents", str(tmp_path), manifest, SRC).ok
    assert stages.run("structure_documents", str(tmp_path), manifest, SRC).ok
    assert memo.FILE_ENRICHMENT.scopes() == ["tiny/other-1.0"] == memo.FILE_INCLUDES.scopes()


def test_megacpp_run_in_one_process_took_every_files_facts_and_kept_none_after(tiny_run):
    """The session's ``megacpp run --corpus tiny`` (one worker: every step in this
    process) kept files' facts across its steps: every revision's p3 and p4 took all of
    them. Afterwards the process keeps nothing (as before the run)."""
    figures = tiny_run[0] / "snapshots" / "tiny" / "figures"
    revisions = sorted(p.stem for p in (figures / "repo_documents").glob("*.json"))
    assert len(revisions) >= 3
    for r in revisions:
        p3 = json.loads((figures / "repo_documents" / f"{r}.json").read_text())
        p4 = json.loads((figures / "structure_documents" / f"{r}.json").read_text())
        p3, p4 = p3.get("figures", p3), p4.get("figures", p4)
        assert p3["files_with_held_includes"] == p3["files"] == p4["files_with_held_enrichment"], r
    assert not memo.across_steps() and len(memo.FILE_ENRICHMENT) == len(memo.FILE_INCLUDES) == 0
