"""Stage 7 — chunk-level dedup (SPEC §4 "Dedup").

Per snapshot, on hashes only. Input: every shard's ``chunks``, read shard by shard in
record batches (a shard without a whitelisted chunk is read for its ``kind`` column only,
never its texts); only the whitelisted chunks' ``kind`` and normalized-text hash are kept
(:func:`megacpp_core.chunk_dedup.chunk_hashes`), never their texts. Output:
``chunk_drops`` — each dropped chunk with its kept twin, the first of its hash in snapshot
keep order (:func:`megacpp_core.kept.document_order`), so the decision does not depend on
the number of shards. The pack and format stages leave the drops out. Only FUNC_BODY,
CLASS_DECL, TYPEDEF and NAMESPACE chunks may be dropped.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from .. import catalog, chunk_dedup
from .. import kept as kept_files
from ..stage import Partitioning, Result, Stage

#: Columns read from each chunks shard (the text only to hash it, one batch at a time).
COLUMNS = kept_files.DOCUMENT_ORDER_COLUMNS + ["kind", "text"]
BATCH_ROWS = 1024


def compute(ctx) -> Result:
    refs, parts, chunks_in = ctx.inputs("chunks"), [], 0
    whitelist = pa.array(sorted(chunk_dedup.WHITELIST), pa.string())
    for ref in refs:
        pf = ref.parquet_file()
        chunks_in += pf.metadata.num_rows
        if not pc.any(pc.is_in(pf.read(columns=["kind"], use_threads=False).column("kind"), value_set=whitelist)).as_py():
            continue  # no whitelisted chunk: the shard's texts are never read
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=COLUMNS, use_threads=False):
            parts.append(chunk_dedup.chunk_hashes(pa.Table.from_batches([batch])))
    order = {s.name: i for i, s in enumerate(ctx.sources)}
    hashes = kept_files.document_order(pa.concat_tables(parts), order) if parts else None
    drops, by_kind = chunk_dedup.drops_from_hashes(hashes) if hashes is not None else (chunk_dedup.DROPS_SCHEMA.empty_table(), {})
    figures = {"chunks_in": chunks_in, "chunks_out": chunks_in - drops.num_rows, "dropped": by_kind,
               "whitelisted_chunks": 0 if hashes is None else hashes.num_rows, "shards_in": len(refs)}
    return Result({"chunk_drops": drops}, figures)


def only_whitelisted_kinds_dropped(g):
    """No chunk outside FUNC_BODY, CLASS_DECL, TYPEDEF, NAMESPACE was dropped."""
    dropped = g.figures["dropped"]
    bad = set(dropped) - chunk_dedup.WHITELIST
    return not bad, f"dropped kinds {sorted(dropped)}"


STAGE = Stage(
    name="chunk_dedup", asset="chunk_dedup", partitioning=Partitioning.SNAPSHOT, compute=compute, code_version="2",
    description="Stage 7: exact dedup of FUNC_BODY, CLASS_DECL, TYPEDEF and NAMESPACE chunks only, decided on "
                "normalized-text hashes streamed from the chunk shards.",
    inputs=(catalog.CHUNKS,), outputs=(catalog.CHUNK_DROPS,), gates=(only_whitelisted_kinds_dropped,),
    figures=("chunks_in", "chunks_out", "dropped", "whitelisted_chunks", "shards_in"),
)
