"""Stage 8 — tokenize (SPEC §4, §6).

Per revision × shard. Inputs: the shard's ``chunks`` and the snapshot ``tokenizer``.
Output: the shard's ``tokenized`` documents (every chunk; the chunk-level dedup drops are
left out by the pack and format stages, which read ``chunk_drops``) — ``[BOS] + ids`` as uint32 per document with its exact round trip checked,
and the enrichment planes aligned token-for-token (fails closed on any misalignment).
Refuses a tokenizer that is not the one the documents were chunked with, the manifest's
pin or the manifest's vocabulary size (:mod:`megacpp_core.tokenize`).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from .. import catalog, snapshot_tokenizer, tokenize
from .. import tokenizer as tk
from ..stage import Partitioning, Result, Stage, StageError

#: Parquet key-value metadata naming the tokenizer the ids were made with.
TOKENIZER_KEY = b"megacpp.tokenizer_sha256"


def compute(ctx) -> Result:
    tok, info = snapshot_tokenizer.load(ctx)
    s = ctx.settings
    docs_ref = ctx.input("chunks")
    try:
        tokenize.check_tokenizer(tok, info, vocab_size=s.vocab_size, pinned_sha256=(s.tokenizer or {}).get("sha256"),
                                 upstream_sha256=docs_ref.metadata().get("tokenizer_sha256"))
    except tk.TokenizerMismatchError as e:
        raise StageError(f"tokenize refuses the snapshot tokenizer: {e}") from e
    docs = docs_ref.read()
    table, figures = tokenize.tokenize_documents(docs, tok, info["vocab_size"], sha256=info["sha256"])
    if "char_structure" in table.column_names:
        try:
            table, align_figs = tokenize.align_enrichment(table, tok, info["sha256"])
        except tokenize.AlignmentError as e:
            raise StageError(f"tokenize: enrichment alignment failed closed: {e}") from e
        figures.update(align_figs)
    too_long = pc.sum(pc.greater(table.column("n_tokens"), s.row_length)).as_py() or 0
    if too_long:
        raise StageError(f"{too_long} documents exceed the row length {s.row_length} with BOS")
    table = table.replace_schema_metadata({TOKENIZER_KEY: info["sha256"].encode()})
    figures["tokenizer_sha256"] = info["sha256"]
    figures["vocab_size"] = info["vocab_size"]
    return Result({"tokenized": table}, figures)


def bos_first_ids_in_vocab_round_trip(g):
    """Re-read from the data root: every document starts with BOS and every id < vocab size
    (the exact round trip was checked while tokenizing)."""
    back = g.read("tokenized", columns=["input_ids"]).column("input_ids").combine_chunks()
    vocab = g.figures["vocab_size"]
    firsts = pc.list_element(back, 0) if len(back) else pa.array([], pa.uint32())
    bos_ok = len(back) == 0 or pc.all(pc.equal(firsts, tk.BOS_ID)).as_py()
    max_id = pc.max(back.flatten()).as_py() if len(back) else 0
    return (bool(bos_ok) and (max_id or 0) < vocab,
            f"{len(back)} documents read back; BOS first: {bos_ok}; max id {max_id} < {vocab}")


STAGE = Stage(
    name="tokenize", asset="tokenized_documents", partitioning=Partitioning.REVISION_SHARD, compute=compute, code_version="2",
    description="Stage 8: BOS + uint32 ids per document, round trip checked; enrichment planes aligned "
                "token-for-token (fails closed).",
    inputs=(catalog.CHUNKS, catalog.TOKENIZER, catalog.TOKENIZER_MANIFEST), outputs=(catalog.TOKENIZED,),
    settings=("vocab_size", "row_length", "tokenizer"), gates=(bos_first_ids_in_vocab_round_trip,),
    figures=("documents", "tokens", "text_bytes", "bytes_per_token", "max_document_tokens", "structure_token_share",
             "chunks_without_tokens", "token_chunks", "tokenizer_sha256", "vocab_size"),
)
