"""License decisions on real files of the default corpus (zstd, levenshtein, psycopg2).

The three sdists (~0.4-0.7 MB each) are read from the shared cache under ``data/cache``
(downloaded once through the stage-0 fetcher when missing) and run through stages 0-3
exactly as the Dagster assets run them.
"""

from __future__ import annotations

import dataclasses
import uuid

import pyarrow.parquet as pq
import pytest

from megacpp_checks.schemas import license as license_schema
from megacpp_checks.schemas import quality as quality_schema
from megacpp_checks.schemas import scrub as scrub_schema
from megacpp_core import license as lic
from megacpp_core import stages
from megacpp_core.stages import license as license_stage
from megacpp_core.layout import SnapshotLayout
from megacpp_core.manifest import load_manifest

from .conftest import make_data_root

SOURCES = ("zstandard-0.25.0", "levenshtein-0.27.5", "psycopg2-2.9.13")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """``(layout, manifest, {source: license rows as dicts keyed by path})``."""
    root = make_data_root(tmp_path_factory.mktemp("license-root"))
    manifest = load_manifest("default")
    layout = SnapshotLayout(root, manifest.name)
    rows = {}
    for name in SOURCES:
        src = manifest.source(name)
        for stage in ("acquire", "quality", "license", "scrub"):
            res = stages.run(stage, layout.data_root, manifest, src)
            assert all(ok for ok, _ in res.checks.values()), (stage, res.checks)
        t = pq.read_table(layout.shard(name) / "license.parquet").to_pylist()
        rows[name] = {r["path"]: r for r in t}
    return layout, manifest, rows


def test_zstd_dual_license_is_permissive(corpus):
    _, _, rows = corpus
    z = rows["zstandard-0.25.0"]
    dual = {p: r for p, r in z.items() if r["spdx_expression"] == "BSD-3-Clause OR GPL-2.0-only"}
    assert {"zstd/zstd.h", "zstd/zdict.h", "zstd/zstd_errors.h"} <= set(dual)
    for r in dual.values():
        assert (r["license_class"], r["decision"], r["origin"]) == ("permissive", "accept", "file_header")
    assert {r["decision"] for r in z.values()} == {"accept"}


def test_levenshtein_gpl2_accepted_and_tagged(corpus):
    _, _, rows = corpus
    lev = rows["levenshtein-0.27.5"]
    own = {p: r for p, r in lev.items() if p.startswith("src/Levenshtein/")}
    assert own, "levenshtein's own C++ sources were not kept"
    for r in own.values():
        assert "GPL-2.0-or-later" in r["spdx_expression"]
        assert (r["license_class"], r["decision"], r["origin"], r["license_file"]) == (
            "gpl2", "accept_tagged", "directory_license", "LICENSE")
    # the vendored rapidfuzz-cpp tree is MIT: its own LICENSE is the nearest ancestor
    vendored = [r for p, r in lev.items() if p.startswith("extern/rapidfuzz-cpp/")]
    assert vendored and all(r["license_class"] == "permissive" for r in vendored)
    assert any(r["origin"] == "directory_license" and r["license_file"] == "extern/rapidfuzz-cpp/LICENSE" for r in vendored)


def test_psycopg2_weak_copyleft_accepted(corpus):
    _, _, rows = corpus
    ps = rows["psycopg2-2.9.13"]
    assert {r["license_class"] for r in ps.values()} == {"weak_copyleft"}
    assert {r["decision"] for r in ps.values()} == {"accept"}
    r = ps["psycopg/adapter_asis.c"]
    assert r["spdx_expression"].startswith("LGPL-3.0-or-later") and r["origin"] == "file_header"


def test_stage_tables_pass_their_schemas(corpus):
    layout, _, _ = corpus
    for name in SOURCES:
        rdir = layout.shard(name)
        assert quality_schema.validate_kept(pq.read_table(rdir / "quality_kept.parquet"))[0]
        assert quality_schema.validate_exclusions(pq.read_table(rdir / "exclusions.parquet"))[0]
        assert license_schema.validate_license(pq.read_table(rdir / "license.parquet"))[0]
        assert scrub_schema.validate_scrubbed(pq.read_table(rdir / "scrubbed.parquet"))[0]


