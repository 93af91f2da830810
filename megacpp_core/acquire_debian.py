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

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from .acquire import (
    Acquired,
    AcquireError,
    ArchiveLimits,
    HashMismatchError,
    UnsafeArchiveError,
    _check_name,
    _hash_file,
    cache_path,
    iter_archive,
    strip_common_root,
)
from .manifest import Source

log = logging.getLogger("megacpp.acquire.debian")

#: Re-run ``apt-get update`` for a version that is not found only when the indexes are
#: older than this many seconds (one hour); a fresh index that lacks it is final.
REFRESH_AFTER_S = 3600
#: Seconds allowed for one apt call (update, showsrc, source download).
APT_TIMEOUT_S = 3600
#: Tarball compressions a source package may use: dpkg's compressor extensions
#: (``Dpkg::Compression`` in bookworm's dpkg 1.21: gzip, bzip2, lzma, xz).
COMPRESSION_EXTENSIONS = ("gz", "bz2", "lzma", "xz")
#: Source formats read here (dpkg-source(1) "SOURCE PACKAGE FORMATS").
SUPPORTED_FORMATS = ("3.0 (quilt)", "3.0 (native)", "1.0")
#: One-line ``sources.list`` option names → deb822 field names (sources.list(5), "THE DEB
#: AND DEB-SRC TYPES: OPTIONS"); options that only concern binary indexes are dropped.
_ONE_LINE_OPTIONS = {
    "signed-by": "Signed-By", "trusted": "Trusted", "check-valid-until": "Check-Valid-Until",
    "valid-until-min": "Valid-Until-Min", "valid-until-max": "Valid-Until-Max", "check-date": "Check-Date",
    "date-max-future": "Date-Max-Future", "inrelease-path": "InRelease-Path", "pdiffs": "PDiffs",
    "by-hash": "By-Hash", "allow-insecure": "Allow-Insecure", "allow-weak": "Allow-Weak",
    "allow-downgrade-to-insecure": "Allow-Downgrade-To-Insecure", "snapshot": "Snapshot",
}
_BINARY_ONLY_OPTIONS = ("arch", "lang", "target", "architectures", "languages", "targets")
#: deb822 fields that describe the entry itself rather than an option carried over.
_ENTRY_FIELDS = ("types", "uris", "suites", "components", "enabled")
#: Machine ``Acquire::`` settings not carried into the private configuration (index
#: targets and changelog locations are apt's compiled-in defaults or binary-index add-ons).
_NOT_CARRIED = ("Acquire::IndexTargets", "Acquire::Changelogs", "Acquire::cdrom")


class AptMissingError(AcquireError):
    """``apt-get`` (or ``apt-cache``) is not installed on this machine."""

    field = "kind"


class AptConfigError(AcquireError):
    """The machine's apt configuration has no ``deb`` entry to derive ``deb-src`` from."""

    field = "kind"


class AptError(AcquireError):
    """An apt call failed for another reason (network, signature, lock); stderr is quoted."""

    field = "package"


class DebianVersionNotFoundError(AcquireError):
    """The package, or the pinned version of it, is not in the configured suites."""

    field = "version"


class DscFormatError(AcquireError):
    """A ``.dsc`` is malformed, lists an unrecognised file or uses an unsupported format."""

    field = "version"


class DscChecksumError(HashMismatchError):
    """A file listed in a ``.dsc`` is missing or its size or sha256 differs from ``Checksums-Sha256``."""

    field = "sha256"


class DebianPinMismatchError(HashMismatchError):
    """The main tarball's sha256 differs from the manifest's ``sha256`` pin."""

    field = "sha256"


# --------------------------------------------------------------------------- versions and names


def split_version(version: str) -> tuple[str, str, str]:
    """``(epoch, upstream, revision)`` of a Debian version (Debian Policy §5.6.12).

    ``"1:2.3-4"`` → ``("1", "2.3", "4")``; ``"2.3"`` (native) → ``("", "2.3", "")``. The
    revision is what follows the last hyphen. Raises ``ValueError`` on an empty version or
    characters outside Policy's ``[A-Za-z0-9.+~:-]``.
    """
    if not version or not re.fullmatch(r"[A-Za-z0-9.+~:-]+", version):
        raise ValueError(f"{version!r} is not a Debian version")
    epoch, sep, rest = version.partition(":")
    if not sep:
        epoch, rest = "", version
    upstream, sep, revision = rest.rpartition("-")
    if not sep:
        upstream, revision = rest, ""
    return epoch, upstream, revision


def dsc_filename(package: str, version: str) -> str:
    """``PACKAGE_VERSION.dsc`` with the epoch dropped, as in the archive (``fmtlib_9.1.0+ds1-2.dsc``)."""
    _, upstream, revision = split_version(version)
    return f"{package}_{upstream}{'-' + revision if revision else ''}.dsc"


