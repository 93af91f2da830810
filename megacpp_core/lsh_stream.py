"""Stage 4b on disk: the cross-source LSH candidate pairs of a band range with memory set
by a bucket size, not by the snapshot (the bucket shape of datatrove's MinHash dedup).

Rows are the rows of the snapshot's ``minhash`` shards concatenated in input order
(manifest, then shard order): a pair is ``(row_a, row_b)``, ``row_a < row_b``.

1. Each shard is read alone; for every band of the range its 64-bit band keys
   (:func:`megacpp_core.minhash.band_keys`, the range's columns as bands ``0 … hi − lo − 1``)
   go with the row to a key bucket on local disk (:class:`megacpp_core.spill.BucketSpill`).
   Empty signatures never pair.
2. Each key bucket is sorted alone; rows sharing a key in one band and coming from two
   different sources make a candidate pair, which goes to a pair bucket by ``row_a``.
3. Each pair bucket, ``row_a`` ranges in ascending order, is made unique and appended to
   the output: the pairs sorted and unique, the set
   :func:`megacpp_core.dedup.cross_source_candidates` finds in memory.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa

from . import minhash as mh
from .signatures import read_ref_signatures
from .spill import BucketSpill, bucket_count, bucket_of
from .tables import ParquetStream, release_memory

PAIRS_SCHEMA = pa.schema([("row_a", pa.int64()), ("row_b", pa.int64())])
#: Key-value metadata naming the minhash inputs the rows refer to (:func:`inputs_digest`).
INPUTS_KEY = "megacpp.minhash_inputs"
_KEY_RECORD = np.dtype([("k", "<u8"), ("m", "<i8")])


def inputs_digest(refs: Sequence) -> str:
    """sha256 over the data-root key and row count of every ``minhash`` input, in order: the
    coordinates a pair's rows refer to. Dedup refuses pairs of other inputs."""
    lines = [f"{ref.key}\t{ref.parquet_file().metadata.num_rows}" for ref in refs]
    return hashlib.sha256(json.dumps(lines).encode("utf-8")).hexdigest()


def key_group_pairs(keys: np.ndarray, rows: np.ndarray, limit: int) -> Iterator[np.ndarray]:
    """The pair codes ``i · 2^32 + j`` (``i < j``) of every two ``rows`` sharing a key of
    ``keys`` (aligned ``uint64`` / ``int64`` arrays), in blocks of at most ``limit`` codes
    (or one row of a group's triangle, when a group has more than ``limit`` members):
    pairs of two-row groups vectorized, larger groups a slice of their triangle at a time,
    so a key shared by many copies of one file never materializes all its pairs at once."""
    order = np.argsort(keys, kind="stable")
    ks, ids = keys[order], rows[order].astype(np.int64)
    if len(ks) < 2:
        return
    brk = np.flatnonzero(np.concatenate(([True], ks[1:] != ks[:-1], [True])))
    sizes = np.diff(brk)
    two = brk[:-1][sizes == 2]
    for lo in range(0, len(two), max(1, limit)):
        t = two[lo:lo + limit]
        a, b = ids[t], ids[t + 1]
        yield (np.minimum(a, b) << 32) | np.maximum(a, b)
    pending, held = [], 0
    for start, size in zip(brk[:-1][sizes > 2].tolist(), sizes[sizes > 2].tolist()):
        members = np.sort(ids[start:start + size])
        r0 = 0
        while r0 < size - 1:  # rows r0 … r1 − 1 of the triangle: about ``limit`` pairs
            per_row = size - 1 - np.arange(r0, size - 1)
            r1 = r0 + max(1, int(np.searchsorted(np.cumsum(per_row), limit, side="right")))
            counts = per_row[:r1 - r0]
            if held and held + int(counts.sum()) > limit:  # blocks stay within ``limit`` (or one slice)
                yield np.concatenate(pending)
                pending, held = [], 0
            ii = np.repeat(np.arange(r0, r1), counts)
            jj = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts) + ii + 1
            pending.append((members[ii] << 32) | members[jj])
            held += len(ii)
            del ii, jj
            r0 = r1
    if pending:
        yield np.concatenate(pending)


