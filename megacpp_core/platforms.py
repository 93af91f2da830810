"""Per-document platform labels: the ``platform_ids`` column (SPEC §4).

SPEC §4 asks for "about 113 labels over OS, RTOS, GPU, architecture, compiler, C++
standard; at most 20 per document, found by an Aho-Corasick scanner", ID 0 reserved. The
labels live in the versioned vocabulary ``megacpp_core/data/platforms/VERSION.json``
(:data:`VOCAB_VERSION` ``v1``: 113 labels, ids 1..113). Each label has an id, a dotted name
(``os.linux``, ``gpu.cuda``, ``arch.avx2``, ``std.cxx17``), a category (``os``, ``rtos``,
``gpu``, ``arch``, ``compiler``, ``std``) and the strings that indicate it:

``indicators``
    exact strings (``_WIN32``, ``__CUDACC__``, ``<arm_neon.h>``) matched at identifier
    boundaries: an indicator whose first character is an identifier character
    (``[A-Za-z0-9_]``, ASCII) does not match right after another identifier character, and
    one whose last character is an identifier character does not match right before one.
    So ``__linux__`` does not match in ``my__linux__x``, ``_WIN32`` not in ``_WIN32_WINNT``
    and ``__GNUC__`` not in ``__GNUC_MINOR__`` — both of which are Windows and GCC
    indicators of their own, listed separately.
``prefixes``
    strings that start an identifier family and may be followed by identifier characters
    (``_mm256_`` matches ``_mm256_add_ps``, ``vld1q_`` matches ``vld1q_f32``); the left
    boundary still applies (``x_mm256_`` does not match).

An indicator string belongs to one label unless the file's ``shared_indicators`` declares
exactly which labels share it (``__MINGW32__`` means both ``compiler.mingw`` and
``os.windows``). IDs are append-only: a label keeps its id for ever, new labels go at the
end, nothing is renumbered; :func:`load_vocabulary` refuses a file whose ids are not
exactly ``1..N`` in order, so a deletion cannot silently shift ids.

Standard tests with a numeric value — ``__cplusplus >= 201703L``, ``_MSVC_LANG > 201402L``,
``__STDC_VERSION__ >= 201112L``, also written value-first — are recognised by a small regex
(:data:`VERSION_TEST`) and not by the Aho-Corasick automaton, because the label depends on
the number *and* the operator: the value may be any ``YYYYMM`` (draft values such as
``201406L`` or ``201500L`` mean the next standard), with or without an ``L``/``UL``
suffix and any spacing, and ``> 201402L`` means C++17 while ``>= 201402L`` means C++14 —
a fixed string set cannot express that. The rule (:func:`standard_for_test`): take the
value, plus one for ``>``; the label is the first standard whose value is at least that
(``199711L`` cxx98, ``201103L`` cxx11, ``201402L`` cxx14, ``201703L`` cxx17, ``202002L``
cxx20, ``202302L`` cxx23, anything later cxx26; for C ``199901L`` c99, ``201112L`` c11,
``201710L`` c17, ``202311L`` c23, C95's ``199409L`` and anything after C23 give no label).
``<``, ``<=``, ``==`` and ``!=`` name the standard of the value they compare against. The
exact values with an ``L`` suffix are also plain ``std.*`` indicators (so
``#if MY_CXX >= 201703L`` counts), hence ``__cplusplus > 201402L`` yields both cxx14 and
cxx17: the document tests the boundary between them.

Scanning (:func:`scan_platforms`) returns the sorted unique label ids found in a text. When
more than ``max_labels`` (:data:`MAX_LABELS_PER_DOCUMENT`, 20, SPEC §4) are found, the
labels are ranked (:func:`rank`) by their number of valid matches, descending — the
platforms a document is written for outweigh those it merely mentions in a portability
``#if`` chain — then by the offset of their first match (in code points), then by id; the
first ``max_labels`` are kept and returned sorted by id. The result depends only on the
text and the vocabulary bytes.
IDs fit ``uint16`` (the packed-row column is ``list<uint16>``; :func:`load_vocabulary`
refuses more than 65,535 labels). The scanner (one hyperscan database of the indicators
and the version macros) is built once per process and vocabulary.
This module does not import Dagster.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .keyscan import LiteralScanner


#: Version of the vocabulary file in use: ``megacpp_core/data/platforms/VOCAB_VERSION.json``.
VOCAB_VERSION = "v1"
#: At most this many labels per document (SPEC §4).
MAX_LABELS_PER_DOCUMENT = 20
#: Reserved id: no label / padding (SPEC §4). Never emitted by the scanner.
NONE_ID = 0
NONE_NAME = "none"
#: Largest id the ``list<uint16>`` column can hold.
MAX_LABEL_ID = 0xFFFF

_IDENT = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_NAME = re.compile(r"^[a-z][a-z0-9]*\.[a-z0-9][a-z0-9_]*$")
_VERSION = re.compile(r"^v[0-9]+$")
_TOP_KEYS = {"version", "title", "notes", "reserved", "categories", "shared_indicators", "labels"}
_LABEL_KEYS = {"id", "name", "category", "description", "indicators", "prefixes"}

#: Numeric standard tests: ``MACRO OP VALUE`` or ``VALUE OP MACRO`` (see the module docstring).
#: Each optional parenthesis comes with its own trailing ``\s*`` so that no two adjacent
#: ``\s*`` can split a run of blanks between them (no quadratic backtracking).
VERSION_TEST = re.compile(
    r"(?<![A-Za-z0-9_])(__cplusplus|_MSVC_LANG|__STDC_VERSION__)\s*(?:\)\s*)?(>=|<=|==|!=|>|<)\s*(?:\(\s*)?"
    r"([0-9]{6})[lLuU]{0,3}(?![A-Za-z0-9_])"
    r"|(?<![A-Za-z0-9_])([0-9]{6})[lLuU]{0,3}\s*(>=|<=|==|!=|>|<)\s*(?:\(\s*)?"
    r"(__cplusplus|_MSVC_LANG|__STDC_VERSION__)(?![A-Za-z0-9_])")
#: The macros a :data:`VERSION_TEST` match holds exactly one of, and every other character
#: such a match can hold (with whitespace): a match lies inside the run of these characters
#: around one macro occurrence (:func:`version_windows`).
VERSION_MACROS = ("__cplusplus", "_MSVC_LANG", "__STDC_VERSION__")
_TEST_CHARS = frozenset("()<>=!0123456789lLuU")
_FLIP = {">": "<", ">=": "<=", "<": ">", "<=": ">=", "==": "==", "!=": "!="}
#: (standard value, label name) in order; a value past the last entry maps to the overflow label.
CXX_STANDARDS = ((199711, "std.cxx98"), (201103, "std.cxx11"), (201402, "std.cxx14"), (201703, "std.cxx17"),
                 (202002, "std.cxx20"), (202302, "std.cxx23"))
CXX_OVERFLOW = "std.cxx26"
#: C95 (199409L) has no label; values after C23 have none either in v1.
C_STANDARDS = ((199409, None), (199901, "std.c99"), (201112, "std.c11"), (201710, "std.c17"), (202311, "std.c23"))
C_OVERFLOW = None


@dataclass(frozen=True)
class Indicator:
    """One indicator string: ``text``, the ``label_ids`` it stands for (one, or several when
    declared in ``shared_indicators``), and ``prefix`` (True: may run on into a longer
    identifier)."""

    text: str
    label_ids: tuple[int, ...]
    prefix: bool


@dataclass(frozen=True)
class PlatformVocabulary:
    """A loaded, validated platform vocabulary.

    ``labels``: ``(id, name, category)`` for ids ``1..N`` in id order (id 0, ``none``, is
    reserved and not listed); ``sha256``: hex SHA-256 of the JSON file's bytes (record it
    next to the ``platform_ids`` column); ``version``: ``v1``…; ``indicators``: every
    indicator string, sorted by text; ``categories``: category names in file order;
    ``source``: where the file was read from.
    """

    version: str
    sha256: str
    labels: tuple[tuple[int, str, str], ...]
    indicators: tuple[Indicator, ...]
    categories: tuple[str, ...]
    source: str

    @property
    def size(self) -> int:
        """Number of labels N (ids ``1..N``)."""
        return len(self.labels)

    @functools.cached_property
    def _by_name(self) -> dict[str, int]:
        return {name: i for i, name, _ in self.labels}

    def id_of(self, name: str) -> int:
        """Id of the label called ``name``; ``KeyError`` naming the vocabulary when absent."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"platform vocabulary {self.version}: no label {name!r}") from None

    def name_of(self, label_id: int) -> str:
        """Name of id ``label_id`` (``none`` for 0); ``ValueError`` outside ``0..N``."""
        if isinstance(label_id, bool) or not isinstance(label_id, int):
            try:
                label_id = int(label_id)  # numpy / pyarrow integers
            except (TypeError, ValueError):
                raise ValueError(f"platform vocabulary {self.version}: id {label_id!r} is not an integer") from None
        if label_id == NONE_ID:
            return NONE_NAME
        if not 1 <= label_id <= len(self.labels):
            raise ValueError(f"platform vocabulary {self.version}: id {label_id} outside 0..{len(self.labels)}")
        return self.labels[label_id - 1][1]

    def category_of(self, label_id: int) -> str:
        """Category of id ``label_id`` (``ValueError`` outside ``1..N``)."""
        self.name_of(label_id)
        if label_id == NONE_ID:
            raise ValueError(f"platform vocabulary {self.version}: id 0 is reserved and has no category")
        return self.labels[int(label_id) - 1][2]


