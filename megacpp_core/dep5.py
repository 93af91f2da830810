"""DEP-5 ``debian/copyright`` as a second license signal (SPEC §3, ``debian`` kind).

A Debian source package states the license of each of its files in ``debian/copyright``.
When that file follows the machine-readable format — the DEP-5 specification,
copyright-format/1.0 — :func:`parse_copyright` turns it into a :class:`Dep5` record whose
:meth:`Dep5.license_for` maps a path of the source tree to an SPDX expression. Free-form
(non-DEP-5) files are recorded as such (``machine_readable=False`` with the reason); they
give no per-file signal.

Rules, all from the DEP-5 specification (copyright-format/1.0):

* The first paragraph is the header; it must carry ``Format:`` (section "Header
  paragraph"); without it the file is not machine-readable.
* ``Files:`` holds whitespace-separated patterns relative to the root of the source tree;
  only ``*`` (any run of characters, ``/`` and leading dots included) and ``?`` (one
  character) are wildcards, ``\\*``, ``\\?`` and ``\\\\`` escape them (section "Files
  paragraph"). ``Makefile.in`` matches only the root file, ``*/Makefile.in`` any depth.
* "If multiple Files paragraphs match, the last paragraph that matches a particular file
  applies to it" (same section).
* The first line of ``License:`` is a short-name expression: names joined by ``or`` /
  ``and``; ``and`` binds tighter than ``or`` unless a comma precedes it
  (``A or B, and C`` = ``(A or B) and C``); ``NAME with KEYWORDS exception`` marks an
  exception; a trailing ``+`` means "or any later version" (section "License
  specification", "Short name").

Short names are normalised to SPDX by :func:`dep5_to_spdx` using :data:`SHORT_NAMES`,
:data:`VERSIONED_FAMILIES` and :data:`EXCEPTIONS` (DEP-5 short-name table mapped onto the
SPDX license and exception lists); an SPDX id written verbatim is kept; any other name
becomes ``LicenseRef-dep5-NAME`` so that the expression stays valid SPDX and the
classifier of :mod:`megacpp_core.license` rates it ``unknown`` (fail safe).

Parsing uses ``python-debian``'s :mod:`debian.copyright` (non-strict mode: real files
have small format slips); its glob translation implements the pattern rule above.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable, Pattern

#: Path of the copyright file inside a Debian source tree (Debian Policy §12.5).
COPYRIGHT_PATH = "debian/copyright"

#: Unversioned DEP-5 short names (and common spellings seen in the archive) → SPDX.
#: Keys are lower-case. Source: the short-name table of the DEP-5 specification
#: (copyright-format/1.0, "License short name"), mapped to SPDX License List ids.
SHORT_NAMES: dict[str, str] = {
    "expat": "MIT",
    "mit": "MIT",
    "mit/x11": "MIT",
    "x11": "X11",
    "public-domain": "LicenseRef-scancode-public-domain",
    "publicdomain": "LicenseRef-scancode-public-domain",
    "public domain": "LicenseRef-scancode-public-domain",
    "isc": "ISC",
    "zlib": "Zlib",
    "zlib/libpng": "Zlib",
    "libpng": "Libpng",
    "bsd-2-clause": "BSD-2-Clause",
    "bsd-3-clause": "BSD-3-Clause",
    "bsd-4-clause": "BSD-4-Clause",
    "cc0": "CC0-1.0",
    "cc0-1.0": "CC0-1.0",
    "cddl": "CDDL-1.0",
    "cpl": "CPL-1.0",
    "efl-2": "EFL-2.0",
    "artistic": "Artistic-1.0",
    "artistic-1": "Artistic-1.0",
    "artistic-2": "Artistic-2.0",
    "perl": "GPL-1.0-or-later OR Artistic-1.0-Perl",  # DEP-5: "Perl license (use GPL-1+ or Artistic-1.0)"
    "python": "Python-2.0",
    "psf-2": "PSF-2.0",
    "zope-2.1": "ZPL-2.1",
    "zope-2.0": "ZPL-2.0",
    "boost-1.0": "BSL-1.0",
    "bsl": "BSL-1.0",
    "bsl-1": "BSL-1.0",
    "apache-2": "Apache-2.0",
    "apache-1": "Apache-1.0",
    "mpl-2": "MPL-2.0",
    "mpl-1": "MPL-1.0",
    "sil-ofl-1.1": "OFL-1.1",
    "ofl": "OFL-1.1",
    "wtfpl": "WTFPL",
    "unlicense": "Unlicense",
}

#: Versioned GNU families: DEP-5 ``NAME[-VERSION][+]`` → SPDX ``ID-VERSION-only`` /
#: ``-or-later``. ``{family: (SPDX stem, version used when none is written)}``; versions
#: are written ``N.M`` in SPDX (``GPL-2`` → ``GPL-2.0``). Source: DEP-5 short-name table
#: (GPL, LGPL, AGPL, GFDL, GFDL-NIV) and the SPDX ids of those licenses.
VERSIONED_FAMILIES: dict[str, tuple[str, str]] = {
    "gpl": ("GPL", "1.0"),
    "lgpl": ("LGPL", "2.0"),
    "agpl": ("AGPL", "3.0"),
    "gfdl": ("GFDL", "1.1"),
    "gfdl-niv": ("GFDL", "1.1"),
}

#: DEP-5 exception keywords (``with KEYWORDS exception``, lower-case, spaces as ``-``) →
#: SPDX exception id; ``{2: …, 3: …}`` picks by the GPL major version it applies to.
#: Source: SPDX License Exceptions list; keywords as used in Debian copyright files.
EXCEPTIONS: dict[str, str | dict[int, str]] = {
    "autoconf": {2: "Autoconf-exception-2.0", 3: "Autoconf-exception-3.0"},
    "autoconf-data": "Autoconf-exception-generic",
    "bison": "Bison-exception-2.2",
    "classpath": "Classpath-exception-2.0",
    "font": "Font-exception-2.0",
    "gcc": {2: "GCC-exception-2.0", 3: "GCC-exception-3.1"},
    "gcc-3.1": "GCC-exception-3.1",
    "gcc-runtime-library": "GCC-exception-3.1",
    "libtool": "Libtool-exception",
    "llvm": "LLVM-exception",
    "ocaml": "OCaml-LGPL-linking-exception",
    "openssl": "LicenseRef-scancode-openssl-exception-gpl-2.0",
    "qt": "Qt-LGPL-exception-1.1",
    "qt-lgpl-1.1": "Qt-LGPL-exception-1.1",
    "qt-gpl-1.0": "Qt-GPL-exception-1.0",
    "wxwindows": "WxWindows-exception-3.1",
    "u-boot": "u-boot-exception-2.0",
    "swift": "Swift-exception",
    "bootloader": "Bootloader-exception",
    "ecos": "eCos-exception-2.0",
    "fltk": "FLTK-exception",
    "389": "389-exception",
}

_VERSIONED = re.compile(r"^(gfdl-niv|agpl|lgpl|gpl|gfdl)(?:-?(\d+(?:\.\d+)?))?(\+)?$", re.I)
_REF_CHARS = re.compile(r"[^A-Za-z0-9.-]+")


class Dep5Error(ValueError):
    """A ``License:`` short-name expression cannot be read (empty, dangling operator)."""


# --------------------------------------------------------------------------- normaliser


def _licenseref(name: str, suffix: str = "") -> str:
    ref = _REF_CHARS.sub("-", name).strip("-") or "unnamed"
    return f"LicenseRef-dep5-{ref}{suffix}"


@lru_cache(maxsize=1)
def _spdx_ids() -> dict[str, str]:
    """Lower-case SPDX license id → its canonical spelling, from the SPDX/ScanCode license
    index vendored with ``license_expression`` (the index :mod:`megacpp_core.license` uses)."""
    from license_expression import get_license_index

    out: dict[str, str] = {}
    for lic in get_license_index():
        key = lic.get("spdx_license_key")
        if key and not lic.get("is_exception"):
            out.setdefault(key.lower(), key)
    return out


def short_name_to_spdx(name: str) -> str:
    """SPDX id (or ``A OR B`` for DEP-5 ``Perl``) of one DEP-5 short name.

    ``GPL-2+`` → ``GPL-2.0-or-later``; ``LGPL-2.1`` → ``LGPL-2.1-only``; ``GFDL-NIV-1.3+`` →
    ``GFDL-1.3-no-invariants-or-later``; ``Expat`` → ``MIT``; ``BSD-3-clause`` →
    ``BSD-3-Clause``; ``public-domain`` → ``LicenseRef-scancode-public-domain``; an SPDX id
    in any case → its canonical spelling; ``X+`` for another SPDX id → ``X+`` (SPDX's
    "or later" operator); anything else → ``LicenseRef-dep5-NAME``. Never raises.
    """
    key = name.strip().lower()
    if key in SHORT_NAMES:
        return SHORT_NAMES[key]
    m = _VERSIONED.match(key)
    if m:
        family, version, plus = m.group(1).lower(), m.group(2), m.group(3)
        stem, default = VERSIONED_FAMILIES[family]
        version = version or default
        if "." not in version:
            version += ".0"
        niv = "-no-invariants" if family == "gfdl-niv" else ""
        return f"{stem}-{version}{niv}-{'or-later' if plus or not m.group(2) else 'only'}"
    ids = _spdx_ids()
    if key in ids:
        return ids[key]
    if key.endswith("+") and key[:-1] in ids:
        return ids[key[:-1]] + "+"
    if re.fullmatch(r"[a-z0-9.-]+-\d+", key) and key + ".0" in ids:  # MPL-2 style
        return ids[key + ".0"]
    return _licenseref(name)


def _exception_to_spdx(words: str, license_id: str) -> str:
    key = "-".join(words.lower().split())
    hit = EXCEPTIONS.get(key)
    if isinstance(hit, dict):
        m = re.search(r"GPL-(\d)", license_id)
        hit = hit.get(int(m.group(1)) if m else 2) or next(iter(hit.values()))
    return hit or _licenseref(words, "-exception")


def _tokens(expr: str) -> list[str]:
    return expr.replace(",", " , ").split()


def _term(tokens: list[str], i: int, expr: str) -> tuple[str, int]:
    """One license name with an optional ``with … exception``; returns (SPDX, next index)."""
    if i >= len(tokens) or tokens[i].lower() in ("or", "and", ","):
        raise Dep5Error(f"license expression {expr!r}: a license name is missing")
    j = i
    while j < len(tokens) and tokens[j].lower() not in ("or", "and", ",", "with"):
        j += 1
    name = " ".join(tokens[i:j])  # DEP-5 names have no spaces; "public domain" and the like are tolerated
    i = j
    spdx = short_name_to_spdx(name)
    if i < len(tokens) and tokens[i].lower() == "with":
        j = i + 1
        while j < len(tokens) and tokens[j].lower() != "exception" and tokens[j].lower() not in ("or", "and", ","):
            j += 1
        words = " ".join(tokens[i + 1:j])
        if not words:
            raise Dep5Error(f"license expression {expr!r}: 'with' names no exception")
        if j < len(tokens) and tokens[j].lower() == "exception":
            j += 1
        exc = _exception_to_spdx(words, spdx)
        spdx = f"({spdx}) WITH {exc}" if " " in spdx else f"{spdx} WITH {exc}"
        i = j
    return spdx, i


def _wrap(s: str) -> str:
    return f"({s})" if " OR " in s or " AND " in s else s


def dep5_to_spdx(expr: str) -> str:
    """SPDX expression of a DEP-5 ``License:`` short-name line.

    ``GPL-2+ or Artistic-2.0, and BSD-3-clause`` → ``(GPL-2.0-or-later OR Artistic-2.0) AND
    BSD-3-Clause``; ``A or B and C`` → ``A OR (B AND C)``; ``GPL-2+ with OpenSSL exception``
    → ``GPL-2.0-or-later WITH …``; names are mapped by :func:`short_name_to_spdx`.
    Operators are matched case-insensitively. Raises :class:`Dep5Error` for an empty
    expression or a dangling operator.
    """
    tokens = _tokens(expr)
    if not tokens:
        raise Dep5Error("empty license expression")
    segments: list[tuple[str | None, list[str]]] = []  # (operator after the comma, tokens)
    current: list[str] = []
    op: str | None = None
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t == ",":
            nxt = tokens[i + 1].lower() if i + 1 < len(tokens) else ""
            segments.append((op, current))
            if nxt in ("and", "or"):
                op, i = nxt, i + 2
            else:  # a bare comma joins like "and" (a list of licenses that all apply)
                op, i = "and", i + 1
            current = []
            continue
        current.append(t)
        i += 1
    segments.append((op, current))
    out: str | None = None
    for seg_op, seg in segments:
        rendered = _segment(seg, expr)
        out = rendered if out is None else f"{_wrap(out)} {seg_op.upper()} {_wrap(rendered)}"  # type: ignore[union-attr]
    assert out is not None
    return out


def _segment(tokens: list[str], expr: str) -> str:
    """``and`` binds tighter than ``or`` inside a comma-free segment."""
    ors: list[list[str]] = [[]]
    i = 0
    while True:
        spdx, i = _term(tokens, i, expr)
        ors[-1].append(spdx)
        if i >= len(tokens):
            break
        op = tokens[i].lower()
        if op not in ("and", "or"):
            raise Dep5Error(f"license expression {expr!r}: expected 'and' or 'or' before {tokens[i]!r}")
        i += 1
        if op == "or":
            ors.append([])
    parts = [" AND ".join(_wrap(x) for x in group) if len(group) > 1 else group[0] for group in ors]
    if len(parts) == 1:
        return parts[0]
    return " OR ".join(_wrap(p) for p in parts)


def normalize_license(expr: str | None) -> str | None:
    """:func:`dep5_to_spdx` checked by the SPDX parser of :mod:`megacpp_core.license`;
    ``None`` for an empty or unreadable expression. Never raises."""
    if not expr or not expr.strip():
        return None
    from .license import parse_expression

    try:
        spdx = dep5_to_spdx(expr)
    except Dep5Error:
        return None
    return spdx if parse_expression(spdx) is not None else None


# --------------------------------------------------------------------------- copyright files


@dataclass(frozen=True)
class FilesStanza:
    """One ``Files:`` paragraph.

    ``patterns``: its globs as written; ``license``: the ``License:`` short-name line;
    ``spdx``: :func:`normalize_license` of it (``None`` when unreadable); ``copyright``:
    the ``Copyright:`` text; ``index``: position among the Files paragraphs (0-based).
    """

    patterns: tuple[str, ...]
    license: str
    spdx: str | None
    copyright: str
    index: int
    _regexes: tuple[Pattern[str], ...] = field(repr=False, compare=False, default=())

    def match(self, path: str) -> str | None:
        """The first of this stanza's patterns that matches ``path`` (whole path), else None."""
        for pat, rx in zip(self.patterns, self._regexes):
            if rx.fullmatch(path):
                return pat
        return None