@dataclass(frozen=True)
class DscFile:
    """One file of a source package.

    ``name`` (no directory), ``sha256`` (hex), ``size`` (bytes), ``role``: ``orig``,
    ``component`` (then ``component`` names it), ``debian``, ``native``, ``diff`` or
    ``signature`` (an upstream ``.asc``; cached, never read).
    """

    name: str
    sha256: str
    size: int
    role: str
    component: str | None = None


@dataclass(frozen=True)
class Dsc:
    """A parsed ``.dsc``: ``source`` package, ``version``, ``format`` and its ``files`` (sorted by name)."""

    source: str
    version: str
    format: str
    files: tuple[DscFile, ...]

    @property
    def main(self) -> DscFile:
        """The pinned tarball: the ``.orig.tar.*``, or the only ``.tar.*`` of a native package."""
        for f in self.files:
            if f.role in ("orig", "native"):
                return f
        raise DscFormatError(f"{self.source} {self.version}: no orig or native tarball")

    @property
    def filename(self) -> str:
        """The ``.dsc`` file name (epoch dropped)."""
        return dsc_filename(self.source, self.version)


def classify_file(package: str, version: str, name: str) -> tuple[str, str | None]:
    """``(role, component)`` of a file listed for ``package`` ``version`` (see :class:`DscFile`).

    Follows dpkg-source's own name rules (``Dpkg::Source::Package::V2`` and ``V1``/
    ``V3::Native``): ``P_UP.orig.tar.EXT``, ``P_UP.orig-COMP.tar.EXT`` (``COMP`` of
    ``[A-Za-z0-9-]``), their ``.asc``, ``P_UP-REV.debian.tar.EXT``, ``P_VER.tar.EXT``,
    ``P_UP-REV.diff.gz``. Raises :class:`DscFormatError` for any other name.
    """
    _, upstream, revision = split_version(version)
    base = re.escape(f"{package}_{upstream}")
    baserev = re.escape(f"{package}_{upstream}{'-' + revision if revision else ''}")
    ext = "(?:" + "|".join(COMPRESSION_EXTENSIONS) + ")"
    rules = (
        (rf"{base}\.orig\.tar\.{ext}", "orig"),
        (rf"{base}\.orig\.tar\.{ext}\.asc", "signature"),
        (rf"{base}\.orig-([A-Za-z0-9-]+)\.tar\.{ext}", "component"),
        (rf"{base}\.orig-([A-Za-z0-9-]+)\.tar\.{ext}\.asc", "signature"),
        (rf"{baserev}\.debian\.tar\.{ext}", "debian"),
        (rf"{baserev}\.tar\.{ext}", "native"),
        (rf"{baserev}\.diff\.gz", "diff"),
    )
    for rx, role in rules:
        m = re.fullmatch(rx, name)
        if m:
            return role, (m.group(1) if role == "component" else None)
    raise DscFormatError(f"{package} {version}: unrecognised file {name!r} in the source package")


def _files_from_paragraph(para: Mapping, what: str, index: bool = False) -> tuple[str, str, str, tuple[DscFile, ...]]:
    """(source, version, format, files) from a ``.dsc`` or (``index=True``) a ``Sources``
    paragraph, whose file list also names the ``.dsc`` itself (left out here)."""
    source = (para.get("Source") or para.get("Package") or "").strip()
    version = (para.get("Version") or "").strip()
    fmt = (para.get("Format") or "1.0").strip()
    if not source or not version:
        raise DscFormatError(f"{what}: no Source or Version field")
    checks = para.get("Checksums-Sha256") or ""
    if not isinstance(checks, str):  # python-debian's Dsc/Sources classes pre-split it into dicts
        checks = "\n".join(f"{d.get('sha256', '')} {d.get('size', '')} {d.get('name', '')}" for d in checks)
    listed = {}
    for line in checks.strip().splitlines():
        parts = line.split()
        if len(parts) != 3 or not re.fullmatch(r"[0-9a-fA-F]{64}", parts[0]) or not parts[1].isdigit():
            raise DscFormatError(f"{what}: malformed Checksums-Sha256 line {line.strip()!r}")
        sha, size, name = parts[0].lower(), int(parts[1]), parts[2]
        if "/" in name or name in (".", "..") or name in listed:
            raise DscFormatError(f"{what}: invalid or duplicate file name {name!r} in Checksums-Sha256")
        listed[name] = (sha, size)
    if not listed:
        raise DscFormatError(f"{what}: no Checksums-Sha256 field (needed to verify the files)")
    md5 = para.get("Files") or ""
    names = [d.get("name") for d in md5] if not isinstance(md5, str) else [
        ln.split()[2] for ln in md5.strip().splitlines() if len(ln.split()) == 3]
    for n in names:
        if n not in listed and not (index and n == dsc_filename(source, version)):
            raise DscFormatError(f"{what}: {n!r} is in Files but not in Checksums-Sha256")
    if index:
        listed.pop(dsc_filename(source, version), None)
    files = []
    for name in sorted(listed):
        role, comp = classify_file(source, version, name)
        files.append(DscFile(name, listed[name][0], listed[name][1], role, comp))
    return source, version, fmt, tuple(files)


