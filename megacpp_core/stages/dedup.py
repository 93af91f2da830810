"""Stage 4 — exact, near and cross-source dedup decisions (SPEC §4 "Dedup").

Per snapshot, fanning in from every revision. Inputs: every revision's ``scrubbed`` files
and ``minhash`` signatures, and the cross-source candidate pairs of every LSH band range.
Outputs: ``decisions`` (keep/drop per file; a drop names its kept twin), ``duplicate_clusters``
and ``kept`` — the surviving files in keep order (license rank, source order, path), the
order every later stage follows. The rules are :mod:`megacpp_core.dedup`.
"""

from __future__ import annotations

import pyarrow as pa

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


def compute(ctx) -> Result:
    s = ctx.settings
    docs = pa.concat_tables([ref.read() for ref in ctx.inputs("scrubbed")])
    d = docs.to_pydict()
    records = [dedup.DedupRecord(doc_key=d["doc_key"][i], source=d["source"][i], source_order=d["source_order"][i],
                                 path=d["path"][i], license_class=d["license_class"][i], text=d["text"][i])
               for i in range(docs.num_rows)]
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
                               signatures=sigs, cross_pairs=cross_pairs)
    decisions = pa.Table.from_pylist(result.decisions, schema=DECISIONS_SCHEMA)
    clusters = pa.Table.from_pylist(result.clusters, schema=CLUSTERS_SCHEMA)
    keep = {r["doc_key"] for r in result.decisions if r["keep"]}
    kept = docs.filter(pa.array([k in keep for k in d["doc_key"]], type=pa.bool_()))
    k = kept.select(["license_class", "source_order", "path"]).to_pydict()
    order = sorted(range(kept.num_rows), key=lambda i: (dedup.LICENSE_RANK[k["license_class"][i]], k["source_order"][i], k["path"][i]))
    kept = kept.take(pa.array(order, type=pa.int64()))
    figures = dict(result.figures)
    figures["bytes_out"] = int(sum(len(t.encode("utf-8")) for t in kept.column("text").to_pylist()))
    figures["signatures_precomputed"] = len(sigs) == docs.num_rows
    figures["cross_pairs_from_band_steps"] = True
    return Result({"decisions": decisions, "duplicate_clusters": clusters, "kept": kept}, figures)


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
    outputs=(catalog.DECISIONS, catalog.DUPLICATE_CLUSTERS, catalog.KEPT),
    settings=("minhash_num_perm", "minhash_threshold", "shingle_k"), gates=(each_drop_names_kept_twin,),
    figures=(*DEDUP_FIGURES, "bytes_out", "signatures_precomputed", "cross_pairs_from_band_steps"),
)