@dataclass(frozen=True)
class Dep5:
    """A parsed ``debian/copyright``.

    ``machine_readable``: False for a free-form file (then ``reason`` says why and
    ``stanzas`` is empty); ``format``: the header's ``Format:`` value; ``format_known``:
    whether it is the copyright-format/1.0 URL python-debian knows;
    ``header_license``/``header_spdx``: the header's optional ``License:`` (the package's
    overall license, not a per-file signal); ``stanzas``: Files paragraphs in file order;
    ``warnings``: paragraphs skipped (e.g. an invalid glob escape), one line each.
    """

    machine_readable: bool
    reason: str | None = None
    format: str | None = None
    format_known: bool = False
    header_license: str | None = None
    header_spdx: str | None = None
    stanzas: tuple[FilesStanza, ...] = ()
    warnings: tuple[str, ...] = ()

    def license_for(self, path: str) -> tuple[str | None, str | None]:
        """``(SPDX expression or None, matching pattern or None)`` for a path relative to
        the source root (a leading ``./`` is ignored).

        The last matching Files paragraph wins (DEP-5 rule); the pattern returned is the
        glob of that paragraph that matched. ``(None, None)`` when no paragraph matches
        or the file is not machine-readable; ``(None, pattern)`` when the paragraph's
        license line could not be normalised.
        """
        if path.startswith("./"):
            path = path[2:]
        for stanza in reversed(self.stanzas):
            pat = stanza.match(path)
            if pat is not None:
                return stanza.spdx, pat
        return None, None

    def licenses_for(self, paths: Iterable[str]) -> list[tuple[str, str | None, str | None]]:
        """``[(path, SPDX or None, pattern or None)]`` for each path, in the given order."""
        return [(p, *self.license_for(p)) for p in paths]


