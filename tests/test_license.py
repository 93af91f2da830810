"""Stage 2 license classification and directory/header precedence."""

from __future__ import annotations

import pytest

from megacpp_core.license import (
    LicensePolicy,
    Scanner,
    classify_expression,
    decide,
    is_license_file,
    leading_comment,
    normalize_header,
    scan_revision,
    spdx_identifier,
)

MIT_TEXT = """MIT License

Copyright (c) 2020 Example Author

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT.
"""


class FakeScanner(Scanner):
    """Answers from a text -> expression table instead of running ScanCode."""

    def __init__(self, answers: dict[str, str]):
        super().__init__()
        self.answers = answers

    def scan_text(self, text: str, cache_key: str) -> str | None:
        if cache_key in self.cache:
            self.cache_hits += 1
            return self.cache[cache_key]
        self.scans += 1
        self.cache[cache_key] = next((e for k, e in self.answers.items() if k in text), None)
        return self.cache[cache_key]


@pytest.mark.parametrize(
    "expr, cls",
    [
        ("MIT", "permissive"),
        ("BSD-3-Clause OR GPL-2.0-only", "permissive"),
        ("GPL-3.0-only OR MPL-2.0", "weak_copyleft"),
        ("MIT AND GPL-2.0+", "gpl2"),
        ("GPL-2.0", "gpl2"),
        ("GPL-2.0-or-later", "gpl2"),
        ("MIT AND GPL-3.0-or-later", "refused"),
        ("AGPL-3.0-only OR SSPL-1.0", "refused"),
        ("Apache-2.0 WITH LLVM-exception", "permissive"),
        ("GPL-2.0-only WITH Classpath-exception-2.0", "gpl2"),
        ("GPL-3.0-or-later WITH GCC-exception-3.1", "refused"),
        ("LGPL-2.1-or-later AND (MIT OR GPL-3.0-only)", "weak_copyleft"),
        ("MIT AND (GPL-3.0-only OR LicenseRef-scancode-public-domain)", "permissive"),
        ("MIT AND LicenseRef-scancode-unknown-license-reference", "permissive"),
        ("LicenseRef-scancode-unknown-license-reference", "unknown"),
        ("LicenseRef-scancode-proprietary-license", "refused"),
        ("CC-BY-NC-4.0", "refused"),
        ("MIT AND NoSuchLicense-1.0", "unknown"),
        ("NoSuchLicense-1.0 AND GPL-3.0-only", "refused"),
        (None, "unknown"),
        ("", "unknown"),
        ("MIT AND (", "unknown"),
    ],
)
def test_classify_expression(expr, cls):
    assert classify_expression(expr) == cls


def test_policy_overrides_and_decisions():
    policy = LicensePolicy(extra_permissive=frozenset({"nosuchlicense-1.0"}), extra_refused=frozenset({"MIT"}))
    assert classify_expression("NoSuchLicense-1.0", policy) == "permissive"
    assert classify_expression("MIT OR Zlib", policy) == "permissive"
    assert classify_expression("MIT", policy) == "refused"
    assert decide("gpl2", LicensePolicy())[0] == "accept_tagged"
    assert decide("weak_copyleft", LicensePolicy())[0] == "accept"
    assert decide("refused", LicensePolicy())[0] == "refuse"
    assert decide("unknown", LicensePolicy())[0] == "refuse"
    assert decide("unknown", LicensePolicy(unknown_decision="accept_tagged"))[0] == "accept_tagged"
    with pytest.raises(ValueError):
        LicensePolicy(unknown_decision="maybe")
    with pytest.raises(ValueError):
        decide("copyleft", LicensePolicy())
    opt_out = LicensePolicy(gpl2_decision="refuse", weak_copyleft_decision="accept_tagged")
    assert decide("gpl2", opt_out)[0] == "refuse" and decide("weak_copyleft", opt_out)[0] == "accept_tagged"
    assert decide("permissive", opt_out)[0] == "accept"
    with pytest.raises(ValueError):
        LicensePolicy(gpl2_decision="tag")


def test_policy_from_snapshot_settings(tmp_path):
    from megacpp_core.manifest import ManifestError, load_manifest
    from megacpp_core.stages.license import license_policy

    base = (tmp_path / "m.yaml")
    src = ("sources:\n  - {name: a-1, kind: pypi, package: a, version: '1', sha256: '" + "0" * 64 + "'}\n")
    base.write_text("name: s\nsettings: {license_gpl2_decision: refuse, refused_sources: [b-2], "
                    "license_refused_ids: [Zlib]}\n" + src)
    policy = license_policy(load_manifest(base).settings)
    assert policy.gpl2_decision == "refuse" and policy.refused_sources == frozenset({"b-2"})
    assert classify_expression("Zlib", policy) == "refused" and classify_expression("Zlib OR MIT", policy) == "permissive"
    base.write_text("name: s\nsettings: {license_gpl2_decision: sometimes}\n" + src)
    with pytest.raises(ManifestError, match="license_gpl2_decision"):
        load_manifest(base)


def test_is_license_file():
    for p in ["LICENSE", "a/b/licence.txt", "COPYING.LESSER", "x/NOTICE", "README.md", "LICENSE-MIT", "docs/license.rst"]:
        assert is_license_file(p), p
    for p in ["src/license.c", "licensed.h", "readmeparser.cpp", "src/main.c", "COPYRIGHT_HOLDERS"]:
        assert not is_license_file(p), p


