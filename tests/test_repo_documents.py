"""The phase-3 repository document builder (megacpp_core.repo_documents, SPEC §5b): include
spellings from tree-sitter, their resolution inside a revision, the include-dependency
order, and pieces cut only at file boundaries — on hostile snippets and on the real
files of the tiny snapshot."""

from __future__ import annotations

import collections
import random

import pytest

from megacpp_core import repo_documents as rd
from megacpp_core.layout import SnapshotLayout
from megacpp_core.tokenizer import SPECIAL_TOKENS


def test_file_separator_is_a_special_token():
    assert rd.FILE_SEP in SPECIAL_TOKENS


def test_include_spellings_come_from_directives_only():
    text = (
        '#include "a.h"\n'
        "#include <vector>\n"
        "// #include \"in_comment.h\"\n"
        'const char *s = "#include \\"in_string.h\\"";\n'
        "#if defined(X)\n#  include \"under_if.h\"\n#endif\n"
        "#include FOO_HEADER\n"
        "/* #include <blocked.h> */\n"
        "#include  <sys/types.h>\n"
    )
    assert rd.include_spellings(text, "cpp") == ["a.h", "vector", "under_if.h", "sys/types.h"]
    assert rd.include_spellings(text, "c") == ["a.h", "vector", "under_if.h", "sys/types.h"]
    assert rd.include_spellings("", "header") == []
    assert rd.include_spellings("#include \"\xe9t\xe9.h\"\nint x;\n", "c") == ["\xe9t\xe9.h"]
    with pytest.raises(ValueError, match="unknown language"):
        rd.include_spellings(text, "rust")


def test_resolution_prefers_the_including_directory_then_the_shortest_path():
    paths = ["src/a.c", "src/a.h", "include/a.h", "lib/x/util.h", "util.h", "src/sub/b.c", "src/sub/c.h"]
    spell = {"src/a.c": ["a.h", "util.h", "stdio.h", "a.h", "../src/a.c"],
             "src/sub/b.c": ["../a.h", "c.h", "x/util.h", "sub/c.h"],
             "include/a.h": ["a.h"]}
    got = rd.resolve_includes(paths, spell)
    assert got["src/a.c"] == ["src/a.h", "util.h"]  # same directory first; shortest tail match; no repeats, no self
    assert got["src/sub/b.c"] == ["src/a.h", "src/sub/c.h", "lib/x/util.h"]
    assert got["include/a.h"] == []  # its own name resolves to itself: no self-edge
    assert got["util.h"] == [] and set(got) == set(paths)


def test_order_puts_headers_first_and_breaks_cycles_deterministically():
    includes = {"main.c": ["b.h", "a.h"], "b.h": ["a.h"], "a.h": [], "z.h": [], "x.h": ["y.h"], "y.h": ["x.h"],
                "w.c": ["x.h"]}
    paths = list(includes)
    order = rd.include_order(paths, includes)
    assert order == ["a.h", "b.h", "main.c", "x.h", "y.h", "w.c", "z.h"]  # the x.h <-> y.h cycle as one unit
    for _ in range(5):  # the same order whatever the input order
        random.shuffle(paths)
        assert rd.include_order(paths, includes) == order


def test_pieces_cut_only_at_file_boundaries_within_budget():
    order = ["a", "b", "c", "big", "d", "e"]
    tokens = {"a": 40, "b": 50, "c": 9, "big": 100, "d": 99, "e": 1}
    got = rd.cut_pieces(order, tokens, budget=100)
    assert got.pieces == [["a", "b", "c"], ["d"], ["e"]]
    assert got.oversized == ["big"]  # 100 + BOS > 100: left for the file-level split
    assert got.tokens == [100, 100, 2] and all(t <= 100 for t in got.tokens)
    assert [p for piece in got.pieces for p in piece] == [p for p in order if p not in got.oversized]
    with pytest.raises(ValueError, match="budget"):
        rd.cut_pieces(order, tokens, budget=1)
    assert rd.piece_text(["a/x.h", "y.c"], {"a/x.h": "int x;\n", "y.c": ""}) == (
        f"{rd.FILE_SEP}a/x.h\nint x;\n{rd.FILE_SEP}y.c\n")