def parse_dsc(data: bytes | str, what: str = ".dsc") -> Dsc:
    """Parse a ``.dsc`` (OpenPGP clear-signed or not) into a :class:`Dsc`.

    The signature is not checked here: the ``.dsc`` itself is verified by apt against the
    signed ``Sources`` index, then by sha256 in the cache. Raises :class:`DscFormatError`
    for a missing field, a malformed or incomplete ``Checksums-Sha256``, an unrecognised
    file name, an unsupported ``Format`` (:data:`SUPPORTED_FORMATS`) or a file set that
    does not fit the format (``3.0 (quilt)``: one orig and one debian tarball; native:
    one tarball; ``1.0``: orig [+ diff] or one tarball).
    """
    from debian.deb822 import Dsc as _Dsc

    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    try:
        para = _Dsc(text)
    except Exception as e:  # python-debian raises various errors on garbage
        raise DscFormatError(f"{what}: not a readable .dsc: {e}") from e
    source, version, fmt, files = _files_from_paragraph(para, what)
    dsc = Dsc(source, version, fmt, files)
    _check_layout(dsc, what)
    return dsc


def _check_layout(dsc: Dsc, what: str) -> None:
    roles = [f.role for f in dsc.files]
    n = {r: roles.count(r) for r in set(roles)}
    if dsc.format not in SUPPORTED_FORMATS:
        raise DscFormatError(f"{what}: source format {dsc.format!r} is not supported ({', '.join(SUPPORTED_FORMATS)})")
    if dsc.format == "3.0 (quilt)":
        ok = n.get("orig") == 1 and n.get("debian") == 1 and not n.get("native") and not n.get("diff")
    elif dsc.format == "3.0 (native)":
        ok = n.get("native") == 1 and len(roles) == 1
    else:  # 1.0
        ok = (n.get("orig") == 1 and not n.get("native") and not n.get("component") and n.get("diff", 0) <= 1
              and not n.get("debian")) or (n.get("native") == 1 and len(roles) == 1)
    if not ok:
        raise DscFormatError(f"{what}: files {sorted(f.name for f in dsc.files)} do not fit source format {dsc.format!r}")
    comps = [f.component for f in dsc.files if f.role == "component"]
    if len(set(comps)) != len(comps):
        raise DscFormatError(f"{what}: component tarball listed twice")


# --------------------------------------------------------------------------- verification and reading


def verify_dsc_files(dsc: Dsc, paths: Mapping[str, Path], what: str) -> None:
    """Check that every file of ``dsc`` is in ``paths`` (file name → local path) with the
    size and sha256 its ``Checksums-Sha256`` lists.

    Raises :class:`DscChecksumError` naming ``what`` (the source), the file and the rule.
    """
    for f in dsc.files:
        p = paths.get(f.name)
        if p is None or not Path(p).is_file():
            raise DscChecksumError(f"{what}: {f.name} listed in {dsc.filename} is missing")
        size = Path(p).stat().st_size
        if size != f.size:
            raise DscChecksumError(f"{what}: {f.name} has {size} bytes, but {dsc.filename} lists {f.size} "
                                   "(Checksums-Sha256)")
        got = _hash_file(Path(p))
        if got != f.sha256:
            raise DscChecksumError(f"{what}: {f.name} has sha256 {got}, but {dsc.filename} lists {f.sha256} "
                                   "(Checksums-Sha256)")


def check_main_pin(dsc: Dsc, pin: str, what: str) -> None:
    """Raise :class:`DebianPinMismatchError` unless the main tarball's listed sha256 equals ``pin``."""
    main = dsc.main
    if main.sha256 != pin.lower():
        raise DebianPinMismatchError(f"{what}: {main.name} of {dsc.source} {dsc.version} has sha256 {main.sha256}, "
                                     f"but the manifest pins {pin}")


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


