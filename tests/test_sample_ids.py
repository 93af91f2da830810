"""The tokenizer's sample ids (``megacpp_core.sample_ids``): written by the tokenizer stage,
taken by the chunk stage for whole files and by the ``p3_repo`` stage after each path
header, on the real ``tiny`` snapshot. The ids are the encoder's own: every output is the
same bytes with the file and without it; a hash or tokenizer that differs is not read; the
header rule holds on every kept file and on hostile headers and texts, and is refused for
tokenizers it does not cover."""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import AddedToken, Tokenizer, normalizers

from megacpp_core import sample_ids
from megacpp_core import tokenizer as tk
from megacpp_checks.schemas.tokenizer import validate_sample_ids

SRC, SHARD = "pybind11-3.1.0", "000"


@pytest.fixture(scope="module")
def tiny(tiny_tokenizer):
    return tiny_tokenizer


def test_the_tokenizer_stage_writes_every_kept_files_ids_sorted_with_its_hash(tiny):
    lay, tok, sha = tiny
    path = lay.stage_dir("tokenizer") / "sample_ids.parquet"
    t = pq.read_table(path)
    assert pq.read_schema(path).metadata[sample_ids.TOKENIZER_KEY] == sha.encode()
    kept = lay.kept_files(["doc_key", "text"])
    keys, texts = kept.column("doc_key").to_pylist(), kept.column("text").to_pylist()
    assert t.column("doc_key").to_pylist() == sorted(keys)  # every kept file (tiny's sample is whole)
    text_of = dict(zip(keys, texts))
    for key, digest, n, ids in zip(*(t.column(c).to_pylist() for c in ("doc_key", "content_sha256", "n_tokens", "ids"))):
        assert digest == hashlib.sha256(text_of[key].encode("utf-8")).hexdigest()
        assert ids == tk.encode(tok, text_of[key]).tolist() and n == len(ids)
    scrubbed = {k: s for ref in lay._shard_refs("scrubbed") for k, s in
                zip(*(ref.read(columns=["doc_key", "content_sha256"]).column(c).to_pylist() for c in ("doc_key", "content_sha256")))}
    assert all(scrubbed[k] == s for k, s in zip(t.column("doc_key").to_pylist(), t.column("content_sha256").to_pylist()))
    assert validate_sample_ids(t)[0]


def test_the_schema_refuses_unsorted_keys_a_bad_hash_and_a_wrong_count():
    ids = [np.array([5, 6], np.uint32), np.array([7], np.uint32)]
    good = sample_ids.table(["b/x.c", "a/y.c"], ["0" * 64, "f" * 64], ids, "sha")
    assert good.column("doc_key").to_pylist() == ["a/y.c", "b/x.c"] and validate_sample_ids(good)[0]
    assert not validate_sample_ids(good.take([1, 0]))[0]  # not sorted
    assert not validate_sample_ids(good.set_column(1, "content_sha256", pa.array(["0" * 64, "nothex"])))[0]
    assert not validate_sample_ids(good.set_column(2, "n_tokens", pa.array([2, 2], pa.int64())))[0]
    with pytest.raises(ValueError, match="2 keys"):
        sample_ids.table(["a", "b"], ["0" * 64], ids, "sha")


class _Ref:
    """A stand-in for an input reference to a local ``sample_ids`` file."""

    def __init__(self, path):
        self.path = path

    def exists(self):
        return self.path.exists()

    def metadata(self):
        md = pq.read_schema(self.path).metadata or {}
        return {k.decode()[len("megacpp."):]: v.decode() for k, v in md.items() if k.startswith(b"megacpp.")}

    def read(self, columns=None, filters=None):
        return pq.read_table(self.path, columns=columns, filters=filters)


def test_read_returns_a_files_ids_only_for_its_hash_and_tokenizer(tiny, tmp_path):
    lay, tok, sha = tiny
    path = lay.stage_dir("tokenizer") / "sample_ids.parquet"
    t = pq.read_table(path)
    keys, shas = t.column("doc_key").to_pylist()[:5], t.column("content_sha256").to_pylist()[:5]
    got = sample_ids.read(_Ref(path), keys + ["nowhere/x.c"], shas[:4] + ["0" * 64, "0" * 64], sha)
    assert [x is None for x in got] == [False] * 4 + [True, True]  # a changed text, a file not in the sample
    assert all(np.array_equal(g, np.asarray(w, np.uint32)) for g, w in zip(got[:4], t.column("ids").to_pylist()))
    assert sample_ids.read(_Ref(path), keys, shas, "another-tokenizer") == [None] * 5
    assert sample_ids.read(_Ref(tmp_path / "missing.parquet"), keys, shas, sha) == [None] * 5


