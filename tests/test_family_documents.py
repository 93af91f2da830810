"""Curriculum family documents and datasets (megacpp_core.family_documents and the
family_chunks, repo_documents and per-family stages, SPEC §5b): cuts by token ids on
hostile text, whole files with their chunk graph, and every family of the real tiny
snapshot packed, exported and verified."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from megacpp_core import families
from megacpp_core import family_documents as fd
from megacpp_core import repo_documents as rd
from megacpp_core.layout import SnapshotLayout

BOS = 2

# A byte-level stand-in tokenizer: id = 256 + byte, so every UTF-8 byte is one token.
_TABLE = [b""] * 256 + [bytes([b]) for b in range(256)]
_ENDS, _INSIDE = fd.token_flags(_TABLE)


def _ids(text: str) -> np.ndarray:
    return np.array([BOS] + [256 + b for b in text.encode("utf-8")], dtype=np.uint32)


def _decode(ids) -> str:
    return bytes(int(i) - 256 for i in ids).decode("utf-8")  # strict: a split character raises


def _doc(text: str, key: str = "r/a.c#0", unit_starts=(), path: str = "a.c", chunk: int = 0, n_chunks: int = 1) -> dict:
    ids = _ids(text)
    return {"doc_key": key, "file_key": f"r/{path}", "source": "r", "revision": "x", "path": path, "language": "c",
            "license_class": "permissive", "chunk_index": chunk, "n_tokens": len(ids), "text": text, "input_ids": ids,
            "n_chunks": n_chunks,
            "chunk_boundaries": [{"start": s, "end": e, "kind": "OTHER", "name": None, "dep_level": 0}
                                 for s, e in zip(unit_starts, list(unit_starts[1:]) + [len(ids)])]}


def _table(rows: list[dict]) -> pa.Table:
    schema = pa.schema(list(fd.BASE_SCHEMA) + [pa.field("n_chunks", pa.int32()),
                                               pa.field("chunk_boundaries", fd.pack.OPTIONAL_TYPES["chunk_boundaries"])])
    return pa.Table.from_pylist(rows, schema=schema)


def test_token_flags_mark_line_ends_and_continuation_bytes():
    assert _ENDS[256 + ord("\n")] and not _ENDS[256 + ord("a")] and not _ENDS[0]
    assert _INSIDE[256 + 0x80] and _INSIDE[256 + 0xBF] and not _INSIDE[256 + 0xC3] and not _INSIDE[256 + ord("a")]


def test_cuts_prefer_unit_starts_then_line_ends_then_the_budget():
    text = "int a;\nint b;\nint c;\n"  # 21 bytes, units at each line
    ids = _ids(text)
    assert fd.cut_positions(ids, [1, 8, 15], _ENDS, _INSIDE, budget=len(ids)) == [1]
    assert fd.cut_positions(ids, [1, 8, 15], _ENDS, _INSIDE, budget=12) == [1, 8, 15]  # units, each piece ≤ 11 tokens
    assert fd.cut_positions(ids, [], _ENDS, _INSIDE, budget=12) == [1, 8, 15]  # no units: after the newlines
    flat = _ids("x" * 25)
    cuts = fd.cut_positions(flat, [], _ENDS, _INSIDE, budget=10)  # neither: at the budget
    assert cuts == [1, 10, 19]
    with pytest.raises(ValueError):
        fd.cut_positions(flat, [], _ENDS, _INSIDE, budget=1)


def test_hard_cuts_never_split_a_character_and_pieces_join_back():
    text = "é€😀" * 40 + "\x00\uffff" + "ü" * 33  # no newline, no unit: every cut is a hard cut
    t = _table([_doc(text)])
    for budget in (5, 6, 7, 64):
        out, figs = fd.phase1_documents(t, budget, _decode, _ENDS, _INSIDE, BOS)
        assert figs == {"split_documents": 1, "pieces": out.num_rows}
        assert "".join(out.column("text").to_pylist()) == text
        for ids, n, key in zip(out.column("input_ids").to_pylist(), out.column("n_tokens").to_pylist(),
                               out.column("doc_key").to_pylist()):
            assert ids[0] == BOS and BOS not in ids[1:] and n == len(ids) <= budget
            assert key.startswith("r/a.c#0" + fd.PIECE_SEP)
        assert out.column("doc_key").to_pylist() == sorted(out.column("doc_key").to_pylist())
    with pytest.raises(fd.FamilyError, match="character boundary"):  # a 4-byte character cannot fit 2 tokens
        fd.phase1_documents(t, 3, _decode, _ENDS, _INSIDE, BOS)


def test_phase1_keeps_fitting_documents_and_a_bad_decoder_fails_closed():
    rows = [_doc("int a;\n", key="r/a.c#0"), _doc("int b;\n" * 10, key="r/b.c#0", path="b.c", unit_starts=(1, 8, 15))]
    out, figs = fd.phase1_documents(_table(rows), 32, _decode, _ENDS, _INSIDE, BOS)
    assert out.column("doc_key").to_pylist()[0] == "r/a.c#0" and figs["split_documents"] == 1
    assert out.schema == fd.BASE_SCHEMA
    with pytest.raises(fd.FamilyError, match="do not join back"):
        fd.phase1_documents(_table(rows), 32, lambda ids: _decode(ids).upper(), _ENDS, _INSIDE, BOS)


def test_file_documents_join_chunks_with_planes_and_the_chunk_graph():
    a, b = _doc("int f();\n", chunk=0, n_chunks=2, unit_starts=(1,)), _doc("int f() { return 1; }\n", key="r/a.c#1", chunk=1,
                                                                             n_chunks=2, unit_starts=(1, 10))
    for r in (a, b):
        r["structure_ids"] = [0] + [3] * (r["n_tokens"] - 1)
        r["call_edges"], r["type_edges"] = ([], []) if r is a else ([{"from": 1, "to": 0}], [])
    schema = pa.schema(list(fd.BASE_SCHEMA) + [pa.field("n_chunks", pa.int32())]
                       + [pa.field(c, fd.pack.OPTIONAL_TYPES[c]) for c in ("structure_ids", "chunk_boundaries",
                                                                             "call_edges", "type_edges")])
    t = pa.Table.from_pylist([b, a], schema=schema)  # any row order
    out, figs = fd.file_documents(t, budget=64, bos_id=BOS)
    assert figs == {"whole_files": 1, "fallback_files": 0} and out.num_rows == 1
    row = out.to_pylist()[0]
    assert row["doc_key"] == "r/a.c#file" and row["text"] == a["text"] + b["text"]
    assert _decode(row["input_ids"][1:]) == row["text"] and row["n_tokens"] == len(row["input_ids"])
    assert len(row["structure_ids"]) == row["n_tokens"] and row["structure_ids"][0] == 0
    starts = [u["start"] for u in row["chunk_boundaries"]]
    assert starts == [1, a["n_tokens"], a["n_tokens"] + 9]  # b's units moved past a's body
    assert row["call_edges"] == [{"from": 2, "to": 1}]  # re-indexed past a's one unit
    over, figs = fd.file_documents(t, budget=20, bos_id=BOS)
    assert figs == {"whole_files": 0, "fallback_files": 1} and over.column("doc_key").to_pylist() == ["r/a.c#0", "r/a.c#1"]
    with pytest.raises(fd.FamilyError, match="chunks"):
        fd.file_documents(t.slice(0, 1), budget=64, bos_id=BOS)


def test_worst_license_is_the_least_permissive():
    assert fd.worst_license(["permissive", "gpl2", "weak_copyleft"]) == "gpl2"
    with pytest.raises(KeyError):
        fd.worst_license(["permissive", "proprietary"])


def test_piece_drops_follow_a_dropped_chunk_into_its_pieces():
    from megacpp_core.stages import families as family_stages

    class Ref:
        def __init__(self, keys):
            self.t = pa.table({"doc_key": pa.array(keys, pa.string())})

        def read(self, columns=None):
            return self.t.select(columns)

    refs = [Ref(["r/a.c#0~000", "r/a.c#0~001", "r/a.c#10~000", "r/a.c#1"]), Ref(["r/b.c#0", "r/b.c#0~x"])]
    got = family_stages.piece_drops(refs, Ref(["r/a.c#0", "r/b.c#0"])).to_pylist()
    assert got == ["r/a.c#0~000", "r/a.c#0~001", "r/b.c#0"]
    assert family_stages.piece_drops(refs, Ref([])).to_pylist() == []


# ---------------------------------------------------------------- the real tiny snapshot

def _families_root(root):
    return SnapshotLayout(root, "tiny").root / "families"


def _rows(root, family: str) -> pa.Table:
    d = _families_root(root) / family / "packed"
    assert (d / "_SUCCESS").exists()
    return pa.concat_tables([pq.read_table(f) for f in sorted(d.glob("*.parquet"))])


@pytest.mark.parametrize("family", [f.name for f in families.FAMILIES])
def test_every_family_is_packed_exported_and_verified(tiny_run, family):
    """Every family of the tiny snapshot: documents, rows of its own length filled by
    best-fit decreasing, every row through the packed verifier, and its Megatron dataset
    through the verify gate and megatron-core's IndexedDataset."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from megacpp_checks import verify
    from megacpp_checks.packed import verify_packed_dir
    root, _ = tiny_run
    f = families.BY_NAME[family]
    figs = SnapshotLayout(root, "tiny").read_figures(family)
    assert figs["docs"] > 0 and figs["rows"] > 0 and figs["row_length"] == f.row_length
    assert figs["fill"] == pytest.approx(figs["tokens"] / (figs["rows"] * f.row_length), abs=1e-6)
    rows = _rows(root, family)
    assert rows.num_rows == figs["rows"]
    assert set(len(x) for x in rows.column("input_ids").to_pylist()) == {f.row_length}
    sentinel = json.loads((_families_root(root) / family / "packed" / "_SUCCESS").read_text())
    assert sentinel["family"] == family and sentinel["row_length"] == f.row_length
    gate = verify_packed_dir(_families_root(root) / family / "packed", out=lambda m: None)
    assert gate.ok, gate.failures
    prefix = _families_root(root) / family / "megatron" / f"tiny_{family}_text_document"
    report = verify.verify_megatron(prefix, out=lambda m: None, require_checksums=True)
    assert report.ok, report.failures
    ds = IndexedDataset(str(prefix))
    assert len(ds) == figs["sequences"] == figs["docs"]
    assert int(sum(ds.sequence_lengths)) == figs["tokens"]