def _diff_created_files(path: Path, limits: ArchiveLimits, what: str) -> list[tuple[str, bytes]]:
    """Files a ``1.0`` ``.diff.gz`` *creates* under ``debian/`` (hunks ``@@ -0,0 +1,N @@``).

    The diff is decompressed with the same size and ratio limits as an archive; changes to
    existing (upstream) files are ignored — no patch is ever applied. Raises
    :class:`UnsafeArchiveError` for a bomb or a hostile path, :class:`AcquireError` for a
    corrupt gzip stream.
    """
    name = f"{what}: {path.name}"
    raw = path.read_bytes()
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = bytearray()
    buf = raw
    while buf:
        try:
            out += d.decompress(buf, limits.max_total_bytes + 1 - len(out))
        except zlib.error as e:
            raise AcquireError(f"{name}: not a readable gzip file: {e}") from e
        if len(out) > limits.max_total_bytes:
            raise UnsafeArchiveError(name, name, f"total size over {limits.max_total_bytes} bytes")
        buf = d.unconsumed_tail
        if d.eof:
            break
    if len(out) > (1 << 20) and len(out) / max(len(raw), 1) > limits.max_ratio:
        raise UnsafeArchiveError(name, name, f"compression ratio over {limits.max_ratio:g} (decompression bomb)")
    lines = bytes(out).split(b"\n")
    files: list[tuple[str, bytes]] = []
    i = 0
    hunk = re.compile(rb"^@@ -0,0 \+1(?:,(\d+))? @@")
    while i < len(lines):
        if lines[i].startswith(b"--- ") and i + 2 < len(lines) and lines[i + 1].startswith(b"+++ "):
            target = lines[i + 1][4:].split(b"\t")[0].decode("utf-8", "surrogateescape").strip()
            m = hunk.match(lines[i + 2])
            i += 2
            if not m:
                continue
            count = int(m.group(1) or 1)
            body = lines[i + 1:i + 1 + count]
            i += 1 + count
            content = b"".join(line[1:] + b"\n" for line in body if line.startswith(b"+"))
            if i < len(lines) and lines[i].startswith(b"\\ No newline"):
                content = content[:-1]
                i += 1
            rel = target.split("/", 1)[1] if "/" in target else target
            if not _under(rel, "debian"):
                continue
            rel = _check_name(name, rel)
            if len(content) > limits.max_member_bytes:
                raise UnsafeArchiveError(name, rel, f"member larger than {limits.max_member_bytes} bytes")
            files.append((rel, content))
            continue
        i += 1
    return files


def read_source_package(dsc: Dsc, paths: Mapping[str, Path], limits: ArchiveLimits = ArchiveLimits(),
                        what: str | None = None) -> list[tuple[str, bytes]]:
    """The files of one source-package revision, laid out as ``dpkg-source -x`` would
    (without applying any patch), as ``(path, bytes)`` sorted by path.

    ``paths`` maps each file name of ``dsc`` to a local, already verified file (see
    :func:`verify_dsc_files`). Each tarball is read by
    :func:`megacpp_core.acquire.iter_archive` under ``limits``; the merged revision must
    also stay within ``limits.max_entries`` and ``limits.max_total_bytes``. Raises
    :class:`UnsafeArchiveError` (hostile tarball, a ``debian.tar`` entry outside
    ``debian/``, revision over the limits; its ``archive`` is ``"WHAT: TARBALL"``, naming
    the source) or :class:`DscFormatError`.
    """
    what = what or dsc.filename
    byname = {f.role: f for f in dsc.files if f.role not in ("component", "signature")}
    tree: dict[str, bytes] = {}
    main = dsc.main
    for p, data in strip_common_root(list(iter_archive(Path(paths[main.name]), limits, f"{what}: {main.name}"))):
        if dsc.format == "3.0 (quilt)" and _under(p, ".pc"):
            continue  # dpkg-source excludes a top-level .pc (quilt state) from the orig tarball
        tree[p] = data
    for f in sorted((f for f in dsc.files if f.role == "component"), key=lambda f: f.component):
        comp = f.component
        assert comp is not None
        for p in [p for p in tree if _under(p, comp)]:
            del tree[p]  # dpkg-source: "required removal of '%s' installed by original tarball"
        for p, data in strip_common_root(list(iter_archive(Path(paths[f.name]), limits, f"{what}: {f.name}"))):
            tree[f"{comp}/{p}"] = data
    if "debian" in byname:
        f = byname["debian"]
        for p in [p for p in tree if _under(p, "debian")]:
            del tree[p]  # dpkg-source erases debian/ before unpacking the debian tarball
        for p, data in iter_archive(Path(paths[f.name]), limits, f"{what}: {f.name}"):
            if not p.startswith("debian/"):
                raise UnsafeArchiveError(f"{what}: {f.name}", p, "debian tarball entry outside debian/")
            tree[p] = data
    if "diff" in byname:
        f = byname["diff"]
        for p, data in _diff_created_files(Path(paths[f.name]), limits, what):
            tree[p] = data
    if len(tree) > limits.max_entries:
        raise UnsafeArchiveError(what, sorted(tree)[limits.max_entries], f"more than {limits.max_entries} entries")
    total = sum(len(b) for b in tree.values())
    if total > limits.max_total_bytes:
        raise UnsafeArchiveError(what, main.name, f"total size over {limits.max_total_bytes} bytes")
    return sorted(tree.items())