def band_range_pairs(refs: Sequence, source_ids: dict[str, int], lo: int, hi: int, rows: int, num_perm: int,
                     workdir: str | Path, out_path: str | Path, bucket_rows: int) -> dict:
    """Write the cross-source candidate pairs of bands ``lo … hi − 1`` (``rows`` rows each)
    of the signatures ``refs`` (``minhash`` inputs with ``.source``, ``.key``) to the local
    parquet file ``out_path`` (:data:`PAIRS_SCHEMA`, sorted, unique, with the
    :data:`INPUTS_KEY` metadata). ``source_ids`` maps each source to its manifest position;
    ``workdir`` holds the spill files; a bucket holds about ``bucket_rows`` records.
    Returns the figures ``documents``, ``candidate_pairs``, ``key_buckets``,
    ``pair_buckets`` (sized from an upper bound on the pairs), ``spill_bytes`` and
    ``all_pairs_cross_source``.

    Raises ``ValueError`` when a shard's signatures are not ``num_perm`` wide or the range
    does not fit them, and ``KeyError`` for a source not in ``source_ids``."""
    if not 0 <= lo < hi or hi * rows > num_perm:
        raise ValueError(f"bands [{lo}, {hi}) x {rows} rows do not fit {num_perm} permutations")
    counts = [ref.parquet_file().metadata.num_rows for ref in refs]
    starts = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    total = int(starts[-1])
    if total >= 1 << 31:
        raise ValueError(f"{total} signatures: pair codes hold rows below 2^31")
    shard_source = np.array([source_ids[ref.source] for ref in refs] or [0], np.int64)
    nb = hi - lo
    per_band = bucket_count(total, bucket_rows)
    work = Path(workdir)
    spill_bytes = 0
    with BucketSpill(work / "keys", nb * per_band, _KEY_RECORD, "key") as keys_spill:
        for ref, start in zip(refs, starts[:-1].tolist()):
            _, sig = read_ref_signatures(ref)
            if not len(sig):
                continue
            if sig.shape[1] != num_perm:
                raise ValueError(f"{ref.uri}: signatures of {sig.shape[1]} permutations, expected {num_perm}")
            sig = np.ascontiguousarray(sig[:, lo * rows:hi * rows])
            live = np.flatnonzero(~mh.is_empty(sig))
            band = mh.band_keys(sig[live], rows, 0, nb)
            del sig
            for col in range(nb):
                rec = np.empty(len(live), _KEY_RECORD)
                rec["k"], rec["m"] = band[:, col], start + live
                keys_spill.add(col * per_band + bucket_of(band[:, col], per_band), rec)
            del band
        keys_spill.flush()
        spill_bytes += keys_spill.records * _KEY_RECORD.itemsize
        # Pair buckets sized from an upper bound on the pairs (every key group's s(s-1)/2):
        # copies of one file in many sources make a bucket quadratic in its group.
        bound = 0
        for b in range(keys_spill.buckets):
            _, sizes = np.unique(keys_spill.read(b)["k"], return_counts=True)
            bound += int((sizes * (sizes - 1) // 2).sum())
        pair_buckets = bucket_count(bound, bucket_rows)
        with BucketSpill(work / "pairs", pair_buckets, np.int64, "pair") as pairs_spill:
            for b in range(keys_spill.buckets):
                rec = keys_spill.read(b)
                for codes in key_group_pairs(rec["k"], rec["m"], bucket_rows):
                    a, c = codes >> 32, codes & 0xFFFFFFFF
                    src_a = shard_source[np.searchsorted(starts, a, side="right") - 1]
                    src_c = shard_source[np.searchsorted(starts, c, side="right") - 1]
                    codes = codes[src_a != src_c]
                    pairs_spill.add((codes >> 32) * pair_buckets // max(total, 1), codes)
                del rec
                release_memory()
            pairs_spill.flush()
            spill_bytes += pairs_spill.records * 8
            found = 0
            with ParquetStream(out_path, PAIRS_SCHEMA) as out:
                for b in range(pair_buckets):
                    codes = np.unique(pairs_spill.read(b))
                    if len(codes):
                        out.write(pa.table({"row_a": pa.array(codes >> 32), "row_b": pa.array(codes & 0xFFFFFFFF)},
                                           schema=PAIRS_SCHEMA))
                        found += len(codes)
                    del codes
                    release_memory()
                out.add_metadata({INPUTS_KEY: inputs_digest(refs)})
    release_memory()
    return {"documents": total, "candidate_pairs": found, "key_buckets": keys_spill.buckets,
            "pair_buckets": pair_buckets, "spill_bytes": spill_bytes, "all_pairs_cross_source": True}


def read_pairs(ref, batch_rows: int = 1 << 20):
    """The ``(row_a, row_b)`` pairs of one band-range output (an input reference), as
    ``int64[m, 2]`` blocks of at most ``batch_rows``."""
    for batch in ref.iter_batches(["row_a", "row_b"], batch_size=batch_rows):
        yield np.stack((batch.column(0).to_numpy(), batch.column(1).to_numpy()), axis=1)
