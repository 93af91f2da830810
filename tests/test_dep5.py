"""DEP-5 debian/copyright as a license signal: stanza matching (last match wins, globs
relative to the source root), DEP-5 short names → SPDX, free-form files recorded as such."""

from __future__ import annotations

import pytest
from debian.copyright import _CURRENT_FORMAT  # the copyright-format/1.0 URL, as python-debian knows it

from megacpp_core import dep5
from megacpp_core.license import classify_expression, parse_expression

COPYRIGHT = f"""Format: {_CURRENT_FORMAT}
Upstream-Name: demo
License: GPL-2+

Files: *
Copyright: 2020 Someone
License: GPL-2+

Files: src/*.c
       src/?.h
Copyright: 2021 Other
License: Expat

Files: */Makefile.in
Copyright: FSF
License: FSF-unlimited

Files: Makefile.in
Copyright: FSF
License: GPL-3+ with Autoconf exception

Files: src/vendor/*
Copyright: Vendor
License: BSD-3-clause or Apache-2.0, and public-domain

Files: src/literal\\*star.c
Copyright: x
License: LGPL-2.1+

Files: debian/*
Copyright: 2022 Maintainer
License: GPL-2+

License: GPL-2+
 On Debian systems, the full text is in /usr/share/common-licenses/GPL-2.
"""


def test_last_matching_stanza_wins_and_globs_are_root_relative():
    d = dep5.parse_copyright(COPYRIGHT)
    assert d.machine_readable and d.format_known and len(d.stanzas) == 7
    assert d.header_license == "GPL-2+" and d.header_spdx == "GPL-2.0-or-later"
    assert d.license_for("README") == ("GPL-2.0-or-later", "*")
    assert d.license_for("src/main.c") == ("MIT", "src/*.c")
    assert d.license_for("src/deep/dir/x.c") == ("MIT", "src/*.c")  # '*' matches '/'
    assert d.license_for("src/a.h") == ("MIT", "src/?.h")
    assert d.license_for("src/ab.h") == ("GPL-2.0-or-later", "*")  # '?' is one character
    assert d.license_for("Makefile.in")[1] == "Makefile.in"  # the later root-only stanza wins
    assert d.license_for("Makefile.in")[0] == "GPL-3.0-or-later WITH Autoconf-exception-3.0"
    assert d.license_for("lib/Makefile.in") == ("LicenseRef-dep5-FSF-unlimited", "*/Makefile.in")
    assert d.license_for("src/vendor/z.c") == (
        "(BSD-3-Clause OR Apache-2.0) AND LicenseRef-scancode-public-domain", "src/vendor/*")  # after src/*.c
    assert d.license_for("src/literal*star.c")[0] == "LGPL-2.1-or-later"
    assert d.license_for("src/literalXstar.c") == ("MIT", "src/*.c")  # '\*' is a literal star
    assert d.license_for("debian/rules") == ("GPL-2.0-or-later", "debian/*")
    assert d.license_for("./src/main.c") == ("MIT", "src/*.c")
    assert d.licenses_for(["README", "src/main.c"]) == [("README", "GPL-2.0-or-later", "*"), ("src/main.c", "MIT", "src/*.c")]


def test_no_matching_stanza():
    d = dep5.parse_copyright(f"Format: {_CURRENT_FORMAT}\n\nFiles: src/*\nCopyright: x\nLicense: Expat\n")
    assert d.license_for("include/a.h") == (None, None)
    assert d.license_for("src/a.c") == ("MIT", "src/*")


@pytest.mark.parametrize("text,reason", [
    ("This package was debianized by Someone on Mon, 1 Jan 2001.\n\nIt was downloaded from somewhere.\n\n"
     "Upstream Author: Someone\n\nCopyright: 2001 Someone\n\nLicense:\n  GPL, see /usr/share/common-licenses/GPL\n",
     "not machine-readable"),
    ("Upstream-Name: demo\n\nFiles: *\nCopyright: x\nLicense: Expat\n", "Format"),
    ("", "empty"),
])
def test_free_form_copyright_recorded_as_such(text, reason):
    d = dep5.parse_copyright(text)
    assert not d.machine_readable and reason in d.reason and d.stanzas == ()
    assert d.license_for("src/a.c") == (None, None)


def test_bytes_invalid_glob_and_unreadable_license_line():
    raw = (f"Format: {_CURRENT_FORMAT}\n\nFiles: *\nCopyright: caf\xe9\nLicense: Expat\n\n"
           "Files: bad\\x\nCopyright: x\nLicense: MIT\n\nFiles: odd/*\nCopyright: x\nLicense: GPL-2+ or\n").encode("latin-1")
    d = dep5.parse_copyright(raw)
    assert d.machine_readable and len(d.stanzas) == 2 and len(d.warnings) == 1 and "paragraph 1" in d.warnings[0]
    assert d.license_for("odd/a.c") == (None, "odd/*")  # dangling 'or': no SPDX, the stanza still named


