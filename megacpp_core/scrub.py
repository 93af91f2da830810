"""Stage 3: PII and secret scrub before tokenization (SPEC §4).

Detectors, in priority order (an earlier match claims its span; later overlapping
matches are dropped):

``secret`` -> ``API_KEY_REDACTED``
    PEM private-key blocks (``-----BEGIN ... PRIVATE KEY-----`` through the matching
    ``-----END ...-----``, the whole block, at most :data:`PEM_MAX_CHARS` characters;
    without an END line, the header and the base64 lines right after it; PuTTY key
    files from their header through the private lines);
    issuer formats (:data:`megacpp_core.keyscan.FORMAT_RULES`: cloud, GitHub, GitLab,
    Slack, Stripe, Google, JWT, npm, PyPI, OpenAI, Twilio, ... and connection-string
    ``Password=``/``AccountKey=`` values); URL passwords (``scheme://user:PASSWORD@host``,
    detect-secrets' BasicAuthDetector character classes; printf/template placeholders
    are not passwords); string literals assigned to a secret-like name (``api_key``,
    ``secret``, ``token``, ``passwd``, ``password``, ``private_key``, ``access_key``)
    whose value is key-like (only ``[A-Za-z0-9_+/=.~-]``, at least one letter and one
    digit, none of the secret words itself (``"setAttr-Token-B0Prime"`` is a name), >=
    :data:`SECRET_MIN_LEN` chars, Shannon entropy >= :data:`SECRET_MIN_ENTROPY`
    bits/char, lower for hex values; only the literal's content is replaced, the quotes
    stay), or unquoted as a whole config line (``api_key = VALUE``); a name holding
    ``public`` (``publicKeyToken``) is not a secret name; and *generic*
    random-looking base64/base64url runs of 20+ characters wherever they stand
    (:func:`megacpp_core.keyscan.generic_spans`: shape tests calibrated on random
    tokens, exemptions for code identifiers, labelled test data, word paths and public
    key material).
``email`` -> ``<redacted-email>``
    ``local@domain.tld`` (RFC 5321-ish; a dotted domain ending in a 2-24 letter TLD).
    Copyright-header addresses are redacted too.
``home_path`` -> ``<redacted-path>/``
    ``/home/NAME/``, ``/Users/NAME/``, ``C:\\Users\\NAME\\`` (single or doubled
    backslashes, any drive letter). Without the trailing separator the marker has no
    trailing ``/`` either, so the text after the name is kept exactly.
``network_address`` -> ``<redacted-network-address>``
    IPv6: a maximal run of hex digits, ``:`` and ``.`` (optional ``%zone``), not touching
    a word character, ``:`` or ``.`` on the left nor a word character, ``(`` or ``<`` on
    the right, that ``ipaddress`` accepts, holds a decimal digit, and has >= 3 non-empty
    groups or is ``XXXX::Y`` (a full 4-digit group, ``::``, a non-empty group, as in
    ``fe80::1``). Eight 2-digit groups without ``::`` (byte dumps, EUI-64) are not
    addresses. So ``std::vector``, ``a::b::c``, ``::operator new``, ``a::b``,
    ``A2::a1`` and ``12:34:56`` never match.
    IPv4: four dot-separated octets 0-255 without leading zeros, not part of a longer
    dotted or alphanumeric run, and none of these number contexts: a version, section,
    spec, OID or standard word right before it on the same line (:data:`_NUMBER_CONTEXT`:
    ``version 1.2.3.4``, ``section 4.1.1.2``, ``C++14 20.8.2.2``); ``OID`` earlier on the
    line; ``name-`` right before it (``linux-2.6.8.1``); enclosed as ``[22.4.1.2]``; or
    all four numbers < 100 at the start of a (comment) line (``// 23.3.4.2 iterators``).
    Addresses in :data:`KEEP_ADDRESSES` (unspecified, loopback ``127.0.0.1``/``::1``,
    broadcast and IPv4 netmasks) carry no identity and stay.

Hex constants and hash test vectors (md5/sha hex strings) match no detector.
:func:`scrub_text` fails closed: its output is re-scanned with the redaction detectors
*and* an independent, stricter detector set (:func:`megacpp_core.leak_rescan.strict_findings`:
detect-secrets' own format plugins, run as that package ships them, plus the generic
shape test with a looser entropy threshold), and a :class:`LeakError` is raised if
either finds anything.

Speed (``bench/scrub.py``: redaction and re-scan together against one combined ``re``
pass of the same detectors): every detector runs only where it can match, with the
same results as a pass over the whole text. One hyperscan pass (pyahocorasick on
non-ASCII texts) finds the literal prefixes of the issuer formats, the secret words of
the assignment rules and the re-scan's gate literals; the base64 runs that the generic
rule and the prefix-less formats share are found once, with numpy; the PEM block and
the existing markers run only on a text holding their literals; the e-mail, home-path
and address detectors only on the lines a literal-led prefilter finds
(:data:`_EMAIL_LINES`); the re-scan's detect-secrets plugins only when their gate
literals occur (:data:`megacpp_core.leak_rescan.STRICT_GATES`). A text the redaction
left unchanged is re-scanned by the stricter detectors only: the redaction detectors
just found nothing on that very text.
"""

