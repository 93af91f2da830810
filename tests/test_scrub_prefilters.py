"""The scrub's prefilters and gates never drop a real finding.

Each detector that runs only where a prefilter or a literal gate says it can match is
compared with the same detector run over the whole text, on hostile texts: triggers
hidden right at a prefilter's boundary (the digit of an IPv6 address four characters
before its first colon), non-ASCII letters that are word characters or change length
when lower-cased, the long s that ``(?i)s`` matches, invalid surrogates, ``\\r\\n`` and
Unicode line separators, and one 10 MB line.
"""

from __future__ import annotations

import random
import re

import pytest

from megacpp_core import keyscan, leak_rescan, scrub
from megacpp_core.scrub import REDACTION_MARKERS, find_leaks, scrub_text

NET, EMAIL, HOME, SECRET = (REDACTION_MARKERS[k] for k in ("network_address", "email", "home_path", "secret"))
#: Pieces that come near the line-local detectors' triggers.
PIECES = (
    "::", ":", ".", "1", "9", "0", "a", "f", "F", "g", "x", "%", "%eth0", "@", "@ex", ".com", "/home/", "/Users/",
    "\\Users\\", "C:", "\\\\", "/", " ", "\n", "\r\n", "\t", "(", "<", "[", "]", "-", "_", "é", "İ", "ſ", "\u2028",
    "\ud800", "\udfff", "😀", "12", "255", "1.2", "::1", "fe80", "2001:db8", "ffff", "10.0.0.1", "version ",
    "OID ", "linux-", "user", "a.b", "1a2b", "abcd", "9abc",
)


def _hostile(seed: int, n: int = 400) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(PIECES) for _ in range(n))


def _v6_accepted(text, matches):
    out = []
    for m in matches:
        end = m.start() + len(m.group(0).rstrip("."))
        if not re.match(r"[\w(<]", text[end : end + 1]) and scrub._ipv6_ok(text[m.start() : end]):
            out.append((m.start(), end))
    return out


def _check_line_local(text: str) -> None:
    """Every line-local detector finds, through its line prefilter, what a pass over the
    whole text finds (IPv6: the addresses it accepts)."""
    for rx, pre in ((scrub._EMAIL, scrub._EMAIL_LINES), (scrub._HOME, scrub._HOME_LINES), (scrub._V4, scrub._V4_LINES)):
        assert [m.span() for m in scrub._line_matches(rx, text, pre)] == [m.span() for m in rx.finditer(text)], rx.pattern
    assert _v6_accepted(text, scrub._line_matches(scrub._V6, text, scrub._V6_LINES)) == _v6_accepted(
        text, scrub._V6.finditer(text))


@pytest.mark.parametrize("seed", range(300))
def test_line_prefilters_find_what_a_whole_text_pass_finds(seed):
    _check_line_local(_hostile(seed))


@pytest.mark.parametrize("text, redacted", [
    ("x = 9abc::def;", f"x = {NET};"),  # the digit 4 characters before the first colon
    ("x = 1abc:0:0:0:0:0:0:ff;", f"x = {NET};"),
    ("x = abc9::def;", f"x = {NET};"),
    ("x = abcd::9ef;", f"x = {NET};"),  # the digit after the second colon
    ("x = abcd:9:ef:1;", "x = abcd:9:ef:1;"),  # 4 groups without :: is not an address
    ("see fe80::1%eth0\r\n", f"see {NET}\r\n"),
    ("ſ 2001:db8::7 İ", f"ſ {NET} İ"),
    ("é1.2.3.4 and é 10.1.2.3", f"é1.2.3.4 and é {NET}"),  # é is a word character
    ("\ud800 jane@example.org \udfff", f"\ud800 {EMAIL} \udfff"),  # invalid surrogates around
    ("C:\\\\Users\\\\ann\\\\x and /Users/bo/y", f"{HOME}x and {HOME}y"),
    ("open(\"D:\\Users\\dan\\x\")", f"open(\"{HOME}x\")"),  # the only gate literal is \\Users\\
    ("a\u2028b 203.0.113.9\u2028c", f"a\u2028b {NET}\u2028c"),
])
def test_triggers_at_prefilter_boundaries_are_redacted(text, redacted):
    assert scrub_text(text).text == redacted
    _check_line_local(text)


