"""Bucketed spill files on local disk: the external-memory building block of the
snapshot-wide dedup steps (stage 4), in the shape of datatrove's MinHash buckets.

Records (one numpy structured dtype) are appended to ``buckets`` files by a bucket id the
caller computes from a hash (so equal keys always meet in one bucket); each bucket is
then read back alone. Memory is one append batch while writing and one bucket while
reading: the caller picks the bucket count from a row budget (:func:`bucket_count`), so a
bucket holds about ``bucket_rows`` records whatever the corpus size.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

#: Most buckets one spill opens (file handles; a bucket count is a power of two up to it).
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


class BucketSpill:
    """``buckets`` (≥ 1) append-only files of ``dtype`` records under ``directory``.

    :meth:`add` appends records to their buckets (``tofile``, no copy of earlier batches
    kept); :meth:`read` returns one bucket's records in append order; :meth:`close`
    closes the files (the directory belongs to the caller, e.g. a stage's scratch).
    Append order is deterministic, so every bucket's content is."""

    def __init__(self, directory: str | os.PathLike, buckets: int, dtype: np.dtype, name: str = "bucket"):
        if buckets < 1:
            raise ValueError(f"bucket count must be >= 1, got {buckets}")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.buckets, self.dtype, self._name = buckets, np.dtype(dtype), name
        self._files = [open(self._path(b), "wb") for b in range(buckets)]
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
            records.tofile(self._files[0])
        else:
            bucket = np.asarray(bucket)
            order = np.argsort(bucket, kind="stable")
            cuts = np.flatnonzero(np.diff(bucket[order])) + 1
            for part in np.split(order, cuts):
                records[part].tofile(self._files[int(bucket[part[0]])])
        self.records += len(records)

    def flush(self) -> None:
        """Flush every bucket file (before reading)."""
        for f in self._files:
            f.flush()

    def read(self, b: int) -> np.ndarray:
        """Bucket ``b``'s records, in the order they were added."""
        self._files[b].flush()
        return np.fromfile(self._path(b), dtype=self.dtype)

    def close(self) -> None:
        for f in self._files:
            f.close()

    def __enter__(self) -> "BucketSpill":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
