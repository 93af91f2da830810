"""Stage 4b — cross-source LSH candidate pairs, one step per band range (SPEC §4 "Dedup").

Per snapshot; each band range is its own stage (its own step and pod, ``heavy="minhash"``)
so the cross-source index of 14 bands × 8 rows over 112 permutations is split over
workers. Input: every revision's ``minhash`` signatures, read one shard at a time; the
band keys and the pairs go through hash buckets on local disk of about
``dedup_bucket_rows`` records each (:mod:`megacpp_core.lsh_stream`), so memory is one
shard and one bucket whatever the snapshot's size. Output: ``lsh_pairs_LO_HI`` —
candidate pairs across sources as rows of the concatenated minhash inputs
(``row_a < row_b``, sorted, unique), naming those inputs in its metadata. The union-find
over the merged pairs is the ``dedup`` stage.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import catalog, dedup, lsh_stream
from ..stage import Partitioning, Result, Stage

#: Band ranges of the 14 cross-source bands, one step (pod) each; they cover 0-13 once.
BAND_RANGES = tuple(catalog.LSH_PAIRS)


def compute(lo: int, hi: int, ctx) -> Result:
    """The candidate pairs of bands ``lo``..``hi``-1 (bound per stage with ``functools.partial``,
    which pickles by name: ``megacpp run --workers`` sends stage declarations to its workers)."""
    out = catalog.LSH_PAIRS[(lo, hi)].name
    order = {x.name: i for i, x in enumerate(ctx.sources)}
    path = ctx.workdir(f"{out}-") / f"{out}.parquet"
    with ctx.scratch(f"{out}-spill-") as spill:
        figures = lsh_stream.band_range_pairs(ctx.inputs("minhash"), order, lo, hi, dedup.CROSS_ROWS,
                                              ctx.settings.minhash_num_perm, spill, path, ctx.settings.dedup_bucket_rows)
    ctx.log(f"{out}: {figures['candidate_pairs']} candidate pairs over {figures['documents']} signatures "
            f"({figures['key_buckets']} key bucket(s))")
    figures = {"band_lo": lo, "band_hi": hi, "rows_per_band": dedup.CROSS_ROWS, **figures}
    return Result({out: path}, figures)


def pairs_cross_source(g):
    """Every committed candidate pair joins files of two different sources, and names rows
    of the minhash inputs this run read."""
    ref = g.output(g.ctx.stage.outputs[0].name)
    inputs = g.inputs("minhash")
    if ref.metadata().get("minhash_inputs") != lsh_stream.inputs_digest(inputs):
        return False, "the pairs name rows of other minhash inputs"
    counts = [r.parquet_file().metadata.num_rows for r in inputs]
    starts = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    source = np.array([r.source for r in inputs] or [""], dtype=object)
    n = 0
    for block in lsh_stream.read_pairs(ref):
        at = np.searchsorted(starts, block, side="right") - 1
        if (block >= starts[-1]).any() or (source[at[:, 0]] == source[at[:, 1]]).any():
            return False, "a pair names a row outside the inputs or two files of one source"
        n += len(block)
    return True, f"{n} candidate pairs, all across sources"


def _stage(lo: int, hi: int) -> Stage:
    name = f"lsh_bands_{lo:02d}_{hi:02d}"
    return Stage(
        name=name, asset=name, partitioning=Partitioning.SNAPSHOT, compute=functools.partial(compute, lo, hi), code_version="2",
        description=f"Stage 4b: cross-source LSH candidate pairs of bands {lo}-{hi - 1} (14 x 8 over 112 permutations), "
                    "through band-key and pair buckets on local disk.",
        inputs=(catalog.MINHASH,), outputs=(catalog.LSH_PAIRS[(lo, hi)],),
        settings=("minhash_num_perm", "dedup_bucket_rows"), gates=(pairs_cross_source,), heavy="minhash",
        figures=("band_lo", "band_hi", "rows_per_band", "documents", "candidate_pairs", "key_buckets", "pair_buckets",
                 "spill_bytes", "all_pairs_cross_source"),
    )


STAGES = tuple(_stage(lo, hi) for lo, hi in BAND_RANGES)