def parse_copyright(text: str | bytes) -> Dep5:
    """Parse a ``debian/copyright`` file (bytes are decoded as UTF-8, bad bytes replaced).

    Returns a :class:`Dep5`; a free-form file (no ``Format:`` header, or not deb822 at
    all) gives ``Dep5(machine_readable=False, reason=…)`` rather than an error. A Files
    paragraph whose globs are invalid (a backslash before anything but ``*``, ``?``,
    ``\\``) is skipped with a warning. Never raises on bad input.
    """
    from debian import copyright as dc

    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not text.strip():
        return Dep5(False, reason="empty copyright file")
    import logging

    dlog = logging.getLogger("debian.copyright")
    old = dlog.level
    dlog.setLevel(logging.ERROR)  # non-strict mode logs every format slip as a warning
    try:
        c = dc.Copyright(text.splitlines(True), strict=False)
    except dc.NotMachineReadableError as e:
        return Dep5(False, reason=f"not machine-readable (DEP-5 header with Format: missing): {e}")
    except Exception as e:  # python-debian raises assorted errors on free-form text
        return Dep5(False, reason=f"not machine-readable: {type(e).__name__}: {e}")
    finally:
        dlog.setLevel(old)
    header = c.header
    hl = header.license.synopsis if header.license else None
    stanzas: list[FilesStanza] = []
    warnings: list[str] = []
    for n, para in enumerate(c.all_files_paragraphs()):
        try:
            patterns = tuple(para.files)
            regexes = tuple(dc.globs_to_re([p]) for p in patterns)
            lic = para.license.synopsis if para.license else ""
        except Exception as e:
            warnings.append(f"Files paragraph {n}: skipped: {e}")
            continue
        stanzas.append(FilesStanza(patterns, lic, normalize_license(lic), para.copyright or "", n, regexes))
    return Dep5(True, format=header.format, format_known=header.known_format(), header_license=hl,
                header_spdx=normalize_license(hl), stanzas=tuple(stanzas), warnings=tuple(warnings))


