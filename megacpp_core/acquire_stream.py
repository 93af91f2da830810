"""Stage 0 as a stream: a revision's shards written in bounded batches (SPEC §3).

The acquire stage (:mod:`megacpp_core.stages.acquire`) never holds a whole revision of a
source fetched as one archive (``pypi``, ``archive``, ``git``):

1. **Names and sizes.** :class:`ArchiveTree` opens the archive with
   :class:`~megacpp_core.archives.ArchiveReader`, which checks every member under the
   safe-extraction rules before any content is read, and keeps only the member paths
   (the common top directory stripped for sdists and archives) and their sizes. They give
   the shard count and each file's shard (:mod:`megacpp_core.sharding`), the figures and
   the shard plan.
2. **Contents, shard by shard.** :func:`write_shards` writes each shard's
   ``source_files`` parquet, rows sorted by path as
   :func:`~megacpp_core.acquire.source_files_table` sorts them, through
   :class:`~megacpp_core.tables.ParquetStream`: a batch is appended every
   :data:`BATCH_ROWS` rows or as soon as it holds :data:`BATCH_BYTES` of content (a
   larger file is a batch of its own). A zip or an uncompressed tar (a git tree) is read
   member by member in that order; a compressed tar, which can only be read in archive
   order, is first copied member by member (:data:`SPILL_CHUNK` at a time) into one local spill file
   and read back from it by offset.

Memory is one batch plus the largest file (at most ``ArchiveLimits.max_member_bytes``),
not the revision. Local scratch disk holds the shard files and, for a compressed tar,
the spill file (the revision's raw bytes, at most ``ArchiveLimits.max_total_bytes``);
nothing is extracted as files. A batch of :data:`BATCH_ROWS` rows is one row group of
the shard file, so a shard whose every 1,024 rows hold less than :data:`BATCH_BYTES` is
byte-identical to the whole shard table written at once
(:func:`~megacpp_core.tables.write_parquet_to`).

``local`` and ``debian`` sources are still read into memory by
:func:`megacpp_core.acquire.acquire_source` (a directory's revision hashes every file
before the first row can be written; a Debian package overlays several tarballs) and
written through the same :func:`write_shards` from a :class:`MemoryTree`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import pyarrow as pa

from . import acquire, sharding
from .archives import Acquired, ArchiveLimits, ArchiveReader, ArchiveSource, UnsafeArchiveError, common_root
from .manifest import Source
from .tables import ROW_GROUP_SIZE, ParquetStream

#: Rows per write batch of a shard file (one parquet row group, SPEC §6's 1,024).
BATCH_ROWS = ROW_GROUP_SIZE
#: Content bytes after which a write batch is appended to its shard file (8 MiB): with
#: :data:`BATCH_ROWS` the bound of what the stage holds besides one file.
BATCH_BYTES = 8 << 20
#: Bytes copied at a time from a compressed tar into the spill file.
SPILL_CHUNK = 256 << 10
#: File name of a shard's ``source_files`` under the output directory's ``SHARD/``.
SHARD_FILE = "source_files.parquet"


class Tree(Protocol):
    """The files of one revision: ``paths`` (POSIX, inside the revision) and ``sizes``
    (bytes) by index, contents read one file at a time with ``read(i)``."""

    paths: list[str]
    sizes: list[int]

    def read(self, i: int) -> bytes: ...


class MemoryTree:
    """A :class:`Tree` over files already in memory (``[(path, bytes)]``, any order)."""

    def __init__(self, files: Sequence[tuple[str, bytes]]):
        self.paths = [p for p, _ in files]
        self.sizes = [len(b) for _, b in files]
        self._data = [b for _, b in files]

    def read(self, i: int) -> bytes:
        """The bytes of file ``i``."""
        return self._data[i]


class ArchiveTree:
    """A :class:`Tree` over a fetched archive (see the module docstring); a context manager
    that closes the archive and removes its spill file.

    Opening runs every safe-extraction check of
    :class:`~megacpp_core.archives.ArchiveReader` (raising
    :class:`~megacpp_core.archives.UnsafeArchiveError` or
    :class:`~megacpp_core.archives.AcquireError` before any content is read).
    ``spill_dir`` is a local directory for the spill file of a compressed tar.
    """

    def __init__(self, arc: ArchiveSource, limits: ArchiveLimits, spill_dir: Path):
        self._reader = ArchiveReader(arc.path, limits, arc.label)
        names = [n for n, _ in self._reader.members]
        strip = arc.strip_root and common_root(names) is not None
        self.paths = [n.split("/", 1)[1] for n in names] if strip else names
        self.sizes = [s for _, s in self._reader.members]
        self._spill_path = Path(spill_dir) / "contents.spill"
        self._spill = None
        self._offsets: list[int] = []

    def read(self, i: int) -> bytes:
        """The bytes of file ``i`` (the spill file is written on the first read of a
        compressed tar). Raises :class:`~megacpp_core.archives.UnsafeArchiveError` when
        a member's content differs in size from its header."""
        if self._reader.random_access:
            return self._reader.read(i)
        if self._spill is None:
            self._write_spill()
        data = os.pread(self._spill.fileno(), self.sizes[i], self._offsets[i])
        if len(data) != self.sizes[i]:
            raise UnsafeArchiveError(self._reader.archive, self._reader.members[i][0], "size differs from its header")
        return data

    def _write_spill(self) -> None:
        self._spill_path.parent.mkdir(parents=True, exist_ok=True)
        self._spill = open(self._spill_path, "w+b")
        for i, (name, size) in enumerate(self._reader.members):
            start = self._spill.tell()
            with self._reader.open_member(i) as member:
                shutil.copyfileobj(member, self._spill, SPILL_CHUNK)
            if self._spill.tell() - start != size:
                raise UnsafeArchiveError(self._reader.archive, name, "size differs from its header")
            self._offsets.append(start)
        self._spill.flush()

    def close(self) -> None:
        """Close the archive and remove the spill file."""
        self._reader.close()
        if self._spill is not None:
            self._spill.close()
        self._spill_path.unlink(missing_ok=True)

    def __enter__(self) -> "ArchiveTree":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def open_tree(source: Source, cache_root: Path, spill_dir: Path,
              limits: ArchiveLimits | None = None) -> Iterator[tuple[Tree, Acquired]]:
    """``(tree, provenance)`` of a source: an :class:`ArchiveTree` for
    :data:`~megacpp_core.acquire.ARCHIVE_KINDS`, else a :class:`MemoryTree` of
    :func:`~megacpp_core.acquire.acquire_source`; ``provenance`` is the
    :class:`~megacpp_core.archives.Acquired` record with no files (revision, origin, …).

    Raises what fetching and the safe-extraction checks raise
    (:class:`~megacpp_core.archives.AcquireError` and its subclasses) before anything is
    read or written.
    """
    limits = limits or ArchiveLimits()
    if source.kind not in acquire.ARCHIVE_KINDS:
        got = acquire.acquire_source(source, cache_root, limits)
        yield MemoryTree(got.files), dataclasses.replace(got, files=[])
        return
    arc = acquire.fetch_archive_source(source, cache_root)
    with ArchiveTree(arc, limits, spill_dir) as tree:
        yield tree, Acquired([], arc.revision, arc.archive_sha256, arc.origin, arc.from_cache, arc.pin_ok)