from __future__ import annotations

import ipaddress
import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache

import ahocorasick

from . import keyscan, leak_rescan
from .keyscan import shannon_entropy

#: Replacement per kind (SPEC §4).
REDACTION_MARKERS = {
    "email": "<redacted-email>",
    "network_address": "<redacted-network-address>",
    "secret": "API_KEY_REDACTED",
    "home_path": "<redacted-path>/",
}
#: Redaction kinds, in the key order of ``ScrubResult.counts``.
KINDS = tuple(REDACTION_MARKERS)

#: Minimum length of an assigned secret value; 16 follows gitleaks' generic-api-key rule
#: family (the shortest common API keys are 16+ characters).
SECRET_MIN_LEN = 16
#: Minimum Shannon entropy in bits/char of an assigned secret value (gitleaks' 3.5).
SECRET_MIN_ENTROPY = 3.5
#: Longest PEM private-key block redacted as one span (a 4096-bit RSA key quoted line by
#: line as C string literals is ~4 KB; 16 KiB leaves room for other wrappings).
PEM_MAX_CHARS = 16384

#: Non-identifying addresses that stay: unspecified, loopback, broadcast, IPv4 netmasks.
KEEP_ADDRESSES = frozenset(
    [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"), ipaddress.ip_address("::")]
    + [ipaddress.IPv4Network(f"0.0.0.0/{n}").netmask for n in range(33)]  # incl. 0.0.0.0, 255.255.255.255
)

_PEM = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY((?: BLOCK)?)-----"
    rf"(?:[\s\S]{{0,{PEM_MAX_CHARS}}}?-----END \1PRIVATE KEY\2-----"
    r"|(?:[ \t]*\r?\n[ \t]*\"?[A-Za-z0-9+/=]{16,}(?:\\n)?\"?[ \t]*,?)*)"  # no END: base64 lines
    rf"|---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----[\s\S]{{0,{PEM_MAX_CHARS}}}?---- END SSH2 ENCRYPTED PRIVATE KEY ----"
    r"|PuTTY-User-Key-File-[23]:[^\n]*(?:\r?\n[^\n]*){0,64}?\r?\nPrivate-(?:MAC|Hash):[^\n]*"
)
#: Password of a ``scheme://user:password@host`` URL: any run without spaces, quotes,
#: ``@ / : < > \\`` (a superset of detect-secrets' BasicAuthDetector classes, which also
#: leave out RFC 3986 sub-delimiters such as ``$`` and ``*`` that real passwords hold);
#: printf/template placeholders (``%s``, ``{pw}``, ``${PW}``, ``<pw>``) are not secrets.
_BASIC_AUTH = re.compile(r"://[^\s:/?#\[\]@\"'<>\\]+:([^\s@/:\"'<>\\]+)@")
_PLACEHOLDER = re.compile(r"%[-+ #0-9.*]*[a-zA-Z]|\{[^{}]*\}|<[^<>]*>|\$\{?\w+\}?|\*+|x{3,}|X{3,}")
_ASSIGN = re.compile(
    r"(?i)\b\w*?(?:api[_-]?key|secret|token|passwd|password|private[_-]?key|access[_-]?key)\w*[\"']?"
    r"\s*(?:\[[^\]\n]{0,16}\]\s*)?(?:=>|:=|[:=,(])?\s*(?:u8|[uUL])?([\"'])([A-Za-z0-9_+/=.~-]+)\1"
)
#: The same names as a whole config line, value unquoted (``api_key = VALUE``,
#: ``export API_TOKEN=VALUE``, ``token: VALUE``); group 2 is the value.
_ASSIGN_LINE = re.compile(
    r"(?i)[ \t]*(?:export[ \t]+)?()[\w.-]*?(?:api[_-]?key|secret|token|passwd|password|private[_-]?key|access[_-]?key)"
    rf"[\w.-]*[ \t]*[=:][ \t]*([A-Za-z0-9_+/=.~-]{{{SECRET_MIN_LEN},}})[ \t]*(?=\r?\n|$)"
)
_SECRET_WORD = re.compile(r"(?i)api[_-]?key|secret|token|passw|private|access")
#: A name saying the value is public (``publicKeyToken``, ``public_api_key``): not a secret.
_PUBLIC_NAME = re.compile(r"(?i)public")
#: The words :data:`_ASSIGN` needs (lower case); it is tried only from the start of a
#: word holding one, found by one Aho-Corasick pass over the lower-cased text.
_ASSIGN_WORDS = tuple(
    f"{a}{sep}{b}" for a, b in (("api", "key"), ("private", "key"), ("access", "key")) for sep in ("", "_", "-")
) + ("secret", "token", "passwd", "password")
_ASSIGN_WORD = re.compile("|".join(_ASSIGN_WORDS), re.IGNORECASE)