@pytest.mark.parametrize("short,spdx", [
    ("GPL-2", "GPL-2.0-only"),
    ("GPL-2+", "GPL-2.0-or-later"),
    ("GPL-2.0+", "GPL-2.0-or-later"),
    ("GPL-3+", "GPL-3.0-or-later"),
    ("GPL", "GPL-1.0-or-later"),
    ("LGPL-2.1", "LGPL-2.1-only"),
    ("LGPL-2.1+", "LGPL-2.1-or-later"),
    ("LGPL-3+", "LGPL-3.0-or-later"),
    ("AGPL-3+", "AGPL-3.0-or-later"),
    ("GFDL-NIV-1.3+", "GFDL-1.3-no-invariants-or-later"),
    ("Expat", "MIT"),
    ("BSD-2-clause", "BSD-2-Clause"),
    ("BSD-3-clause", "BSD-3-Clause"),
    ("Apache-2.0", "Apache-2.0"),
    ("Apache-2", "Apache-2.0"),
    ("MPL-2.0", "MPL-2.0"),
    ("ISC", "ISC"),
    ("Zlib", "Zlib"),
    ("CC0", "CC0-1.0"),
    ("Boost-1.0", "BSL-1.0"),
    ("BSL-1.0", "BSL-1.0"),
    ("Artistic-2.0", "Artistic-2.0"),
    ("Perl", "GPL-1.0-or-later OR Artistic-1.0-Perl"),
    ("public-domain", "LicenseRef-scancode-public-domain"),
    ("GPL-2+ with OpenSSL exception", "GPL-2.0-or-later WITH LicenseRef-scancode-openssl-exception-gpl-2.0"),
    ("GPL-3+ with GCC exception", "GPL-3.0-or-later WITH GCC-exception-3.1"),
    ("GPL-2+ with Font exception", "GPL-2.0-or-later WITH Font-exception-2.0"),
    ("Apache-2.0 with LLVM exception", "Apache-2.0 WITH LLVM-exception"),
    ("LGPL-2.1 with Qt exception", "LGPL-2.1-only WITH Qt-LGPL-exception-1.1"),
    ("Expat with embedded exception", "MIT WITH LicenseRef-dep5-embedded-exception"),
    ("GPL-2+ or Artistic", "GPL-2.0-or-later OR Artistic-1.0"),
    ("A or B and C", "LicenseRef-dep5-A OR (LicenseRef-dep5-B AND LicenseRef-dep5-C)"),
    ("GPL-2+ or Artistic-2.0, and BSD-3-clause", "(GPL-2.0-or-later OR Artistic-2.0) AND BSD-3-Clause"),
    ("ISC, Expat", "ISC AND MIT"),
    ("Some-Local-License", "LicenseRef-dep5-Some-Local-License"),
])
def test_short_names_normalised_to_spdx(short, spdx):
    assert dep5.dep5_to_spdx(short) == spdx
    assert dep5.normalize_license(short) == spdx and parse_expression(spdx) is not None


@pytest.mark.parametrize("bad", ["", "   ", "or", "GPL-2+ and", "GPL-2+ with", "GPL-2+ or , Expat"])
def test_unreadable_expressions(bad):
    assert dep5.normalize_license(bad) is None
    if bad.strip():
        with pytest.raises(dep5.Dep5Error):
            dep5.dep5_to_spdx(bad)


def test_normalised_names_feed_the_license_classes():
    cls = {s: classify_expression(dep5.normalize_license(s)) for s in
           ("Expat", "public-domain", "LGPL-2.1+", "GPL-2+", "GPL-3+", "Some-Local-License", "Expat or GPL-3+")}
    assert cls == {"Expat": "permissive", "public-domain": "permissive", "LGPL-2.1+": "weak_copyleft",
                   "GPL-2+": "gpl2", "GPL-3+": "refused", "Some-Local-License": "unknown", "Expat or GPL-3+": "permissive"}


def test_dep5_of_files():
    files = [("a.c", b"int a;"), ("debian/copyright", f"Format: {_CURRENT_FORMAT}\n\nFiles: *\nCopyright: x\nLicense: ISC\n".encode())]
    assert dep5.dep5_of_files(files).license_for("a.c") == ("ISC", "*")
    assert dep5.dep5_of_files(files[:1]) is None