@dataclasses.dataclass
class WrittenShards:
    """What :func:`write_shards` wrote: ``files`` ``{shard key: local parquet path}`` for
    every shard (``n`` of them, keys ``000``…), per shard its file count and content bytes,
    and the number of write ``batches`` over all shards."""

    files: dict[str, Path]
    n: int
    shard_files: list[int]
    shard_bytes: list[int]
    batches: int


def sorted_indices(tree: Tree) -> list[int]:
    """The indices of ``tree``'s files in path order (the order of every ``source_files`` table)."""
    return sorted(range(len(tree.paths)), key=tree.paths.__getitem__)


def write_shards(tree: Tree, snapshot: str, source: Source, provenance: Acquired, shard_bytes: int,
                 out_dir: Path) -> WrittenShards:
    """Write the ``source_files`` shards of a revision to ``out_dir/SHARD/source_files.parquet``.

    The shard count and each file's shard come from ``tree.paths``/``tree.sizes`` and
    ``shard_bytes`` (:func:`megacpp_core.sharding.assign`); each shard's rows (the columns
    of :func:`megacpp_core.acquire.source_files_table`, provenance from ``provenance``) are
    in path order and appended in batches of at most :data:`BATCH_ROWS` rows and
    :data:`BATCH_BYTES` content bytes (or one file). A shard without files is a parquet file
    with no rows. Raises ``ValueError`` when the revision needs more than
    :data:`~megacpp_core.sharding.MAX_SHARDS` shards, and whatever ``tree.read`` raises.
    """
    n, shard_of = sharding.assign(tree.paths, tree.sizes, shard_bytes)
    members: list[list[int]] = [[] for _ in range(n)]
    for i in sorted_indices(tree):
        members[shard_of[i]].append(i)
    files, counts, nbytes, batches = {}, [], [], 0
    for s, idx in enumerate(members):
        key = sharding.shard_key(s)
        path = Path(out_dir) / key / SHARD_FILE
        with ParquetStream(path, acquire.SOURCE_FILES_SCHEMA) as out:
            batch: list[tuple[str, bytes]] = []
            held = 0
            for j, i in enumerate(idx):
                batch.append((tree.paths[i], tree.read(i)))
                held += tree.sizes[i]
                if len(batch) >= BATCH_ROWS or held >= BATCH_BYTES or j == len(idx) - 1:
                    rows = acquire.source_files_table(snapshot, source, dataclasses.replace(provenance, files=batch))
                    batch, held = [], 0  # the bytes live on in the table only while it is written
                    out.write(rows)
                    del rows
                    batches += 1
            if not idx:
                out.write(acquire.SOURCE_FILES_SCHEMA.empty_table())
        files[key] = path
        counts.append(len(idx))
        nbytes.append(sum(tree.sizes[i] for i in idx))
    return WrittenShards(files, n, counts, nbytes, batches)


def license_texts(tree: Tree) -> pa.Table:
    """The ``license_texts`` table of a revision (:data:`~megacpp_core.acquire.LICENSE_TEXTS_SCHEMA`):
    its files that are :func:`~megacpp_core.acquire.is_license_evidence`, in path order
    (what :func:`~megacpp_core.acquire.license_texts_table` takes from the whole table)."""
    take = [i for i in sorted_indices(tree) if acquire.is_license_evidence(tree.paths[i], tree.sizes[i])]
    return pa.table({"path": [tree.paths[i] for i in take], "size": [tree.sizes[i] for i in take],
                     "content": [tree.read(i) for i in take]}, schema=acquire.LICENSE_TEXTS_SCHEMA)