def test_p3_rows_hold_whole_files_one_bos_per_piece(tiny_run):
    """Every committed p3_repo row read back: BOS count == repository pieces in the row,
    and every piece's ids split at the file separator decode to ``path\\n`` + the whole kept
    file; pieces span several files, and a header precedes its includer (lz4)."""
    from megacpp_core import tokenizer as tk
    root, _ = tiny_run
    tok = tk.load_tokenizer(SnapshotLayout(root, "tiny").stage_dir("tokenizer") / "tokenizer.json")
    sep = tok.token_to_id(rd.FILE_SEP)
    kept = SnapshotLayout(root, "tiny").kept_files(["source", "path", "text"])
    files = {(s, p): t for s, p, t in zip(*(kept.column(c).to_pylist() for c in ("source", "path", "text")))}
    docs = pa.concat_tables([pq.read_table(p) for p in sorted(SnapshotLayout(root, "tiny").root.glob(
        "revisions/*/families/p3_repo.parquet"))])
    paths_of = dict(zip(docs.column("doc_key").to_pylist(), docs.column("paths").to_pylist()))
    source_of = dict(zip(docs.column("doc_key").to_pylist(), docs.column("source").to_pylist()))
    seen = set()
    for r in _rows(root, "p3_repo").to_pylist():
        ids = np.array(r["input_ids"], dtype=np.int64)[: r["valid_token_count"]]
        starts = np.flatnonzero(ids == tk.BOS_ID).tolist()
        assert len(starts) == r["num_docs"] == len(r["doc_keys"])
        for key, a, b in zip(r["doc_keys"], starts, starts[1:] + [len(ids)]):
            if paths_of[key] is None:
                continue  # a fallback chunk of a file over the budget
            runs = rd.split_ids(ids[a:b].tolist(), sep)
            assert [tok.decode(x, skip_special_tokens=False) for x in runs] == [
                f"{p}\n{files[(source_of[key], p)]}" for p in paths_of[key]]
            seen |= {(source_of[key], p) for p in paths_of[key]}
    assert seen == set(files)  # every kept file, in exactly one piece (no oversized file in tiny)
    assert max(len(p) for p in paths_of.values() if p) > 1
    lz4 = [p for k, p in paths_of.items() if source_of[k] == "lz4-4.4.5" and p]
    order = [q for piece in lz4 for q in piece]
    assert order.index("lz4libs/lz4.h") < order.index("lz4libs/lz4frame.c")


