"""Stage 4b — cross-source LSH candidate pairs, one step per band range (SPEC §4 "Dedup").

Per snapshot; each band range is its own stage (its own step and pod, ``heavy="minhash"``)
so the cross-source index of 14 bands × 8 rows over 112 permutations is split over
workers. Input: every revision's ``minhash`` signatures. Output: ``lsh_pairs_LO_HI`` —
candidate pairs across sources (``doc_key_a < doc_key_b``, sorted). The union-find over
the merged pairs is the ``dedup`` stage.
"""

from __future__ import annotations

import functools

import pyarrow as pa
import pyarrow.compute as pc

from .. import catalog, dedup
from ..signatures import snapshot_signatures
from ..stage import Partitioning, Result, Stage

#: Band ranges of the 14 cross-source bands, one step (pod) each; they cover 0-13 once.
BAND_RANGES = tuple(catalog.LSH_PAIRS)


def compute(lo: int, hi: int, ctx) -> Result:
    """The candidate pairs of bands ``lo``..``hi``-1 (bound per stage with ``functools.partial``,
    which pickles by name: ``megacpp run --workers`` sends stage declarations to its workers)."""
    out = catalog.LSH_PAIRS[(lo, hi)].name
    rows_ = dedup.CROSS_ROWS
    order = {x.name: i for i, x in enumerate(ctx.sources)}
    # only this range's permutations (columns lo·r … hi·r − 1), as bands 0 … hi − lo − 1
    keys, src_id, sig = snapshot_signatures(ctx.inputs("minhash"), ctx.settings.minhash_num_perm, order,
                                            slice(lo * rows_, hi * rows_))
    pairs = dedup.cross_source_candidates(sig, src_id, 0, hi - lo)
    del sig
    a = keys.take(pa.array(pairs[:, 0])) if len(pairs) else pa.array([], pa.string())
    b = keys.take(pa.array(pairs[:, 1])) if len(pairs) else pa.array([], pa.string())
    first = pc.less(a, b)
    table = pa.table({"doc_key_a": pc.if_else(first, a, b), "doc_key_b": pc.if_else(first, b, a)})
    table = table.take(pc.sort_indices(table, sort_keys=[("doc_key_a", "ascending"), ("doc_key_b", "ascending")]))
    table = pa.table({c: table.column(c).combine_chunks() for c in table.column_names})
    cross = bool((src_id[pairs[:, 0]] != src_id[pairs[:, 1]]).all()) if len(pairs) else True
    figures = {"band_lo": lo, "band_hi": hi, "rows_per_band": rows_, "documents": len(keys),
               "candidate_pairs": table.num_rows, "index_bytes_per_document": (hi - lo) * 12,
               "all_pairs_cross_source": cross}
    return Result({out: table}, figures)


def pairs_cross_source(g):
    """Every candidate pair joins files of two different sources."""
    f = g.figures
    if f["all_pairs_cross_source"]:
        return True, f"{f['candidate_pairs']} candidate pairs, all across sources"
    return False, "same-source pair found"


def _stage(lo: int, hi: int) -> Stage:
    name = f"lsh_bands_{lo:02d}_{hi:02d}"
    return Stage(
        name=name, asset=name, partitioning=Partitioning.SNAPSHOT, compute=functools.partial(compute, lo, hi), code_version="1",
        description=f"Stage 4b: cross-source LSH candidate pairs of bands {lo}-{hi - 1} (14 x 8 over 112 permutations).",
        inputs=(catalog.MINHASH,), outputs=(catalog.LSH_PAIRS[(lo, hi)],), settings=("minhash_num_perm",),
        gates=(pairs_cross_source,), heavy="minhash",
        figures=("band_lo", "band_hi", "rows_per_band", "documents", "candidate_pairs", "index_bytes_per_document",
                 "all_pairs_cross_source"),
    )


STAGES = tuple(_stage(lo, hi) for lo, hi in BAND_RANGES)
