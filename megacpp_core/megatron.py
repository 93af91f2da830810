"""Stage 10: Megatron ``.bin/.idx`` indexed datasets (SPEC §7).

The pair is written with megatron-core's ``IndexedDatasetBuilder`` when it is importable and
by :class:`RawIndexedDatasetBuilder` otherwise; both produce byte-identical files. The index
layout (little-endian), as written by ``megatron.core.datasets.indexed_dataset._IndexWriter``:

====================  ==========================  ==========================================
field                 type                        meaning
====================  ==========================  ==========================================
magic                 9 bytes ``MMIDIDX\\0\\0``
version               uint64                      always 1
dtype code            uint8                       :data:`DTYPE_BY_CODE`
sequence count S      uint64
document count D      uint64                      entries of ``document_indices`` (docs + 1)
sequence lengths      int32[S]                    tokens per sequence
sequence pointers     int64[S]                    byte offset of each sequence in ``.bin``
document indices      int64[D]                    ``0``, then the end sequence of each document
sequence modes        int8[S], optional           multimodal datasets only
====================  ==========================  ==========================================

The ``.bin`` is the concatenation of all sequences in the index dtype. Our documents are one
sequence each, so ``document_indices == arange(S + 1)``.

Both builders also append a whole existing dataset with ``add_index`` (megatron-core's
``IndexedDatasetBuilder.add_index`` is the source of that format: the other ``.bin`` bytes
are copied after ours, its sequence lengths appended, and its document indices after the
leading 0 appended offset by our sequence count); :mod:`megacpp_core.megatron_merge` builds
the per-shard merge on it.
"""

from __future__ import annotations

import os
import shutil
import struct
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from megacpp_core.tables import sha256_file

#: Index magic, from megatron-core ``indexed_dataset._INDEX_HEADER``.
INDEX_MAGIC = b"MMIDIDX\x00\x00"
#: The only index version megatron-core writes or reads.
INDEX_VERSION = 1
#: magic (9) + version (8) + dtype code (1) + sequence count (8) + document count (8).
INDEX_HEADER_BYTES = 34
_HEADER = struct.Struct("<9sQBQQ")
#: Dtype codes, from megatron-core ``indexed_dataset.DType``. There is no uint32 code.
DTYPE_BY_CODE: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
CODE_BY_DTYPE: dict[np.dtype, int] = {dt: code for code, dt in DTYPE_BY_CODE.items()}
#: Vocabularies at or above this size need int32 ids; from megatron-core ``DType.optimal_dtype``.
UINT16_VOCAB_LIMIT = 65500
BACKENDS = ("auto", "megatron", "raw")
#: Bytes per read/write when ``add_index`` copies another ``.bin`` (16 MiB; memory stays bounded).
COPY_CHUNK_BYTES = 16 << 20


class IndexFormatError(ValueError):
    """A ``.idx`` file that is not a well-formed Megatron index; the message names the file."""


class IndexDtypeMismatchError(ValueError):
    """An index appended with ``add_index`` whose token dtype differs from the builder's.

    megatron-core only checks this with ``assert index.dtype == self.dtype``; we raise this
    instead, naming the file and both dtypes, before anything is appended.
    """


def megatron_dtype(vocab_size: int) -> np.dtype:
    """Token dtype for a vocabulary of ``vocab_size`` ids.

    ``uint16`` below :data:`UINT16_VOCAB_LIMIT` (65,500, megatron-core's cut-off), ``int32``
    from there on: the index has no uint32 code. Raises ``ValueError`` unless
    ``0 < vocab_size <= 2**31`` (every id must fit int32).
    """
    if not 0 < vocab_size <= 2**31:
        raise ValueError(f"vocab_size {vocab_size} outside (0, 2**31]")
    return np.dtype(np.uint16 if vocab_size < UINT16_VOCAB_LIMIT else np.int32)


def bin_path(prefix: str | os.PathLike) -> Path:
    """``prefix.bin`` (suffix appended, as in megatron-core ``get_bin_path``)."""
    return Path(f"{os.fspath(prefix)}.bin")