def test_header_scans_are_cached_across_files(corpus):
    layout, manifest, _ = corpus
    scanner = lic.Scanner()
    stages.run("license", layout.data_root, manifest, "psycopg2-2.9.13", tools={"scancode": scanner})
    # 66 files share a handful of distinct normalized headers and license files
    assert scanner.scans < 10 < scanner.cache_hits


def test_stored_answers_give_the_same_table(corpus, tmp_path):
    """A fresh scanner reads every ScanCode answer from the result store under the data
    root's cache (no ScanCode run) and writes the same bytes; a store of another ScanCode
    (another namespace) answers nothing and ScanCode runs again, with the same bytes."""
    from megacpp_core.license_scancode import ResultStore
    from megacpp_core.storage import DataRoot

    layout, manifest, _ = corpus
    path = layout.shard("psycopg2-2.9.13") / "license.parquet"
    res = stages.run("license", layout.data_root, manifest, "psycopg2-2.9.13", tools={"scancode": lic.Scanner()})
    want = path.read_bytes()
    warm = lic.Scanner()
    res = stages.run("license", layout.data_root, manifest, "psycopg2-2.9.13", tools={"scancode": warm})
    assert (warm.scans, res.figures["scancode_runs"]) == (0, 0) and warm.store_hits > 0
    assert res.figures["scancode_store_hits"] == warm.store_hits and path.read_bytes() == want
    foreign = lic.Scanner(ResultStore(DataRoot(layout.data_root).cache_dir / license_stage.STORE_DIR,
                                          ns=f"another scancode {uuid.uuid4().hex}"))  # never stored before, even in a shared cache
    stages.run("license", layout.data_root, manifest, "psycopg2-2.9.13", tools={"scancode": foreign})
    assert foreign.scans > 0 and foreign.store_hits == 0 and path.read_bytes() == want


def test_policy_is_configurable_per_snapshot(corpus):
    """Runs last: it leaves the strict policy's tables behind."""
    layout, manifest, rows = corpus
    strict = dataclasses.replace(manifest, settings=dataclasses.replace(
        manifest.settings, license_gpl2_decision="refuse", license_weak_copyleft_decision="accept_tagged",
        refused_sources=("zstandard-0.25.0",)))
    policy = license_stage.license_policy(strict.settings)
    scanner = license_stage.shared_scanner()
    for name in SOURCES:
        res = stages.run("license", layout.data_root, strict, name, tools={"scancode": scanner})
        assert res.checks["every_file_decided"][0]
    lev2 = {r["path"]: r for r in pq.read_table(layout.shard("levenshtein-0.27.5") / "license.parquet").to_pylist()}
    assert {r["decision"] for p, r in lev2.items() if p.startswith("src/Levenshtein/")} == {"refuse"}
    ps2 = pq.read_table(layout.shard("psycopg2-2.9.13") / "license.parquet").to_pylist()
    assert {r["decision"] for r in ps2} == {"accept_tagged"}
    z2 = pq.read_table(layout.shard("zstandard-0.25.0") / "license.parquet").to_pylist()
    assert {(r["decision"], r["origin"], r["reason"]) for r in z2} == {("refuse", "refusal_list", "source on refusal list")}
    assert policy.refused_sources == frozenset({"zstandard-0.25.0"}) and policy.gpl2_decision == "refuse"
    # scrub drops every refused file: none reaches the output
    res = stages.run("scrub", layout.data_root, strict, "levenshtein-0.27.5")
    assert res.checks["no_refused_license_downstream"][0]
    out = pq.read_table(layout.shard("levenshtein-0.27.5") / "scrubbed.parquet").column("path").to_pylist()
    assert not any(p.startswith("src/Levenshtein/") for p in out)
