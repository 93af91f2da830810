"""Per-shard Megatron index merge: many ``.bin/.idx`` pairs into one, in order (SPEC §7).

The merged format is megatron-core's ``IndexedDatasetBuilder.add_index`` (megatron-core
0.16.1, ``megatron/core/datasets/indexed_dataset.py``), applied to each shard in turn: the
merged ``.bin`` is the shards' ``.bin`` bytes concatenated, the merged index holds their
int32 sequence lengths concatenated, int64 sequence pointers recomputed as the running sum
of lengths x itemsize, and int64 document indices ``[0]`` followed by each shard's document
indices after its leading 0, offset by the sequences before it. Merging shards written by
:func:`~megacpp_core.megatron.write_indexed_dataset` therefore gives the bytes one
``write_indexed_dataset`` of all their documents would.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from megacpp_core import megatron
from megacpp_core.tables import sha256_file


def merge_indexed_datasets(
    prefixes: Sequence[str | os.PathLike],
    out_prefix: str | os.PathLike,
    vocab_size: int,
    *,
    backend: str = "auto",
) -> dict:
    """Merge the datasets at ``prefixes`` (in that order) into ``out_prefix.bin``/``.idx``.

    Each shard is a ``prefix.bin``/``prefix.idx`` pair whose dtype must be
    :func:`~megacpp_core.megatron.megatron_dtype` (``vocab_size``) (uint16 below 65,500 ids,
    int32 from there). ``backend``: ``"megatron"`` (megatron-core's
    ``IndexedDatasetBuilder.add_index``), ``"raw"``
    (:meth:`~megacpp_core.megatron.RawIndexedDatasetBuilder.add_index`) or ``"auto"``
    (megatron-core when importable, else raw); the bytes are identical either way.

    Every shard index is validated before anything is written
    (:func:`~megacpp_core.megatron.read_shard_index`). ``.bin`` bytes are streamed, never
    read whole: copied in chunks (16 MiB raw, 64 KiB megatron-core), then the merged
    ``.bin`` is read once more in :data:`~megacpp_core.megatron.COPY_CHUNK_BYTES` chunks to
    hash it and check every id is in ``[0, vocab_size)``. The index is held in memory
    (O(total sequences)). Output is atomic as in ``write_indexed_dataset``: temp files are
    renamed into place only after the check; on any error they are removed and an existing
    ``out_prefix`` pair is left untouched. ``out_prefix`` may be one of ``prefixes``.

    Zero shards, or shards with no documents, are allowed: zero shards give the same empty
    pair (0 sequences, ``document_indices == [0]``, 0-byte ``.bin``) as
    ``write_indexed_dataset(out_prefix, [], vocab_size)``, and an empty shard adds nothing.
    (megatron-core's ``IndexedDataset`` cannot mmap a 0-byte ``.bin``, for either function.)

    Returns the figures of ``write_indexed_dataset``: ``{"sequences", "documents", "tokens",
    "dtype", "backend", "bin_sha256", "idx_sha256"}`` (counts summed over the shards, dtype
    name, resolved backend, hex SHA-256 of the merged files).

    Raises ``TypeError`` when ``prefixes`` is a single path rather than a sequence of them;
    ``ValueError`` for an unknown backend, a bad ``vocab_size``, or a token id outside
    ``[0, vocab_size)`` (naming the shard); ``FileNotFoundError`` naming a missing ``.idx``
    or ``.bin``; ``IndexFormatError`` for a malformed shard index;
    :class:`~megacpp_core.megatron.IndexDtypeMismatchError` for a shard of another dtype;
    ``ValueError`` for a multimodal shard or a ``.bin`` whose size disagrees with its index;
    ``ImportError`` for ``backend="megatron"`` without megatron-core.
    """
    if isinstance(prefixes, (str, bytes, os.PathLike)):
        raise TypeError(f"prefixes must be a sequence of dataset prefixes, got the single path {prefixes!r}")
    backend = megatron.resolve_backend(backend)
    dtype = megatron.megatron_dtype(vocab_size)
    shards = [os.fspath(p) for p in prefixes]
    sequences = documents = tokens = 0
    starts = []  # byte offset of each shard in the merged .bin
    for prefix in shards:
        info = megatron.read_shard_index(prefix, dtype)
        starts.append(tokens * dtype.itemsize)
        sequences += info.sequence_count
        documents += info.document_count
        tokens += info.token_count
    with megatron.atomic_builder(out_prefix, dtype, backend) as (builder, tmp_bin, tmp_idx):
        for prefix in shards:
            builder.add_index(prefix)
        builder.finalize(tmp_idx)
        merged = megatron.read_index(tmp_idx)
        if (merged.sequence_count, merged.document_count, merged.token_count) != (sequences, documents, tokens):
            raise RuntimeError(f"{tmp_idx}: merged index disagrees with its shards (changed during the merge?)")
        bin_sha256 = _hash_checking_ids(tmp_bin, dtype, vocab_size, shards, starts)
    return {
        "sequences": sequences,
        "documents": documents,
        "tokens": tokens,
        "dtype": dtype.name,
        "backend": backend,
        "bin_sha256": bin_sha256,
        "idx_sha256": sha256_file(megatron.idx_path(out_prefix)),
    }


def _hash_checking_ids(path: Path, dtype: np.dtype, vocab_size: int, shards: list[str], starts: list[int]) -> str:
    """Hex SHA-256 of ``path``, read in bounded chunks, checking each ``dtype`` id is in
    ``[0, vocab_size)``; ``ValueError`` naming the shard and token offset otherwise."""
    step = max(dtype.itemsize, megatron.COPY_CHUNK_BYTES // dtype.itemsize * dtype.itemsize)
    h = hashlib.sha256()
    offset = 0
    with open(path, "rb") as f:
        while chunk := f.read(step):
            h.update(chunk)
            ids = np.frombuffer(chunk, dtype=dtype.newbyteorder("<"))
            bad = (ids >= vocab_size) | (ids < 0)
            if ids.size and bad.any():
                j = int(np.argmax(bad))
                at = offset + j * dtype.itemsize
                k = bisect.bisect_right(starts, at) - 1  # the last shard starting at or before it
                raise ValueError(f"shard {k} ({shards[k]}): token id {int(ids[j])} outside [0, {vocab_size}) "
                                 f"at token {(at - starts[k]) // dtype.itemsize}")
            offset += len(chunk)
    return h.hexdigest()
