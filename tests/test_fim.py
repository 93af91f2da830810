"""FIM (PSM/SPM): determinism, rates, and every token-aligned column moving with the tokens."""

from __future__ import annotations

import numpy as np
import pytest

from megacpp_core import fim, pack
from megacpp_core import tokenizer as tk

BOS, PAD = tk.BOS_ID, tk.PAD_ID
#: A byte-per-token vocabulary: id 64 + b is byte b.
BYTE_TABLE = [b""] * 64 + [bytes([b]) for b in range(256)]


def byte_doc(text: str, key="s/a.cc#0", planes=True) -> pack.PackInput:
    ids = np.array([BOS] + [64 + b for b in text.encode()], dtype=np.uint32)
    n = len(ids)
    extras = {}
    if planes:
        extras = {p: (np.arange(n) * (k + 3)) % 200 + 1 for k, p in enumerate(pack.PLANES)}
        extras["chunk_boundaries"] = [{"start": s, "end": min(n, s + 7), "kind": "FUNC_BODY", "name": f"c{s}", "dep_level": s % 3}
                                      for s in range(1, n, 7)]
        extras["call_edges"] = [{"from": j, "to": 0} for j in range(len(extras["chunk_boundaries"]))]
        extras["type_edges"] = []
        extras["platform_ids"] = [5]
    keep = np.ones(n, np.uint8)
    keep[3] = 0
    return pack.PackInput(ids, key, "s", "r", "a.cc", 0, loss_keep=keep, extras=extras)


def test_decisions_are_deterministic_and_follow_rates():
    cfg = fim.FimConfig(rate=0.5, spm_share=0.5, seed=7)
    keys = [f"s/f{i}.cc#0" for i in range(4000)]
    a = [fim.decide(k, 100, cfg) for k in keys]
    assert a == [fim.decide(k, 100, cfg) for k in keys]
    assert a != [fim.decide(k, 100, fim.FimConfig(seed=8)) for k in keys]
    modes = [m for m, _, _ in a]
    assert 0.46 < 1 - modes.count("none") / len(keys) < 0.54
    assert 0.45 < modes.count("spm") / (len(keys) - modes.count("none")) < 0.55
    assert all(0 <= x <= y <= 100 for _, x, y in a)
    assert {m for m, *_ in (fim.decide(k, 100, fim.FimConfig(rate=0.0)) for k in keys)} == {"none"}


@pytest.mark.parametrize("mode", ["psm", "spm"])
def test_every_token_aligned_column_is_permuted_with_the_tokens(mode, monkeypatch):
    doc = byte_doc("int x = 1;\nint add(int a, int b) { return a + b; }\n")
    n = len(doc.ids)
    a, b = 12, 30
    monkeypatch.setattr(fim, "decide", lambda key, n_body, cfg: (mode, a, b))
    r = fim.apply_fim(doc, fim.FimConfig(doc_comment_policy="keep"), 4096)
    new, src = r.doc, r.src
    assert len(new.ids) == n + 3 and sorted(src[src >= 0].tolist()) == list(range(n))
    body = doc.ids[1:]
    pre, mid, suf = body[:a].tolist(), body[a:b].tolist(), body[b:].tolist()
    P, M, S = fim.FIM_PREFIX_ID, fim.FIM_MIDDLE_ID, fim.FIM_SUFFIX_ID
    want = [BOS, P] + pre + [S] + suf + [M] + mid if mode == "psm" else [BOS, P, S] + suf + [M] + pre + mid
    assert new.ids.tolist() == want
    marker = src < 0
    for p in pack.PLANES:  # planes: same value as the source token, 0 at markers
        assert np.array_equal(new.extras[p][~marker], np.asarray(doc.extras[p])[src[~marker]]), p
        assert not new.extras[p][marker].any()
    assert np.array_equal(new.loss_keep[~marker], doc.loss_keep[src[~marker]])
    assert new.loss_keep[marker].all()
    # chunk spans: every piece covers tokens that were consecutive inside one source chunk,
    # and the pieces of a chunk together cover exactly its source tokens
    covered: dict[str, list[int]] = {}
    for c in new.extras["chunk_boundaries"]:
        olds = src[c["start"]:c["end"]]
        assert (olds >= 0).all() and (np.diff(olds) == 1).all()
        assert np.array_equal(new.ids[c["start"]:c["end"]], doc.ids[olds])
        covered.setdefault(c["name"], []).extend(olds.tolist())
    for c in doc.extras["chunk_boundaries"]:
        assert sorted(covered[c["name"]]) == list(range(c["start"], c["end"]))
    names = [c["name"] for c in new.extras["chunk_boundaries"]]
    for e, old in zip(new.extras["call_edges"], doc.extras["call_edges"]):
        assert names[e["from"]] == doc.extras["chunk_boundaries"][old["from"]]["name"]
        assert names[e["to"]] == doc.extras["chunk_boundaries"][old["to"]]["name"]
    assert new.extras["platform_ids"] == [5]
    rows = pack.build_rows([new], 4096, BOS, PAD, optional=pack.OPTIONAL_COLUMNS)
    pack.check_rows(rows, 4096, 1000, BOS, PAD)
    assert rows.column("loss_mask")[0].as_py()[:len(new.ids) - 1] == new.loss_keep[1:].tolist()