def idx_path(prefix: str | os.PathLike) -> Path:
    """``prefix.idx`` (suffix appended, as in megatron-core ``get_idx_path``)."""
    return Path(f"{os.fspath(prefix)}.idx")


class RawIndexedDatasetBuilder:
    """Pure numpy/struct twin of megatron-core's ``IndexedDatasetBuilder`` (non-multimodal).

    Same protocol: ``add_item`` appends one sequence (1-D array, cast to ``dtype``) to the
    ``.bin``; ``end_document`` closes a document after the sequences added so far;
    ``add_index(prefix)`` appends a whole existing dataset; ``finalize(idx_path)`` closes
    the ``.bin`` and writes the index. Output is byte-identical to megatron-core 0.16.1.
    Raises ``ValueError`` for a dtype with no index code (e.g. uint32).

    The index is held as numpy chunks (int32 lengths, int64 document indices: 12 bytes per
    appended sequence, plus a Python int per ``add_item``/``end_document`` since the last
    ``add_index``); ``.bin`` bytes are never held beyond one :data:`COPY_CHUNK_BYTES` copy.
    """

    def __init__(self, bin_path: str | os.PathLike, dtype: np.dtype | type) -> None:
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODE_BY_DTYPE:
            raise ValueError(f"dtype {self.dtype} has no Megatron index code")
        self._bin = open(bin_path, "wb")
        self._count = 0  # sequences so far
        self._lengths: list[int] = []  # pending add_item lengths, after _length_chunks
        self._document_indices: list[int] = [0]  # pending, after _document_chunks
        self._length_chunks: list[np.ndarray] = []
        self._document_chunks: list[np.ndarray] = []

    def add_item(self, tokens: np.ndarray) -> None:
        """Append one sequence; ``tokens`` is cast (unchecked) to the builder dtype."""
        arr = np.asarray(tokens, dtype=self.dtype)
        self._bin.write(arr.tobytes(order="C"))
        self._lengths.append(arr.size)
        self._count += 1

    def end_document(self) -> None:
        """Mark the end of a document at the current sequence count."""
        self._document_indices.append(self._count)

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append ``len(lengths)`` sequences, each its own document, from their
        concatenation ``tokens`` (1-D, cast unchecked to the builder dtype) in one write:
        the bytes ``add_item`` then ``end_document`` per sequence give, without a Python
        step per sequence (as in ``add_index``, sequences added since the last
        ``end_document`` join the first of these documents). ``ValueError`` when
        ``lengths`` (non-negative) do not add up to ``tokens.size``; nothing is written then."""
        lengths = np.asarray(lengths, dtype=np.int64)
        arr = np.ascontiguousarray(tokens, dtype=self.dtype)
        if arr.ndim != 1 or lengths.ndim != 1 or (lengths.size and int(lengths.min()) < 0) or int(lengths.sum()) != arr.size:
            raise ValueError(f"add_documents: {arr.size} tokens (shape {arr.shape}) do not split into lengths "
                             f"summing to {int(lengths.sum())}")
        self._bin.write(arr)
        self._flush()
        self._length_chunks.append(lengths.astype(np.int32))
        self._document_chunks.append(np.arange(self._count + 1, self._count + lengths.size + 1, dtype=np.int64))
        self._count += lengths.size

    def add_index(self, path_prefix: str | os.PathLike) -> None:
        """Append the whole dataset ``path_prefix.bin``/``.idx`` (megatron-core's ``add_index``).

        Byte-identical twin of megatron-core 0.16.1 ``IndexedDatasetBuilder.add_index``: the
        other's int32[S'] sequence lengths are appended, its int64[D'] document indices
        without the leading 0 are appended plus our sequence count S (so sequences added
        since the last ``end_document`` join the first appended document, as in
        megatron-core), and its ``.bin`` is copied after ours in :data:`COPY_CHUNK_BYTES`
        (16 MiB) reads, never whole. The other pair is validated first by
        :func:`read_shard_index`: ``FileNotFoundError`` (naming the path) for a missing
        ``.idx``/``.bin``, ``IndexFormatError`` for a malformed index,
        :class:`IndexDtypeMismatchError` when its dtype is not the builder's, ``ValueError``
        for a multimodal index or a ``.bin`` whose size disagrees with the index. Nothing is
        appended when it raises.
        """
        info = read_shard_index(path_prefix, self.dtype)
        self._flush()
        self._length_chunks.append(info.sequence_lengths.astype(np.int32))
        self._document_chunks.append(info.document_indices[1:] + self._count)
        self._count += info.sequence_count
        del info
        with open(bin_path(path_prefix), "rb") as f:
            shutil.copyfileobj(f, self._bin, COPY_CHUNK_BYTES)

    def _flush(self) -> None:
        """Move the pending Python-int lists onto the numpy chunk lists."""
        self._length_chunks.append(np.asarray(self._lengths, dtype=np.int32))
        self._document_chunks.append(np.asarray(self._document_indices, dtype=np.int64))
        self._lengths, self._document_indices = [], []

    def finalize(self, idx_path: str | os.PathLike) -> None:
        """Close the ``.bin`` and write the index to ``idx_path``."""
        self._bin.close()
        self._flush()
        lengths = np.concatenate(self._length_chunks)
        document_indices = np.concatenate(self._document_chunks)
        self._length_chunks, self._document_chunks = [lengths], [document_indices]
        pointers = np.zeros(lengths.size, dtype=np.int64)
        np.cumsum(lengths[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        with open(idx_path, "wb") as f:
            f.write(_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, CODE_BY_DTYPE[self.dtype],
                                 lengths.size, document_indices.size))
            for arr in (lengths, pointers, document_indices):
                f.write(arr.tobytes(order="C"))

    def close(self) -> None:
        """Close the ``.bin`` without writing an index (used on failure)."""
        self._bin.close()


class _MegatronBuilder:
    """Adapter giving megatron-core's builder the :class:`RawIndexedDatasetBuilder` protocol."""

    def __init__(self, bin_path: Path, dtype: np.dtype) -> None:
        builder_cls = _megatron_builder_class()
        if builder_cls is None:
            raise ImportError("backend='megatron' requested but megatron-core is not importable")
        import torch

        self._torch = torch
        self.dtype = np.dtype(dtype)
        # The builder keys its dtype code on the scalar type's __name__: pass np.int32, not np.dtype.
        self._builder = builder_cls(str(bin_path), dtype=self.dtype.type)

    def add_item(self, tokens: np.ndarray) -> None:
        """Append one sequence (already in the builder dtype)."""
        self._builder.add_item(self._torch.from_numpy(np.ascontiguousarray(tokens)))

    def end_document(self) -> None:
        """Mark the end of a document."""
        self._builder.end_document()

    def add_index(self, path_prefix: str | os.PathLike) -> None:
        """Append a whole dataset with megatron-core's own ``IndexedDatasetBuilder.add_index``.

        The pair is validated first exactly as in :meth:`RawIndexedDatasetBuilder.add_index`
        (same errors; megatron-core itself only asserts the dtype and would silently drop a
        multimodal index's modes). megatron-core copies the ``.bin`` with
        ``shutil.copyfileobj`` (64 KiB reads) and keeps the index as Python lists.
        """
        read_shard_index(path_prefix, self.dtype)
        self._builder.add_index(os.fspath(path_prefix))

    def finalize(self, idx_path: Path) -> None:
        """Close the ``.bin`` and write the index."""
        self._builder.finalize(str(idx_path))

    def close(self) -> None:
        """Close the ``.bin`` without writing an index."""
        self._builder.data_file.close()


def _megatron_builder_class():
    """megatron-core's ``IndexedDatasetBuilder``, or None when megatron-core/torch is missing.

    Importing it imports all of ``megatron.core`` (seconds, plus "Transformer Engine and Apex
    are not installed" UserWarnings, which are silenced here).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            import torch  # noqa: F401
            from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    except ImportError:
        return None
    return IndexedDatasetBuilder


def resolve_backend(backend: str) -> str:
    """``"megatron"`` or ``"raw"`` for ``backend`` in :data:`BACKENDS`; ``"auto"`` picks
    megatron-core when importable. Raises ``ValueError`` for an unknown backend."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} not in {BACKENDS}")
    if backend == "auto":
        return "megatron" if _megatron_builder_class() is not None else "raw"
    return backend


