"""Stage 0 for every source kind of SPEC §3: git (real repositories over file://), archive,
local, pypi — provenance columns, pins, refusals and the offline second run."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from megacpp_checks.schemas.acquire import validate_source_files
from megacpp_core import acquire, stages
from megacpp_core.layout import SnapshotLayout
from megacpp_core.manifest import ManifestError, load_manifest
from megacpp_core.tables import read_parquet

GIT_ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def served_repo(tmp_path):
    """A real repository with an annotated tag v1.0, a lightweight tag v1.1, a branch
    ``release`` and a hook that would leave a marker if any hook ran."""
    repo = tmp_path / "upstream"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "src").mkdir()
    (repo / "src" / "a.cpp").write_text("int main() { return 0; }\n")
    (repo / "include").mkdir()
    (repo / "include" / "a.h").write_text("#pragma once\nint f();\n")
    os.symlink("a.h", repo / "include" / "alias.h")
    (repo / "LICENSE").write_text("MIT License\n")
    marker = tmp_path / "HOOK_RAN"
    (repo / ".gitattributes").write_text("*.cpp filter=evil\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "core.hooksPath=/dev/null", "commit", "-q", "-m", "one")
    _git(repo, "tag", "-a", "v1.0", "-m", "release 1.0")
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "src" / "b.c").write_text("int b(void) { return 1; }\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "core.hooksPath=/dev/null", "commit", "-q", "-m", "two")
    _git(repo, "tag", "v1.1")
    _git(repo, "branch", "release")
    for hook in ("post-checkout", "post-merge", "pre-commit", "post-receive", "reference-transaction", "pre-upload", "update"):
        h = repo / ".git" / "hooks" / hook  # installed last: any hook run from now on leaves the marker
        h.write_text(f"#!/bin/sh\ntouch {marker}\n")
        h.chmod(0o755)
    return repo, first, _git(repo, "rev-parse", "HEAD"), marker


def _manifest(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "m.yaml"
    p.write_text(body)
    return p


def test_git_tag_fetched_shallow_commit_recorded_no_hooks(tmp_path, served_repo):
    repo, first, second, marker = served_repo
    m = load_manifest(_manifest(tmp_path, f"name: g\nsources:\n  - {{name: up-1.0, kind: git, url: '{repo.as_uri()}', tag: v1.0}}\n"
                                          f"  - {{name: up-1.1, kind: git, url: '{repo.as_uri()}', tag: v1.1}}\n"))
    layout = SnapshotLayout(tmp_path / "root", "g")
    res = stages.run("acquire", layout.data_root, m, m.sources[0])
    assert res.figures["revision"] == first and res.checks["hash_matches_pin"][0] and res.checks["source_files_schema"][0]
    t = read_parquet(layout.shard("up-1.0") / "source_files.parquet")
    assert t.column("path").to_pylist() == [".gitattributes", "LICENSE", "include/a.h", "src/a.cpp"]  # in-tree symlink skipped
    assert set(t.column("revision").to_pylist()) == {first} and set(t.column("version").to_pylist()) == {"v1.0"}
    assert set(t.column("kind").to_pylist()) == {"git"} and t.column("archive_sha256").null_count == t.num_rows
    lang = dict(zip(t.column("path").to_pylist(), t.column("language").to_pylist()))
    assert lang["src/a.cpp"] == "cpp" and lang["include/a.h"] == "header" and lang["LICENSE"] is None
    # the lightweight tag resolves to the second commit; the fetch was shallow (one commit)
    light = stages.run("acquire", layout.data_root, m, m.sources[1])
    assert light.figures["revision"] == second and light.figures["files"] == 5
    assert not marker.exists(), "a hook of the fetched repository ran"
    assert not any((layout.cache / "tmp").iterdir()), "temporary clone left behind"


def test_git_branch_or_missing_tag_refused(tmp_path, served_repo):
    repo = served_repo[0]
    for tag, rule in (("release", "is a branch"), ("main", "is a branch"), ("v9.9", "no tag")):
        m = load_manifest(_manifest(tmp_path, f"name: g\nsources:\n  - {{name: up, kind: git, url: '{repo.as_uri()}', tag: {tag}}}\n"))
        with pytest.raises(acquire.AcquireError, match=rule):
            acquire.acquire_source(m.sources[0], tmp_path / "cache")
        with pytest.raises(ManifestError, match=r"m\.yaml.*'up'.*field 'tag'.*" + rule):
            acquire.check_pins(m, tmp_path / "cache")


def test_git_commit_pin_must_match(tmp_path, served_repo):
    repo, first, second, _ = served_repo
    m = load_manifest(_manifest(tmp_path, f"name: g\nsources:\n  - {{name: up, kind: git, url: '{repo.as_uri()}', tag: v1.0, commit: '{second}'}}\n"))
    with pytest.raises(acquire.AcquireError, match="resolves to"):
        acquire.acquire_source(m.sources[0], tmp_path / "cache")


def test_git_second_run_is_offline(tmp_path, served_repo):
    repo, first, _, _ = served_repo
    m = load_manifest(_manifest(tmp_path, f"name: g\nsources:\n  - {{name: up, kind: git, url: '{repo.as_uri()}', tag: v1.0}}\n"))
    a = acquire.acquire_source(m.sources[0], tmp_path / "cache")
    import shutil

    shutil.rmtree(repo)  # the remote is gone
    b = acquire.acquire_source(m.sources[0], tmp_path / "cache")
    assert b.from_cache and not a.from_cache and b.revision == first and b.files == a.files
    acquire.check_pins(m, tmp_path / "cache")  # cached: no remote lookup


def _tar_bytes(mode: str, files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.xz", ".tar.bz2", ".zip"])
def test_archive_kind_every_format_by_path_and_url(tmp_path, suffix):
    files = {"mylib-1.0/src/x.cc": b"int x() { return 1; }\n", "mylib-1.0/x.cuh": b"__device__ int y();\n"}
    if suffix == ".zip":
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for n, d in files.items():
                zf.writestr(n, d)
        data = buf.getvalue()
    else:
        data = _tar_bytes({".tar.gz": "w:gz", ".tar.xz": "w:xz", ".tar.bz2": "w:bz2"}[suffix], files)
    arc = tmp_path / f"mylib-1.0{suffix}"
    arc.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    m = load_manifest(_manifest(tmp_path, f"name: a\nsources:\n  - {{name: by-path, kind: archive, path: {arc.name}, sha256: {sha}}}\n"
                                          f"  - {{name: by-url, kind: archive, url: '{arc.as_uri()}', sha256: {sha}, version: '1.0'}}\n"))
    for src in m.sources:
        got = acquire.acquire_source(src, tmp_path / f"cache-{src.name}")
        assert [p for p, _ in got.files] == ["src/x.cc", "x.cuh"]
        assert got.revision == got.archive_sha256 == sha and not got.from_cache
        assert acquire.cache_path(tmp_path / f"cache-{src.name}", sha, arc.name).exists()
    table = acquire.source_files_table("a", m.sources[1], got)
    assert table.column("language").to_pylist() == ["cpp", "cuda"] and set(table.column("version").to_pylist()) == {"1.0"}
    assert validate_source_files(table)[0]
    arc.unlink()  # second run: served from the cache, the original is not read
    again = acquire.acquire_source(m.sources[0], tmp_path / "cache-by-path")
    assert again.from_cache and again.files == got.files


def test_archive_wrong_hash_refused_nothing_kept(tmp_path):
    arc = tmp_path / "z-1.tar.gz"
    arc.write_bytes(_tar_bytes("w:gz", {"z/a.c": b"int a;\n"}))
    m = load_manifest(_manifest(tmp_path, f"name: a\nsources:\n  - {{name: z, kind: archive, path: {arc}, sha256: '{'0' * 64}'}}\n"))
    with pytest.raises(acquire.HashMismatchError, match="z-1.tar.gz.*pins"):
        acquire.acquire_source(m.sources[0], tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]


def test_local_kind_revision_hashes_list_and_contents(tmp_path):
    d = tmp_path / "mine"
    (d / "sub").mkdir(parents=True)
    (d / "a.c").write_text("int a;\n")
    (d / "sub" / "b.hpp").write_text("struct B {};\n")
    os.symlink("a.c", d / "inside.c")  # link inside: skipped, never followed
    m = load_manifest(_manifest(tmp_path, "name: l\nsources:\n  - {name: mine, kind: local, path: mine, label: '2026-01'}\n"))
    first = acquire.acquire_source(m.sources[0], tmp_path / "cache")
    assert [p for p, _ in first.files] == ["a.c", "sub/b.hpp"] and first.archive_sha256 is None
    table = acquire.source_files_table("l", m.sources[0], first)
    assert set(table.column("version").to_pylist()) == {"2026-01"} and validate_source_files(table)[0]
    assert acquire.acquire_source(m.sources[0], tmp_path / "cache").revision == first.revision  # stable
    (d / "sub" / "b.hpp").write_text("struct B { int x; };\n")
    changed = acquire.acquire_source(m.sources[0], tmp_path / "cache").revision
    (d / "sub" / "b.hpp").rename(d / "sub" / "c.hpp")
    renamed = acquire.acquire_source(m.sources[0], tmp_path / "cache").revision
    assert len({first.revision, changed, renamed}) == 3
    os.symlink("/etc/passwd", d / "outside.h")
    with pytest.raises(acquire.UnsafeArchiveError, match="outside") as e:
        acquire.acquire_source(m.sources[0], tmp_path / "cache")
    assert e.value.entry == "outside.h" and str(d) in e.value.archive
    (d / "outside.h").unlink()
    os.mkfifo(d / "pipe.c")
    with pytest.raises(acquire.UnsafeArchiveError, match="FIFO"):
        acquire.acquire_source(m.sources[0], tmp_path / "cache")


def test_local_python_package_torch_headers_resolved_from_installed_package():
    import importlib.metadata

    m = load_manifest("large")
    src = m.source("torch-headers")
    assert src.kind == "local" and src.version == importlib.metadata.version("torch")
    from megacpp_core.acquire_local import local_root

    root = local_root(src)
    assert root.name == "include" and root.parent.name == "torch" and (root / "torch").is_dir()
    from megacpp_core.acquire_local import acquire_local

    got = acquire_local(src)
    paths = [p for p, _ in got.files]
    assert "LICENSE" in paths and not (root / "LICENSE").exists()  # the distribution's license, added at the root
    assert b"Copyright" in dict(got.files)["LICENSE"] and len(paths) == len(set(paths)) > 1000


def test_large_manifest_pins():
    m = load_manifest("large")
    assert m.source("grpcio-1.85.1").sha256 == "5f530287d5de5f7f66089ead81de44f6787162944dab3922efa65dfdff108a1d"
    assert m.source("llama-cpp-python-0.3.36").sha256 == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    default = load_manifest("default")
    assert [s.name for s in m.sources[:len(default.sources)]] == [s.name for s in default.sources]


def test_hostile_archive_partition_fails_and_writes_nothing(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        ti = tarfile.TarInfo("pkg/a.c")
        ti.size = 7
        tf.addfile(ti, io.BytesIO(b"int a;\n"))
        ln = tarfile.TarInfo("pkg/evil")
        ln.type, ln.linkname = tarfile.SYMTYPE, "../../../etc/shadow"
        tf.addfile(ln)
    arc = tmp_path / "evil-1.tar.gz"
    arc.write_bytes(buf.getvalue())
    sha = hashlib.sha256(buf.getvalue()).hexdigest()
    m = load_manifest(_manifest(tmp_path, f"name: h\nsources:\n  - {{name: evil, kind: archive, path: {arc}, sha256: {sha}}}\n"))
    layout = SnapshotLayout(tmp_path / "root", "h")
    stale = layout.shard("evil") / "source_files.parquet"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"stale output of an earlier run")
    with pytest.raises(acquire.UnsafeArchiveError) as e:
        stages.run("acquire", layout.data_root, m, m.sources[0])
    assert (e.value.archive, e.value.entry) == ("evil-1.tar.gz", "pkg/evil") and "outside" in e.value.rule
    assert not [p for p in layout.revision("evil").rglob("*") if p.is_file()]
    assert layout.read_figures("acquire", "evil") is None


def test_second_run_makes_no_network_access(tmp_path, monkeypatch):
    """The pinned sdists of ``tiny`` are cached; with every index unreachable and every HTTP
    or socket call failing, acquire and the pre-run pin check still succeed."""
    import socket

    from tests.conftest import make_data_root

    root = make_data_root(tmp_path / "root")
    m = load_manifest("tiny")
    layout = SnapshotLayout(root, "tiny")
    for s in m.sources:  # first run (may reach the index when the shared cache is cold)
        acquire.fetch_pypi_sdist(s, layout.cache)
    monkeypatch.setenv("MEGACPP_INDEX_URL", "https://index.invalid/simple")

    def _no_network(*a, **k):
        raise AssertionError("network access on a second run")

    monkeypatch.setattr(socket, "create_connection", _no_network)
    monkeypatch.setattr(socket.socket, "connect", _no_network)
    monkeypatch.setattr(acquire, "_project_packages", _no_network)
    monkeypatch.setattr(acquire, "_download", _no_network)
    acquire.check_pins(m, layout.cache)
    for s in m.sources:
        res = stages.run("acquire", layout.data_root, m, s)
        assert res.figures["from_cache"] is True and res.checks["hash_matches_pin"][0]