def read_dsc_dir(dsc_path: Path, limits: ArchiveLimits = ArchiveLimits(), pin: str | None = None,
                 what: str | None = None) -> tuple[Dsc, list[tuple[str, bytes]]]:
    """Parse the ``.dsc`` at ``dsc_path``, verify the files next to it (the layout ``apt-get
    source --download-only`` leaves), check ``pin`` against the main tarball when given,
    and read the revision (:func:`read_source_package`).

    Returns ``(dsc, files)``. Raises :class:`DscFormatError`, :class:`DscChecksumError`,
    :class:`DebianPinMismatchError` or :class:`UnsafeArchiveError`; nothing is read from a
    tarball before every checksum and the pin have been verified.
    """
    dsc_path = Path(dsc_path)
    what = what or dsc_path.name
    dsc = parse_dsc(dsc_path.read_bytes(), what)
    paths = {f.name: dsc_path.parent / f.name for f in dsc.files}
    verify_dsc_files(dsc, paths, what)
    if pin is not None:
        check_main_pin(dsc, pin, what)
    return dsc, read_source_package(dsc, paths, limits, what)


# --------------------------------------------------------------------------- machine apt configuration


@dataclass(frozen=True)
class AptEntry:
    """One ``deb`` entry of the machine's configuration.

    ``uris``, ``suites``, ``components`` as configured (``components`` empty for a flat
    repository); ``options``: ``(deb822 field, value)`` pairs carried into the derived
    ``deb-src`` entry (``Signed-By``, ``Trusted``, ``Check-Valid-Until``, …; binary-only
    options such as ``Architectures`` are dropped); ``origin``: the file it was read from.
    """

    uris: tuple[str, ...]
    suites: tuple[str, ...]
    components: tuple[str, ...]
    options: tuple[tuple[str, str], ...]
    origin: str


def parse_one_line_sources(text: str, origin: str = "sources.list") -> list[AptEntry]:
    """``deb`` entries of a one-line ``sources.list`` file (sources.list(5)).

    ``deb [opt=value …] URI SUITE [COMPONENT …]``; comments (``#``) and ``deb-src`` lines
    are skipped; options are mapped to deb822 names (:data:`_ONE_LINE_OPTIONS`), unknown
    ones title-cased, binary-only ones (``arch``, ``lang``, ``target`` and their
    ``+=``/``-=`` forms) dropped. Malformed lines are skipped with a warning, as apt would
    refuse them.
    """
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"^(\S+)\s*(?:\[([^\]]*)\])?\s*(.*)$", line)
        if not m or m.group(1) != "deb":
            continue
        opts = []
        for opt in (m.group(2) or "").split():
            key, sep, value = opt.partition("=")
            key = key.rstrip("+-").lower()
            if not sep or key in _BINARY_ONLY_OPTIONS:
                continue
            opts.append((_ONE_LINE_OPTIONS.get(key, "-".join(w.capitalize() for w in key.split("-"))), value))
        rest = m.group(3).split()
        if len(rest) < 2:
            log.warning("%s:%d: malformed deb line skipped", origin, n)
            continue
        out.append(AptEntry((rest[0],), (rest[1],), tuple(rest[2:]), tuple(opts), origin))
    return out


def parse_deb822_sources(text: str, origin: str = "x.sources") -> list[AptEntry]:
    """``deb`` entries of a deb822 ``.sources`` file (sources.list(5), "DEB822-STYLE FORMAT").

    A stanza counts when its ``Types`` include ``deb`` and ``Enabled`` is not ``no``;
    field names are case-insensitive; every field other than ``Types``, ``URIs``,
    ``Suites``, ``Components``, ``Enabled`` and the binary-only ones
    (``Architectures``, ``Languages``, ``Targets`` and their ``-Add``/``-Remove`` forms) is
    carried as an option, multi-line values (an inline ``Signed-By`` key) included.
    """
    from debian.deb822 import Deb822

    out = []
    for para in Deb822.iter_paragraphs(text.splitlines(True)):
        fields = {k.lower(): (k, v) for k, v in para.items()}
        types = fields.get("types", ("", ""))[1].split()
        if "deb" not in types or fields.get("enabled", ("", "yes"))[1].strip().lower() == "no":
            continue
        uris = tuple(fields.get("uris", ("", ""))[1].split())
        suites = tuple(fields.get("suites", ("", ""))[1].split())
        if not uris or not suites:
            log.warning("%s: deb stanza without URIs or Suites skipped", origin)
            continue
        opts = []
        for low, (key, value) in fields.items():
            base = re.sub(r"-(add|remove)$", "", low)
            if low in _ENTRY_FIELDS or base in _BINARY_ONLY_OPTIONS:
                continue
            opts.append((key, value))
        out.append(AptEntry(uris, suites, tuple(fields.get("components", ("", ""))[1].split()), tuple(opts), origin))
    return out