def test_after_header_is_the_whole_encoding_on_every_kept_file(tiny):
    lay, tok, sha = tiny
    kept = lay.kept_files(["doc_key", "path", "text"])
    built = 0
    for path, text in zip(kept.column("path").to_pylist(), kept.column("text").to_pylist()):
        got = sample_ids.after_header(tok, sha, path, text, tk.encode(tok, text))
        if got is not None:
            built += 1
            assert np.array_equal(got, tk.encode(tok, f"{path}\n{text}")), path
    assert built >= kept.num_rows - 3


HOSTILE_HEADERS = ["a.c", "dir/x++", "x.h~", "odd name ", "tabs\t", "déjà/vu.h", "new\nline.c", "", "::", "a/b/c.cpp  ",
                   "1234", "emoji-🙂.h", "<FILE_SEP>", "x" * 300, "dir/a.h;;;;", "a.h+++++", "a.h\r", "a.h ", "a.h->",
                   "a.h\n", "a.h\t\t"]
HOSTILE_TEXTS = ["#include <x>\n", "/* c */ int a;", "{", "int", "x", "_a", "1e5", "::std", "'\\n'", "\"s\"", "~A();",
                 " int a;", "\tint a;", "\n\nint a;", "\u00a0x", "\u2003x", "\x1cx", "éclair", "", "<BOS>x", "\u0085x",
                 "\r\nint a;", "\\\nx", "int\n    return;\n", "#define X \\\n  1\n", "int a;", "->x", "0x1F", "#if 0",
                 "template <class T>", "return;"]


@pytest.mark.parametrize("header", HOSTILE_HEADERS)
def test_after_header_on_hostile_headers_and_texts_is_exact_or_declined(tiny, header):
    """Exact whenever it answers; it answers for every text starting with a printable
    non-space ASCII character unless the header's own ids depend on what follows it."""
    _, tok, sha = tiny
    settled = tk.encode(tok, f"{header}\n").tolist() == tk.encode(tok, f"{header}\nx").tolist()[:-1]
    for text in HOSTILE_TEXTS:
        got = sample_ids.after_header(tok, sha, header, text, tk.encode(tok, text))
        if text and "!" <= text[0] <= "~" and settled:
            assert got is not None, (header, text)
        if got is not None:
            assert np.array_equal(got, tk.encode(tok, f"{header}\n{text}")), (header, text)
        else:
            assert not text or not ("!" <= text[0] <= "~") or not settled


def test_a_header_whose_ids_depend_on_the_text_is_declined(tiny):
    """Before a text that starts with an added token the regex piece ends at the newline,
    so the look-ahead there sees the end, not a character: ``;;;;`` and the newline are one
    pre-token. Joining the header's ids before a letter with the text's ids would be wrong;
    the rule declines instead."""
    _, tok, sha = tiny
    header, text = "dir/a.h;;;;", "#include <x>\n"
    joined = np.concatenate([tk.encode(tok, f"{header}\nx")[:-1], tk.encode(tok, text)])
    assert not np.array_equal(joined, tk.encode(tok, f"{header}\n{text}"))
    assert sample_ids.after_header(tok, sha, header, text, tk.encode(tok, text)) is None


def _variant(tok: Tokenizer) -> Tokenizer:
    v = Tokenizer.from_str(tok.to_str())
    v.encode_special_tokens = True
    return v