@contextmanager
def atomic_builder(prefix: str | os.PathLike, dtype: np.dtype, backend: str) -> Iterator[tuple]:
    """Yield ``(builder, tmp_bin, tmp_idx)`` for a pair published at ``prefix`` on success.

    ``backend`` is ``"megatron"`` or ``"raw"`` (see :func:`resolve_backend`). The body fills
    the builder and calls ``builder.finalize(tmp_idx)``. On a clean exit both ``.tmp`` files
    are renamed into place, the ``.idx`` last (a stale one is removed first), so an ``.idx``
    under its final name always has its ``.bin``; on any error the builder is closed, the
    temp files removed and an existing pair left untouched. ``ImportError`` for
    ``"megatron"`` without megatron-core (nothing is created but the parent directory).
    """
    final_bin, final_idx = bin_path(prefix), idx_path(prefix)
    tmp_bin = final_bin.with_name(final_bin.name + ".tmp")
    tmp_idx = final_idx.with_name(final_idx.name + ".tmp")
    final_bin.parent.mkdir(parents=True, exist_ok=True)
    builder = (_MegatronBuilder if backend == "megatron" else RawIndexedDatasetBuilder)(tmp_bin, dtype)
    try:
        yield builder, tmp_bin, tmp_idx
    except BaseException:
        builder.close()
        tmp_bin.unlink(missing_ok=True)
        tmp_idx.unlink(missing_ok=True)
        raise
    final_idx.unlink(missing_ok=True)
    os.replace(tmp_bin, final_bin)
    os.replace(tmp_idx, final_idx)