def test_a_10_mb_line_hides_every_kind_at_its_end():
    """One 10 MB line of near misses (``::``, short dotted numbers, ``@`` without a
    domain, ``/home`` without a name) ending in one value of each line-local kind."""
    filler = "std::vector<int> v{1.2, 3.4}; @param home x::y 12:34 " * (10_000_000 // 52)
    tail = " jane@example.org 2001:db8::1 192.0.2.44 /home/ann/src"
    text = filler + tail
    assert "\n" not in text and len(text) >= 10_000_000
    assert [m.span() for m in scrub._line_matches(scrub._V4, text, scrub._V4_LINES)] == [m.span() for m in scrub._V4.finditer(text)]
    out = scrub_text(text).text
    assert out == filler + f" {EMAIL} {NET} {NET} {HOME}src"


# ------------------------------------------------------------------ literal gates


def _ungated(monkeypatch, fn):
    monkeypatch.setattr(leak_rescan, "STRICT_GATES", {})
    monkeypatch.setattr(leak_rescan, "STRICT_GATES_LOWER", {})
    monkeypatch.setattr(leak_rescan, "STRICT_RUN_GATES", {})
    return fn()


AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLE12"  # 40 characters of the AWS secret shape; synthetic


@pytest.mark.parametrize("text", [
    f"awſ_secret_key = '{AWS_SECRET}'\n",  # (?i)s matches the long s; "aws" is not in text.lower()
    f"AWS_KEY = '{AWS_SECRET}'\n",
    f"İİ aws token: \"{AWS_SECRET}\"\n",  # lower() changes the length before it
    "id = ACCA" + "QX7ZK2M4N6P8R3T5" + "\n",
    "x = 'SK" + "0123456789abcdef0123456789abcdef" + "';\n",  # Twilio, a run of exactly 34
    "x SK" + "0123456789abcdef0123456789abcdef" + " zz\n",
    "token xoxb-123456789012-123456789012-abcdef0123\n",
    "https://hooks.slack.com/services/T0AAAAAAA/B0BBBBBBB/abcdefghijklmnopqrstuvwx\n",
    "glpat-" + "aB3dE5fG7hI9jK1lM3nO" + "\n",
    "GR1348941" + "aB3dE5fG7hI9jK1lM3nO" + "\n",
    "a" * 5000 + f" aws_key='{AWS_SECRET}' " + "b" * 5000,  # a long line: windows around the hit
    "bot = 123456789:" + "AAH4kq8Zr2VbN5xKc7Lw0PdT3mYhGf9JsAe" + "\n",  # Telegram, a run of exactly 35
    'repo = "AKC' + "p8Zr2VbN5xKc7Lw0PdT3mYhGf9JsAe1UoRi6Xk0" + '"\n',
    'url = "https://svc:hunter2pass@db.example.net/x"\n',
    "AccountKey=" + "q8Zr2VbN+5xKc7Lw0PdT/3mYhGf9JsAe1UoRi6Xkq8Zr2VbN+5xKc7Lw0PdT/3mYhGf9JsAe1UoRi6Xk12345678" + "\n",
    "k = ghp_" + "0123456789abcdefghijABCDEFGHIJ012345" + "\n",
    "t = eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U\n",
    "m = " + "0123456789abcdef0123456789abcdef" + "-us12\n",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAuV1bC3dE4fG5hI6jK7lM8nO9pQ0rS1tU2vW3xY4zA5b\n",
    "p = pypi-AgEIcHlwaS5vcmc" + "q8Zr2VbN5xKc7Lw0PdT3mYhGf9JsAe1UoRi6Xk" * 2 + "\n",
    "s = SG." + "q8Zr2VbN5xKc7Lw0PdT3mY" + "." + "q8Zr2VbN5xKc7Lw0PdT3mYhGf9JsAe1UoRi6Xk12345" + "\n",
    "s = sq0csp-" + "q8Zr2VbN5xKc7Lw0PdT3mYhGf9JsAe1UoRi6Xk12345" + "\n",
    "s = sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc" + "\n",
    "o = sk-" + "q8Zr2VbN5xKc7Lw0PdT3" + "T3BlbkFJ" + "q8Zr2VbN5xKc7Lw0PdT3" + "\n",
    "//registry.npmjs.org/:_authToken=npm_" + "q8Zr2VbN5xKc7Lw0PdT3mYhGf9JsAe1UoRi6" + "\n",
])
def test_gated_rescan_finds_what_the_ungated_one_finds(monkeypatch, text):
    gated = leak_rescan.strict_findings(text, SECRET)
    assert gated, "each text holds something a plugin reports"
    assert _ungated(monkeypatch, lambda: leak_rescan.strict_findings(text, SECRET)) == gated


@pytest.mark.parametrize("seed", range(40))
def test_gates_agree_on_hostile_text(monkeypatch, seed):
    rng = random.Random(seed)
    pieces = PIECES + ("aws", "AWS", "awſ", "AKIA", "ACCA", "SK", "AC", "xox", "b-", "glpat-", "GR1348941", "key",
                       "AKC", "AP", "AccountKey=", "://", "ghp_", "eyJ", "-us", ":_authToken=", "T3BlbkFJ", "PRIVATE KEY",
                       "pypi-AgE", "SG.", "sq0csp-", "k_live_", "123456789:", "AAH4kq8Zr2VbN5xKc7Lw0Pd",
                       "token", "'", '"', "=", "0123456789abcdef", "ABCDEFGHIJ", "hooks.slack.com/services/T", "/B")
    text = "".join(rng.choice(pieces) for _ in range(600))
    assert leak_rescan.strict_findings(text, SECRET) == _ungated(monkeypatch, lambda: leak_rescan.strict_findings(text, SECRET))


# ------------------------------------------------------------------ the re-scan shortcut


def test_rescan_shortcut_is_per_call():
    """A text scrub_text left unchanged is re-scanned by the stricter detectors only
    (the redaction pass just found nothing on it); find_leaks called on its own still
    runs every detector."""
    clean = "int main() { return 0; }\n"
    assert scrub_text(clean).text is clean
    dirty = "// jane@example.org\n"
    assert scrub_text(dirty).text == f"// {EMAIL}\n"
    assert find_leaks(dirty) == [("email", "jane@example.org")]
    assert scrub._CLEAN.text is None


def test_unchanged_text_still_fails_closed(monkeypatch):
    """With the redaction's generic rule off, a key it no longer sees leaves the text
    unchanged, and the stricter re-scan stops it."""
    monkeypatch.setattr(keyscan, "random_like", lambda tok, margin=0.0: bool(margin))
    with pytest.raises(scrub.LeakError, match="secret"):
        scrub_text("// q8Zr2VbN+5xKc7Lw0PdT/3mYhGf9JsAe1UoRi6Xk\n")


# ------------------------------------------------------------------ the hyperscan pass

#: Every literal the multi-pattern pass looks for (format prefixes, assignment words in
#: mixed case, re-scan gate literals), overlapping ones next to each other.
LITERALS = tuple(sorted({p for _, ps, _, _ in keyscan.FORMAT_RULES for p in ps})) + (
    "Api_Key", "SECRET", "ToKeN", "passWD", "PassWord", "private-key", "ACCESS_KEY", "sk-ant-", "AKIAKIA", "ghp_ghp_",
    "glpat-glpat-", "xoxb-xoxp-", "aWs", "GR1348941GR", "hooks.slack.com", "eyJeyJ", "=", "'", '"', ":", "\n", " ",
    "Zx8kP2qLm9Tn4Vb7Rc1Wd6Ys", "0123456789abcdef0123456789abcdef", "q8Zr2VbN+5xKc7Lw0PdT/3mYhGf9JsAe1UoRi6Xk",
)


def _engine_results(text: str):
    return (keyscan.format_spans(text), sorted(set(scrub._assign_word_starts(text))),
            leak_rescan.strict_findings(text, SECRET))


def test_hyperscan_is_installed():
    assert keyscan.hyperscan is not None


@pytest.mark.parametrize("seed", range(40))
def test_hyperscan_pass_finds_what_the_automaton_finds(monkeypatch, seed):
    """The same format hits, assignment words and re-scan findings with the hyperscan
    pass as with pyahocorasick and substring tests (a text that is not ASCII: hyperscan
    over its UTF-8 for the case-sensitive literals; the re-scan's gate takes the second
    way either way)."""
    rng = random.Random(seed)
    text = "".join(rng.choice(LITERALS) for _ in range(300))
    if seed % 4 == 3:
        text = "İ" + text + "ſ"
    fast = _engine_results(text)
    monkeypatch.setattr(keyscan, "hyperscan", None)
    monkeypatch.setattr(leak_rescan, "hyperscan", None)
    assert _engine_results(text) == fast


def test_literal_scanner_reports_overlapping_and_caseless_hits(monkeypatch):
    lits = ("sk-", "sk-ant-", "aws", "AKIA")
    text = "sk-ant-x AWSAKIAKIA aWs"
    expected = [(0, 0), (0, 1), (9, 2), (12, 3), (15, 3), (20, 2)]
    assert keyscan.LiteralScanner(lits, caseless=True).hits(text) == expected
    assert keyscan.LiteralScanner(lits, caseless=True).present(text) == {0, 1, 2, 3}
    assert keyscan.LiteralScanner(lits).present(text) == {0, 1, 3}
    monkeypatch.setattr(keyscan, "hyperscan", None)
    assert keyscan.LiteralScanner(lits, caseless=True).hits(text) == expected
    assert keyscan.LiteralScanner(lits).hits("İ" + text) == [(s + 1, i) for s, i in ((0, 0), (0, 1), (12, 3), (15, 3))]
    with pytest.raises(ValueError):
        keyscan.LiteralScanner(lits, caseless=True).hits("İ" + text)


@pytest.mark.parametrize("text", [
    "é日本😀 sk-ant-x", "\udcff\ud800sk-" * 3 + "AKIA", "\x00ſİ" * 50 + "awsaws", "😀" * 1000 + "sk-ant-sk-",
    "\u0085\u3000sk-\u00a0AKIAKIA\U0010ffff",
])
def test_literal_scanner_offsets_are_characters_on_text_that_is_not_ascii(monkeypatch, text):
    """hyperscan scans the UTF-8 bytes of a text that is not ASCII; its hits are mapped to
    character offsets, the same as the automaton's (and as ``str.find``)."""
    lits = ("sk-", "sk-ant-", "aws", "AKIA")
    fast = keyscan.LiteralScanner(lits)
    got, present = fast.hits(text), fast.present(text)
    assert got and all(text.startswith(lits[i], s) for s, i in got)
    expected = sorted((s, i) for i, lit in enumerate(lits)
                      for s in range(len(text)) if text.startswith(lit, s))
    assert got == expected and present == {i for _, i in expected}
    monkeypatch.setattr(keyscan, "hyperscan", None)
    assert keyscan.LiteralScanner(lits).hits(text) == got
    assert keyscan.LiteralScanner(lits).present(text) == present


def test_literal_scanner_reports_every_index_of_a_repeated_literal(monkeypatch):
    lits = ("aa", "aa", "a", "AA")
    fast = keyscan.LiteralScanner(lits)
    expected = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 2)]
    assert fast.hits("aaa") == expected and fast.present("aaa") == {0, 1, 2}
    assert keyscan.LiteralScanner(lits, caseless=True).present("AAA") == {0, 1, 2, 3}
    monkeypatch.setattr(keyscan, "hyperscan", None)
    assert keyscan.LiteralScanner(lits).hits("aaa") == expected
    assert keyscan.LiteralScanner(lits).present("aaa") == {0, 1, 2}
    assert keyscan.LiteralScanner(lits, caseless=True).present("AAA") == {0, 1, 2, 3}