def dep5_of_files(files: Iterable[tuple[str, bytes]]) -> Dep5 | None:
    """:func:`parse_copyright` of the ``debian/copyright`` among ``(path, bytes)`` files
    (e.g. :attr:`megacpp_core.acquire.Acquired.files`), or ``None`` when there is none."""
    for p, data in files:
        if p == COPYRIGHT_PATH:
            return parse_copyright(data)
    return None


# --------------------------------------------------------------------------- the second signal

#: How a file's ScanCode decision and its DEP-5 license relate (the ``agreement`` column):
#: ``agree`` (the same SPDX expression), ``same_class`` (different expressions, same
#: license class), ``disagree`` (different classes), ``dep5_only`` (ScanCode found no
#: license), ``no_stanza`` (no Files paragraph matches the path), ``unreadable_dep5`` (the
#: paragraph's License line could not be normalised), ``not_machine_readable`` (a
#: free-form ``debian/copyright``), ``no_dep5`` (the source is not a Debian source package).
AGREEMENTS = ("agree", "same_class", "disagree", "dep5_only", "no_stanza", "unreadable_dep5", "not_machine_readable",
              "no_dep5")
#: Which signal decides (``settings.license_dep5_policy``): ``stricter`` (default: the less
#: permissive class of the two, ScanCode on a tie), ``scancode``, ``dep5`` (DEP-5 whenever
#: it has a license for the file), ``dep5_if_unknown`` (DEP-5 only where ScanCode found none).
POLICIES = ("stricter", "scancode", "dep5", "dep5_if_unknown")
#: Agreements where both signals name a license (the denominator of the agreement rate).
COMPARED = ("agree", "same_class", "disagree", "dep5_only")


