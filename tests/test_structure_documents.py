"""The phase-4 ``p4_structure`` documents (megacpp_core.structure_documents and the
structure_documents stage, SPEC §5b): repository pieces with every enrichment plane and
the chunk graph aligned to their own tokens — on hostile snippets with a byte-level
stand-in tokenizer, and on the real tiny snapshot down to its packed rows and the loader."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from megacpp_checks.schemas import documents as s_documents
from megacpp_core import enrich, family_documents, pack, pack_inputs, tokenize
from megacpp_core import repo_documents as rd
from megacpp_core import structure_documents as sd
from megacpp_core.layout import SnapshotLayout

BOS, SEP = 2, 27
# id = 256 + byte; the separator spells its text, as the real tokenizer's added token does
_TABLE = [b""] * 256 + [bytes([b]) for b in range(256)]
_TABLE[BOS], _TABLE[SEP] = b"<BOS>", rd.FILE_SEP.encode()
_LENGTHS = np.asarray([len(b) for b in _TABLE], dtype=np.int64)

HEADER = "struct Point { int x; int y; };\n/* é€😀 */\nint area(struct Point p);\n"
SOURCE = ('#include "geo.h"\n\nstatic int helper(int v) { return v * 2; }\n\n'
          "int area(struct Point p) {\n  return helper(p.x) * p.y; // naïve\n}\n")
FILES = {"geo.h": ("header", HEADER), "geo.c": ("c", SOURCE)}


def _encode(strings):
    return [[256 + b for b in s.encode("utf-8", "surrogatepass")] for s in strings]


def _p3(files=FILES, budget=65_536):
    docs = rd.revision_documents("r", files, _encode, bos_id=BOS, file_sep_id=SEP, budget=budget)
    meta = pa.table({"path": list(files), "license_class": ["permissive"] * len(files)})
    return family_documents.repo_family_table(docs.table, meta, "rev"), docs


def _units(path):
    lang, text = FILES[path]
    return enrich.enrich_file(text, lang).units


def _decode(ids) -> str:
    return b"".join(_TABLE[int(i)] for i in ids).decode("utf-8", "surrogatepass")


def _chars(ids) -> np.ndarray:
    """The character index of each byte token of a text's ids."""
    return np.cumsum([(_TABLE[int(t)][0] & 0xC0) != 0x80 for t in ids]) - 1


def test_a_piece_gets_planes_per_token_and_its_files_whole_unit_lists():
    p3, _ = _p3()
    assert p3.num_rows == 1 and p3.column("paths").to_pylist() == [["geo.h", "geo.c"]]  # the header first
    out, figs = sd.structure_table(p3, {p: lang for p, (lang, _) in FILES.items()}, {}, {}, None, _TABLE, _LENGTHS, SEP)
    row = out.to_pylist()[0]
    n = row["n_tokens"]
    assert out.column("input_ids").equals(p3.column("input_ids")) and out.column_names[:len(p3.column_names)] == p3.column_names
    for p in pack.PLANES:
        assert len(row[p]) == n and row[p][0] == 0
    ids = np.asarray(row["input_ids"])
    seps = np.flatnonzero(ids == SEP).tolist()
    assert len(seps) == 2
    # header tokens (the separator, the path, the newline) carry no structure and no chunk
    for s, path in zip(seps, ("geo.h", "geo.c")):
        head = range(s, s + 1 + len(path) + 1)
        assert all(row["structure_ids"][t] == 0 and row["dep_levels"][t] == 0 for t in head)
    # each file's chunks are its units, in order, and decode to the units' texts
    chunks = row["chunk_boundaries"]
    want = [(path, FILES[path][1][u.start:u.end]) for path in ("geo.h", "geo.c") for u in _units(path)]
    assert [_decode(ids[c["start"]:c["end"]]) for c in chunks] == [t for _, t in want]
    assert figs["chunks"] == len(chunks) and figs["chunks_without_tokens"] == 0
    # structure at each file token = the file's per-character plane at the token's character
    for s, (path, (lang, text)) in zip(seps, (("geo.h", FILES["geo.h"]), ("geo.c", FILES["geo.c"]))):
        fe = enrich.enrich_file(text, lang)
        start = s + 1 + len(path) + 1
        body = ids[start:start + len(text.encode())]
        assert np.array_equal(np.asarray(row["structure_ids"][start:start + len(body)]), fe.structure[_chars(body)])
    # tree-sitter's intra-file call edge: area -> helper, inside geo.c; nothing crosses files without the lane
    names = [c["name"] for c in chunks]
    area_c = max(i for i, x in enumerate(names) if x == "area")
    assert {"from": area_c, "to": names.index("helper")} in row["call_edges"]
    assert figs["cross_file_call_edges"] == figs["cross_file_type_edges"] == 0
    assert len(row["platform_ids"]) <= 20
    ok, detail = s_documents.family_validator(65_536)(out)
    assert ok, detail