# ---------------------------------------------------------------------------------------------
# loading and validation


def vocabulary_path(version: str = VOCAB_VERSION):
    """The packaged vocabulary file of ``version`` (a ``Traversable``); ``ValueError`` for a
    malformed version string."""
    if not isinstance(version, str) or not _VERSION.match(version):
        raise ValueError(f"platform vocabulary version {version!r} is not of the form v<N>")
    return resources.files("megacpp_core") / "data" / "platforms" / f"{version}.json"


def load_vocabulary(version: str = VOCAB_VERSION, path: str | Path | None = None) -> PlatformVocabulary:
    """Load and validate a platform vocabulary.

    Without ``path`` the packaged ``data/platforms/VERSION.json`` is read once per process
    (cached). With ``path`` that file is read (not cached, for tests and reviews of an
    edited copy); its ``version`` field must equal ``version``.

    Raises ``ValueError`` (the message names the file and the offending label or string)
    when the file is unreadable or not a JSON object; the version differs; ``reserved`` does
    not reserve id 0 as ``none``; a label lacks a field or has an unknown one; an id is not
    an integer, is 0, repeats, or the ids are not exactly ``1..N`` in file order (a gap, a
    duplicate or a reordering); N exceeds 65,535 (``uint16``); a name is malformed,
    repeated, ``none`` or does not start with its category; a category is undeclared; a
    label has no indicator at all; an indicator is empty, not a string, or listed twice;
    an indicator string is claimed by two labels without a ``shared_indicators`` entry
    naming exactly those labels (or with different exact/prefix kinds), or a
    ``shared_indicators`` entry is not claimed as declared.
    """
    if path is None:
        return _load_packaged(version)
    return _load(version, Path(path))


