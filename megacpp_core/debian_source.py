"""Debian source packages read without ``dpkg-source`` (SPEC §3, the ``debian`` kind).

A source package is a ``.dsc`` and the files it lists (orig tarball, ``orig-COMPONENT``
tarballs, ``debian.tar.*`` or a ``1.0`` ``.diff.gz``). :func:`parse_dsc` reads the
``.dsc``; :func:`verify_dsc_files` checks every listed file's size and sha256;
:func:`read_source_package` lays the tarballs out as dpkg-source's ``3.0 (quilt)``
extraction would (see :mod:`megacpp_core.acquire_debian`) under the safe-extraction rules
of :func:`megacpp_core.archives.iter_archive`. Nothing is extracted to disk, no patch is
applied and nothing from the package runs.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .archives import (
    AcquireError,
    ArchiveLimits,
    HashMismatchError,
    UnsafeArchiveError,
    _check_name,
    _hash_file,
    iter_archive,
    strip_common_root,
)

#: (``Dpkg::Compression`` in bookworm's dpkg 1.21: gzip, bzip2, lzma, xz).
COMPRESSION_EXTENSIONS = ("gz", "bz2", "lzma", "xz")
#: Source formats read here (dpkg-source(1) "SOURCE PACKAGE FORMATS").
SUPPORTED_FORMATS = ("3.0 (quilt)", "3.0 (native)", "1.0")


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