def _checked_document(doc: np.ndarray, i: int, vocab_size: int) -> np.ndarray:
    """``doc`` as a 1-D integer array with ids in ``[0, vocab_size)``; ``ValueError`` otherwise."""
    arr = np.asarray(doc)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"document {i}: expected a 1-D integer array, "
                         f"got shape {arr.shape} dtype {arr.dtype}")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0:
            raise ValueError(f"document {i}: negative token id {lo}")
        if hi >= vocab_size:
            raise ValueError(f"document {i}: token id {hi} >= vocab_size {vocab_size}")
    return arr


def write_indexed_dataset(
    prefix: str | os.PathLike,
    documents: Iterable[np.ndarray],
    vocab_size: int,
    backend: str = "auto",
) -> dict:
    """Write ``prefix.bin``/``prefix.idx`` with one sequence per document, atomically.

    ``documents`` yields one 1-D integer array per document (uint32 ids from our tokenizer,
    leading BOS included); it is consumed once, streaming. Ids are stored as
    :func:`megatron_dtype` (``vocab_size``). ``backend``: ``"megatron"`` (megatron-core's
    builder), ``"raw"`` (:class:`RawIndexedDatasetBuilder`) or ``"auto"`` (megatron-core when
    importable, else raw); the bytes are identical either way.

    Both files are written under ``.tmp`` names and renamed into place only after every
    document is written; the ``.idx`` is renamed last (a stale one is removed first), so an
    ``.idx`` under its final name always has its ``.bin`` in place. On any error the temp
    files are removed and an existing pair is left untouched.

    Returns ``{"sequences", "documents", "tokens", "dtype", "backend", "bin_sha256",
    "idx_sha256"}``. Raises ``ValueError`` for an unknown backend, a bad ``vocab_size``, or a
    document that is not a 1-D integer array or holds an id < 0 or >= ``vocab_size`` (naming
    the document index); ``ImportError`` for ``backend="megatron"`` without megatron-core.
    """
    backend = resolve_backend(backend)
    dtype = megatron_dtype(vocab_size)
    count = tokens = 0
    with atomic_builder(prefix, dtype, backend) as (builder, _, tmp_idx):
        for i, doc in enumerate(documents):
            arr = _checked_document(doc, i, vocab_size)
            builder.add_item(arr.astype(dtype, copy=False))
            builder.end_document()
            count += 1
            tokens += arr.size
        builder.finalize(tmp_idx)
    final_bin, final_idx = bin_path(prefix), idx_path(prefix)
    return {
        "sequences": count,
        "documents": count,
        "tokens": tokens,
        "dtype": dtype.name,
        "backend": backend,
        "bin_sha256": sha256_file(final_bin),
        "idx_sha256": sha256_file(final_idx),
    }