@functools.lru_cache(maxsize=None)
def _load_packaged(version: str) -> PlatformVocabulary:
    return _load(version, vocabulary_path(version))


def _load(version: str, src) -> PlatformVocabulary:
    if not isinstance(version, str) or not _VERSION.match(version):
        raise ValueError(f"platform vocabulary version {version!r} is not of the form v<N>")
    try:
        raw = src.read_bytes()
    except OSError as e:
        raise ValueError(f"platform vocabulary {version} not readable at {src}: {e}") from None
    return _parse(raw, version, str(src))


def _parse(raw: bytes, version: str, where: str) -> PlatformVocabulary:
    def fail(msg: str) -> ValueError:
        return ValueError(f"platform vocabulary {where}: {msg}")

    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise fail(f"not valid UTF-8 JSON: {e}") from None
    if not isinstance(data, dict):
        raise fail("top level is not an object")
    if missing := {"version", "labels", "categories"} - set(data):
        raise fail(f"missing keys {sorted(missing)}")
    if unknown := set(data) - _TOP_KEYS:
        raise fail(f"unknown keys {sorted(unknown)}")
    if data["version"] != version:
        raise fail(f"file says version {data['version']!r}, expected {version!r}")
    reserved = data.get("reserved", {"0": NONE_NAME})
    if reserved != {"0": NONE_NAME}:
        raise fail(f"'reserved' must be {{\"0\": \"none\"}} (id 0 is reserved for no label), got {reserved!r}")
    cats = data["categories"]
    if not isinstance(cats, dict) or not cats or not all(isinstance(c, str) and _NAME.match(c + ".x") for c in cats):
        raise fail("'categories' must be a non-empty object of lower-case category names")
    labels_raw = data["labels"]
    if not isinstance(labels_raw, list) or not labels_raw:
        raise fail("'labels' must be a non-empty list")
    if len(labels_raw) > MAX_LABEL_ID:
        raise fail(f"{len(labels_raw)} labels do not fit uint16 ids (at most {MAX_LABEL_ID})")

    labels: list[tuple[int, str, str]] = []
    claims: dict[str, list[tuple[int, str, bool]]] = {}
    seen_ids: set[int] = set()
    names: set[str] = set()
    for pos, lab in enumerate(labels_raw):
        at = f"labels[{pos}]"
        if not isinstance(lab, dict):
            raise fail(f"{at} is not an object")
        if missing := {"id", "name", "category", "indicators"} - set(lab):
            raise fail(f"{at} lacks {sorted(missing)}")
        if unknown := set(lab) - _LABEL_KEYS:
            raise fail(f"{at} has unknown keys {sorted(unknown)}")
        lid, name, cat = lab["id"], lab["name"], lab["category"]
        if isinstance(lid, bool) or not isinstance(lid, int):
            raise fail(f"{at}: id {lid!r} is not an integer")
        if lid == NONE_ID:
            raise fail(f"{at}: id 0 is reserved for 'none' and cannot be a label")
        if lid in seen_ids:
            raise fail(f"{at}: duplicate id {lid}")
        if lid != pos + 1:
            raise fail(f"{at}: id {lid} where {pos + 1} is expected — ids must be exactly 1..N in file order "
                       f"(append-only: no gaps, no reordering)")
        seen_ids.add(lid)
        if not isinstance(name, str) or not _NAME.match(name):
            raise fail(f"{at}: name {name!r} is not of the form category.label (lower case)")
        if name in names:
            raise fail(f"{at}: duplicate name {name!r}")
        names.add(name)
        if cat not in cats:
            raise fail(f"{at} ({name}): category {cat!r} is not declared in 'categories'")
        if name.split(".", 1)[0] != cat:
            raise fail(f"{at}: name {name!r} does not start with its category {cat!r}")
        exact, prefixes = lab["indicators"], lab.get("prefixes", [])
        for kind, lst in (("indicators", exact), ("prefixes", prefixes)):
            if not isinstance(lst, list) or not all(isinstance(s, str) and s.strip() == s and s for s in lst):
                raise fail(f"{at} ({name}): '{kind}' must be a list of non-empty strings without outer whitespace")
        if not exact and not prefixes:
            raise fail(f"{at} ({name}): has no indicator (both 'indicators' and 'prefixes' are empty)")
        own = exact + prefixes
        if len(set(own)) != len(own):
            dup = next(s for s in own if own.count(s) > 1)
            raise fail(f"{at} ({name}): indicator {dup!r} is listed twice")
        for s in exact:
            claims.setdefault(s, []).append((lid, name, False))
        for s in prefixes:
            claims.setdefault(s, []).append((lid, name, True))
        labels.append((lid, name, cat))

    shared = data.get("shared_indicators", {})
    if not isinstance(shared, dict) or not all(isinstance(v, list) for v in shared.values()):
        raise fail("'shared_indicators' must map an indicator string to the list of label names sharing it")
    indicators: list[Indicator] = []
    for text in sorted(claims):
        who = claims[text]
        if len(who) > 1:
            declared = shared.get(text)
            if declared is None:
                raise fail(f"indicator {text!r} is claimed by {', '.join(n for _, n, _ in who)} but not declared "
                           f"in 'shared_indicators'")
            if sorted(declared) != sorted(n for _, n, _ in who):
                raise fail(f"indicator {text!r}: 'shared_indicators' lists {sorted(declared)}, but it is claimed by "
                           f"{sorted(n for _, n, _ in who)}")
            if len({p for _, _, p in who}) != 1:
                raise fail(f"indicator {text!r} is a prefix for some of its labels and exact for others")
        indicators.append(Indicator(text, tuple(sorted(i for i, _, _ in who)), who[0][2]))
    for text, declared in shared.items():
        if len(claims.get(text, ())) < 2:
            raise fail(f"'shared_indicators' declares {text!r} for {declared}, but it is claimed by "
                       f"{[n for _, n, _ in claims.get(text, ())] or 'no label'}")
    return PlatformVocabulary(version=version, sha256=hashlib.sha256(raw).hexdigest(), labels=tuple(labels),
                              indicators=tuple(indicators), categories=tuple(cats), source=where)


