"""Stage 4 partitioned: the dedup of :mod:`megacpp_core.dedup`, with memory set by
settings and by the largest source, not by the snapshot.

The rules, the passes (:mod:`megacpp_core.dedup_passes`) and the outputs are those of
:func:`megacpp_core.dedup.deduplicate_columns` — byte for byte; only where the data lives
differs:

1. **Index** (:class:`megacpp_core.dedup_index.KeepIndex`): every file's keep-order index,
   one source at a time; per source its doc keys, hashes and signatures go to local spill
   files, read back memory-mapped.
2. **Exact**: ``(sha256, index)`` records go to hash buckets
   (:class:`megacpp_core.spill.BucketSpill`, about ``bucket_rows`` per bucket); each bucket
   is sorted alone and every file but the first of its hash names that first.
3. **Near**, one source at a time: that source's signatures only.
4. **Cross-source**: the band steps' candidate pairs, alive pairs estimated on signature
   rows gathered from the spill files.
5. **Tables**, streamed to parquet in 1,024-row row groups: ``decisions`` source by source in
   ``doc_key`` order (a source's keys all start with ``SOURCE/``), ``duplicate_clusters``
   in cluster order.

What stays in memory for the whole snapshot: ``kind`` (1 byte), ``twin`` (4 bytes), an
empty-signature flag (1 byte), a text-read flag (1 byte) and the minhash-row → index map
(4 bytes) per file — 11 bytes a file, 304 MB at 27.6 M files — plus, per drop, its index,
twin and Jaccard, and the cross-source candidate pairs of two files still kept after the
exact and near passes (16 bytes a pair). The near pass holds one source's signatures
(512 bytes a file at 128 permutations) and its band keys, so the largest source sets
that term. Everything else is one source, one bucket or one block of pairs at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import dedup_passes as passes
from . import minhash as mh
from .dedup import CROSS_BANDS, CROSS_NUM_PERM, CROSS_ROWS, LICENSE_RANK, REPORT_JACCARD, near_lsh_params
from .dedup_index import DedupInputError, KeepIndex
from .dedup_tables import CLUSTERS_SCHEMA, CROSS, DECISIONS_SCHEMA, EXACT, KEPT, NEAR, dup_kinds, take_rows
from .spill import BucketSpill, bucket_count, bucket_of
from .tables import ROW_GROUP_SIZE, ParquetStream, release_memory

#: Records per exact-pass bucket (``(sha256, index)``: 40 bytes each, so 1 Mi records are
#: 40 MiB read back plus the sort's index arrays); the default of the ``dedup_bucket_rows``
#: setting. Implementation choice.
BUCKET_ROWS = 1 << 20
#: Rows per block when the tables are written (their string gathers are the transient).
TABLE_BLOCK = 16 * ROW_GROUP_SIZE

_EXACT_RECORD = np.dtype([("h", "<u8", (4,)), ("g", "<i8")])


def _exact_pass(spill: BucketSpill, kind: np.ndarray, twin: np.ndarray) -> None:
    """Every file but the first (lowest index) of its sha256 becomes an exact drop naming
    that first file; one bucket in memory at a time."""
    for b in range(spill.buckets):
        rec = spill.read(b)
        if len(rec) < 2:
            continue
        h, g = rec["h"], rec["g"]
        order = np.lexsort((g, h[:, 3], h[:, 2], h[:, 1], h[:, 0]))
        h, g = h[order], g[order]
        new = np.concatenate(([True], (h[1:] != h[:-1]).any(axis=1)))
        first = g[np.flatnonzero(new)][np.cumsum(new) - 1]
        dup = ~new
        kind[g[dup]] = EXACT
        twin[g[dup]] = first[dup]
        del rec, h, g, order


def deduplicate_partitioned(scrubbed: Sequence, minhash: Sequence, cross_pairs: Callable[[], Iterable[np.ndarray]],
                            workdir: str | Path, decisions_path: str | Path, clusters_path: str | Path,
                            num_perm: int = 128, threshold: float = 0.7, shingle_k: int = 5,
                            bucket_rows: int = BUCKET_ROWS, verify_exact: bool = True,
                            log: Callable[[str], None] = lambda m: None) -> dict:
    """Dedup the snapshot whose scrubbed shards are ``scrubbed`` and signatures ``minhash``
    (input references, manifest then shard order, with ``.source``; see
    :class:`~megacpp_core.dedup_index.KeepIndex`), writing ``decisions`` and
    ``duplicate_clusters`` to the local parquet files ``decisions_path`` and
    ``clusters_path``. ``cross_pairs()`` yields the cross-source candidate pairs in blocks
    (``int64[m, 2]``) as rows of the concatenated ``minhash`` inputs (the band steps'
    output, :mod:`megacpp_core.lsh_stream`). Returns the figures of
    :class:`megacpp_core.dedup.DedupResult` plus ``texts_read_for_verification``,
    ``signatures_computed`` (files without a signature in ``minhash``) and
    ``exact_buckets``.

    Raises :class:`~megacpp_core.dedup_index.DedupInputError` on inconsistent inputs
    (duplicate ``doc_key``, a key outside its source, a malformed hash, pairs naming rows
    outside the minhash inputs) and ``ValueError`` for ``num_perm < 112``. With
    ``verify_exact`` False pairs are decided on the estimate alone and no text is read,
    except those of files the ``minhash`` inputs lack (their signatures are computed)."""

    if num_perm < CROSS_NUM_PERM:
        raise ValueError(f"num_perm must be >= {CROSS_NUM_PERM} for the cross-source pass, got {num_perm}")
    work = Path(workdir)
    idx = KeepIndex(scrubbed, minhash, work / "index", num_perm)
    n = idx.n
    mh_index = np.full(sum(ref.parquet_file().metadata.num_rows for ref in minhash), -1, np.int32)
    kind, twin = np.zeros(n, np.int8), np.full(n, -1, np.int32)
    buckets = bucket_count(n, bucket_rows)
    log(f"dedup: {n} files in {len(idx.sources)} sources; exact pass over {buckets} hash bucket(s)")
    with BucketSpill(work / "exact", buckets, _EXACT_RECORD, "sha") as spill:
        def to_spill(words: np.ndarray, g: np.ndarray) -> None:
            rec = np.empty(len(g), _EXACT_RECORD)
            rec["h"], rec["g"] = words, g
            spill.add(bucket_of(words[:, 0], buckets), rec)

        computed = idx.build(spill_sha=to_spill, minhash_rows=mh_index, log=log)
        spill.flush()
        _exact_pass(spill, kind, twin)
    release_memory()

    read = np.zeros(n, bool)  # files whose text the exact check read (1 byte a file)

    def texts_of(g: Sequence[int]):
        read[np.asarray(g, dtype=np.int64)] = True
        return idx.texts_of(g)

    def verify(pairs: np.ndarray) -> np.ndarray:
        return passes.verify_pairs(pairs, texts_of, threshold, shingle_k)

    check = verify if verify_exact else None

    # Near, one source at a time (pairs within a source only).
    b, r_ = near_lsh_params(threshold, num_perm)
    empty = np.zeros(n, bool)
    near_candidates = near_rejected = 0
    for s, src in enumerate(idx.sources):
        if not src.n:
            continue
        g = idx.source_table(s).column("g").to_numpy()
        sig = idx.source_signatures(s)
        e = mh.is_empty(sig)
        empty[g] = e
        k = kind[g].astype(np.int8)
        t = np.full(len(g), -1, np.int64)

        def verify_local(pairs: np.ndarray, g=g) -> np.ndarray:
            return verify(g[pairs])

        c, rj = passes.near_pass(sig, k, t, e, threshold, b, r_, group=None,
                                 verify=verify_local if verify_exact else None)
        near_candidates, near_rejected = near_candidates + c, near_rejected + rj
        hit = np.flatnonzero(k == NEAR)
        kind[g[hit]], twin[g[hit]] = NEAR, g[t[hit]]
        del sig, g
    release_memory()
    log(f"dedup: exact {int((kind == EXACT).sum())}, near {int((kind == NEAR).sum())} drops")

    # Cross-source: the band steps' pairs mapped to indices; only pairs of two alive files
    # (kept so far, non-empty signature) of two sources are held.
    alive = (kind == KEPT) & ~empty
    del empty
    parts = [np.zeros((0, 2), np.int64)]
    for block in cross_pairs():
        block = np.asarray(block, dtype=np.int64).reshape(-1, 2)
        if len(block) and (block.min() < 0 or block.max() >= len(mh_index)):
            raise DedupInputError(f"cross-source pairs name minhash rows outside [0, {len(mh_index)})")
        gp = mh_index[block].astype(np.int64)
        gp = gp[(gp >= 0).all(axis=1)]
        gp = gp[alive[gp[:, 0]] & alive[gp[:, 1]]]
        parts.append(np.sort(gp, axis=1))
    cand = mh.merge_pairs(parts)
    del parts
    if len(cand):
        cand = cand[idx.locate(cand[:, 0])[0] != idx.locate(cand[:, 1])[0]]

    def cross_sig(g: np.ndarray) -> np.ndarray:
        return idx.rows(g, slice(0, CROSS_NUM_PERM))

    cross = passes.cross_pass(cand, kind, twin, alive, cross_sig, threshold, check)
    del cand, alive

    dropped, same = passes.resolve(kind, twin)
    jac = np.ones(len(dropped))
    rest = np.flatnonzero(~same)
    jac[rest] = passes.estimate(idx.rows, dropped[rest], twin[dropped[rest]])
    figures = _write_tables(idx, kind, twin, dropped, jac, decisions_path, clusters_path)
    n_removed = {k: int((kind == code).sum()) for k, code in (("exact", EXACT), ("near", NEAR), ("cross", CROSS))}
    rate = (lambda x: round(x / n, 6)) if n else (lambda x: 0.0)

    def report(bands: int, rows: int) -> dict:
        return {"effective_threshold": mh.effective_threshold(bands, rows),
                "candidate_probability": {str(j): round(mh.candidate_probability(j, bands, rows), 6)
                                          for j in REPORT_JACCARD}}

    near_rep, cross_rep = report(b, r_), report(CROSS_BANDS, CROSS_ROWS)
    texts_read = int(read.sum())
    return {
        "files_in": n, "exact_removed": n_removed["exact"], "near_removed": n_removed["near"],
        "cross_source_removed": n_removed["cross"], "files_out": n - sum(n_removed.values()),
        "exact_removal_rate": rate(n_removed["exact"]), "near_removal_rate": rate(n_removed["near"]),
        "cross_source_removal_rate": rate(n_removed["cross"]), "clusters": figures["clusters"],
        "num_perm": num_perm, "threshold": threshold, "shingle_k": shingle_k, "lsh_bands": b, "lsh_rows": r_,
        "effective_threshold": near_rep["effective_threshold"], "candidate_probability": near_rep["candidate_probability"],
        "near_candidate_pairs": near_candidates, "near_rejected_by_exact": near_rejected, "verify_exact": verify_exact,
        "cross_num_perm": CROSS_NUM_PERM, "cross_lsh_bands": CROSS_BANDS, "cross_lsh_rows": CROSS_ROWS,
        "cross_effective_threshold": cross_rep["effective_threshold"],
        "cross_candidate_probability": cross_rep["candidate_probability"],
        "cross_candidate_pairs": cross["candidate_pairs"], "cross_confirmed_pairs": cross["confirmed_pairs"],
        "cross_rejected_by_exact": cross["rejected"], "cross_source_clusters": cross["clusters"],
        "cross_source_below_threshold": cross["below_threshold"], "largest_clusters": figures["largest_clusters"],
        "texts_read_for_verification": texts_read, "signatures_computed": computed, "exact_buckets": buckets,
    }


def _write_tables(idx: KeepIndex, kind: np.ndarray, twin: np.ndarray, dropped: np.ndarray, jac: np.ndarray,
                  decisions_path, clusters_path) -> dict:
    """Stream ``decisions`` and ``duplicate_clusters`` (the tables of
    :func:`megacpp_core.dedup_tables.build_tables`) and return the cluster figures."""
    roots = twin[dropped].astype(np.int64)
    kept_ids = np.unique(roots)  # keep order: a cluster's id is its kept member's position
    cluster_of_drop = np.searchsorted(kept_ids, roots)

    def cluster(g: np.ndarray, keep: np.ndarray) -> np.ndarray:
        out = np.full(len(g), -1, np.int64)
        if len(kept_ids):
            pos = np.minimum(np.searchsorted(kept_ids, g), len(kept_ids) - 1)
            out[keep] = np.where(kept_ids[pos[keep]] == g[keep], pos[keep], -1)
            out[~keep] = np.searchsorted(kept_ids, twin[g[~keep]].astype(np.int64))
        return out

    names = [src.name for src in idx.sources]
    with ParquetStream(decisions_path, DECISIONS_SCHEMA, whole_row_groups=True) as out:
        for s in sorted(range(len(names)), key=lambda i: (names[i] + "/").encode("utf-8")):
            if not idx.sources[s].n:
                continue
            t = idx.source_table(s)
            t = t.take(pc.sort_indices(t.column("doc_key")))
            for lo in range(0, t.num_rows, TABLE_BLOCK):
                part = t.slice(lo, TABLE_BLOCK)
                g = part.column("g").to_numpy()
                keep = kind[g] == KEPT
                drop_pos = np.searchsorted(dropped, g[~keep])
                j = np.zeros(len(g))
                j[~keep] = jac[drop_pos]
                twin_keys = take_rows(idx.keys(twin[g[~keep]].astype(np.int64)),
                                      np.cumsum(~keep) - 1, keep) if (~keep).any() else pa.nulls(len(g), pa.string())
                out.write(pa.table({
                    "doc_key": part.column("doc_key"), "keep": pa.array(keep), "dup_kind": dup_kinds(kind[g]),
                    "kept_twin": twin_keys, "jaccard": pa.array(j, mask=keep), "cluster_id": pa.array(cluster(g, keep)),
                    "content_sha256": part.column("content_sha256"),
                }, schema=DECISIONS_SCHEMA))
            del t

    rows = np.concatenate((kept_ids, dropped))
    is_kept = np.concatenate((np.ones(len(kept_ids), bool), np.zeros(len(dropped), bool)))
    cid = np.concatenate((np.arange(len(kept_ids)), cluster_of_drop))
    jrow = np.concatenate((np.ones(len(kept_ids)), jac))
    order = np.lexsort((rows, ~is_kept, cid))
    rows, is_kept, cid, jrow = rows[order], is_kept[order], cid[order], jrow[order]
    size = np.bincount(cluster_of_drop, minlength=len(kept_ids)).astype(np.int64) + 1
    source_names = pa.array(names, pa.string())
    with ParquetStream(clusters_path, CLUSTERS_SCHEMA, whole_row_groups=True) as out:
        for lo in range(0, len(rows), TABLE_BLOCK):
            r, c = rows[lo:lo + TABLE_BLOCK], cid[lo:lo + TABLE_BLOCK]
            out.write(pa.table({
                "cluster_id": pa.array(c, pa.int64()), "cluster_size": pa.array(size[c], pa.int64()),
                "doc_key": idx.keys(r), "source": take_rows(source_names, idx.locate(r)[0]),
                "is_kept": pa.array(is_kept[lo:lo + TABLE_BLOCK]), "kept_doc_key": idx.keys(kept_ids[c]),
                "dup_kind": dup_kinds(kind[r]), "jaccard_to_kept": pa.array(jrow[lo:lo + TABLE_BLOCK], pa.float64()),
            }, schema=CLUSTERS_SCHEMA))
    largest = []
    for c in np.lexsort((np.arange(len(kept_ids)), -size))[:10].tolist():
        members = dropped[cluster_of_drop == c]
        largest.append({"cluster_id": c, "size": int(size[c]), "kept": idx.keys(kept_ids[c:c + 1])[0].as_py(),
                        "members": idx.keys(members).to_pylist()})
    return {"clusters": int(len(kept_ids)), "largest_clusters": largest}


__all__ = ["BUCKET_ROWS", "deduplicate_partitioned", "LICENSE_RANK"]
