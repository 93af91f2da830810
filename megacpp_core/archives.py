"""Safe reading of source archives and the content-addressed cache (SPEC §3).

Shared by every source kind of :mod:`megacpp_core.acquire` (``pypi``, ``archive``) and the
kind modules (:mod:`megacpp_core.acquire_git`, :mod:`megacpp_core.acquire_local`, …),
which import from here, never from the dispatcher. Archives are read in memory, never
extracted to disk, under the rules of :class:`ArchiveLimits`; any violation raises
:class:`UnsafeArchiveError` naming the archive, the entry and the rule.
"""

from __future__ import annotations

import hashlib
import posixpath
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator


class AcquireError(RuntimeError):
    """A source could not be fetched or its bytes do not match the pin."""


class HashMismatchError(AcquireError):
    """The downloaded or cached bytes do not have the pinned sha256."""


class UnsafeArchiveError(AcquireError):
    """An archive entry violates a safe-extraction rule.

    Attributes ``archive``, ``entry`` and ``rule`` name what was refused and why.
    """

    def __init__(self, archive: str, entry: str, rule: str):
        super().__init__(f"{archive}: entry {entry!r} refused: {rule}")
        self.archive, self.entry, self.rule = archive, entry, rule


@dataclass(frozen=True)
class ArchiveLimits:
    """Safe-extraction limits (SPEC §3: total size, file count, compression ratio).

    ``max_total_bytes`` 2 GiB of members, ``max_entries`` 100,000, ``max_ratio`` 250×
    uncompressed/compressed size, ``max_member_bytes`` 256 MiB for a single member.
    """

    max_total_bytes: int = 2 << 30
    max_member_bytes: int = 256 << 20
    max_entries: int = 100_000
    max_ratio: float = 250.0


@dataclass(frozen=True)
class FetchedArchive:
    """A hash-checked archive in the cache."""

    path: Path
    sha256: str
    filename: str
    from_cache: bool
    index_url: str | None


@dataclass(frozen=True)
class Acquired:
    """What stage 0 read for one source.

    ``files``: ``(path inside the source, bytes)`` sorted by path; ``revision``: the
    archive sha256 (``pypi``, ``archive``), the resolved commit sha (``git``) or the local
    content hash (``local``); ``archive_sha256``: sha256 of the fetched archive file, or
    ``None`` for ``git`` and ``local``; ``origin``: archive file name, URL@tag or directory;
    ``from_cache``: True when no network was used.
    """

    files: list[tuple[str, bytes]]
    revision: str
    archive_sha256: str | None
    origin: str
    from_cache: bool
    pin_ok: bool = True


def cache_path(cache_root: Path, sha256: str, filename: str) -> Path:
    """Content-addressed location ``cache_root/sha256/AB/SHA/FILENAME``."""
    return Path(cache_root) / "sha256" / sha256[:2] / sha256 / filename


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_name(archive: str, name: str) -> str:
    if "\x00" in name:
        raise UnsafeArchiveError(archive, name, "NUL byte in entry name")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafeArchiveError(archive, name, "entry name is not valid UTF-8") from None
    if name.startswith("/") or name.startswith("\\") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchiveError(archive, name, "absolute path")
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        raise UnsafeArchiveError(archive, name, "'..' path traversal")
    return posixpath.normpath(name.replace("\\", "/"))


def _link_target_ok(name: str, target: str) -> bool:
    if target.startswith("/"):
        return False
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    return not (joined == ".." or joined.startswith("../"))


