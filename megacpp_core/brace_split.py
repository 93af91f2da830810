"""The brace-balanced splitter of stage 6 (SPEC §4 "Chunking"): unit ends of C/C++ text
found without a parse, for files whose tree-sitter tree has ERROR nodes
(:mod:`megacpp_core.chunk` cuts them with it).

The lexer is the regex :data:`_BRACE_LEX`. Python's ``re`` spends about 20 ns a
character on it (on ``default``, 51 calls over 4.8 M characters: 0.13 s), so when the
native library is available (:func:`megacpp_core.native.tswalk.available`) the same lexer
runs in C (``native/brace.c``: :func:`megacpp_core.native.tswalk.brace_cuts`), which
gives the same cuts (``tests/test_brace_split.py`` compares both on real files and on
generated hostile text); :func:`brace_cuts_regex` is the Python one."""

from __future__ import annotations

import re

import numpy as np

from .native import tswalk

__all__ = ["brace_cuts", "brace_cuts_regex"]

# Lexemes the brace-balanced splitter looks at; everything else is skipped by the regex
# engine. Raw strings, strings, characters and comments are consumed whole so their braces
# and semicolons do not count; a preprocessor line (with continuations) is one lexeme.
_BRACE_LEX = re.compile(
    r'R"(?P<delim>[^()\\\s"]{0,16})\((?:.|\n)*?\)(?P=delim)"'
    r'|"(?:\\.|[^"\\\n])*"'
    r"|'(?:\\.|[^'\\\n])*'"
    r"|//(?:\\\r?\n|[^\n])*"
    r"|/\*(?:.|\n)*?\*/"
    r"|^[ \t]*\#(?:\\\r?\n|[^\n])*"
    r"|[{};]",
    re.MULTILINE,
)


def brace_cuts(text: str, lo: int, hi: int, level: int = 0) -> list[int]:
    """Unit ends of ``text[lo:hi]`` for the brace-balanced splitter, as ``str`` offsets.

    Brace depth starts at 0 at ``lo`` (clamped at 0 when a ``}`` has no opener, e.g. code
    split across ``#if`` branches). A unit ends after a ``;`` or ``}`` that leaves the depth
    at ``level``, or after a preprocessor line at that depth; the cut falls after the rest
    of that line (a trailing comment stays with its unit). Returns sorted offsets strictly
    inside ``(lo, hi)``; ``[]`` when there is no cut. Native when the library is available
    (see the module docstring), else :func:`brace_cuts_regex`; the same cuts either way.
    """
    if hi - lo < 2 or not tswalk.available():
        return brace_cuts_regex(text, lo, hi, level)
    codes = np.frombuffer(text[lo:hi].encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    cuts = tswalk.brace_cuts(codes, lo == 0 or text[lo - 1] == "\n", level)
    return (cuts + lo).tolist()


def brace_cuts_regex(text: str, lo: int, hi: int, level: int = 0) -> list[int]:
    """:func:`brace_cuts` by the regex :data:`_BRACE_LEX` (the reference the native lexer
    follows)."""
    depth = 0
    cuts: list[int] = []
    last = lo
    for m in _BRACE_LEX.finditer(text, lo, hi):
        tok = m.group()
        c = tok[0]
        if c == "{":
            depth += 1
            continue
        if c == "}":
            depth = max(0, depth - 1)
        elif c == ";":
            pass
        elif tok.lstrip().startswith("#"):
            if depth != level:
                continue
        else:
            continue  # literals and comments
        if depth != level:
            continue
        end = m.end()
        nl = text.find("\n", end, hi)
        cut = hi if nl < 0 else nl + 1
        if last < cut < hi:
            cuts.append(cut)
            last = cut
    return cuts