def test_lane_cross_file_edges_join_the_piece_graph_and_its_dep_levels():
    p3, _ = _p3()
    h, c = _units("geo.h"), _units("geo.c")
    area_c = max(i for i, u in enumerate(c) if u.name == "area")
    point_h = next(i for i, u in enumerate(h) if u.kind == "CLASS_DECL")
    proto_h = max(i for i, u in enumerate(h) if u.name == "area")
    lane = sd.lane_from_tables(
        pa.table({"kind": ["call", "type", "include", "call", "call"],
                  "from_file": ["geo.c", "geo.c", "geo.c", "geo.c", "geo.c"],
                  "to_file": ["geo.h", "geo.h", "geo.h", "other.c", "geo.c"],
                  "from_chunk": pa.array([area_c, area_c, None, area_c, area_c], pa.int32()),
                  "to_chunk": pa.array([proto_h, point_h, None, 0, 0], pa.int32())}),
        pa.table({"file": ["geo.c"], "status": ["ok"]}))
    assert lane.cross == [("call", "geo.c", area_c, "geo.h", proto_h), ("call", "geo.c", area_c, "other.c", 0),
                          ("type", "geo.c", area_c, "geo.h", point_h)]
    assert lane.intra == {"geo.c": {"call": {(area_c, 0)}, "type": set()}}
    langs = {p: lang for p, (lang, _) in FILES.items()}
    out, figs = sd.structure_table(p3, langs, {}, {}, lane, _TABLE, _LENGTHS, SEP)
    row = out.to_pylist()[0]
    nh = len(h)
    assert {"from": nh + area_c, "to": proto_h} in row["call_edges"]
    assert {"from": nh + area_c, "to": point_h} in row["type_edges"]
    assert figs["cross_file_call_edges"] == figs["cross_file_type_edges"] == 1
    # the lane's intra-file edges replaced tree-sitter's in geo.c (area -> helper is gone, area -> unit 0 is there)
    assert {"from": nh + area_c, "to": nh} in row["call_edges"]
    levels = [x["dep_level"] for x in row["chunk_boundaries"]]
    assert levels[nh + area_c] == 0 and levels[proto_h] == levels[point_h] == 1
    assert row["dep_levels"][row["chunk_boundaries"][proto_h]["start"]] == 2  # dep_level + 1 on its tokens


def test_a_fallback_chunk_is_enriched_over_its_span_of_the_file():
    text = FILES["geo.c"][1]
    a = text.index("int area")
    ids = np.asarray([BOS] + _encode([text[a:]])[0], dtype=np.uint32)
    row = {c: None for c in family_documents.BASE_COLUMNS}
    row.update(doc_key="r/geo.c#1", file_key="r/geo.c", source="r", revision="rev", path="geo.c", language="c",
               license_class="permissive", chunk_index=1, n_tokens=len(ids), text=text[a:], input_ids=ids)
    schema = pa.schema(list(family_documents.BASE_SCHEMA) + [pa.field("paths", pa.list_(pa.string())),
                                                             pa.field("offsets", pa.list_(pa.int64())),
                                                             pa.field("n_files", pa.int32())])
    p3 = pa.Table.from_pylist([{**row, "paths": None, "offsets": None, "n_files": None}], schema=schema)
    out, _ = sd.structure_table(p3, {"geo.c": "c"}, {"r/geo.c#1": (a, len(text))}, {"geo.c": text}, None, _TABLE,
                                _LENGTHS, SEP)
    got = out.to_pylist()[0]
    fe = enrich.enrich_file(text, "c")
    assert np.array_equal(np.asarray(got["structure_ids"][1:]), fe.structure[a:][_chars(ids[1:])])
    assert [_decode(ids[c["start"]:c["end"]]) for c in got["chunk_boundaries"]] == [
        text[max(u.start, a):u.end] for u in fe.units if u.end > a]


