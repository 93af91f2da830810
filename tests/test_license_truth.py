"""License classes of real header notices whose licenses are known from their own files.

``tests/data/license_truth.jsonl`` (written by ``bench/license_truth.py --save-sample``)
holds leading comment blocks of Debian ``-dev`` package headers with their package and
expected class: GPL-3 headers (readline, gsl, GnuTLS-EXTRA's openssl.h) refused, LGPL
ones (gnutls, glib, gcrypt, ...) accepted, GPL-2 ones (libgit2's "GPL v2 with a Linking
Exception", gdbm.h) tagged, dual-licensed ones (zstd, gmp, nettle, libidn2, libunistring)
classified by their most permissive option. Each block is decided by the real ScanCode
path of the license stage (:func:`megacpp_core.license.scan_revision`, header only).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megacpp_core import license as lic

DATA = Path(__file__).parent / "data" / "license_truth.jsonl"
#: Notices that only point elsewhere: the header alone is ``unknown`` by design and the
#: directory license decides in a real tree.
HEADER_ALONE_UNKNOWN = {("libbz2-dev", "bzlib.h"): "released under the terms of the license contained in the file LICENSE"}
DECISION = {"permissive": "accept", "weak_copyleft": "accept", "gpl2": "accept_tagged", "refused": "refuse"}
#: libgit2's header notice as the pygit2 sdist of corpora/default.yaml ships it (src/wildmatch.h).
LIBGIT2_IN_PYGIT2 = (
    "/*\n * Copyright (C) the libgit2 contributors. All rights reserved.\n *\n"
    " * This file is part of libgit2, distributed under the GNU GPL v2 with\n"
    " * a Linking Exception. For full terms see the included COPYING file.\n */\n"
)


@pytest.fixture(scope="module")
def scanner():
    return lic.Scanner()


def _decide(scanner, package: str, path: str, comment: str) -> dict:
    files = {path: comment + "\n#include <stddef.h>\nint x;\n"}
    return lic.scan_revision(package, files, [path], lic.LicensePolicy(), scanner)[0]


def test_truth_set_shape():
    records = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()]
    assert len(records) >= 25 and len({r["package"] for r in records}) >= 20
    assert {r["expected_class"] for r in records} == {"permissive", "weak_copyleft", "gpl2", "refused"}


@pytest.mark.parametrize("record", [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()],
                         ids=lambda r: f"{r['package']}:{r['path']}")
def test_real_notice_class(scanner, record):
    row = _decide(scanner, record["package"], record["path"], record["comment"])
    if (record["package"], record["path"]) in HEADER_ALONE_UNKNOWN:
        assert row["license_class"] == "unknown" and row["spdx_expression"] is None
        return
    assert (row["license_class"], row["decision"]) == (record["expected_class"], DECISION[record["expected_class"]]), (
        row["spdx_expression"])
    assert row["origin"] in ("file_header", "spdx_header")


def test_gpl2_with_linking_exception_is_tagged_not_lgpl(scanner):
    for package, path, comment in (
        ("pygit2-1.21.0", "src/wildmatch.h", LIBGIT2_IN_PYGIT2),
        *[(r["package"], r["path"], r["comment"]) for r in map(json.loads, DATA.read_text().splitlines())
          if r["path"] == "git2.h"],
    ):
        row = _decide(scanner, package, path, comment)
        assert "GPL-2.0" in row["spdx_expression"] and "LGPL" not in row["spdx_expression"], row
        assert (row["license_class"], row["decision"]) == ("gpl2", "accept_tagged")


def test_mention_of_another_files_license_is_not_the_files_license(scanner):
    gnutls = next(r for r in map(json.loads, DATA.read_text().splitlines()) if r["path"] == "gnutls/gnutls.h")
    assert "openssl compatibility layer (which is under the GNU GPL" in " ".join(gnutls["comment"].replace("*", " ").split())
    row = _decide(scanner, gnutls["package"], gnutls["path"], gnutls["comment"])
    assert row["spdx_expression"] == "LGPL-2.1-or-later"
    assert (row["license_class"], row["decision"]) == ("weak_copyleft", "accept")


@pytest.mark.parametrize("sentence, other", [
    ("The openssl compatibility layer (which is under the GNU GPL license) is in gnutls/openssl.h.", True),
    ("The files in crypto.c and hash.c are licensed under the BSD license.", True),
    ("See LICENSE.txt for the license.", False),
    ("Licensed under the MIT license, see COPYING.LIB.", False),
    ("This file is part of libgit2, distributed under the GNU GPL v2 with a Linking Exception.", False),
    ("Portions of this file are derived from zlib.h, under the zlib license.", False),
    ("you can redistribute it and/or modify it under the terms of the GNU General Public License", False),
    ("The low level cipher functionality is in gnutls/crypto.h.", False),  # no license word
])
def test_mentions_other_file(sentence, other):
    assert lic.mentions_other_file(sentence) is other


def test_normalize_header_drops_only_other_file_sentences():
    comment = (
        "/*\n * This library is free software; you can redistribute it under the terms of the\n"
        " * GNU Lesser General Public License, version 2.1 or later.\n *\n"
        " * The compatibility layer (which is under the GNU GPL license) is in compat/gpl.h.\n"
        " * The rest is documented in doc/api.txt.\n */\n"
    )
    out = lic.normalize_header(comment)
    assert "Lesser General Public License, version 2.1" in out
    assert "GNU GPL license" not in out and "compat/gpl.h" not in out
    plain = "/* Licensed under the MIT license. See LICENSE for details. */"
    assert lic.normalize_header(plain) == "Licensed under the MIT license. See LICENSE for details."


@pytest.mark.parametrize("notice, want_class", [
    # a choice in one sentence does not turn an obligation stated in another into an option
    ("This file is dual-licensed under the MIT License or the Apache License, Version 2.0.\n"
     "The assembly routines in this file are licensed under the GNU General Public License version 3 only.", "refused"),
    # a sentence-level re-read never drops a stricter clue of the whole text
    ("Licensed under the MIT license.\nSome routines are covered by the GNU GPL.", "refused"),
])
def test_rereading_a_notice_is_never_less_strict(scanner, notice, want_class):
    assert lic.classify_expression(scanner.scan(notice)) == want_class


def test_a_notice_naming_its_own_file_is_kept():
    comment = ("/* foo.h is free software; you can redistribute it and/or modify it under the terms of the GNU "
               "General Public License version 2. */\n")
    assert "GNU General Public License version 2" in lic.normalize_header(lic.leading_comment(comment), "include/foo.h")
    assert lic.normalize_header(lic.leading_comment(comment), "src/bar.h") == ""  # in bar.h it is another file's notice
