"""DEP-5 as a second license signal: a real Debian source package (fmtlib) through
acquire → quality → license with agreement figures, and the policy on hostile rows."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from megacpp_checks.schemas import license as license_schema
from megacpp_core import dep5, stages
from megacpp_core.license import LicensePolicy
from megacpp_core.manifest import load_manifest
from tests.conftest import make_data_root

FMT = ("  - {name: fmtlib-9.1.0, kind: debian, package: fmtlib, version: '9.1.0+ds1-2', "
       "sha256: 84ce1c2d0be3a9863935137969dcec6970125caac032f82474640bfc81463583}\n"
       "  - {name: lz4-4.4.5, kind: pypi, package: lz4, version: '4.4.5', "
       "sha256: 5f0b9e53c1e82e88c10d7c180069363980136b9d7a8306c4dca4f760d60c39f0}\n")


@pytest.fixture(scope="module")
def fmt_license(tmp_path_factory):
    base = tmp_path_factory.mktemp("dep5")
    path = base / "d.yaml"
    path.write_text("name: d\nsources:\n" + FMT)
    m = load_manifest(path)
    root = make_data_root(base / "root")
    results = {}
    for src in m.sources:
        for name in ("acquire", "quality", "license"):
            res = stages.run(name, root, m, src)
            assert res.ok, (name, res.checks)
        results[src.name] = (res, pq.read_table(root / "snapshots" / "d" / "revisions" / src.name / "shards" / "000" / "license.parquet"))
    return results


def test_real_package_gets_dep5_agreement_figures(fmt_license):
    res, table = fmt_license["fmtlib-9.1.0"]
    d = res.figures["dep5"]
    assert d["copyright"] == "dep5" and d["compared"] == table.num_rows > 10
    assert 0.0 <= d["agreement_rate"] <= 1.0
    rows = table.to_pylist()
    assert {r["agreement"] for r in rows} <= set(dep5.COMPARED)
    header = next(r for r in rows if r["path"] == "include/fmt/format.h")
    assert header["license_dep5"] and header["dep5_pattern"] == "*" and header["license_scancode"]
    assert license_schema.validate_license(table)[0]


def test_other_kinds_have_no_dep5_signal(fmt_license):
    res, table = fmt_license["lz4-4.4.5"]
    assert res.figures["dep5"]["copyright"] == "none" and res.figures["dep5"]["agreement_rate"] is None
    assert set(table.column("agreement").to_pylist()) == {"no_dep5"}
    assert set(table.column("decided_by").to_pylist()) == {"scancode"}


COPYRIGHT = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: demo

Files: *
Copyright: 2020 Someone
License: Expat

Files: src/gpl/*
Copyright: 2020 Someone
License: GPL-3+

Files: src/odd.c
Copyright: 2020 Someone
License: some-custom-thing
"""


def _row(path, expr, cls, origin="file_header"):
    return {"path": path, "spdx_expression": expr, "license_class": cls, "decision": "accept", "reason": "r",
            "origin": origin, "license_file": None}


@pytest.mark.parametrize("mode, path, scancode, want", [
    # the stricter of the two: DEP-5's GPL-3 refuses a file ScanCode read as MIT
    ("stricter", "src/gpl/a.c", ("MIT", "permissive"), ("dep5", "refused", "refuse", "disagree")),
    ("scancode", "src/gpl/a.c", ("MIT", "permissive"), ("scancode", "permissive", "accept", "disagree")),
    ("dep5", "src/gpl/a.c", ("MIT", "permissive"), ("dep5", "refused", "refuse", "disagree")),
    # ScanCode's GPL-3 is stricter than DEP-5's Expat: ScanCode stands
    ("stricter", "src/a.c", ("GPL-3.0-or-later", "refused"), ("scancode", "refused", "accept", "disagree")),
    ("dep5", "src/a.c", ("GPL-3.0-or-later", "refused"), ("dep5", "permissive", "accept", "disagree")),
    # ScanCode found nothing: dep5_if_unknown takes DEP-5, stricter keeps unknown (fail safe)
    ("dep5_if_unknown", "src/a.c", (None, "unknown"), ("dep5", "permissive", "accept", "dep5_only")),
    ("stricter", "src/a.c", (None, "unknown"), ("scancode", "unknown", "accept", "dep5_only")),
    ("stricter", "src/a.c", ("MIT", "permissive"), ("scancode", "permissive", "accept", "agree")),
    ("stricter", "src/a.c", ("BSD-3-Clause", "permissive"), ("scancode", "permissive", "accept", "same_class")),
    # an unknown DEP-5 short name is rated unknown: stricter refuses
    ("stricter", "src/odd.c", ("MIT", "permissive"), ("dep5", "unknown", "refuse", "disagree")),
])
def test_policy_decides_where_the_signals_differ(mode, path, scancode, want):
    d = dep5.parse_copyright(COPYRIGHT)
    out = dep5.reconcile(_row(path, *scancode), d, mode, LicensePolicy())
    assert (out["decided_by"], out["license_class"], out["decision"], out["agreement"]) == want
    assert out["license_scancode"] == scancode[0]
    if out["decided_by"] == "dep5":
        assert out["spdx_expression"] == out["license_dep5"] and "license_dep5_policy=" + mode in out["reason"]


def test_refusal_list_free_form_and_unknown_modes():
    d = dep5.parse_copyright(COPYRIGHT)
    refused = dict(_row("src/gpl/a.c", None, "unknown", origin="refusal_list"), decision="refuse")
    assert dep5.reconcile(refused, d, "dep5", LicensePolicy())["decision"] == "refuse"
    free = dep5.parse_copyright("This package was debianized by someone.\nIt is GPL.\n")
    out = dep5.reconcile(_row("a.c", "MIT", "permissive"), free, "stricter", LicensePolicy())
    assert out["agreement"] == "not_machine_readable" and out["decided_by"] == "scancode"
    assert dep5.summary([out], free)["copyright"] == "free_form"
    assert dep5.reconcile(_row("a.c", "MIT", "permissive"), None, "stricter", LicensePolicy())["agreement"] == "no_dep5"
    with pytest.raises(ValueError, match="license_dep5_policy"):
        dep5.reconcile(_row("a.c", "MIT", "permissive"), d, "loosest", LicensePolicy())


def test_the_setting_is_validated(tmp_path):
    from megacpp_core.manifest import ManifestError

    p = tmp_path / "m.yaml"
    p.write_text("name: d\nsettings: {license_dep5_policy: loosest}\nsources:\n" + FMT)
    with pytest.raises(ManifestError, match="license_dep5_policy"):
        load_manifest(p)
