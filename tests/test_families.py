"""The curriculum's family registry and the phase-1 split (megacpp_core.families, SPEC §5b)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from megacpp_core import families


def test_registry_matches_the_spec_table():
    assert [(f.name, f.phase, f.row_length) for f in families.FAMILIES] == [
        ("p1_simple", 1, 4096), ("p1_docrich", 1, 4096), ("p2_file", 2, 16384),
        ("p3_repo", 3, 65536), ("p4_structure", 4, 65536)]
    assert set(families.BY_NAME) == {f.name for f in families.FAMILIES}


def test_doc_comment_share_counts_doxygen_comments_only():
    texts = [
        "/** Adds. */\nint add(int a, int b);",           # 12 of 35 bytes
        "// plain comment\nint x;",                         # not a doc comment
        "/*! qt style */ int y; /// trailing\n",
        "",
        "int z; /**/",                                      # an empty block is not a doc comment
        "/// \udcff lone surrogate\nint w;",
    ]
    s = families.doc_comment_share(texts)
    assert s[0] == pytest.approx(len("/** Adds. */") / len(texts[0].encode()))
    assert s[1] == 0.0 and s[3] == 0.0 and s[4] == 0.0
    assert 0 < s[2] < 1 and 0 < s[5] < 1
    arrow = pa.chunked_array([texts[:2], texts[2:5]])  # arrow holds no lone surrogate
    assert np.array_equal(s[:5], families.doc_comment_share(arrow))


def test_phase1_split_puts_every_chunk_in_exactly_one_family():
    texts = ["/** " + "d" * k + " */\n" + "int f();\n" * (20 - k) for k in range(20)] + [None]
    t = pa.table({"doc_key": [f"k{i}" for i in range(len(texts))], "text": pa.array(texts, pa.large_string())})
    out = families.split_phase1(t, 0.3)
    a, b = out["p1_simple"].column("doc_key").to_pylist(), out["p1_docrich"].column("doc_key").to_pylist()
    assert a and b and not set(a) & set(b) and sorted(a + b) == sorted(t.column("doc_key").to_pylist())
    assert a == sorted(a, key=lambda k: int(k[1:])) and b == sorted(b, key=lambda k: int(k[1:]))
    assert all(families.doc_comment_share([x])[0] >= 0.3 for x in out["p1_docrich"].column("text").to_pylist())
    with pytest.raises(ValueError):
        families.split_phase1(t, 0.0)
    with pytest.raises(KeyError):
        families.split_phase1(t.drop_columns(["text"]))


def test_phase1_families_are_both_non_empty_on_real_chunks(tiny_run):
    from megacpp_core.layout import SnapshotLayout
    root, _ = tiny_run
    chunks = SnapshotLayout(root, "tiny").documents("chunks", ["doc_key", "text"])
    out = families.split_phase1(chunks)
    assert out["p1_simple"].num_rows and out["p1_docrich"].num_rows
    assert out["p1_simple"].num_rows + out["p1_docrich"].num_rows == chunks.num_rows