def test_doc_comment_describing_the_middle_is_masked(monkeypatch):
    text = "int x;\n/** Adds two numbers. */\nint add(int a, int b) { return a + b; }\n"
    doc = byte_doc(text, planes=False)
    start = text.index("int add")
    comment = (text.index("/**"), text.index("*/") + 2)
    monkeypatch.setattr(fim, "decide", lambda key, n_body, cfg: ("psm", start, len(text) - 2))
    r = fim.apply_fim(doc, fim.FimConfig(), 4096, BYTE_TABLE)
    assert r.masked == comment[1] - comment[0]
    old_masked = {int(s) - 1 for s, k in zip(r.src, r.doc.loss_keep) if s > 0 and k == 0} - {2}
    assert old_masked == set(range(*comment))
    kept = fim.apply_fim(doc, fim.FimConfig(doc_comment_policy="keep"), 4096, BYTE_TABLE)
    assert kept.masked == 0 and (kept.doc.loss_keep == 0).sum() == 1
    # a comment not adjacent to the middle is left alone
    monkeypatch.setattr(fim, "decide", lambda key, n_body, cfg: ("psm", 2, 4))
    assert fim.apply_fim(doc, fim.FimConfig(), 4096, BYTE_TABLE).masked == 0


def test_document_too_long_for_the_markers_is_left_whole(monkeypatch):
    doc = byte_doc("x" * 20, planes=False)
    monkeypatch.setattr(fim, "decide", lambda key, n_body, cfg: ("spm", 3, 9))
    r = fim.apply_fim(doc, fim.FimConfig(), row_length=len(doc.ids) + 2)
    assert r.mode == "none" and r.reason == "too_long" and r.doc is doc
    docs, figs = fim.apply_fim_all([doc], fim.FimConfig(), len(doc.ids) + 2)
    assert figs["fim_skipped_too_long"] == 1 and docs[0] is doc


def _byte_table_reference(tok) -> list[bytes]:
    """The byte table asked id by id (``id_to_token``), each model token mapped char by char
    through GPT-2's byte table, added tokens as UTF-8, ids without a token as ``b""``."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:] + [256 + k for k in range(256 - len(bs))]
    bs = bs + [b for b in range(256) if b not in bs]
    inv = {chr(c): b for b, c in zip(bs, cs)}
    added = {i: a.content for i, a in tok.get_added_tokens_decoder().items()}
    out = []
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        s = added.get(i, tok.id_to_token(i) or "")
        out.append(s.encode() if i in added or not all(ch in inv for ch in s) else bytes(inv[ch] for ch in s))
    return out


def test_byte_table_of_a_sparse_vocabulary_with_added_tokens_over_model_ids():
    """Model ids with gaps, a token outside the byte alphabet, and added tokens both new and
    re-using a model token's id: the same bytes as the id-by-id reference."""
    from tokenizers import AddedToken, Tokenizer, models

    vocab = {"a": 0, "b": 1, "Ġc": 3, "é": 5, "ĊĠĠ": 7, "\u00ff\u0100": 9}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("é", special=True)])
    tok.add_tokens([AddedToken("b", special=False), AddedToken("std::", special=False)])
    table = fim.token_byte_table(tok)
    assert table == _byte_table_reference(tok)
    assert table[3] == b" c" and table[2] == b"" and len(table) == 8  # 2: no token; 9: past the reported size
    assert table[5] == "é".encode() and table[tok.token_to_id("<s>")] == b"<s>"
    assert table[tok.token_to_id("std::")] == b"std::"  # an added id that a model token also has: the added token


def test_byte_table_of_model_tokens_outside_the_byte_alphabet():
    """Model tokens (not added) holding characters the byte table does not map (a space, a
    tab, CJK, an emoji, a code point past the table) take their UTF-8, whole, among
    tokens that map byte by byte: the same bytes as the id-by-id reference."""
    from tokenizers import AddedToken, Tokenizer, models

    vocab = {"a": 0, "x y": 1, "ĠĠ": 2, "日本": 3, "\U0001F600": 4, "Ġ\t": 5, "\u0144": 6, "\u0143": 7, "ÿĀ": 8}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens([AddedToken("<s>", special=True)])
    table = fim.token_byte_table(tok)
    assert table == _byte_table_reference(tok)
    assert table[1] == b"x y" and table[2] == b"  " and table[3] == "日本".encode() and table[5] == "Ġ\t".encode()  # a tab: the whole token as UTF-8
    assert table[6] == "\u0144".encode() and table[7] == b"\xad" and table[8] == b"\xff\x00"


def test_real_tokenizer_byte_table_matches_id_by_id(tiny_run):
    """Every id of the real tiny tokenizer, against a reference that asks the tokenizer for
    each id's token and maps it char by char through GPT-2's byte table."""
    from megacpp_core.layout import SnapshotLayout

    root, _ = tiny_run
    tok = tk.load_tokenizer(SnapshotLayout(root, "tiny").stage_dir("tokenizer") / "tokenizer.json")
    table = fim.token_byte_table(tok)
    assert len(table) == tok.get_vocab_size(with_added_tokens=True)
    assert table == _byte_table_reference(tok)
    assert table[tk.BOS_ID] == b"<BOS>" and any(len(b) > 4 for b in table)


def test_real_tokenizer_byte_table_adds_up(tiny_run):
    from megacpp_core.layout import SnapshotLayout

    root, _ = tiny_run
    lay = SnapshotLayout(root, "tiny")
    tok = tk.load_tokenizer(lay.stage_dir("tokenizer") / "tokenizer.json")
    table = fim.token_byte_table(tok)
    docs = lay.documents("tokenized", columns=["text", "input_ids"]).select(["text", "input_ids"]).to_pylist()
    for d in docs[:50]:
        assert b"".join(table[i] for i in d["input_ids"][1:]) == d["text"].encode()
