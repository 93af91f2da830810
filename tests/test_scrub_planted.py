"""Planted-secrets recall and control-set precision of the stage-3 scrub.

A generated repository plants at least 20 values of every detector family in code,
comments and string literals; every one must be gone after the scrub, counted under its
kind. A control set of real C/C++ files of the ``tiny`` snapshot (version strings, hex
constants, hash test vectors, no PII or secrets) must come out byte-identical, both from
:func:`scrub_text` and in the materialized ``scrubbed`` table.
"""

from __future__ import annotations

import base64
import ipaddress
import random
import re
import string

import pyarrow.parquet as pq
import pytest

from megacpp_core.scrub import KINDS, REDACTION_MARKERS, find_leaks, scrub_text

PER_FAMILY = 24  # >= 20 of each family, 8 in each of the three contexts
CONTEXTS = ("code", "comment", "string")
AZ = string.ascii_letters
AZ09 = string.ascii_letters + string.digits
UP09 = string.ascii_uppercase + string.digits


def _s(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _key(rng: random.Random, alphabet: str, n: int) -> str:
    """Random key with at least one digit and one letter (as issued keys have)."""
    while True:
        v = _s(rng, alphabet, n)
        if any(c.isdigit() for c in v) and any(c.isalpha() for c in v):
            return v


def _ipv4(rng):
    while True:
        a = ipaddress.IPv4Address(rng.getrandbits(32))
        if a.is_global and not all(int(p) < 100 for p in str(a).split(".")):
            return str(a)


def _ipv6(rng):
    while True:
        a = ipaddress.IPv6Address((0x2001 << 112) | rng.getrandbits(112)).compressed
        if any(c.isdigit() for c in a) and a.count(":") >= 3:
            return a


def _pem(rng):
    body = base64.b64encode(rng.randbytes(rng.choice((96, 180, 270)))).decode()
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    kind = rng.choice(("RSA ", "EC ", "", "OPENSSH "))
    return "\n".join([f"-----BEGIN {kind}PRIVATE KEY-----", *lines, f"-----END {kind}PRIVATE KEY-----"])


#: family -> (kind, generator). Formats as published by each issuer; none is a live value.
FAMILIES = {
    "email": ("email", lambda r: f"{_s(r, string.ascii_lowercase, 6)}.{_s(r, string.ascii_lowercase, 5)}@{_s(r, string.ascii_lowercase, 7)}.{r.choice(['com', 'org', 'net', 'io', 'de'])}"),
    "ipv4": ("network_address", _ipv4),
    "ipv6": ("network_address", _ipv6),
    "aws_access_key": ("secret", lambda r: "AKIA" + _key(r, UP09, 16)),
    "github_token": ("secret", lambda r: r.choice(["ghp_", "gho_", "ghs_"]) + _key(r, AZ09, 36)),
    "gitlab_token": ("secret", lambda r: "glpat-" + _key(r, AZ09, 20)),
    "slack_token": ("secret", lambda r: "xoxb-" + _s(r, string.digits, 12) + "-" + _key(r, AZ09, 24)),
    "google_api_key": ("secret", lambda r: "AIza" + _key(r, AZ09, 35)),
    "stripe_key": ("secret", lambda r: "sk_live_" + _key(r, AZ09, 24)),
    "npm_token": ("secret", lambda r: "npm_" + _key(r, AZ09, 36)),
    "openai_key": ("secret", lambda r: "sk-" + _key(r, AZ09, 20) + "T3BlbkFJ" + _key(r, AZ09, 20)),
    "sendgrid_key": ("secret", lambda r: "SG." + _key(r, AZ09, 22) + "." + _key(r, AZ09, 43)),
    "jwt": ("secret", lambda r: "eyJ" + _key(r, AZ09, 30) + ".eyJ" + _key(r, AZ09, 40) + "." + _key(r, AZ09 + "_-", 43)),
    "private_key_block": ("secret", _pem),
    "azure_storage_key": ("secret", lambda r: _key(r, AZ09 + "+/", 86) + "=="),
    "url_password": ("secret", lambda r: _key(r, AZ09 + "!$*_-", r.randrange(8, 20))),
    "home_linux": ("home_path", lambda r: f"/home/{_s(r, string.ascii_lowercase, 6)}/"),
    "home_macos": ("home_path", lambda r: f"/Users/{_s(r, string.ascii_lowercase, 5)}.{_s(r, string.ascii_lowercase, 4)}/"),
    "home_windows": ("home_path", lambda r: f"C:\\Users\\{_s(r, AZ, 7)}\\"),
}
#: How a family's value sits in its surrounding text (the value alone elsewhere).
WRAP = {
    "azure_storage_key": "DefaultEndpointsProtocol=https;AccountName=acct{i};AccountKey={v};EndpointSuffix=core.windows.net",
    "url_password": "postgresql://svc_{i}:{v}@db{i}.example.net:5432/app",
}
#: Secret-like names for high-entropy assignments (the value is planted, the name stays).
ASSIGN_NAMES = ("api_key", "kSecretToken", "DB_PASSWORD", "private_key", "aws_access_key", "auth_token")


def _plant(family: str, value: str, context: str, i: int) -> str:
    """One C/C++ snippet holding ``value`` in ``context``."""
    if family == "private_key_block":
        if context == "comment":
            return f"/* test key #{i}:\n{value}\n*/\nint key_{i}_len = {len(value)};\n"
        if context == "string":
            quoted = "\n".join(f'    "{ln}\\n"' for ln in value.split("\n"))
            return f"static const char kKey{i}[] =\n{quoted};\n"
        return f'static const char kRaw{i}[] = R"PEM(\n{value}\n)PEM";\n'
    if family in WRAP:
        value = WRAP[family].format(i=i, v=value)
    if context == "comment":
        return rng_comment(i).format(v=value)
    if context == "string":
        return f'static const char *value_{i} = "{value}";\nlog_value(value_{i}, {i});\n'
    return f"#define PLANTED_{i} {value}\nint use_{i}(void) {{ return {i} + 1; }}\n"


def rng_comment(i: int) -> str:
    return ("// see {v} for details\n", "/* owner: {v} */\n", "/*\n * configured at {v} (do not change)\n */\n")[i % 3]


def planted_repository(seed: int = 20260):
    """``(files, planted)``: ``files`` maps path -> C/C++ text, ``planted`` is a list of
    ``(path, family, kind, value)`` with ``PER_FAMILY`` values per family."""
    rng = random.Random(seed)
    snippets, planted = [], []
    for family, (kind, gen) in FAMILIES.items():
        for i in range(PER_FAMILY):
            value = gen(rng)
            snippets.append((family, kind, value, _plant(family, value, CONTEXTS[i % 3], len(snippets))))
    for i in range(PER_FAMILY):
        value = _key(rng, AZ09 + "+/", rng.randrange(24, 41))
        name = ASSIGN_NAMES[i % len(ASSIGN_NAMES)]
        text = (f'const char *{name} = "{value}";\n', f'// {name}: "{value}"\n',
                f'config.set("{name}", "{value}");\n')[i % 3]
        snippets.append(("high_entropy_assignment", "secret", value, text))
    rng.shuffle(snippets)
    files: dict[str, str] = {}
    for n in range(0, len(snippets), 12):
        path = f"src/module_{n // 12:02d}.cc"
        body = [f"// module {n // 12}\n#include <stdio.h>\n\n"]
        for family, kind, value, text in snippets[n:n + 12]:
            body.append(text + f"static int counter_{n}_{len(body)} = 0x{rng.getrandbits(32):08x};\n\n")
            planted.append((path, family, kind, value))
        files[path] = "".join(body)
    return files, planted


def test_every_planted_value_is_redacted():
    files, planted = planted_repository()
    families = {f for _, f, _, _ in planted}
    assert len(families) == len(FAMILIES) + 1
    assert all(sum(1 for _, f, _, _ in planted if f == fam) >= 20 for fam in families)
    out = {p: scrub_text(t, max_samples=100) for p, t in files.items()}
    missed = [(f, v) for p, f, _, v in planted if v.rstrip("/\\") in out[p].text]
    assert not missed, f"{len(missed)} planted values survived, first {missed[:3]}"
    counts = dict.fromkeys(KINDS, 0)
    for r in out.values():
        for k, v in r.counts.items():
            counts[k] += v
    expected = dict.fromkeys(KINDS, 0)
    for _, _, kind, _ in planted:
        expected[kind] += 1
    assert counts == expected
    for r in out.values():
        assert find_leaks(r.text) == []
        assert scrub_text(r.text).text == r.text  # idempotent
        for smp in r.samples:
            assert smp["marker"] in smp["before"] and smp["marker"] == REDACTION_MARKERS[smp["kind"]]


def test_planted_repository_is_deterministic():
    assert planted_repository() == planted_repository()
    a, _ = planted_repository()
    assert {p: scrub_text(t).text for p, t in a.items()} == {p: scrub_text(t).text for p, t in planted_repository()[0].items()}


#: Real files of the tiny snapshot with version strings, hex constants and hash test vectors.
CONTROL = {
    "xxhash-4.1.0": ("deps/xxhash/xxhash.h", "src/_xxhash.c"),
    "lz4-4.4.5": ("lz4libs/lz4.c", "lz4libs/xxhash.c", "lz4/frame/_frame.c"),
    "pybind11-3.1.0": ("include/pybind11/conduit/pybind11_conduit_v1.h", "tests/test_native_enum.cpp",
                       "tests/test_with_catch/test_subinterpreter.cpp", "tests/test_python_multiple_inheritance.cpp"),
}


def test_control_set_is_byte_identical(tiny_run):
    root, _ = tiny_run
    features = {"hex": 0, "hash": 0, "version": 0}
    for source, paths in CONTROL.items():
        rdir = root / "snapshots" / "tiny" / "revisions" / source / "shards" / "000"
        kept = {r["path"]: r["text"] for r in pq.read_table(rdir / "quality_kept.parquet", columns=["path", "text"]).to_pylist()}
        out = {r["path"]: r["text"] for r in pq.read_table(rdir / "scrubbed.parquet", columns=["path", "text"]).to_pylist()}
        for p in paths:
            text = kept[p]
            features["hex"] += len(re.findall(r"\b0x[0-9A-Fa-f]{8,}", text))
            features["hash"] += len(re.findall(r"\b[0-9a-f]{32,64}\b", text))
            features["version"] += len(re.findall(r"\b\d+\.\d+\.\d+\b", text))
            r = scrub_text(text)
            assert r.text == text and sum(r.counts.values()) == 0, (source, p, r.counts)
            assert out[p] == text, (source, p)
    assert min(features.values()) >= 3, features


@pytest.mark.parametrize("text", [
    'static const char *md5 = "d41d8cd98f00b204e9800998ecf8427e";',
    'const char *sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";',
    "#define XXH_PRIME64_1 0x9E3779B185EBCA87ULL",
    '#define PY_VERSION "3.12.1.0"',
    "static const uint8_t iv[16] = {0x00, 0x01, 0x02, 0x03};",
    "std::string key = \"AKIA\"; // prefix only",
    'const char *token = "TOKEN_NAME_PLACEHOLDER";',
    'snprintf(url, n, "%s://%s:%s@%s", scheme, user, password, host);',
])
def test_lookalikes_untouched(text):
    assert scrub_text(text).text == text
