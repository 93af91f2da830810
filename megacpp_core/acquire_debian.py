"""Stage 0 for ``debian`` sources: a pinned Debian source package, read without building it (SPEC §3).

A ``debian`` source is ``{name, kind: debian, package, version, sha256}``: the *source*
package name, its exact Debian version (``[epoch:]upstream[-revision]``) and the sha256 of
its main tarball — the ``.orig.tar.*`` (or, for a native package, its only ``.tar.*``).

**Private apt configuration.** Nothing in the machine's ``/etc/apt`` or
``/var/lib/apt`` is modified. :func:`private_apt_config` derives one
``Types: deb-src`` entry from every ``deb`` entry the machine is configured with (same
URIs, suites, components and options such as ``Signed-By``; read from the files apt itself
reads: ``Dir::Etc::sourcelist`` and ``Dir::Etc::sourceparts/*.list|*.sources``, one-line and
deb822 formats) and writes it, with its own state, cache and log directories, under
``CACHE/debian/apt/KEY/`` (``KEY`` = hash of the derived configuration). apt is run with
``APT_CONFIG`` pointing at a private ``apt.conf`` that carries the machine's ``Acquire::``
settings (proxies, validity checks, …), its keyring/credential locations and its download
sandbox user, but none of its ``apt.conf.d`` hooks, plus ``-o Dir::State=…``, ``-o Dir::Cache=…``, ``-o Dir::Etc::…``
options. No mirror or registry host appears in this code: every URI comes from the
machine's configuration, as for the ``pypi`` kind.

**Fetch.** ``apt-get update`` runs once per derived configuration (a stamp file records it)
and again only when a pinned version is not found and the indexes are older than
:data:`REFRESH_AFTER_S`. The pinned version is looked up in the source index
(``apt-cache showsrc``) and its main tarball's sha256 compared with the pin **before**
anything is downloaded; then ``apt-get source --download-only --only-source PKG=VERSION``
downloads the ``.dsc`` and its files into a temporary directory (apt checks them against
the signed index). The ``.dsc``'s ``Checksums-Sha256`` are verified again here, the pin is
checked on the bytes, and every file goes to the content-addressed cache
(:func:`megacpp_core.acquire.cache_path`); a record ``CACHE/debian/pins/KEY.json`` lists
them, so a second acquire needs neither apt nor the network.

**Read.** ``dpkg-source -x`` is never run (it applies patches and can run code). The
tarballs are read with :func:`megacpp_core.acquire.iter_archive` under its safe-extraction
rules and laid out as dpkg-source's ``3.0 (quilt)`` extraction would lay them out
(see ``Dpkg::Source::Package::V2::do_extract`` in dpkg): the orig tarball at the root
(its single top directory stripped, a top-level ``.pc`` dropped), each
``orig-COMPONENT`` tarball under ``COMPONENT/`` (replacing whatever the orig had there),
and the ``debian.tar.*`` replacing ``debian/`` (its entries must all lie under ``debian/``).
``3.0 (native)`` and ``1.0`` native packages are their single tarball; a ``1.0`` package's
``.diff.gz`` contributes only the files it *creates* under ``debian/`` (the patch is never
applied to upstream files). ``debian/patches`` are carried as files, never applied.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from .apt_sources import (
    AptConfig,
    AptConfigError,
    AptError,
    AptMissingError,
    DebianVersionNotFoundError,
    _apt_config_paths,
    _locked,
    _require_apt,
    _run,
    _stderr,
    _write,
    locate_version,
    machine_deb_entries,
    private_apt_config,
    render_deb_src,
)
from .archives import Acquired, ArchiveLimits, _hash_file, cache_path
from .debian_source import (
    DebianPinMismatchError,
    DscChecksumError,
    DscFormatError,
    check_main_pin,
    classify_file,
    dsc_filename,
    parse_dsc,
    read_dsc_dir,
    read_source_package,
    split_version,
    verify_dsc_files,
)
from .manifest import Source

#: The debian kind's API, gathered here from its parts (apt configuration, source packages).
__all__ = [
    "AptConfig", "AptConfigError", "AptError", "AptMissingError", "DebianPinMismatchError",
    "DebianVersionNotFoundError", "DscChecksumError", "DscFormatError", "acquire_debian", "cached_record",
    "check_main_pin", "check_pin", "classify_file", "dsc_filename", "fetch_debian", "machine_deb_entries", "parse_dsc",
    "private_apt_config", "read_dsc_dir", "read_source_package", "render_deb_src", "split_version", "verify_dsc_files",
]

log = logging.getLogger("megacpp.acquire.debian")

# --------------------------------------------------------------------------- cache


def _record_path(source: Source, cache_root: Path) -> Path:
    key = hashlib.sha256(f"{source.package}\0{source.version}\0{source.sha256}".encode()).hexdigest()
    return Path(cache_root) / "debian" / "pins" / f"{key}.json"


def cached_record(source: Source, cache_root: Path) -> dict | None:
    """``{"package", "version", "sha256", "format", "dsc": {name, sha256, size}, "files": [...]}``
    when the pinned revision is fully in the cache with intact bytes, else ``None``."""
    rec_path = _record_path(source, cache_root)
    if not rec_path.exists():
        return None
    rec = json.loads(rec_path.read_text())
    for f in [rec["dsc"], *rec["files"]]:
        p = cache_path(cache_root, f["sha256"], f["name"])
        if not p.is_file() or p.stat().st_size != f["size"] or _hash_file(p) != f["sha256"]:
            log.warning("%s: cached %s is missing or corrupt; fetching again", source.name, f["name"])
            return None
    return rec


def _store(path: Path, sha: str, name: str, cache_root: Path) -> Path:
    """Move a verified download to its content-addressed place (a copy across file systems)."""
    dest = cache_path(cache_root, sha, name)
    if dest.is_file() and dest.stat().st_size == path.stat().st_size and _hash_file(dest) == sha:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".{os.getpid()}.part")
    try:
        os.replace(path, tmp)
    except OSError:
        shutil.copyfile(path, tmp)
    os.replace(tmp, dest)
    return dest


def _hand_to_sandbox(work: Path) -> None:
    """When running as root, let apt's unprivileged download user (``APT::Sandbox::User``)
    write into ``work``, so that apt keeps its own privilege separation for the download
    instead of falling back to root ("Download is performed unsandboxed as root")."""
    if os.geteuid() != 0:
        return
    import pwd

    try:
        user = pwd.getpwnam(_apt_config_paths()["sandbox"])
    except KeyError:
        return
    os.chown(work, user.pw_uid, os.getegid())


def fetch_debian(source: Source, cache_root: Path) -> tuple[dict, bool]:
    """Download (or reuse) the pinned source package; return ``(cache record, from_cache)``.

    The index entry is located and the pin checked against it before any download; the
    downloaded ``.dsc`` must describe the pinned version, its files must match its
    ``Checksums-Sha256`` and the main tarball the pin. Raises :class:`AptMissingError`,
    :class:`AptConfigError`, :class:`AptError`, :class:`DebianVersionNotFoundError`,
    :class:`DscFormatError`, :class:`DscChecksumError` or :class:`DebianPinMismatchError`;
    on any failure nothing is added to the cache.
    """
    assert source.package and source.version and source.sha256
    rec = cached_record(source, cache_root)
    if rec is not None:
        return rec, True
    get, _ = _require_apt(source)
    config = private_apt_config(cache_root)
    indexed = locate_version(config, source)
    check_main_pin(indexed, source.sha256, f"source {source.name}")
    tmp_root = Path(cache_root) / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="debian-", dir=tmp_root))
    try:
        _hand_to_sandbox(work)
        with _locked(config):
            r = _run([get, "-q", *config.options(), "source", "--download-only", "--only-source",
                      f"{source.package}={source.version}"], config, source, cwd=work)
        for f in work.iterdir():
            if f.stat().st_uid != os.geteuid():
                os.chown(f, os.geteuid(), os.getegid())
        for line in r.stderr.decode("utf-8", "replace").splitlines():
            if line.startswith("W:"):
                log.warning("%s: apt-get source: %s", source.name, line)
        if r.returncode != 0:
            raise AptError(f"source {source.name}: apt-get source --download-only {source.package}={source.version} "
                           f"failed: {_stderr(r)}")
        dsc_path = work / dsc_filename(source.package, source.version)
        if not dsc_path.is_file():
            raise AptError(f"source {source.name}: apt-get source left no {dsc_path.name}")
        what = f"source {source.name}"
        dsc = parse_dsc(dsc_path.read_bytes(), what)
        if (dsc.source, dsc.version) != (source.package, source.version):
            raise DscFormatError(f"{what}: {dsc_path.name} describes {dsc.source} {dsc.version}")
        paths = {f.name: work / f.name for f in dsc.files}
        verify_dsc_files(dsc, paths, what)
        check_main_pin(dsc, source.sha256, what)
        dsc_sha, dsc_size = _hash_file(dsc_path), dsc_path.stat().st_size
        for f in dsc.files:  # every file, the upstream signatures included
            _store(paths[f.name], f.sha256, f.name, cache_root)
        _store(dsc_path, dsc_sha, dsc_path.name, cache_root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rec = {"package": source.package, "version": source.version, "sha256": source.sha256, "format": dsc.format,
           "dsc": {"name": dsc_path.name, "sha256": dsc_sha, "size": dsc_size},
           "files": [{"name": f.name, "sha256": f.sha256, "size": f.size, "role": f.role} for f in dsc.files]}
    rec_path = _record_path(source, cache_root)
    _write(rec_path, json.dumps(rec, sort_keys=True, indent=1))
    log.info("%s: fetched %s (%d files)", source.name, rec["dsc"]["name"], len(dsc.files))
    return rec, False


def acquire_debian(source: Source, cache_root: Path, limits: ArchiveLimits = ArchiveLimits()) -> Acquired:
    """Fetch (or reuse) a ``debian`` source and read its revision safely.

    Returns :class:`megacpp_core.acquire.Acquired` with ``files`` sorted by path (orig at
    the root, components under their directory, ``debian/`` from the debian tarball),
    ``revision`` = ``archive_sha256`` = the main tarball's sha256 (the pin), ``origin`` =
    ``PACKAGE_VERSION.dsc``. Raises the errors of :func:`fetch_debian` and
    :class:`UnsafeArchiveError` for a hostile tarball.
    """
    rec, from_cache = fetch_debian(source, cache_root)
    dsc_file = cache_path(cache_root, rec["dsc"]["sha256"], rec["dsc"]["name"])
    what = f"source {source.name}"
    dsc = parse_dsc(dsc_file.read_bytes(), what)
    paths = {f.name: cache_path(cache_root, f.sha256, f.name) for f in dsc.files}
    check_main_pin(dsc, source.sha256, what)
    files = read_source_package(dsc, paths, limits, what)
    return Acquired(files, dsc.main.sha256, dsc.main.sha256, rec["dsc"]["name"], from_cache,
                    pin_ok=dsc.main.sha256 == source.sha256)


def check_pin(source: Source, cache_root: Path) -> None:
    """Pre-run pin check of a ``debian`` source: nothing to do when the revision is
    cached; otherwise the version must be in the configured suites and its indexed main
    tarball must have the pinned sha256. Raises :class:`AptMissingError`,
    :class:`AptConfigError`, :class:`AptError`, :class:`DebianVersionNotFoundError` or
    :class:`DebianPinMismatchError` (each carries ``field``, the manifest field at fault)."""
    if cached_record(source, cache_root) is not None:
        return
    _require_apt(source)
    config = private_apt_config(cache_root)
    check_main_pin(locate_version(config, source), source.sha256, f"source {source.name}")
