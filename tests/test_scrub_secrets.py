"""Generic key detection, the independent fail-closed re-scan, and hostile inputs."""

from __future__ import annotations

import base64
import random

import pytest

from megacpp_core import keyscan, leak_rescan
from megacpp_core.scrub import REDACTION_MARKERS, LeakError, find_leaks, scrub_text

SECRET = REDACTION_MARKERS["secret"]
#: The shape of a cloud secret access key (40 base64 characters); synthetic.
KEY40 = "q8Zr2VbN+5xKc7Lw0PdT/3mYhGf9JsAe1UoRi6Xk"


@pytest.mark.parametrize("template", [
    '// rotated 2024-05: {v}\n',
    '/*\n * backup credentials {v}\n */\n',
    'const char *kValue = "{v}";\n',
    'config.set("endpoint", "https://x.example"); config.set("value", "{v}");\n',
    '#define FALLBACK {v}\n',
    'VALUE={v}\n',
    'value: {v}\n',
    '{{"value": "{v}"}}\n',
    'curl "https://api.example.net/v1?sig={v}&n=1"\n',
])
def test_generic_40_char_key_redacted_wherever_it_stands(template):
    text = template.format(v=KEY40)
    out = scrub_text(text)
    assert KEY40 not in out.text and out.counts["secret"] == 1
    assert out.text == template.format(v=SECRET)


@pytest.mark.parametrize("text", [
    # code names, also where a comment mentions them
    "r = LZ4_decompress_safe_withPrefix64k(src, dst, n, cap);\n// see LZ4_decompress_safe_withPrefix64k()\n",
    "x = XXH3_len_129to240_64b(input, len, secret, seed);\n",
    "/* was ZSTD_c_experimentalParam6=1003 */ enum { ZSTD_c_experimentalParam5 = 1002 };\n",
    "const int kDecimalRepCapacity = kBase10MaximalLength + 1;\n",
    "// For UTF-8 we avoid a temporary by using `PyUnicode_AsUTF8AndSize`.\n",
    # lookup tables, digests, paths, public key material
    'static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";\n',
    'std::string chars = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";\n',
    '{"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},\n',
    '#include "rapidfuzz/distance/LCSseq_impl.hpp"\n',
    "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ3x9Zr2VbN5xKc7Lw0PdT3mYhGf9JsAe1UoRi6Xk0wCgYIKoZIzj0EAwIw\n-----END CERTIFICATE-----\n",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq8Zr2VbN5xKc7Lw0PdT3mYhGf9JsAe1UoRi6Xk user\n",
    # low-entropy test strings and labelled test vectors
    '"dCUHccYEJUTXVGRPRFOUOIdeVPNdklhdzGQTGNDGRdjpjofdWURFGdFCSdtKOKIUOISCNTdHGROGRdGRN0EJTKITgdCUHccq"\n',
    '// expected base64 of the test vector\n{"foobar-test-input", "q8Zr2VbN5xKc7Lw0PdT3mYhGf9JsAe1UoRi6Xk"},\n',
])
def test_non_secret_constants_kept(text):
    out = scrub_text(text)
    assert out.text == text and out.counts["secret"] == 0
    assert find_leaks(text) == []


def test_fail_closed_when_redaction_misses_a_format(monkeypatch):
    """The re-scan runs detect-secrets' own plugins: with the redaction's format rules
    disabled, an AWS key id left in the output stops the scrub."""
    monkeypatch.setattr(keyscan, "format_spans", lambda text: [])
    with pytest.raises(LeakError, match="secret"):
        scrub_text('const char *id = "AKIAQX7ZK2M4N6P8R3T5";\n')


def test_fail_closed_when_redaction_threshold_slips(monkeypatch):
    """The re-scan's generic test has its own, looser entropy threshold: a redaction
    that stops seeing random keys fails closed."""
    real = keyscan.random_like
    monkeypatch.setattr(keyscan, "random_like", lambda tok, margin=0.0: real(tok, margin) if margin else False)
    with pytest.raises(LeakError, match="secret"):
        scrub_text(f"// {KEY40}\n")


def test_rescan_findings_name_the_detector_not_only_the_kind():
    found = leak_rescan.strict_findings(f'k = "AKIAQX7ZK2M4N6P8R3T5"; s = "{KEY40}";', SECRET)
    assert [name for name, _ in found] == ["AWSKeyDetector", "GenericHighEntropy"]
    assert leak_rescan.strict_findings(f'k = "{SECRET}"; url = "%s://%s:%s@%s";', SECRET) == []


@pytest.mark.parametrize("text, secrets", [
    ("eyJ" * 20000, 0),  # a prefix repeated: no token
    ("AKC" * 20000, 0),
    ("password=" * 5000, 1),  # one run, one redaction
    ("xoxb-" * 10000, 1),
    ("/* never closed " + "a b " * 5000, 0),
    ('"never closed ' + "x" * 20000, 0),
    (base64.b64encode(random.Random(5).randbytes(60000)).decode(), 1),  # one random blob
    ("QUJD" * 20000, 0),  # a repeated pattern is not random
    ("İ api_key = \"Zx8kP2qLm9Tn4Vb7Rc1Wd6Ys\"\r\nİ token: Zx8kP2qLm9Tn4Vb7Rc1Wd6Yt\r\n", 2),  # lower() changes length
])
def test_hostile_inputs(text, secrets):
    out = scrub_text(text, max_samples=1)
    assert out.counts["secret"] == secrets
    assert scrub_text(out.text).text == out.text


def test_expected_entropy_matches_the_large_sample_limit():
    # Miller-Madow: E[H] ~ log2 k - (k - 1) / (2 n ln 2) for n >> k
    import math

    for n in (5000, 100000):
        assert keyscan.expected_entropy(n) == pytest.approx(6 - 63 / (2 * n * math.log(2)), abs=2e-3)
    assert keyscan.expected_entropy(20) == pytest.approx(4.0415, abs=1e-4)


def test_a_word_about_the_encoding_does_not_exempt_a_key():
    """``// HMAC key (base64)`` heads a key, not test data; a labelled digest of a digest's
    size stays, one of another size does not."""
    from megacpp_core import scrub

    key = 'static const char kHmacKey[] = "q7Vt0pX9eRz2LmK4wN8sYb1JhG6cF3dA5uT0iO2kQ8M=";\n'
    assert "q7Vt0pX9" not in scrub.scrub_text("// HMAC key (base64)\n" + key).text
    digest = 'static const char d[] = "ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=";\n'  # 32 bytes
    assert "ungWv48B" in scrub.scrub_text('/* SHA-256 of "abc" */\n' + digest).text
    odd = 'static const char d[] = "ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0Xq9Lm";\n'  # 36 bytes
    assert "ungWv48B" not in scrub.scrub_text('/* SHA-256 of "abc" */\n' + odd).text
    assert "ungWv48B" not in scrub.scrub_text('/* SHA-256 HMAC key */\n' + digest).text  # a key of a digest's size
    vector = 'static const char v[] = "q7Vt0pX9eRz2LmK4wN8sYb1JhG6cF3dA5uT0iO2kQ8M=";\n'
    assert "q7Vt0pX9" in scrub.scrub_text("/* RFC 4231 test vector 3 */\n" + vector).text