def test_real_revisions_order_every_include_before_its_includer_outside_cycles(tiny_run):
    root, _ = tiny_run
    files = _tiny_files(root)
    assert len(files) == 3
    for source, fs in files.items():
        spell = {p: rd.include_spellings(t, lang) for p, (lang, t) in fs.items()}
        inc = rd.resolve_includes(list(fs), spell)
        order = rd.include_order(list(fs), inc)
        assert sorted(order) == sorted(fs)
        pos = {p: i for i, p in enumerate(order)}
        edges = [(q, p) for p, qs in inc.items() for q in qs]
        assert edges, source
        # an include placed after its includer must close a cycle back to it
        for q, p in edges:
            if pos[q] > pos[p]:
                stack, seen = [q], set()
                while stack:
                    x = stack.pop()
                    seen.add(x)
                    stack += [y for y in inc[x] if y not in seen]
                assert p in seen, (source, q, p)
    lz4 = files["lz4-4.4.5"]
    order = rd.include_order(list(lz4), rd.resolve_includes(list(lz4), {p: rd.include_spellings(t, lang)
                                                                          for p, (lang, t) in lz4.items()}))
    assert order.index("lz4libs/lz4.h") < order.index("lz4libs/lz4frame.c")  # a known chain: lz4frame.c includes lz4.h
    pieces = rd.cut_pieces(order, {p: len(rd.piece_text([p], {p: lz4[p][1]})) // 3 for p in order}, budget=20_000)
    assert len(pieces.pieces) >= 2 and any(len(p) > 1 for p in pieces.pieces)  # pieces span several files
    assert [p for piece in pieces.pieces for p in piece] == [p for p in order if p not in set(pieces.oversized)]


def _tiny_files(root):
    kept = SnapshotLayout(root, "tiny").kept_files(["source", "path", "language", "text"])
    files: dict[str, dict[str, tuple[str, str]]] = collections.defaultdict(dict)
    for s, p, lang, text in zip(*(kept.column(c).to_pylist() for c in ("source", "path", "language", "text"))):
        files[s][p] = (lang, text)
    return files


def _tok(root):
    from megacpp_core import tokenizer as tk
    tok = tk.load_tokenizer(SnapshotLayout(root, "tiny").stage_dir("tokenizer") / "tokenizer.json")
    return tok, (lambda strings: [e.ids for e in tok.encode_batch(strings, add_special_tokens=False)])


def test_revision_documents_read_back_to_whole_source_files(tiny_run):
    """Every p3 piece of every tiny revision gives back whole kept files, each once, both
    from its text (split at the header offsets) and from its token ids (split at the
    separator id, decoded); headers precede their includers; every piece fits the budget."""
    from megacpp_core import tokenizer as tk
    root, _ = tiny_run
    tok, encode = _tok(root)
    sep = tok.token_to_id(rd.FILE_SEP)
    budget = 20_000
    for source, fs in sorted(_tiny_files(root).items()):
        docs = rd.revision_documents(source, fs, encode, bos_id=tk.BOS_ID, file_sep_id=sep, budget=budget)
        t = docs.table
        assert t.num_rows >= 1 and t.schema == rd.DOCUMENTS_SCHEMA
        seen = []
        for row in t.to_pylist():
            assert row["doc_key"] == f"{source}/@p3/{row['piece_index']:05d}"
            parts = rd.split_piece(row["text"], row["paths"], row["offsets"])
            assert [p for p, _ in parts] == row["paths"] and row["n_files"] == len(parts)
            for p, text in parts:
                assert text == fs[p][1], (source, p)  # no piece cuts a file in the middle
            runs = rd.split_ids(row["input_ids"], sep)
            assert [tok.decode(r, skip_special_tokens=False) for r in runs] == [f"{p}\n{fs[p][1]}" for p in row["paths"]]
            assert row["input_ids"].count(tk.BOS_ID) == 1 and row["input_ids"][0] == tk.BOS_ID
            assert row["n_tokens"] == len(row["input_ids"]) <= budget
            seen += row["paths"]
        assert sorted(seen + docs.oversized) == sorted(fs) and len(set(seen)) == len(seen)
        assert docs.figures["files"] == len(fs) and docs.figures["pieces"] == t.num_rows
        if source == "lz4-4.4.5":
            assert seen.index("lz4libs/lz4.h") < seen.index("lz4libs/lz4frame.c")
            assert any(n > 1 for n in t.column("n_files").to_pylist())  # pieces span several files
    lz4 = _tiny_files(root)["lz4-4.4.5"]
    one, two = (rd.revision_documents("lz4-4.4.5", lz4, encode, bos_id=tk.BOS_ID, file_sep_id=sep, budget=budget)
                for _ in range(2))
    assert one.table.equals(two.table)


def _chars(strings):
    return [[ord(c) + 100 for c in x] for x in strings]


def test_a_file_holding_the_separator_still_reads_back_exactly():
    files = {
        "a.h": ("header", "#pragma once\nint a;\n"),
        "b.c": ("c", '#include "a.h"\nconst char *s = "<FILE_SEP>a.h\\n";\n/* <FILE_SEP>x.c\n */\n'),
        "c.c": ("c", "<FILE_SEP>b.c\n" * 3),
    }
    docs = rd.revision_documents("r", files, _chars, bos_id=2, file_sep_id=7, budget=10_000)
    (row,) = docs.table.to_pylist()
    assert row["paths"] == ["a.h", "b.c", "c.c"]
    assert dict(rd.split_piece(row["text"], row["paths"], row["offsets"])) == {p: t for p, (_, t) in files.items()}
    assert row["input_ids"].count(7) == 3  # the separator only by id, never from the text
    assert rd.split_ids(row["input_ids"], 7) == _chars([f"{p}\n{t}" for p, (_, t) in files.items()])
    with pytest.raises(ValueError, match="no header"):
        rd.split_piece(row["text"], row["paths"], [0, 3, row["offsets"][2]])
    with pytest.raises(ValueError):
        rd.split_ids(row["input_ids"][1:], 7)


def test_an_oversized_file_is_set_apart_and_an_empty_revision_has_no_piece():
    files = {"big.c": ("c", "x" * 500), "small.h": ("header", "int s;\n")}
    docs = rd.revision_documents("r", files, _chars, bos_id=2, file_sep_id=7, budget=100)
    assert docs.oversized == ["big.c"] and docs.table.column("paths").to_pylist() == [["small.h"]]
    empty = rd.revision_documents("r", {}, _chars, bos_id=2, file_sep_id=7)
    assert empty.table.num_rows == 0 and empty.oversized == [] and empty.figures["files"] == 0


def _attention(q, k, v, segment_ids, lo: int, hi: int, keys_from: int = 0):
    """Causal attention outputs of queries ``lo … hi − 1`` over keys ``keys_from … hi − 1``
    with the loader's document mask for those query rows."""
    import torch

    from megacpp_core import loader
    mask = loader.document_attention_mask(segment_ids, slice(lo, hi))[:, keys_from:hi]
    scores = (q[lo:hi] @ k[keys_from:hi].T) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v[keys_from:hi]


def test_a_p3_row_attends_within_each_repository_piece(tiny_run):
    """A committed p3_repo row of the tiny snapshot (``families/p3_repo/packed``, the
    family stage's output) holding several repository pieces: with the loader's document
    mask, each piece's attention output in the row equals that of the piece alone (the
    rows' read-back against the kept files is tests/test_family_documents.py)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from megacpp_core import loader
    root, _ = tiny_run
    tok, _ = _tok(root)
    packed = SnapshotLayout(root, "tiny").root / "families" / "p3_repo" / "packed"
    rows = pa.concat_tables([pq.read_table(f) for f in sorted(packed.glob("*.parquet"))])
    assert set(len(x) for x in rows.column("input_ids").to_pylist()) == {rd.P3_BUDGET}
    best = max(range(rows.num_rows), key=lambda i: rows.column("num_docs")[i].as_py())
    r = rows.slice(best, 1).to_pylist()[0]
    assert r["num_docs"] >= 2, "no p3 row holds two pieces"
    ids = np.array(r["input_ids"], dtype=np.int64)
    views = loader.derived_views(ids, r["valid_token_count"])
    seg = torch.from_numpy(views["segment_ids"])
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(tok.get_vocab_size(), 8, generator=g)
    wq, wk, wv = (torch.randn(8, 8, generator=g) for _ in range(3))
    x = emb[torch.from_numpy(ids)]
    q, k, v = x @ wq, x @ wk, x @ wv
    cu = views["cu_seqlens"].tolist()
    window = 1024  # the queries at each end of a piece; keys reach this far into the piece before it
    for d, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        if d >= r["num_docs"]:
            break  # the PAD tail
        alone_seg = torch.zeros(b - a, dtype=torch.int32)
        for lo, hi in {(a, min(b, a + window)), (max(a, b - window), b)}:
            in_row = _attention(q, k, v, seg, lo, hi, keys_from=max(0, a - window))
            alone = _attention(q[a:b], k[a:b], v[a:b], alone_seg, lo - a, hi - a)
            assert torch.allclose(in_row, alone, atol=1e-5), f"piece {d} of row {best} attends outside itself"