def _apt_config_paths() -> dict[str, str]:
    """The machine's apt file locations and sandbox user (``apt-config shell``), with apt's
    compiled-in defaults as fallback."""
    keys = {"sourcelist": "Dir::Etc::sourcelist/f", "sourceparts": "Dir::Etc::sourceparts/d",
            "trusted": "Dir::Etc::trusted/f", "trustedparts": "Dir::Etc::trustedparts/d",
            "netrc": "Dir::Etc::netrc/f", "netrcparts": "Dir::Etc::netrcparts/d", "sandbox": "APT::Sandbox::User"}
    defaults = {"sourcelist": "/etc/apt/sources.list", "sourceparts": "/etc/apt/sources.list.d/",
                "trusted": "/etc/apt/trusted.gpg", "trustedparts": "/etc/apt/trusted.gpg.d/",
                "netrc": "/etc/apt/auth.conf", "netrcparts": "/etc/apt/auth.conf.d/", "sandbox": "_apt"}
    exe = shutil.which("apt-config")
    if exe is None:
        return defaults
    args = [exe, "shell"]
    for var, key in keys.items():
        args += [var.upper(), key]
    r = subprocess.run(args, capture_output=True, text=True, env=_clean_env(), timeout=60)
    got = dict(defaults)
    for line in r.stdout.splitlines():
        var, _, value = line.partition("=")
        if var.lower() in got:
            got[var.lower()] = value.strip().strip("'")
    return got


def machine_deb_entries(sourcelist: Path | None = None, sourceparts: Path | None = None) -> list[AptEntry]:
    """Every enabled ``deb`` entry the machine's apt reads, in apt's order: the
    ``sources.list`` file, then ``sources.list.d/*.list`` and ``*.sources`` sorted by name
    (other file names — ``*.disabled``, ``*.save``, … — are ignored, as apt ignores them).

    ``sourcelist``/``sourceparts`` default to the machine's ``Dir::Etc::sourcelist`` and
    ``Dir::Etc::sourceparts``. Duplicate entries are kept once.
    """
    if sourcelist is None or sourceparts is None:
        conf = _apt_config_paths()
        sourcelist = Path(conf["sourcelist"]) if sourcelist is None else sourcelist
        sourceparts = Path(conf["sourceparts"]) if sourceparts is None else sourceparts
    entries: list[AptEntry] = []
    if Path(sourcelist).is_file():
        entries += parse_one_line_sources(Path(sourcelist).read_text(encoding="utf-8", errors="replace"), str(sourcelist))
    if Path(sourceparts).is_dir():
        for f in sorted(Path(sourceparts).iterdir()):
            if not f.is_file() or not re.fullmatch(r"[A-Za-z0-9_.-]+\.(list|sources)", f.name):
                continue
            text = f.read_text(encoding="utf-8", errors="replace")
            entries += parse_one_line_sources(text, str(f)) if f.suffix == ".list" else parse_deb822_sources(text, str(f))
    seen, out = set(), []
    for e in entries:
        key = (e.uris, e.suites, e.components, e.options)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _field(key: str, value: str) -> str:
    lines = value.strip("\n").split("\n")
    first = lines[0].strip()
    rest = ["." if not ln.strip() else ln.strip() for ln in lines[1:]]
    return "\n".join([f"{key}: {first}".rstrip()] + [f" {ln}" for ln in rest])


def render_deb_src(entries: Iterable[AptEntry]) -> str:
    """The derived ``deb-src`` entries as one deb822 ``.sources`` text (deterministic)."""
    stanzas = []
    for e in entries:
        lines = [f"# from {e.origin}", "Types: deb-src", f"URIs: {' '.join(e.uris)}", f"Suites: {' '.join(e.suites)}"]
        if e.components:
            lines.append(f"Components: {' '.join(e.components)}")
        lines += [_field(k, v) for k, v in e.options]
        stanzas.append("\n".join(lines) + "\n")
    return "\n".join(stanzas)


