"""Whole-file ids handed from chunk to tokenize in one process (``megacpp_core.ids_memo``).

On the real ``tiny`` snapshot: tokenize with the memo filled as the chunk stage fills it
gives exactly the table it gives without, encodes only the documents that are not whole
files, and still checks every decode (a wrong id in the memo fails closed).
"""

from __future__ import annotations


import numpy as np
import pyarrow.parquet as pq
import pytest

from megacpp_core import ids_memo, tokenize
from megacpp_core import tokenizer as tk
from megacpp_core.stages import chunk as chunk_stage


def test_the_memo_holds_one_tokenizers_ids_within_its_limit():
    memo = ids_memo.IdsMemo(max_tokens=5)
    a = np.arange(3, dtype=np.uint32)
    assert not memo.put("sha-a", "x", a)  # nothing begun: no tokenizer
    memo.begin("sha-a")
    assert memo.put("sha-a", "x", a) and not memo.put("sha-b", "y", a)  # another tokenizer
    assert not memo.put("sha-a", "z", np.arange(3, dtype=np.uint32))  # 3 + 3 > 5 tokens
    assert memo.take("sha-b", "x") is None  # another tokenizer's lookup
    assert memo.take("sha-a", "x") is a and memo.take("sha-a", "x") is None  # taken once
    assert memo.put("sha-a", "z", np.arange(5, dtype=np.uint32))  # room again
    memo.begin("sha-a")  # a new shard drops what the last one left
    assert len(memo) == 0 and memo.take("sha-a", "z") is None
    memo.put("sha-a", "x", a)
    memo.clear()
    assert len(memo) == 0 and not memo.put("sha-a", "x", a)


@pytest.fixture(scope="module")
def tiny(tiny_tokenizer):
    lay, tok, sha = tiny_tokenizer
    chunks = sorted((lay.root / "revisions").glob("*/shards/*/chunks.parquet"))
    assert chunks
    return lay, tok, sha, chunks


def _counting_encoder(monkeypatch) -> list[str]:
    seen: list[str] = []
    real = tk.ids_encoder

    def wrapped(tok):
        fast = real(tok)
        return lambda texts, **kw: (seen.extend(texts), fast(texts, **kw))[1]

    monkeypatch.setattr(tk, "ids_encoder", wrapped)
    return seen


def test_tokenize_takes_whole_files_from_the_memo_and_gives_the_same_table(tiny, monkeypatch):
    lay, tok, sha, chunk_files = tiny
    kept = lay.kept_files(["doc_key", "text"]).column("text").to_pylist()
    vocab = tok.get_vocab_size(with_added_tokens=True)
    hits = 0
    for path in chunk_files:
        docs = pq.read_table(path)
        plain, _ = tokenize.tokenize_documents(docs, tok, vocab)
        on_disk = pq.read_table(path.with_name("tokenized.parquet"), columns=["doc_key", "input_ids"])
        assert plain.select(["doc_key", "input_ids"]).equals(on_disk)  # the pipeline's own output
        ids_memo.MEMO.begin(sha)
        for text, ids in zip(kept, tk.encode_batch(tok, kept)):  # as chunk's keep_ids puts them
            ids_memo.MEMO.put(sha, text, ids)
        encoded = _counting_encoder(monkeypatch)
        memo, _ = tokenize.tokenize_documents(docs, tok, vocab, sha256=sha)
        monkeypatch.undo()
        assert memo.equals(plain)
        whole = docs.column("n_chunks").to_pylist()
        assert len(encoded) == sum(n != 1 for n in whole)  # only the split files' chunks are encoded
        hits += sum(n == 1 for n in whole)
        assert len(ids_memo.MEMO) == 0  # emptied at the end
    assert hits > 0