def test_header_extraction_and_normalization():
    text = (
        "#pragma once\n/* foo.h - frobnicates widgets\n *\n * Copyright (c) 2019 Jane Doe\n *\n"
        " * Licensed under the MIT license.\n */\n// trailing note\n#include <x.h>\n/* not a header */\n"
    )
    comment = leading_comment(text)
    assert "frobnicates" in comment and "trailing note" in comment and "not a header" not in comment
    other = text.replace("foo.h - frobnicates widgets", "bar.h - bars").replace("2019 Jane Doe", "2024 John Roe")
    assert normalize_header(comment) == normalize_header(leading_comment(other)) == "Licensed under the MIT license."
    assert normalize_header("/* just a description of the algorithm */") == ""
    assert leading_comment("int main(void) { return 0; } /* MIT */") == ""
    assert spdx_identifier("// SPDX-License-Identifier: GPL-2.0+ OR MIT */\nint x;") == "GPL-2.0-or-later OR MIT"
    assert spdx_identifier("\n" * 40 + "// SPDX-License-Identifier: MIT") is None


REVISION = {
    "LICENSE": "GPL-3 TEXT",
    "README.md": "Project readme, see LICENSE",
    "src/core.c": "int core;\n",
    "src/spdx.c": "// SPDX-License-Identifier: BSD-2-Clause\nint spdx;\n",
    "src/header.c": "/* This file is released under the Zlib license. */\nint h;\n",
    "vendor/lib/LICENSE.txt": "MIT TEXT",
    "vendor/lib/deep/x/y.c": "int y;\n",
    "vendor/lib/deep/README": "nothing to see here",
    "vendor/other/z.c": "int z;\n",
}
ANSWERS = {"GPL-3 TEXT": "GPL-3.0-only", "MIT TEXT": "MIT", "Zlib license": "Zlib"}


def test_scan_revision_precedence():
    scanner = FakeScanner(ANSWERS)
    rows = scan_revision("demo", REVISION, [p for p in REVISION if p.endswith(".c")], LicensePolicy(), scanner)
    by = {r["path"]: r for r in rows}
    assert [r["path"] for r in rows] == sorted(by)
    # nearest ancestor with a detecting license file wins; README without a license is skipped
    assert by["vendor/lib/deep/x/y.c"] == {
        "path": "vendor/lib/deep/x/y.c",
        "spdx_expression": "MIT",
        "license_class": "permissive",
        "decision": "accept",
        "reason": "permissive license",
        "origin": "directory_license",
        "license_file": "vendor/lib/LICENSE.txt",
    }
    assert (by["vendor/other/z.c"]["license_file"], by["vendor/other/z.c"]["decision"]) == ("LICENSE", "refuse")
    assert (by["src/core.c"]["origin"], by["src/core.c"]["license_class"]) == ("directory_license", "refused")
    # the file's own SPDX line / license header override the directory license
    assert (by["src/spdx.c"]["origin"], by["src/spdx.c"]["spdx_expression"], by["src/spdx.c"]["decision"]) == (
        "spdx_header", "BSD-2-Clause", "accept")
    assert (by["src/header.c"]["origin"], by["src/header.c"]["spdx_expression"], by["src/header.c"]["license_file"]) == (
        "file_header", "Zlib", None)
    # a second revision sharing the scanner reuses every cached answer
    scans = scanner.scans
    assert scan_revision("demo", REVISION, ["src/core.c", "src/header.c"], LicensePolicy(), scanner)
    assert scanner.scans == scans and scanner.cache_hits > 0


def test_unknown_default_and_refusal_list():
    files = {"a.c": "int a;\n", "docs/README": "hello"}
    rows = scan_revision("demo", files, ["a.c"], LicensePolicy(), FakeScanner({}))
    assert rows[0] == {
        "path": "a.c", "spdx_expression": None, "license_class": "unknown", "decision": "refuse",
        "reason": "no recognised license (unknown_decision=refuse)", "origin": "default", "license_file": None,
    }
    lenient = LicensePolicy(unknown_decision="accept_tagged")
    assert scan_revision("demo", files, ["a.c"], lenient, FakeScanner({}))[0]["decision"] == "accept_tagged"
    refused = LicensePolicy(refused_sources=frozenset({"demo"}))
    scanner = FakeScanner(ANSWERS)
    rows = scan_revision("demo", REVISION, ["src/spdx.c", "src/core.c"], refused, scanner)
    assert [(r["decision"], r["reason"]) for r in rows] == [("refuse", "source on refusal list")] * 2
    assert scanner.scans == 0
    with pytest.raises(KeyError):
        scan_revision("demo", files, ["missing.c"], LicensePolicy(), FakeScanner({}))


def test_scancode_detects_inline_mit_text():
    scanner = Scanner()
    files = {"LICENSE": MIT_TEXT, "src/a.c": "int a;\n", "src/b.c": "/* Licensed under the MIT License. */\nint b;\n"}
    rows = scan_revision("demo", files, ["src/a.c", "src/b.c"], LicensePolicy(), scanner)
    assert [(r["origin"], r["spdx_expression"], r["decision"]) for r in rows] == [
        ("directory_license", "MIT", "accept"),
        ("file_header", "MIT", "accept"),
    ]
    assert scanner.scan(MIT_TEXT) == "MIT" and scanner.scans == 2 and scanner.cache_hits == 1
