"""Stage 8 alignment of the enrichment columns (megacpp_core.tokenize.align_document) and the
schemas of the enriched document tables, on the real ``tiny`` snapshot and on hostile input."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from megacpp_checks.schemas import documents as schema
from megacpp_core import chunk, pack, tokenize
from megacpp_core import tokenizer as tk
from megacpp_core.layout import SnapshotLayout


@pytest.fixture(scope="module")
def snap(tiny_run):
    root, _ = tiny_run
    layout = SnapshotLayout(root, "tiny")
    tok = tk.load_tokenizer(layout.stage_dir("tokenizer") / "tokenizer.json")
    table, lengths = tokenize.byte_table(tok)
    return {
        "layout": layout, "tok": tok, "table": table, "lengths": lengths,
        "chunks": layout.documents("chunks"),
        "tokenized": layout.documents("tokenized"),
    }


def test_every_plane_has_one_value_per_token_on_real_documents(snap):
    t = snap["tokenized"]
    n = t.column("n_tokens").to_numpy()
    for col in (*pack.PLANES, "token_char_start", "token_char_end", "input_ids"):
        lengths = pc.list_value_length(t.column(col)).to_numpy()
        assert (lengths == n).all(), col
    ok, detail = schema.validate_tokenized(t, tk.BOS_ID)
    assert ok, detail
    ok, detail = schema.validate_documents(snap["chunks"])
    assert ok, detail
    assert not any(c.startswith("char_") for c in t.column_names)  # character planes stay in stage 6


def test_spans_and_samples_recomputed_independently(snap):
    t = snap["tokenized"].to_pydict()
    chunks = snap["chunks"]
    by_key = {k: i for i, k in enumerate(chunks.column("doc_key").to_pylist())}
    char_structure = chunks.column("char_structure").to_pylist()
    table = snap["table"]
    checked = 0
    for i in range(0, len(t["doc_key"]), 7):  # every 7th document, all tokens
        text, ids = t["text"][i], t["input_ids"][i]
        cs, ce = t["token_char_start"][i], t["token_char_end"][i]
        assert (cs[0], ce[0]) == (0, 0) and ids[0] == tk.BOS_ID
        pieces = b"".join(table[x] for x in ids[1:])
        assert pieces == text.encode("utf-8", "surrogatepass")
        # the spans cover the text in order; neighbours abut or share one split character
        assert cs[1] == 0 and ce[-1] == len(text)
        for a in range(1, len(ids) - 1):
            assert cs[a + 1] in (ce[a], ce[a] - 1)
        plane = char_structure[by_key[t["doc_key"][i]]]
        assert t["structure_ids"][i][0] == 0
        assert t["structure_ids"][i][1:] == [plane[c] for c in cs[1:]]  # first character of each token
        checked += 1
    assert checked > 20


def test_chunk_boundaries_and_edges_are_token_positions(snap):
    t = snap["tokenized"].to_pydict()
    with_edges = 0
    for i in range(len(t["doc_key"])):
        n = t["n_tokens"][i]
        cb = t["chunk_boundaries"][i]
        assert all(1 <= c["start"] < c["end"] <= n for c in cb)
        assert all(a["end"] <= b["start"] for a, b in zip(cb, cb[1:]))
        dep = np.asarray(t["dep_levels"][i])
        for c in cb:
            assert (dep[c["start"]:c["end"]] == min(c["dep_level"], 254) + 1).all()
        for e in t["call_edges"][i] + t["type_edges"][i]:
            assert 0 <= e["from"] < len(cb) and 0 <= e["to"] < len(cb) and e["from"] != e["to"]
        with_edges += bool(t["call_edges"][i])
        assert len(t["platform_ids"][i]) <= 20
    assert with_edges > 10


def _doc(snap, i=3):
    t = snap["tokenized"]
    row = {c: t.column(c)[i].as_py() for c in ("doc_key", "text", "input_ids")}
    ch = snap["chunks"]
    j = ch.column("doc_key").to_pylist().index(row["doc_key"])
    row["planes"] = {c: ch.column(c)[j].as_py() for c in tokenize.CHAR_PLANES}
    row["chunks"] = ch.column("char_chunk_boundaries")[j].as_py()
    row["calls"] = ch.column("call_edges")[j].as_py()
    row["types"] = ch.column("type_edges")[j].as_py()
    return row


def _table(snap, form: str):
    """The byte table as ``token_char_spans`` takes it: a ``list[bytes]`` or one arrow array."""
    return snap["table"] if form == "list" else tokenize.byte_array(snap["tok"])


@pytest.mark.parametrize("form", ["list", "arrow"])
def test_alignment_fails_closed(snap, form):
    d = _doc(snap)
    ids = np.asarray(d["input_ids"], dtype=np.uint32)
    table = _table(snap, form)
    spans = tokenize.token_char_spans(d["text"], ids, table, snap["lengths"], d["doc_key"])
    out = tokenize.align_document(d["text"], ids, spans, d["planes"], d["chunks"], d["calls"], d["types"], d["doc_key"])
    assert all(len(out[p]) == len(ids) for p in pack.PLANES)
    with pytest.raises(tokenize.AlignmentError, match="cover"):  # a token missing
        tokenize.token_char_spans(d["text"], ids[:-1], table, snap["lengths"], d["doc_key"])
    swapped = ids.copy()
    swapped[[1, 2]] = swapped[[2, 1]]
    assert swapped[1] != ids[1]
    with pytest.raises(tokenize.AlignmentError, match="spell"):  # same bytes count, wrong text
        tokenize.token_char_spans(d["text"], swapped, table, snap["lengths"], d["doc_key"])
    last = ids.copy()  # the last token replaced by another of the same byte width
    widths = snap["lengths"]
    last[-1] = np.flatnonzero((widths == widths[last[-1]]) & (np.arange(len(widths)) != last[-1]))[0]
    with pytest.raises(tokenize.AlignmentError, match="spell"):
        tokenize.token_char_spans(d["text"], last, table, snap["lengths"], d["doc_key"])
    short = dict(d["planes"], char_structure=d["planes"]["char_structure"][:-1])
    with pytest.raises(tokenize.AlignmentError, match="char_structure"):
        tokenize.align_document(d["text"], ids, spans, short, d["chunks"], d["calls"], d["types"], d["doc_key"])
    bad_chunk = [{**d["chunks"][0], "end": len(d["text"]) + 5}]
    with pytest.raises(tokenize.AlignmentError, match="outside"):
        tokenize.align_document(d["text"], ids, spans, d["planes"], bad_chunk, [], [], d["doc_key"])
    with pytest.raises(tokenize.AlignmentError, match="outside"):
        tokenize.align_document(d["text"], ids, spans, d["planes"], d["chunks"], [{"from": 0, "to": 999}], [], d["doc_key"])


@pytest.mark.parametrize("form", ["list", "arrow"])
def test_non_ascii_and_split_characters(snap, form):
    tok = snap["tok"]
    text = "// naïve ✓ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢\nint f() { return 1; }  // 日本語\n"
    ids = np.concatenate([[tk.BOS_ID], tk.encode(tok, text)]).astype(np.uint32)
    cs, ce = tokenize.token_char_spans(text, ids, _table(snap, form), snap["lengths"])
    assert cs[1] == 0 and ce[-1] == len(text)
    assert all(cs[a + 1] in (ce[a], ce[a] - 1) for a in range(1, len(ids) - 1))
    for a in range(1, len(ids)):  # every token's bytes lie inside its character span
        assert snap["table"][ids[a]] in text[cs[a]:ce[a]].encode("utf-8")


def test_schemas_catch_corruption(snap):
    t = snap["tokenized"]
    i = t.column_names.index("ast_depth")
    vals = t.column("ast_depth").to_pylist()
    vals[0] = vals[0][:-1]  # one value short in the first row
    bad = t.set_column(i, "ast_depth", pa.array(vals, type=pa.list_(pa.uint8())))
    ok, detail = schema.validate_tokenized(bad, tk.BOS_ID)
    assert not ok and "planes_per_token" in detail
    vals = t.column("token_char_end").to_pylist()
    vals[1][5] += 3  # a gap between two tokens
    bad = t.set_column(t.column_names.index("token_char_end"), "token_char_end", pa.array(vals, type=pa.list_(pa.int32())))
    ok, detail = schema.validate_tokenized(bad, tk.BOS_ID)
    assert not ok and "spans_cover_text" in detail
    c = snap["chunks"]
    buckets = c.column("bucket").to_pylist()
    n = c.column("n_text_tokens").to_pylist()
    j = max(range(len(n)), key=n.__getitem__)
    buckets[j] = 4096 if n[j] >= 4096 else buckets[j]
    if n[j] >= 4096:
        bad = c.set_column(c.column_names.index("bucket"), "bucket", pa.array(buckets, type=pa.int32()))
        ok, detail = schema.validate_documents(bad)
        assert not ok and "bucket" in detail
    edges = c.column("call_edges").to_pylist()
    edges[0] = [{"from": 0, "to": 10_000}]
    bad = c.set_column(c.column_names.index("call_edges"), "call_edges", pa.array(edges, type=pa.list_(pack.EDGE_TYPE)))
    ok, detail = schema.validate_documents(bad)
    assert not ok and "edges_in_range" in detail


def test_documents_within_buckets_on_real_input(snap):
    c = snap["chunks"]
    n = c.column("n_text_tokens").to_numpy()
    b = c.column("bucket").to_numpy()
    assert (n + 1 <= b).all()
    assert set(b.tolist()) <= set(chunk.BUCKETS)
    for bucket, count in zip(*np.unique(b, return_counts=True)):  # the smallest bucket that holds it
        smaller = [x for x in chunk.BUCKETS if x < bucket]
        if smaller:
            assert (n[b == bucket] + 1 > smaller[-1]).all()
