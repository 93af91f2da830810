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


def _zip(path: Path, entries) -> Path:
    """``entries``: (ZipInfo or name, data)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for info, data in entries:
            zf.writestr(info, data)
    return path


def _zinfo(name: str, mode: int) -> zipfile.ZipInfo:
    zi = zipfile.ZipInfo(name)
    zi.external_attr = mode << 16
    zi.create_system = 3
    return zi


def test_undecodable_tar_name_refused(tmp_path):
    arc = tmp_path / "bad-names.tar"
    with tarfile.open(arc, "w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape") as tf:
        ti = tarfile.TarInfo("pkg/caf\udce9.c")  # raw byte 0xE9: Latin-1, not UTF-8
        ti.size = 7
        tf.addfile(ti, io.BytesIO(b"int a;\n"))
    with pytest.raises(acquire.UnsafeArchiveError, match="UTF-8") as e:
        list(acquire.iter_archive(arc))
    assert e.value.archive == "bad-names.tar" and "pkg/caf" in e.value.entry


def test_undecodable_zip_names_refused(tmp_path):
    def build(path: Path, utf8_flag: bool, raw: bytes) -> Path:
        zi = zipfile.ZipInfo("pkg/cafX.c")
        if utf8_flag:
            zi.flag_bits |= 0x800
        _zip(path, [(zi, b"int a;\n")])
        path.write_bytes(path.read_bytes().replace(b"cafX", raw))  # both headers
        return path

    # no UTF-8 flag and a non-ASCII byte: a legacy code-page name of unknown encoding
    legacy = build(tmp_path / "legacy.zip", False, b"caf\x82")
    with pytest.raises(acquire.UnsafeArchiveError, match="UTF-8") as e:
        list(acquire.iter_archive(legacy))
    assert e.value.archive == "legacy.zip" and e.value.entry.startswith("pkg/caf")
    # UTF-8 flag set but the bytes are not UTF-8
    bad = build(tmp_path / "bad-utf8.zip", True, b"caf\xff")
    with pytest.raises(acquire.UnsafeArchiveError, match="UTF-8") as e:
        list(acquire.iter_archive(bad))
    assert e.value.archive == "bad-utf8.zip" and "caf" in e.value.entry


@pytest.mark.parametrize("entries,rule", [
    ([("pkg/a.c", b"int a;\n"), (_zinfo("pkg/link", 0o120777), b"/etc/passwd")], "symlink"),
    ([(_zinfo("pkg/fifo", 0o010644), b"")], "FIFO"),
    ([(_zinfo("pkg/dev", 0o020644), b"")], "device"),
    ([("pkg/a.c", b"int a;\n"), ("pkg/a.c", b"int b;\n")], "duplicate"),
    ([("/abs/a.c", b"int a;\n")], "absolute"),
    ([("C:\\win\\a.c", b"int a;\n")], "absolute"),
])
def test_hostile_zip_refused_naming_archive_entry_rule(tmp_path, entries, rule):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns on the duplicate name
        arc = _zip(tmp_path / "evil.zip", entries)
    with pytest.raises(acquire.UnsafeArchiveError, match=rule) as e:
        list(acquire.iter_archive(arc))
    assert e.value.archive == "evil.zip" and e.value.entry


def test_hardlink_inside_skipped_outside_refused(tmp_path):
    ok = _tar(tmp_path / "ok.tar.gz", [_file("pkg/a.c"), _special("pkg/b.c", tarfile.LNKTYPE, "pkg/a.c")])
    assert [p for p, _ in acquire.iter_archive(ok)] == ["pkg/a.c"]
    bad = _tar(tmp_path / "bad.tar.gz", [_file("pkg/a.c"), _special("pkg/b.c", tarfile.LNKTYPE, "../../etc/shadow")])
    with pytest.raises(acquire.UnsafeArchiveError, match="outside") as e:
        list(acquire.iter_archive(bad))
    assert e.value.entry == "pkg/b.c"


def test_bomb_by_total_size_ratio_and_member_size(tmp_path):
    """Total size and member size are checked on the headers, before any content is read;
    the ratio limit catches highly compressible archives under the size limits."""
    limits = acquire.ArchiveLimits(max_total_bytes=3 << 20, max_member_bytes=2 << 20)
    noise = lambda n, seed: hashlib.shake_256(seed).digest(n)  # incompressible
    total = _tar(tmp_path / "total.tar.gz", [_file(f"pkg/f{i}.c", noise(1 << 20, bytes([i]))) for i in range(4)])
    with pytest.raises(acquire.UnsafeArchiveError, match="total size") as e:
        list(acquire.iter_archive(total, limits))
    assert e.value.entry == "pkg/f3.c"
    member = _tar(tmp_path / "member.tar.gz", [_file("pkg/big.c", noise(3 << 20, b"x"))])
    with pytest.raises(acquire.UnsafeArchiveError, match="member larger"):
        list(acquire.iter_archive(member, limits))
    for suffix, mode in ((".tar.xz", "w:xz"), (".tar.bz2", "w:bz2")):
        p = tmp_path / f"bomb{suffix}"
        with tarfile.open(p, mode) as tf:
            ti, f = _file("pkg/zeros.c", b"\0" * (8 << 20))
            tf.addfile(ti, f)
        with pytest.raises(acquire.UnsafeArchiveError, match="ratio"):
            list(acquire.iter_archive(p))
    zbomb = _zip(tmp_path / "bomb.zip", [("pkg/zeros.c", b"\0" * (8 << 20))])
    with pytest.raises(acquire.UnsafeArchiveError, match="ratio"):
        list(acquire.iter_archive(zbomb))


def test_too_many_entries_zip_and_nothing_yielded(tmp_path):
    arc = _zip(tmp_path / "many.zip", [(f"pkg/f{i}.c", b"int x;\n") for i in range(12)])
    it = acquire.iter_archive(arc, acquire.ArchiveLimits(max_entries=10))
    with pytest.raises(acquire.UnsafeArchiveError, match="more than 10 entries"):
        next(it)  # the very first item already fails: nothing was yielded before the refusal
