"""The brace-balanced splitter of stage 6 (SPEC §4 "Chunking"): unit ends of C/C++ text
found without a parse, for files whose tree-sitter tree has ERROR nodes
(:mod:`megacpp_core.chunk` cuts them with it)."""

from __future__ import annotations

import re

__all__ = ["brace_cuts"]

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
    inside ``(lo, hi)``; ``[]`` when there is no cut.
    """
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
