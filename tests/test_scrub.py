"""Stage 3 PII/secret scrub: recall on each kind, precision on ordinary C/C++."""

from __future__ import annotations

import pytest

from megacpp_core.scrub import (
    REDACTION_MARKERS,
    LeakError,
    find_leaks,
    scrub_text,
    shannon_entropy,
)

EMAIL, NET, SECRET, HOME = (REDACTION_MARKERS[k] for k in ("email", "network_address", "secret", "home_path"))

# Synthetic values in the published formats (none is a live credential).
AWS = "AKIA" + "QX7ZK2M4N6P8R3T5"
GITHUB = "ghp_" + "0123456789abcdefghijABCDEFGHIJ012345"
SLACK = "xoxb-" + "123456789012-abcdefABCDEF"
GOOGLE = "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K_l-MnOpQrStU"
STRIPE = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
JWT = "eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiIxMjM0NTY3ODkwIn0." + "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
HIGH_ENTROPY = "Zx8kP2qLm9Tn4Vb7Rc1Wd6Ys"


def scrubbed(text: str) -> str:
    return scrub_text(text).text


@pytest.mark.parametrize(
    "before, after",
    [
        ("/* Author: Jane Doe <jane.doe@example.org> */", f"/* Author: Jane Doe <{EMAIL}> */"),
        ('send("ops+alerts@mail.example.co.uk");', f'send("{EMAIL}");'),
        ("// contact bob@example.com.", f"// contact {EMAIL}."),
        ('const char *ip = "192.168.1.20";', f'const char *ip = "{NET}";'),
        ("// server 10.0.0.1:8080 is down", f"// server {NET}:8080 is down"),
        ('connect("2001:db8::1");', f'connect("{NET}");'),
        ("/* link-local fe80::1%eth0 */", f"/* link-local {NET} */"),
        ("[2001:0db8:85a3:0000:0000:8a2e:0370:7334]:443", f"[{NET}]:443"),
        ("mapped ::ffff:10.1.2.3", f"mapped ::ffff:{NET}"),
        (f"#define KEY \"{AWS}\"", f'#define KEY "{SECRET}"'),
        (f"// token {GITHUB}", f"// token {SECRET}"),
        (f"auto s = \"{SLACK}\";", f'auto s = "{SECRET}";'),
        (f"k = \"{GOOGLE}\";", f'k = "{SECRET}";'),
        (f"/* {STRIPE} */", f"/* {SECRET} */"),
        (f'hdr("Authorization: Bearer {JWT}");', f'hdr("Authorization: Bearer {SECRET}");'),
        (f'static const char *api_key = "{HIGH_ENTROPY}";', f'static const char *api_key = "{SECRET}";'),
        (f'#define DB_PASSWORD "{HIGH_ENTROPY}"', f'#define DB_PASSWORD "{SECRET}"'),
        (f'char kSecretToken[] = u8"{HIGH_ENTROPY}";', f'char kSecretToken[] = u8"{SECRET}";'),
        (f'{{"access_key", "{HIGH_ENTROPY}"}},', f'{{"access_key", "{SECRET}"}},'),
        ('open("/home/alice/src/x.c");', f'open("{HOME}src/x.c");'),
        ("// built in /Users/bob.smith/work", f"// built in {HOME}work"),
        ('"C:\\\\Users\\\\carol\\\\AppData"', f'"{HOME}AppData"'),
        ("C:\\Users\\carol\\Desktop", f"{HOME}Desktop"),
        ("cd /home/dave.", "cd <redacted-path>."),
    ],
)
def test_each_kind_redacted(before, after):
    result = scrub_text(before)
    assert result.text == after
    assert sum(result.counts.values()) >= 1


def test_private_key_block_redacted_whole():
    pem = (
        "static const char key[] =\n"
        '    "-----BEGIN RSA PRIVATE KEY-----\\n"\n'
        '    "MIIEowIBAAKCAQEAuV1bC3dE4fG5hI6jK7lM8nO9pQ0rS1tU2vW3xY4zA5b\\n"\n'
        '    "-----END RSA PRIVATE KEY-----\\n";\n'
        "int after;\n"
    )
    assert scrubbed(pem) == f'static const char key[] =\n    "{SECRET}\\n";\nint after;\n'
    truncated = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAE\nint x;\n"
    assert scrubbed(truncated) == f"{SECRET}\nint x;\n"