def test_header_safe_refuses_tokenizers_the_rule_does_not_cover(tiny):
    _, tok, sha = tiny
    assert sample_ids.header_safe(tok, sha)
    spanning = _variant(tok)
    spanning.add_tokens([AddedToken("\n#", normalized=False)])  # a token across the header's newline
    text = "#include <x.h>\n"
    split = np.concatenate([tk.encode(spanning, "a.c\nx")[:-1], tk.encode(spanning, text)])
    assert not np.array_equal(split, tk.encode(spanning, f"a.c\n{text}"))  # the rule would be wrong here
    assert not sample_ids.header_safe(spanning, "variant-spanning")
    assert sample_ids.after_header(spanning, "variant-spanning", "a.c", text, tk.encode(spanning, text)) is None
    lstrip = _variant(tok)
    lstrip.add_tokens([AddedToken("struct_x", lstrip=True, normalized=False)])
    assert not sample_ids.header_safe(lstrip, "variant-lstrip")
    word = _variant(tok)
    word.add_tokens([AddedToken("h\n", single_word=True, normalized=False)])
    assert not sample_ids.header_safe(word, "variant-single-word")
    normalized = _variant(tok)
    normalized.normalizer = normalizers.NFC()
    assert not sample_ids.header_safe(normalized, "variant-normalizer")
    assert not sample_ids.header_safe(tk.new_tokenizer(hybrid=False), "variant-gpt2")
    special = _variant(tok)
    special.add_special_tokens([AddedToken("h\n#", normalized=False)])  # a special token's match still takes characters
    assert not sample_ids.header_safe(special, "variant-special")
    matching = _variant(tok)
    matching.encode_special_tokens = False
    assert not sample_ids.header_safe(matching, "variant-matching-specials")
    tab = _variant(tok)
    tab.add_tokens([AddedToken("\n\t\t\t\t\t\t\t\t\t\t\t\t", normalized=False)])  # whitespace after the newline: covered
    assert sample_ids.header_safe(tab, "variant-tab")


def _copy(tiny_run, tmp_path):
    shutil.copytree(tiny_run[0] / "snapshots", tmp_path / "snapshots")
    from megacpp_core.manifest import load_manifest

    return load_manifest(str(tmp_path / "snapshots" / "tiny" / "manifest.yaml"))


def test_chunk_and_p3_write_the_same_bytes_with_and_without_the_sample_ids(tiny_run, tmp_path):
    """The chunk stage of one shard and the ``p3_repo`` stage of its revision, run with the
    sample ids, with one file's hash changed in them, and with the file gone: the same
    bytes each time, and the figures count the files taken from the sample."""
    from megacpp_core import stages

    manifest = _copy(tiny_run, tmp_path)
    snap = tmp_path / "snapshots" / "tiny"
    shard = snap / "revisions" / SRC / "shards" / SHARD
    p3 = snap / "revisions" / SRC / "families" / "p3_repo.parquet"
    want_chunks, want_p3 = (shard / "chunks.parquet").read_bytes(), p3.read_bytes()
    ids_file = snap / "tokenizer" / "sample_ids.parquet"
    t = pq.read_table(ids_file)
    mine = [i for i, k in enumerate(t.column("doc_key").to_pylist()) if k.startswith(SRC + "/")]
    assert mine
    seen = []
    for case in ("whole", "one hash changed", "missing"):
        if case == "one hash changed":
            hashes = t.column("content_sha256").to_pylist()
            hashes[mine[0]] = "0" * 64
            pq.write_table(t.set_column(1, "content_sha256", pa.array(hashes)), ids_file)
        elif case == "missing":
            ids_file.unlink()
        for f in (shard / "chunks.parquet", p3):
            f.unlink()
        chunk_run = stages.run("chunk", str(tmp_path), manifest, SRC, SHARD)
        p3_run = stages.run("repo_documents", str(tmp_path), manifest, SRC)
        assert chunk_run.ok and p3_run.ok, case
        assert (shard / "chunks.parquet").read_bytes() == want_chunks, case
        assert p3.read_bytes() == want_p3, case
        seen.append((chunk_run.figures["files_with_sample_ids"], p3_run.figures["files_from_sample_ids"]))
    files = chunk_run.figures["files"]
    assert seen[0][0] == files and seen[0][1] >= files - 3
    assert seen[1] == (files - 1, seen[0][1] - 1)
    assert seen[2] == (0, 0)


