"""Stage 0: index lookup, hash pinning, the content-addressed cache and hostile archives."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from megacpp_core import acquire
from megacpp_core.manifest import Source


def _tar(path: Path, members) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for m in members:
            tf.addfile(*m)
    return path


def _file(name: str, data: bytes = b"int x;\n"):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    return ti, io.BytesIO(data)


def _special(name: str, type_, linkname: str = ""):
    ti = tarfile.TarInfo(name)
    ti.type = type_
    ti.linkname = linkname
    return (ti,)


@pytest.mark.parametrize("members,rule", [
    ([_file("/etc/passwd")], "absolute path"),
    ([_file("pkg/../../evil.c")], "traversal"),
    ([_file("pkg/a.c"), _special("pkg/link", tarfile.SYMTYPE, "../../etc/passwd")], "outside"),
    ([_file("pkg/a.c"), _special("pkg/hard", tarfile.LNKTYPE, "/etc/shadow")], "outside"),
    ([_special("pkg/dev", tarfile.CHRTYPE)], "device"),
    ([_special("pkg/fifo", tarfile.FIFOTYPE)], "FIFO"),
    ([_file("pkg/a.c"), _file("pkg/a.c", b"other")], "duplicate"),
])
def test_hostile_tar_refused_naming_archive_entry_rule(tmp_path, members, rule):
    arc = _tar(tmp_path / "evil-1.0.tar.gz", members)
    with pytest.raises(acquire.UnsafeArchiveError, match=rule) as e:
        list(acquire.iter_archive(arc))
    assert e.value.archive == "evil-1.0.tar.gz" and e.value.entry


def test_decompression_bomb_and_entry_limits(tmp_path):
    arc = _tar(tmp_path / "bomb.tar.gz", [_file("pkg/zeros.c", b"\0" * (8 << 20))])
    with pytest.raises(acquire.UnsafeArchiveError, match="ratio"):
        list(acquire.iter_archive(arc))
    many = _tar(tmp_path / "many.tar.gz", [_file(f"pkg/f{i}.c") for i in range(30)])
    with pytest.raises(acquire.UnsafeArchiveError, match="entries"):
        list(acquire.iter_archive(many, acquire.ArchiveLimits(max_entries=10)))


def test_zip_traversal_refused(tmp_path):
    p = tmp_path / "z.zip"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("pkg/ok.c", "int x;\n")
        zf.writestr("../evil.c", "int y;\n")
    with pytest.raises(acquire.UnsafeArchiveError, match="traversal"):
        list(acquire.iter_archive(p))


def test_safe_links_skipped_and_root_stripped(tmp_path):
    arc = _tar(tmp_path / "ok-1.0.tar.gz", [_file("ok-1.0/src/a.c"), _special("ok-1.0/src/b.c", tarfile.SYMTYPE, "a.c")])
    files = acquire.strip_common_root(list(acquire.iter_archive(arc)))
    assert [p for p, _ in files] == ["src/a.c"]


def _local_index(tmp_path: Path, project: str, filename: str, data: bytes, published: str | None = None) -> str:
    files = tmp_path / "files"
    files.mkdir(parents=True, exist_ok=True)
    (files / filename).write_bytes(data)
    page = tmp_path / "simple" / project
    page.mkdir(parents=True, exist_ok=True)
    digest = published or hashlib.sha256(data).hexdigest()
    (page / "index.html").write_text(f'<html><body><a href="../../files/{filename}#sha256={digest}">{filename}</a></body></html>')
    return (tmp_path / "simple").as_uri()


def test_fetch_hash_pin_cache_and_offline_reuse(tmp_path, monkeypatch):
    data = _tar(tmp_path / "demo-1.0.tar.gz", [_file("demo-1.0/a.c")]).read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    monkeypatch.setenv("MEGACPP_INDEX_URL", _local_index(tmp_path / "idx", "demo", "demo-1.0.tar.gz", data))
    src = Source(name="demo-1.0", kind="pypi", order=0, package="demo", version="1.0", sha256=sha)
    first = acquire.fetch_pypi_sdist(src, tmp_path / "cache")
    assert not first.from_cache and first.path == acquire.cache_path(tmp_path / "cache", sha, "demo-1.0.tar.gz")
    monkeypatch.setenv("MEGACPP_INDEX_URL", "file:///nonexistent/index")  # index unreachable
    again = acquire.fetch_pypi_sdist(src, tmp_path / "cache")
    assert again.from_cache and again.path == first.path


def test_wrong_hash_fails_clearly_and_keeps_nothing(tmp_path, monkeypatch):
    data = _tar(tmp_path / "demo-1.0.tar.gz", [_file("demo-1.0/a.c")]).read_bytes()
    monkeypatch.setenv("MEGACPP_INDEX_URL", _local_index(tmp_path / "idx", "demo", "demo-1.0.tar.gz", data))
    src = Source(name="demo-1.0", kind="pypi", order=0, package="demo", version="1.0", sha256="ab" * 32)
    with pytest.raises(acquire.HashMismatchError, match="demo-1.0.*pins"):
        acquire.fetch_pypi_sdist(src, tmp_path / "cache")
    assert not any(p.is_file() for p in (tmp_path / "cache").rglob("*")) if (tmp_path / "cache").exists() else True


def test_index_urls_follow_pip_configuration(monkeypatch):
    monkeypatch.delenv("MEGACPP_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.invalid/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///opt/x/simple")
    acquire._pip_index_configuration.cache_clear()
    urls = acquire.configured_index_urls()
    assert urls[0] == "https://mirror.invalid/simple" and "file:///opt/x/simple" in urls
    acquire._pip_index_configuration.cache_clear()


def test_index_lookup_leaves_megatron_importable():
    """Reading pip's configuration must not load the stdlib distutils into this process
    (setuptools, imported later by torch and megatron-core, asserts on it)."""
    import subprocess
    import sys

    code = ("import sys; from megacpp_core.acquire import configured_index_urls; configured_index_urls(); "
            "assert 'distutils' not in sys.modules; import setuptools")
    subprocess.run([sys.executable, "-c", code], check=True, env={k: v for k, v in __import__("os").environ.items() if k != "MEGACPP_INDEX_URL"})
