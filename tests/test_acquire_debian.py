"""Stage 0 for ``debian`` sources: the private apt configuration, a real source package
(fmtlib from the machine's configured suite, cached under ``data/cache``), pins, and
hostile or inconsistent source packages built here (read without dpkg-source)."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from megacpp_core import acquire, acquire_debian as ad
from megacpp_core.dep5 import dep5_of_files
from megacpp_core.manifest import ManifestError, Source, load_manifest

from .conftest import SHARED_CACHE

#: fmtlib in bookworm (a ~330 KB source package, format 3.0 (quilt)).
FMT = dict(package="fmtlib", version="9.1.0+ds1-2",
           sha256="84ce1c2d0be3a9863935137969dcec6970125caac032f82474640bfc81463583")


def _src(name: str = "fmtlib-9.1.0", **kw) -> Source:
    return Source(name=name, kind="debian", order=0, **{**FMT, **kw})


def _manifest(tmp_path: Path, **kw) -> Path:
    f = {**FMT, **kw}
    p = tmp_path / "m.yaml"
    p.write_text(f"name: d\nsources:\n  - {{name: fmt, kind: debian, package: {f['package']}, "
                 f"version: '{f['version']}', sha256: {f['sha256']}}}\n")
    return p


@pytest.fixture(scope="module")
def fmt_acquired():
    """fmtlib fetched once through acquire_source into the shared cache, then read again."""
    first = acquire.acquire_source(_src(), SHARED_CACHE)
    second = acquire.acquire_source(_src(), SHARED_CACHE)
    return first, second


# --------------------------------------------------------------------------- a real source package


def test_real_package_read_through_acquire_source(fmt_acquired):
    a, b = fmt_acquired
    paths = [p for p, _ in a.files]
    assert paths == sorted(paths) and len(set(paths)) == len(paths)
    assert "include/fmt/format.h" in paths and "src/format.cc" in paths  # orig tarball at the root
    assert "debian/copyright" in paths and "debian/rules" in paths  # the debian tarball under debian/
    assert not any(p.startswith("fmtlib-") for p in paths)  # the orig's top directory is stripped
    assert a.revision == a.archive_sha256 == FMT["sha256"] and a.pin_ok
    assert a.origin == "fmtlib_9.1.0+ds1-2.dsc"
    assert b.from_cache and b.files == a.files and b.revision == a.revision  # deterministic, offline


def test_cached_package_needs_no_apt(fmt_acquired, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get, no apt-cache, no apt-config
    again = acquire.acquire_source(_src(), SHARED_CACHE)
    assert again.from_cache and again.files == fmt_acquired[0].files
    m = load_manifest(_manifest(tmp_path))
    acquire.check_pins(m, SHARED_CACHE)  # cached: nothing to look up


def test_dep5_of_real_package_maps_cpp_files(fmt_acquired):
    files = fmt_acquired[0].files
    d = dep5_of_files(files)
    assert d is not None and d.machine_readable and d.format_known
    spdx, pattern = d.license_for("include/fmt/format.h")
    assert pattern == "*" and spdx.startswith("MIT WITH ")  # "Expat with embedded exception"
    assert d.license_for("support/cmake/JoinPaths.cmake") == ("MIT OR CC0-1.0", "support/cmake/JoinPaths.cmake")
    assert d.license_for("debian/rules")[1] == "debian/*"  # the last matching stanza wins over "*"
    cpp = [p for p, _ in files if p.endswith((".cc", ".h"))]
    assert cpp and all(d.license_for(p)[0] for p in cpp)


def test_cached_files_are_content_addressed(fmt_acquired):
    rec = ad.cached_record(_src(), SHARED_CACHE)
    assert rec is not None and rec["dsc"]["name"] == "fmtlib_9.1.0+ds1-2.dsc"
    roles = {f["role"]: f for f in rec["files"]}
    assert roles["orig"]["sha256"] == FMT["sha256"] and "debian" in roles
    for f in [rec["dsc"], *rec["files"]]:
        p = acquire.cache_path(SHARED_CACHE, f["sha256"], f["name"])
        assert hashlib.sha256(p.read_bytes()).hexdigest() == f["sha256"]


# --------------------------------------------------------------------------- refusals against the suite


def test_wrong_pin_refused_before_download(tmp_path):
    bad = "0" * 64
    with pytest.raises(ad.DebianPinMismatchError, match=r"fmtlib-9\.1\.0.*fmtlib_9\.1\.0\+ds1\.orig\.tar\.gz.*manifest pins 0{64}"):
        acquire.acquire_source(_src(sha256=bad), SHARED_CACHE)
    assert not acquire.cache_path(SHARED_CACHE, bad, "x").parent.exists()
    with pytest.raises(ManifestError, match=r"m\.yaml.*'fmt'.*field 'sha256'"):
        acquire.check_pins(load_manifest(_manifest(tmp_path, sha256=bad)), SHARED_CACHE)


def test_version_or_package_not_in_suite_refused(tmp_path):
    with pytest.raises(ad.DebianVersionNotFoundError, match=r"version 0\.0\.1-1 of source package 'fmtlib' is not in "
                                                             r"the configured suites.*available: 9\.1\.0\+ds1-2"):
        acquire.acquire_source(_src(version="0.0.1-1"), SHARED_CACHE)
    with pytest.raises(ad.DebianVersionNotFoundError, match="'megacpp-no-such-source' is not in the configured suites"):
        acquire.acquire_source(_src(package="megacpp-no-such-source"), SHARED_CACHE)
    with pytest.raises(ManifestError, match=r"'fmt'.*field 'version'.*not in the configured suites"):
        acquire.check_pins(load_manifest(_manifest(tmp_path, version="0.0.1-1")), SHARED_CACHE)


def test_missing_apt_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ad.AptMissingError, match="fmtlib-9.1.0: the apt-get command is not installed"):
        acquire.acquire_source(_src(version="0.0.1-1"), tmp_path / "cache")


# --------------------------------------------------------------------------- private apt configuration


def test_deb_src_entries_derived_from_machine_style_files(tmp_path):
    etc = tmp_path / "etc"
    parts = etc / "sources.list.d"
    parts.mkdir(parents=True)
    (etc / "sources.list").write_text(
        "# comment\ndeb [arch=amd64 signed-by=/k/one.gpg] file:/srv/apt/one stable main contrib\n"
        "deb-src file:/srv/apt/one stable main\n")
    (parts / "a.sources").write_text(
        "Types: deb deb-src\nURIs: file:/srv/apt/two\nSuites: s1 s1-updates\nComponents: main\n"
        "Architectures: amd64\nSigned-By: /k/two.gpg\n\n"
        "Types: deb\nURIs: file:/srv/apt/off\nSuites: s2\nComponents: main\nEnabled: no\n\n"
        "Types: deb-src\nURIs: file:/srv/apt/src-only\nSuites: s3\nComponents: main\n")
    (parts / "b.list.disabled").write_text("deb file:/srv/apt/disabled s4 main\n")
    (parts / "c.list").write_text("deb file:/srv/apt/flat ./\n")
    entries = ad.machine_deb_entries(etc / "sources.list", parts)
    assert [e.uris[0] for e in entries] == ["file:/srv/apt/one", "file:/srv/apt/two",
                                            "file:/srv/apt/flat"]
    assert entries[0].options == (("Signed-By", "/k/one.gpg"),) and entries[0].components == ("main", "contrib")
    assert entries[1].suites == ("s1", "s1-updates") and entries[1].options == (("Signed-By", "/k/two.gpg"),)
    text = ad.render_deb_src(entries)
    assert text.count("Types: deb-src") == 3 and "Architectures" not in text and "/srv/apt/off" not in text
    cfg = ad.private_apt_config(tmp_path / "cache", etc / "sources.list", parts)
    assert cfg.root.is_relative_to((tmp_path / "cache").resolve())
    assert (cfg.root / "sources.list.d" / "derived.sources").read_text() == text
    conf = (cfg.root / "apt.conf").read_text()
    assert f'Dir::Etc::parts "{cfg.root / "apt.conf.d"}";' in conf and not any((cfg.root / "apt.conf.d").iterdir())
    opts = cfg.options()
    for key in ("Dir::State", "Dir::Cache", "Dir::Etc::sourcelist", "Dir::Etc::sourceparts", "Dir::Etc::preferencesparts"):
        value = next(o.split("=", 1)[1] for o in opts if o.startswith(key + "="))
        assert Path(value).is_relative_to(cfg.root)
    assert cfg.env()["APT_CONFIG"] == str(cfg.root / "apt.conf")
    assert ad.private_apt_config(tmp_path / "cache", etc / "sources.list", parts).key == cfg.key  # idempotent
    (parts / "c.list").write_text("deb file:/srv/apt/flat2 ./\n")
    assert ad.private_apt_config(tmp_path / "cache", etc / "sources.list", parts).key != cfg.key
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ad.AptConfigError, match="no deb entry"):
        ad.private_apt_config(tmp_path / "cache", empty / "sources.list", empty)


def test_machine_configuration_is_the_one_apt_reads():
    cfg = ad.private_apt_config(SHARED_CACHE)
    assert cfg.entries and cfg.root.is_relative_to(SHARED_CACHE.resolve())
    assert "Types: deb-src" in (cfg.root / "sources.list.d" / "derived.sources").read_text()


# --------------------------------------------------------------------------- source packages built here


def _tar(path: Path, files: dict[str, bytes], mode: str = "w:xz") -> Path:
    with tarfile.open(path, mode) as tf:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return path


def _dsc(d: Path, package: str, version: str, fmt: str, names: list[str], override: dict[str, str] | None = None) -> Path:
    lines = []
    for n in names:
        data = (d / n).read_bytes()
        sha = (override or {}).get(n) or hashlib.sha256(data).hexdigest()
        lines.append(f" {sha} {len(data)} {n}")
    md5 = [f" {hashlib.md5((d / n).read_bytes()).hexdigest()} {(d / n).stat().st_size} {n}" for n in names]
    p = d / ad.dsc_filename(package, version)
    p.write_text(f"Format: {fmt}\nSource: {package}\nVersion: {version}\n"
                 "Checksums-Sha256:\n" + "\n".join(lines) + "\nFiles:\n" + "\n".join(md5) + "\n")
    return p


def _quilt(tmp_path: Path, orig: dict[str, bytes], debian: dict[str, bytes] | None = None,
           components: dict[str, dict[str, bytes]] | None = None) -> Path:
    d = tmp_path / "pkg"
    d.mkdir()
    names = [_tar(d / "demo_1.0.orig.tar.xz", orig).name]
    for comp, files in (components or {}).items():
        names.append(_tar(d / f"demo_1.0.orig-{comp}.tar.gz", files, "w:gz").name)
    names.append(_tar(d / "demo_1.0-1.debian.tar.xz", debian or {"debian/copyright": b"free text\n"}).name)
    return _dsc(d, "demo", "1.0-1", "3.0 (quilt)", names)


def test_multi_tarball_layout_as_dpkg_source(tmp_path):
    dsc = _quilt(tmp_path,
                 orig={"demo-1.0/src/a.c": b"int a;\n", "demo-1.0/debian/old": b"x", "demo-1.0/.pc/applied": b"x",
                       "demo-1.0/extra/stale.c": b"int s;\n"},
                 debian={"debian/copyright": b"free\n", "debian/patches/series": b"p.patch\n"},
                 components={"extra": {"extra-2.0/lib.c": b"int l;\n"}, "docs": {"guide.txt": b"g\n"}})
    orig_sha = hashlib.sha256((dsc.parent / "demo_1.0.orig.tar.xz").read_bytes()).hexdigest()
    parsed, files = ad.read_dsc_dir(dsc, pin=orig_sha)
    assert [p for p, _ in files] == ["debian/copyright", "debian/patches/series", "docs/guide.txt", "extra/lib.c", "src/a.c"]
    assert {f.role for f in parsed.files} == {"orig", "component", "debian"} and parsed.main.sha256 == orig_sha
    assert ad.read_dsc_dir(dsc)[1] == files  # deterministic
    with pytest.raises(ad.DebianPinMismatchError, match="manifest pins"):
        ad.read_dsc_dir(dsc, pin="1" * 64)


@pytest.mark.parametrize("orig,debian,rule", [
    ({"demo-1.0/../../escape.c": b"x"}, None, "traversal"),
    ({"/etc/evil.c": b"x"}, None, "absolute path"),
    ({"demo-1.0/a.c": b"x"}, {"debian/../../x": b"x"}, "traversal"),
    ({"demo-1.0/a.c": b"x"}, {"src/a.c": b"overwrite"}, "outside debian/"),
])
def test_hostile_tarball_refused(tmp_path, orig, debian, rule):
    dsc = _quilt(tmp_path, orig, debian)
    with pytest.raises(acquire.UnsafeArchiveError, match=rule):
        ad.read_dsc_dir(dsc)


def test_hostile_symlink_in_orig_refused(tmp_path):
    d = tmp_path / "pkg"
    d.mkdir()
    with tarfile.open(d / "demo_1.0.orig.tar.xz", "w:xz") as tf:
        ti = tarfile.TarInfo("demo-1.0/link")
        ti.type, ti.linkname = tarfile.SYMTYPE, "../../../etc/passwd"
        tf.addfile(ti)
    _tar(d / "demo_1.0-1.debian.tar.xz", {"debian/copyright": b"x"})
    dsc = _dsc(d, "demo", "1.0-1", "3.0 (quilt)", ["demo_1.0.orig.tar.xz", "demo_1.0-1.debian.tar.xz"])
    with pytest.raises(acquire.UnsafeArchiveError, match="outside the archive"):
        ad.read_dsc_dir(dsc)


def test_dsc_checksum_mismatch_refused(tmp_path):
    dsc = _quilt(tmp_path, {"demo-1.0/a.c": b"int a;\n"})
    orig = dsc.parent / "demo_1.0.orig.tar.xz"
    _tar(orig, {"demo-1.0/a.c": b"int b;\n"})  # the tarball changed after the .dsc was written
    with pytest.raises(ad.DscChecksumError, match=r"demo_1\.0\.orig\.tar\.xz has (sha256|\d+ bytes).*Checksums-Sha256"):
        ad.read_dsc_dir(dsc)
    _dsc(dsc.parent, "demo", "1.0-1", "3.0 (quilt)", ["demo_1.0.orig.tar.xz", "demo_1.0-1.debian.tar.xz"],
         override={"demo_1.0-1.debian.tar.xz": "f" * 64})
    with pytest.raises(ad.DscChecksumError, match=r"demo_1\.0-1\.debian\.tar\.xz has sha256 .* lists f{64}"):
        ad.read_dsc_dir(dsc)
    _dsc(dsc.parent, "demo", "1.0-1", "3.0 (quilt)", ["demo_1.0.orig.tar.xz", "demo_1.0-1.debian.tar.xz"])
    orig.unlink()
    with pytest.raises(ad.DscChecksumError, match=r"demo_1\.0\.orig\.tar\.xz listed in demo_1\.0-1\.dsc is missing"):
        ad.read_dsc_dir(dsc)


def test_dsc_format_errors(tmp_path):
    d = tmp_path / "pkg"
    d.mkdir()
    _tar(d / "demo_1.0.orig.tar.xz", {"demo-1.0/a.c": b"x"})
    (d / "evil.sh").write_bytes(b"#!/bin/sh\n")
    with pytest.raises(ad.DscFormatError, match="unrecognised file 'evil.sh'"):
        ad.read_dsc_dir(_dsc(d, "demo", "1.0-1", "3.0 (quilt)", ["demo_1.0.orig.tar.xz", "evil.sh"]))
    with pytest.raises(ad.DscFormatError, match="do not fit source format"):
        ad.read_dsc_dir(_dsc(d, "demo", "1.0-1", "3.0 (quilt)", ["demo_1.0.orig.tar.xz"]))
    with pytest.raises(ad.DscFormatError, match="not supported"):
        ad.read_dsc_dir(_dsc(d, "demo", "1.0-1", "3.0 (git)", ["demo_1.0.orig.tar.xz"]))
    (d / "no-checksums.dsc").write_text("Format: 3.0 (quilt)\nSource: demo\nVersion: 1.0-1\n")
    with pytest.raises(ad.DscFormatError, match="no Checksums-Sha256"):
        ad.read_dsc_dir(d / "no-checksums.dsc")


def test_native_and_format_1_0_packages(tmp_path):
    d = tmp_path / "native"
    d.mkdir()
    _tar(d / "demo_2.0.tar.xz", {"demo-2.0/a.c": b"int a;\n", "demo-2.0/debian/copyright": b"x\n"})
    _, files = ad.read_dsc_dir(_dsc(d, "demo", "2.0", "3.0 (native)", ["demo_2.0.tar.xz"]))
    assert [p for p, _ in files] == ["a.c", "debian/copyright"]
    d = tmp_path / "v1"
    d.mkdir()
    _tar(d / "demo_1.0.orig.tar.gz", {"demo-1.0/a.c": b"int a;\n"}, "w:gz")
    diff = (b"--- demo-1.0.orig/a.c\n+++ demo-1.0/a.c\n@@ -1 +1 @@\n-int a;\n+int patched;\n"
            b"--- demo-1.0.orig/debian/copyright\n+++ demo-1.0/debian/copyright\n@@ -0,0 +1,2 @@\n+line one\n+line two\n"
            b"--- demo-1.0.orig/debian/compat\n+++ demo-1.0/debian/compat\n@@ -0,0 +1 @@\n+13\n\\ No newline at end of file\n")
    (d / "demo_1.0-1.diff.gz").write_bytes(gzip.compress(diff))
    _, files = ad.read_dsc_dir(_dsc(d, "demo", "1.0-1", "1.0", ["demo_1.0.orig.tar.gz", "demo_1.0-1.diff.gz"]))
    assert dict(files) == {"a.c": b"int a;\n", "debian/copyright": b"line one\nline two\n", "debian/compat": b"13"}


def test_revision_limits_apply_across_tarballs(tmp_path):
    dsc = _quilt(tmp_path, {f"demo-1.0/f{i}.c": b"x" for i in range(6)},
                 components={"c": {f"c/g{i}.c": b"y" for i in range(6)}})
    with pytest.raises(acquire.UnsafeArchiveError, match="more than 10 entries"):
        ad.read_dsc_dir(dsc, acquire.ArchiveLimits(max_entries=10))


def test_versions_and_file_names():
    assert ad.split_version("1:15.0.6-4") == ("1", "15.0.6", "4")
    assert ad.split_version("2.0") == ("", "2.0", "")
    assert ad.dsc_filename("llvm-toolchain-15", "1:15.0.6-4") == "llvm-toolchain-15_15.0.6-4.dsc"
    assert ad.classify_file("opencv", "4.6.0+dfsg-12", "opencv_4.6.0+dfsg.orig-contrib.tar.xz") == ("component", "contrib")
    assert ad.classify_file("m", "1:2-3", "m_2.orig.tar.gz.asc") == ("signature", None)
    with pytest.raises(ValueError):
        ad.split_version("1.0 -1")


# --------------------------------------------------------------------------- manifest


def test_manifest_debian_kind(tmp_path):
    m = load_manifest(_manifest(tmp_path))
    s = m.sources[0]
    assert (s.kind, s.package, s.version, s.sha256) == ("debian", *FMT.values())
    p = tmp_path / "bad.yaml"
    p.write_text("name: d\nsources:\n  - {name: x, kind: debian, package: fmtlib, version: '1.0-1'}\n")
    with pytest.raises(ManifestError, match="field 'sha256' is required for kind debian"):
        load_manifest(p)
    p.write_text(f"name: d\nsources:\n  - {{name: x, kind: debian, package: fmtlib, version: 'v 1', sha256: {'a' * 64}}}\n")
    with pytest.raises(ManifestError, match="field 'version' is not a Debian"):
        load_manifest(p)
    p.write_text(f"name: d\nsources:\n  - {{name: x, kind: debian, package: fmtlib, version: '1', sha256: {'a' * 64}, url: u}}\n")
    with pytest.raises(ManifestError, match="field 'url' is not a field of kind debian"):
        load_manifest(p)


def test_format_1_0_diff_with_hostile_path_refused(tmp_path):
    d = tmp_path / "v1"
    d.mkdir()
    _tar(d / "demo_1.0.orig.tar.gz", {"demo-1.0/a.c": b"int a;\n"}, "w:gz")
    diff = b"--- demo-1.0.orig/debian/../../x\n+++ demo-1.0/debian/../../x\n@@ -0,0 +1 @@\n+owned\n"
    (d / "demo_1.0-1.diff.gz").write_bytes(gzip.compress(diff))
    with pytest.raises(acquire.UnsafeArchiveError, match=r"demo_1\.0-1\.diff\.gz.*traversal"):
        ad.read_dsc_dir(_dsc(d, "demo", "1.0-1", "1.0", ["demo_1.0.orig.tar.gz", "demo_1.0-1.diff.gz"]))