@lru_cache(maxsize=1)
def _assign_automaton():
    auto = ahocorasick.Automaton()
    for w in _ASSIGN_WORDS:
        auto.add_word(w, len(w))
    auto.make_automaton()
    return auto


@lru_cache(maxsize=1)
def _assign_scanner() -> keyscan.LiteralScanner:
    return keyscan.LiteralScanner(_ASSIGN_WORDS, caseless=True)


def _assign_word_starts(text: str):
    if text.isascii() and keyscan.hyperscan is not None:  # one hyperscan pass, ASCII case folded
        yield from (start for start, _ in _assign_scanner().hits(text))
        return
    lower = text.lower()
    if len(lower) != len(text):  # a few non-ASCII letters change length when lower-cased
        yield from (m.start() for m in _ASSIGN_WORD.finditer(text))
        return
    for end, n in _assign_automaton().iter(lower):
        yield end - n + 1


def _assignments(text: str) -> list[re.Match]:
    """``_ASSIGN.finditer(text)``, tried only at the words holding a secret word (the
    same matches: a match starts at the word boundary before its secret word), then
    :data:`_ASSIGN_LINE` at the start of those words' lines."""
    out, done, lines = [], 0, set()
    for start in sorted(set(_assign_word_starts(text))):
        lines.add(text.rfind("\n", 0, start) + 1)
        while start > done and (text[start - 1].isalnum() or text[start - 1] == "_"):
            start -= 1
        if start < done:
            continue
        m = _ASSIGN.match(text, start)
        if m:
            out.append(m)
            done = m.end()
    for ls in sorted(lines):
        m = _ASSIGN_LINE.match(text, ls)
        if m:
            out.append(m)
    return out
_EMAIL = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9](?:[A-Za-z0-9._%+-]{0,63})@"
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![\w-])"
)
_HOME = re.compile(
    r"(?<![\w.~%-])/(?:home|Users)/[A-Za-z0-9_-](?:[A-Za-z0-9._-]*[A-Za-z0-9_-])?(/)?"
    r"|(?<![\w])[A-Za-z]:(\\\\|\\|/)Users\2[^\\/\s\"'<>:*?|]+(\2)?"
)
_V6 = re.compile(r"(?<![\w:.%])[0-9A-Fa-f]*:[0-9A-Fa-f:.]*(?:%[0-9A-Za-z_-]+)?")
_V4 = re.compile(r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?!\w|\.\w)")
_OCTET = re.compile(r"0|[1-9]\d{0,2}")
#: Words (and standard names: C++14, ECMA-262, IEEE 802.11-2012, ISO 14882) after which a
#: dotted quad is a version, section, spec or OID number, not an address.
_NUMBER_CONTEXT = re.compile(
    r"(?i)(?:(?<![a-z])(?:version|ver|v|release|rel|rev|revision|sections?|sec|chapters?|clauses?|para"
    r"|spec|specification|rfc|oid|iso|ieee|ansi|posix|c\+\+\d\d|ecma-\d+|802\.\d+\w*(?:-\d{4})?|14882)|§)"
    r"[\s:=(\"'_,-]*$"
)
_OID_ON_LINE = re.compile(r"(?i)(?<![a-z])oid(?![a-z])")
_LINE_START = re.compile(r"(?:^|\n)[ \t]*(?:/[/*]+!?|\*+|#)?[ \t]*$")
_MARKER = re.compile("|".join(re.escape(m.rstrip("/")) for m in REDACTION_MARKERS.values()))


