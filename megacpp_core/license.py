"""Stage 2: license scan and per-file accept/refuse decision (SPEC §4).

Evidence, strongest first, for each candidate file:

1. ``spdx_header``: an ``SPDX-License-Identifier: <expr>`` line in the file's first
   :data:`SPDX_SCAN_LINES` lines, parsed with ``license_expression``'s SPDX licensing.
2. ``file_header``: the file's leading comment block (at most :data:`HEADER_MAX_CHARS`
   characters), scanned with ScanCode once per distinct normalized header. Three
   corrections of ScanCode's reading of short notices, each measured on real headers
   (``bench/license_truth.py``): sentences stating *another* file's license are dropped
   before the scan (:func:`mentions_other_file`); a detection resting on a match below
   ScanCode's own clue coverage is re-read sentence by sentence (:meth:`Scanner.scan_text`);
   a notice that states a choice between licenses ("dual-licensed", "under either") gets
   the ``OR`` of its matches instead of their ``AND``.
3. ``directory_license``: license-like files (:func:`is_license_file`) of the nearest
   ancestor directory whose license files yield a detection.
4. ``default``: nothing found; the class is ``unknown``.

Whole source files are never scanned: ScanCode needs ~50 s on a 1 MB amalgamated C file.

License classes, ordered from most to least permissive (:data:`CLASS_ORDER`):
``permissive < weak_copyleft < gpl2 < unknown < refused``. An ``OR`` takes its most
permissive operand, an ``AND`` its least permissive one, ``X WITH exception`` takes the
class of ``X``. Symbols that are statements about licensing rather than licenses (CLA,
patent grants, warranty disclaimers, "see the LICENSE file" references) are neutral:
they are dropped from the expression before combining; an expression of neutral symbols
only is ``unknown``.

Symbol classes come from the ScanCode LicenseDB category vendored with
``license_expression`` (see :data:`CATEGORY_CLASS`), with ScanCode's own license DB as
the fallback for keys the vendored index does not know yet.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from license_expression import (
    OR,
    ExpressionError,
    LicenseSymbol,
    LicenseWithExceptionSymbol,
    get_license_index,
    get_spdx_licensing,
)

from .license_scancode import ResultStore, run_scancode, load as load_scancode

#: License classes from most to least permissive (SPEC §4).
CLASS_ORDER = ("permissive", "weak_copyleft", "gpl2", "unknown", "refused")
_RANK = {c: i for i, c in enumerate(CLASS_ORDER)}
_NEUTRAL = "neutral"

#: ScanCode LicenseDB category -> license class. Source: the category vocabulary of
#: https://scancode-licensedb.aboutcode.org/ (vendored by ``license_expression``).
#: ``Copyleft`` maps to ``refused`` except the GPL-2.0 family, which is ``gpl2``.
CATEGORY_CLASS = {
    "Permissive": "permissive",
    "Public Domain": "permissive",
    "Copyleft Limited": "weak_copyleft",
    "Copyleft": "refused",
    "Commercial": "refused",
    "Proprietary Free": "refused",
    "Source-available": "refused",
    "Free Restricted": "refused",
    "Unstated License": "unknown",
    "CLA": _NEUTRAL,
    "Patent License": _NEUTRAL,
}

#: ``Unstated License`` keys that are notices about licensing, not licenses (neutral).
NEUTRAL_KEYS = frozenset(
    k.lower()
    for k in (
        "LicenseRef-scancode-unknown-license-reference",
        "LicenseRef-scancode-warranty-disclaimer",
        "LicenseRef-scancode-generic-exception",
        "LicenseRef-scancode-generic-export-compliance",
        "LicenseRef-scancode-generic-tos",
        "LicenseRef-scancode-generic-trademark",
        "LicenseRef-scancode-here-disclaimer",
    )
)

#: Per-file decisions (SPEC §4).
DECISIONS = ("accept", "accept_tagged", "refuse")
#: Where a file's decision came from, strongest evidence first: its own
#: ``SPDX-License-Identifier``, its own license header, the nearest directory license,
#: nothing (``default``), or the snapshot's refusal list of sources.
ORIGINS = ("spdx_header", "file_header", "directory_license", "default", "refusal_list")

#: Lines searched for an ``SPDX-License-Identifier`` (the SPDX spec asks for it near the top).
SPDX_SCAN_LINES = 30
#: Longest leading comment block handed to ScanCode, in characters.
HEADER_MAX_CHARS = 4096

_SPDX_LINE = re.compile(r"SPDX-License-Identifier:\s*(.+)")
_LICENSE_NAME = re.compile(r"(?i)^(licen[cs]e|copying|notice|readme)([._-].*)?$")
_PRIMARY_NAME = re.compile(r"(?i)^(licen[cs]e|copying)")
#: Source extensions never treated as license files even when named ``license.c`` etc.
_SOURCE_EXT = frozenset(".c .h .cc .cpp .cxx .c++ .hh .hpp .hxx .h++ .inl .ipp .tpp .py .pyx".split())
_SPACE = re.compile(r"\s*")
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_GUARD = re.compile(r"#\s*(pragma\s+once|ifndef\s+\w+|define\s+\w+)[ \t]*(?=\n|$)")
#: Words found in (nearly) every license notice; a header paragraph without one is not scanned.
_KEYWORD = re.compile(
    r"(?i)licen[cs]|spdx|public[\s-]*domain|warrant|permission|permitted|distribut|free software"
    r"|\bgpl|proprietary|confidential|copyleft|disclaims?\s+copyright"
)
_COPYRIGHT_LINE = re.compile(r"(?i)^(?:portions\s+)?(?:copyright\b|\(c\)|\u00a9)")
_MARKERS = re.compile(r"^\s*(?:/\*+|\*+/|//+|\*+(?!/))?!?|\*+/\s*$")


@dataclass(frozen=True)
class LicensePolicy:
    """What to do with each license class (SPEC §4 defaults; per snapshot from its settings).

    ``weak_copyleft_decision`` (default ``accept``), ``gpl2_decision`` (default
    ``accept_tagged``) and ``unknown_decision`` (default ``refuse``, failing safe): the
    decision, one of :data:`DECISIONS`, for that class; ``permissive`` is always accepted
    and ``refused`` always refused. ``refused_sources``: source names whose files are all
    refused unscanned. ``extra_permissive`` / ``extra_refused``: SPDX ids
    (case-insensitive) forced to that class before the category lookup. Raises
    ``ValueError`` on an invalid decision.
    """

    unknown_decision: str = "refuse"
    refused_sources: frozenset[str] = frozenset()
    extra_permissive: frozenset[str] = frozenset()
    extra_refused: frozenset[str] = frozenset()
    weak_copyleft_decision: str = "accept"
    gpl2_decision: str = "accept_tagged"

    def __post_init__(self) -> None:
        for name in ("unknown_decision", "weak_copyleft_decision", "gpl2_decision"):
            if getattr(self, name) not in DECISIONS:
                raise ValueError(f"{name}={getattr(self, name)!r}; expected one of {DECISIONS}")


@lru_cache(maxsize=1)
def _licensing():
    return get_spdx_licensing()


@lru_cache(maxsize=1)
def _vendored_categories() -> dict[str, str]:
    """Lower-cased SPDX id (and aliases) -> ScanCode category, from the vendored index."""
    out: dict[str, str] = {}
    for lic in get_license_index():
        for key in [lic.get("spdx_license_key")] + list(lic.get("other_spdx_license_keys") or []):
            if key and lic.get("category"):
                out.setdefault(key.lower(), lic["category"])
    return out


@lru_cache(maxsize=1)
def _scancode_categories() -> dict[str, str]:
    """Same mapping from the installed ScanCode's license DB (part of the cache its index is
    in: loaded once per process by :func:`~megacpp_core.license_scancode.load`, 2.8–2.9 s)."""
    from licensedcode.cache import get_licenses_db

    load_scancode()

    db = get_licenses_db().values()
    return {lic.spdx_license_key.lower(): lic.category for lic in db if lic.spdx_license_key}


def _category(key: str) -> str | None:
    cat = _vendored_categories().get(key)
    if cat is None and key.startswith("licenseref-scancode-"):  # newer than the vendored index
        cat = _scancode_categories().get(key)
    return cat


def _symbol_class(key: str, policy: LicensePolicy) -> str:
    key = key.lower()
    if key in {k.lower() for k in policy.extra_permissive}:
        return "permissive"
    if key in {k.lower() for k in policy.extra_refused}:
        return "refused"
    if key in NEUTRAL_KEYS:
        return _NEUTRAL
    cat = _category(key)
    if cat == "Copyleft" and (key == "gpl-2.0" or key.startswith(("gpl-2.0-", "gpl-2.0+"))):
        return "gpl2"
    return CATEGORY_CLASS.get(cat, "unknown")


def _node_class(node, policy: LicensePolicy) -> str:
    if isinstance(node, LicenseWithExceptionSymbol):
        return _symbol_class(node.license_symbol.key, policy)
    if isinstance(node, LicenseSymbol):
        return _symbol_class(node.key, policy)
    classes = [c for c in (_node_class(a, policy) for a in node.args) if c != _NEUTRAL]
    if not classes:
        return _NEUTRAL
    return (min if isinstance(node, OR) else max)(classes, key=_RANK.__getitem__)


def _parse(expr: str | None):
    if not expr or not expr.strip():
        return None
    try:
        return _licensing().parse(expr)
    except ExpressionError:
        return None


def parse_expression(expr: str | None) -> str | None:
    """Canonical SPDX rendering of ``expr`` (aliases resolved, e.g. ``GPL-2.0+`` ->
    ``GPL-2.0-or-later``), or ``None`` when empty or unparsable."""
    parsed = _parse(expr)
    return None if parsed is None else str(parsed)


def classify_expression(expr: str | None, policy: LicensePolicy | None = None) -> str:
    """License class (one of :data:`CLASS_ORDER`) of an SPDX expression string.

    ``None``, empty, unparsable or neutral-only expressions are ``unknown``; unknown keys
    are ``unknown``. Never raises on bad input.
    """
    parsed = _parse(expr)
    cls = _NEUTRAL if parsed is None else _node_class(parsed, policy or LicensePolicy())
    return "unknown" if cls == _NEUTRAL else cls


def _has_license(expr: str | None, policy: LicensePolicy) -> bool:
    """True when ``expr`` parses and holds at least one non-neutral symbol."""
    parsed = _parse(expr)
    return parsed is not None and _node_class(parsed, policy) != _NEUTRAL


def decide(license_class: str, policy: LicensePolicy) -> tuple[str, str]:
    """``(decision, reason)`` for a license class; decision is one of :data:`DECISIONS`.

    Raises ``ValueError`` for a class outside :data:`CLASS_ORDER`.
    """
    if license_class == "permissive":
        return "accept", "permissive license"
    if license_class == "weak_copyleft":
        return policy.weak_copyleft_decision, f"weak copyleft license (weak_copyleft_decision={policy.weak_copyleft_decision})"
    if license_class == "gpl2":
        return policy.gpl2_decision, f"GPL-2.0 license (gpl2_decision={policy.gpl2_decision})"
    if license_class == "refused":
        return "refuse", "license class refused by policy"
    if license_class == "unknown":
        return policy.unknown_decision, f"no recognised license (unknown_decision={policy.unknown_decision})"
    raise ValueError(f"license_class={license_class!r}; expected one of {CLASS_ORDER}")


def is_license_file(path: str) -> bool:
    """True for LICENSE*/LICENCE*/COPYING*/NOTICE*/README* files (any directory,
    case-insensitive; the stem must end there or continue after ``.``, ``_`` or ``-``),
    excluding source files such as ``license.c``."""
    name = posixpath.basename(path)
    return bool(_LICENSE_NAME.match(name)) and posixpath.splitext(name)[1].lower() not in _SOURCE_EXT


def spdx_identifier(text: str) -> str | None:
    """Canonical expression of the first parsable ``SPDX-License-Identifier`` in the first
    :data:`SPDX_SCAN_LINES` lines of ``text``, else ``None``."""
    for line in text.split("\n", SPDX_SCAN_LINES)[:SPDX_SCAN_LINES]:
        m = _SPDX_LINE.search(line)
        if m:
            expr = parse_expression(m.group(1).split("*/")[0].strip())
            if expr:
                return expr
    return None


def leading_comment(text: str) -> str:
    """The comment(s) before the first line of code in C/C++ ``text``, truncated to
    :data:`HEADER_MAX_CHARS` characters. ``#pragma once`` and include-guard
    ``#ifndef X`` / ``#define X`` lines may precede or interleave. ``""`` when none."""
    out, pos = [], 0
    while pos < len(text) and sum(map(len, out)) < HEADER_MAX_CHARS:
        pos = _SPACE.match(text, pos).end()
        m = _COMMENT.match(text, pos)
        if m:
            out.append(m.group(0))
        elif not (m := _GUARD.match(text, pos)):
            break
        pos = m.end()
    return "\n".join(out)[:HEADER_MAX_CHARS]