@pytest.mark.parametrize(
    "text",
    [
        "std::vector<std::string> v; a::b::c(); x = a::b; ::operator new(n); A2::a1; &B::a1; E1::A;",
        "ns::detail::impl<T>::value; auto t = \"12:34:56\"; case 1: break; x ? 1:2;",
        "// mac de:ad:be:ef:00:11:22:33 and 00:1a:2b:3c:4d:5e",
        "unsigned x = 0xDEADBEEFu; uint64_t y = 0x9E3779B97F4A7C15ULL;",
        '{"", "d41d8cd98f00b204e9800998ecf8427e"}, {"abc", "900150983cd24fb0d6963f7d28e17f72"},',
        '"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"',
        '#define LZ4_VERSION_STRING "1.9.4"  #define XYZ_FULL_VERSION "4.8.12.0"  version 2.4.0.1  v1.2.3.4',
        "1.2.3.4.5 and 10.0.0.1.2 and linux-2.6.8.1/include and [22.4.1.2] and C++14 20.8.2.2",
        "// 23.3.4.2 iterators:\n#define GNUTLS_OID_X520_CN \"2.5.4.3\"\nfloat f = 1.5f; double d = 3.14159;",
        "0.0.0.0 127.0.0.1 255.255.255.255 255.255.255.0 ::1 :: in6addr_any",
        '@param x the value; see @ref foo; printf("%s@%s", user, host); root@localhost',
        'const char *token = "unexpected end of input"; token_name = "IDENTIFIER_TOKEN_NAME";',
        '#define LN_setAttr_Token_B0Prime "setAttr-Token-B0Prime"  password = "short1"',
        "https://example.com/home/about/ and /path/to/home/x/ and $HOME/.config",
        # boost 1.81 libs/math/test/test_tr1.c: the digits after the point are a 20-character
        # run of the base64 alphabet with both cases and a digit
        "   check_close_fraction_f(hermitef(10, 30), 5.896624628001300E+17f, 100 * eps, __LINE__);\n"
        "   check_close_fraction_f(hermitef(10, 1000), 1.023976960161280E+33f, 100 * eps, __LINE__);\n"
        "   check_close_fraction_l(hermitel(10, 1000), 1.023976960161280E+33L, 100 * eps, __LINE__);",
    ],
)
def test_ordinary_code_untouched(text):
    result = scrub_text(text)
    assert result.text == text
    assert result.counts == {"email": 0, "network_address": 0, "secret": 0, "home_path": 0}
    assert find_leaks(text) == []


MIXED = f"""/*
 * Copyright (c) 2021 Jane Doe <jane@example.org>
 * Built on /home/jane/build with 10.1.2.3 and fe80::1
 */
static const char *api_key = "{HIGH_ENTROPY}";
static const char *aws = "{AWS}"; // 2001:db8::42
"""


def test_idempotent_counts_and_samples():
    first = scrub_text(MIXED, max_samples=2)
    assert first.counts == {"email": 1, "network_address": 3, "secret": 2, "home_path": 1}
    assert len(first.samples) == 2
    assert first.samples[0]["kind"] == "email" and first.samples[0]["marker"] == EMAIL
    assert EMAIL in first.samples[0]["before"] and "jane@" not in first.samples[0]["before"]
    second = scrub_text(first.text)
    assert second.text == first.text
    assert sum(second.counts.values()) == 0 and second.samples == []
    assert find_leaks(first.text) == []
    assert {k for k, _ in find_leaks(MIXED)} == {"email", "network_address", "secret", "home_path"}
    assert scrub_text(MIXED, max_samples=2) == first


def test_fail_closed(monkeypatch):
    import megacpp_core.scrub as scrub

    monkeypatch.setattr(scrub, "find_leaks", lambda text: [("email", "x@y.zz")])
    with pytest.raises(LeakError, match="email"):
        scrub.scrub_text("nothing to see")


def test_shannon_entropy():
    assert shannon_entropy("") == 0.0
    assert shannon_entropy("aaaa") == 0.0
    assert shannon_entropy("abcd") == pytest.approx(2.0)
    assert shannon_entropy(HIGH_ENTROPY) >= 3.5


def test_scrub_stage_leaves_out_a_file_its_rescan_flags(monkeypatch):
    """Fail closed per file: a file whose scrubbed text still leaks is not written; the
    stage goes on and names it in its figures."""
    from types import SimpleNamespace

    import pyarrow as pa

    import megacpp_core.scrub as scrub
    from megacpp_core.stages import scrub as stage

    real = scrub.find_leaks
    monkeypatch.setattr(scrub, "find_leaks", lambda text: [("secret", "x")] if "LEAKY" in text else real(text))
    kept = pa.table({"doc_key": ["a", "b", "c"], "path": ["a.c", "b.c", "c.c"], "language": ["c"] * 3,
                     "text": ["int a;", "int LEAKY;", "int c;"]})
    lic = pa.table({"doc_key": ["a", "b", "c"], "license_class": ["permissive"] * 3,
                    "decision": ["accept", "accept", "refuse"], "spdx_expression": ["MIT"] * 3})
    tables = {"quality_kept": kept, "license": lic}
    ctx = SimpleNamespace(
        source=SimpleNamespace(name="s", order=0, sha256="0" * 64),
        input=lambda name: SimpleNamespace(read=lambda: tables[name], read_json=lambda: {"revision": "r"}))
    res = stage.compute(ctx)
    out = res.outputs["scrubbed"]
    assert out.column("doc_key").to_pylist() == ["a"]
    f = res.figures
    assert (f["files_in"], f["files_out"], f["refused_by_license"], f["dropped_by_rescan"]) == (3, 1, 1, 1)
    assert f["dropped_by_rescan_files"] == [{"doc_key": "b", "why": "scrub output still holds: ['secret']"}]