def test_hostile_inputs_fail_closed():
    p3, _ = _p3()
    langs = {p: lang for p, (lang, _) in FILES.items()}
    bad = p3.set_column(p3.schema.get_field_index("input_ids"), "input_ids",
                        pa.array([p3.column("input_ids")[0].as_py()[:-1]], pa.list_(pa.uint32())))
    with pytest.raises(tokenize.AlignmentError, match="r/@p3/00000"):
        sd.structure_table(bad, langs, {}, {}, None, _TABLE, _LENGTHS, SEP)
    with pytest.raises(ValueError, match="tile"):
        sd.document_structure(10, [sd.Segment(0, None, length=4), sd.Segment(5, None, length=5)], {})
    with pytest.raises(ValueError, match="outside"):
        fe = enrich.enrich_file(HEADER, "header")
        sd.document_structure(10, [sd.Segment(0, "geo.h", len(HEADER) - 5, len(HEADER) + 5)], {"geo.h": fe})
    with pytest.raises(KeyError):
        sd.structure_table(p3, {"geo.h": "header"}, {}, {}, None, _TABLE, _LENGTHS, SEP)  # no language for geo.c
    ids = [BOS, SEP, 300, 301, SEP, 302]
    assert sd.chunks_inside_files(ids, [{"start": 2, "end": 4}, {"start": 5, "end": 6}], SEP)
    assert not sd.chunks_inside_files(ids, [{"start": 2, "end": 5}], SEP)


# ---------------------------------------------------------------- the real tiny snapshot

def _docs(layout, family):
    return pa.concat_tables([pq.read_table(p) for p in sorted(layout.root.glob(f"revisions/*/families/{family}.parquet"))])


def test_p4_documents_are_the_p3_documents_with_planes_that_agree_with_stage_8(tiny_run):
    """Every p4 document has p3's key and ids; where a piece's token and a stage-8 token
    cover the same characters of the same file (most of them), the four character planes
    agree — two independent alignments of the same per-character planes (``dep_levels``
    follow each document's own graph)."""
    root, _ = tiny_run
    layout = SnapshotLayout(root, "tiny")
    p3, p4 = _docs(layout, "p3_repo"), _docs(layout, "p4_structure")
    assert p4.column("doc_key").equals(p3.column("doc_key")) and p4.column("input_ids").equals(p3.column("input_ids"))
    from megacpp_core import tokenizer as tk
    tok = tk.load_tokenizer(layout.stage_dir("tokenizer") / "tokenizer.json")
    table, lengths = tokenize.byte_table(tok)
    tz = layout.documents("tokenized", ["source", "path", "chunk_index", "token_char_start", "token_char_end", "text",
                                        *pack.PLANES]).to_pylist()
    stage8: dict[tuple, dict] = {}
    at: dict[tuple, int] = {}
    for d in sorted(tz, key=lambda d: (d["source"], d["path"], d["chunk_index"])):
        f = (d["source"], d["path"])
        base = at.get(f, 0)
        for t in range(1, len(d["token_char_start"])):
            stage8.setdefault(f, {})[(base + d["token_char_start"][t], base + d["token_char_end"][t])] = \
                tuple(d[p][t] for p in pack.PLANES)
        at[f] = base + len(d["text"])
    same = total = 0
    for r in p4.to_pylist():
        if r["paths"] is None:
            continue
        cs, ce = tokenize.token_char_spans(r["text"], np.asarray(r["input_ids"]), table, lengths)
        starts = [o + len(rd.FILE_HEADER.format(path=p)) for p, o in zip(r["paths"], r["offsets"])]
        ends = r["offsets"][1:] + [len(r["text"])]
        for p, a, b in zip(r["paths"], starts, ends):
            ref = stage8[(r["source"], p)]
            for t in np.flatnonzero((cs >= a) & (ce <= b)).tolist():
                total += 1
                key = (int(cs[t]) - a, int(ce[t]) - a)
                if key in ref:
                    same += 1
                    assert tuple(r[q][t] for q in pack.PLANES[:1] + pack.PLANES[2:]) == \
                        ref[key][:1] + ref[key][2:], (r["doc_key"], p, t)
    assert total and same / total > 0.9, (same, total)


