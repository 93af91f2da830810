"""Secret detectors of the stage-3 scrub (SPEC §4): the redaction rules and the
independent fail-closed re-scan.

Two detector sets, on purpose written apart:

**Redaction rules** (:func:`format_spans`, :func:`generic_spans`; used by
:func:`megacpp_core.scrub.scrub_text` to decide what to replace):

``format``
    Issuer formats in the shape of gitleaks' rules and detect-secrets' plugins of the
    same names (:data:`FORMAT_RULES`): cloud access key ids, AWS secret keys next to an
    ``aws...key`` word, GitHub, GitLab, Slack, Stripe, Google, OpenAI, Anthropic, npm,
    PyPI, SendGrid, Twilio, Mailchimp, Square, Discord, Telegram, Hugging Face,
    DigitalOcean, Shopify, Databricks, Artifactory and age keys, JWTs, Azure storage
    keys and ``Password=``/``Pwd=``/``AccountKey=`` values of connection strings.
    One multi-pattern pass (:class:`LiteralScanner`: hyperscan, pyahocorasick on
    non-ASCII text) finds where a rule's literal prefix stands; only there is the
    rule's regex tried, so the pass is one scan of the text plus a few anchored matches.
``generic``
    Any maximal run of the base64 / base64url alphabet (``[A-Za-z0-9+/_-]``, then
    ``=`` padding) of at least :data:`GENERIC_MIN_LEN` characters, wherever it stands
    (string literal, comment, macro body, config value), that is *random-looking*
    (:func:`random_like`) and is not exempt by context (:func:`generic_spans`).

**Re-scan** (:func:`megacpp_core.leak_rescan.strict_findings`): detect-secrets' own format plugins (their
regexes and their validation, e.g. the JWT JSON check) run over the scrubbed text,
plus the generic shape test with stricter thresholds (:data:`STRICT_MARGIN`) over every
base64 run of the output, found by its own scan. Anything it reports makes the scrub
fail closed (:class:`megacpp_core.scrub.LeakError`).

Random-looking, measured rather than guessed (``bench/scrub_secrets.py`` prints the
figures): a token of ``n`` characters is random-looking when

* it holds an upper-case letter, a lower-case letter and a digit (from 32 characters
  on, ``+`` or ``/`` will do),
  and is not a hex number (``0x...`` with C suffixes) or a pure hex string: digests,
  hash test vectors and hex lookup tables never match;
* its Shannon entropy is at least :func:`expected_entropy` ``(n) -`` :func:`entropy_slack`
  ``(n)``: the plug-in entropy a string of ``n`` uniform draws from 64 symbols has on
  average, less a length-dependent slack set at the 1e-4 quantile of 20,000 random
  base64 / base62 / base64url tokens per length (long test strings made of a few
  letters, alphabet tables and repeated patterns fall below it);
* at most a fraction :func:`structure_limit` ``(n)`` of it is *structure*: words of
  three or more letters holding a vowel (``Get``, ``Buffer``, ``PYTHONPATH``), digit
  runs of three or more, ``_`` and ``-`` separators. The limit is the 1e-4 quantile of
  the same random tokens; identifiers (``LZ4_decompress_safe_withPrefix64k``) and
  paths are mostly structure.

Context exemptions of the generic rule (never of the format rules):

* a C/C++ identifier (``[A-Za-z_]\\w*``) that is used as a name in code somewhere in
  the same text (outside comments and string literals, not as the value of a
  ``#define NAME VALUE`` line nor right after ``=`` or ``:``) is a name, not a secret,
  also where a comment or string mentions it;
* a token on a line (or right under a line) labelled as test data (:data:`TEST_LABEL`:
  ``test vector``, ``known answer``, ``expected``, ``fixture``, ...) is a fixture; one
  labelled as a digest (:data:`DIGEST_LABEL`: ``digest``, ``sha256``, ``md5``, ...) is
  one only when it has a digest's size (:data:`DIGEST_BYTES`) and no key word
  (:data:`KEY_WORDS`) labels it too;
* a ``/``-separated path whose parts are words (``rapidfuzz/distance/LCSseq``);
* public key material: the body of an armored block that is not private
  (``-----BEGIN CERTIFICATE-----``, ``PUBLIC KEY``, ``PGP SIGNATURE``, ...) and OpenSSH
  public keys (``ssh-rsa AAAA...``).

Why no ready-made entropy detector: detect-secrets' ``Base64HighEntropyString`` looks
only at quoted strings with one fixed limit (4.5 bits/char), which misses random
tokens shorter than ~28 characters and flags long non-random test strings (the
rapidfuzz test texts of the default corpus reach 4.7 bits/char over 96 characters);
it also reports lines, not the character spans a replacement needs. Its format plugins
are used as they are, in the re-scan.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections import Counter
from functools import lru_cache
from itertools import accumulate

import ahocorasick
import numpy as np

try:  # one pass of a multi-pattern engine; pyahocorasick otherwise
    import hyperscan
except ImportError:  # pragma: no cover - a dependency; without it the same results, slower
    hyperscan = None


class LiteralScanner:
    """Every occurrence of ASCII literals in a text in one pass: hyperscan (4× pyahocorasick on ``default``), else an
    automaton; ``caseless``: ASCII texts only (``ValueError``). A non-ASCII text is scanned as UTF-8 and offsets
    mapped to ``str`` indices. :meth:`hits`: sorted ``(start, literal index)``, overlaps included; :meth:`present`: indices found."""

    def __init__(self, literals, caseless: bool = False):
        self.literals, self.caseless, self._dbs, self._auto = tuple(literals), caseless, {}, None
        self._lens = tuple(map(len, self.literals))  # once, not per text: platforms scan 1,930 per document

    def _db(self, text: str, single: bool):
        if hyperscan is None or (self.caseless and not text.isascii()):
            return None
        if single not in self._dbs:
            flags = (hyperscan.HS_FLAG_CASELESS if self.caseless else 0) | (hyperscan.HS_FLAG_SINGLEMATCH if single else 0)
            db = self._dbs[single] = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            db.compile(expressions=[re.escape(lit).encode("ascii") for lit in self.literals],
                       ids=list(range(len(self.literals))), elements=len(self.literals), flags=[flags] * len(self.literals))
        return self._dbs[single]

    def hits(self, text: str) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        db = self._db(text, False) if text else None
        if db is not None:
            lens, data = self._lens, text.encode("utf-8", "surrogatepass")
            db.scan(data, match_event_handler=lambda i, _f, to, _fl, _c: out.append((to - lens[i], i)))
            if out and len(data) != len(text):  # byte offset -> index of the character starting there
                lead = np.cumsum((np.frombuffer(data, np.uint8) & 0xC0) != 0x80, dtype=np.int64)
                out = list(zip((lead[(got := np.asarray(out, dtype=np.int64))[:, 0]] - 1).tolist(), got[:, 1].tolist()))
        elif text:
            out = list(self._automaton_hits(text))
        return sorted(out)

    def present(self, text: str) -> set[int]:
        found: set[int] = set()
        if (db := self._db(text, True) if text else None) is None:
            return {i for _, i in self._automaton_hits(text)} if text else found
        db.scan(text.encode("utf-8", "surrogatepass"), match_event_handler=lambda i, _f, _t, _fl, _c: found.add(i))
        return found

    def _automaton_hits(self, text: str):
        if self.caseless:
            if not text.isascii():
                raise ValueError("a caseless LiteralScanner scans ASCII text only")
            text = text.lower()
        if self._auto is None:  # one word per distinct literal, with every index it has (as hyperscan)
            self._auto, ids = ahocorasick.Automaton(), {}
            for i, lit in enumerate(self.literals):
                ids.setdefault(lit.lower() if self.caseless else lit, []).append(i)
            for word, idx in ids.items():
                self._auto.add_word(word, (len(word), idx))
            self._auto.make_automaton()
        for end, (n, idx) in self._auto.iter(text):
            yield from ((end - n + 1, i) for i in idx)


#: Shortest generic key-like token ("20+ characters": AWS secret keys are 40, API tokens 20-64).
GENERIC_MIN_LEN = 20
#: Extra entropy slack (bits/char) of the re-scan, so that it flags a superset of what the
#: redaction rules flag (about one standard deviation of a random 40-character token's entropy).
STRICT_MARGIN = 0.1


def shannon_entropy(s: str) -> float:
    """Shannon entropy of the character distribution of ``s`` in bits/char (0.0 if empty)."""
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values()) if n else 0.0


@lru_cache(maxsize=4096)
def expected_entropy(n: int, k: int = 64) -> float:
    """Expected plug-in Shannon entropy (bits/char) of ``n`` independent uniform draws
    from ``k`` symbols: ``log2 n - (k/n) * E[N log2 N]`` with ``N ~ Binomial(n, 1/k)``,
    summed over ``N`` within 12 standard deviations of its mean (binomial terms in log
    space, so any ``n`` works). ``n >= 1``."""
    p = 1.0 / k
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    lo, hi = max(2, int(mean - 12 * sd) - 10), min(n, int(mean + 12 * sd) + 10)
    base = math.lgamma(n + 1)
    s = 0.0
    for j in range(lo, hi + 1):
        logpmf = base - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * math.log(p) + (n - j) * math.log1p(-p)
        s += math.exp(logpmf) * j * math.log2(j)
    return math.log2(n) - k * s / n


def entropy_slack(n: int) -> float:
    """How far (bits/char) below :func:`expected_entropy` a random token of length ``n``
    may fall: ``0.25 + 2.0 / sqrt(n)``, just below the 1e-4 quantile of 20,000 random
    base64, base62 and base64url tokens of each length 20..86 (fitted; re-measured by
    ``bench/scrub_secrets.py --calibrate``)."""
    return 0.25 + 2.0 / math.sqrt(n)


def structure_limit(n: int) -> float:
    """Largest structure fraction (:func:`structure_fraction`) of a random-looking
    token of length ``n``: ``0.30 + 2.2 / sqrt(n)``, about the 1e-3 quantile of the same
    random tokens (0.80 at n=20, 0.65-0.68 at n=40, 0.55-0.58 at n=64). A tighter
    quantile would let short names such as ``setAttr-Token-B0Prime`` (0.90) through:
    the cost is ~1e-3 of random 20-30 character tokens missed, measured."""
    return 0.34 + 2.5 / math.sqrt(n)


_STRUCT = re.compile(r"[A-Z]?[a-z]{2,}|[A-Z]{2,}(?![a-z])|\d{3,}|[_-]")
_VOWEL = re.compile(r"[aeiouAEIOU]")


def structure_fraction(token: str) -> float:
    """Share of ``token``'s characters in words (3+ letters, Capitalized or all-caps or
    lower-case, holding a vowel) and digit runs of 3+, each ``_``/``-`` separator counted
    twice (random base64url tokens hold one per 32 characters, names one per 5-8);
    capped at 1.0."""
    s = 0
    for m in _STRUCT.finditer(token):
        w = m.group(0)
        if w in "_-":
            s += 2
        elif w[0].isdigit() or (len(w) >= 3 and _VOWEL.search(w)):
            s += len(w)
    return min(1.0, s / len(token)) if token else 0.0


_HEX_NUMBER = re.compile(r"(?:0[xX])?[0-9A-Fa-f']+(?:[uU]?[lLzZ]{0,2}|[lLzZ]{0,2}[uU]?)")
#: A C/C++ floating literal's digits from where a base64 run can start (after the ``.``):
#: ``5.896624628001300E+17f`` gives the run ``896624628001300E+17f`` (boost's math tests).
_DECIMAL_NUMBER = re.compile(r"\d[\d']*(?:[eE][+-]?\d+)?(?:[fFlL]|[fF](?:16|32|64|128)|[bB][fF]16)?")
_HAS_LOWER = re.compile(r"[a-z]")
_HAS_UPPER = re.compile(r"[A-Z]")
_HAS_DIGIT = re.compile(r"[0-9]")
_HAS_B64_SYMBOL = re.compile(r"[+/]")
#: From this length on a ``+`` or ``/`` stands in for the digit (a random 40-character
#: base64 key lacks a digit once in a thousand draws; shorter runs with ``/`` and no
#: digit are mostly prose such as ``NTLM/Negotiate-based``).
_SYMBOL_FOR_DIGIT_LEN = 32


def random_like(token: str, margin: float = 0.0) -> bool:
    """True when ``token`` (padding ``=`` already stripped) has the shape of a random key
    (see the module docstring). ``margin`` (bits/char) loosens the entropy threshold (the
    re-scan passes :data:`STRICT_MARGIN`)."""
    n = len(token)
    if n < GENERIC_MIN_LEN or not (_HAS_LOWER.search(token) and _HAS_UPPER.search(token)):
        return False
    if not (_HAS_DIGIT.search(token) or (n >= _SYMBOL_FOR_DIGIT_LEN and _HAS_B64_SYMBOL.search(token))):
        return False
    if _HEX_NUMBER.fullmatch(token) or _DECIMAL_NUMBER.fullmatch(token):
        return False
    if shannon_entropy(token) < expected_entropy(n) - entropy_slack(n) - margin:
        return False
    if structure_fraction(token) > structure_limit(n):
        return False
    return not _path_like(token)


def _path_like(token: str) -> bool:
    """``a/b/c`` (two slashes or more: one slash splits random base64 into two short
    parts that are words by chance too often) whose parts (3+ chars) are mostly words
    or numbers: a path or URL tail."""
    if token.count("/") < 2:
        return False
    parts = [p for p in token.split("/") if len(p) >= 3]
    if len(parts) < 2:
        return False
    wordy = sum(len(p) for p in parts if p.isdigit() or structure_fraction(p) >= 0.75)
    return wordy >= 0.6 * sum(len(p) for p in parts)


# --------------------------------------------------------------------------- formats

_B64 = "A-Za-z0-9+/"
_AZ09 = "A-Za-z0-9"
#: ``(name, literal prefixes, regex tried at each prefix hit, needs a left boundary)``.
#: Every repetition is bounded (256 characters for a token, 4-8 KiB for a JWT segment) so
#: that a text made of one prefix repeated costs at most that bound per hit.
#: A rule's regex is matched at the prefix's start; group ``s`` (when present) is the
#: redacted part, else the whole match. Shapes from gitleaks' default rules and
#: detect-secrets' plugins of the same names; prefixes as published by each issuer.
FORMAT_RULES: tuple[tuple[str, tuple[str, ...], str, bool], ...] = (
    ("aws_access_key_id",
     ("A3T", "AKIA", "ASIA", "ABIA", "ACCA", "AGPA", "AIDA", "AROA", "AIPA", "ANPA", "ANVA", "ASCA"),
     r"(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ASCA)[A-Z0-9]{16}(?![A-Za-z0-9])", True),
    ("github_token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), r"gh[pousr]_[A-Za-z0-9_]{36,255}", True),
    ("github_fine_grained_pat", ("github_pat_",), r"github_pat_[A-Za-z0-9_]{22,255}", True),
    ("gitlab_token", ("glpat-", "gldt-", "glft-", "glsoat-", "glrt-", "glptt-", "glcbt-", "glimt-", "GR1348941"),
     r"(?:(?:glpat|gldt|glft|glsoat|glrt|glptt|glimt)-|glcbt-(?:[0-9a-fA-F]{2}_)?|GR1348941)[A-Za-z0-9_-]{20,64}", True),
    ("slack_token", ("xoxa-", "xoxb-", "xoxp-", "xoxo-", "xoxs-", "xoxr-", "xoxe-", "xapp-"),
     r"(?:xox[abposre](?:\.[A-Za-z0-9-]{1,64})?|xapp)-[0-9A-Za-z-]{10,256}", True),
    ("slack_webhook", ("https://hooks.slack.com/",),
     r"https://hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9_/+-]{20,256}", False),
    ("google_api_key", ("AIza",), r"AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])", True),
    ("google_oauth_secret", ("GOCSPX-",), r"GOCSPX-[A-Za-z0-9_-]{28}", True),
    ("stripe_key", ("sk_live_", "rk_live_", "sk_test_", "rk_test_", "sk_prod_", "rk_prod_"),
     r"[rs]k_(?:live|test|prod)_[0-9A-Za-z]{10,99}", True),
    ("jwt", ("eyJ",), r"eyJ[A-Za-z0-9_=-]{7,4096}\.[A-Za-z0-9_=-]{1,8192}(?:\.[A-Za-z0-9_.+/=-]{0,4096})?", True),
    ("npm_token", ("npm_",), r"npm_[A-Za-z0-9]{36}", True),
    ("npmrc_auth", (":_authToken=",), r":_authToken=\s*(?P<s>[^\s\"'`]+)", False),
    ("pypi_token", ("pypi-AgE",), r"pypi-AgE[A-Za-z0-9_-]{70,1024}", True),
    ("openai_key", ("sk-",), r"sk-[A-Za-z0-9_-]{20,160}T3BlbkFJ[A-Za-z0-9_-]{20,160}", True),
    ("anthropic_key", ("sk-ant-",), r"sk-ant-(?:api|admin)\d\d-[A-Za-z0-9_-]{80,256}", True),
    ("sendgrid_key", ("SG.",), r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}", True),
    ("square_token", ("sq0csp-", "sq0atp-", "EAAA"), r"sq0csp-[0-9A-Za-z\\_-]{43}|sq0atp-[0-9A-Za-z_-]{22}|EAAA[A-Za-z0-9_+=-]{60}", True),
    ("huggingface_token", ("hf_",), r"hf_[A-Za-z]{34}(?![A-Za-z0-9])", True),
    ("digitalocean_token", ("dop_v1_", "doo_v1_", "dor_v1_"), r"do[opr]_v1_[a-f0-9]{64}", True),
    ("shopify_token", ("shpat_", "shpca_", "shppa_", "shpss_"), r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}", True),
    ("databricks_token", ("dapi",), r"dapi[a-f0-9]{32}(?:-\d)?(?![A-Za-z0-9])", True),
    ("age_secret_key", ("AGE-SECRET-KEY-1",), r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}", False),
    ("azure_storage_key", ("AccountKey=", "SharedAccessKey="),
     r"(?:AccountKey|SharedAccessKey)=(?P<s>[A-Za-z0-9+/]{40,256}={0,2}|[A-Za-z0-9+/=]{88})", False),
    ("connection_string_password", ("Password=", "password=", "PASSWORD=", "Pwd=", "pwd=", "PWD="),
     (r"(?:Password|password|PASSWORD|Pwd|pwd|PWD)=(?!(?:None|null|NULL|nil|true|false)\b)"
      r"(?P<s>[^;\s\"'%{}<>$()]{3,256})(?=[;\s\"']|$)"), False),
    ("aws_secret_key", ("aws", "AWS", "Aws"),
     r"(?i:aws).{0,20}?(?i:key|pwd|pw|password|pass|token).{0,20}?['\"](?P<s>[0-9a-zA-Z/+]{40})['\"]", False),
)
#: Formats without a literal prefix of 3+ characters.
_TWILIO = re.compile(r"(?<![A-Za-z0-9])(?:AC|SK)[a-z0-9]{32}(?![A-Za-z0-9])")
#: detect-secrets' ``(?:\s|=|:|"|^)`` left and ``(?:\s|"|$)`` right delimiters.
_ARTIFACTORY = re.compile(r"A(?:KC[a-zA-Z0-9]{10,256}|P[\dABCDEF][a-zA-Z0-9]{8,256})(?=[\s\"]|$)")
_ARTIFACTORY_LEFT = frozenset(" \t\r\n\f\v=:\"")
#: Discord bot token ``[MNO]`` + 23-25, ``.``, 6, ``.``, 27 (found from its last segment).
_DISCORD_TAIL = re.compile(r"\.[A-Za-z\d_-]{6}\.[A-Za-z\d_-]{27}(?![A-Za-z0-9_-])")
_DISCORD_HEAD = re.compile(r"[MNO][A-Za-z\d_-]{23,25}")
#: Telegram bot token ``\d{8,10}:`` + 35 (found from the run after its colon).
_TELEGRAM_TAIL = re.compile(r":[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])")
_TELEGRAM_HEAD = re.compile(r"\d{8,10}")
#: Mailchimp key: 32 ``[0-9a-z]`` + ``-us`` + 1-2 digits.
_MAILCHIMP = re.compile(r"(?<![0-9a-z])[0-9a-z]{32}-us[0-9]{1,2}(?![0-9])")


def _run_formats(text: str) -> list[tuple[int, int, str]]:
    """Twilio, Discord, Telegram and Mailchimp keys: each holds a run of 27+ characters of
    the base64url alphabet, so they are looked for only around the runs :data:`_RUN`
    finds (one scan shared with the generic rule), with the full regex anchored there."""
    out = []
    for s, e in runs(text):
        if e - s >= 34:
            out.extend((t.start(), t.end(), "twilio_key") for t in _TWILIO.finditer(text, s, e))
        if s and text[s - 1] == ":":
            t = _TELEGRAM_TAIL.match(text, s - 1)
            if t:
                for h in range(max(0, s - 11), s - 8):
                    if _TELEGRAM_HEAD.fullmatch(text, h, s - 1) and not (h and text[h - 1].isdigit()):
                        out.append((h, t.end(), "telegram_token"))
                        break
        if s >= 8 and text[s - 1] == "." and text[s - 8] == ".":
            t = _DISCORD_TAIL.match(text, s - 8)
            if t:
                for h in range(max(0, s - 34), s - 31):
                    if _DISCORD_HEAD.fullmatch(text, h, s - 8) and not (h and text[h - 1] in _B64URL_CHARS):
                        out.append((h, t.end(), "discord_token"))
                        break
        if "-us" in text[s:e]:
            for t in _MAILCHIMP.finditer(text, s, e):
                out.append((t.start(), t.end(), "mailchimp_key"))
    return out


_B64URL_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"


@lru_cache(maxsize=1)
def _format_prefixes() -> tuple[LiteralScanner, tuple[tuple[int, ...], ...]]:
    """The scanner of every rule's literal prefixes, and per prefix the rules it starts."""
    rules: dict[str, list[int]] = {}
    for i, (_, prefixes, _, _) in enumerate(FORMAT_RULES):
        for p in prefixes:
            rules.setdefault(p, []).append(i)
    return LiteralScanner(rules), tuple(tuple(idx) for idx in rules.values())