def normalize_header(comment: str, path: str | None = None) -> str:
    """Scan input (and cache key source) for a leading comment block.

    Per line: comment markers (``/*``, ``*/``, ``//``, leading ``*``) stripped and
    whitespace collapsed; copyright lines without a license keyword dropped (years and
    holders vary per file, the notice does not). Sentences that state the license of
    *another* file (:func:`mentions_other_file`, e.g. gnutls.h's "The openssl
    compatibility layer (which is under the GNU GPL license) is in gnutls/openssl.h.")
    are dropped: a mention of another file's license is not this file's license (``path``:
    the file the comment heads, whose own name in a sentence keeps it).
    Paragraphs are kept from the first to the last one holding a license keyword
    (:data:`_KEYWORD`), which trims per-file descriptions around the notice. ``""`` when
    no paragraph holds a keyword.
    """
    paras: list[str] = []
    cur: list[str] = []
    for raw in comment.splitlines() + [""]:
        line = " ".join(_MARKERS.sub(" ", raw).split())
        if not line:
            if cur:
                paras.append(_drop_other_file_mentions("\n".join(cur), path))
            cur = []
        elif not (_COPYRIGHT_LINE.match(line) and not _KEYWORD.search(line)):
            cur.append(line)
    paras = [p for p in paras if p]
    hits = [i for i, p in enumerate(paras) if _KEYWORD.search(p)]
    return "\n\n".join(paras[hits[0] : hits[-1] + 1]) if hits else ""