@dataclass
class IndexInfo:
    """A parsed, validated Megatron index.

    ``sequence_lengths`` int32[S] (tokens), ``sequence_pointers`` int64[S] (bytes into the
    ``.bin``), ``document_indices`` int64[D] (sequence index where each document ends,
    starting with 0), ``sequence_modes`` int8[S] or None.
    """

    path: Path
    dtype_code: int
    dtype: np.dtype
    sequence_lengths: np.ndarray
    sequence_pointers: np.ndarray
    document_indices: np.ndarray
    sequence_modes: np.ndarray | None = None

    @property
    def sequence_count(self) -> int:
        """Number of sequences S."""
        return int(self.sequence_lengths.size)

    @property
    def document_count(self) -> int:
        """Number of documents (``len(document_indices) - 1``)."""
        return int(self.document_indices.size) - 1

    @property
    def token_count(self) -> int:
        """Total tokens, ``sum(sequence_lengths)``."""
        return int(self.sequence_lengths.sum(dtype=np.int64))

    @property
    def bin_bytes(self) -> int:
        """Size the ``.bin`` must have: total tokens × itemsize, in bytes."""
        return self.token_count * self.dtype.itemsize


def read_index(idx_path: str | os.PathLike) -> IndexInfo:
    """Parse and validate a Megatron ``.idx`` file (our parser; megatron-core's only asserts).

    Checks: magic, version == 1, a known dtype code, a file size that matches the header
    counts exactly (with or without an int8 sequence-modes tail), non-negative lengths,
    pointers equal to the running sum of lengths × itemsize, and document indices that start
    at 0, never decrease and end at the sequence count. Raises ``IndexFormatError`` naming
    the file and the broken rule; ``FileNotFoundError`` when it is missing.
    """
    path = Path(idx_path)
    size = path.stat().st_size

    def bad(what: str) -> IndexFormatError:
        return IndexFormatError(f"{path}: {what}")

    with open(path, "rb") as f:
        head = f.read(INDEX_HEADER_BYTES)
        if len(head) < INDEX_HEADER_BYTES:
            raise bad(f"{size} bytes, shorter than the {INDEX_HEADER_BYTES}-byte header")
        magic, version, code, n_seq, n_doc = _HEADER.unpack(head)
        if magic != INDEX_MAGIC:
            raise bad(f"bad magic {magic!r}, expected {INDEX_MAGIC!r}")
        if version != INDEX_VERSION:
            raise bad(f"unsupported version {version}, expected {INDEX_VERSION}")
        if code not in DTYPE_BY_CODE:
            raise bad(f"unknown dtype code {code}, expected one of {sorted(DTYPE_BY_CODE)}")
        expected = INDEX_HEADER_BYTES + n_seq * (4 + 8) + n_doc * 8
        has_modes = n_seq > 0 and size == expected + n_seq
        if size != expected and not has_modes:
            raise bad(f"{size} bytes, but {n_seq} sequences and {n_doc} document indices "
                      f"require {expected} (or {expected + n_seq} with sequence modes)")
        lengths = np.fromfile(f, dtype="<i4", count=n_seq).astype(np.int32)
        pointers = np.fromfile(f, dtype="<i8", count=n_seq).astype(np.int64)
        doc_indices = np.fromfile(f, dtype="<i8", count=n_doc).astype(np.int64)
        modes = np.fromfile(f, dtype=np.int8, count=n_seq) if has_modes else None

    dtype = DTYPE_BY_CODE[code]
    if n_seq and lengths.min() < 0:
        raise bad(f"negative sequence length at sequence {int(np.argmax(lengths < 0))}")
    want = np.zeros(n_seq, dtype=np.int64)
    np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize, out=want[1:])
    if not np.array_equal(pointers, want):
        j = int(np.argmax(pointers != want))
        raise bad(f"sequence pointer {j} is {int(pointers[j])}, expected {int(want[j])} "
                  f"(running sum of lengths x itemsize {dtype.itemsize})")
    if n_doc == 0 or doc_indices[0] != 0:
        raise bad("document indices must start with 0")
    if np.any(np.diff(doc_indices) < 0):
        raise bad(f"document indices decrease at entry {int(np.argmax(np.diff(doc_indices) < 0)) + 1}")
    if doc_indices[-1] != n_seq:
        raise bad(f"document indices end at {int(doc_indices[-1])}, expected the sequence count {n_seq}")
    return IndexInfo(path, code, dtype, lengths, pointers, doc_indices, modes)


