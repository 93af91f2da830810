"""Stage 0 — acquire: fetch a pinned source, check its hash, read it safely (SPEC §3).

:func:`acquire_source` dispatches on the source kind — ``pypi`` and ``archive`` here,
``git`` in :mod:`megacpp_core.acquire_git`, ``local`` in :mod:`megacpp_core.acquire_local`,
``debian`` in :mod:`megacpp_core.acquire_debian` — and returns all the files in memory with
their revision (archive sha256, commit sha, local content hash or orig tarball sha256).
:func:`source_files_table` turns files into ``source_files`` rows. The acquire stage does
not hold a revision: for the kinds fetched as one archive (:data:`ARCHIVE_KINDS`) it calls
:func:`fetch_archive_source` and streams the archive shard by shard
(:mod:`megacpp_core.acquire_stream`).

``pypi`` sources are sdists located through the simple repository API of the package
indexes that pip on this machine is configured with (``index-url`` first, then each
``extra-index-url``, from pip's own configuration files and ``PIP_*`` environment
variables; ``MEGACPP_INDEX_URL`` overrides all of them). The file is downloaded,
checked against the pinned sha256 and stored in a content-addressed cache under the data
root; a cached file is re-hashed and reused without any network access. **Nothing from
the package is built or executed**: the archive is only read.

Archives are never extracted to disk; they are read under the rules of
:class:`ArchiveLimits`; any violation raises :class:`UnsafeArchiveError` naming the
archive, the entry and the rule, and nothing is written for the partition.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import pyarrow as pa

from .archives import (  # noqa: F401  (re-exported: the stage and callers use acquire.*)
    Acquired,
    AcquireError,
    ArchiveLimits,
    ArchiveSource,
    FetchedArchive,
    HashMismatchError,
    UnsafeArchiveError,
    _check_name,
    _check_sizes,
    _hash_file,
    cache_path,
    iter_archive,
    strip_common_root,
)
from .manifest import Manifest, ManifestError, Source

log = logging.getLogger("megacpp.acquire")

#: Extension → language label used by every later stage.
LANGUAGE_BY_EXTENSION = {
    ".c": "c",
    ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".c++": "cpp",
    ".h": "header", ".hh": "header", ".hpp": "header", ".hxx": "header", ".h++": "header",
    ".inl": "header", ".ipp": "header", ".tpp": "header",
    ".cu": "cuda", ".cuh": "cuda",
}


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


def fetch_pypi_sdist(source: Source, cache_root: Path) -> FetchedArchive:
    """Locate, download and hash-check the sdist of a ``pypi`` source.

    A cached file whose sha256 still matches is reused without network access. Raises
    :class:`HashMismatchError` when the index serves different bytes than the pin (the
    file is not kept) and :class:`AcquireError` when no index has the sdist.
    """
    want = source.sha256
    assert want and source.package and source.version
    hit = _cached(cache_root, want, source.name)
    if hit:
        return hit
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


def _cached(cache_root: Path, want: str, name: str) -> FetchedArchive | None:
    hit_dir = Path(cache_root) / "sha256" / want[:2] / want
    if hit_dir.is_dir():
        for f in sorted(hit_dir.iterdir()):
            if f.is_file() and not f.name.endswith(".part"):
                if _hash_file(f) == want:
                    return FetchedArchive(f, want, f.name, True, None)
                log.warning("%s: cached file %s is corrupt; fetching again", name, f)
                f.unlink()
    return None


def fetch_archive(source: Source, cache_root: Path) -> FetchedArchive:
    """Download (``url``) or copy (``path``) the archive of an ``archive`` source into the cache.

    The bytes are hashed while they are copied; a mismatch with the pinned sha256 raises
    :class:`HashMismatchError` and keeps nothing. A cached file whose sha256 still matches
    is reused without touching the URL or path. Raises :class:`AcquireError` when the path
    does not exist or the URL cannot be fetched.
    """
    want = source.sha256
    assert want and (source.url or source.path)
    hit = _cached(cache_root, want, source.name)
    if hit:
        return hit
    loc = source.url or Path(source.path).as_uri()
    filename = loc.rstrip("/").rsplit("/", 1)[-1]
    if source.path and not Path(source.path).is_file():
        raise AcquireError(f"source {source.name}: archive path {source.path} does not exist")
    dest = cache_path(cache_root, want, filename)
    try:
        got = _download(loc, dest)
    except (OSError, ValueError) as e:
        raise AcquireError(f"source {source.name}: cannot fetch {loc}: {e}") from e
    except Exception as e:  # requests' errors (connection, HTTP status)
        raise AcquireError(f"source {source.name}: cannot fetch {loc}: {e}") from e
    if got != want:
        dest.unlink(missing_ok=True)
        raise HashMismatchError(f"source {source.name}: {filename} has sha256 {got}, but the manifest pins {want}")
    return FetchedArchive(dest, want, filename, False, None)


#: Source kinds fetched as one archive file (:func:`fetch_archive_source`); the acquire stage
#: streams them (:mod:`megacpp_core.acquire_stream`).
ARCHIVE_KINDS = ("pypi", "archive", "git")


def fetch_archive_source(source: Source, cache_root: Path) -> ArchiveSource:
    """Fetch (or reuse) a source of one of :data:`ARCHIVE_KINDS` as one hash-checked archive
    file in the cache, without reading it: the sdist or archive (members under a single top
    directory, which readers strip), or the tree tar of a git tag (``cache/git/COMMIT/tree.tar``).

    Raises :class:`AcquireError` (fetch or pin failure, or another kind) and
    :class:`HashMismatchError`.
    """
    if source.kind in ("pypi", "archive"):
        fetched = fetch_pypi_sdist(source, cache_root) if source.kind == "pypi" else fetch_archive(source, cache_root)
        return ArchiveSource(fetched.path, fetched.path.name, True, fetched.sha256, fetched.sha256, fetched.filename,
                             fetched.from_cache, pin_ok=fetched.sha256 == source.sha256)
    if source.kind == "git":
        from . import acquire_git

        info, from_cache = acquire_git.fetch_git(source, cache_root)
        label = f"{source.url}@{source.tag}"
        return ArchiveSource(Path(cache_root) / info["tar"], label, False, info["commit"], None, label, from_cache)
    raise AcquireError(f"source {source.name}: kind {source.kind!r} is not read from one archive")


def acquire_source(source: Source, cache_root: Path, limits: ArchiveLimits | None = None) -> Acquired:
    """Fetch (or reuse) a source of any kind and read all its files into memory, safely.

    Raises :class:`AcquireError` (fetch or pin failure), :class:`HashMismatchError` or
    :class:`UnsafeArchiveError` (hostile archive, git tree or local directory).
    """
    limits = limits or ArchiveLimits()
    if source.kind in ARCHIVE_KINDS:
        arc = fetch_archive_source(source, cache_root)
        files = list(iter_archive(arc.path, limits, arc.label))
        files = strip_common_root(files) if arc.strip_root else files
        files.sort(key=lambda x: x[0])
        return Acquired(files, arc.revision, arc.archive_sha256, arc.origin, arc.from_cache, pin_ok=arc.pin_ok)
    if source.kind == "local":
        from . import acquire_local

        return acquire_local.acquire_local(source, limits)
    if source.kind == "debian":
        from . import acquire_debian

        return acquire_debian.acquire_debian(source, cache_root, limits)
    raise AcquireError(f"source {source.name}: unknown kind {source.kind!r}")


def check_pins(manifest: Manifest, cache_root: Path) -> None:
    """Check, before a run, that every pin can be satisfied; raise :class:`ManifestError`
    naming the manifest, the source and the field otherwise.

    ``pypi``: the version must exist as an sdist on a configured index (skipped when the
    pinned file is already cached, and when no index answers — the fetch then reports
    it); ``git``: ``tag`` must be a tag, not a branch (skipped when the tag's resolution
    is cached); ``archive``: ``path`` must exist unless cached; ``local``: the directory
    must exist; ``debian``: the version must be in the configured suites with the pinned
    orig sha256 (skipped when cached; see :func:`megacpp_core.acquire_debian.check_pin`).
    """
    from . import acquire_git, acquire_local

    for s in manifest.sources:
        where = f"{manifest.path}: source {s.name!r}"
        if s.kind == "pypi":
            if _cached_any(cache_root, s.sha256):
                continue
            answered = False
            versions: set[str] = set()
            for index_url in configured_index_urls():
                try:
                    packages = _project_packages(index_url, s.package)
                except Exception as e:
                    log.warning("%s: index %s unavailable: %s", s.name, index_url, e)
                    continue
                answered = True
                versions |= {p.version for p in packages if p.package_type == "sdist"}
                if s.version in versions:
                    break
            if answered and s.version not in versions:
                raise ManifestError(f"{where}: field 'version': {s.package}=={s.version} has no sdist on the configured "
                                    f"indexes (sdist versions there: {len(versions)})")
        elif s.kind == "git":
            if acquire_git.cached_resolution(s, cache_root) is None:
                try:
                    acquire_git.resolve_tag(s)
                except AcquireError as e:
                    raise ManifestError(f"{where}: field 'tag': {e}") from None
        elif s.kind == "archive":
            if s.path and not _cached_any(cache_root, s.sha256) and not Path(s.path).is_file():
                raise ManifestError(f"{where}: field 'path': {s.path} does not exist")
        elif s.kind == "local":
            try:
                acquire_local.local_root(s)
            except AcquireError as e:
                raise ManifestError(f"{where}: field '{'path' if s.path else 'python_package'}': {e}") from None
        elif s.kind == "debian":
            from . import acquire_debian

            try:
                acquire_debian.check_pin(s, cache_root)
            except AcquireError as e:
                raise ManifestError(f"{where}: field '{getattr(e, 'field', 'package')}': {e}") from None


def cached_archive_bytes(cache_root: Path, sha: str | None) -> int | None:
    """Bytes of the archive pinned by ``sha`` in the content-addressed cache that
    :func:`fetch_archive` fills (``CACHE/sha256/xx/SHA/NAME``), or None when it is not
    cached or has no pin. Not hashed: a size for planning the order of work, not a
    verified copy (acquire verifies it before use)."""
    if not sha:
        return None
    d = Path(cache_root) / "sha256" / sha[:2] / sha
    try:
        sizes = [f.stat().st_size for f in d.iterdir() if f.is_file() and not f.name.endswith(".part")]
    except (FileNotFoundError, NotADirectoryError):
        return None
    return max(sizes) if sizes else None


def _cached_any(cache_root: Path, sha: str | None) -> bool:
    return cached_archive_bytes(cache_root, sha) is not None


def language_of(path: str) -> str | None:
    """Language label (``c``, ``cpp``, ``header``, ``cuda``) from the extension, else ``None``."""
    ext = os.path.splitext(path)[1].lower()
    return LANGUAGE_BY_EXTENSION.get(ext)


SOURCE_FILES_SCHEMA = pa.schema([
    ("snapshot", pa.string()),
    ("source", pa.string()),
    ("kind", pa.string()),
    ("version", pa.string()),
    ("revision", pa.string()),
    ("archive_sha256", pa.string()),
    ("path", pa.string()),
    ("size", pa.int64()),
    ("content_sha256", pa.string()),
    ("language", pa.string()),
    ("doc_key", pa.string()),
    ("content", pa.large_binary()),
])


def source_files_table(snapshot: str, source: Source, acquired: Acquired) -> pa.Table:
    """The ``source_files`` table of one source (SOURCE_FILES_SCHEMA), one row per file.

    Columns: provenance — ``snapshot``, ``source`` (name), ``kind``, ``version`` (version,
    tag or label), ``revision`` (archive sha256 / commit sha / local hash),
    ``archive_sha256`` (null for git and local); ``path`` inside the source (POSIX,
    common top directory of an archive stripped); ``size`` in bytes; ``content_sha256``;
    ``language`` (``c``, ``cpp``, ``header``, ``cuda`` from the extension, None for other
    files, which later stages still use for license files); ``doc_key`` = ``SOURCE/PATH``
    (stable across runs, used by every later stage); the raw ``content``. Rows are sorted
    by path.
    """
    cols: dict[str, list] = {f.name: [] for f in SOURCE_FILES_SCHEMA}
    for p, data in sorted(acquired.files, key=lambda x: x[0]):
        cols["snapshot"].append(snapshot)
        cols["source"].append(source.name)
        cols["kind"].append(source.kind)
        cols["version"].append(source.version)
        cols["revision"].append(acquired.revision)
        cols["archive_sha256"].append(acquired.archive_sha256)
        cols["path"].append(p)
        cols["size"].append(len(data))
        cols["content_sha256"].append(hashlib.sha256(data).hexdigest())
        cols["language"].append(language_of(p))
        cols["doc_key"].append(f"{source.name}/{p}")
        cols["content"].append(data)
    return pa.table(cols, schema=SOURCE_FILES_SCHEMA)


#: License evidence files larger than this are not read (a license text is a few kB; the
#: limit keeps a hostile "LICENSE" of gigabytes out of the scan).
MAX_LICENSE_FILE_BYTES = 1_000_000


#: Columns of ``license_texts`` (those of :data:`SOURCE_FILES_SCHEMA`).
LICENSE_TEXTS_SCHEMA = pa.schema([SOURCE_FILES_SCHEMA.field(n) for n in ("path", "size", "content")])


def is_license_evidence(path: str, size: int) -> bool:
    """True for a file of a revision's license evidence: a license file
    (:func:`megacpp_core.license.is_license_file`) of at most :data:`MAX_LICENSE_FILE_BYTES`
    bytes, or ``debian/copyright`` (``path`` inside the revision, ``size`` in bytes)."""
    from .dep5 import COPYRIGHT_PATH
    from .license import is_license_file

    return path == COPYRIGHT_PATH or (is_license_file(path) and size <= MAX_LICENSE_FILE_BYTES)


def license_texts_table(table: pa.Table) -> pa.Table:
    """The license evidence of a revision: the rows of ``table`` (``source_files``) that
    are :func:`is_license_evidence`, in table order; columns ``path``, ``size``,
    ``content`` (:data:`LICENSE_TEXTS_SCHEMA`)."""
    paths, sizes = table.column("path").to_pylist(), table.column("size").to_pylist()
    take = [i for i, (p, n) in enumerate(zip(paths, sizes)) if is_license_evidence(p, n)]
    return table.select(["path", "size", "content"]).take(pa.array(take, type=pa.int64()))


def revision_table(refs, columns: list[str]) -> pa.Table:
    """One revision's shards of a shard dataset (``refs``: its input references, e.g.
    ``ctx.inputs("source_files")`` in a per-revision stage) as one table sorted by ``path``
    (which ``columns`` must include): the whole revision, for the libclang lane."""
    parts = [r.read(columns=columns) for r in refs]
    t = pa.concat_tables(parts) if parts else pa.table({c: pa.array([], pa.string()) for c in columns})
    return t.take(t.column("path").to_numpy(zero_copy_only=False).argsort(kind="stable")) if t.num_rows else t


def tree_files(source_files: pa.Table) -> tuple[list[tuple[str, bytes]], str]:
    """Every file of a revision as ``(path, bytes)`` and its revision id (``""`` when the
    table is empty), from a ``source_files`` table read with ``path``, ``content`` and
    ``revision``."""
    files = list(zip(source_files.column("path").to_pylist(), source_files.column("content").to_pylist()))
    return files, (source_files.column("revision")[0].as_py() if source_files.num_rows else "")
