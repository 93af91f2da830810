"""Stage 4 — exact, near and cross-source dedup decisions (SPEC §4 "Dedup").

Per snapshot, fanning in from every revision × shard, on bounded summaries: the scrubbed
shards' metadata and ``content_sha256`` (never the texts), the ``minhash`` signatures and
the cross-source candidate pairs of every LSH band range. Only the texts of records in a
candidate pair whose estimate reaches the threshold are streamed (record batches, shard by
shard) for the exact-Jaccard verification, and only their shingle-hash sets are kept.
Outputs: ``decisions`` (keep/drop per file; a drop names its kept twin) and
``duplicate_clusters``; later stages read the kept files shard by shard
(:mod:`megacpp_core.kept`) in keep order (license rank, source order, path). The rules
are :mod:`megacpp_core.dedup`.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from megacpp_checks.schemas import dedup as dedup_schema

from .. import catalog, dedup
from ..signatures import table_signatures
from ..stage import Partitioning, Result, Stage

DECISIONS_SCHEMA = pa.schema([
    ("doc_key", pa.string()), ("keep", pa.bool_()), ("dup_kind", pa.string()), ("kept_twin", pa.string()),
    ("jaccard", pa.float64()), ("cluster_id", pa.int64()), ("content_sha256", pa.string()),
])
CLUSTERS_SCHEMA = pa.schema([
    ("cluster_id", pa.int64()), ("cluster_size", pa.int64()), ("doc_key", pa.string()), ("source", pa.string()),
    ("is_kept", pa.bool_()), ("kept_doc_key", pa.string()), ("dup_kind", pa.string()), ("jaccard_to_kept", pa.float64()),
])


#: Scrubbed columns dedup reads: everything but the text (the exact pass compares
#: ``content_sha256``; the exact-Jaccard verification streams only candidate texts).
META_COLUMNS = ["doc_key", "source", "source_order", "path", "license_class", "content_sha256"]


def compute(ctx) -> Result:
    s = ctx.settings
    shards = ctx.inputs("scrubbed")
    metas = [ref.read(columns=META_COLUMNS) for ref in shards]
    docs = pa.concat_tables(metas) if metas else pa.table({c: pa.array([], pa.string()) for c in META_COLUMNS})
    d = docs.to_pydict()
    records = [dedup.DedupRecord(doc_key=d["doc_key"][i], source=d["source"][i], source_order=d["source_order"][i],
                                 path=d["path"][i], license_class=d["license_class"][i], text=None,
                                 content_sha256=d["content_sha256"][i])
               for i in range(docs.num_rows)]
    del d
    texts_read = [0]

    def load_texts(keys: set[str]):
        """Stream ``(doc_key, text)`` of ``keys`` shard by shard (record batches)."""
        value_set = pa.array(sorted(keys), pa.string())
        for ref in shards:
            for batch in ref.parquet_file().iter_batches(batch_size=1024, columns=["doc_key", "text"]):
                hit = batch.filter(pc.is_in(batch.column(0), value_set=value_set))
                texts_read[0] += hit.num_rows
                yield from zip(hit.column(0).to_pylist(), hit.column(1).to_pylist())

    sigs = {}
    for ref in ctx.inputs("minhash"):
        keys, sig = table_signatures(ref.read(), ref.uri)
        if len(keys) and sig.shape[1] == s.minhash_num_perm:
            sigs.update(zip(keys, sig))
    cross_pairs = []
    for lo, hi in catalog.LSH_PAIRS:
        t = ctx.input(catalog.LSH_PAIRS[(lo, hi)].name).read()
        cross_pairs += list(zip(t.column("doc_key_a").to_pylist(), t.column("doc_key_b").to_pylist()))
    result = dedup.deduplicate(records, num_perm=s.minhash_num_perm, threshold=s.minhash_threshold, shingle_k=s.shingle_k,
                               signatures=sigs, cross_pairs=cross_pairs, load_texts=load_texts)
    decisions = pa.Table.from_pylist(result.decisions, schema=DECISIONS_SCHEMA)
    clusters = pa.Table.from_pylist(result.clusters, schema=CLUSTERS_SCHEMA)
    figures = dict(result.figures)
    figures["signatures_precomputed"] = len(sigs) == docs.num_rows
    figures["cross_pairs_from_band_steps"] = True
    figures["texts_read_for_verification"] = texts_read[0]
    figures["shards_in"] = len(shards)
    return Result({"decisions": decisions, "duplicate_clusters": clusters}, figures)


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
