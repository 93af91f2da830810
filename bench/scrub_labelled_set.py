"""Build ``tests/data/scrub_labelled.jsonl``: the labelled set of the secret scrub.

Two kinds of records, one JSON object per line, in a fixed order:

``{"label": "secret", "id", "family", "context", "text", "secrets": [...]}``
    Synthetic credentials of every format the scrub knows (issuer formats, generic
    random base64/base62/base64url keys of 20-64 characters, private-key blocks,
    connection strings with passwords, JWTs), drawn from a seeded generator in the
    alphabet and length each issuer publishes, planted in C/C++ contexts (string
    literal, initializer, call argument, line and block comment, quoted and bare
    ``#define``) and config contexts (``.env``, INI, YAML, JSON, CMake, shell, URL
    query). ``secrets`` are the substrings that must be gone after the scrub. None of
    them is a live credential. One real record too: the private test key that the
    ``pygit2`` sdist ships (``test/keys/pygit2_empty``).
``{"label": "keep", "id", "kind", "source", "path", "line", "text"}``
    Real non-secret constants taken from the cached sdists of ``corpora/default.yaml``
    (any text file of the sdist, not only the C/C++ files the quality stage keeps): hex
    digests and commit hashes, 64-bit hex literals, UUIDs, alphabet/lookup tables,
    version strings, long mixed-case identifiers with digits, long low-entropy test
    strings, SSH public keys and PGP signatures; ``text`` is the line with up to
    :data:`WINDOW` lines either side. At most :data:`PER_KIND_SOURCE` records per kind
    and source, in path and line order.

Deterministic: same cache and seed, same file. Usage::

    python bench/scrub_labelled_set.py [--out tests/data/scrub_labelled.jsonl] [--seed 4242]
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import re
import string
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Lines of context either side of a real constant.
WINDOW = 2
#: Real constants kept per (kind, source).
PER_KIND_SOURCE = 3
#: Skip sdist files larger than this (bytes): generated tables, not code.
MAX_FILE = 1_000_000

A62 = string.ascii_letters + string.digits
B64 = A62 + "+/"
URL = A62 + "_-"
LOWER09 = string.ascii_lowercase + string.digits
HEXL = "0123456789abcdef"
B32 = string.ascii_uppercase + "234567"


def _draw(rng: random.Random, alphabet: str, n: int, classes: tuple[str, ...] = ()) -> str:
    """``n`` uniform draws from ``alphabet``, redrawn until every string in ``classes``
    contributes a character (the class definition of the family, e.g. "mixed case and
    digits" for the generic keys)."""
    while True:
        v = "".join(rng.choice(alphabet) for _ in range(n))
        if all(any(c in cls for c in v) for cls in classes):
            return v


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _jwt(rng: random.Random) -> str:
    header = _b64url(b'{"alg":"HS256","typ":"JWT"}')
    payload = _b64url(json.dumps({"sub": str(rng.randrange(10**9)), "iat": 1700000000 + rng.randrange(10**7),
                                  "scope": rng.choice(["read", "write", "admin"])}, separators=(",", ":")).encode())
    return f"{header}.{payload}.{_b64url(rng.randbytes(32))}"


def _pem(rng: random.Random, label: str) -> str:
    body = base64.b64encode(rng.randbytes(rng.choice((121, 270, 1190)))).decode()
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    return "\n".join([f"-----BEGIN {label}-----", *lines, f"-----END {label}-----"])


_UP, _LO, _DG = string.ascii_uppercase, string.ascii_lowercase, string.digits
MIXED = (_UP, _LO, _DG)

#: family -> generator of one secret value (formats as published by each issuer).
FAMILIES = {
    "aws_access_key_id": lambda r: "AKIA" + _draw(r, B32, 16, (_DG,)),
    "aws_secret_access_key": lambda r: _draw(r, B64, 40, MIXED),
    "generic_base62_20": lambda r: _draw(r, A62, 20, MIXED),
    "generic_base62_24": lambda r: _draw(r, A62, 24, MIXED),
    "generic_base62_32": lambda r: _draw(r, A62, 32, MIXED),
    "generic_base62_40": lambda r: _draw(r, A62, 40, MIXED),
    "generic_base62_64": lambda r: _draw(r, A62, 64, MIXED),
    "generic_base64_44": lambda r: base64.b64encode(r.randbytes(32)).decode(),
    "generic_base64url_43": lambda r: _b64url(r.randbytes(32)),
    "github_pat": lambda r: "ghp_" + _draw(r, A62, 36),
    "github_fine_grained_pat": lambda r: "github_pat_" + _draw(r, A62, 22) + "_" + _draw(r, A62, 59),
    "gitlab_pat": lambda r: "glpat-" + _draw(r, URL, 20),
    "slack_bot_token": lambda r: f"xoxb-{r.randrange(10**11, 10**12)}-{r.randrange(10**12, 10**13)}-{_draw(r, A62, 24)}",
    "slack_webhook": lambda r: f"https://hooks.slack.com/services/T{_draw(r, _UP + _DG, 8)}/B{_draw(r, _UP + _DG, 10)}/{_draw(r, A62, 24)}",
    "stripe_live_secret": lambda r: "sk_live_" + _draw(r, A62, 24),
    "stripe_restricted": lambda r: "rk_live_" + _draw(r, A62, 99),
    "google_api_key": lambda r: "AIza" + _draw(r, URL, 35),
    "google_oauth_client_secret": lambda r: "GOCSPX-" + _draw(r, URL, 28),
    "openai_key": lambda r: "sk-" + _draw(r, A62, 20) + "T3BlbkFJ" + _draw(r, A62, 20),
    "anthropic_key": lambda r: "sk-ant-api03-" + _draw(r, URL, 93) + "AA",
    "npm_token": lambda r: "npm_" + _draw(r, A62, 36),
    "pypi_token": lambda r: "pypi-AgEIcHlwaS5vcmc" + _draw(r, URL, 120),
    "sendgrid_key": lambda r: "SG." + _draw(r, URL, 22) + "." + _draw(r, URL, 43),
    "twilio_api_key": lambda r: "SK" + _draw(r, HEXL, 32),
    "mailchimp_key": lambda r: _draw(r, HEXL, 32) + f"-us{r.randrange(1, 21)}",
    "square_oauth_secret": lambda r: "sq0csp-" + _draw(r, URL, 43),
    "discord_bot_token": lambda r: "M" + _draw(r, URL, 23) + "." + _draw(r, URL, 6) + "." + _draw(r, URL, 27),
    "telegram_bot_token": lambda r: f"{r.randrange(10**8, 10**9)}:" + _draw(r, URL, 35),
    "huggingface_token": lambda r: "hf_" + _draw(r, string.ascii_letters, 34),
    "digitalocean_token": lambda r: "dop_v1_" + _draw(r, HEXL, 64),
    "shopify_token": lambda r: "shpat_" + _draw(r, HEXL, 32),
    "databricks_token": lambda r: "dapi" + _draw(r, HEXL, 32),
    "jwt": _jwt,
    "azure_storage_key": lambda r: base64.b64encode(r.randbytes(64)).decode(),
    "hex_key_assigned": lambda r: _draw(r, HEXL, 32, (string.digits, "abcdef")),
    "password_in_url": lambda r: _draw(r, A62 + "!$*_-", r.randrange(10, 20), MIXED),
    "password_in_conninfo": lambda r: _draw(r, A62 + "!*_-", r.randrange(10, 20), MIXED),
}
#: Families whose value is planted inside a wrapper (the value alone must go).
WRAPPED = {
    "azure_storage_key": "DefaultEndpointsProtocol=https;AccountName=acct{i};AccountKey={v};EndpointSuffix=core.windows.net",
    "password_in_url": "postgresql://svc_{i}:{v}@db{i}.internal.example:5432/app",
    "password_in_conninfo": "Server=tcp:db{i}.example.net,1433;Database=app;User ID=svc;Password={v};",
}
#: C/C++ and config contexts; ``{v}`` is the planted value, ``{i}`` the record number.
CONTEXTS = {
    "c_string": 'static const char *kServiceValue{i} = "{v}";\nuse_value(kServiceValue{i});\n',
    "cpp_initializer": 'const std::string settings_{i}{{"{v}"}};\n',
    "c_call_argument": 'client_{i}.configure("{v}", /*timeout_ms=*/500);\n',
    "c_line_comment": "int retries_{i} = 3;  // deployed with {v}\n",
    "c_block_comment": "/*\n * Staging configuration: {v}\n * (rotated monthly)\n */\nint stage_{i};\n",
    "c_define_quoted": '#define SERVICE_VALUE_{i} "{v}"\n',
    "c_define_bare": "#define SERVICE_VALUE_{i} {v}\n",
    "c_array": "static const char *const kValues{i}[] = {{\n    \"{v}\",\n    nullptr,\n}};\n",
    "c_secret_name": 'static const char *api_key_{i} = "{v}";\n',
    "env_file": "SERVICE_VALUE_{i}={v}\n",
    "ini_file": "[service]\nendpoint = https://api{i}.example.net\nvalue = {v}\n",
    "yaml_file": "service:\n  endpoint: https://api{i}.example.net\n  value: {v}\n",
    "json_file": '{{"service": {{"endpoint": "https://api{i}.example.net", "value": "{v}"}}}}\n',
    "cmake_file": 'set(SERVICE_VALUE_{i} "{v}")\n',
    "shell_export": 'export SERVICE_VALUE_{i}="{v}"\n',
    "url_query": 'curl -s "https://api{i}.example.net/v1/items?access_token={v}&limit=10"\n',
}
#: Contexts per family: every family in every C/C++ context and in the config ones.
SKIP = {
    # an assigned secret name is what ``hex_key_assigned`` needs (a bare 32-hex digest is kept)
    "hex_key_assigned": set(CONTEXTS) - {"c_secret_name", "ini_file", "yaml_file", "json_file", "env_file"},
}
PRIVATE_KEYS = ("RSA PRIVATE KEY", "EC PRIVATE KEY", "PRIVATE KEY", "OPENSSH PRIVATE KEY", "ENCRYPTED PRIVATE KEY")


def _hex_key_context(ctx: str, i: int, v: str) -> str:
    return {
        "c_secret_name": f'static const char *api_key_{i} = "{v}";\n',
        "ini_file": f"[service]\napi_key = {v}\n",
        "yaml_file": f"service:\n  api_key: \"{v}\"\n",
        "json_file": f'{{"api_key": "{v}"}}\n',
        "env_file": f'API_KEY="{v}"\n',
    }[ctx]


def secret_records(seed: int) -> list[dict]:
    """Synthetic positives, in family then context order."""
    rng = random.Random(seed)
    out = []
    for family, gen in FAMILIES.items():
        for ctx, tpl in CONTEXTS.items():
            if ctx in SKIP.get(family, ()):
                continue
            i = len(out)
            v = gen(rng)
            planted = WRAPPED.get(family, "{v}").format(i=i, v=v)
            if family == "hex_key_assigned":
                text = _hex_key_context(ctx, i, v)
            elif ctx in ("env_file", "ini_file", "yaml_file") and family in WRAPPED:
                text = tpl.format(i=i, v=f'"{planted}"')
            else:
                text = tpl.format(i=i, v=planted)
            out.append({"label": "secret", "id": f"s{i:04d}", "family": family, "context": ctx,
                        "text": text, "secrets": [v]})
    for label in PRIVATE_KEYS:
        pem = _pem(rng, label)
        body = [ln for ln in pem.split("\n")[1:-1]]
        quoted = "\n".join(f'    "{ln}\\n"' for ln in pem.split("\n"))
        for ctx, text in (
            ("key_file", pem + "\n"),
            ("c_string_lines", f"static const char kTestKey[] =\n{quoted};\n"),
            ("cpp_raw_string", f'static const char *kTestKey = R"PEM(\n{pem}\n)PEM";\n'),
            ("c_block_comment", f"/* test key:\n{pem}\n*/\nint key_len;\n"),
        ):
            i = len(out)
            out.append({"label": "secret", "id": f"s{i:04d}", "family": "private_key_" + label.lower().replace(" ", "_"),
                        "context": ctx, "text": text, "secrets": body})
    return out


def _sdist_files() -> list[tuple[str, str, str]]:
    """``(source, path, text)`` of every UTF-8 text file of the default corpus sdists."""
    from megacpp_core.acquire import acquire_source
    from megacpp_core.manifest import load_manifest

    manifest = load_manifest("default")
    out = []
    for src in manifest.sources:
        acq = acquire_source(src, ROOT / "data" / "cache")
        for path, data in acq.files:
            if len(data) > MAX_FILE or b"\0" in data:
                continue
            try:
                out.append((src.name, path, data.decode("utf-8")))
            except UnicodeDecodeError:
                continue
    return out


#: Real-constant kinds: a regex over a line (the first group, or the match, is the constant).
KEEP_KINDS = {
    "hex_digest": re.compile(r"(?<![0-9A-Za-z])[0-9a-fA-F]{32,128}(?![0-9A-Za-z])"),
    "hex_literal_64": re.compile(r"\b0x[0-9A-Fa-f]{16}(?:ULL|ull|LL|ll|UL|ul|U|u)?\b"),
    "uuid": re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
    "lookup_table": re.compile(r"ABCDEFGHIJKLMNOPQRSTUVWXYZ|abcdefghijklmnopqrstuvwxyz|0123456789[A-Fa-f]{6}"),
    "version_string": re.compile(r"(?i)version\w*\W{1,4}\"?\d+\.\d+\.\d+"),
    "long_identifier": re.compile(r"(?<!\w)(?=\w*[a-z])(?=\w*[A-Z])(?=\w*\d)[A-Za-z_]\w{19,}"),
    "long_test_string": re.compile(r"\"[A-Za-z0-9]{48,}\""),
    "ssh_public_key": re.compile(r"ssh-rsa AAAA[A-Za-z0-9+/]{40,}"),
}


def keep_records(files: list[tuple[str, str, str]]) -> list[dict]:
    """Real non-secret constants (see the module docstring), deterministic order."""
    out = []
    taken: dict[tuple[str, str], int] = {}
    for source, path, text in sorted(files):
        lines = text.split("\n")
        for kind, rx in KEEP_KINDS.items():
            if taken.get((kind, source), 0) >= PER_KIND_SOURCE:
                continue
            for n, line in enumerate(lines):
                if len(line) > 1000 or not rx.search(line):
                    continue
                lo, hi = max(0, n - WINDOW), min(len(lines), n + WINDOW + 1)
                out.append({"label": "keep", "id": "", "kind": kind, "source": source, "path": path,
                            "line": n + 1, "text": "\n".join(lines[lo:hi]) + "\n"})
                taken[(kind, source)] = taken.get((kind, source), 0) + 1
                break
    for source, path, text in sorted(files):  # whole armored public blocks
        for m in re.finditer(r"-----BEGIN PGP SIGNATURE-----[\s\S]{0,4000}?-----END PGP SIGNATURE-----", text):
            out.append({"label": "keep", "id": "", "kind": "pgp_signature", "source": source, "path": path,
                        "line": text.count("\n", 0, m.start()) + 1, "text": m.group(0) + "\n"})
            break
    for i, r in enumerate(out):
        r["id"] = f"k{i:04d}"
    return out


def real_secret_records(files: list[tuple[str, str, str]]) -> list[dict]:
    """Private keys shipped inside the sdists (test keys are still keys)."""
    out = []
    for source, path, text in sorted(files):
        m = re.search(r"-----BEGIN ([A-Z ]*)PRIVATE KEY-----\n([\s\S]+?)\n-----END \1PRIVATE KEY-----", text)
        if m:
            out.append({"label": "secret", "id": "", "family": "private_key_real_test_key", "context": f"{source}:{path}",
                        "text": m.group(0) + "\n", "secrets": m.group(2).split("\n")})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "scrub_labelled.jsonl")
    ap.add_argument("--seed", type=int, default=4242)
    args = ap.parse_args(argv)
    files = _sdist_files()
    records = secret_records(args.seed)
    for r in real_secret_records(files):
        r["id"] = f"s{len(records):04d}"
        records.append(r)
    records += keep_records(files)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n")
    kinds = {}
    for r in records:
        key = r["label"] + ":" + (r.get("family") or r.get("kind"))
        kinds[key] = kinds.get(key, 0) + 1
    print(json.dumps({"records": len(records), "bytes": args.out.stat().st_size, "by_kind": kinds}, indent=1))


if __name__ == "__main__":
    main()
