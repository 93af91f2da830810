"""Stage 0 for ``local`` sources: a directory read in place (SPEC §3).

The directory is either ``path`` or, for ``python_package``, ``MODULE/SUBDIR`` inside an
installed distribution (located from the distribution's metadata; nothing is imported).
For ``python_package`` sources the distribution's top-level license files (its
``License-File`` metadata entries without a directory part, e.g. ``LICENSE``) are added at
the source root under their own names — unless the directory has a file of that name —
because the package directory itself rarely carries one (torch keeps its license in the
``.dist-info``), and the license stage applies a root license file to the whole tree.
The same rules as for archives apply: names must be valid UTF-8 without ``..``; symbolic
links pointing outside the directory, device files, FIFOs and sockets are refused; links
that stay inside are skipped (never followed); size and count limits hold. The revision
is the sha256 of the sorted file list with each file's content hash.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import stat
from pathlib import Path

from .archives import Acquired, AcquireError, ArchiveLimits, UnsafeArchiveError, _check_name, _check_sizes
from .manifest import Source


def local_root(source: Source) -> Path:
    """The directory a ``local`` source reads (absolute).

    Raises :class:`AcquireError` when the package is not installed or the directory does
    not exist.
    """
    if source.path:
        root = Path(source.path)
    else:
        try:
            dist = importlib.metadata.distribution(source.python_package)
        except importlib.metadata.PackageNotFoundError:
            raise AcquireError(f"source {source.name}: python package {source.python_package!r} is not installed") from None
        root = Path(dist.locate_file(source.module or source.python_package))
        if source.subdir:
            root = root / source.subdir
    if not root.is_dir():
        raise AcquireError(f"source {source.name}: directory {root} does not exist")
    return root.resolve()


def local_revision(files: list[tuple[str, bytes]]) -> str:
    """Hex sha256 of ``"PATH\\0CONTENT_SHA256\\n"`` over the files sorted by path."""
    h = hashlib.sha256()
    for p, data in sorted(files, key=lambda x: x[0]):
        h.update(p.encode("utf-8") + b"\0" + hashlib.sha256(data).hexdigest().encode() + b"\n")
    return h.hexdigest()


def read_directory(root: Path, limits: ArchiveLimits = ArchiveLimits()) -> list[tuple[str, bytes]]:
    """``(relative POSIX path, bytes)`` of every regular file under ``root``, sorted.

    Raises :class:`UnsafeArchiveError` (archive = the directory) for a link pointing
    outside, a device file, FIFO or socket, an undecodable name, or the count/size limits
    of :class:`ArchiveLimits` (the ratio limit does not apply to plain files). All
    entries are checked before any content is read.
    """
    label = str(root)
    members: list[tuple[str, Path]] = []
    total = 0
    count = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for entry in sorted(dirnames + filenames):
            full = Path(dirpath) / entry
            rel = full.relative_to(root).as_posix()
            count += 1
            if count > limits.max_entries:
                raise UnsafeArchiveError(label, rel, f"more than {limits.max_entries} entries")
            name = _check_name(label, rel)
            st = full.lstat()
            if stat.S_ISLNK(st.st_mode):
                target = os.path.realpath(full)
                if os.path.commonpath([target, str(root)]) != str(root):
                    raise UnsafeArchiveError(label, rel, f"link to {os.readlink(full)!r} points outside the directory")
                if entry in dirnames:
                    dirnames.remove(entry)  # never walk into a linked directory
                continue
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeArchiveError(label, rel, "device file, FIFO or socket")
            total += st.st_size
            _check_sizes(label, rel, st.st_size, total, float("inf"), limits)
            members.append((name, full))
    out = []
    for name, full in members:
        out.append((name, full.read_bytes()))
    return out


def distribution_license_files(package: str) -> list[tuple[str, bytes]]:
    """``(name, bytes)`` of an installed distribution's top-level ``License-File`` entries, sorted."""
    dist = importlib.metadata.distribution(package)
    out = []
    for entry in dist.metadata.get_all("License-File") or []:
        if "/" in entry or "\\" in entry:
            continue
        for candidate in (f"licenses/{entry}", entry):
            text = dist.read_text(candidate)
            if text is not None:
                out.append((entry, text.encode("utf-8")))
                break
    return sorted(out)


def acquire_local(source: Source, limits: ArchiveLimits = ArchiveLimits()) -> Acquired:
    """Read a ``local`` source in place; revision = :func:`local_revision` of its files
    (for ``python_package`` sources including the added distribution license files)."""
    root = local_root(source)
    files = read_directory(root, limits)
    if source.python_package:
        have = {p for p, _ in files}
        files = sorted(files + [(n, b) for n, b in distribution_license_files(source.python_package) if n not in have])
    return Acquired(files, local_revision(files), None, str(root), True)