class LeakError(ValueError):
    """Scrubbed output still holds something a detector flags; the message names the kind
    (never the value)."""


@dataclass
class ScrubResult:
    """``text``: scrubbed text. ``counts``: redactions per kind (every kind of
    :data:`KINDS` present, 0 when none). ``samples``: up to ``max_samples`` dicts
    ``{kind, before, marker}`` in text order, ``before`` being the scrubbed text from
    ~40 chars before to ~40 chars after the marker (so it holds no redacted value)."""

    text: str
    counts: dict[str, int] = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)


_HEX_VALUE = re.compile(r"[0-9a-fA-F]+")


def _key_like(value: str) -> bool:
    """Value of a secret-named assignment that looks like a key. The entropy bar is
    :data:`SECRET_MIN_ENTROPY`, lowered for hex values to what random hex of that length
    reaches (:func:`megacpp_core.keyscan.expected_entropy` over 16 symbols less
    :func:`megacpp_core.keyscan.entropy_slack`): 32 random hex digits average 3.5
    bits/char, so gitleaks' 3.5 misses half of them."""
    n = len(value)
    bar = SECRET_MIN_ENTROPY
    if _HEX_VALUE.fullmatch(value):
        bar = min(bar, keyscan.expected_entropy(n, 16) - keyscan.entropy_slack(n))
    return (
        n >= SECRET_MIN_LEN
        and not _SECRET_WORD.search(value)
        and any(c.isdigit() for c in value)
        and any(c.isalpha() for c in value)
        and value != REDACTION_MARKERS["secret"]
        and shannon_entropy(value) >= bar
    )


def _password(value: str) -> bool:
    return not (_PLACEHOLDER.fullmatch(value) or value.startswith(("%", "{", "$", "<")) or REDACTION_MARKERS["secret"] in value)


def _widest(spans: list[tuple]) -> list[tuple]:
    """Sorted, overlapping spans merged into their union (one redaction per run)."""
    out: list[tuple] = []
    for sp in spans:
        if out and sp[0] < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], sp[1]), *out[-1][2:])
        else:
            out.append(sp)
    return out


def _ipv6_ok(token: str) -> bool:
    bare = token.split("%")[0]
    if bare.count(":") < 2 or not any(c.isdigit() for c in bare):
        return False
    try:
        addr = ipaddress.IPv6Address(bare)
    except ValueError:
        return False
    groups = bare.split(":")
    if "::" not in bare and all(len(g) == 2 for g in groups):
        return False
    left, sep, right = bare.partition("::")
    short_ok = bool(sep) and len(left) == 4 and bool(right)  # "fe80::1", not C++ "A2::a1"
    return addr not in KEEP_ADDRESSES and (sum(map(bool, groups)) >= 3 or short_ok)


def _ipv4_ok(text: str, m: re.Match) -> bool:
    parts = m.group(0).split(".")
    if not all(_OCTET.fullmatch(p) and int(p) <= 255 for p in parts):
        return False
    if ipaddress.IPv4Address(m.group(0)) in KEEP_ADDRESSES:
        return False
    s, e = m.start(), m.end()
    lo = max(0, s - 200)  # line context looked at, bounded to stay linear on huge lines
    line_start = text.rfind("\n", lo, s) + 1 or lo
    small = all(int(p) < 100 for p in parts)
    return not (
        _NUMBER_CONTEXT.search(text, max(line_start, s - 24), s)  # "version 1.2.3.4", "section 4.1.1.2"
        or _OID_ON_LINE.search(text, line_start, s)  # '#define X_OID_CN "2.5.4.3"'
        or re.search(r"\w-$", text[max(0, s - 2) : s])  # "linux-2.6.8.1"
        or text[s - 1 : s] == "[" and text[e : e + 1] == "]"  # "[22.4.1.2]"
        or small and _LINE_START.search(text, max(0, s - 16), s)  # "// 23.3.4.2 iterators"
    )


