"""Safe reading of source archives and the content-addressed cache (SPEC §3).

Shared by every source kind of :mod:`megacpp_core.acquire` (``pypi``, ``archive``) and the
kind modules (:mod:`megacpp_core.acquire_git`, :mod:`megacpp_core.acquire_local`, …),
which import from here, never from the dispatcher. Archives are never extracted to disk:
:class:`ArchiveReader` checks every member under the rules of :class:`ArchiveLimits`
before any content is read, then reads members one at a time; any violation raises
:class:`UnsafeArchiveError` naming the archive, the entry and the rule.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator


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


@dataclass(frozen=True)
class ArchiveSource:
    """A fetched source that is one archive file on local disk (``pypi``, ``archive``,
    ``git``), ready to be read with :class:`ArchiveReader`.

    ``path``: the archive; ``label``: its name in errors (the file name, or ``URL@TAG``);
    ``strip_root``: drop a single top directory shared by every member (sdists and
    archives, not git trees); ``revision``, ``archive_sha256``, ``origin``, ``from_cache``,
    ``pin_ok`` as in :class:`Acquired`.
    """

    path: Path
    label: str
    strip_root: bool
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


class ArchiveReader:
    """A tar or zip archive opened under :class:`ArchiveLimits`, every member checked
    before any content is read (the context manager closes it).

    On construction the whole member list is read and checked: links that stay inside the
    archive are skipped (never followed); links pointing outside, device files, FIFOs,
    absolute or ``..`` names, duplicate entries, undecodable names, and archives over the
    size, count or ratio limits raise :class:`UnsafeArchiveError` (naming the archive by
    ``name``, default the file name, the entry and the rule); an unreadable file raises
    :class:`AcquireError`. Then :attr:`members` lists ``(normalized POSIX path, size in
    bytes)`` of every regular file in archive order, and member ``i`` is read by
    :meth:`read` or :meth:`open_member`. :attr:`random_access` is True when reading
    members out of archive order is cheap (zip, uncompressed tar); a compressed tar read
    out of order decompresses again from its start.
    """

    def __init__(self, path: Path, limits: ArchiveLimits = ArchiveLimits(), name: str | None = None):
        path = Path(path)
        self.archive = name or path.name
        self._zip: zipfile.ZipFile | None = None
        self._tar: tarfile.TarFile | None = None
        self._infos: list = []
        self.members: list[tuple[str, int]] = []
        compressed = max(path.stat().st_size, 1)
        if zipfile.is_zipfile(path):
            try:
                self._zip = zipfile.ZipFile(path)
            except UnicodeDecodeError as e:
                raise UnsafeArchiveError(self.archive, repr(e.object[e.start:e.end + 16]),
                                         "entry name is not valid UTF-8") from None
            except zipfile.BadZipFile as e:
                raise AcquireError(f"{self.archive}: not a readable zip archive: {e}") from e
            self.random_access = True
        else:
            try:
                self._tar = tarfile.open(path, mode="r:*", encoding="utf-8", errors="surrogateescape")
            except tarfile.TarError as e:
                raise AcquireError(f"{self.archive}: not a readable tar or zip archive: {e}") from e
            self.random_access = isinstance(self._tar.fileobj, io.BufferedReader)  # not gzip, bz2 or xz
        try:
            self._check_zip(compressed, limits) if self._zip is not None else self._check_tar(compressed, limits)
        except BaseException:
            self.close()
            raise

    def _check_zip(self, compressed: int, limits: ArchiveLimits) -> None:
        archive, seen, total = self.archive, set(), 0
        infos = self._zip.infolist()
        if len(infos) > limits.max_entries:
            raise UnsafeArchiveError(archive, infos[limits.max_entries].filename, f"more than {limits.max_entries} entries")
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
            self.members.append((name, info.file_size))
            self._infos.append(info)

    def _check_tar(self, compressed: int, limits: ArchiveLimits) -> None:
        archive, seen, total = self.archive, set(), 0
        infos = []
        for i, info in enumerate(self._tar):
            if i >= limits.max_entries:
                raise UnsafeArchiveError(archive, info.name, f"more than {limits.max_entries} entries")
            infos.append(info)
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
            self.members.append((name, info.size))
            self._infos.append(info)

    def open_member(self, i: int) -> BinaryIO:
        """A binary file object of member ``i`` (index into :attr:`members`)."""
        if self._zip is not None:
            return self._zip.open(self._infos[i])
        return self._tar.extractfile(self._infos[i]) or io.BytesIO()

    def read(self, i: int) -> bytes:
        """The bytes of member ``i``; raises :class:`UnsafeArchiveError` when a zip member's
        size differs from its header."""
        if self._zip is not None:
            info = self._infos[i]
            data = self._zip.read(info)
            if len(data) != info.file_size:
                raise UnsafeArchiveError(self.archive, info.filename, "size differs from its header")
            return data
        with self.open_member(i) as f:
            return f.read()

    def close(self) -> None:
        """Close the archive file."""
        for f in (self._zip, self._tar):
            if f is not None:
                f.close()

    def __enter__(self) -> "ArchiveReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def iter_archive(path: Path, limits: ArchiveLimits = ArchiveLimits(), name: str | None = None) -> Iterator[tuple[str, bytes]]:
    """Yield ``(member path, bytes)`` for each regular file of a tar or zip archive, in
    archive order, under the rules of :class:`ArchiveReader`: all checks run on the member
    list before any content is read, so a refused archive yields nothing (it raises
    :class:`UnsafeArchiveError` at the first ``next``). Errors name the archive by ``name``
    (default: the file name)."""
    with ArchiveReader(path, limits, name) as reader:
        for i, (member, _) in enumerate(reader.members):
            yield member, reader.read(i)


def _check_sizes(archive, entry, size, total, compressed, limits: ArchiveLimits) -> None:
    if size > limits.max_member_bytes:
        raise UnsafeArchiveError(archive, entry, f"member larger than {limits.max_member_bytes} bytes")
    if total > limits.max_total_bytes:
        raise UnsafeArchiveError(archive, entry, f"total size over {limits.max_total_bytes} bytes")
    if total / compressed > limits.max_ratio and total > (1 << 20):
        raise UnsafeArchiveError(archive, entry, f"compression ratio over {limits.max_ratio:g} (decompression bomb)")


def common_root(paths: Iterable[str]) -> str | None:
    """The single top-level directory shared by every path (``lz4-4.4.5`` of
    ``lz4-4.4.5/…``), or None when there is none (or no path)."""
    tops: set[str] = set()
    for p in paths:
        top, slash, _ = p.partition("/")
        if not slash:
            return None
        tops.add(top)
        if len(tops) > 1:
            return None
    return next(iter(tops), None)


def strip_common_root(files: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """Drop a single top-level directory shared by every member (``lz4-4.4.5/…``)."""
    if common_root(p for p, _ in files) is None:
        return files
    return [(p.split("/", 1)[1], b) for p, b in files]
