"""The document-level Megatron export on whole arrays (SPEC §7): FIM's id moves, the
decoded texts and the spliced text column equal the per-document path they replace, and
the format stage writes the bytes that path wrote."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from megacpp_core import fim, kept, megatron_export, pack, pack_inputs
from megacpp_core import tokenizer as tk
from megacpp_core.megatron import write_indexed_dataset
from megacpp_core.tables import ParquetStream


def random_documents(rng: np.random.Generator, n: int) -> tuple[list[np.ndarray], list[str]]:
    """``n`` BOS-led uint32 documents of 1..300 tokens (some BOS alone) and their keys."""
    docs = [np.concatenate([[tk.BOS_ID], rng.integers(64, 5000, rng.integers(0, 300))]).astype(np.uint32) for _ in range(n)]
    return docs, [f"src/f{rng.integers(1 << 30)}.cc#{i}" for i in range(n)]


@pytest.mark.parametrize("cfg,row_length", [
    (fim.FimConfig(), 8192),
    (fim.FimConfig(rate=1.0, spm_share=0.3, seed=3), 8192),
    (fim.FimConfig(rate=1.0, spm_share=0.7, seed=4), 150),  # the longer documents are too long for the markers
    (fim.FimConfig(rate=0.0), 8192),
])
def test_permute_ids_equals_apply_fim_per_document(cfg, row_length):
    docs, keys = random_documents(np.random.default_rng(7), 400)
    flat = np.concatenate(docs)
    ids, lengths, drawn = fim.permute_ids(flat, np.array([d.size for d in docs], np.int32), keys, cfg, row_length)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    assert starts[-1] == ids.size
    modes = []
    for i, (doc, key) in enumerate(zip(docs, keys)):
        r = fim.apply_fim(pack.PackInput(doc, key, "src", "r", "f.cc", 0), cfg, row_length)
        assert np.array_equal(ids[starts[i]:starts[i + 1]], r.doc.ids), i
        assert drawn[i] == (r.mode != "none")
        modes.append(r.mode)
    if cfg.rate == 1.0:
        assert {"psm", "spm"} <= set(modes)
    if row_length == 150:
        assert "none" in modes


def test_splice_texts_matches_replace_with_mask():
    rng = np.random.default_rng(1)
    words = ["", "a", "int x;", "ü€😀", "long " * 30]
    for n in (1, 2, 9, 40):
        for pattern in ("random", "none", "all", "alternate"):
            drawn = {"random": rng.random(n) < 0.5, "none": np.zeros(n, bool), "all": np.ones(n, bool),
                     "alternate": np.arange(n) % 2 == 0}[pattern]
            texts = pa.array(["x"] * 3 + [words[k] for k in rng.integers(0, len(words), n)], pa.string()).slice(3)
            repl = pa.array([f"<{words[k]}>" for k in rng.integers(0, len(words), int(drawn.sum()))], pa.large_string())
            got = megatron_export.splice_texts(texts, drawn, repl)
            got.validate(full=True)
            want = pc.replace_with_mask(pc.cast(texts, pa.large_string()), pa.array(drawn), repl)
            assert got.to_pylist() == want.to_pylist(), (n, pattern)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_run):
    from megacpp_core.layout import SnapshotLayout

    root, _ = tiny_run
    lay = SnapshotLayout(root, "tiny")
    path = lay.stage_dir("tokenizer") / "tokenizer.json"
    return lay, tk.load_tokenizer(path), tk.tokenizer_sha256(path)


def test_decoded_texts_equal_the_tokenizers_decode(tiny_tokenizer):
    lay, tok, sha = tiny_tokenizer
    docs = lay.documents("tokenized", columns=["doc_key", "input_ids"])
    cfg = fim.FimConfig(rate=1.0, seed=11)
    seqs = [fim.apply_fim(pack.PackInput(np.asarray(x, np.uint32), k, "s", "r", "p", 0), cfg, 1 << 20).doc.ids
            for x, k in zip(docs.column("input_ids").to_pylist()[:40], docs.column("doc_key").to_pylist())]
    seqs.append(np.array([tk.BOS_ID], np.uint32))  # BOS alone: the empty text

    def check(batch):
        got = megatron_export.decoded_texts(np.concatenate(batch), np.array([len(q) for q in batch]), tok, sha)
        assert got.type == pa.large_string()
        assert got.to_pylist() == [tk.decode(tok, q[1:]) for q in batch]

    check(seqs)  # valid UTF-8: the arrow fast path
    table = fim.token_byte_table(tok)
    lead = table.index(b"\xe2")  # the first byte of a three-byte character, alone: not UTF-8
    broken = np.array([tk.BOS_ID, lead, *seqs[0][1:8]], np.uint32)
    assert "\ufffd" in tk.decode(tok, broken[1:])
    check([seqs[1], broken, seqs[2]])  # the tokenizer's own lossy decode for every document
    with pytest.raises(ValueError, match="out of range"):
        megatron_export.decoded_texts(np.array([tk.BOS_ID, len(table)], np.uint32), np.array([2]), tok, sha)


def reference_export(lay, manifest, tok, sha, vocab_size, out):
    """The per-document export this module replaced: each shard's documents as pack
    inputs after :func:`megacpp_core.fim.apply_fim`, a FIM document's text decoded by the
    tokenizer, written one document at a time."""
    import pyarrow.parquet as pq

    order = {s.name: i for i, s in enumerate(manifest.sources)}
    drops = pq.read_table(lay.stage_dir("documents") / "chunk_drops.parquet").column("doc_key").combine_chunks()
    columns, _ = pack_inputs.columns_to_read([])
    seqs = []
    schema = pa.schema([("doc_key", pa.string()), ("text", pa.large_string())])
    with ParquetStream(out / "ref.documents.parquet", schema) as docs_out:
        refs = sorted(lay._shard_refs("tokenized"), key=lambda r: (order[r.path.parts[-4]], r.path.parts[-2]))
        for ref in refs:  # the stage's order: manifest order, then shard keys
            docs = kept.read_documents([ref], order, columns, drops)
            if not docs.num_rows:
                continue
            inputs, _, _, raw = pack_inputs.packed_documents(docs, manifest.settings, tok, sha)
            lengths = pc.list_value_length(raw.column("input_ids")).to_pylist()
            texts = [t if len(x.ids) == n else tk.decode(tok, x.ids[1:])
                     for t, x, n in zip(raw.column("text").to_pylist(), inputs, lengths)]
            seqs += [x.ids for x in inputs]
            docs_out.write(pa.table({"doc_key": [x.doc_key for x in inputs], "text": pa.array(texts, pa.large_string())}))
    write_indexed_dataset(out / "ref", seqs, vocab_size, backend="raw")
    return out / "ref"


@pytest.mark.parametrize("fim_settings", [{}, {"fim_rate": 1.0, "fim_spm_share": 0.3, "fim_seed": 5}])
def test_format_stage_writes_the_bytes_of_the_per_document_export(tiny_run, tiny_tokenizer, tmp_path, fim_settings):
    from megacpp_core import stages
    from megacpp_core.layout import SnapshotLayout
    from megacpp_core.manifest import load_manifest

    lay, tok, sha = tiny_tokenizer
    copy = SnapshotLayout(tmp_path / "root", "tiny")
    shutil.copytree(lay.root, copy.root)
    m = load_manifest("tiny")
    m = dataclasses.replace(m, settings=dataclasses.replace(m.settings, **fim_settings))
    res = stages.run("format", copy.data_root, m)
    assert res.checks["verify_gate"][0], res.checks
    ref = reference_export(copy, m, tok, sha, res.figures["vocab_size"], tmp_path)
    got = copy.root / res.figures["prefix"]
    for ext in (".bin", ".idx", ".documents.parquet"):
        assert (got.parent / f"{got.name}{ext}").read_bytes() == (ref.parent / f"{ref.name}{ext}").read_bytes(), ext
    assert res.figures["parts"] == sum(1 for r in copy._shard_refs("tokenized") if r.read(columns=["doc_key"]).num_rows)


def _tiny_documents(lay, count: int = 40):
    """``count`` tiny documents (keep order, with the order columns) and a last one that is
    its BOS alone, as ``(table, flat ids, lengths, texts)``."""
    docs = lay.documents("tokenized", columns=["doc_key", "text", "input_ids"]).slice(0, count)
    bos = pa.table({c: pa.array([{"doc_key": "bos-only#0", "text": "", "input_ids": [tk.BOS_ID]}.get(c, docs.column(c)[0].as_py())],
                                docs.schema.field(c).type) for c in docs.column_names})
    docs = pa.concat_tables([docs, bos])
    col = docs.column("input_ids").combine_chunks()
    offsets = col.offsets.to_numpy()
    flat = col.values.to_numpy()[offsets[0]:offsets[-1]].astype(np.uint32)
    return docs, flat, np.diff(offsets).astype(np.int64), docs.column("text").combine_chunks()


def test_fim_texts_equal_the_ids_bytes_at_every_cut(tiny_tokenizer):
    """The FIM texts cut from the source texts are the texts decoded from the FIM ids
    (:func:`megacpp_core.megatron_export.decoded_texts`), for PSM and SPM, cuts at the
    body's ends (empty pieces, the last document's suffix ending the ids) and a document
    that is its BOS alone; None exactly where those bytes are not UTF-8 (a cut inside a
    character: the caller decodes them) or a text is not its ids' bytes."""
    lay, tok, sha = tiny_tokenizer
    _, flat, lengths, texts = _tiny_documents(lay)
    body = lengths - 1
    rng = np.random.default_rng(5)
    edges = {"random": None, "start": (0, 0), "end": (body, body), "whole middle": (0, body), "no suffix": (body // 2, body)}
    fallbacks = 0
    for trial in range(24):
        kind = list(edges)[trial % len(edges)]
        mode = rng.integers(0, 3, lengths.size).astype(np.int8)
        mode[-2:] = rng.integers(1, 3)  # the last real document and the BOS-only one are drawn
        if edges[kind] is None:
            x, y = rng.integers(0, body + 1), rng.integers(0, body + 1)
            a, b = np.minimum(x, y), np.maximum(x, y)
        else:
            a, b = (np.broadcast_to(v, lengths.shape).astype(np.int64) for v in edges[kind])
        a, b = np.where(mode > 0, a, 0).astype(np.int64), np.where(mode > 0, b, 0).astype(np.int64)
        ids, new_lengths, drawn = fim.apply_cuts(flat, lengths, mode, a, b)
        want = megatron_export.splice_texts(
            texts, drawn, megatron_export.decoded_texts(ids[np.repeat(drawn, new_lengths)], new_lengths[drawn], tok, sha))
        got = megatron_export.fim_texts(texts, flat, lengths, mode, a, b, tok, sha)
        if got is None:
            fallbacks += 1
            assert any("\ufffd" in t for t in want.to_pylist()), (trial, kind)
        else:
            assert got.type == pa.large_string() and got.to_pylist() == want.to_pylist(), (trial, kind)
    assert fallbacks < 24
    # "€" as its three byte tokens, cut inside the character: the pieces are not UTF-8
    table = fim.token_byte_table(tok)
    euro = np.array([tk.BOS_ID, *(table.index(bytes([c])) for c in "€".encode())], np.uint32)
    split = (np.concatenate([flat, euro]), np.append(lengths, euro.size), pa.array(texts.to_pylist() + ["€"], pa.string()))
    mode = np.zeros(lengths.size + 1, np.int8)
    mode[-1] = 1
    cut_a, cut_b = np.zeros(lengths.size + 1, np.int64), np.zeros(lengths.size + 1, np.int64)
    cut_a[-1], cut_b[-1] = 1, 2
    assert megatron_export.fim_texts(split[2], split[0], split[1], mode, cut_a, cut_b, tok, sha) is None
    wrong = pa.array(texts.to_pylist()[:-2] + [texts[-2].as_py() + "x", ""], pa.string())
    mode = np.zeros(lengths.size, np.int8)
    mode[-2] = 1
    assert megatron_export.fim_texts(wrong, flat, lengths, mode, np.zeros_like(lengths), body, tok, sha) is None


def test_export_fails_closed_when_the_writer_thread_fails(tiny_tokenizer, tmp_path, monkeypatch):
    """An error in the writer thread (the documents parquet's append) reaches the caller
    and leaves no pair at the prefix, as an error of the reading thread does."""
    from megacpp_core.manifest import load_manifest

    lay, tok, sha = tiny_tokenizer
    docs = lay.documents("tokenized", columns=megatron_export.COLUMNS + kept.DOCUMENT_ORDER_COLUMNS).slice(0, 30)

    class Ref:
        def __init__(self, table):
            self.table, self.uri = table, "memory"

        def read(self, columns=None):
            return self.table.select(columns)

    refs = [Ref(docs.slice(0, 10)), Ref(docs.slice(10, 10)), Ref(docs.slice(20, 10))]
    settings = load_manifest("tiny").settings
    info = {"sha256": sha, "vocab_size": 131072}
    order = {s.name: i for i, s in enumerate(load_manifest("tiny").sources)}
    schema = pa.schema([("doc_key", pa.string()), ("text", pa.large_string())])
    with ParquetStream(tmp_path / "ok.documents.parquet", schema, release_each_write=False) as out:
        written = megatron_export.document_level(refs, None, order, settings, tok, info, tmp_path, tmp_path / "ok", out)
    assert written["parts"] == 3 and written["sequences"] == 30
    calls = []
    real = ParquetStream.write

    def failing(self, table):
        calls.append(len(table))
        if len(calls) == 2:
            raise OSError("disk full")
        real(self, table)

    monkeypatch.setattr(ParquetStream, "write", failing)
    with pytest.raises(OSError, match="disk full"):
        with ParquetStream(tmp_path / "bad.documents.parquet", schema) as out:
            megatron_export.document_level(refs, None, order, settings, tok, info, tmp_path, tmp_path / "bad", out)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("bad")]
