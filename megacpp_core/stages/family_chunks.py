"""Curriculum families, phases 1 and 2 — the documents of ``p1_simple``, ``p1_docrich``
and ``p2_file`` (SPEC §5b), per revision × shard.

Inputs: the shard's ``tokenized`` documents and the snapshot ``tokenizer``. Nothing is
tokenized again: phase-1 documents are the tokenized documents cut by ids to 4,096
tokens, split by documentation-comment share (the phase-1 family stages leave out the
pieces of the chunk-level dedup drops, as pack and format do, so this stage runs beside
``tokenize`` without waiting for the snapshot); ``p2_file`` documents join every chunk
of a file into one 16,384-token document with its planes and chunk graph
(:mod:`megacpp_core.family_documents`).
"""

from __future__ import annotations

import pyarrow.compute as pc

from .. import catalog, families, family_documents, pack, snapshot_tokenizer, tokenize
from .. import tokenizer as tk
from ..stage import Partitioning, Result, Stage

P1, P2 = families.BY_NAME["p1_simple"], families.BY_NAME["p2_file"]


def compute(ctx) -> Result:
    tok, info = snapshot_tokenizer.load(ctx)
    ref = ctx.input("tokenized")
    pack.check_tokenizer({"tokenizer_sha256": ref.metadata().get("tokenizer_sha256")}, info["sha256"], None, ref.uri)
    names = ref.schema().names
    docs = ref.read(columns=[c for c in family_documents.READ_COLUMNS if c in names])
    ends_line, inside = family_documents.tokenizer_flags(tok, info["sha256"])
    p1, p1_figs = family_documents.phase1_documents(docs, P1.row_length, lambda ids: tokenize.decode_ids(tok, info["sha256"], ids),
                                                    ends_line, inside, tk.BOS_ID)
    split = families.split_phase1(p1)
    p2, p2_figs = family_documents.file_documents(docs, P2.row_length, tk.BOS_ID)
    meta = {family_documents.TOKENIZER_KEY: info["sha256"].encode()}
    out = {f"{name}_documents": t.replace_schema_metadata(meta) for name, t in (*split.items(), ("p2_file", p2))}
    body = int(pc.sum(docs.column("n_tokens")).as_py() or 0) - docs.num_rows
    figures = {"documents_in": docs.num_rows, "body_tokens": body,
               "p1_split_documents": p1_figs["split_documents"], "p1_pieces": p1_figs["pieces"],
               "p2_whole_files": p2_figs["whole_files"], "p2_fallback_files": p2_figs["fallback_files"]}
    for name, t in out.items():
        figures[name.replace("_documents", "_docs")] = t.num_rows
        figures[name.replace("_documents", "_tokens")] = int(pc.sum(t.column("n_tokens")).as_py() or 0)
    return Result(out, figures)


def every_token_once(g):
    """Re-read from the data root: the two phase-1 families together, and ``p2_file``, each
    hold every token of the shard's documents once (a piece is BOS + a slice of its
    document's ids; a whole file is BOS + its chunks' ids)."""
    f, body = g.figures, {}
    for name in ("p1_simple", "p1_docrich", "p2_file"):
        n = g.read(f"{name}_documents", columns=["n_tokens"]).column("n_tokens")
        body[name] = int(pc.sum(n).as_py() or 0) - len(n)
    p1 = body["p1_simple"] + body["p1_docrich"]
    ok = p1 == f["body_tokens"] and body["p2_file"] == f["body_tokens"]
    return ok, f"phase 1: {p1} body tokens, p2_file: {body['p2_file']}, documents: {f['body_tokens']}"


STAGE = Stage(
    name="family_chunks", asset="phase1_phase2_documents", partitioning=Partitioning.REVISION_SHARD, compute=compute,
    code_version="1",
    description="Curriculum phases 1 and 2 (SPEC 5b): p1_simple / p1_docrich (tokenized documents cut by ids to 4,096, "
                "split by doc-comment share) and p2_file (whole files of up to 16,384 tokens with planes and chunk graph).",
    inputs=(catalog.TOKENIZED, catalog.TOKENIZER, catalog.TOKENIZER_MANIFEST),
    outputs=tuple(catalog.FAMILY_DOCUMENTS[n] for n in ("p1_simple", "p1_docrich", "p2_file")),
    gates=(every_token_once,),
    figures=("documents_in", "body_tokens", "p1_split_documents", "p1_pieces",
             "p2_whole_files", "p2_fallback_files", "p1_simple_docs", "p1_simple_tokens", "p1_docrich_docs",
             "p1_docrich_tokens", "p2_file_docs", "p2_file_tokens"),
)