#: Sentence ends inside a normalized paragraph: ``.``/``;``/``:`` then a space or line
#: break and an upper-case letter or ``(`` (``v2.1``, ``e.g.`` and ``gnutls/openssl.h``
#: do not end a sentence).
_SENTENCE_END = re.compile(r"(?<=[.;:])\s+(?=[A-Z(])")
#: A source file (optionally with its directory), never a license file:
#: ``gnutls/openssl.h``, ``foo.c``.
_OTHER_FILE = re.compile(
    r"(?<![\w/.-])(?:[\w.-]+/)*(?!(?:licen[cs]e|copying|notice|readme)\b)[\w-]+"
    r"\.(?:h|hh|hpp|hxx|h\+\+|inl|c|cc|cpp|cxx|c\+\+|py|pyx|rs|go|java|js|s|asm)\b(?![\w/-])",
    re.IGNORECASE,
)
#: Words by which a sentence speaks of this file (or of parts of it): then it is kept.
_SELF = re.compile(
    r"(?i)\bth(?:is|ese)\s+(?:file|header|library|program|software|source|code|module|package|work|project)s?\b"
    r"|\b(?:portions?|parts?|derived|based\s+on|copied|taken\s+from|adapted|contains?)\b"
)


def mentions_other_file(sentence: str, own: str | None = None) -> bool:
    """True when ``sentence`` (one sentence of a normalized header) states the license of
    another file: it holds a license keyword (:data:`_KEYWORD`) and names a source file
    or path that is not a license file (:data:`_OTHER_FILE`) and is not this file
    (``own``: its path or base name; ``foo.h is free software…`` in ``foo.h`` is this
    file's notice), and does not speak of this file or of parts of it (:data:`_SELF`)."""
    if not _KEYWORD.search(sentence) or _SELF.search(sentence):
        return False
    own_name = posixpath.basename(own).lower() if own else None
    named = [m.group(0) for m in _OTHER_FILE.finditer(sentence)]
    return any(posixpath.basename(n).lower() != own_name for n in named)


