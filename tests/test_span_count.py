"""SpanCounter (stage 6): exact token counts of spans from one encoding of the file.

Every check compares ``SpanCounter(a, b)`` with ``len(encode(text[a:b]))`` (and
``SpanCounter.ids(a, b)`` with the ids themselves) of the real
code tokenizer (trained here on small C/C++ files, with the fixed bands' added tokens).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from megacpp_core import span_count
from megacpp_core import tokenizer as T

FIXTURES = Path(__file__).parent / "fixtures"


def _corpus() -> list[str]:
    from tests.test_tokenizer import c_corpus

    return c_corpus(120) + [p.read_text() for p in sorted(FIXTURES.rglob("*")) if p.suffix in (".c", ".cpp", ".hpp", ".h")]


@pytest.fixture(scope="module")
def tok():
    return T.train_tokenizer(_corpus(), vocab_size=T.MIN_VOCAB_SIZE).tokenizer


def _texts(tok) -> dict[str, str]:
    real = {f"fixture:{p.name}": p.read_text() for p in sorted(FIXTURES.rglob("*")) if p.suffix in (".c", ".cpp", ".hpp", ".h")}
    added = sorted({a.content for a in tok.get_added_tokens_decoder().values()
                    if 1 < len(a.content) < 20 and a.content.strip()})
    rng = random.Random(7)
    tails = ["", " x", "(y);", "  ", "\t"]
    edge_lines = "".join(f"{rng.choice(added)}{rng.choice(tails)}\n" for _ in range(400))
    return {
        **real,
        "generated": "".join(_corpus()[:20]),
        "invalid_utf8_replaced": (b"int a; /* \xff\xfe bad \xc3 */\nchar *s = \"\xe2\x82\";\n" * 40).decode("utf-8", "replace"),
        "unicode": "// naïve café — Ω ≠ ∑ 中文注释\nint ß = 1;\nconst char *e = \"😀👍🏽\";\n" * 60,
        "crlf": "int a;\r\n{\r\n  b();\r\n}\r\n\r\nstatic int c;\r\n" * 60,
        "no_newline": "int f(void) { return 1; }" * 200,
        "huge_line": "x += y << 2; " * 3000 + "\nint z;\n" + "a" * 20000,
        "added_tokens_at_line_starts": edge_lines,
        "indented": "".join(f"{' ' * (i % 9)}{'#' if i % 5 == 0 else ''}{w}\n"
                            for i, w in enumerate(["define X 1", "include <a.h>", "if (a) {", "}", "return 0;", "//c"] * 80)),
        "blank_runs": "int a;\n\n\n   \n\t\n}\n\n" * 80,
    }


def _spans(text: str, rng: random.Random, k: int) -> list[tuple[int, int]]:
    n = len(text)
    starts = [i + 1 for i, c in enumerate(text[:-1]) if c == "\n"]  # line starts, and a few chars around them
    points = sorted({0, n, *(p + d for p in starts for d in (-2, -1, 0, 1, 2, 3) if 0 <= p + d <= n)})
    out = [(0, n)]
    for _ in range(k):
        a, b = sorted(rng.sample(points, 2)) if rng.random() < 0.7 else sorted(rng.sample(range(n + 1), 2))
        if a < b:
            out.append((a, b))
        if b - a > 50 and rng.random() < 0.3:
            out.append((a, a + rng.randint(1, 50)))  # short spans ending anywhere
    return out


def test_locality_margin_applies_to_the_code_tokenizer(tok):
    margin = span_count.locality_margin(tok)
    longest = max(len(a.content) for a in tok.get_added_tokens_decoder().values())
    assert margin == longest + 1
    prefixes = span_count.added_prefixes(tok)
    assert all(a.content in prefixes for a in tok.get_added_tokens_decoder().values())


def test_added_prefixes_are_every_prefix_of_every_added_token(tok):
    """Against the definition (every non-empty prefix of every content), on the code
    tokenizer and on hostile contents: chains of prefixes, code points past the BMP, a NUL
    (which numpy's fixed-width strings would drop at an end), a lone character."""
    from tokenizers import AddedToken, Tokenizer, models

    def definition(t):
        return {a.content[:k] for a in t.get_added_tokens_decoder().values() for k in range(1, len(a.content) + 1)}

    assert span_count.added_prefixes(tok) == definition(tok)
    for contents in (["ab", "abc", "abd", "b", "日本語", "日本", "\U0001F600!", "<s>", "<s>x", "<"],
                     ["x\x00", "x", "\x00y", "a\x00"], ["z"]):
        other = Tokenizer(models.BPE(vocab={"a": 0}, merges=[]))
        other.add_tokens([AddedToken(c, special=False) for c in contents])
        assert span_count.added_prefixes(other) == definition(other) != set(), contents
    assert span_count.added_prefixes(Tokenizer(models.BPE(vocab={"a": 0}, merges=[]))) == frozenset()
    long = Tokenizer(models.BPE(vocab={"a": 0}, merges=[]))  # too wide for one array: pair by pair
    long.add_tokens([AddedToken(c, special=False) for c in ["x" * 5000, "x" * 4999 + "y", *(f"<R_{i}>" for i in range(900))]])
    assert span_count.added_prefixes(long) == definition(long)


def test_locality_margin_reads_newlines_of_added_tokens(tok):
    """An added token whose ``\\n`` is followed by whitespace keeps the rule (the margin
    grows with it); one whose ``\\n`` ends it or precedes another character refuses it."""
    from tokenizers import AddedToken, Tokenizer

    def with_added(content: str):
        other = Tokenizer.from_str(tok.to_str())
        other.encode_special_tokens = tok.encode_special_tokens  # a setting, not in the JSON
        other.add_tokens([AddedToken(content, special=False, normalized=False)])
        return other

    base = max(len(a.content) for a in tok.get_added_tokens_decoder().values())
    kept = "\n" + " " * (base + 5)
    assert span_count.locality_margin(with_added(kept)) == len(kept) + 1
    for bad in ("a\nb", "x = 1;\n", "\n\tok\n}"):
        assert span_count.locality_margin(with_added(bad)) is None, bad


@pytest.mark.parametrize("soft", [True, False], ids=["hard_and_soft_line_starts", "hard_line_starts"])
def test_span_counts_equal_encoding_each_span(tok, soft):
    margin, lengths, prefixes, newline = span_count.prepare(tok)
    assert margin is not None and newline  # the code tokenizer has the indentation band
    rng = random.Random(0)
    checked = 0
    for name, text in _texts(tok).items():
        ids = tok.encode(text, add_special_tokens=False).ids
        counter = span_count.SpanCounter(tok, text, ids, lengths, margin, prefixes, soft)
        assert len(counter.hard) > 1 or name in ("no_newline",), name
        if soft and name == "indented":  # the \n before every indented line after code is one
            s = [i for i in range(1, len(text) - 1) if text[i] == "\n" and "!" <= text[i - 1] <= "~" and text[i + 1] in " \t"]
            assert s and set(s) <= set(counter.hard.tolist())
        for a, b in _spans(text, rng, 150):
            want = tok.encode(text[a:b], add_special_tokens=False).ids
            assert counter(a, b) == len(want), (name, a, b, text[max(0, a - 5):a + 20], text[max(0, b - 20):b + 5])
            got = counter.ids(a, b)
            assert got.dtype == np.uint32 and got.tolist() == want, (name, a, b)
            checked += 1
    assert checked > 1000


def _with_added(tok, *added):
    """``tok`` parsed again with ``added`` (``tokenizers.AddedToken`` s) added."""
    from tokenizers import Tokenizer

    other = Tokenizer.from_str(tok.to_str())
    other.encode_special_tokens = tok.encode_special_tokens  # a setting, not in the JSON
    other.add_tokens(list(added))
    return other


def test_newline_starts_read_the_added_tokens(tok):
    """Soft line starts need ``"\\n "`` and ``"\\n\\t"`` matched in text, no added token
    with code right before a ``\\n`` and no ``single_word`` token starting with one; a
    tokenizer the margin accepts can still refuse them."""
    import json

    from tokenizers import AddedToken, Tokenizer

    assert span_count.newline_starts(tok)
    for bad in (AddedToken("a\n ", special=False, normalized=False),
                AddedToken("\n  x", special=False, normalized=False, single_word=True)):
        other = _with_added(tok, bad)
        assert span_count.locality_margin(other) is not None and not span_count.newline_starts(other), bad
    state = json.loads(tok.to_str())
    state["added_tokens"] = [a for a in state["added_tokens"] if a["content"] != "\n\t"]
    assert not span_count.newline_starts(Tokenizer.from_str(json.dumps(state)))


def test_soft_line_starts_would_miscount_where_refused(tok):
    """With an added token ``"a\\n "`` (code before a ``\\n``), a ``\\n`` after ``a`` is
    not where a piece starts: the soft rule forced on gives a wrong count, and the counter
    as prepared (soft line starts refused) stays exact."""
    from tokenizers import AddedToken

    other = _with_added(tok, AddedToken("a\n ", special=False, normalized=False))
    margin, lengths, prefixes, soft = span_count.prepare(other)
    assert margin is not None and not soft
    text = "int f(void) {\n  int a\n  = 1; return a\n  ;\n}\n" * 20
    ids = other.encode(text, add_special_tokens=False).ids
    exact = span_count.SpanCounter(other, text, ids, lengths, margin, prefixes, soft)
    forced = span_count.SpanCounter(other, text, ids, lengths, margin, prefixes, True)
    assert exact.margin is not None and forced.margin is not None  # the ids' bytes are the text's: no fallback
    assert len(forced.hard) > len(exact.hard)
    spans = [(a, b) for a in range(0, 60, 3) for b in range(a + 40, len(text), 97)]
    wrong = 0
    for a, b in spans:
        want = len(other.encode(text[a:b], add_special_tokens=False).ids)
        assert exact(a, b) == want, (a, b)
        wrong += forced(a, b) != want
    assert wrong > 0


def test_soft_line_starts_encode_less_of_indented_code(tok):
    """Spans inside a function body (every line indented): hard line starts alone encode
    them whole; with the soft ones each span's ends are encoded."""
    margin, lengths, prefixes, _ = span_count.prepare(tok)
    body = "".join(f"    x{i} = f(x{i - 1}, {i});\n" for i in range(1, 400))
    text = "int g(int x0) {\n" + body + "    return x0;\n}\n"
    ids = tok.encode(text, add_special_tokens=False).ids
    lines = [i + 1 for i, c in enumerate(text) if c == "\n"]
    spans = list(zip(lines[1:-3:20], lines[21:-3:20]))
    encoded = {}
    for soft in (False, True):
        counter = span_count.SpanCounter(tok, text, ids, lengths, margin, prefixes, soft)
        for a, b in spans:
            assert counter(a, b) == len(tok.encode(text[a:b], add_special_tokens=False).ids)
        encoded[soft] = counter.encoded_chars
    total = sum(b - a for a, b in spans)
    assert encoded[False] >= total and encoded[True] < total / 4, (encoded, total)


def test_span_counter_encodes_less_than_the_spans(tok):
    margin, lengths, prefixes, _ = span_count.prepare(tok)
    text = "".join(_corpus()[:40])
    counter = span_count.SpanCounter(tok, text, tok.encode(text, add_special_tokens=False).ids, lengths, margin, prefixes)
    lines = [i + 1 for i, c in enumerate(text) if c == "\n"]
    spans = list(zip(lines[::10], lines[10::10]))
    for a, b in spans:
        assert counter(a, b) == len(tok.encode(text[a:b], add_special_tokens=False).ids)
    assert counter.encoded_chars < sum(b - a for a, b in spans) / 2


def test_span_counter_falls_back_without_the_locality_rule(tok):
    _, lengths, prefixes, _ = span_count.prepare(tok)
    text = "int a;\nint b;\n"
    ids = tok.encode(text, add_special_tokens=False).ids
    for margin, the_ids in ((None, ids), (40, ids[:-1])):  # no rule; ids of another text
        counter = span_count.SpanCounter(tok, text, the_ids, lengths, margin, prefixes)
        assert counter.margin is None
        for a, b in ((0, 7), (3, 14), (7, 14), (0, 14)):
            assert counter(a, b) == len(tok.encode(text[a:b], add_special_tokens=False).ids)
            assert counter.ids(a, b).tolist() == tok.encode(text[a:b], add_special_tokens=False).ids
        assert counter.encoded_chars > 0


def test_locality_margin_refuses_other_tokenizers():
    build = T.train_tokenizer(_corpus()[:50], vocab_size=T.MIN_VOCAB_SIZE, hybrid=False)
    assert span_count.locality_margin(build.tokenizer) is None


def test_repeated_left_windows_are_counted_from_the_right_text(tok):
    """One counter, many spans starting inside lines whose left windows repeat (the same
    line text at several offsets, and different lines sharing their first characters):
    each count and each id list still equals the encoding of its own span, though most
    left pieces come from the counter's memo."""
    lines = ["return x + 1;", "    return y;", "if (a) { b(); }", "return x + 2;", "\treturn 0;", "re()", "return x + 3;"]
    text = "".join(f"{lines[i % len(lines)]}\n" for i in range(300))
    margin, lengths, prefixes, soft = span_count.prepare(tok)
    ids = tok.encode(text, add_special_tokens=False).ids
    counter = span_count.SpanCounter(tok, text, ids, lengths, margin, prefixes, soft)
    starts = [i + 1 for i, c in enumerate(text[:-1]) if c == "\n"]
    spans = [(s + d, starts[k + 5] + e) for k, s in enumerate(starts[:-8]) for d in (1, 4, 6) for e in (0, 3)]
    for a, b in spans:
        want = tok.encode(text[a:b], add_special_tokens=False).ids
        assert counter(a, b) == len(want), (a, b)
        assert counter.ids(a, b).tolist() == want, (a, b)
    assert 0 < len(counter._lefts) < len(spans) / 10  # the memo was used, and keyed finely enough
