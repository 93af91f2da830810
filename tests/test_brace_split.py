"""The brace-balanced splitter's native lexer (``native/brace.c``) against the Python regex
it follows (:func:`megacpp_core.brace_split.brace_cuts_regex`): the same cuts on the real
files of the ``tiny`` snapshot and the test fixtures, whole and in random ranges at several
levels, and on generated hostile text (unterminated literals, raw strings with long or
whitespace delimiters, line continuations, CRLF, every Unicode whitespace character,
characters outside the BMP, lone surrogates, a long line of semicolons)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from megacpp_core import brace_split
from megacpp_core.native import tswalk

FIXTURES = Path(__file__).parent / "fixtures"

pytestmark = pytest.mark.skipif(not tswalk.available(), reason="unreachable: tests/test_native_walk.py requires the library")


def _same(text: str, lo: int, hi: int, level: int) -> list[int]:
    want = brace_split.brace_cuts_regex(text, lo, hi, level)
    got = brace_split.brace_cuts(text, lo, hi, level)
    assert got == want, (lo, hi, level, text[lo:hi][:200])
    return got


def _ranges(text: str, rng: random.Random, k: int):
    n = len(text)
    yield 0, n
    lines = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
    for _ in range(k):
        if rng.random() < 0.5 and len(lines) > 1:
            a, b = sorted(rng.sample(lines, 2))
        else:
            a = rng.randrange(n + 1)
            b = rng.randrange(a, n + 1)
        yield a, b


def test_the_native_lexer_is_the_one_used():
    assert tswalk.available()  # the Makefile builds it; tests/test_native_walk.py fails without it
    text = "int a;\nint b;\n"
    assert brace_split.brace_cuts(text, 0, len(text)) == [7]


def test_same_cuts_as_the_regex_on_real_files(tiny_run):
    import pyarrow.parquet as pq

    root, _ = tiny_run
    files = sorted((Path(str(root)) / "snapshots").glob("*/revisions/*/shards/*/scrubbed.parquet"))
    texts = [t for f in files for t in pq.read_table(f, columns=["text"]).column("text").to_pylist() if t]
    texts += [p.read_text(encoding="utf-8", errors="surrogateescape") for p in sorted(FIXTURES.rglob("*"))
              if p.suffix in (".c", ".cc", ".cpp", ".h", ".hpp")]
    assert len(texts) > 20
    rng = random.Random(3)
    cuts = 0
    for text in texts:
        for a, b in _ranges(text, rng, 6):
            for level in (0, 1, 2):
                cuts += len(_same(text, a, b, level))
    assert cuts > 1000


_PIECES = ['R"', 'R"ab(', ')ab"', ")ab", 'R"(', ')"', 'R"' + "d" * 16 + "(", ")" + "d" * 16 + '"', 'R"' + "e" * 17 + "(",
           '"', "'", "\\", "\\\n", "\\\r\n", "\n", "\r\n", "\r", "//", "/*", "*/", "/", "*", "#", "#define X ", " ", "\t",
           "{", "}", ";", "x", "int", "R", "\u2003", "\x85", "\xa0", "\x1c", "\x0b", "\U0001F600", "é", "\ud800", "(", ")"]


def test_same_cuts_as_the_regex_on_hostile_text():
    rng = random.Random(11)
    for _ in range(3000):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randrange(1, 60)))
        for a, b in _ranges(text, rng, 3):
            _same(text, a, b, rng.choice((0, 0, 1, 2)))


def test_raw_string_delimiters_refuse_every_whitespace_character():
    spaces = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    assert len(spaces) > 20
    raw = {}
    for ch in spaces + ["(", ")", "\\", '"', "a", "\u200b"]:  # \u200b: not whitespace to Python
        text = f'R"a{ch}b(\n; }}\n)a{ch}b";\nint z;\n'  # a raw string hides the ; of line 2
        raw[ch] = _same(text, 0, len(text), 0) == [text.index("int z")]
        _same(text, 1, len(text), 0)
    assert raw["a"] and raw["\u200b"] and not any(raw[ch] for ch in spaces + ["(", ")", "\\", '"'])


def test_long_lines_and_line_starts():
    line = "a;" * 20000 + "\n"
    assert _same(line * 3, 0, 3 * len(line), 0) == [len(line), 2 * len(line)]
    text = "int a;\n  #if X\nint b;\n#endif\n"
    for lo in range(len(text)):  # a preprocessor line counts only from its line start, the range's first included
        _same(text, lo, len(text), 0)