def _merge(claimed: list[tuple], new: list[tuple]) -> list[tuple]:
    """Add the ``new`` spans (sorted) that overlap no ``claimed`` span (sorted, disjoint)."""
    out, i = [], 0
    for span in new:
        while i < len(claimed) and claimed[i][1] <= span[0]:
            out.append(claimed[i])
            i += 1
        free_right = i == len(claimed) or span[1] <= claimed[i][0]
        if span[0] < span[1] and free_right and (not out or out[-1][1] <= span[0]):
            out.append(span)
    return out + claimed[i:]


#: Line prefilters of the line-local detectors (:data:`_EMAIL`, :data:`_HOME`, :data:`_V6`,
#: :data:`_V4`): every match of the detector lies on one line and holds a match of its
#: prefilter, and its look-arounds treat the line's ``\n`` as they treat the string's
#: ends, so running the detector over the lines holding a prefilter hit finds exactly what
#: one pass over the whole text finds (:func:`_hit_lines`).
#: An e-mail holds ``@``, a domain label and a dot.
_EMAIL_LINES = re.compile(r"@[A-Za-z0-9-]+\.")
#: ``/home/``, ``/Users/``, ``\Users\`` (also inside ``\\Users\\``).
_HOME_LINES = re.compile(r"/(?:home|Users)/|\\Users\\")
#: An accepted IPv6 token (bare of its zone) holds two colons and a decimal digit, only
#: hex digits and dots stand between its first colon and its second, and its first group
#: (before the first colon) is at most 4 hex digits (``ipaddress`` refuses longer
#: groups): the digit is within the 4 characters before the first colon, or between the
#: first two colons, or after the second. Every branch starts at a colon (a fast literal
#: search).
_V6_LINES = re.compile(
    r":(?:(?<=\d:)|(?<=\d[0-9A-Fa-f]:)|(?<=\d[0-9A-Fa-f]{2}:)|(?<=\d[0-9A-Fa-f]{3}:))[0-9A-Fa-f.]*:"
    r"|:[0-9A-Fa-f.]*\d[0-9A-Fa-f.]*:|:[0-9A-Fa-f.]*:[0-9A-Fa-f.:]*\d")
#: A dotted quad holds ``.N.N.``.
_V4_LINES = re.compile(r"\.\d{1,3}\.\d{1,3}\.")


def _hit_lines(text: str, prefilter: re.Pattern) -> list[tuple[int, int]]:
    """``(start, end)`` of every line of ``text`` (``end`` at its ``\\n`` or the text's end)
    holding a match of ``prefilter`` (whose matches never hold ``\\n``), in order."""
    out, pos, n = [], 0, len(text)
    search = prefilter.search
    while True:
        m = search(text, pos)
        if m is None:
            return out
        end = text.find("\n", m.end())
        end = n if end < 0 else end
        out.append((text.rfind("\n", 0, m.start()) + 1, end))
        pos = end + 1


def _line_matches(rx: re.Pattern, text: str, prefilter: re.Pattern):
    """``rx.finditer(text)`` for a line-local ``rx`` (see :data:`_EMAIL_LINES`), run only
    on the lines holding a ``prefilter`` hit."""
    for ls, le in _hit_lines(text, prefilter):
        yield from rx.finditer(text, ls, le)


