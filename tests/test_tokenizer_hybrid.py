"""Hybrid tokenizer: fixed bands, identifier safety, stable IDs, seeds, pinned files, the
tiny-corpus round trip and the tokenize stage's refusal of a foreign tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from megacpp_core import stages, tokenize
from megacpp_core import tokenizer as T
from megacpp_core.layout import SnapshotLayout
from megacpp_core.manifest import ManifestError, load_manifest
from tests.test_tokenizer import HOSTILE, _random_words, c_corpus

VOCAB = 65536
IDENTIFIERS = ["print", "integer", "do_something", "end_point", "initialize", "int_", "_int", "int2", "x0x",
               "uint", "format_string", "define", "returns", "voidptr", "__global__x", "std_vector", "TESTING",
               "printf_like", "endl_", "donut", "ifdef", "forward_list2", "dequeue"]


@pytest.fixture(scope="module")
def build() -> T.TokenizerBuild:
    return T.train_tokenizer(c_corpus(), vocab_size=VOCAB)


def test_bands_layout_is_contiguous_and_fixed_ids_match(build):
    bands = build.bands
    assert [b["name"] for b in bands] == ["special", "keywords", "preprocessor", "attributes", "operators",
                                          "numbers", "indent", "stl", "gpu", "testing", "bpe", "reserved"]
    assert bands[0]["start"] == 0 and bands[-1]["end_exclusive"] == VOCAB
    for a, b in zip(bands, bands[1:]):
        assert a["end_exclusive"] == b["start"] and a["count"] == a["end_exclusive"] - a["start"]
    fixed = T.fixed_tokens()
    assert len(fixed) == build.fixed == sum(b["count"] for b in bands[1:-2])
    tok = build.tokenizer
    for i, t in enumerate(T.SPECIAL_TOKENS + fixed):
        assert tok.token_to_id(t) == i and tok.id_to_token(i) == t
    for t in ("int", " int", "co_await", "contract_assert", "#include", "[[nodiscard]]", "->", "0x", "0X", "0x00",
              "0xFF", "0x80", "0xDEADBEEF", "0b", "1uz", "1.0f", "\t", "    ", "\n    ", "std::vector", "__global__",
              "hipMalloc", "xla::XlaOp", "EXPECT_EQ", "TEST_CASE", "BOOST_CHECK_EQUAL"):
        assert t in fixed, t


def test_fixed_tokens_encode_as_one_token(build):
    tok = build.tokenizer
    for text in ("0xDEADBEEF", "std::vector", "__global__", "co_await", "[[nodiscard]]", "EXPECT_EQ", "\t", "#include"):
        ids = T.encode(tok, text)
        assert ids.tolist() == [tok.token_to_id(text)], text
    ids = T.encode(tok, "std::vector<std::string>")
    assert len(ids) == 4 and T.decode(tok, ids) == "std::vector<std::string>"
    assert T.encode(tok, "(int)").tolist()[1] == tok.token_to_id("int")
    assert tok.token_to_id(" return") in T.encode(tok, "{ return 0; }").tolist()


@pytest.mark.parametrize("name", IDENTIFIERS)
def test_fixed_tokens_never_break_identifiers(build, name):
    """Inside an identifier no fixed token is cut out: the IDs are exactly the learned BPE's
    segmentation of the pre-tokens (a piece equal to a fixed string shares its one ID)."""
    tok = build.tokenizer
    for text in (name, f" {name}", f"({name})", f"x.{name}", f"{name}_2 {name}"):
        ids = T.encode(tok, text)
        assert T.decode(tok, ids) == text
        bpe = [t.id for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text) for t in tok.model.tokenize(piece)]
        assert ids.tolist() == bpe, (text, [tok.id_to_token(int(i)) for i in ids])


def test_decoding_underscore_identifiers_is_exact(build):
    tok = build.tokenizer
    text = "end_point do_something initialize integer print _a_ a__b int_ __x__ x_0x10 0x10_u"
    assert T.decode(tok, T.encode(tok, text)) == text


@pytest.mark.parametrize("key", sorted(HOSTILE))
def test_hostile_round_trip_with_fixed_bands(build, key):
    tok, text = build.tokenizer, HOSTILE[key] + "\n\tint x = 0xFF; // 1.0f\n    return;  \n"
    assert T.decode(tok, T.encode(tok, text)) == text


def test_ids_stable_across_corpora(build, tmp_path):
    words = _random_words(3000)
    other = T.train_tokenizer([words, words, HOSTILE["unicode"]], vocab_size=VOCAB)
    assert other.tokenizer.to_str() != build.tokenizer.to_str()
    assert other.fixed == build.fixed
    for i, t in enumerate(T.SPECIAL_TOKENS + T.fixed_tokens()):
        assert other.tokenizer.token_to_id(t) == i
    a = {b["name"]: b for b in build.bands}
    o = {b["name"]: b for b in other.bands}
    for name in a:
        if name not in ("bpe", "reserved"):
            assert a[name] == o[name]


def test_changed_band_files_are_refused(monkeypatch):
    monkeypatch.setattr(T, "BANDS_SHA256", "0" * 64)
    with pytest.raises(RuntimeError, match="fixed IDs must not move"):
        T.load_bands()


def test_malformed_band_files_are_refused(tmp_path, monkeypatch):
    version = tmp_path / "vx"
    version.mkdir()
    monkeypatch.setattr(T, "_band_dir", lambda v: tmp_path / v)
    (version / "01_a.txt").write_text("#! single_word=1 space_variant=1\nfoo\n")
    (version / "02_b.txt").write_text("#! single_word=0 space_variant=0\n\\s\\s\\t\n\\sfoo\n")
    with pytest.raises(ValueError, match="already in band a"):
        T.load_bands("vx")
    (version / "02_b.txt").write_text("#! single_word=0 space_variant=0\n# comment\n\\s\\s\\t\n")
    bands = T.load_bands("vx")
    assert [(b.name, b.tokens, b.single_word) for b in bands] == [("a", ("foo", " foo"), True), ("b", ("  \t",), False)]
    (version / "02_b.txt").write_text("#! single_word=0 space_variant=0\n<BOS>\n")
    with pytest.raises(ValueError, match="already in band special"):
        T.load_bands("vx")
    (version / "02_b.txt").write_text("no header\n")
    with pytest.raises(ValueError, match="header"):
        T.load_bands("vx")
    (version / "02_b.txt").write_text("#! single_word=0 space_variant=0\nbad\\q\n")
    with pytest.raises(ValueError, match="bad escape"):
        T.load_bands("vx")


def test_seed_morphemes_are_measured_and_std_merges(build):
    hits = T.measure_morphemes(["std::vector<int> v; std::string init_buffer; int readValue;"], ["std::", "init", "value", "zzz"])
    assert hits == {"std::": 2, "init": 1, "value": 0, "zzz": 0}
    code = ["#include <vector>\nstd::map<int, int> m; std::sort(a, b); auto p = std::make_pair(1, 2);\n"] * 40
    b = T.train_tokenizer(code + c_corpus(50), vocab_size=VOCAB)
    assert b.seeds["std::"] >= 80 and "zzz" not in b.seeds
    assert all(n >= T.SEED_MIN_HITS for n in b.seeds.values())
    ids = T.encode(b.tokenizer, "std::make_pair")
    assert b.tokenizer.id_to_token(int(ids[0])) == "std::"


def test_manifest_lists_bands_version_sha(build, tmp_path):
    info = T.save_tokenizer(build, tmp_path, extra={"snapshot": "s"})
    assert info["tokenizer_sha256"] == T.tokenizer_sha256(tmp_path / T.TOKENIZER_FILE)
    assert info["vocab_size"] == VOCAB and info["bands"] == build.bands
    assert info["bands_version"] == T.BANDS_VERSION and info["bands_sha256"] == T.bands_digest()
    assert info["tokenizers_version"] and info["snapshot"] == "s" and info["fixed"] == build.fixed


def test_pinned_tokenizer(build, tmp_path):
    info = T.save_tokenizer(build, tmp_path)
    path = tmp_path / T.TOKENIZER_FILE
    tok, lay = T.pin_tokenizer(path, info["tokenizer_sha256"], VOCAB)
    assert lay["bands"] == build.bands and lay["fixed"] == build.fixed and lay["reserved"] == build.reserved
    assert T.encode(tok, "int x;").tolist() == T.encode(build.tokenizer, "int x;").tolist()
    with pytest.raises(T.TokenizerMismatchError, match="does not match"):
        T.pin_tokenizer(path, "f" * 64, VOCAB)
    with pytest.raises(T.TokenizerMismatchError, match="vocab size"):
        T.pin_tokenizer(path, info["tokenizer_sha256"], 131072)


def _write_manifest(tmp_path: Path, extra: dict) -> Path:
    doc = {"name": "pinned", "sources": [{"name": "lz4-4.4.5", "kind": "pypi", "package": "lz4", "version": "4.4.5",
                                          "sha256": "5f0b9e53c1e82e88c10d7c180069363980136b9d7a8306c4dca4f760d60c39f0"}],
           **extra}
    p = tmp_path / "pinned.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_manifest_tokenizer_pin_field(tmp_path):
    m = load_manifest(_write_manifest(tmp_path, {"tokenizer": {"path": "tok/tokenizer.json", "sha256": "A" * 64}}))
    assert m.tokenizer == {"path": str(tmp_path / "tok" / "tokenizer.json"), "sha256": "a" * 64}
    assert load_manifest(_write_manifest(tmp_path, {})).tokenizer is None
    for bad in ({"path": "x"}, {"path": "x", "sha256": "zz"}, "x.json", {"path": "", "sha256": "a" * 64}):
        with pytest.raises(ManifestError, match="tokenizer"):
            load_manifest(_write_manifest(tmp_path, {"tokenizer": bad}))


def test_check_tokenizer_refuses_mismatch(build):
    tok = build.tokenizer
    info = {"tokenizer_sha256": "a" * 64, "vocab_size": VOCAB}
    tokenize.check_tokenizer(tok, info, vocab_size=VOCAB, pinned_sha256="a" * 64, upstream_sha256="a" * 64)
    with pytest.raises(T.TokenizerMismatchError, match="settings.vocab_size"):
        tokenize.check_tokenizer(tok, info, vocab_size=131072)
    with pytest.raises(T.TokenizerMismatchError, match="pin"):
        tokenize.check_tokenizer(tok, info, pinned_sha256="b" * 64)
    with pytest.raises(T.TokenizerMismatchError, match="chunked documents"):
        tokenize.check_tokenizer(tok, info, upstream_sha256="b" * 64)
    with pytest.raises(T.TokenizerMismatchError, match="loaded"):
        tokenize.check_tokenizer(tok, {**info, "vocab_size": 131072})


# ----------------------------------------------------------------- on the tiny snapshot run


@pytest.fixture(scope="module")
def tiny_layout(tiny_run):
    return SnapshotLayout(tiny_run[0], "tiny")


def test_tiny_every_document_round_trips(tiny_layout):
    info = json.loads((tiny_layout.stage_dir("tokenizer") / T.MANIFEST_FILE).read_text())
    tok = T.load_tokenizer(tiny_layout.stage_dir("tokenizer"), info["tokenizer_sha256"])
    kept = tiny_layout.kept_files(["doc_key", "text"])
    pairs = list(zip(kept.column("doc_key").to_pylist(), kept.column("text").to_pylist()))
    assert len(pairs) > 20
    assert T.check_round_trip(tok, pairs) == []
    assert info["model"] == "bpe-byte-level-hybrid" and info["fixed"] == len(T.fixed_tokens())
    assert info["seed_morphemes"].get("std::", 0) >= T.SEED_MIN_HITS
    assert tiny_layout.read_figures("tokenize")["tokenizer_sha256"] == info["tokenizer_sha256"]


def test_tiny_training_sample_is_bounded_in_keep_order_and_held_in_arrow(tiny_layout):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from megacpp_core import kept as kept_files

    refs = tiny_layout._shard_refs("scrubbed")
    decisions = pq.read_table(tiny_layout.stage_dir("dedup") / "decisions.parquet", columns=["doc_key", "keep"])
    full = tiny_layout.kept_files(["doc_key", "text"])
    whole = kept_files.sample(refs, decisions, 1 << 40)
    assert whole.schema.types == [pa.string(), pa.large_string()]
    assert whole.column("doc_key").to_pylist() == full.column("doc_key").to_pylist()
    assert whole.column("text").to_pylist() == full.column("text").to_pylist()
    total = sum(len(t.encode("utf-8")) for t in whole.column("text").to_pylist())
    part = kept_files.sample(refs, decisions, total // 3)
    keys = part.column("doc_key").to_pylist()
    assert 0 < len(keys) < whole.num_rows
    assert sum(len(t.encode("utf-8")) for t in part.column("text").to_pylist()) <= total // 3
    order = whole.column("doc_key").to_pylist()
    assert [order.index(k) for k in keys] == sorted(order.index(k) for k in keys)  # keep order
    text_of = dict(zip(order, whole.column("text").to_pylist()))
    assert part.column("text").to_pylist() == [text_of[k] for k in keys]
    assert kept_files.sample(list(reversed(refs)), decisions, total // 3).equals(part)  # not the shard order


def _copy_snapshot(tiny_layout, tmp_path) -> SnapshotLayout:
    dst = tmp_path / "root"
    for stage in ("tokenizer", "documents", "dedup", "revisions"):
        shutil.copytree(tiny_layout.stage_dir(stage), SnapshotLayout(dst, "tiny").stage_dir(stage))
    return SnapshotLayout(dst, "tiny")


def test_tokenize_stage_refuses_tampered_tokenizer(tiny_layout, tmp_path):
    manifest = load_manifest("tiny")
    lay = _copy_snapshot(tiny_layout, tmp_path)
    tdir = lay.stage_dir("tokenizer")
    info = json.loads((tdir / T.MANIFEST_FILE).read_text())
    (tdir / T.MANIFEST_FILE).write_text(json.dumps({**info, "vocab_size": 65536}))
    with pytest.raises(stages.StageError, match="vocab size"):
        stages.run("tokenize", lay.data_root, manifest, "lz4-4.4.5")
    (tdir / T.MANIFEST_FILE).write_text(json.dumps(info))
    (tdir / T.TOKENIZER_FILE).write_text((tdir / T.TOKENIZER_FILE).read_text() + " ")
    with pytest.raises(T.TokenizerMismatchError, match="does not match"):
        stages.run("tokenize", lay.data_root, manifest, "lz4-4.4.5")


def test_tokenizer_stage_uses_pinned_file(tiny_layout, tmp_path):
    src = tiny_layout.stage_dir("tokenizer") / T.TOKENIZER_FILE
    sha = T.tokenizer_sha256(src)
    lay = _copy_snapshot(tiny_layout, tmp_path)
    shutil.rmtree(lay.stage_dir("tokenizer"))
    base = yaml.safe_load(load_manifest("tiny").path.read_text())
    p = tmp_path / "tiny_pinned.yaml"
    p.write_text(yaml.safe_dump({**base, "name": "tiny", "tokenizer": {"path": str(src), "sha256": sha}}))
    res = stages.run("tokenizer", lay.data_root, load_manifest(p))
    assert all(ok for ok, _ in res.checks.values()) and res.figures["pinned"] is True
    info = json.loads((lay.stage_dir("tokenizer") / T.MANIFEST_FILE).read_text())
    assert info["tokenizer_sha256"] == sha and info["pinned"]["sha256"] == sha and info["vocab_size"] == 131072
    assert info["bands"] == json.loads((src.parent / T.MANIFEST_FILE).read_text())["bands"]
    p.write_text(yaml.safe_dump({**base, "name": "tiny", "tokenizer": {"path": str(src), "sha256": "0" * 64}}))
    with pytest.raises(stages.StageError, match="pinned tokenizer refused"):
        stages.run("tokenizer", lay.data_root, load_manifest(p))


def test_added_tokens_are_converted_once_per_tokenizer_file_and_each_time_without_one(build):
    """:func:`megacpp_core.snapshot_tokenizer.added_tokens`: the hybrid tokenizer's added
    tokens as ``get_added_tokens_decoder`` gives them; the same dict again for the same
    file sha256, a fresh one for another sha256 or without one (a tokenizer that may
    change: tokens added to it are seen)."""
    from tokenizers import Tokenizer

    from megacpp_core import snapshot_tokenizer

    tok = Tokenizer.from_str(build.tokenizer.to_str())
    first = snapshot_tokenizer.added_tokens(tok, "a" * 64)
    assert {i: a.content for i, a in first.items()} == {i: a.content for i, a in tok.get_added_tokens_decoder().items()}
    assert len(first) > 1000 and snapshot_tokenizer.added_tokens(tok, "a" * 64) is first
    assert snapshot_tokenizer.added_tokens(tok, "b" * 64) is not first
    assert snapshot_tokenizer.added_tokens(tok) is not snapshot_tokenizer.added_tokens(tok)
    tok.add_tokens(["<NEW_ADDED_TOKEN>"])
    assert len(snapshot_tokenizer.added_tokens(tok)) == len(first) + 1