def iter_archive(path: Path, limits: ArchiveLimits = ArchiveLimits(), name: str | None = None) -> Iterator[tuple[str, bytes]]:
    """Yield ``(member path, bytes)`` for each regular file of a tar or zip archive.

    Links that stay inside the archive are skipped (never followed); links pointing
    outside, device files, FIFOs, absolute or ``..`` names, duplicate entries,
    undecodable names, and archives over the size, count or ratio limits raise
    :class:`UnsafeArchiveError`. All checks run on the member list before any content
    is read, so a refused archive yields nothing. Errors name the archive by ``name``
    (default: the file name).
    """
    path = Path(path)
    archive = name or path.name
    compressed = max(path.stat().st_size, 1)
    seen: set[str] = set()
    total = 0
    if zipfile.is_zipfile(path):
        try:
            zf = zipfile.ZipFile(path)
        except UnicodeDecodeError as e:
            raise UnsafeArchiveError(archive, repr(e.object[e.start:e.end + 16]), "entry name is not valid UTF-8") from None
        except zipfile.BadZipFile as e:
            raise AcquireError(f"{archive}: not a readable zip archive: {e}") from e
        with zf:
            infos = zf.infolist()
            if len(infos) > limits.max_entries:
                raise UnsafeArchiveError(archive, infos[limits.max_entries].filename, f"more than {limits.max_entries} entries")
            members = []
            for info in infos:
                if not info.flag_bits & 0x800 and not info.filename.isascii():
                    # no UTF-8 flag: the name was decoded as cp437; its real encoding is unknown
                    raise UnsafeArchiveError(archive, info.filename, "entry name is not valid UTF-8 (legacy zip name encoding)")
                name = _check_name(archive, info.filename)
                if name in seen:
                    raise UnsafeArchiveError(archive, info.filename, "duplicate entry")
                seen.add(name)
                mode = (info.external_attr >> 16) & 0o170000
                if mode == 0o120000:
                    raise UnsafeArchiveError(archive, info.filename, "symlink in zip archive")
                if mode in (0o020000, 0o060000, 0o010000, 0o140000):
                    raise UnsafeArchiveError(archive, info.filename, "device file or FIFO")
                if info.is_dir():
                    continue
                total += info.file_size
                _check_sizes(archive, info.filename, info.file_size, total, compressed, limits)
                members.append((name, info))
            for name, info in members:
                data = zf.read(info)
                if len(data) != info.file_size:
                    raise UnsafeArchiveError(archive, info.filename, "size differs from its header")
                yield name, data
        return
    try:
        tf = tarfile.open(path, mode="r:*", encoding="utf-8", errors="surrogateescape")
    except tarfile.TarError as e:
        raise AcquireError(f"{archive}: not a readable tar or zip archive: {e}") from e
    with tf:
        infos = []
        for i, info in enumerate(tf):
            if i >= limits.max_entries:
                raise UnsafeArchiveError(archive, info.name, f"more than {limits.max_entries} entries")
            infos.append(info)
        members = []
        for info in infos:
            name = _check_name(archive, info.name)
            if info.isdev() or info.isfifo():
                raise UnsafeArchiveError(archive, info.name, "device file or FIFO")
            if info.issym() or info.islnk():
                if not _link_target_ok(name if info.issym() else ".", info.linkname):
                    raise UnsafeArchiveError(archive, info.name, f"link to {info.linkname!r} points outside the archive")
                continue
            if info.isdir():
                continue
            if not info.isfile():
                raise UnsafeArchiveError(archive, info.name, "unsupported entry type")
            if name in seen:
                raise UnsafeArchiveError(archive, info.name, "duplicate entry")
            seen.add(name)
            total += info.size
            _check_sizes(archive, info.name, info.size, total, compressed, limits)
            members.append((name, info))
        for name, info in members:
            f = tf.extractfile(info)
            data = f.read() if f else b""
            yield name, data


def _check_sizes(archive, entry, size, total, compressed, limits: ArchiveLimits) -> None:
    if size > limits.max_member_bytes:
        raise UnsafeArchiveError(archive, entry, f"member larger than {limits.max_member_bytes} bytes")
    if total > limits.max_total_bytes:
        raise UnsafeArchiveError(archive, entry, f"total size over {limits.max_total_bytes} bytes")
    if total / compressed > limits.max_ratio and total > (1 << 20):
        raise UnsafeArchiveError(archive, entry, f"compression ratio over {limits.max_ratio:g} (decompression bomb)")


def strip_common_root(files: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """Drop a single top-level directory shared by every member (``lz4-4.4.5/…``)."""
    tops = {p.split("/", 1)[0] for p, _ in files}
    if len(tops) == 1 and all("/" in p for p, _ in files):
        return [(p.split("/", 1)[1], b) for p, b in files]
    return files