def test_a_wrong_id_in_the_memo_fails_the_round_trip_and_another_tokenizer_is_not_read(tiny):
    lay, tok, sha, chunk_files = tiny
    docs = pq.read_table(chunk_files[0])
    vocab = tok.get_vocab_size(with_added_tokens=True)
    one = next(i for i, n in enumerate(docs.column("n_chunks").to_pylist()) if n == 1)
    text = docs.column("text")[one].as_py()
    ids = tk.encode_batch(tok, [text])[0].copy()
    assert ids.size > 1
    ids[0] = ids[1] + 1 if ids[1] + 1 != ids[0] else ids[1] + 2  # a different token
    ids_memo.MEMO.begin(sha)
    ids_memo.MEMO.put(sha, text, ids)
    with pytest.raises(tokenize.TokenizeError, match="decode"):
        tokenize.tokenize_documents(docs, tok, vocab, sha256=sha)
    assert len(ids_memo.MEMO) == 0
    ids_memo.MEMO.begin("another-tokenizer")
    ids_memo.MEMO.put("another-tokenizer", text, ids)
    plain, _ = tokenize.tokenize_documents(docs, tok, vocab)
    assert tokenize.tokenize_documents(docs, tok, vocab, sha256=sha)[0].equals(plain)


def test_chunk_keeps_every_files_whole_ids_and_the_exact_ids_of_every_document_of_a_split_file(tiny):
    """On real files cut at a small budget (many files split): every file's whole ids and
    every document's ids of a split file, each exactly the tokenizer's encoding of its
    text (the split documents' ids come from the span counter's pieces)."""
    lay, tok, sha, _ = tiny
    kept = lay.kept_files(["doc_key", "text", "language", "source", "path", "archive_sha256", "license_class"])
    d = kept.slice(0, 60).to_pydict()
    got: dict[str, np.ndarray] = {}
    cols, tally = chunk_stage.chunk_rows(d, tok, sha, 1023, False, keep_ids=lambda t, ids: got.setdefault(t, ids))
    split_docs = [t for t, n in zip(cols["text"], cols["n_chunks"]) if n > 1]
    assert tally["split_files"] > 5 and len(split_docs) > 20
    assert set(got) == set(d["text"]) | set(split_docs)
    texts = sorted(got)
    assert all(got[t].dtype == np.uint32 and np.array_equal(got[t], w) for t, w in zip(texts, tk.encode_batch(tok, texts)))


def test_chunk_then_tokenize_in_one_process_encode_nothing_again(tiny_run, tmp_path, monkeypatch):
    """The wiring, as a step runs them: the chunk stage then the tokenize stage of one
    ``tiny`` shard in this process. Tokenize encodes nothing (every document's ids come
    from chunk: whole files, and the documents of split files), run alone it encodes every
    document, and both write the bytes of the session's ``megacpp run``."""
    import shutil

    from megacpp_core import stages
    from megacpp_core.manifest import load_manifest

    src_root = tiny_run[0]
    shutil.copytree(src_root / "snapshots", tmp_path / "snapshots")
    manifest = load_manifest(str(tmp_path / "snapshots" / "tiny" / "manifest.yaml"))
    shard = tmp_path / "snapshots" / "tiny" / "revisions" / "pybind11-3.1.0" / "shards" / "000"
    want = (shard / "tokenized.parquet").read_bytes()
    docs = pq.read_table(shard / "chunks.parquet", columns=["n_chunks"]).column("n_chunks").to_pylist()
    assert any(n > 1 for n in docs) and any(n == 1 for n in docs)
    for alone in (False, True):
        (shard / "tokenized.parquet").unlink()
        if alone:
            ids_memo.MEMO.clear()
        else:
            assert stages.run("chunk", str(tmp_path), manifest, "pybind11-3.1.0", "000").ok
        encoded = _counting_encoder(monkeypatch)
        assert stages.run("tokenize", str(tmp_path), manifest, "pybind11-3.1.0", "000").ok
        monkeypatch.undo()
        assert len(encoded) == (len(docs) if alone else 0)
        assert (shard / "tokenized.parquet").read_bytes() == want
        assert len(ids_memo.MEMO) == 0