def _drop_other_file_mentions(paragraph: str, own: str | None = None) -> str:
    """``paragraph`` without its other-file sentences (unchanged when there are none)."""
    parts = _SENTENCE_END.split(paragraph)
    kept = [p for p in parts if not mentions_other_file(p, own)]
    return paragraph if len(kept) == len(parts) else "\n".join(kept)


class Scanner:
    """ScanCode wrapper with an in-memory cache keyed by caller-chosen keys.

    Share one instance across revisions in a process. ``scans`` counts ScanCode calls,
    ``cache_hits`` counts answers served from the cache, ``store_hits`` ScanCode answers
    read from ``store`` (a :class:`~megacpp_core.license_scancode.ResultStore`, optional)
    instead of running ScanCode. The first ScanCode call loads its license index (2.8–2.9 s,
    :func:`~megacpp_core.license_scancode.load`); later scans take 0.01-1 s per text.
    """

    def __init__(self, store: ResultStore | None = None) -> None:
        self.cache: dict[str, str | None] = {}
        self.scans = 0
        self.cache_hits = 0
        self.store = store
        self.store_hits = 0

    def use_store(self, directory) -> None:
        """Read and keep ScanCode's answers in a result store under ``directory``."""
        if self.store is None or str(self.store.root) != str(directory):
            self.store = ResultStore(directory)

    def scan_text(self, text: str, cache_key: str) -> str | None:
        """ScanCode's ``detected_license_expression_spdx`` for ``text`` (``None`` when
        nothing is detected). ScanCode runs once per distinct ``cache_key``.

        A text of header size (at most :data:`HEADER_MAX_CHARS`) whose detection rests on
        a match covering less than ScanCode's own clue threshold of its rule
        (``licensedcode.detection.CLUES_MATCH_COVERAGE_THR``, 60 %: below it ScanCode
        calls a match a license *clue*, not a detection) is scanned again sentence by
        sentence, and the ``AND`` of the sentences' clean detections is used instead:
        libgit2's "distributed under the GNU GPL v2 with a Linking Exception. For full
        terms see the included COPYING file." matches 54 % of an LGPL-2.1+ rule as a
        whole, while its first sentence is an exact GPL-2.0 match.

        The sentence-level reading is used only when its license class is at least as
        strict as the whole text's (a clue that names a stricter license is never dropped).

        A header-size text that states a choice between licenses (:data:`_ALTERNATIVE`:
        "dual-licensed", "under either", "at your choice") gets the ``OR`` of the licenses
        its choice sentences name, ``AND`` whatever its other sentences require, rather than
        ScanCode's ``AND`` of every match: libunistring's "It is
        dual-licensed under "the GNU LGPLv3+ or the GNU GPLv2+". You can redistribute it
        and/or modify it under either - the terms of the GNU Lesser General Public License
        ... or - the terms of the GNU General Public License ..." is LGPL-3.0+ *or* GPL-2.0+
        (SPEC §4: a dual-licensed file takes its most permissive option), not both.
        """
        if cache_key in self.cache:
            self.cache_hits += 1
            return self.cache[cache_key]
        result = self._scancode(text)
        expr = result.get("detected_license_expression_spdx")
        if len(text) <= HEADER_MAX_CHARS:
            if _has_clue_match(result):
                by_sentence = self._by_sentence(text)
                # never less strict than the whole-text reading (a dropped clue must not
                # turn "MIT AND GPL" into "MIT")
                if _rank(by_sentence) >= _rank(expr):
                    expr = by_sentence
            elif _ALTERNATIVE.search(" ".join(text.split())):
                expr = self._choice(text) or expr
        self.cache[cache_key] = expr or None
        return self.cache[cache_key]

    def _scancode(self, text: str) -> dict:
        if self.store is not None and (stored := self.store.get(text)) is not None:
            self.store_hits += 1
            return stored
        result = run_scancode(text)
        self.scans += 1
        if self.store is not None:
            self.store.put(text, result)
        return result

    def _choice(self, text: str) -> str | None:
        """The ``OR`` of the licenses named in the sentences that state a choice
        (:data:`_ALTERNATIVE`), ``AND`` the licenses that the other sentences grant
        (:data:`_GRANT`: "licensed under", "distributed under", …; scanned together): an
        obligation stated outside the choice stays an obligation, while references such
        as "You should have received a copy of the GNU GPL" are not obligations."""
        sentences = _SENTENCE_END.split(" ".join(text.split()))
        chosen = " ".join(x for x in sentences if _ALTERNATIVE.search(x))
        rest = " ".join(x for x in sentences if not _ALTERNATIVE.search(x) and _GRANT.search(x))
        either = _either(self._scancode(chosen))
        if either is None:
            return None
        rest_expr = self._scancode(rest).get("detected_license_expression_spdx") if rest.strip() else None
        return _combine_and([f"({either})"] + ([f"({rest_expr})"] if rest_expr else []))

    def _by_sentence(self, text: str) -> str | None:
        exprs = []
        for sentence in _SENTENCE_END.split(" ".join(text.split())):
            result = self._scancode(sentence)
            expr = result.get("detected_license_expression_spdx")
            if expr and not _has_clue_match(result):
                exprs.append(expr)
        return _combine_and(exprs)

    def scan(self, text: str) -> str | None:
        """:meth:`scan_text` keyed by the SHA-256 of ``text``; ``None`` for blank text."""
        if not text.strip():
            return None
        return self.scan_text(text, hashlib.sha256(text.encode("utf-8")).hexdigest())


