"""The fail-closed re-scan of scrubbed text: an independent, stricter detector set.

:func:`strict_findings` runs detect-secrets' own regex format plugins as shipped (not the
span regexes of the redaction pass) and the generic random-token rule of
:mod:`megacpp_core.keyscan` at a looser entropy threshold (:data:`STRICT_MARGIN`). The
scrub stage fails closed when it finds anything the redaction left
(:func:`megacpp_core.scrub.find_leaks`).
"""

from __future__ import annotations

import re
from functools import lru_cache

from .keyscan import STRICT_MARGIN, LiteralScanner, generic_spans, hyperscan, random_like, runs  # noqa: F401  (random_like: named in the docstring)

#: detect-secrets plugins run by the re-scan: every regex-based format plugin of
#: detect-secrets 1.5 except the keyword-assignment ones (``KeywordDetector``,
#: ``Cloudant``, ``IbmCloudIam``, ``IbmCosHmac``, ``Softlayer``: line-level keyword
#: heuristics that flag ``password = "short1"`` and need a Python call per line) and
#: ``IPPublicDetector`` (addresses are the ``network_address`` kind, with its own
#: keep-list).
STRICT_PLUGINS = (
    "AWSKeyDetector", "ArtifactoryDetector", "AzureStorageKeyDetector", "BasicAuthDetector",
    "DiscordBotTokenDetector", "GitHubTokenDetector", "GitLabTokenDetector", "JwtTokenDetector",
    "MailchimpDetector", "NpmDetector", "OpenAIDetector", "PrivateKeyDetector", "PypiTokenDetector",
    "SendGridDetector", "SlackDetector", "SquareOAuthDetector", "StripeDetector",
    "TelegramBotTokenDetector", "TwilioKeyDetector",
)
#: Per plugin, a regex every match of the plugin's own regexes contains (a literal the
#: pattern requires); the plugin runs only on the lines where it matches, as
#: detect-secrets itself scans line by line.
STRICT_PREFILTER = {
    "AWSKeyDetector": r"A3T|ABIA|ACCA|AKIA|ASIA|(?i:aws)",
    "ArtifactoryDetector": r"AKC|AP[\dABCDEF]",
    "AzureStorageKeyDetector": r"AccountKey=",
    "BasicAuthDetector": r"://",
    "DiscordBotTokenDetector": r"\.[A-Za-z\d_-]{6}\.",
    "GitHubTokenDetector": r"gh[pousr]_",
    "GitLabTokenDetector": r"gl(?:pat|dt|ft|soat|rt|cbt|imt)-|GR1348941",
    "JwtTokenDetector": r"eyJ",
    "MailchimpDetector": r"-us[0-9]",
    "NpmDetector": r":_authToken=",
    "OpenAIDetector": r"T3BlbkFJ",
    "PrivateKeyDetector": r"PRIVATE KEY|PuTTY-User-Key-File-2",
    "PypiTokenDetector": r"pypi-AgE",
    "SendGridDetector": r"SG\.",
    "SlackDetector": r"xox[abposr]-|hooks\.slack\.com",
    "SquareOAuthDetector": r"sq0csp-",
    "StripeDetector": r"k_live_",
    "TelegramBotTokenDetector": r":[0-9A-Za-z_-]{35}",
    "TwilioKeyDetector": r"(?:AC|SK)[a-z0-9]{32}",
}
#: Per plugin, literals one of which every match of its prefilter holds: without any of
#: them in the text the prefilter finds nothing and is not run (on ASCII text all of them
#: are looked for in one hyperscan pass, instead of a regex scan per plugin; Discord's
#: prefilter holds no literal but ``.``). AWS's ``(?i:aws)`` is tested on the lower-cased
#: text, plus ``\u017f`` (long s, which ``(?i)s`` matches).
STRICT_GATES = {
    "AWSKeyDetector": ("A3T", "ABIA", "ACCA", "AKIA", "ASIA", "\u017f"),
    "ArtifactoryDetector": ("AKC", "AP"),
    "AzureStorageKeyDetector": ("AccountKey=",),
    "BasicAuthDetector": ("://",),
    "GitHubTokenDetector": ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    "GitLabTokenDetector": ("glpat-", "gldt-", "glft-", "glsoat-", "glrt-", "glcbt-", "glimt-", "GR1348941"),
    "JwtTokenDetector": ("eyJ",),
    "MailchimpDetector": ("-us",),
    "NpmDetector": (":_authToken=",),
    "OpenAIDetector": ("T3BlbkFJ",),
    "PrivateKeyDetector": ("PRIVATE KEY", "PuTTY-User-Key-File-2"),
    "PypiTokenDetector": ("pypi-AgE",),
    "SendGridDetector": ("SG.",),
    "SlackDetector": ("xox", "hooks.slack.com"),
    "SquareOAuthDetector": ("sq0csp-",),
    "StripeDetector": ("k_live_",),
    "TwilioKeyDetector": ("AC", "SK"),
}
#: Lower-case literals of :data:`STRICT_GATES`, looked for in ``text.lower()``.
STRICT_GATES_LOWER = {"AWSKeyDetector": ("aws",)}
#: Plugins whose prefilter matches only inside a run of the base64url alphabet at least
#: this long (:func:`megacpp_core.keyscan.runs`, shared with the generic rule): without
#: such a run the prefilter is not run.
STRICT_RUN_GATES = {"TwilioKeyDetector": 34, "TelegramBotTokenDetector": 35}


@lru_cache(maxsize=4)
def _gate_scanners(literals: tuple[str, ...], lower: tuple[str, ...]) -> tuple[LiteralScanner, LiteralScanner]:
    return LiteralScanner(literals), LiteralScanner(lower, caseless=True)


