"""The stage-4 output tables (``decisions``, ``duplicate_clusters``) built from the
per-document decision arrays of :func:`megacpp_core.dedup.deduplicate_columns`.

Every per-document figure is a numpy column indexed by the document's position in keep
order (module doc of :mod:`megacpp_core.dedup`): ``kind`` (int8, :data:`KIND_NAMES`),
``twin`` (int64, the kept record a drop names, -1 when kept) and ``jaccard`` (float64,
NaN when kept). The tables are assembled with arrow ``take`` on the string columns, so
no per-document Python object is created.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: ``dup_kind`` of each ``kind`` code: 0 kept, 1 exact, 2 near, 3 cross-source.
KIND_NAMES = (None, "exact", "near", "cross_source")
KEPT, EXACT, NEAR, CROSS = 0, 1, 2, 3

DECISIONS_SCHEMA = pa.schema([
    ("doc_key", pa.string()), ("keep", pa.bool_()), ("dup_kind", pa.string()), ("kept_twin", pa.string()),
    ("jaccard", pa.float64()), ("cluster_id", pa.int64()), ("content_sha256", pa.string()),
])
CLUSTERS_SCHEMA = pa.schema([
    ("cluster_id", pa.int64()), ("cluster_size", pa.int64()), ("doc_key", pa.string()), ("source", pa.string()),
    ("is_kept", pa.bool_()), ("kept_doc_key", pa.string()), ("dup_kind", pa.string()), ("jaccard_to_kept", pa.float64()),
])

_KINDS = pa.array(KIND_NAMES[1:], pa.string())


@dataclass
class DedupTables:
    """Outcome of :func:`megacpp_core.dedup.deduplicate_columns`: ``decisions``
    (:data:`DECISIONS_SCHEMA`, one row per document, sorted by ``doc_key``),
    ``clusters`` (:data:`CLUSTERS_SCHEMA`, by ``cluster_id`` then keep order, kept member
    first) and ``figures`` (the keys of :class:`megacpp_core.dedup.DedupResult`)."""

    decisions: pa.Table
    clusters: pa.Table
    figures: dict = field(default_factory=dict)


def _nullable(values: np.ndarray, null: np.ndarray) -> pa.Array:
    return pa.array(values, mask=null) if null.any() else pa.array(values)


def take_rows(column: pa.Array, idx: np.ndarray, null: np.ndarray | None = None) -> pa.Array:
    """``column[idx]`` for ``int64[m]`` row indices ``idx``; rows where ``null`` (``bool[m]``)
    is set become nulls."""
    if null is not None and null.any():
        return column.take(pa.array(np.where(null, 0, idx), mask=null))
    return column.take(pa.array(idx, pa.int64()))


def dup_kinds(kind: np.ndarray) -> pa.Array:
    """``dup_kind`` strings (null when kept) of ``kind`` codes (``int8[n]``)."""
    kind = np.asarray(kind)
    return take_rows(_KINDS, kind.astype(np.int64) - 1, kind == KEPT)


def build_tables(keys: pa.Array, sources: pa.Array, sha: pa.Array, kind: np.ndarray, twin: np.ndarray,
                 jaccard: np.ndarray) -> tuple[pa.Table, pa.Table, dict]:
    """``(decisions, clusters, cluster figures)`` of ``n`` documents in keep order.

    ``keys``, ``sources``, ``sha`` are string arrays (``doc_key``, ``source``,
    ``content_sha256``) of length ``n``; ``kind`` int8[n], ``twin`` int64[n] (a kept
    index for every drop, each drop's twin earlier in keep order), ``jaccard`` float64[n]
    (the estimate to the twin, ignored for kept rows). A cluster is a kept record and
    every drop naming it; its id is the ordinal of the kept record among the clusters in
    keep order. Cluster figures: ``clusters`` (count) and ``largest_clusters`` (the ten
    largest: ``cluster_id``, ``size``, ``kept``, ``members``; larger first, then id).
    """
    n = len(keys)
    kind = np.asarray(kind, dtype=np.int8)
    twin = np.asarray(twin, dtype=np.int64)
    kept = kind == KEPT
    dropped = np.flatnonzero(~kept)
    roots = twin[dropped]
    kept_ids = np.unique(roots)  # keep order: the cluster id is the position
    cluster = np.full(n, -1, dtype=np.int64)
    cluster[kept_ids] = np.arange(kept_ids.size)
    cluster[dropped] = np.searchsorted(kept_ids, roots)
    decisions = pa.table({
        "doc_key": keys, "keep": pa.array(kept), "dup_kind": dup_kinds(kind), "kept_twin": take_rows(keys, twin, kept),
        "jaccard": _nullable(np.asarray(jaccard, dtype=np.float64), kept), "cluster_id": pa.array(cluster),
        "content_sha256": sha,
    }, schema=DECISIONS_SCHEMA)
    decisions = decisions.take(pc.sort_indices(keys)).combine_chunks()

    rows = np.concatenate((kept_ids, dropped))
    is_kept = np.concatenate((np.ones(kept_ids.size, bool), np.zeros(dropped.size, bool)))
    cid = cluster[rows]
    order = np.lexsort((rows, ~is_kept, cid))
    rows, is_kept, cid = rows[order], is_kept[order], cid[order]
    size = np.bincount(cluster[dropped], minlength=kept_ids.size).astype(np.int64) + 1
    jac = np.where(is_kept, 1.0, np.asarray(jaccard, dtype=np.float64)[rows])
    clusters = pa.table({
        "cluster_id": pa.array(cid, pa.int64()), "cluster_size": pa.array(size[cid], pa.int64()),
        "doc_key": take_rows(keys, rows), "source": take_rows(sources, rows), "is_kept": pa.array(is_kept),
        "kept_doc_key": take_rows(keys, kept_ids[cid]), "dup_kind": dup_kinds(kind[rows]),
        "jaccard_to_kept": pa.array(jac, pa.float64()),
    }, schema=CLUSTERS_SCHEMA).combine_chunks()

    largest = []
    for c in np.lexsort((np.arange(kept_ids.size), -size))[:10].tolist():
        members = dropped[cluster[dropped] == c]
        largest.append({"cluster_id": c, "size": int(size[c]), "kept": keys[int(kept_ids[c])].as_py(),
                        "members": take_rows(keys, members).to_pylist()})
    return decisions, clusters, {"clusters": int(kept_ids.size), "largest_clusters": largest}