def _machine_acquire_settings() -> list[str]:
    """The machine's ``Acquire::`` settings (``apt-config dump``) as apt.conf lines, minus
    :data:`_NOT_CARRIED`; values holding a quote or newline are skipped."""
    exe = shutil.which("apt-config")
    if exe is None:
        return []
    r = subprocess.run([exe, "dump"], capture_output=True, text=True, env=_clean_env(), timeout=60)
    out = []
    for line in r.stdout.splitlines():
        m = re.fullmatch(r'(Acquire::\S*) "(.*)";', line)
        if not m or m.group(1).startswith(_NOT_CARRIED) or '"' in m.group(2):
            continue
        out.append(line)
    return out


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "APT_CONFIG"}
    env["LC_ALL"] = "C"
    return env


@dataclass(frozen=True)
class AptConfig:
    """The project's private apt configuration under ``root`` (``CACHE/debian/apt/KEY``).

    ``key``: 16 hex digits of sha256 over the derived sources and the private ``apt.conf``
    (a change in the machine's entries gives a new directory, hence a fresh
    ``apt-get update``); ``entries``: the machine ``deb`` entries it was derived from.
    """

    root: Path
    key: str
    entries: tuple[AptEntry, ...]

    @property
    def stamp(self) -> Path:
        """File written after a successful ``apt-get update`` of this configuration."""
        return self.root / "update.ok"

    def options(self) -> list[str]:
        """``-o`` options that point every apt state, cache, log and source location here."""
        r = self.root
        opts = {
            "Dir::State": r / "state", "Dir::State::status": r / "state" / "status",
            "Dir::Cache": r / "cache", "Dir::Log": r / "log",
            "Dir::Etc::sourcelist": r / "sources.list", "Dir::Etc::sourceparts": r / "sources.list.d",
            "Dir::Etc::preferences": r / "preferences", "Dir::Etc::preferencesparts": r / "preferences.d",
        }
        out = []
        for k, v in opts.items():
            out += ["-o", f"{k}={v}"]
        return out

    def env(self) -> dict[str, str]:
        """Environment for apt: ``APT_CONFIG`` = the private ``apt.conf``, ``LC_ALL=C``."""
        env = _clean_env()
        env["APT_CONFIG"] = str(self.root / "apt.conf")
        return env


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(path.name + f".{os.getpid()}.part")
    tmp.write_text(text)
    os.replace(tmp, path)


def private_apt_config(cache_root: Path, sourcelist: Path | None = None, sourceparts: Path | None = None) -> AptConfig:
    """Write (idempotently) and return the private apt configuration under ``cache_root``.

    Layout of ``cache_root/debian/apt/KEY/``: ``sources.list`` (empty),
    ``sources.list.d/derived.sources`` (:func:`render_deb_src`), ``apt.conf`` (read through
    ``APT_CONFIG``: ``Dir::Etc::parts`` → the empty ``apt.conf.d/`` here so no machine hook
    runs, the machine's keyring and credential locations, its sandbox user and its
    ``Acquire::`` settings),
    ``preferences.d/``, ``state/`` (``lists/``, an empty dpkg ``status``), ``cache/``,
    ``log/``. Raises :class:`AptConfigError` when the machine has no ``deb`` entry.
    """
    entries = machine_deb_entries(sourcelist, sourceparts)
    if not entries:
        raise AptConfigError("the machine's apt configuration has no deb entry to derive deb-src entries from "
                             f"(read {sourcelist or 'Dir::Etc::sourcelist'} and {sourceparts or 'Dir::Etc::sourceparts'})")
    sources = render_deb_src(entries)
    paths = _apt_config_paths()
    conf_lines = ["// Private apt configuration of the debian source kind (megacpp_core.acquire_debian).",
                  "// Derived from the machine's apt configuration; never edit by hand."]
    for key in ("trusted", "trustedparts", "netrc", "netrcparts"):
        conf_lines.append(f'Dir::Etc::{key} "{paths[key]}";')
    conf_lines.append(f'APT::Sandbox::User "{paths["sandbox"]}";')
    conf_lines += _machine_acquire_settings()
    key = hashlib.sha256((sources + "\0" + "\n".join(conf_lines)).encode()).hexdigest()[:16]
    root = Path(cache_root).resolve() / "debian" / "apt" / key
    conf_lines[2:2] = [f'Dir::Etc::parts "{root / "apt.conf.d"}";', 'Dir::Etc::main "/dev/null";']
    for d in ("apt.conf.d", "preferences.d", "sources.list.d", "state/lists/partial", "cache/archives/partial", "log"):
        (root / d).mkdir(parents=True, exist_ok=True)
    _write(root / "sources.list.d" / "derived.sources", sources)
    _write(root / "sources.list", "")
    _write(root / "state" / "status", "")
    _write(root / "apt.conf", "\n".join(conf_lines) + "\n")
    return AptConfig(root, key, tuple(entries))