def test_p2_whole_files_decode_to_the_kept_files(tiny_run):
    """Every ``#file`` document of p2_file decodes to its whole kept file, and every kept
    file is in p2 either whole or as all of its chunks."""
    from megacpp_core import tokenizer as tk
    root, _ = tiny_run
    layout = SnapshotLayout(root, "tiny")
    tok = tk.load_tokenizer(layout.stage_dir("tokenizer") / "tokenizer.json")
    kept = layout.kept_files(["doc_key", "text"])
    files = dict(zip(kept.column("doc_key").to_pylist(), kept.column("text").to_pylist()))
    docs = pa.concat_tables([pq.read_table(p) for p in sorted(layout.root.glob("revisions/*/shards/*/families/p2_file.parquet"))])
    texts: dict[str, list] = {}
    for key, fk, ci, text, ids in zip(*(docs.column(c).to_pylist() for c in ("doc_key", "file_key", "chunk_index", "text",
                                                                               "input_ids"))):
        assert tk.decode(tok, ids[1:]) == text
        texts.setdefault(fk, []).append((ci, text))
    assert {k: "".join(t for _, t in sorted(v)) for k, v in texts.items()} == files
    assert any(k.endswith("#file") for k in docs.column("doc_key").to_pylist())


def _flags_one_by_one(table):
    ends = np.array([bool(b) and b[-1:] == b"\n" for b in table], dtype=bool)
    inside = np.array([bool(b) and (b[0] & 0xC0) == 0x80 for b in table], dtype=bool)
    return ends, inside


@pytest.mark.parametrize("table", [
    [], [b""], [b"", b"", b""], [b"\n", b"", b"\x80a", b"a\n", b"\xc3", b"", b"\xbf\n", b"\n\n"], [b"\x80"],
])
def test_token_flags_on_hostile_byte_tables(table):
    got = fd.token_flags(table)
    want = _flags_one_by_one(table)
    assert all(g.dtype == bool and g.shape == (len(table),) and (g == w).all() for g, w in zip(got, want))


def test_token_flags_of_the_snapshot_tokenizer(tiny_tokenizer):
    from megacpp_core import tokenize

    _, tok, sha = tiny_tokenizer
    table = tokenize.byte_table(tok, sha)[0]
    ends, inside = fd.tokenizer_flags(tok, sha)
    want_ends, want_inside = _flags_one_by_one(table)
    assert (ends == want_ends).all() and (inside == want_inside).all()
    assert ends.sum() > 10 and inside.sum() > 10  # byte-level BPE: newline-ended and continuation-byte tokens
    assert fd.tokenizer_flags(tok, sha)[0] is ends  # once per process and tokenizer
