"""Stage 4 — exact, near and cross-source dedup decisions (SPEC §4 "Dedup").

Per snapshot, fanning in from every revision × shard, on bounded summaries: the scrubbed
shards' metadata and ``content_sha256`` (never the texts), the ``minhash`` signatures and
the cross-source candidate pairs of every LSH band range, held as columns: the metadata as
one arrow table in keep order, the signatures as one ``uint32[n, num_perm]`` matrix, the
pairs as ``int64[m, 2]`` row indices (:func:`megacpp_core.dedup.deduplicate_columns`).
Only the texts of records in a candidate pair whose estimate reaches the threshold are
streamed (record batches, only from the shards and row groups holding them) for the
exact-Jaccard verification, and only their shingle-hash sets are kept.
Outputs: ``decisions`` (keep/drop per file; a drop names its kept twin) and
``duplicate_clusters``; later stages read the kept files shard by shard
(:mod:`megacpp_core.kept`) in keep order (license rank, source order, path). The rules
are :mod:`megacpp_core.dedup`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megacpp_checks.schemas import dedup as dedup_schema

from .. import catalog, dedup, dedup_tables
from ..signatures import read_ref_signatures
from ..stage import Partitioning, Result, Stage

DECISIONS_SCHEMA = dedup_tables.DECISIONS_SCHEMA
CLUSTERS_SCHEMA = dedup_tables.CLUSTERS_SCHEMA


#: Scrubbed columns dedup reads: everything but the text (the exact pass compares
#: ``content_sha256``; the exact-Jaccard verification streams only candidate texts).
META_COLUMNS = ["doc_key", "source", "source_order", "path", "license_class", "content_sha256"]
META_SCHEMA = pa.schema([("doc_key", pa.string()), ("source", pa.string()), ("source_order", pa.int32()),
                         ("path", pa.string()), ("license_class", pa.string()), ("content_sha256", pa.string())])


#: Rows per record batch when candidate texts are streamed for the exact-Jaccard check
#: (a batch's texts are the transient: at most 256 files of ``max_file_bytes``).
TEXT_BATCH_ROWS = 256


def _rows(keys: pa.Array, of: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """``int64[len(of)]``: the position of each of ``of`` in ``keys``, -1 when absent."""
    return pc.fill_null(pc.index_in(of, value_set=keys), -1).to_numpy().astype(np.int64)


def compute(ctx) -> Result:
    """The snapshot's ``decisions`` and ``duplicate_clusters`` (module doc); raises
    ``ValueError`` from :func:`megacpp_core.dedup.deduplicate_columns` on bad input."""
    s = ctx.settings
    shards = ctx.inputs("scrubbed")
    metas = [ref.read(columns=META_COLUMNS) for ref in shards]
    docs = pa.concat_tables(metas) if metas else META_SCHEMA.empty_table()
    # Every column in keep order, so the passes see one signature matrix they need not permute.
    perm = dedup.keep_order_indices(docs)
    shard_of = np.repeat(np.arange(len(metas), dtype=np.int32), [m.num_rows for m in metas])[perm]
    docs = docs.take(pa.array(perm)).combine_chunks()
    del metas, perm
    keys = docs.column("doc_key").chunk(0) if docs.num_rows else pa.array([], pa.string())
    texts_read: set[str] = set()  # files whose text was streamed (once or more)

    def load_texts(want: set[str]):
        """Stream ``(doc_key, text)`` of ``want``, reading only the shards that hold them
        and, in those, only the row groups that do (found from the ``doc_key`` column),
        :data:`TEXT_BATCH_ROWS` rows at a time."""
        value_set = pa.array(sorted(want), pa.string())
        for i in np.unique(shard_of[pc.is_in(keys, value_set=value_set).to_numpy(zero_copy_only=False)]).tolist():
            pf = shards[i].parquet_file()
            hit_rows = np.flatnonzero(pc.is_in(pf.read(columns=["doc_key"], use_threads=False).column(0),
                                               value_set=value_set).to_numpy(zero_copy_only=False))
            ends = np.cumsum([pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)])
            groups = np.unique(np.searchsorted(ends, hit_rows, side="right")).tolist()
            for batch in pf.iter_batches(batch_size=TEXT_BATCH_ROWS, row_groups=groups, columns=["doc_key", "text"],
                                         use_threads=False):
                hit = batch.filter(pc.is_in(batch.column(0), value_set=value_set))
                hit_keys = hit.column(0).to_pylist()
                texts_read.update(hit_keys)
                yield from zip(hit_keys, hit.column(1).to_pylist())

    sig = np.empty((docs.num_rows, s.minhash_num_perm), dtype=np.uint32)
    have = np.zeros(docs.num_rows, dtype=bool)
    for ref in ctx.inputs("minhash"):
        shard_keys, shard_sig = read_ref_signatures(ref)
        if len(shard_keys) and shard_sig.shape[1] == s.minhash_num_perm:
            at = _rows(keys, shard_keys)
            sig[at[at >= 0]] = shard_sig[at >= 0]
            have[at[at >= 0]] = True
        del shard_keys, shard_sig
    cross_pairs = [np.zeros((0, 2), np.int64)]
    for lo, hi in catalog.LSH_PAIRS:
        t = ctx.input(catalog.LSH_PAIRS[(lo, hi)].name).read()
        ab = np.stack((_rows(keys, t.column("doc_key_a")), _rows(keys, t.column("doc_key_b"))), axis=1)
        cross_pairs.append(ab[(ab >= 0).all(axis=1)])  # pairs naming unknown keys are ignored
    result = dedup.deduplicate_columns(docs, sig, have, np.concatenate(cross_pairs), num_perm=s.minhash_num_perm,
                                       threshold=s.minhash_threshold, shingle_k=s.shingle_k, load_texts=load_texts)
    figures = dict(result.figures)
    figures["signatures_precomputed"] = bool(have.all())
    figures["cross_pairs_from_band_steps"] = True
    figures["texts_read_for_verification"] = len(texts_read)  # distinct files
    figures["shards_in"] = len(shards)
    return Result({"decisions": result.decisions, "duplicate_clusters": result.clusters}, figures)


def each_drop_names_kept_twin(g):
    """Every drop names a kept twin, and appears in ``duplicate_clusters`` with it."""
    return dedup_schema.validate_decisions(g.value("decisions"), g.value("duplicate_clusters"))


#: Figures of :func:`megacpp_core.dedup.deduplicate` (see its ``DedupResult.figures``).
DEDUP_FIGURES = ("candidate_probability", "clusters", "cross_candidate_pairs", "cross_candidate_probability",
                 "cross_confirmed_pairs", "cross_effective_threshold", "cross_lsh_bands", "cross_lsh_rows",
                 "cross_num_perm", "cross_rejected_by_exact", "cross_source_below_threshold", "cross_source_clusters",
                 "cross_source_removal_rate", "cross_source_removed", "effective_threshold", "exact_removal_rate",
                 "exact_removed", "files_in", "files_out", "largest_clusters", "lsh_bands", "lsh_rows",
                 "near_candidate_pairs", "near_rejected_by_exact", "near_removal_rate", "near_removed", "num_perm",
                 "shingle_k", "threshold", "verify_exact")

STAGE = Stage(
    name="dedup", asset="dedup_decisions", partitioning=Partitioning.SNAPSHOT, compute=compute, code_version="1",
    description="Stage 4: SHA-256 exact dedup, MinHash-LSH near dedup within each source, then the cross-source "
                "union-find pass over the merged band-range candidate pairs; writes duplicate_clusters.",
    inputs=(catalog.SCRUBBED, catalog.MINHASH, *catalog.LSH_PAIRS.values()),
    outputs=(catalog.DECISIONS, catalog.DUPLICATE_CLUSTERS),
    settings=("minhash_num_perm", "minhash_threshold", "shingle_k"), gates=(each_drop_names_kept_twin,),
    figures=(*DEDUP_FIGURES, "signatures_precomputed", "cross_pairs_from_band_steps", "texts_read_for_verification",
             "shards_in"),
)
