"""Stage 4 — exact, near and cross-source dedup decisions (SPEC §4 "Dedup").

Per snapshot, fanning in from every revision × shard, on bounded summaries and with
memory set by settings (:mod:`megacpp_core.dedup_stream`): the scrubbed shards' metadata
and ``content_sha256`` (never the texts) indexed in keep order one source at a time, the
``minhash`` signatures spilled per source to local disk, the exact pass over hash buckets
of about ``dedup_bucket_rows`` records, the near pass one source at a time and the
cross-source pass over the band steps' candidate pairs. Only the texts of records in a
candidate pair whose estimate reaches the threshold are streamed (record batches, only
from the shards and row groups holding them) for the exact-Jaccard verification.
Outputs, streamed: ``decisions`` (keep/drop per file; a drop names its kept twin) and
``duplicate_clusters``; later stages read the kept files shard by shard
(:mod:`megacpp_core.kept`) in keep order (license rank, source order, path). The rules
are :mod:`megacpp_core.dedup`.
"""

from __future__ import annotations


from megacpp_checks.schemas import dedup as dedup_schema

from .. import catalog, dedup_stream, dedup_tables, lsh_stream
from ..dedup_index import DedupInputError
from ..stage import Partitioning, Result, Stage

DECISIONS_SCHEMA = dedup_tables.DECISIONS_SCHEMA
CLUSTERS_SCHEMA = dedup_tables.CLUSTERS_SCHEMA


def compute(ctx) -> Result:
    """The snapshot's ``decisions`` and ``duplicate_clusters`` (module doc); raises
    :class:`~megacpp_core.dedup_index.DedupInputError` on inconsistent inputs (stale band
    steps, duplicate keys, a malformed hash)."""
    s = ctx.settings
    shards, signatures = ctx.inputs("scrubbed"), ctx.inputs("minhash")
    digest = lsh_stream.inputs_digest(signatures)
    pair_refs = [ctx.input(d.name) for d in catalog.LSH_PAIRS.values()]
    for ref in pair_refs:
        if ref.metadata().get("minhash_inputs") != digest:
            raise DedupInputError(f"{ref.uri} names rows of other minhash inputs: re-run its LSH step first")

    def pairs():
        for ref in pair_refs:
            yield from lsh_stream.read_pairs(ref)

    work = ctx.workdir("dedup-")
    figures = dedup_stream.deduplicate_partitioned(
        shards, signatures, pairs, work / "spill", work / "decisions.parquet", work / "duplicate_clusters.parquet",
        num_perm=s.minhash_num_perm, threshold=s.minhash_threshold, shingle_k=s.shingle_k,
        bucket_rows=s.dedup_bucket_rows, verify_exact=s.minhash_verify_exact, log=ctx.log)
    figures["signatures_precomputed"] = figures.pop("signatures_computed") == 0
    figures["cross_pairs_from_band_steps"] = True
    figures["shards_in"] = len(shards)
    return Result({"decisions": work / "decisions.parquet", "duplicate_clusters": work / "duplicate_clusters.parquet"},
                  figures)


def each_drop_names_kept_twin(g):
    """Every drop names a kept twin, and appears in ``duplicate_clusters`` with it (both
    committed tables read row group by row group; each table's own rules are its
    ``_schema`` check)."""
    return dedup_schema.validate_decisions_files(g.output("decisions").parquet_file(),
                                                 g.output("duplicate_clusters").parquet_file(), tables_checked=True)


#: Figures of :func:`megacpp_core.dedup.deduplicate` (see its ``DedupResult.figures``).
DEDUP_FIGURES = ("candidate_probability", "clusters", "cross_candidate_pairs", "cross_candidate_probability",
                 "cross_confirmed_pairs", "cross_effective_threshold", "cross_lsh_bands", "cross_lsh_rows",
                 "cross_num_perm", "cross_rejected_by_exact", "cross_source_below_threshold", "cross_source_clusters",
                 "cross_source_removal_rate", "cross_source_removed", "effective_threshold", "exact_removal_rate",
                 "exact_removed", "files_in", "files_out", "largest_clusters", "lsh_bands", "lsh_rows",
                 "near_candidate_pairs", "near_rejected_by_exact", "near_removal_rate", "near_removed", "num_perm",
                 "shingle_k", "threshold", "verify_exact")

STAGE = Stage(
    name="dedup", asset="dedup_decisions", partitioning=Partitioning.SNAPSHOT, compute=compute, code_version="2",
    description="Stage 4: SHA-256 exact dedup over hash buckets, MinHash-LSH near dedup within each source, then the "
                "cross-source union-find pass over the merged band-range candidate pairs; memory set by "
                "dedup_bucket_rows and the largest source; writes duplicate_clusters.",
    inputs=(catalog.SCRUBBED, catalog.MINHASH, *catalog.LSH_PAIRS.values()),
    outputs=(catalog.DECISIONS, catalog.DUPLICATE_CLUSTERS),
    settings=("minhash_num_perm", "minhash_threshold", "shingle_k", "dedup_bucket_rows", "minhash_verify_exact"),
    gates=(each_drop_names_kept_twin,),
    figures=(*DEDUP_FIGURES, "signatures_precomputed", "cross_pairs_from_band_steps", "texts_read_for_verification",
             "shards_in", "exact_buckets"),
)