def reconcile(row: dict, dep5: "Dep5 | None", mode: str, policy) -> dict:
    """A license decision of :func:`megacpp_core.license.scan_revision` with the DEP-5 signal.

    ``row``: the ScanCode-based decision (``path``, ``spdx_expression``, ``license_class``,
    ``decision``, ``reason``, ``origin``, ``license_file``); ``dep5``: the source package's
    parsed ``debian/copyright`` (None for a source that is not a Debian source package);
    ``mode``: one of :data:`POLICIES`; ``policy``: the
    :class:`~megacpp_core.license.LicensePolicy`. Returns the row plus ``license_scancode``
    (ScanCode's expression), ``license_dep5`` (DEP-5's, SPDX), ``dep5_pattern`` (the Files
    glob that matched), ``agreement`` (one of :data:`AGREEMENTS`) and ``decided_by``
    (``scancode`` or ``dep5``). When the mode picks DEP-5 and its class differs from
    ScanCode's (or ScanCode found nothing), ``spdx_expression``, ``license_class``,
    ``decision`` and ``reason`` are DEP-5's. A refusal-list decision is never changed.
    Raises ``ValueError`` for an unknown ``mode``.
    """
    from . import license as lic

    if mode not in POLICIES:
        raise ValueError(f"license_dep5_policy={mode!r}; expected one of {POLICIES}")
    out = {**row, "license_scancode": row["spdx_expression"], "license_dep5": None, "dep5_pattern": None,
           "decided_by": "scancode"}
    if dep5 is None:
        return {**out, "agreement": "no_dep5"}
    if not dep5.machine_readable:
        return {**out, "agreement": "not_machine_readable"}
    spdx, pattern = dep5.license_for(row["path"])
    out.update(license_dep5=spdx, dep5_pattern=pattern)
    if pattern is None:
        return {**out, "agreement": "no_stanza"}
    if spdx is None:
        return {**out, "agreement": "unreadable_dep5"}
    dep5_class = lic.classify_expression(spdx, policy)
    sc_expr, sc_class = row["spdx_expression"], row["license_class"]
    if sc_expr is None and sc_class == "unknown":
        agreement = "dep5_only"
    elif lic.parse_expression(sc_expr) == lic.parse_expression(spdx):
        agreement = "agree"
    else:
        agreement = "same_class" if sc_class == dep5_class else "disagree"
    out["agreement"] = agreement
    rank = {c: i for i, c in enumerate(lic.CLASS_ORDER)}
    use_dep5 = {"scancode": False, "dep5": True, "dep5_if_unknown": sc_class == "unknown",
                "stricter": rank[dep5_class] > rank[sc_class]}[mode]
    if use_dep5 and row["origin"] != "refusal_list" and (dep5_class != sc_class or sc_expr is None):
        decision, reason = lic.decide(dep5_class, policy)
        out.update(spdx_expression=spdx, license_class=dep5_class, decision=decision, decided_by="dep5",
                   reason=f"{reason}; from debian/copyright ({pattern}), ScanCode: {sc_expr or 'none'} "
                          f"(license_dep5_policy={mode})")
    return out