def _spans(text: str) -> list[tuple[int, int, str, str]]:
    """Non-overlapping ``(start, end, kind, replacement)`` sorted by start; detectors in
    priority order, existing redaction markers claimed first.

    Each detector runs only where it can match: the PEM block and the existing markers
    only when the text holds their literals, the line-local detectors only on the lines
    their prefilter finds (:func:`_line_matches`), with the same matches as a pass over
    the whole text."""
    secret, net, home = (REDACTION_MARKERS[k] for k in ("secret", "network_address", "home_path"))
    v6 = []
    for m in _line_matches(_V6, text, _V6_LINES):
        end = m.start() + len(m.group(0).rstrip("."))
        if not re.match(r"[\w(<]", text[end : end + 1]) and _ipv6_ok(text[m.start() : end]):
            v6.append((m.start(), end, "network_address", net))
    pem = "PRIVATE KEY" in text or "PuTTY-User-Key-File-" in text
    email = "@" in text
    homes = "/home/" in text or "/Users/" in text or "\\Users\\" in text
    passes = [
        [(m.start(), m.end(), "secret", secret) for m in (_PEM.finditer(text) if pem else ())],
        _widest([(s, e, "secret", secret) for s, e, _ in keyscan.format_spans(text)]),
        [(m.start(1), m.end(1), "secret", secret) for m in _BASIC_AUTH.finditer(text) if _password(m.group(1))],
        [(m.start(2), m.end(2), "secret", secret) for m in _assignments(text)
         if _key_like(m.group(2)) and not _PUBLIC_NAME.search(text, m.start(), m.start(2))],
        [(s, e, "secret", secret) for s, e in keyscan.generic_spans(text)],
        [(m.start(), m.end(), "email", REDACTION_MARKERS["email"])
         for m in (_line_matches(_EMAIL, text, _EMAIL_LINES) if email else ())],
        [
            (m.start(), m.end(), "home_path", home if m.group(1) or m.group(3) else home[:-1])
            for m in (_line_matches(_HOME, text, _HOME_LINES) if homes else ())
        ],
        v6,
        [(m.start(), m.end(), "network_address", net) for m in _line_matches(_V4, text, _V4_LINES) if _ipv4_ok(text, m)],
    ]
    markers = "<redacted-" in text or REDACTION_MARKERS["secret"] in text
    claimed = [(m.start(), m.end(), "", "") for m in (_MARKER.finditer(text) if markers else ())]
    for spans in passes:
        claimed = _merge(claimed, spans)
    return [c for c in claimed if c[2]]


#: ``_CLEAN.text``: the text :func:`scrub_text` is re-scanning when it redacted nothing
#: (its output is its input, on which :func:`_spans` just found nothing), so that
#: :func:`find_leaks` runs only the stricter re-scan on it; identity, never equality.
_CLEAN = threading.local()


def find_leaks(text: str) -> list[tuple[str, str]]:
    """``(kind, matched_text)`` for everything in ``text`` that either the redaction
    detectors or the stricter re-scan (:func:`megacpp_core.leak_rescan.strict_findings`,
    reported as kind ``secret``) flag, in text order. Redaction markers never count.
    Empty on properly scrubbed text."""
    known = getattr(_CLEAN, "text", None)
    spans = [] if known is not None and known is text else _spans(text)
    leaks = [(s, kind, text[s:e]) for s, e, kind, _ in spans]
    seen = {v for _, k, v in leaks if k == "secret"}
    pos = 0
    for _, value in leak_rescan.strict_findings(text, REDACTION_MARKERS["secret"]):
        if value not in seen:
            at = text.find(value, pos)
            leaks.append((at if at >= 0 else len(text), "secret", value))
    leaks.sort(key=lambda x: x[0])
    return [(kind, v) for _, kind, v in leaks]


def scrub_text(text: str, max_samples: int = 3) -> ScrubResult:
    """Redact e-mails, network addresses, secrets and home paths in ``text``.

    Deterministic and idempotent: scrubbing the output again changes nothing and counts
    zero. Raises :class:`LeakError` (naming the kinds) if a re-scan of the output still
    finds something.
    """
    out: list[str] = []
    counts = dict.fromkeys(KINDS, 0)
    at: list[tuple[int, str, str]] = []  # (offset in output, kind, marker)
    pos = size = 0
    spans = _spans(text)
    for s, e, kind, repl in spans:
        out += [text[pos:s], repl]
        size += s - pos
        at.append((size, kind, repl))
        size += len(repl)
        pos = e
        counts[kind] += 1
    out.append(text[pos:])
    result = "".join(out)
    samples = [
        {"kind": kind, "before": result[max(0, o - 40) : o + len(repl) + 40], "marker": repl}
        for o, kind, repl in at[:max_samples]
    ]
    if not spans:  # the output is the input, whose redaction detectors found nothing
        result = text
        _CLEAN.text = text
    try:
        leaks = find_leaks(result)
    finally:
        _CLEAN.text = None
    if leaks:
        raise LeakError(f"scrub output still holds: {sorted({k for k, _ in leaks})}")
    return ScrubResult(result, counts, samples)
