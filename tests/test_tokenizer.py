"""Stage 5 tokenizer: ID layout, exact vocab size, lossless round trip, determinism, loading."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from megacpp_core import morphemes as morpheme_count
from megacpp_core import tokenizer as T

VOCAB = 65536

HOSTILE = {
    "unicode": "// naïve café — Ω ≠ ∑ 中文注释 עברית\nint ß = 1;\n",
    "emoji": 'const char *s = "😀👍🏽🇩🇪";\n',
    "crlf": "int a;\r\nint b;\r\n\r\n",
    "tabs_trailing": "\tint x = 1;   \n\t\t \n  ",
    "leading_space": "   #define X 1",
    "literal_specials": "<BOS><PAD><EOS><UNK><FILE_SEP><RESERVED_SPECIAL_3><RESERVED_BPE_0> <BOS>\n",
    "long_line": "a" * 200_000,
    "long_mixed": ("x += y << 2; /* <PAD> */ " * 8_000),
    "control": "\x01\x7f\x1b[0m\v\f",
    "empty": "",
}


def c_corpus(n: int = 300) -> list[str]:
    """A few hundred small generated C/C++ files (deterministic)."""
    docs = []
    for i in range(n):
        docs.append(
            f"#include <stdio.h>\n#include \"mod_{i % 7}.h\"\n\n"
            f"static int helper_{i}(int a, int b) {{\n"
            f"\tfor (int k = 0; k < {i}; ++k) {{\n\t\ta += b * k; // step {i}\n\t}}\n"
            f"\treturn a - {i % 13};\n}}\n\n"
            f"class Widget{i % 5} : public Base {{\npublic:\n"
            f"    std::vector<int> values_{i};\n    int size() const {{ return values_{i}.size(); }}\n}};\n"
        )
    return docs


@pytest.fixture(scope="module")
def build() -> T.TokenizerBuild:
    return T.train_tokenizer(c_corpus(), vocab_size=VOCAB)


def test_special_tokens_layout():
    assert len(T.SPECIAL_TOKENS) == T.NUM_SPECIAL == 64
    assert len(set(T.SPECIAL_TOKENS)) == 64
    assert T.SPECIAL_TOKENS[:4] == ["<PAD>", "<UNK>", "<BOS>", "<EOS>"]
    assert (T.PAD_ID, T.UNK_ID, T.BOS_ID, T.EOS_ID) == (0, 1, 2, 3)
    assert T.SPECIAL_TOKENS[27] == "<FILE_SEP>"
    assert T.SPECIAL_TOKENS[28] == "<RESERVED_SPECIAL_0>"
    assert T.SPECIAL_TOKENS[63] == "<RESERVED_SPECIAL_35>"
    assert T.DEFAULT_VOCAB_SIZE == 131072


def test_trained_ids_match_special_list(build):
    tok = build.tokenizer
    for i, token in enumerate(T.SPECIAL_TOKENS):
        assert tok.token_to_id(token) == i
        assert tok.id_to_token(i) == token


def test_exact_vocab_size_with_reserved_fill(caplog):
    with caplog.at_level(logging.WARNING, logger="megacpp.tokenizer"):
        b = T.train_tokenizer(c_corpus(50), vocab_size=VOCAB)
    tok = b.tokenizer
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB == b.vocab_size
    assert b.reserved > 0 and b.learned >= 256
    assert T.NUM_SPECIAL + b.fixed + b.learned + b.reserved == VOCAB
    assert b.merges >= b.learned - 256  # merges may also rebuild fixed tokens, reusing their ids
    bands = {d["name"]: d for d in b.bands}
    assert bands["special"] == {"name": "special", "start": 0, "end_exclusive": 64, "count": 64}
    assert bands["bpe"]["start"] == 64 + b.fixed and bands["bpe"]["count"] == b.learned
    assert bands["reserved"] == {
        "name": "reserved", "start": 64 + b.fixed + b.learned, "end_exclusive": VOCAB, "count": b.reserved,
    }
    assert tok.id_to_token(64 + b.fixed + b.learned) == "<RESERVED_BPE_0>"
    assert tok.id_to_token(VOCAB - 1) == f"<RESERVED_BPE_{b.reserved - 1}>"
    assert any("reserved" in r.getMessage() and str(b.reserved) in r.getMessage() for r in caplog.records)


def _random_words(n: int = 20000) -> str:
    import random
    import string

    rng = random.Random(0)
    return " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(8)) for _ in range(n))


@pytest.mark.parametrize("hybrid", [True, False])
def test_small_vocab_is_filled_by_merges_without_reserve(hybrid):
    words = _random_words()
    b = T.train_tokenizer(c_corpus() + [words, words], vocab_size=T.MIN_VOCAB_SIZE, hybrid=hybrid)
    assert b.reserved == 0 and b.fixed + b.learned == T.MIN_VOCAB_SIZE - 64
    assert (b.fixed > 1000) == hybrid
    assert b.tokenizer.get_vocab_size(with_added_tokens=True) == T.MIN_VOCAB_SIZE


@pytest.mark.parametrize("bad", [0, 511, 4095, -1, 1 << 32, True, 65536.0, "65536"])
def test_invalid_vocab_size(bad):
    with pytest.raises(ValueError):
        T.train_tokenizer(["int x;"], vocab_size=bad)


def test_invalid_min_frequency():
    with pytest.raises(ValueError):
        T.train_tokenizer(["int x;"], vocab_size=T.MIN_VOCAB_SIZE, min_frequency=0)


@pytest.mark.parametrize("key", sorted(HOSTILE))
def test_round_trip_hostile(build, key):
    tok, text = build.tokenizer, HOSTILE[key]
    ids = T.encode(tok, text)
    assert ids.dtype == np.uint32 and ids.ndim == 1
    assert T.decode(tok, ids) == text
    assert T.count_tokens(tok, text) == len(ids)
    if text:
        bpe_end = T.NUM_SPECIAL + build.fixed + build.learned
        assert ids.min() >= T.NUM_SPECIAL and ids.max() < bpe_end


def test_literal_special_text_is_not_a_special_id(build):
    ids = T.encode(build.tokenizer, "<BOS>")
    assert len(ids) > 1 and T.BOS_ID not in ids.tolist()
    assert T.PAD_ID not in T.encode(build.tokenizer, "<PAD>").tolist()


def test_encode_batch_and_check_round_trip(build):
    tok = build.tokenizer
    texts = list(HOSTILE.values()) + c_corpus(20)
    batch = T.encode_batch(tok, texts)
    assert all(a.dtype == np.uint32 for a in batch)
    assert [a.tolist() for a in batch] == [T.encode(tok, t).tolist() for t in texts]
    assert T.check_round_trip(tok, HOSTILE.items(), batch=3) == []


def test_check_round_trip_reports_failures(build):
    from tokenizers import Tokenizer

    broken = Tokenizer.from_str(build.tokenizer.to_str())
    broken.decoder = None  # byte-level symbols leak into the output, "int x" -> "int Ġx"
    broken.encode_special_tokens = True
    pairs = [("ok", "a"), ("spaced", "int x = 1;"), ("ok2", "")]
    assert T.check_round_trip(broken, pairs) == ["spaced"]


def test_decode_does_not_skip_specials_or_bad_ids(build):
    tok = build.tokenizer
    assert T.decode(tok, [T.BOS_ID]) == "<BOS>"
    assert T.decode(tok, np.array([], dtype=np.uint32)) == ""
    with pytest.raises(ValueError):
        T.decode(tok, [VOCAB])
    with pytest.raises(ValueError):
        T.decode(tok, [-1])


def test_decode_ids_is_the_tokenizers_decode_on_hostile_texts_and_split_characters(build):
    """:func:`megacpp_core.tokenize.decode_ids` (the ids' bytes as UTF-8) equals the
    tokenizer's decode: whole hostile texts, specials among the ids, every prefix of a
    multi-byte text (cuts inside characters fall back to the lossy decode) and no ids;
    bad ids raise as decode does."""
    from megacpp_core import tokenize

    tok = build.tokenizer
    for text in HOSTILE.values():
        ids = T.encode(tok, text)
        assert tokenize.decode_ids(tok, None, ids) == T.decode(tok, ids) == text
    ids = np.concatenate([[T.BOS_ID], T.encode(tok, HOSTILE["emoji"] + HOSTILE["unicode"]), [T.BOS_ID]])
    split = 0
    for k in range(len(ids) + 1):
        want = T.decode(tok, ids[:k])
        split += "\ufffd" in want
        assert tokenize.decode_ids(tok, None, ids[:k]) == want, k
    assert split > 0  # some cuts did split a character
    for bad in ([VOCAB], [-1]):
        with pytest.raises(ValueError):
            tokenize.decode_ids(tok, None, np.asarray(bad))


def test_save_load_and_manifest(build, tmp_path):
    manifest = T.save_tokenizer(build, tmp_path, extra={"snapshot": "s1"})
    path = tmp_path / T.TOKENIZER_FILE
    on_disk = json.loads((tmp_path / T.MANIFEST_FILE).read_text())
    assert on_disk == manifest
    assert manifest["tokenizer_sha256"] == T.tokenizer_sha256(path)
    assert manifest["snapshot"] == "s1"
    assert manifest["vocab_size"] == VOCAB and manifest["reserved"] == build.reserved
    assert manifest["special_tokens"] == T.SPECIAL_TOKENS
    assert manifest["training_documents"] == 300
    assert not list(tmp_path.glob("*.tmp"))

    tok = T.load_tokenizer(path, expected_sha256=manifest["tokenizer_sha256"])
    assert tok.encode_special_tokens is True
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB
    text = HOSTILE["literal_specials"]
    assert T.encode(tok, text).tolist() == T.encode(build.tokenizer, text).tolist()
    assert T.decode(tok, T.encode(tok, text)) == text
    assert T.load_tokenizer(tmp_path).encode_special_tokens is True

    with pytest.raises(ValueError):
        T.save_tokenizer(build, tmp_path, extra={"vocab_size": 1})


def test_load_with_wrong_sha_raises(build, tmp_path):
    T.save_tokenizer(build, tmp_path)
    path = tmp_path / T.TOKENIZER_FILE
    wrong = "0" * 64
    with pytest.raises(T.TokenizerMismatchError) as err:
        T.load_tokenizer(path, expected_sha256=wrong)
    msg = str(err.value)
    assert str(path) in msg and wrong in msg and T.tokenizer_sha256(path) in msg
    assert isinstance(err.value, ValueError)
    with pytest.raises(FileNotFoundError):
        T.load_tokenizer(tmp_path / "missing.json")


def test_encode_refuses_special_matching_tokenizer(build, tmp_path):
    from tokenizers import Tokenizer

    T.save_tokenizer(build, tmp_path)
    raw = Tokenizer.from_file(str(tmp_path / T.TOKENIZER_FILE))
    assert raw.encode_special_tokens is False  # not persisted by tokenizers: load_tokenizer re-applies it
    with pytest.raises(ValueError):
        T.encode(raw, "<BOS>")


def test_training_is_deterministic(build, tmp_path):
    again = T.train_tokenizer(iter(c_corpus()), vocab_size=VOCAB)
    a = T.save_tokenizer(build, tmp_path / "a")
    b = T.save_tokenizer(again, tmp_path / "b")
    assert (tmp_path / "a" / T.TOKENIZER_FILE).read_bytes() == (tmp_path / "b" / T.TOKENIZER_FILE).read_bytes()
    assert (tmp_path / "a" / T.MANIFEST_FILE).read_bytes() == (tmp_path / "b" / T.MANIFEST_FILE).read_bytes()
    assert a["tokenizer_sha256"] == b["tokenizer_sha256"]


def test_training_is_deterministic_across_processes_and_threads(build, tmp_path):
    script = (
        "import sys; from megacpp_core import tokenizer as T; from tests.test_tokenizer import c_corpus; "
        f"print(T.save_tokenizer(T.train_tokenizer(c_corpus(), vocab_size={VOCAB}), sys.argv[1])"
        "['tokenizer_sha256'])"
    )
    env = {"RAYON_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], env=env, check=True, capture_output=True, text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.stdout.strip() == T.save_tokenizer(build, tmp_path / "here")["tokenizer_sha256"]


def test_training_streams_an_arrow_column_to_the_same_bytes(build, tmp_path):
    """The stage trains on a TextColumn (arrow strings converted batch by batch, read twice)
    without a Python list of the sample, and gets the list's tokenizer."""
    import pyarrow as pa

    from megacpp_core.kept import TextColumn

    col = pa.chunked_array([pa.array(c_corpus()[:123], pa.large_string()), pa.array(c_corpus()[123:], pa.large_string())])
    texts = TextColumn(col, batch=50)
    assert len(texts) == 300 and list(texts) == list(texts) == c_corpus()
    streamed = T.train_tokenizer(texts, vocab_size=VOCAB)
    assert streamed.tokenizer.to_str() == build.tokenizer.to_str()
    assert (streamed.documents, streamed.text_bytes) == (build.documents, build.text_bytes) == (
        300, sum(len(t.encode("utf-8")) for t in c_corpus()))


def _morphemes_in_one_piece(texts, morphemes):
    """The definition: ``str.count`` over every identifier of every text, one per line."""
    stream = "\n".join("\n".join(morpheme_count._IDENT.findall(t)) for t in texts)
    return {m: stream.count(m) for m in morphemes}


def test_morphemes_are_counted_as_in_one_piece():
    """Each distinct identifier searched once and weighted gives ``str.count`` over the
    whole identifier stream: on the C corpus, on repeated and overlapping hits ("aa" in
    "aaaaa" twice, as ``str.count``), on non-ASCII text and an empty text."""
    texts = c_corpus(40) + ["std::vector<int> init_value; std::init readValue;"] * 3
    texts += ["aaaaa aaa aa a; int initinit = ininit;", "", "naïve_ß Ünïcode std::std:: x::y", "\x00\xff bin"]
    morphemes = ["std::", "init", "value", "Widget", "help", "zzz", "aa", "in", "::", "_", "e"]
    got = T.measure_morphemes(iter(texts), morphemes)
    assert got == _morphemes_in_one_piece(texts, morphemes) and got["std::"] == 48 and got["aa"] == 4
    # a morpheme with a newline or the empty one: counted in one piece ("x\na\nb\ny")
    assert T.measure_morphemes(["x a", "b y"], ["a\nb", ""]) == {"a\nb": 1, "": 8}
    assert T.measure_morphemes([], ["std::"]) == {"std::": 0}


@pytest.mark.integration
def test_morphemes_of_a_real_sample_are_counted_as_in_one_piece(tiny_run):
    import pyarrow.parquet as pq

    root, _ = tiny_run
    texts = [t for p in sorted((root / "snapshots" / "tiny" / "revisions").glob("*/shards/*/scrubbed.parquet"))
             for t in pq.read_table(p, columns=["text"]).column("text").to_pylist()]
    morphemes = T.load_seed_morphemes()
    assert len(texts) > 50 and len(morphemes) > 50
    got = T.measure_morphemes(texts, morphemes)
    assert got == _morphemes_in_one_piece(texts, morphemes) and sum(got.values()) > 1000


def test_an_error_counting_morphemes_fails_training_and_leaves_no_thread(monkeypatch):
    import threading

    def broken(texts, morphemes, stop=None):
        raise RuntimeError("morpheme count failed")

    monkeypatch.setattr(T, "measure_morphemes", broken)
    before = threading.active_count()
    with pytest.raises(RuntimeError, match="morpheme count failed"):
        T.train_tokenizer(["int main() { return 0; }\n"] * 20, vocab_size=4096)
    assert threading.active_count() == before


def test_training_that_fails_stops_the_morpheme_count(monkeypatch):
    """The count runs beside the trainer; when training ends early the count is told to
    stop instead of reading every text first."""
    import threading
    import time

    read = []

    class SlowTexts:  # every iter() starts over, as TextColumn's
        def __iter__(self):
            for i in range(5000):
                if threading.current_thread().name.startswith("morphemes"):
                    read.append(i)
                    time.sleep(0.001)
                yield f"int f{i}(void);\n"

        def __len__(self):
            return 5000

    class FailingTokenizer:
        def train_from_iterator(self, iterator, trainer):
            raise RuntimeError("trainer failed")

    monkeypatch.setattr(T, "new_tokenizer", lambda hybrid=True: FailingTokenizer())
    with pytest.raises(RuntimeError, match="trainer failed"):
        T.train_tokenizer(SlowTexts(), vocab_size=4096)
    assert 0 < len(read) < 5000


def _mark_fixed_by_json(raw: str, bands) -> tuple[str, int]:
    """The reference of ``_mark_fixed``: edit the fixed tokens' flags in the tokenizer's JSON;
    returns the edited tokenizer's JSON and its number of merges."""
    import json

    from tokenizers import Tokenizer

    flags = {t: b.single_word for b in bands for t in b.tokens}
    doc = json.loads(raw)
    for entry in doc["added_tokens"]:
        if entry["content"] in flags:
            entry.update(special=False, single_word=flags[entry["content"]], lstrip=False, rstrip=False,
                         normalized=False)
    return Tokenizer.from_str(json.dumps(doc, ensure_ascii=False)).to_str(), len(doc["model"]["merges"])


def test_fixed_tokens_are_marked_as_editing_the_json_would_on_real_code(tiny_run, monkeypatch):
    """``_mark_fixed`` flags the fixed tokens in place (``add_tokens``): the tokenizer then
    serializes to exactly the JSON that editing the trained tokenizer's JSON gives, with the
    same merge count, on the ``tiny`` snapshot's kept files at the default size; the
    tokenizer ``train_tokenizer`` returns is parsed from its final JSON (``build.json``) and
    behaves as the JSON edit with the reserved ids added (its in-memory state too)."""
    from tokenizers import Tokenizer

    from megacpp_core.layout import SnapshotLayout

    root, _ = tiny_run
    texts = SnapshotLayout(root, "tiny").kept_files(["text"]).column("text").to_pylist()
    seen = {}
    real = T._mark_fixed

    def spy(tok, bands):
        seen["want"] = _mark_fixed_by_json(tok.to_str(), bands)
        assert real(tok, bands) is None
        seen["got"] = tok.to_str()

    monkeypatch.setattr(T, "_mark_fixed", spy)
    build = T.train_tokenizer(texts, vocab_size=T.DEFAULT_VOCAB_SIZE)
    assert seen["got"] == seen["want"][0] and build.merges == seen["want"][1] > 1000
    assert build.json and build.tokenizer.to_str() == build.json and build.tokenizer.encode_special_tokens
    fixed = T.fixed_tokens()
    ids = [build.tokenizer.token_to_id(t) for t in fixed]
    assert ids == list(range(T.NUM_SPECIAL, T.NUM_SPECIAL + len(fixed)))
    ref = Tokenizer.from_str(seen["want"][0])
    reserved = T.DEFAULT_VOCAB_SIZE - ref.get_vocab_size(with_added_tokens=True)  # from the JSON edit itself
    assert reserved > 0 and build.reserved == reserved
    ref.add_special_tokens([f"<RESERVED_BPE_{i}>" for i in range(reserved)])
    got = build.tokenizer
    assert got.to_str() == ref.to_str()
    for t in (ref, got):
        t.encode_special_tokens = True
    probe = texts[:40] + [" ".join(fixed[:200]), "0xDEADBEEF std::vector<int> alignas(16) int x;"]
    assert [e.ids for e in got.encode_batch(probe)] == [e.ids for e in ref.encode_batch(probe)]
    one = [ref.encode(t, add_special_tokens=False).ids for t in fixed[:50]]
    assert got.decode_batch(one, skip_special_tokens=True) == ref.decode_batch(one, skip_special_tokens=True)
    assert all(got.decode_batch(one, skip_special_tokens=True))  # fixed tokens are not specials: kept