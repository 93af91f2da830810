"""Bucketed spill files on local disk: the external-memory building block of the
snapshot-wide dedup steps (stage 4), in the shape of datatrove's MinHash buckets.

Records (one numpy structured dtype) are appended to ``buckets`` files by a bucket id the
caller computes from a hash (so equal keys always meet in one bucket); each bucket is
then read back alone. Memory is one append batch and a write buffer of
:data:`BUFFER_BYTES` while writing, one bucket while reading: the caller picks the bucket
count from a row budget (:func:`bucket_count`), so a bucket holds about ``bucket_rows``
records whatever the corpus size.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

#: Most buckets of one spill (a bucket count is a power of two up to it); a spill keeps no
#: file open between writes, so the count is not bounded by file handles.
MAX_BUCKETS = 4096


def bucket_count(rows: int, bucket_rows: int) -> int:
    """The power of two ``B`` (1 … :data:`MAX_BUCKETS`) of buckets for ``rows`` records so
    that a bucket holds about ``bucket_rows`` of them on uniformly spread keys. Raises
    ``ValueError`` for ``bucket_rows < 1``."""
    if bucket_rows < 1:
        raise ValueError(f"bucket_rows must be >= 1, got {bucket_rows}")
    need = max(1, -(-rows // bucket_rows))
    return min(MAX_BUCKETS, 1 << (need - 1).bit_length())


def bucket_of(key: np.ndarray, buckets: int) -> np.ndarray:
    """``int64[n]``: the bucket of each ``uint64`` key — its top ``log2(buckets)`` bits (the
    keys are hashes, so their top bits spread uniformly). ``buckets`` is a power of two."""
    bits = buckets.bit_length() - 1
    if bits == 0:
        return np.zeros(len(key), dtype=np.int64)
    return (np.asarray(key, dtype=np.uint64) >> np.uint64(64 - bits)).astype(np.int64)


#: Bytes of records a spill buffers in memory before appending them to their bucket files.
#: Implementation choice: large enough that a file is opened once per few MB written.
BUFFER_BYTES = 8 << 20


class BucketSpill:
    """``buckets`` (≥ 1) append-only files of ``dtype`` records under ``directory``.

    :meth:`add` buffers records by bucket (at most ``buffer_bytes``, default
    :data:`BUFFER_BYTES`, in all; no copy of
    earlier batches kept beyond it); a flush appends each bucket's buffer to its file,
    opened for that append only, so a spill holds no file handle between writes whatever
    its bucket count (the LSH step's key buckets number bands × buckets per band).
    :meth:`read` returns one bucket's records in append order; :meth:`close` flushes (the
    directory belongs to the caller, e.g. a stage's scratch). Append order is
    deterministic, so every bucket's content is."""

    def __init__(self, directory: str | os.PathLike, buckets: int, dtype: np.dtype, name: str = "bucket",
                 buffer_bytes: int | None = None):
        if buckets < 1:
            raise ValueError(f"bucket count must be >= 1, got {buckets}")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.buckets, self.dtype, self._name = buckets, np.dtype(dtype), name
        cap = BUFFER_BYTES if buffer_bytes is None else buffer_bytes
        self._limit = max(1, cap // max(1, self.dtype.itemsize))
        for b in range(buckets):  # empty files: a bucket nothing reaches reads back empty
            open(self._path(b), "wb").close()
        self._pending: dict[int, list[np.ndarray]] = {}
        self._held = 0
        self.records = 0

    def _path(self, b: int) -> Path:
        return self.dir / f"{self._name}-{b:05d}.bin"

    def add(self, bucket: np.ndarray, records: np.ndarray) -> None:
        """Append ``records`` (``dtype``, aligned with ``bucket``: ``int[n]`` ids in
        ``[0, buckets)``) to their buckets, keeping their relative order."""
        records = np.asarray(records, dtype=self.dtype)
        if not len(records):
            return
        if self.buckets == 1:
            self._pending.setdefault(0, []).append(records.copy())
        else:
            bucket = np.asarray(bucket)
            order = np.argsort(bucket, kind="stable")
            cuts = np.flatnonzero(np.diff(bucket[order])) + 1
            for part in np.split(order, cuts):
                self._pending.setdefault(int(bucket[part[0]]), []).append(records[part])
        self._held += len(records)
        self.records += len(records)
        if self._held >= self._limit:
            self.flush()

    def flush(self) -> None:
        """Append every buffered record to its bucket file (before reading)."""
        for b in sorted(self._pending):
            with open(self._path(b), "ab") as f:
                for part in self._pending[b]:
                    part.tofile(f)
        self._pending.clear()
        self._held = 0

    def read(self, b: int) -> np.ndarray:
        """Bucket ``b``'s records, in the order they were added."""
        if self._pending:
            self.flush()
        return np.fromfile(self._path(b), dtype=self.dtype)

    def close(self) -> None:
        """Flush what is buffered."""
        self.flush()

    def __enter__(self) -> "BucketSpill":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:  # an error: the files are the caller's scratch; drop the buffer
            self._pending.clear()