def test_p4_rows_carry_each_documents_planes_and_graph_at_its_row_positions(tiny_run):
    """Every packed p4 row: each document's planes at its row offset equal the document's,
    its chunk spans are its spans moved by that offset, its edges re-indexed past the
    earlier documents' chunks, its platform labels its own; no chunk holds a file
    separator; the tolerant loader reads every row with every feature enabled."""
    from megacpp_core.loader import FEATURES, PackedRowsDataset

    root, _ = tiny_run
    layout = SnapshotLayout(root, "tiny")
    docs = {r["doc_key"]: r for r in _docs(layout, "p4_structure").to_pylist()}
    d = layout.root / "families" / "p4_structure" / "packed"
    rows = pa.concat_tables([pq.read_table(f) for f in sorted(d.glob("*.parquet"))]).to_pylist()
    seen = set()
    for r in rows:
        ids = np.asarray(r["input_ids"])
        starts = np.flatnonzero(ids[: r["valid_token_count"]] == BOS).tolist()
        nchunk = 0
        for k, (key, a) in enumerate(zip(r["doc_keys"], starts)):
            doc = docs[key]
            n = doc["n_tokens"]
            for p in pack.PLANES:
                assert r[p][a:a + n] == doc[p], (key, p)
            mine = r["chunk_boundaries"][nchunk:nchunk + len(doc["chunk_boundaries"])]
            assert [(c["start"] - a, c["end"] - a) for c in mine] == [(c["start"], c["end"]) for c in doc["chunk_boundaries"]]
            for e in pack.EDGE_COLUMNS:
                moved = [{"from": x["from"] + nchunk, "to": x["to"] + nchunk} for x in doc[e]]
                assert all(x in r[e] for x in moved), (key, e)
            assert r["platform_ids"][k] == doc["platform_ids"]
            nchunk += len(doc["chunk_boundaries"])
            seen.add(key)
        assert nchunk == len(r["chunk_boundaries"])
        assert sd.chunks_inside_files(ids, r["chunk_boundaries"], 27)
    assert seen == set(docs)
    n = 0
    for split in ("train", "validation"):
        ds = PackedRowsDataset(d, split, features=list(FEATURES), full_contract=True)
        for i in range(len(ds)):
            x = ds[i]
            assert x["structure_ids"].shape == (65_536,) and len(x["chunk_boundaries"]) > 0
            n += 1
        assert not any(ds.defaulted.values())
    assert n == len(rows)


def test_the_gate_reads_p4_back_in_batches_and_catches_a_crossing_chunk(tiny_run, tmp_path, monkeypatch):
    """The stage's gate passes on the real tiny documents read back a few at a time, and
    fails on a chunk spanning a whole multi-file piece and on a missing document."""
    import shutil
    from pathlib import Path

    from megacpp_core import catalog
    from megacpp_core.runner import InputRef
    from megacpp_core.stage import Partition
    from megacpp_core.stages import structure_documents as stage
    from megacpp_core.storage import DataRoot

    root, _ = tiny_run
    layout = SnapshotLayout(root, "tiny")
    src = next(p.parent.parent.name for p in sorted(layout.root.glob("revisions/*/families/p3_repo.parquet"))
               if pq.read_table(p, columns=["n_files"]).column("n_files").to_numpy().max(initial=0) > 1)
    part = Partition("tiny", src)
    P3, P4 = catalog.FAMILY_DOCUMENTS["p3_repo"], catalog.FAMILY_DOCUMENTS["p4_structure"]
    data = DataRoot(tmp_path / "root")
    for d in (P3, P4):
        dst = data.local_path(d.key(part))
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(root) / d.key(part), dst)

    class G:
        figures = {"chunks": 0, "cross_file_call_edges": 0, "cross_file_type_edges": 0}

        def input(self, name):
            return InputRef(data, P3, part)

        def output(self, name):
            return InputRef(data, P4, part)

    monkeypatch.setattr(stage, "GATE_BATCH_DOCS", 2)
    ok, detail = stage.same_documents_as_p3(G())
    assert ok, detail
    p4_path = data.local_path(P4.key(part))
    t = pq.read_table(p4_path)
    i = int(np.argmax(t.column("n_files").to_numpy()))  # a piece of several files
    rows = t.to_pylist()
    n = len(rows[i]["input_ids"])
    rows[i]["chunk_boundaries"] = [dict(rows[i]["chunk_boundaries"][0], start=0, end=n)]
    pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), p4_path)
    ok, detail = stage.same_documents_as_p3(G())
    assert not ok and "a chunk crosses a file separator" in detail, detail
    pq.write_table(t.slice(0, t.num_rows - 1), p4_path)
    ok, detail = stage.same_documents_as_p3(G())
    assert not ok and "keys differ" in detail, detail