#: Words that state a choice between the licenses a notice names.
_ALTERNATIVE = re.compile(
    r"(?i)\bdual[- ]?licen[cs]ed\b|\bunder\s+either\b|\beither\s+under\b|\bat\s+your\s+choice\b"
    r"|\bchoice\s+of\s+(?:the\s+)?(?:following\s+)?licen[cs]es\b|\bone\s+of\s+the\s+(?:following|above)[\w\s-]*licen[cs]es\b"
)


#: Words by which a sentence grants a license (an obligation, not a reference to one).
_GRANT = re.compile(
    r"(?i)\b(?:licen[cs]ed|distributed|released|available|provided|covered|governed|made\s+available)"
    r"\s+(?:only\s+)?(?:under|by)\b|\bsubject\s+to\s+the\s+(?:terms|conditions)\b"
)


def _either(result: Mapping) -> str | None:
    """``OR`` of the distinct license expressions of a ScanCode result's matches
    (``None`` when fewer than two)."""
    exprs = sorted({m["license_expression_spdx"] for d in result.get("license_detections") or ()
                    for m in d.get("matches") or () if m.get("license_expression_spdx")})
    if len(exprs) < 2:
        return None
    return parse_expression(" OR ".join(f"({e})" for e in exprs))


def _rank(expr: str | None) -> int:
    """Position of ``expr``'s license class in :data:`CLASS_ORDER` under the default
    policy (higher = stricter; no expression is ``unknown``)."""
    return _RANK[classify_expression(expr)]