def read_shard_index(prefix: str | os.PathLike, dtype: np.dtype | type) -> IndexInfo:
    """:func:`read_index` of ``prefix.idx``, checked for appending to a ``dtype`` builder.

    Beyond :func:`read_index`'s checks: the index dtype must be ``dtype``
    (:class:`IndexDtypeMismatchError`, naming the file and both dtypes), it must have no
    int8 sequence-modes tail (``ValueError``: multimodal datasets are not merged), and
    ``prefix.bin`` must be exactly :attr:`IndexInfo.bin_bytes` long (``ValueError`` naming
    it). ``FileNotFoundError`` (its message names the path) for a missing ``.idx`` or
    ``.bin``; ``IndexFormatError`` for a malformed index.
    """
    want = np.dtype(dtype)
    info = read_index(idx_path(prefix))
    if info.dtype != want:
        raise IndexDtypeMismatchError(f"{info.path}: index dtype {info.dtype.name} "
                                      f"(code {info.dtype_code}), expected {want.name}")
    if info.sequence_modes is not None:
        raise ValueError(f"{info.path}: multimodal index (sequence modes) cannot be appended")
    path = bin_path(prefix)
    size = path.stat().st_size
    if size != info.bin_bytes:
        raise ValueError(f"{path}: {size} bytes, but {info.path} describes {info.token_count} "
                         f"{want.name} tokens = {info.bin_bytes} bytes")
    return info


def read_document(prefix: str | os.PathLike, i: int, index: IndexInfo | None = None) -> np.ndarray:
    """Token ids of document ``i`` (1-D, index dtype), read through a memmap of ``prefix.bin``.

    ``index`` reuses an already parsed :func:`read_index` result. Raises ``IndexError`` when
    ``i`` is out of range, ``IndexFormatError`` for a bad index, and ``ValueError`` when the
    ``.bin`` is too short for the document.
    """
    info = index if index is not None else read_index(idx_path(prefix))
    if not 0 <= i < info.document_count:
        raise IndexError(f"{info.path}: document {i} out of range [0, {info.document_count})")
    first, last = int(info.document_indices[i]), int(info.document_indices[i + 1])
    count = int(info.sequence_lengths[first:last].sum(dtype=np.int64))
    if count == 0:
        return np.empty(0, dtype=info.dtype)
    mm = np.memmap(bin_path(prefix), dtype=info.dtype, mode="r",
                   offset=int(info.sequence_pointers[first]), shape=(count,))
    return np.array(mm)
