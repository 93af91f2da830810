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


def test_span_counts_equal_encoding_each_span(tok):
    margin, lengths, prefixes = span_count.prepare(tok)
    assert margin is not None
    rng = random.Random(0)
    checked = 0
    for name, text in _texts(tok).items():
        ids = tok.encode(text, add_special_tokens=False).ids
        counter = span_count.SpanCounter(tok, text, ids, lengths, margin, prefixes)
        assert len(counter.hard) > 1 or name in ("no_newline",), name
        for a, b in _spans(text, rng, 150):
            want = tok.encode(text[a:b], add_special_tokens=False).ids
            assert counter(a, b) == len(want), (name, a, b, text[max(0, a - 5):a + 20], text[max(0, b - 20):b + 5])
            got = counter.ids(a, b)
            assert got.dtype == np.uint32 and got.tolist() == want, (name, a, b)
            checked += 1
    assert checked > 1000


def test_span_counter_encodes_less_than_the_spans(tok):
    margin, lengths, prefixes = span_count.prepare(tok)
    text = "".join(_corpus()[:40])
    counter = span_count.SpanCounter(tok, text, tok.encode(text, add_special_tokens=False).ids, lengths, margin, prefixes)
    lines = [i + 1 for i, c in enumerate(text) if c == "\n"]
    spans = list(zip(lines[::10], lines[10::10]))
    for a, b in spans:
        assert counter(a, b) == len(tok.encode(text[a:b], add_special_tokens=False).ids)
    assert counter.encoded_chars < sum(b - a for a, b in spans) / 2


def test_span_counter_falls_back_without_the_locality_rule(tok):
    _, lengths, prefixes = span_count.prepare(tok)
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