@lru_cache(maxsize=1)
def _format_regexes() -> tuple[re.Pattern, ...]:
    return tuple(re.compile(r) for _, _, r, _ in FORMAT_RULES)


def format_spans(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, rule_name)`` of every issuer-format secret in ``text`` (may overlap;
    sorted by start)."""
    out = []
    regexes = _format_regexes()
    scanner, rules_of = _format_prefixes()
    for start, k in scanner.hits(text):
        idx = rules_of[k]
        before = text[start - 1] if start else "\n"
        for i in idx:
            name, _, _, left = FORMAT_RULES[i]
            if left and before.isalnum():
                continue
            if name == "jwt" and text.find(".", start, start + 4100) < 0:
                continue
            m = regexes[i].match(text, start)
            if m:
                s, e = m.span("s") if "s" in regexes[i].groupindex else m.span()
                out.append((s, e, name))
    out.extend((m.start(), m.end(), "artifactory_token") for m in _ARTIFACTORY.finditer(text)
               if not m.start() or text[m.start() - 1] in _ARTIFACTORY_LEFT)
    out.extend(_run_formats(text))
    out.sort()
    return out


# --------------------------------------------------------------------------- generic

#: Candidate runs of the base64 / base64url alphabet with ``=`` padding.
_RUN = re.compile(rf"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{{{GENERIC_MIN_LEN},}}={{0,3}}")
_IDENT = re.compile(r"[A-Za-z_]\w*")


#: Code points of the :data:`_RUN` alphabet, as a lookup table over the first 128.
_RUN_TABLE = np.zeros(128, dtype=bool)
_RUN_TABLE[np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-", dtype=np.uint8)] = True
_PAD = ord("=")


@lru_cache(maxsize=4)
def runs(text: str) -> tuple[tuple[int, int], ...]:
    """Spans of :data:`_RUN` in ``text`` (one scan shared by the format and generic rules;
    the last few texts cached), found with numpy over the code points: maximal runs of
    the alphabet of :data:`GENERIC_MIN_LEN`+ characters, each with up to 3 ``=`` after."""
    if len(text) < GENERIC_MIN_LEN:
        return ()
    if text.isascii():
        cps = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
        inside = _RUN_TABLE[cps]
    else:  # one code point per element, lone surrogates included
        cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        inside = _RUN_TABLE[np.minimum(cps, 127)] & (cps < 128)
    step = np.diff(inside.view(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts = np.flatnonzero(step == 1)
    ends = np.flatnonzero(step == -1)
    keep = ends - starts >= GENERIC_MIN_LEN
    starts, ends = starts[keep], ends[keep]
    if not len(ends):
        return ()
    n = len(cps)
    for _ in range(3):  # "=" padding, up to 3, each only after the previous one
        pad = ends < n
        pad[pad] = cps[ends[pad]] == _PAD
        ends = ends + pad
    return tuple(zip(starts.tolist(), ends.tolist()))
#: Lexer for :func:`code_names`: comments and literals are skipped, ``#define NAME``
#: and identifiers of 3+ characters are captured.
_CODE_LEX = re.compile(
    r"//[^\n]*|/\*[\s\S]*?(?:\*/|$(?![\s\S]))|\"(?:\\.|[^\"\\\n])*\"?|'(?:\\.|[^'\\\n])*'?"
    r"|(?P<define>^[ \t]*#[ \t]*define[ \t]+\w+[ \t]+)(?=[A-Za-z_]\w*[ \t]*$)"
    r"|(?P<id>[A-Za-z_]\w{2,})",
    re.MULTILINE,
)
#: Characters after an identifier that make it code even as an assigned value (a
#: config value ends its line, or is followed by ``&`` or a quote).
_CODE_AFTER = frozenset("(;,)[.*%|^<>?")
#: Operators that make a value code when a space stands before them (``x = kMax + 1``);
#: inside a base64 key ``+ - /`` follow a character directly.
_SPACED_OPERATORS = frozenset("+-/&=")
#: Syntactic name references in prose: ``name(``, a backquoted ```name```, ``::name``,
#: ``->name``, ``.name``.
_NAME_REFERENCE_BEFORE = ("`", "::", "->", ".")
#: Labels of test data on the token's line or the line above (case-insensitive words):
#: they exempt any random-looking token. Words saying only what a token *is* ("base64",
#: "encoded", "key") are not labels: ``// HMAC key (base64)`` heads a key.
TEST_LABEL = re.compile(
    r"(?i)(?<![a-z])(?:test[ _-]?vectors?|test[ _-]?data|known[ _-]?answers?|kat|expected|expect|fixtures?"
    r"|sample[ _-]?data|golden)(?![a-z])"
)
#: Labels of a digest on the token's line or the line above: they exempt a token only when
#: its size is a digest's (:data:`DIGEST_BYTES` once base64-decoded).
DIGEST_LABEL = re.compile(
    r"(?i)(?<![a-z])(?:digest|checksum|hash|sha-?(?:1|224|256|384|512)|sha3|md5|crc-?32|blake2[bs]?)(?![a-z])"
)
#: Words that veto a digest label: ``// SHA-256 HMAC key`` heads a key of a digest's size.
KEY_WORDS = re.compile(r"(?i)(?<![a-z])(?:key|secret|token|passw(?:or)?d|credentials?|api)(?![a-z])")
#: Digest sizes in bytes: MD5 16, SHA-1 20, SHA-224 28, SHA-256 32, SHA-384 48, SHA-512 64.
DIGEST_BYTES = frozenset({16, 20, 28, 32, 48, 64})


@lru_cache(maxsize=4)
def code_names(text: str) -> frozenset[str]:
    """Identifiers (3+ characters) used in code in ``text``: outside comments, string and
    character literals. A value right after ``=`` or a single ``:`` (how config values
    stand) counts only when followed by one of ``( ; , ) [ . * % | ^ < > ?`` (a call, a statement, an argument,
    an operand; not ``+ - /``, which base64 keys hold); the value of a ``#define NAME
    VALUE`` line counts when it holds ``_`` (C naming; random base62 keys never do) or is
    so followed. The last few texts' sets are cached (the redaction and the re-scan
    both ask)."""
    names = set()
    value_next = False
    n = len(text)
    for m in _CODE_LEX.finditer(text):
        kind = m.lastgroup
        if kind == "define":
            value_next = True
            continue
        if kind != "id":
            value_next = False
            continue
        tok = m.group("id")
        in_define, value_next = value_next, False
        j = m.start() - 1
        while j >= 0 and text[j] in " \t":
            j -= 1
        prev = text[j] if j >= 0 else ""
        assigned = (prev == "=" and text[j - 1 : j] not in ("=", "!", "<", ">")) or (
            prev == ":" and text[j - 1 : j] != ":")
        if (in_define and "_" not in tok) or assigned:
            k = m.end()
            while k < n and text[k] in " \t":
                k += 1
            after = text[k] if k < n else ""
            if not (after and (after in _CODE_AFTER or (k > m.end() and after in _SPACED_OPERATORS))):
                continue
        names.add(tok)
    return frozenset(names)


_SPLIT_OPS = re.compile(r"[+/-]")


def _name_reference(text: str, s: int, e: int) -> bool:
    """An identifier written as a reference to code: called (``name(``), backquoted
    (```name```), or after ``::``, ``->`` or ``.``."""
    return text[e : e + 1] in ("(", "`") or text[max(0, s - 2) : s].endswith(_NAME_REFERENCE_BEFORE)


def _name_family(tok: str, names: frozenset[str]) -> bool:
    """``ZSTD_c_experimentalParam6`` mentioned in a comment when ``ZSTD_c_...`` names are
    used in code: the token's prefix through its last ``_`` (4+ characters) starts a
    code name."""
    cut = tok.rfind("_") + 1
    if cut < 4:
        return False
    prefix = tok[:cut]
    return any(n.startswith(prefix) for n in names)


def _code_expression(tok: str, names: frozenset[str]) -> bool:
    """``match+LZ4_DISTANCE_MAX``: numbers and code names of the text joined by ``+ - /``,
    each name of 8+ characters mostly words (:func:`structure_fraction` >= 0.5), so that
    a base64 key that the C lexer splits at ``+`` and ``/`` is not taken for one."""
    parts = [p for p in _SPLIT_OPS.split(tok) if p]
    return len(parts) >= 2 and all(
        p.isdigit() or (p in names and (len(p) < 8 or structure_fraction(p) >= 0.5)) for p in parts)


def _labelled(text: str, start: int, end: int, digests: bool = True) -> bool:
    """True when the token ``text[start:end]`` is labelled test data (:data:`TEST_LABEL`)
    or, with ``digests``, a labelled digest of a digest's size (:data:`DIGEST_LABEL`, no
    :data:`KEY_WORDS` near it) on its line before it or on the line above."""
    line_start = text.rfind("\n", 0, start) + 1
    prev_start = text.rfind("\n", 0, max(0, line_start - 1)) + 1 if line_start else line_start
    if TEST_LABEL.search(text, prev_start, start):
        return True
    if digests and DIGEST_LABEL.search(text, prev_start, start) and not KEY_WORDS.search(text, prev_start, start):
        body = text[start:end].rstrip("=")
        return (len(body) * 6) // 8 in DIGEST_BYTES
    return False


def generic_candidates(text: str, margin: float = 0.0) -> list[tuple[int, int]]:
    """Spans of random-looking base64 runs (padding included), before context exemptions."""
    out = []
    for start, end in runs(text):
        tok = text[start:end].rstrip("=")
        if tok.startswith("//"):  # a comment marker glued to the word after it
            cut = len(tok) - len(tok.lstrip("/"))
            start, tok = start + cut, tok[cut:]
        if random_like(tok, margin):
            out.append((start, end))
    return out


#: Armored blocks whose base64 body is public (certificates, public keys, signatures):
#: any ``-----BEGIN X-----`` ... ``-----END X-----`` whose label has no ``PRIVATE``.
_ARMOR = re.compile(r"-----BEGIN ((?:(?!PRIVATE)[A-Z0-9 ])+)-----[\s\S]{0,65536}?-----END \1-----")
#: OpenSSH public keys (``ssh-rsa AAAA...``): public by definition.
_SSH_PUBLIC = re.compile(r"(?:ssh-(?:rsa|dss|ed25519)|ecdsa-sha2-nistp\d+|sk-(?:ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com)[ \t]+AAAA[A-Za-z0-9+/]+=*")


def _public_spans(text: str) -> list[tuple[int, int]]:
    spans = []
    if "-----BEGIN " in text:
        spans += [m.span() for m in _ARMOR.finditer(text)]
    if "AAAA" in text:
        spans += [m.span() for m in _SSH_PUBLIC.finditer(text)]
    return sorted(spans)


def generic_spans(text: str, margin: float = 0.0, digest_labels: bool = True) -> list[tuple[int, int]]:
    """Spans of generic key-like tokens in ``text`` after the context exemptions of the
    module docstring (code names, labelled test data, word paths). ``digest_labels``:
    whether a digest label exempts a digest-sized token."""
    cands = generic_candidates(text, margin)
    if not cands:
        return []
    names: frozenset[str] | None = None
    public = _public_spans(text)
    starts, reach = [ps for ps, _ in public], list(accumulate((pe for _, pe in public), max))
    out = []
    for s, e in cands:
        i = bisect_right(starts, s)  # a public span holds [s, e) iff one starting at or before s reaches e
        if i and reach[i - 1] >= e:
            continue
        tok = text[s:e].rstrip("=")
        if _IDENT.fullmatch(tok) or (_SPLIT_OPS.search(tok) and _IDENT.match(tok)):
            if names is None:
                names = code_names(text)
            if tok in names or _code_expression(tok, names) or _name_family(tok, names) or _name_reference(text, s, e):
                continue
        if _labelled(text, s, e, digest_labels):
            continue
        out.append((s, e))
    return out