def summary(rows: list[dict], dep5: "Dep5 | None", limit: int = 50) -> dict:
    """Figures of the DEP-5 signal over one revision's reconciled rows: ``copyright``
    (``dep5``, ``free_form`` or ``none``), ``agreement`` counts, ``agreement_rate`` (share of
    ``agree`` + ``same_class`` among the files both signals cover, None when none),
    ``decided_by_dep5`` and up to ``limit`` ``disagreements`` (path, both expressions and
    classes, what was chosen)."""
    counts = {a: 0 for a in AGREEMENTS}
    for r in rows:
        counts[r["agreement"]] += 1
    compared = sum(counts[a] for a in COMPARED)
    disagreements = [{"path": r["path"], "scancode": r["license_scancode"], "dep5": r["license_dep5"],
                      "pattern": r["dep5_pattern"], "chosen": r["decided_by"], "class": r["license_class"],
                      "decision": r["decision"]}
                     for r in rows if r["agreement"] in ("disagree", "dep5_only")][:limit]
    return {"copyright": "none" if dep5 is None else ("dep5" if dep5.machine_readable else "free_form"),
            "copyright_reason": None if dep5 is None else dep5.reason,
            "agreement": {k: v for k, v in counts.items() if v},
            "agreement_rate": round((counts["agree"] + counts["same_class"]) / compared, 4) if compared else None,
            "compared": compared, "decided_by_dep5": sum(1 for r in rows if r["decided_by"] == "dep5"),
            "disagreements": disagreements}
