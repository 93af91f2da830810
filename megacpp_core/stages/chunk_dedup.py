"""Stage 7 — chunk-level dedup (SPEC §4 "Dedup").

Per snapshot. Input: ``chunks``. Outputs: ``deduped`` (the documents left, in keep order)
and ``chunk_drops`` (each dropped chunk with its kept twin). Only FUNC_BODY, CLASS_DECL,
TYPEDEF and NAMESPACE chunks may be dropped (:mod:`megacpp_core.chunk_dedup`).
"""

from __future__ import annotations

from .. import catalog, chunk_dedup
from ..stage import Partitioning, Result, Stage


def compute(ctx) -> Result:
    docs = ctx.input("chunks").read()
    kept, drops, figures = chunk_dedup.dedup_chunks(docs)
    kept = kept.replace_schema_metadata(docs.schema.metadata)  # keeps the tokenizer lineage key
    return Result({"deduped": kept, "chunk_drops": drops}, figures)


def only_whitelisted_kinds_dropped(g):
    """No chunk outside FUNC_BODY, CLASS_DECL, TYPEDEF, NAMESPACE was dropped."""
    dropped = g.figures["dropped"]
    bad = set(dropped) - chunk_dedup.WHITELIST
    return not bad, f"dropped kinds {sorted(dropped)}"


STAGE = Stage(
    name="chunk_dedup", asset="chunk_dedup", partitioning=Partitioning.SNAPSHOT, compute=compute, code_version="1",
    description="Stage 7: exact dedup of FUNC_BODY, CLASS_DECL, TYPEDEF and NAMESPACE chunks only.",
    inputs=(catalog.CHUNKS,), outputs=(catalog.DEDUPED, catalog.CHUNK_DROPS), gates=(only_whitelisted_kinds_dropped,),
    figures=("chunks_in", "chunks_out", "dropped"),
)