# ---------------------------------------------------------------------------------------------
# scanning


def standard_for_test(macro: str, op: str, value: int) -> str | None:
    """Label name for a numeric standard test ``macro op value`` (macro first; see the
    module docstring), e.g. ``("__cplusplus", ">", 201402)`` → ``"std.cxx17"``; ``None``
    when the vocabulary has no label for it (C95, post-C23). ``ValueError`` for an unknown
    macro or operator."""
    if op not in _FLIP:
        raise ValueError(f"unknown comparison operator {op!r}")
    if macro in ("__cplusplus", "_MSVC_LANG"):
        table, overflow = CXX_STANDARDS, CXX_OVERFLOW
    elif macro == "__STDC_VERSION__":
        table, overflow = C_STANDARDS, C_OVERFLOW
    else:
        raise ValueError(f"{macro!r} is not a standard version macro")
    want = value + 1 if op == ">" else value
    for std_value, name in table:
        if std_value >= want:
            return name
    return overflow


def version_windows(text: str, macros: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Where :data:`VERSION_TEST` can match in ``text``, given every occurrence
    ``(start, end)`` of a :data:`VERSION_MACROS` name in it: the maximal runs of whitespace
    (``str.isspace``, what ``\\s`` matches), parentheses, comparison operators, ASCII
    digits and ``lLuU`` around each occurrence, merged where they overlap; ``[(start,
    end)]`` sorted, disjoint. Every match lies inside one window (it holds one macro and
    only such characters), so ``VERSION_TEST.finditer(text, start, end + 1)`` over the
    windows (the extra character for the final look-ahead) yields exactly the matches of
    ``finditer(text)``: no match crosses a window's edge, and the look-behind sees the
    character before ``start``."""
    n = len(text)
    out: list[list[int]] = []
    for s, e in sorted(macros):
        while s > 0 and (text[s - 1] in _TEST_CHARS or text[s - 1].isspace()):
            s -= 1
        while e < n and (text[e] in _TEST_CHARS or text[e].isspace()):
            e += 1
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


class _Scanner:
    """The indicators of one vocabulary and the :data:`VERSION_MACROS` as one multi-literal
    scanner (:class:`megacpp_core.keyscan.LiteralScanner`: a hyperscan database, or a
    pyahocorasick automaton without hyperscan; the same matches either way) plus the ids
    of the std labels."""

    def __init__(self, vocab: PlatformVocabulary):
        self.vocab = vocab
        self.rules = [(len(ind.text), ind.label_ids, ind.text[0] in _IDENT, not ind.prefix and ind.text[-1] in _IDENT,
                       ind.text) for ind in vocab.indicators]
        self.literals = LiteralScanner([ind.text for ind in vocab.indicators] + list(VERSION_MACROS))
        wanted = [n for _, n in CXX_STANDARDS + C_STANDARDS] + [CXX_OVERFLOW, C_OVERFLOW]
        self.std_ids = {name: i for i, name, _ in vocab.labels if name in wanted}

    def matches(self, text: str):
        """Yield ``(start, label_ids, what)`` for every valid match, indicators (by start)
        then standard tests (:data:`VERSION_TEST`, searched only in :func:`version_windows`)."""
        n = len(text)
        rules, n_rules = self.rules, len(self.rules)
        macros = []
        for start, k in self.literals.hits(text):
            if k >= n_rules:
                macros.append((start, start + len(VERSION_MACROS[k - n_rules])))
                continue
            length, ids, left, right, word = rules[k]
            end = start + length - 1
            if left and start > 0 and text[start - 1] in _IDENT:
                continue
            if right and end + 1 < n and text[end + 1] in _IDENT:
                continue
            yield start, ids, word
        for lo, hi in version_windows(text, macros):
            for m in VERSION_TEST.finditer(text, lo, min(n, hi + 1)):
                if m.group(1):
                    macro, op, value = m.group(1), m.group(2), int(m.group(3))
                else:
                    macro, op, value = m.group(6), _FLIP[m.group(5)], int(m.group(4))
                name = standard_for_test(macro, op, value)
                if name in self.std_ids:
                    yield m.start(), (self.std_ids[name],), f"{macro} {op} {value}"

    def evidence(self, text: str) -> dict[int, tuple[int, int]]:
        acc: dict[int, list[int]] = {}
        for start, ids, _ in self.matches(text):
            for i in ids:
                e = acc.get(i)
                if e is None:
                    acc[i] = [1, start]
                else:
                    e[0] += 1
                    if start < e[1]:
                        e[1] = start
        return {i: (c, f) for i, (c, f) in acc.items()}


_SCANNERS: dict[str, _Scanner] = {}


def _scanner(vocab: PlatformVocabulary | None) -> _Scanner:
    vocab = vocab or load_vocabulary()
    sc = _SCANNERS.get(vocab.sha256)
    if sc is None:
        sc = _SCANNERS[vocab.sha256] = _Scanner(vocab)
    return sc


def _as_text(text: str | bytes) -> str:
    if isinstance(text, str):
        return text
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text).decode("utf-8", errors="surrogateescape")
    raise TypeError(f"expected str or bytes, got {type(text).__name__}")


def evidence(text: str | bytes, vocab: PlatformVocabulary | None = None) -> dict[int, tuple[int, int]]:
    """``{label id: (matches, first offset)}`` for every label found in ``text``: the number
    of valid matches (indicator occurrences plus numeric standard tests) and the start of
    the earliest one, in code points of the text (``bytes`` are decoded as UTF-8 with
    ``surrogateescape``, so offsets count decoded characters). No cap applied.
    ``TypeError`` for anything but ``str``/``bytes``."""
    return _scanner(vocab).evidence(_as_text(text))


def scan_platforms(text: str | bytes, vocab: PlatformVocabulary | None = None,
                   max_labels: int = MAX_LABELS_PER_DOCUMENT) -> list[int]:
    """The platform label ids of one document: sorted, unique, each in ``1..N``, at most
    ``max_labels`` (default :data:`MAX_LABELS_PER_DOCUMENT` = 20, SPEC §4).

    ``text`` is the document (``str``; ``bytes`` are decoded as UTF-8 with
    ``surrogateescape``); any content is accepted, including NULs and lone surrogates.
    ``vocab`` defaults to :func:`load_vocabulary` (``v1``). When more than ``max_labels``
    labels are found, :func:`rank` decides which are kept: most matches first, then the
    earliest first match, then the lower id; the kept ids are returned sorted. Returns
    Python ints that fit ``uint16``. Raises ``TypeError`` for other input types and
    ``ValueError`` for a negative ``max_labels``.
    """
    if isinstance(max_labels, bool) or not isinstance(max_labels, int) or max_labels < 0:
        raise ValueError(f"max_labels must be a non-negative integer, got {max_labels!r}")
    ev = evidence(text, vocab)
    if len(ev) > max_labels:
        return sorted(rank(ev)[:max_labels])
    return sorted(ev)


def rank(ev: dict[int, tuple[int, int]]) -> list[int]:
    """Label ids of an :func:`evidence` dict, best first: by number of matches
    (descending), then offset of the first match (ascending), then id (ascending). A total
    order, so the cap of :func:`scan_platforms` is deterministic."""
    return sorted(ev, key=lambda i: (-ev[i][0], ev[i][1], i))


def scan_many(texts: Iterable[str | bytes], vocab: PlatformVocabulary | None = None,
              max_labels: int = MAX_LABELS_PER_DOCUMENT) -> list[list[int]]:
    """:func:`scan_platforms` of each text, in order: one sorted id list per text."""
    sc = _scanner(vocab)
    return [scan_platforms(t, sc.vocab, max_labels) for t in texts]


def explain(text: str | bytes, vocab: PlatformVocabulary | None = None) -> dict[str, list[str]]:
    """Why each label was found: ``{label name: [matched indicator strings, first match
    first]}``; numeric standard tests appear as ``"__cplusplus >= 201703"``. Ordered by the
    label's first occurrence; no cap applied. For reviewing the vocabulary."""
    sc = _scanner(vocab)
    hits: dict[int, tuple[int, list[str]]] = {}
    for start, ids, what in sorted(sc.matches(_as_text(text)), key=lambda m: m[0]):
        for i in ids:
            first, words = hits.setdefault(i, (start, []))
            if what not in words:
                words.append(what)
    return {sc.vocab.name_of(i): words for i, (_, words) in sorted(hits.items(), key=lambda kv: (kv[1][0], kv[0]))}


def label_names(ids: Iterable[int], vocab: PlatformVocabulary | None = None) -> list[str]:
    """Names of ``ids`` in the given order (``none`` for the reserved 0); ``ValueError``
    for an id outside ``0..N``. Accepts any iterable of integers (lists, numpy arrays)."""
    v = vocab or load_vocabulary()
    return [v.name_of(i) for i in ids]


def figures(id_lists: Sequence[Iterable[int]], vocab: PlatformVocabulary | None = None) -> dict[str, Any]:
    """Dataset-card figures of a set of documents' ``platform_ids``.

    ``id_lists``: one iterable of label ids per document (0 is ignored as padding). Returns
    a JSON-ready dict: ``vocabulary`` (version), ``vocabulary_sha256``, ``labels`` (N),
    ``documents``, ``labelled_documents`` (at least one label), ``labels_assigned``
    (total), ``mean_labels_per_document``, ``max_labels_per_document``, ``at_cap``
    (documents holding exactly :data:`MAX_LABELS_PER_DOCUMENT` labels), ``per_label``
    (``{name: documents}``, labels that occur, by count descending then name) and
    ``per_category`` (``{category: documents with a label of it}``, every category).
    ``ValueError`` for an id outside ``0..N``.
    """
    v = vocab or load_vocabulary()
    per_label = [0] * (v.size + 1)
    per_cat = {c: 0 for c in v.categories}
    docs = labelled = total = biggest = at_cap = 0
    for ids in id_lists:
        docs += 1
        uniq = {int(i) for i in ids} - {NONE_ID}
        for i in uniq:
            v.name_of(i)  # range check
            per_label[i] += 1
        for c in {v.category_of(i) for i in uniq}:
            per_cat[c] += 1
        labelled += bool(uniq)
        total += len(uniq)
        biggest = max(biggest, len(uniq))
        at_cap += len(uniq) == MAX_LABELS_PER_DOCUMENT
    order = sorted((i for i in range(1, v.size + 1) if per_label[i]), key=lambda i: (-per_label[i], v.name_of(i)))
    return {
        "vocabulary": v.version,
        "vocabulary_sha256": v.sha256,
        "labels": v.size,
        "documents": docs,
        "labelled_documents": labelled,
        "labels_assigned": total,
        "mean_labels_per_document": total / docs if docs else 0.0,
        "max_labels_per_document": biggest,
        "at_cap": at_cap,
        "per_label": {v.name_of(i): per_label[i] for i in order},
        "per_category": per_cat,
    }
