"""The passes of stage-4 dedup (rules: :mod:`megacpp_core.dedup`) on per-document numpy
columns indexed by keep order, shared by the in-memory reference
(:func:`megacpp_core.dedup.deduplicate_columns`) and the partitioned snapshot step
(:mod:`megacpp_core.dedup_stream`), which differ only in where signatures and texts live.

Per-document state: ``kind`` (``int8``, :data:`~megacpp_core.dedup_tables.KEPT` …
:data:`~megacpp_core.dedup_tables.CROSS`) and ``twin`` (``int64``, the index of the record
a drop names, -1 when kept), both updated in place. Signatures come through an accessor
``rows(idx: int64[m]) -> uint32[m, p]`` (a matrix slice in memory, a gather from spill
files on disk), texts through ``texts_of(idx) -> iterator of (index, text)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from . import minhash as mh
from .dedup_tables import CROSS, EXACT, KEPT, NEAR

#: Records whose shingle-hash sets one verification block holds (:func:`verify_pairs`
#: streams each block's texts). A set is 4 bytes per distinct shingle, at most 4 MB for a
#: 1 MB file (``max_file_bytes``) and some 3 KB for a typical 10 KB one, so a block holds a
#: few tens of MiB; implementation choice.
VERIFY_BLOCK_RECORDS = 4096

Rows = Callable[[np.ndarray], np.ndarray]
TextsOf = Callable[[Sequence[int]], Iterator[tuple[int, str]]]


def estimate(rows: Rows, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """``float64[m]``: the MinHash Jaccard estimate (fraction of equal slots) of each pair
    ``(i[q], j[q])``, :data:`megacpp_core.minhash.PAIR_BLOCK` pairs at a time (two
    gathered ``uint32[block, p]`` matrices are the only temporaries)."""
    i, j = np.asarray(i, dtype=np.int64), np.asarray(j, dtype=np.int64)
    out = np.zeros(len(i))
    for a in range(0, len(i), mh.PAIR_BLOCK):
        out[a:a + mh.PAIR_BLOCK] = (rows(i[a:a + mh.PAIR_BLOCK]) == rows(j[a:a + mh.PAIR_BLOCK])).mean(axis=1)
    return out


def verify_pairs(pairs: np.ndarray, texts_of: TextsOf, threshold: float, shingle_k: int,
                 block_records: int | None = None) -> np.ndarray:
    """``bool[m]``: the exact Jaccard of each pair's sets of 32-bit shingle hashes is ≥
    ``threshold`` (the verification of candidate pairs; ``pairs`` is ``int64[m, 2]``).
    Pairs are taken in order, in blocks holding the hash sets of at most
    ``block_records`` (default :data:`VERIFY_BLOCK_RECORDS`) records; each block streams its
    texts through ``texts_of``, so memory is set by the block, not by the number of pairs."""
    limit = VERIFY_BLOCK_RECORDS if block_records is None else block_records
    ok = np.zeros(len(pairs), dtype=bool)

    def verify(lo: int, hi: int, records: set[int]) -> None:
        sets = {x: np.unique(mh.shingle_hashes([text], shingle_k)[0]) for x, text in texts_of(sorted(records))}
        for s0 in range(lo, hi, mh.PAIR_BLOCK):
            for q, (i, j) in enumerate(pairs[s0:min(hi, s0 + mh.PAIR_BLOCK)].tolist(), s0):
                a, b = sets[i], sets[j]
                inter = np.intersect1d(a, b, assume_unique=True).size
                ok[q] = (inter / (a.size + b.size - inter) if a.size + b.size else 1.0) >= threshold

    lo, records = 0, set()
    for start in range(0, len(pairs), mh.PAIR_BLOCK):  # Python objects for one slice of pairs at a time
        for q, (i, j) in enumerate(pairs[start:start + mh.PAIR_BLOCK].tolist(), start):
            if q > lo and len(records) + (i not in records) + (j not in records) > limit:
                verify(lo, q, records)
                lo, records = q, set()
            records.update((i, j))
    if len(pairs):
        verify(lo, len(pairs), records)
    return ok


def near_pass(sig: np.ndarray, kind: np.ndarray, twin: np.ndarray, empty: np.ndarray, threshold: float,
              bands: int, rows: int, group: np.ndarray | None = None,
              verify: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[int, int]:
    """Near dedup within each ``group`` (all rows one group when None), greedy in keep order
    against kept records only; updates ``kind``/``twin`` in place. Returns
    ``(candidate pairs, pairs rejected by verify)``.

    ``sig`` is ``uint32[n, p]`` in keep order; ``empty`` marks empty signatures, which never
    pair. The candidate pairs come band by band, each once (:func:`megacpp_core.minhash.band_pair_blocks`
    over ``bands`` × ``rows``); only those whose estimate reaches ``threshold`` are held.
    Records ``j`` are decided in ascending order: ``j`` is dropped for the kept candidate
    ``i < j`` with the highest estimate (the smaller ``i`` on a tie) whose pair passes
    ``verify`` (``int64[m, 2] -> bool[m]``; every pair passes when None)."""
    def rows_of(idx: np.ndarray) -> np.ndarray:
        return sig[idx]

    candidates, likely, est = 0, [np.zeros((0, 2), np.int64)], [np.zeros(0)]
    for p in mh.band_pair_blocks(sig, rows, 0, bands, group=group, cross_group=False, skip=(kind != KEPT) | empty):
        candidates += len(p)
        e = estimate(rows_of, p[:, 0], p[:, 1])
        likely.append(p[e >= threshold])
        est.append(e[e >= threshold])
    likely, est = np.concatenate(likely), np.concatenate(est)
    by_j = np.lexsort((likely[:, 0], likely[:, 1]))  # by j, then i: the greedy's order
    likely, est = likely[by_j], est[by_j]
    ok = verify(likely) if verify is not None else np.ones(len(likely), dtype=bool)
    rejected = 0
    jj = likely[:, 1]
    bounds = np.flatnonzero(np.concatenate(([True], jj[1:] != jj[:-1], [True]))) if len(jj) else np.zeros(1, np.int64)
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        j, best = int(jj[lo]), None
        for q in range(lo, hi):
            i = int(likely[q, 0])
            if kind[i] != KEPT:
                continue
            if not ok[q]:
                rejected += 1
                continue
            if best is None or (float(est[q]), -i) > (best[0], -best[1]):
                best = (float(est[q]), i)
        if best is not None:
            twin[j], kind[j] = best[1], NEAR
    return candidates, rejected


def cross_pass(cand: np.ndarray, kind: np.ndarray, twin: np.ndarray, alive: np.ndarray, rows: Rows, threshold: float,
               verify: Callable[[np.ndarray], np.ndarray] | None = None) -> dict:
    """Cross-source pass over candidate pairs ``cand`` (``int64[m, 2]``, ``i < j``, unique):
    pairs of two ``alive`` records (kept so far, non-empty signature) whose estimate over
    ``rows`` (the cross-source permutations) reaches ``threshold`` and that pass ``verify``
    are merged with union-find; every member of a group but the first in keep order
    becomes a ``CROSS`` drop naming it (``kind``/``twin`` updated in place). Returns the
    figures ``candidate_pairs`` (alive pairs), ``confirmed_pairs``, ``rejected``,
    ``clusters`` and ``below_threshold`` (members whose estimate to the kept member is
    below ``threshold``: union-find is transitive)."""
    cand = cand[alive[cand[:, 0]] & alive[cand[:, 1]]] if len(cand) else cand
    est = estimate(rows, cand[:, 0], cand[:, 1]) if len(cand) else np.zeros(0)
    confirmed = cand[est >= threshold] if len(cand) else cand
    rejected = 0
    if verify is not None and len(confirmed):
        ok = verify(confirmed)
        rejected = int((~ok).sum())
        confirmed = confirmed[ok]
    nodes = np.unique(confirmed)  # union-find over the confirmed pairs' records only
    uf = mh.UnionFind(nodes.size)
    for i, j in np.searchsorted(nodes, confirmed).tolist():
        uf.union(i, j)
    groups = uf.groups()
    members, roots = [], []
    for root, group in groups.items():  # root = smallest index = first in keep order
        r0 = int(nodes[root])
        for m in nodes[group[1:]].tolist():
            twin[m], kind[m] = r0, CROSS
            members.append(m)
            roots.append(r0)
    members, roots = np.asarray(members, dtype=np.int64), np.asarray(roots, dtype=np.int64)
    below = int((estimate(rows, members, roots) < threshold).sum()) if len(members) else 0
    return {"candidate_pairs": int(len(cand)), "confirmed_pairs": int(len(confirmed)), "rejected": rejected,
            "clusters": len(groups), "below_threshold": below}


def resolve(kind: np.ndarray, twin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Point every drop at a kept record (twins point earlier in keep order, so a chain ends);
    ``twin`` is updated in place. Returns ``(dropped, identical)``: the indices of the drops
    (``int64``, ascending) and, aligned, whether each is a byte-identical copy of its kept
    twin — an exact drop whose first-of-its-hash twin stayed kept (a copy of a record
    dropped later by a near or cross pass is not identical to that record's kept twin,
    which would otherwise have been its exact twin)."""
    dropped = np.flatnonzero(kind != KEPT)
    first = twin[dropped].copy()
    while len(dropped) and (hop := kind[twin[dropped]] != KEPT).any():
        twin[dropped[hop]] = twin[twin[dropped[hop]]]
    return dropped, (kind[dropped] == EXACT) & (twin[dropped] == first)
