"""Parses handed from the ``p3_repo`` stage to the ``p4_structure`` stage in one process
(:data:`megacpp_core.memo.PARSED`), on the real ``tiny`` snapshot: run as their step runs
them, p4 parses no file and writes the bytes it writes alone (when it parses every file);
the memo keeps one revision within its limit and is empty afterwards."""

from __future__ import annotations

import shutil

import pytest

from megacpp_core import chunk, memo

SRC = "pybind11-3.1.0"


def test_a_text_memo_holds_one_scope_within_its_limit_and_gives_each_value_once():
    m = memo.TextMemo(10, len)
    assert not m.put("a", "x", "123")  # nothing begun
    m.begin("a")
    assert m.put("a", "x", "123") and not m.put("b", "y", "1") and not m.put("a", "x", "1")  # another scope; held
    assert not m.put("a", "z", "12345678")  # 3 + 8 > 10
    assert m.take("b", "x") is None and m.take("a", "x") == "123" and m.take("a", "x") is None
    assert m.put("a", "z", "1234567890")  # room again once taken
    m.begin("b")  # a new scope drops the rest
    assert len(m) == 0 and m.take("a", "z") is None
    m.put("b", "x", "1")
    m.clear()
    assert len(m) == 0 and not m.put("b", "x", "1")


def test_the_parse_memo_counts_the_trees_and_offset_maps_it_holds():
    ascii_, wide = chunk.parse_source("int x;\n", "c"), chunk.parse_source("int é;\n", "c")
    assert memo.parsed_bytes(ascii_) == memo.TREE_BYTES_PER_BYTE * 7  # no offset map for ASCII
    assert memo.parsed_bytes(wide) == memo.TREE_BYTES_PER_BYTE * 8 + 8 * 9  # 8 bytes, an int64 map of 9
    m = memo.TextMemo(memo.parsed_bytes(ascii_), memo.parsed_bytes)
    m.begin("rev")
    assert m.put("rev", ascii_.text, ascii_) and not m.put("rev", "other", chunk.parse_source("int y;\n", "c"))


def _count_parses(monkeypatch) -> dict[str, list[str]]:
    """Texts parsed (``ParsedSource`` made), under the key ``counts["now"]`` names."""
    counts: dict[str, list[str]] = {"now": "p3", "p3": [], "p4": []}
    real = chunk.ParsedSource.__init__

    def counting(self, text, language):
        counts[counts["now"]].append(text)
        real(self, text, language)

    monkeypatch.setattr(chunk.ParsedSource, "__init__", counting)
    return counts


@pytest.mark.parametrize("limit", [memo.MAX_PARSED_BYTES, 440_000])
def test_p3_then_p4_in_one_process_parse_each_file_once_and_write_the_same_bytes(tiny_run, tmp_path, monkeypatch, limit):
    """With the memo's full limit p4 parses nothing; with a small one it parses the files
    the memo could not hold; run alone it parses every file. The bytes are the session
    run's each time, and the memo ends empty."""
    from megacpp_core import stages
    from megacpp_core.manifest import load_manifest

    shutil.copytree(tiny_run[0] / "snapshots", tmp_path / "snapshots")
    manifest = load_manifest(str(tmp_path / "snapshots" / "tiny" / "manifest.yaml"))
    fam = tmp_path / "snapshots" / "tiny" / "revisions" / SRC / "families"
    want = {n: (fam / n).read_bytes() for n in ("p3_repo.parquet", "p4_structure.parquet")}
    monkeypatch.setattr(memo.PARSED, "limit", limit)
    for alone in (False, True):
        for n in want:
            (fam / n).unlink()
        counts = _count_parses(monkeypatch)
        assert stages.run("repo_documents", str(tmp_path), manifest, SRC).ok
        held = len(memo.PARSED)
        if alone:
            memo.PARSED.clear()  # as in another process
        counts["now"] = "p4"
        assert stages.run("structure_documents", str(tmp_path), manifest, SRC).ok
        assert len(memo.PARSED) == 0
        files = len(counts["p3"])
        assert files > 0 and len(counts["p4"]) == (files if alone else files - held)
        assert held == files if limit == memo.MAX_PARSED_BYTES else 0 < held < files
        for n, b in want.items():
            assert (fam / n).read_bytes() == b, (n, alone)


def test_clear_all_empties_every_memo_of_the_process():
    from megacpp_core import ids_memo

    import numpy as np

    ids_memo.MEMO.begin("sha")
    ids_memo.MEMO.put("sha", "a", np.zeros(2, np.uint32))
    memo.PARSED.begin("rev")
    memo.PARSED.put("rev", "int x;\n", chunk.parse_source("int x;\n", "c"))
    mine = memo.TextMemo(10, len)
    mine.begin("s")
    mine.put("s", "t", "v")
    memo.clear_all()
    assert len(ids_memo.MEMO) == len(memo.PARSED) == len(mine) == 0
