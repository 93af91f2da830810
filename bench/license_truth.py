"""Benchmark: license classes of real C headers whose licenses are known from their own files.

Each package of :data:`PACKAGES` is a Debian ``-dev`` package; its headers
(``usr/include/**/*.h``) are fetched with ``apt-get download`` and unpacked with
``dpkg -x`` into a temporary directory (or read from ``--deb-dir``, a folder of
already downloaded ``.deb`` files). The expected class of a header is its package's
(:data:`PACKAGES`: from the package's ``copyright`` file and the notices its headers
carry; dual-licensed packages take the class of their most permissive option, SPEC §4),
except where the header's own notice says otherwise (:data:`FILE_TRUTH`, each read by
hand and given a reason).

Every header is decided exactly as the license stage decides a file: one
:func:`megacpp_core.license.scan_revision` per package with only its headers (so no
directory license: the header's own ``SPDX-License-Identifier`` or leading comment
decides, else the class is ``unknown``), default :class:`~megacpp_core.license.LicensePolicy`.

Prints one JSON object: ``confusion`` (expected class -> recorded class -> count) over
the headers whose leading comment holds a license notice, ``no_notice`` (headers
without one, per package: their decision is left to a directory license in a real
tree), ``per_package`` (headers, with notice, agreeing), ``decisions`` (expected class
-> decision -> count), and ``disagreements`` (every header whose recorded class differs,
with the normalized notice's first 300 characters).

``--save-sample PATH`` also writes the labelled subset kept as a test
(``tests/data/license_truth.jsonl``): for each package, up to ``--per-package`` distinct
normalized notices plus the headers of :data:`MUST_SAMPLE` (the comment blocks only),
with package, path and expected class.

``--ref REV`` decides with ``megacpp_core/license.py`` of git revision ``REV`` instead
(the table before a change).

Usage::

    python bench/license_truth.py [--deb-dir DIR] [--ref REV] [--save-sample tests/data/license_truth.jsonl]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import types
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from megacpp_core import license as lic  # noqa: E402

#: Debian package -> (expected class of its headers, the license as its copyright file
#: and header notices state it).
PACKAGES = {
    "libgnutls28-dev": ("weak_copyleft", "LGPL-2.1-or-later"),
    "libgit2-dev": ("gpl2", "GPL-2.0 with a linking exception"),
    "libgmp-dev": ("weak_copyleft", "LGPL-3.0-or-later OR GPL-2.0-or-later (dual)"),
    "libreadline-dev": ("refused", "GPL-3.0-or-later"),
    "libgdbm-dev": ("refused", "GPL-3.0-or-later"),
    "libgsl-dev": ("refused", "GPL-3.0-or-later"),
    "libfftw3-dev": ("gpl2", "GPL-2.0-or-later"),
    "libssl-dev": ("permissive", "Apache-2.0"),
    "libzstd-dev": ("permissive", "BSD-3-Clause OR GPL-2.0-only (dual)"),
    "libcurl4-openssl-dev": ("permissive", "curl"),
    "zlib1g-dev": ("permissive", "Zlib"),
    "libsqlite3-dev": ("permissive", "public domain (blessing)"),
    "libjson-c-dev": ("permissive", "MIT"),
    "libpcre2-dev": ("permissive", "BSD-3-Clause WITH PCRE2-exception"),
    "libxml2-dev": ("permissive", "MIT"),
    "libncurses-dev": ("permissive", "X11 (MIT-style)"),
    "libbz2-dev": ("permissive", "bzip2-1.0.6"),
    "liblzma-dev": ("permissive", "public domain / 0BSD"),
    "libglib2.0-dev": ("weak_copyleft", "LGPL-2.1-or-later"),
    "libmpfr-dev": ("weak_copyleft", "LGPL-3.0-or-later"),
    "libgpg-error-dev": ("weak_copyleft", "LGPL-2.1-or-later"),
    "libgcrypt20-dev": ("weak_copyleft", "LGPL-2.1-or-later"),
    "nettle-dev": ("weak_copyleft", "LGPL-3.0-or-later OR GPL-2.0-or-later (dual)"),
    "libidn2-dev": ("weak_copyleft", "LGPL-3.0-or-later OR GPL-2.0-or-later (dual)"),
    "libtasn1-6-dev": ("weak_copyleft", "LGPL-2.1-or-later"),
    "libunistring-dev": ("weak_copyleft", "LGPL-3.0-or-later OR GPL-2.0-or-later (dual)"),
}
#: ``(package, path under usr/include)`` -> (expected class, reason): headers whose own
#: notice differs from their package's license.
FILE_TRUTH: dict[tuple[str, str], tuple[str, str]] = {
    ("libgnutls28-dev", "gnutls/openssl.h"): ("refused", "part of GnuTLS-EXTRA: GPL version 3 or later"),
    ("libgit2-dev", "git2/stdint.h"): ("permissive", "Alexander Chemeris' MSVC stdint.h: BSD 3-clause"),
    ("libgdbm-dev", "gdbm.h"): ("gpl2", "GPL version 2 or later (the package's copyright file says GPL-3+)"),
    ("libfftw3-dev", "fftw3.h"): ("permissive", "BSD 2-clause, 'applies *only* to this header file'"),
}
#: Headers always kept in the labelled sample (the cases the issue names and the
#: per-file exceptions above).
MUST_SAMPLE = frozenset({
    ("libgnutls28-dev", "gnutls/gnutls.h"), ("libgnutls28-dev", "gnutls/openssl.h"), ("libgit2-dev", "git2.h"),
    ("libunistring-dev", "unicase.h"), ("libgdbm-dev", "gdbm.h"), ("libfftw3-dev", "fftw3.h"),
    ("libgit2-dev", "git2/stdint.h"), ("libzstd-dev", "zstd.h"), ("libgmp-dev", "gmp.h"),
})
CLASSES = lic.CLASS_ORDER


def fetch(packages: list[str], deb_dir: Path | None, work: Path) -> dict[str, Path]:
    """Package -> its unpacked root under ``work``."""
    debs = work / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    out = {}
    for pkg in packages:
        found = sorted((deb_dir or debs).glob(f"{pkg}_*.deb"))
        if not found:
            subprocess.run(["apt-get", "download", pkg], cwd=debs, check=True, capture_output=True)
            found = sorted(debs.glob(f"{pkg}_*.deb"))
        root = work / "x" / pkg
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg", "-x", str(found[-1]), str(root)], check=True)
        out[pkg] = root
    return out


def headers(root: Path) -> dict[str, str]:
    inc = root / "usr" / "include"
    out = {}
    for p in sorted(inc.rglob("*.h")):
        if p.is_file() and not p.is_symlink():
            out[p.relative_to(inc).as_posix()] = p.read_text(encoding="utf-8", errors="replace")
    return out


def load_ref(ref: str) -> types.ModuleType:
    """``megacpp_core/license.py`` as of git ``ref`` (to compare with an older revision)."""
    src = subprocess.run(["git", "show", f"{ref}:megacpp_core/license.py"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    mod = types.ModuleType("license_at_ref")
    sys.modules["license_at_ref"] = mod
    exec(compile(src, f"{ref}:megacpp_core/license.py", "exec"), mod.__dict__)
    return mod


def main(argv: list[str] | None = None) -> dict:
    global lic
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default=None, help="decide with megacpp_core/license.py of this git revision")
    ap.add_argument("--deb-dir", type=Path, default=None, help="folder with downloaded .deb files")
    ap.add_argument("--save-sample", type=Path, default=None)
    ap.add_argument("--per-package", type=int, default=1)
    args = ap.parse_args(argv)
    if args.ref:
        lic = load_ref(args.ref)
    scanner = lic.Scanner()
    policy = lic.LicensePolicy()
    confusion = {e: Counter() for e in CLASSES}
    decisions = {e: Counter() for e in CLASSES}
    per_package, no_notice, disagreements, sample = {}, {}, [], []
    with tempfile.TemporaryDirectory() as tmp:
        roots = fetch(list(PACKAGES), args.deb_dir, Path(tmp))
        for pkg, root in roots.items():
            files = headers(root)
            rows = lic.scan_revision(pkg, files, list(files), policy, scanner)
            agree = with_notice = 0
            notices_taken: set[str] = set()
            for r in rows:
                text = files[r["path"]]
                notice = lic.normalize_header(lic.leading_comment(text))
                if not notice and not lic.spdx_identifier(text):
                    no_notice[pkg] = no_notice.get(pkg, 0) + 1
                    continue
                with_notice += 1
                expected = FILE_TRUTH.get((pkg, r["path"]), PACKAGES[pkg])[0]
                confusion[expected][r["license_class"]] += 1
                decisions[expected][r["decision"]] += 1
                if r["license_class"] == expected:
                    agree += 1
                else:
                    disagreements.append({"package": pkg, "path": r["path"], "expected": expected,
                                          "recorded": r["license_class"], "spdx": r["spdx_expression"],
                                          "notice": notice[:300]})
                key = notice or lic.spdx_identifier(text)
                must = (pkg, r["path"]) in MUST_SAMPLE
                if must or (key not in notices_taken and len(notices_taken) < args.per_package):
                    notices_taken.add(key)
                    sample.append({"package": pkg, "path": r["path"], "expected_class": expected,
                                   "package_license": PACKAGES[pkg][1], "comment": lic.leading_comment(text)})
            per_package[pkg] = {"headers": len(rows), "with_notice": with_notice, "agree": agree,
                                "license": PACKAGES[pkg][1], "expected": PACKAGES[pkg][0]}
    total = sum(sum(c.values()) for c in confusion.values())
    agree = sum(confusion[c][c] for c in CLASSES)
    result = {
        "packages": len(PACKAGES), "headers_with_notice": total, "agree": agree,
        "accuracy": round(agree / total, 4) if total else None,
        "confusion": {e: {r: confusion[e][r] for r in CLASSES if confusion[e][r]} for e in CLASSES if confusion[e]},
        "decisions": {e: dict(decisions[e]) for e in CLASSES if decisions[e]},
        "no_notice": no_notice, "per_package": per_package,
        "scancode_runs": scanner.scans, "disagreements": disagreements,
    }
    if args.save_sample:
        args.save_sample.parent.mkdir(parents=True, exist_ok=True)
        with open(args.save_sample, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(s, sort_keys=True, ensure_ascii=False) + "\n" for s in sample)
    print(json.dumps(result, indent=1, sort_keys=True))
    return result


if __name__ == "__main__":
    main()
