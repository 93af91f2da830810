"""Stage 0 — acquire: fetch a pinned source, check its hash, read it safely (SPEC §3).

``pypi`` sources are sdists located through the simple repository API of the package
indexes that pip on this machine is configured with (``index-url`` first, then each
``extra-index-url``, from pip's own configuration files and ``PIP_*`` environment
variables; ``MEGACPP_INDEX_URL`` overrides all of them). The file is downloaded,
checked against the pinned sha256 and stored in a content-addressed cache under the data
root; a cached file is re-hashed and reused without any network access. **Nothing from
the package is built or executed**: the archive is only read.

Archives are read in memory, never extracted to disk, under the rules of
:class:`ArchiveLimits`; any violation raises :class:`UnsafeArchiveError` naming the
archive, the entry and the rule, and nothing is written for the partition.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import posixpath
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse
from urllib.request import url2pathname

import pyarrow as pa

from .manifest import Source

log = logging.getLogger("megacpp.acquire")

#: Extension → language label used by every later stage.
LANGUAGE_BY_EXTENSION = {
    ".c": "c",
    ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".c++": "cpp",
    ".h": "header", ".hh": "header", ".hpp": "header", ".hxx": "header", ".h++": "header",
    ".inl": "header", ".ipp": "header", ".tpp": "header",
    ".cu": "cuda", ".cuh": "cuda",
}


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


# --------------------------------------------------------------------------- indexes

_PIP_CONFIG_PROBE = """
import json
from pip._internal.configuration import Configuration
from pip._internal.models.index import PyPI
conf = Configuration(isolated=False)
conf.load()
print(json.dumps({"items": list(conf.items()), "default": PyPI.simple_url}))
"""


@functools.lru_cache(maxsize=1)
def _pip_index_configuration() -> tuple[tuple[tuple[str, str], ...], str]:
    # pip's configuration is read in a child process: importing pip's internals here would
    # load the stdlib distutils and break a later setuptools import (torch, megatron-core).
    out = subprocess.run([sys.executable, "-c", _PIP_CONFIG_PROBE], check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    return tuple((k, v) for k, v in doc["items"]), doc["default"]


def configured_index_urls() -> list[str]:
    """Simple-API index URLs in the order pip would consult them.

    ``MEGACPP_INDEX_URL`` (space separated) wins when set. Otherwise pip's configuration
    (files and ``PIP_*`` environment, read by pip itself in a child process) gives
    ``index-url`` — pip's built-in default when unset — followed by every
    ``extra-index-url``.
    """
    override = os.environ.get("MEGACPP_INDEX_URL")
    if override:
        return override.split()
    items, default = _pip_index_configuration()
    values: dict[str, str] = {}
    for key, value in items:  # later entries (env) override files
        values[key.split(".", 1)[1]] = value
    index = values.get("index-url") or default
    extras = values.get("extra-index-url", "").split()
    return [index] + [u for u in extras if u != index]


def _project_packages(index_url: str, project: str):
    import pypi_simple

    normalized = pypi_simple.normalize(project) if hasattr(pypi_simple, "normalize") else project.lower()
    if index_url.startswith("file:"):
        page_dir = Path(url2pathname(urlparse(index_url).path)) / normalized
        page = page_dir / "index.html"
        if not page.exists():
            return []
        html = page.read_text(encoding="utf-8", errors="replace")
        base = page_dir.as_uri() + "/"
        return pypi_simple.ProjectPage.from_html(project, html, base_url=base).packages
    with pypi_simple.PyPISimple(index_url) as client:
        try:
            return client.get_project_page(project).packages
        except pypi_simple.NoSuchProjectError:
            return []


def _download(url: str, dest: Path) -> str:
    """Stream ``url`` to ``dest``; return the hex sha256 of the bytes."""
    h = hashlib.sha256()
    tmp = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if url.startswith("file:"):
        src = Path(url2pathname(urlparse(url).path))
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            for chunk in iter(lambda: fin.read(1 << 20), b""):
                h.update(chunk)
                fout.write(chunk)
    else:
        import requests

        with requests.get(url, stream=True, timeout=120) as r:
            r.raise_for_status()
            with open(tmp, "wb") as fout:
                for chunk in r.iter_content(1 << 20):
                    h.update(chunk)
                    fout.write(chunk)
    os.replace(tmp, dest)
    return h.hexdigest()


def cache_path(cache_root: Path, sha256: str, filename: str) -> Path:
    """Content-addressed location ``cache_root/sha256/AB/SHA/FILENAME``."""
    return Path(cache_root) / "sha256" / sha256[:2] / sha256 / filename


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_pypi_sdist(source: Source, cache_root: Path) -> FetchedArchive:
    """Locate, download and hash-check the sdist of a ``pypi`` source.

    A cached file whose sha256 still matches is reused without network access. Raises
    :class:`HashMismatchError` when the index serves different bytes than the pin (the
    file is not kept) and :class:`AcquireError` when no index has the sdist.
    """
    want = source.sha256
    assert want and source.package and source.version
    hit_dir = Path(cache_root) / "sha256" / want[:2] / want
    if hit_dir.is_dir():
        for f in sorted(hit_dir.iterdir()):
            if f.is_file() and not f.name.endswith(".part"):
                if _hash_file(f) == want:
                    return FetchedArchive(f, want, f.name, True, None)
                log.warning("%s: cached file %s is corrupt; fetching again", source.name, f)
                f.unlink()
    tried = []
    for index_url in configured_index_urls():
        tried.append(index_url)
        try:
            packages = _project_packages(index_url, source.package)
        except Exception as e:  # an unreachable extra index must not hide the others
            log.warning("%s: index %s unavailable: %s", source.name, index_url, e)
            continue
        sdists = [p for p in packages if p.package_type == "sdist" and p.version == source.version]
        if not sdists:
            continue
        # Prefer the file whose published digest matches the pin; otherwise the first one.
        sdists.sort(key=lambda p: (p.digests.get("sha256") != want, p.filename))
        pkg = sdists[0]
        published = pkg.digests.get("sha256")
        if published and published != want:
            raise HashMismatchError(
                f"source {source.name}: the index serves {pkg.filename} with sha256 {published}, "
                f"but the manifest pins {want}"
            )
        dest = cache_path(cache_root, want, pkg.filename)
        got = _download(pkg.url, dest)
        if got != want:
            dest.unlink(missing_ok=True)
            raise HashMismatchError(
                f"source {source.name}: downloaded {pkg.filename} has sha256 {got}, "
                f"but the manifest pins {want}"
            )
        log.info("%s: fetched %s from %s", source.name, pkg.filename, index_url)
        return FetchedArchive(dest, want, pkg.filename, False, index_url)
    raise AcquireError(
        f"source {source.name}: no sdist of {source.package}=={source.version} on the configured "
        f"indexes ({', '.join(tried) or 'none'})"
    )


# --------------------------------------------------------------------------- archives

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


def iter_archive(path: Path, limits: ArchiveLimits = ArchiveLimits()) -> Iterator[tuple[str, bytes]]:
    """Yield ``(member path, bytes)`` for each regular file of a tar or zip archive.

    Links that stay inside the archive are skipped (never followed); links pointing
    outside, device files, FIFOs, absolute or ``..`` names, duplicate entries,
    undecodable names, and archives over the size, count or ratio limits raise
    :class:`UnsafeArchiveError`. All checks run on the member list before any content
    is read, so a refused archive yields nothing.
    """
    archive = path.name
    compressed = max(path.stat().st_size, 1)
    seen: set[str] = set()
    total = 0
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            if len(infos) > limits.max_entries:
                raise UnsafeArchiveError(archive, infos[limits.max_entries].filename, f"more than {limits.max_entries} entries")
            members = []
            for info in infos:
                name = _check_name(archive, info.filename)
                if name in seen:
                    raise UnsafeArchiveError(archive, info.filename, "duplicate entry")
                seen.add(name)
                mode = (info.external_attr >> 16) & 0o170000
                if mode == 0o120000:
                    raise UnsafeArchiveError(archive, info.filename, "symlink in zip archive")
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


def language_of(path: str) -> str | None:
    """Language label (``c``, ``cpp``, ``header``, ``cuda``) from the extension, else ``None``."""
    ext = os.path.splitext(path)[1].lower()
    return LANGUAGE_BY_EXTENSION.get(ext)


SOURCE_FILES_SCHEMA = pa.schema([
    ("snapshot", pa.string()),
    ("source", pa.string()),
    ("kind", pa.string()),
    ("version", pa.string()),
    ("archive_sha256", pa.string()),
    ("path", pa.string()),
    ("size", pa.int64()),
    ("content_sha256", pa.string()),
    ("language", pa.string()),
    ("doc_key", pa.string()),
    ("content", pa.large_binary()),
])


def source_files_table(snapshot: str, source: Source, archive: FetchedArchive,
                       limits: ArchiveLimits = ArchiveLimits()) -> pa.Table:
    """Read every regular file of the archive into the ``source_files`` table.

    Columns (SOURCE_FILES_SCHEMA): provenance (snapshot, source, kind, version,
    archive sha256), ``path`` inside the source, ``size`` in bytes, ``content_sha256``,
    ``language`` (None for non-C/C++ files, which later stages still use for license
    files), ``doc_key`` = ``SOURCE/PATH`` (stable across runs), and the raw ``content``.
    Rows are sorted by path. Raises :class:`UnsafeArchiveError` on a hostile archive.
    """
    files = strip_common_root(list(iter_archive(archive.path, limits)))
    files.sort(key=lambda x: x[0])
    cols: dict[str, list] = {f.name: [] for f in SOURCE_FILES_SCHEMA}
    for p, data in files:
        cols["snapshot"].append(snapshot)
        cols["source"].append(source.name)
        cols["kind"].append(source.kind)
        cols["version"].append(source.version)
        cols["archive_sha256"].append(archive.sha256)
        cols["path"].append(p)
        cols["size"].append(len(data))
        cols["content_sha256"].append(hashlib.sha256(data).hexdigest())
        cols["language"].append(language_of(p))
        cols["doc_key"].append(f"{source.name}/{p}")
        cols["content"].append(data)
    return pa.table(cols, schema=SOURCE_FILES_SCHEMA)