def test_ids_that_do_not_spell_their_text_are_not_used(tiny_run, tmp_path):
    """Ids altered under the right hash (a damaged file) do not decode to their text: chunk
    and p3_repo encode that file instead, and every output keeps its bytes."""
    from megacpp_core import stages

    manifest = _copy(tiny_run, tmp_path)
    snap = tmp_path / "snapshots" / "tiny"
    shard = snap / "revisions" / SRC / "shards" / SHARD
    p3 = snap / "revisions" / SRC / "families" / "p3_repo.parquet"
    want = {f: f.read_bytes() for f in (shard / "chunks.parquet", shard / "tokenized.parquet", p3)}
    ids_file = snap / "tokenizer" / "sample_ids.parquet"
    t = pq.read_table(ids_file)
    rows = t.to_pylist()
    i = next(j for j, r in enumerate(rows) if r["doc_key"].startswith(SRC + "/") and len(r["ids"]) > 1)
    first = rows[i]["ids"][0]
    rows[i]["ids"][0] = first + 1 if first + 1 < tk.DEFAULT_VOCAB_SIZE else first - 1  # another token, same count
    pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), ids_file)
    for f in want:
        f.unlink()
    chunk_run = stages.run("chunk", str(tmp_path), manifest, SRC, SHARD)
    assert chunk_run.ok and chunk_run.figures["files_with_sample_ids"] == chunk_run.figures["files"] - 1
    assert stages.run("tokenize", str(tmp_path), manifest, SRC, SHARD).ok
    assert stages.run("repo_documents", str(tmp_path), manifest, SRC).ok
    assert all(f.read_bytes() == b for f, b in want.items())


def test_verified_keeps_only_ids_that_decode_to_their_text(tiny):
    _, tok, sha = tiny
    ids = [tk.encode(tok, "int a;"), tk.encode(tok, "int b;"), None]
    for digest in (sha, None):  # the byte table kept per process by the sha256, or built for the call
        got = sample_ids.verified(tok, ["int a;", "int a;", "x"], ids, digest)
        assert got[0] is ids[0] and got[1] is None and got[2] is None


def test_verified_agrees_with_the_tokenizers_decode_on_real_and_damaged_ids(tiny):
    """On the ``tiny`` sample's files, whole and damaged (an id changed, dropped or added,
    an id outside the vocabulary, another file's ids, a multi-byte character split), an
    entry is kept exactly when the tokenizer's own ``decode`` gives its text; an empty
    text with no ids is kept."""
    import random

    lay, tok, sha = tiny
    kept = lay.kept_files(["doc_key", "text"])
    texts = kept.column("text").to_pylist()[:40] + ["", "é — ü", "x"]
    good = [tk.encode(tok, t) for t in texts]
    rng = random.Random(5)
    ids, want_texts = [], []
    vocab = tok.get_vocab_size(with_added_tokens=True)
    for i, (t, x) in enumerate(zip(texts, good)):
        ids.append(x)
        want_texts.append(t)
        if x.size:
            for damaged in (np.delete(x, rng.randrange(x.size)), np.append(x, x[:1]),
                            np.where(np.arange(x.size) == rng.randrange(x.size), (x + 1) % vocab, x).astype(np.uint32),
                            np.append(x, np.uint32(vocab + 7)), good[(i + 1) % len(good)]):
                ids.append(damaged)
                want_texts.append(t)
    split = np.array(tok.encode("é", add_special_tokens=False).ids, np.uint32)
    bytes_e = [tok.id_to_token(int(j)) for j in split]
    ids.append(split[:1] if len(bytes_e) > 1 else split)
    want_texts.append("é")
    got = sample_ids.verified(tok, want_texts, ids, sha)
    for t, x, g in zip(want_texts, ids, got):
        in_vocab = bool((x < vocab).all())
        expect = in_vocab and tok.decode(x.tolist(), skip_special_tokens=False) == t
        assert (g is x) == expect, (t[:40], x[:10])
    assert sum(g is not None for g in got) >= len(texts)  # every whole entry kept
    # stricter than the decode: ids whose bytes are not UTF-8 against a text holding the
    # U+FFFD the lossy decode gives, ids outside the vocabulary the decode skips, and a
    # text that is not UTF-8 are all encoded again
    lossy = split[:1] if len(bytes_e) > 1 else np.array([], np.uint32)
    x = tk.encode(tok, "x")
    odd = [lossy, np.append(x, np.uint32(vocab)), np.array([-1], np.int64), tk.encode(tok, "a")]
    odd_texts = ["\ufffd", "x", "x", "\ud800"]
    if lossy.size:
        assert tok.decode(lossy.tolist(), skip_special_tokens=False) == "\ufffd"
    assert sample_ids.verified(tok, odd_texts, odd, sha) == [None] * 4
