r"""Stage 1 — quality filter (SPEC §4 "Quality").

Each heuristic is a named filter with a threshold from :class:`~megacpp_core.manifest.Settings`;
the first filter that fails rejects the file and the ``exclusions`` table records the
filter name, the measured value and the threshold. Filters, in order:

====================  =======================================================  =========
filter                measure                                                  default
====================  =======================================================  =========
``extension``         lower-cased extension in the whitelist                   SPEC list
``max_file_bytes``    size in bytes                                            ≤ 1 MB
``min_file_bytes``    size in bytes                                            ≥ 100 B
``nul_byte``          a NUL byte anywhere                                      none
``invalid_utf8``      strict UTF-8 decode                                      decodes
``max_line_length``   longest line, in characters                              ≤ 1000
``unique_lines``      distinct / total non-blank stripped lines                > 0.30
``comment_ratio``     comment characters / non-blank characters                < 0.80
``generated``         an auto-generated marker in the first N lines            none
``entropy``           share of non-blank bytes in high-entropy runs (below)    ≤ 0.5
``max_lines``         number of lines                                          ≤ 100,000
``mean_line_length``  characters / lines                                       ≤ 100
``alpha_fraction``    alphabetic characters / all characters                   ≥ 0.25
``encoded_run``       longest encoded-data run (below), in characters          ≤ 1,024
``encoded_share``     characters in encoded-data runs / all characters         ≤ 0.5
====================  =======================================================  =========

The last five are the StarCoder2 code filters (Lozhkov et al. 2024, "StarCoder 2 and The
Stack v2", §3 "Preprocessing": 100k-line cap, mean line length 100, alphabetic fraction
0.25 and encoded-data detection). Encoded data are matches of StarCoder2's three
patterns: base64 runs ``[a-zA-Z0-9+/\n=]{64,}``, hex byte runs
``(?:\b(?:0x|\\x)?[0-9a-fA-F]{2}(?:,|\b\s*)){8,}`` and ``\u`` escape runs
``(?:\\u[0-9a-fA-F]{4}){8,}``; a file goes when one run is longer than 1,024 characters
or all runs together cover more than half of it.

``entropy`` applies the SPEC's 4.5 bits/byte where that number comes from: the Shannon
entropy of base64-alphabet runs (``[A-Za-z0-9+/=]{20,}``), the limit detect-secrets'
``Base64HighEntropyString`` uses. A file is a binary-in-ASCII dump when runs above
``max_entropy`` bits/byte cover more than ``max_entropy_coverage`` of its non-blank
bytes. The whole-file byte histogram is not used: ordinary C/C++ measures ≈4.9
bits/byte there (median over the default corpus; 97% of files exceed 4.5), while a
base64 dump's runs measure ≈5.5 and identifiers (no ``_`` inside a run) stay below it.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .manifest import Settings

#: C/C++ comments and the literals that can hide comment markers.
_LEXEMES = re.compile(
    r'//[^\n]*|/\*.*?(?:\*/|\Z)|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S
)
FILTERS = (
    "extension", "max_file_bytes", "min_file_bytes", "nul_byte", "invalid_utf8",
    "max_line_length", "unique_lines", "comment_ratio", "generated", "entropy",
    "max_lines", "mean_line_length", "alpha_fraction", "encoded_run", "encoded_share",
)

#: StarCoder2's encoded-data patterns (base64, hex bytes, ``\u`` escapes), verbatim.
ENCODED_PATTERNS = (
    re.compile(r"[a-zA-Z0-9+/\n=]{64,}"),
    re.compile(r"(?:\b(?:0x|\\x)?[0-9a-fA-F]{2}(?:,|\b\s*)){8,}"),
    re.compile(r"(?:\\u[0-9a-fA-F]{4}){8,}"),
)


#: A substring every match of the pattern of the same index contains (None: no such
#: prefilter): a text without it is not scanned (the ``\\u`` pattern costs a scan of
#: every position otherwise, about 25 ms a megabyte here).
_ENCODED_NEEDS = (None, None, "\\u")

#: Per ASCII byte: whether the base64 pattern's class ``[a-zA-Z0-9+/\\n=]`` holds it.
_B64_CLASS = np.zeros(256, dtype=bool)
_B64_CLASS[list(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/\n=")] = True
#: Per ASCII byte: whether a match of the hex-bytes pattern can hold it: hex digits, the
#: ``0x``/``\\x`` prefixes, ``,`` and its ``\\s`` (the ASCII characters ``str.isspace``
#: accepts, as ``re`` does). Its assertions (``\\b``) consume nothing.
_HEX_SPAN_CLASS = np.zeros(256, dtype=bool)
_HEX_SPAN_CLASS[list(b"0123456789abcdefABCDEFx\\,")] = True
_HEX_SPAN_CLASS[[c for c in range(128) if chr(c).isspace()]] = True
#: The shortest match of each: 64 base64 characters; 8 units of two hex digits.
_B64_MIN, _HEX_MIN = 64, 16


def _class_runs(mask: np.ndarray, min_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)`` (int64) of the maximal runs of True in ``mask`` at least
    ``min_len`` long."""
    edges = np.diff(mask.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    keep = ends - starts >= min_len
    return starts[keep], ends[keep]


def _regex_runs(text: str) -> list[int]:
    """The length of every match of every :data:`ENCODED_PATTERNS` regex over the whole
    ``text`` (behind its :data:`_ENCODED_NEEDS` prefilter): the definition
    :func:`encoded_runs` computes faster on ASCII text, and its way on any other text."""
    return [n for k in range(len(ENCODED_PATTERNS)) for n in _pattern_runs(k, text)]


def _pattern_runs(k: int, text: str) -> list[int]:
    """The length of every match of ``ENCODED_PATTERNS[k]`` over the whole ``text``; none
    without its :data:`_ENCODED_NEEDS` substring."""
    needs = _ENCODED_NEEDS[k]
    return [] if needs is not None and needs not in text else \
        [m.end() - m.start() for m in ENCODED_PATTERNS[k].finditer(text)]


def _runs(text: str) -> list[int]:
    """:func:`_regex_runs` of ``text``, in another order, computed with numpy on ASCII text
    (``tests/test_quality.py`` compares the two): the base64 pattern, a greedy run of one
    class, matches exactly the maximal runs of that class of 64 or more (a scan reaches
    each run at its first character); a hex-bytes match holds only
    :data:`_HEX_SPAN_CLASS` characters, so it lies inside one maximal run of them of 16 or
    more, and the regex runs only there, with one character past the run's end visible to
    its final ``\\b`` (the ``\\b`` at the run's start sees the character before ``pos``)."""
    if not text.isascii():
        return _regex_runs(text)
    codes = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    starts, ends = _class_runs(_B64_CLASS[codes], _B64_MIN)
    runs = (ends - starts).tolist()
    n, hexes = len(text), ENCODED_PATTERNS[1]
    for a, b in zip(*(x.tolist() for x in _class_runs(_HEX_SPAN_CLASS[codes], _HEX_MIN))):
        runs += [m.end() - m.start() for m in hexes.finditer(text, a, min(n, b + 1))]
    return runs + _pattern_runs(2, text)


@dataclass(frozen=True)
class Rejection:
    """Why a file was rejected: the filter, the measured value and the threshold."""

    filter: str
    value: float
    threshold: float | str


#: The ASCII characters ``str.isspace`` accepts, and those ``str.isalpha`` rejects.
_ASCII_SPACE = bytes(c for c in range(128) if chr(c).isspace())
_ASCII_NON_ALPHA = bytes(c for c in range(128) if not chr(c).isalpha())


def count_nonspace(text: str) -> int:
    """Characters of ``text`` that are not ``str.isspace``: for ASCII text one
    ``bytes.translate`` pass in C, otherwise ``str.isspace`` on every character (``map``,
    no Python loop body); the same count as ``sum(not ch.isspace() for ch in text)``."""
    if text.isascii():
        return len(text.encode("ascii").translate(None, _ASCII_SPACE))
    return len(text) - sum(map(str.isspace, text))


def count_alpha(text: str) -> int:
    """Characters of ``text`` that are ``str.isalpha``, counted as :func:`count_nonspace` counts."""
    if text.isascii():
        return len(text.encode("ascii").translate(None, _ASCII_NON_ALPHA))
    return sum(map(str.isalpha, text))


def comment_ratio(text: str) -> float:
    """Fraction of non-blank characters that sit inside ``//`` or ``/* */`` comments."""
    nonblank = count_nonspace(text)
    if not nonblank:
        return 0.0
    in_comments = 0
    for m in _LEXEMES.finditer(text):
        tok = m.group(0)
        if tok.startswith("/"):
            in_comments += count_nonspace(tok)
    return in_comments / nonblank


_B64_RUN = re.compile(rb"[A-Za-z0-9+/=]{20,}")


def shannon_entropy(data: bytes) -> float:
    """Shannon entropy of a byte string in bits/byte (0.0 for empty input)."""
    n = len(data)
    if not n:
        return 0.0
    return -sum(c / n * math.log2(c / n) for c in Counter(data).values())


def high_entropy_coverage(data: bytes, max_entropy: float = 4.5) -> float:
    """Share of non-blank bytes inside base64-alphabet runs of ≥ 20 bytes whose entropy
    exceeds ``max_entropy`` bits/byte (4.5: detect-secrets' base64 limit)."""
    nonblank = len(data) - sum(data.count(c) for c in b" \t\r\n\f\v")
    if nonblank <= 0:
        return 0.0
    hot = sum(len(m.group(0)) for m in _B64_RUN.finditer(data) if shannon_entropy(m.group(0)) > max_entropy)
    return hot / nonblank


def alpha_fraction(text: str) -> float:
    """Alphabetic characters (``str.isalpha``) / all characters; 0.0 for empty text."""
    return count_alpha(text) / len(text) if text else 0.0


def encoded_runs(text: str) -> tuple[int, float]:
    """``(longest, share)``: the longest encoded-data run in characters and the share of
    ``text``'s characters inside runs (runs of different patterns may overlap; each
    pattern's runs are disjoint, so the share is capped at 1.0). ``(0, 0.0)`` for empty text."""
    if not text:
        return 0, 0.0
    runs = _runs(text)
    return max(runs, default=0), min(1.0, sum(runs) / len(text))


def check_file(path: str, data: bytes, s: Settings) -> tuple[str | None, Rejection | None]:
    """Run the filters in order on one file.

    Returns ``(text, None)`` for a kept file (``text`` decoded as UTF-8) or
    ``(None, Rejection)`` for the first filter that fails.
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in s.extensions:
        return None, Rejection("extension", 0.0, ",".join(s.extensions))
    size = len(data)
    if size > s.max_file_bytes:
        return None, Rejection("max_file_bytes", size, s.max_file_bytes)
    if size < s.min_file_bytes:
        return None, Rejection("min_file_bytes", size, s.min_file_bytes)
    if b"\x00" in data:
        return None, Rejection("nul_byte", data.index(b"\x00"), "none")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, Rejection("invalid_utf8", e.start, "strict utf-8")
    lines = text.splitlines()
    longest = max((len(x) for x in lines), default=0)
    if longest > s.max_line_length:
        return None, Rejection("max_line_length", longest, s.max_line_length)
    stripped = [x.strip() for x in lines if x.strip()]
    if stripped:
        ratio = len(set(stripped)) / len(stripped)
        if ratio <= s.min_unique_lines_ratio:
            return None, Rejection("unique_lines", round(ratio, 4), s.min_unique_lines_ratio)
    cr = comment_ratio(text)
    if cr >= s.max_comment_ratio:
        return None, Rejection("comment_ratio", round(cr, 4), s.max_comment_ratio)
    head = "\n".join(lines[: s.generated_marker_lines]).lower()
    for marker in s.generated_markers:
        if marker.lower() in head:
            return None, Rejection("generated", float(head.index(marker.lower())), marker)
    cov = high_entropy_coverage(data, s.max_entropy)
    if cov > s.max_entropy_coverage:
        return None, Rejection("entropy", round(cov, 4), f"{s.max_entropy} bits/byte over {s.max_entropy_coverage}")
    if len(lines) > s.max_lines:
        return None, Rejection("max_lines", len(lines), s.max_lines)
    mean = len(text) / max(1, len(lines))
    if mean > s.max_mean_line_length:
        return None, Rejection("mean_line_length", round(mean, 2), s.max_mean_line_length)
    alpha = alpha_fraction(text)
    if alpha < s.min_alpha_fraction:
        return None, Rejection("alpha_fraction", round(alpha, 4), s.min_alpha_fraction)
    longest, share = encoded_runs(text)
    if longest > s.max_encoded_run_chars:
        return None, Rejection("encoded_run", longest, s.max_encoded_run_chars)
    if share > s.max_encoded_share:
        return None, Rejection("encoded_share", round(share, 4), s.max_encoded_share)
    return text, None


KEPT_SCHEMA = pa.schema([
    ("doc_key", pa.string()), ("source", pa.string()), ("path", pa.string()),
    ("language", pa.string()), ("size", pa.int64()), ("content_sha256", pa.string()),
    ("text", pa.large_string()),
])
EXCLUSIONS_SCHEMA = pa.schema([
    ("doc_key", pa.string()), ("source", pa.string()), ("path", pa.string()), ("size", pa.int64()),
    ("stage", pa.string()), ("filter", pa.string()), ("value", pa.float64()), ("threshold", pa.string()),
])


def filter_files(source_files: pa.Table, s: Settings) -> tuple[pa.Table, pa.Table, dict]:
    """Apply the quality filters to a ``source_files`` table.

    Returns ``(kept, exclusions, figures)``: ``kept`` has KEPT_SCHEMA (decoded text),
    ``exclusions`` has EXCLUSIONS_SCHEMA with one row per rejected file, ``figures``
    has ``files_in``, ``files_out``, ``bytes_in``, ``bytes_out`` and ``rejected`` (a
    per-filter count over FILTERS). ``files_in == files_out + sum(rejected)``.
    """
    kept = {f.name: [] for f in KEPT_SCHEMA}
    excl = {f.name: [] for f in EXCLUSIONS_SCHEMA}
    rejected = {f: 0 for f in FILTERS}
    cols = source_files.to_pydict()
    bytes_out = 0
    for i, path in enumerate(cols["path"]):
        data = cols["content"][i]
        text, why = check_file(path, data, s)
        if why is None:
            kept["doc_key"].append(cols["doc_key"][i])
            kept["source"].append(cols["source"][i])
            kept["path"].append(path)
            kept["language"].append(cols["language"][i])
            kept["size"].append(cols["size"][i])
            kept["content_sha256"].append(cols["content_sha256"][i])
            kept["text"].append(text)
            bytes_out += cols["size"][i]
        else:
            rejected[why.filter] += 1
            excl["doc_key"].append(cols["doc_key"][i])
            excl["source"].append(cols["source"][i])
            excl["path"].append(path)
            excl["size"].append(cols["size"][i])
            excl["stage"].append("quality")
            excl["filter"].append(why.filter)
            excl["value"].append(float(why.value))
            excl["threshold"].append(str(why.threshold))
    figures = {
        "files_in": len(cols["path"]),
        "files_out": len(kept["path"]),
        "bytes_in": int(sum(cols["size"])),
        "bytes_out": int(bytes_out),
        "rejected": rejected,
    }
    return pa.table(kept, schema=KEPT_SCHEMA), pa.table(excl, schema=EXCLUSIONS_SCHEMA), figures