# --------------------------------------------------------------------------- apt calls


def _require_apt(source: Source) -> tuple[str, str]:
    get, cache = shutil.which("apt-get"), shutil.which("apt-cache")
    if get is None or cache is None:
        raise AptMissingError(f"source {source.name}: the {'apt-get' if get is None else 'apt-cache'} command is not "
                              "installed; the debian kind fetches with apt-get source (SPEC §3)")
    return get, cache


@contextlib.contextmanager
def _locked(config: AptConfig) -> Iterator[None]:
    """An exclusive lock on the configuration (apt's own locks would fail, not wait)."""
    with open(config.root / "megacpp.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(args: list[str], config: AptConfig, source: Source, cwd: Path | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, cwd=cwd, capture_output=True, env=config.env(), timeout=APT_TIMEOUT_S)
    except FileNotFoundError:
        raise AptMissingError(f"source {source.name}: {args[0]} is not installed") from None


def _stderr(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.decode("utf-8", "replace").splitlines() if ln.startswith(("E:", "Err:"))]
    return " / ".join(lines[-5:]) or r.stderr.decode("utf-8", "replace").strip()[-500:]


def apt_update(config: AptConfig, source: Source) -> None:
    """``apt-get update`` of the private configuration (only ``Sources`` indexes: every
    entry is ``deb-src``); writes the stamp. Raises :class:`AptError` on failure."""
    get, _ = _require_apt(source)
    r = _run([get, "-q", *config.options(), "update"], config, source)
    if r.returncode != 0:
        raise AptError(f"source {source.name}: apt-get update of the derived deb-src entries failed: {_stderr(r)}")
    _write(config.stamp, json.dumps({"updated_at": int(time.time())}))
    log.info("%s: apt-get update of %s done", source.name, config.root)


def source_versions(config: AptConfig, source: Source) -> dict[str, Dsc]:
    """Every version of ``source.package`` in the configured suites (``apt-cache showsrc
    --only-source``), as ``{version: Dsc built from the index entry}``; ``{}`` when the
    package is unknown. Entries whose file list cannot be classified are left out.
    Raises :class:`AptError` when apt-cache itself fails (e.g. unreadable indexes)."""
    from debian.deb822 import Sources

    _, cache = _require_apt(source)
    r = _run([cache, *config.options(), "showsrc", "--only-source", source.package], config, source)
    out: dict[str, Dsc] = {}
    if r.returncode != 0:  # an unknown package is only a warning ("W: Unable to locate package")
        raise AptError(f"source {source.name}: apt-cache showsrc {source.package} failed: {_stderr(r)}")
    for para in Sources.iter_paragraphs(io.StringIO(r.stdout.decode("utf-8", "replace")), use_apt_pkg=False):
        if para.get("Package") != source.package:
            continue
        try:
            pkg, ver, fmt, files = _files_from_paragraph(para, f"index entry {source.package}", index=True)
        except DscFormatError as e:
            log.warning("%s: %s", source.name, e)
            continue
        out.setdefault(ver, Dsc(pkg, ver, fmt, files))
    return out


def _index_age(config: AptConfig) -> float | None:
    if not config.stamp.exists():
        return None
    try:
        return time.time() - json.loads(config.stamp.read_text())["updated_at"]
    except (ValueError, KeyError):
        return None


def locate_version(config: AptConfig, source: Source) -> Dsc:
    """The index entry of the pinned version; runs ``apt-get update`` first when this
    configuration never was, and again when the version is missing from indexes older
    than :data:`REFRESH_AFTER_S`. Raises :class:`DebianVersionNotFoundError` naming the
    versions the suites do carry."""
    with _locked(config):
        age = _index_age(config)
        if age is None:
            apt_update(config, source)
            age = 0.0
        versions = source_versions(config, source)
        if source.version not in versions and age > REFRESH_AFTER_S:
            apt_update(config, source)
            versions = source_versions(config, source)
    if source.version not in versions:
        suites = sorted({s for e in config.entries for s in e.suites})
        if not versions:
            raise DebianVersionNotFoundError(
                f"source {source.name}: source package {source.package!r} is not in the configured suites "
                f"({', '.join(suites)}) — the deb-src entries are derived from the machine's deb entries")
        raise DebianVersionNotFoundError(
            f"source {source.name}: version {source.version} of source package {source.package!r} is not in the "
            f"configured suites ({', '.join(suites)}); available: {', '.join(sorted(versions))}")
    return versions[source.version]


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