@lru_cache(maxsize=1)
def _clue_threshold() -> float:
    from licensedcode.detection import CLUES_MATCH_COVERAGE_THR

    return float(CLUES_MATCH_COVERAGE_THR)


def _has_clue_match(result: Mapping) -> bool:
    """True when a match of a ScanCode ``get_licenses`` result covers less of its rule
    than ScanCode's clue threshold."""
    return any(
        (m.get("match_coverage") or 0) < _clue_threshold()
        for d in result.get("license_detections") or ()
        for m in d.get("matches") or ()
    )


def _header_expression(scanner: Scanner, text: str, path: str | None = None) -> str | None:
    return parse_expression(scanner.scan(normalize_header(leading_comment(text), path)))


def _combine_and(exprs: list[str]) -> str | None:
    exprs = sorted(set(exprs))
    if not exprs:
        return None
    return parse_expression(" AND ".join(f"({e})" for e in exprs))


def _row(path, expr, cls, origin, license_file, policy) -> dict:
    decision, reason = decide(cls, policy)
    return {
        "path": path,
        "spdx_expression": expr,
        "license_class": cls,
        "decision": decision,
        "reason": reason,
        "origin": origin,
        "license_file": license_file,
    }


def scan_revision(
    source: str,
    files: Mapping[str, str],
    candidates: Iterable[str],
    policy: LicensePolicy,
    scanner: Scanner | None = None,
) -> list[dict]:
    """One license decision per candidate file of one source revision.

    ``files``: every file of the revision, relative POSIX path -> decoded text.
    ``candidates``: paths (keys of ``files``) to decide. Returns dicts sorted by ``path``
    with keys ``path``, ``spdx_expression`` (str | None), ``license_class``,
    ``decision``, ``reason``, ``origin`` (one of :data:`ORIGINS`) and ``license_file``
    (the directory license file used, else ``None``).

    A directory's license is the ``AND`` of the detections of its LICENSE/LICENCE/COPYING
    files, or of its NOTICE/README files when the former detect nothing (fail safe for
    dual-license layouts: the source files' own headers usually state the ``OR``).
    ``license_file`` is the first such contributing file in path order. Files of a source
    in ``policy.refused_sources`` are refused unscanned (class ``unknown``, origin
``refusal_list``). Raises
    ``KeyError`` for a candidate missing from ``files``.
    """
    paths = sorted(set(candidates))
    if source in policy.refused_sources:
        refused = {"decision": "refuse", "reason": "source on refusal list"}
        return [{**_row(p, None, "unknown", "refusal_list", None, policy), **refused} for p in paths]
    scanner = scanner or Scanner()
    by_dir: dict[str, list[str]] = {}
    for p in sorted(files):
        if is_license_file(p):
            by_dir.setdefault(posixpath.dirname(p), []).append(p)
    dir_cache: dict[str, tuple[str | None, str | None]] = {}

    def dir_license(d: str) -> tuple[str | None, str | None]:
        if d not in dir_cache:
            found: tuple[str | None, str | None] = (None, None)
            entries = by_dir.get(d, [])
            primary = [p for p in entries if _PRIMARY_NAME.match(posixpath.basename(p))]
            for group in (primary, [p for p in entries if p not in primary]):
                hits = [(p, e) for p in group if _has_license(e := scanner.scan(files[p]), policy)]
                if hits:
                    found = (_combine_and([e for _, e in hits]), hits[0][0])
                    break
            if found[0] is None and d:
                found = dir_license(posixpath.dirname(d))
            dir_cache[d] = found
        return dir_cache[d]

    rows = []
    for path in paths:
        text, lic_file = files[path], None
        if expr := spdx_identifier(text):
            origin = "spdx_header"
        elif _has_license(expr := _header_expression(scanner, text, path), policy):
            origin = "file_header"
        else:
            expr, lic_file = dir_license(posixpath.dirname(path))
            origin = "directory_license" if expr else "default"
        rows.append(_row(path, expr, classify_expression(expr, policy), origin, lic_file, policy))
    return rows