def _gate_open(name: str, text: str, cache: dict) -> bool:
    """False when ``text`` cannot hold a match of the plugin's prefilter: no base64url run
    long enough (:data:`STRICT_RUN_GATES`), or none of its :data:`STRICT_GATES` literals.
    On ASCII text every gate literal is looked for in one hyperscan pass (``cache`` keeps
    what it found, and ``text.lower()`` otherwise)."""
    run = STRICT_RUN_GATES.get(name)
    if run and not any(e - s >= run for s, e in runs(text)):
        return False
    lits = STRICT_GATES.get(name)
    if lits is None:
        return True
    low = STRICT_GATES_LOWER.get(name, ())
    if text.isascii() and hyperscan is not None:
        if "found" not in cache:
            every = tuple(sorted({lit for v in STRICT_GATES.values() for lit in v if lit.isascii()}))
            every_low = tuple(sorted({lit for v in STRICT_GATES_LOWER.values() for lit in v}))
            exact, folded = _gate_scanners(every, every_low)
            cache["found"] = {every[i] for i in exact.present(text)}
            cache["found_lower"] = {every_low[i] for i in folded.present(text)}
        return any(lit in cache["found"] for lit in lits) or any(lit in cache["found_lower"] for lit in low)
    if any(lit in text for lit in lits):
        return True
    if low and "lower" not in cache:
        cache["lower"] = text.lower()
    return any(lit in cache["lower"] for lit in low)


_PLACEHOLDER = re.compile(r"%[-+ #0-9.*]*[a-zA-Z]|\{[^{}]*\}|<[^<>]*>|\$\{?\w+\}?|\*+|x{3,}|X{3,}")
_KEY_BODY = re.compile(r"[A-Za-z0-9+/=]{40,}")


@lru_cache(maxsize=1)
def _strict_plugins() -> tuple:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    classes = {c.__name__: c for c in get_mapping_from_secret_type_to_class().values()}
    return tuple((name, classes[name](), re.compile(STRICT_PREFILTER[name])) for name in STRICT_PLUGINS)


#: Longest piece of a line handed to one detect-secrets plugin call, and the overlap of
#: consecutive pieces of a longer line. Some plugin regexes rescan a whole run from every
#: start (``eyJ[...]+\\.``), quadratic in the run; lines of kept files are at most 1,000
#: characters (SPEC §4 quality), so only hostile or generated text is cut.
STRICT_LINE_WINDOW = 4096
STRICT_LINE_OVERLAP = 1024


def _plugin_matches(text: str, plugin, prefilter: re.Pattern):
    """``(match, offset)`` of the plugin's regexes on each line (or window of a long
    line, :data:`STRICT_LINE_WINDOW`) holding a prefilter hit, ``offset`` being where
    the scanned piece starts in ``text``."""
    done = -1
    for hit in prefilter.finditer(text):
        if hit.start() < done:
            continue
        lo = text.rfind("\n", 0, hit.start()) + 1
        hi = text.find("\n", hit.end())
        hi = len(text) if hi < 0 else hi
        if hi - lo > STRICT_LINE_WINDOW:
            lo = max(lo, hit.start() - STRICT_LINE_OVERLAP)
            hi = min(hi, lo + STRICT_LINE_WINDOW)
        done = hi if hi - lo < STRICT_LINE_WINDOW else hi - STRICT_LINE_OVERLAP
        piece = text[lo:hi]
        for rx in plugin.denylist:
            for m in rx.finditer(piece):
                yield m, lo


def strict_findings(text: str, marker: str) -> list[tuple[str, str]]:
    """``(detector, value)`` for every key-like string left in scrubbed ``text``, in text
    order; empty on properly scrubbed text. ``marker`` is the redaction marker (a
    value holding it was redacted).

    detect-secrets' plugins report a match of their regexes (the capture group when
    there is one) that their own validation accepts, dropping only: matches inside a
    longer letter/digit run (``ACCA`` + 16 letters inside a DNA test sequence is not
    an AWS key id), template and printf placeholders (``%s``, ``{password}``), values
    holding ``marker``, and private-key headers with no key material (40+ base64
    characters) in the 200 characters after them (a PEM parser's marker strings).
    Then every base64 run is tested with :func:`random_like` at :data:`STRICT_MARGIN`
    and the same context exemptions as the redaction.
    """
    found: list[tuple[int, str, str]] = []
    seen: set[tuple[int, int, str]] = set()
    gates: dict = {}
    for name, plugin, prefilter in _strict_plugins():
        if not _gate_open(name, text, gates):
            continue
        for m, off in _plugin_matches(text, plugin, prefilter):
            rx = m.re
            g = next((i for i in range(1, rx.groups + 1) if m.group(i)), 0) if rx.groups else 0
            value, s, e = m.group(g), m.start(g) + off, m.end(g) + off
            if not value or marker in value or (s, e, name) in seen:
                continue
            seen.add((s, e, name))
            if name == "JwtTokenDetector" and not plugin.is_formally_valid(value):
                continue
            if name == "PrivateKeyDetector":
                if not _KEY_BODY.search(text, e, e + 200):
                    continue
            elif (s and text[s - 1].isalnum() and text[s].isalnum()) or (
                    e < len(text) and text[e].isalnum() and text[e - 1].isalnum()):
                continue
            if _PLACEHOLDER.fullmatch(value) or value.startswith(("%", "{", "$", "<")):
                continue
            found.append((s, name, value))
    for s, e in generic_spans(text, STRICT_MARGIN):
        found.append((s, "GenericHighEntropy", text[s:e]))
    found.sort()
    return [(name, value) for _, name, value in found]
