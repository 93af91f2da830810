"""MinHash signature tables, shared by the per-revision ``minhash`` stage and the
snapshot-wide LSH and dedup stages.

A ``minhash`` table has ``doc_key`` (string) and ``signature``: a fixed-size list of
``num_perm`` uint32 per file (4 bytes per permutation, 512 B per file at 128).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .tables import release_memory


class SignatureError(ValueError):
    """A signature table whose rows are not all of one length."""


def signatures_table(doc_keys: list[str], sig: np.ndarray) -> pa.Table:
    """``minhash`` table from ``doc_keys`` and ``sig`` (uint32[n, num_perm])."""
    flat = pa.array(np.ascontiguousarray(sig, dtype=np.uint32).ravel(), type=pa.uint32())
    return pa.table({"doc_key": pa.array(doc_keys, pa.string()),
                     "signature": pa.FixedSizeListArray.from_arrays(flat, sig.shape[1])})


def signature_matrix(t: pa.Table, where: str = "minhash") -> np.ndarray:
    """``uint32[n, num_perm]`` of a ``minhash`` table's ``signature`` column (a view of its
    arrow buffer; ``uint32[0, 0]`` without rows); raises :class:`SignatureError` naming
    ``where`` when the rows differ in length."""
    col = t.column("signature").combine_chunks()  # parquet may hand back a plain list<uint32>
    flat = np.asarray(col.flatten(), dtype=np.uint32)
    n = len(col)
    if n == 0:
        return flat.reshape(0, 0)
    if flat.size % n or (pc.list_value_length(col).to_numpy() != flat.size // n).any():
        raise SignatureError(f"{where}: signatures are not all of one length")
    return flat.reshape(n, flat.size // n)


def table_signatures(t: pa.Table, where: str = "minhash") -> tuple[list[str], np.ndarray]:
    """``(doc_keys, uint32[n, num_perm])`` from a ``minhash`` table (:func:`signature_matrix`)."""
    sig = signature_matrix(t, where)
    return (t.column("doc_key").to_pylist() if len(sig) else []), sig


def read_signatures(path) -> tuple[list[str], np.ndarray]:
    """:func:`table_signatures` of a local ``minhash.parquet`` file."""
    import pyarrow.parquet as pq

    return table_signatures(pq.read_table(path), str(path))


def read_ref_signatures(ref, columns: slice = slice(None)) -> tuple[pa.ChunkedArray, np.ndarray]:
    """``(doc_key column, uint32[n, k])`` of one ``minhash`` input (``.iter_batches``,
    ``.uri``): the permutations ``columns`` selects (default all), decoded batch by batch
    on this thread; the matrix is a copy of those columns only (no arrow buffer of the file
    stays alive with it). An empty column and ``uint32[0, 0]`` without rows."""
    batches = list(ref.iter_batches(["doc_key", "signature"]))
    if not batches:
        return pa.chunked_array([], pa.string()), np.zeros((0, 0), np.uint32)
    t = pa.Table.from_batches(batches)
    return t.column("doc_key"), np.array(signature_matrix(t, ref.uri)[:, columns], dtype=np.uint32, copy=True)


def snapshot_signatures(refs, width: int, source_ids: dict[str, int],
                        columns: slice = slice(None)) -> tuple[pa.ChunkedArray, np.ndarray, np.ndarray]:
    """Every revision's signatures, in input order: ``(doc_key column, int32[n] source ids,
    uint32[n, k])`` with ``k`` the permutations ``columns`` selects of ``width`` (a band
    range keeps only its own: 56 of 128 for 7 bands × 8 rows; each shard is still decoded
    whole). ``refs``: per-shard inputs with ``.source``, ``.iter_batches`` and ``.uri``
    (:func:`read_ref_signatures`: on the xl snapshot's 61 shards, reading whole tables on
    arrow's thread pool kept about 200 MB of decoded buffers alive); ``source_ids`` maps each ``.source`` to its id (manifest
    order). The keys stay an arrow column, the sources integers: a few bytes per document
    besides the selected signature columns. Raises ``KeyError`` for a source not in
    ``source_ids``."""
    keys, srcs, sigs = [], [], []
    k = len(range(width)[columns])
    for ref in refs:
        key, sg = read_ref_signatures(ref, columns)
        keys.append(key)
        srcs.append(np.full(len(key), source_ids[ref.source], dtype=np.int32))
        sigs.append(sg if len(sg) else np.zeros((0, k), np.uint32))
        del sg
    release_memory()
    return (pa.chunked_array([c for key in keys for c in key.chunks], pa.string()),
            np.concatenate(srcs) if srcs else np.zeros(0, np.int32),
            np.concatenate(sigs) if sigs else np.zeros((0, k), np.uint32))
