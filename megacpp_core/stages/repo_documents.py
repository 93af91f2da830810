"""Curriculum phase 3 — the ``p3_repo`` documents of one revision (SPEC §5b), per revision.

Input: the revision's ``tokenized`` shards (every chunk: the chunks tile each kept file,
so joining a file's chunk texts in ``chunk_index`` order gives the file back) and the
snapshot ``tokenizer``. The files are put in include-dependency order and cut into pieces
of at most 65,536 tokens at file boundaries (:func:`megacpp_core.repo_documents.revision_documents`);
a file over the budget alone falls back to its ``p2_file`` split (its chunks), counted in
``oversized_files``. Memory follows the revision's text and ids, which ``shard_bytes``
does not bound: a repository piece needs every file of its revision.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import catalog, families, family_documents, pack, repo_documents, snapshot_tokenizer
from .. import tokenizer as tk
from ..stage import Partitioning, Result, Stage

P3 = families.BY_NAME["p3_repo"]
FILE_COLUMNS = ["file_key", "path", "language", "license_class", "revision", "chunk_index", "text"]


def compute(ctx) -> Result:
    tok, info = snapshot_tokenizer.load(ctx)
    refs = ctx.inputs("tokenized")
    for ref in refs:
        pack.check_tokenizer({"tokenizer_sha256": ref.metadata().get("tokenizer_sha256")}, info["sha256"], None, ref.uri)
    parts = [ref.read(columns=FILE_COLUMNS) for ref in refs]
    chunks = pa.concat_tables(parts) if parts else pa.table({c: [] for c in FILE_COLUMNS})
    chunks = chunks.take(pc.sort_indices(chunks, sort_keys=[("path", "ascending"), ("chunk_index", "ascending")]))
    files: dict[str, tuple[str, list[str]]] = {}
    for path, lang, text in zip(*(chunks.column(c).to_pylist() for c in ("path", "language", "text"))):
        files.setdefault(path, (lang, []))[1].append(text)
    whole = {p: (lang, "".join(texts)) for p, (lang, texts) in files.items()}
    sep = tok.token_to_id(repo_documents.FILE_SEP)
    docs = repo_documents.revision_documents(ctx.partition.source, whole, lambda s: tk.encode_batch(tok, s),
                                             bos_id=tk.BOS_ID, file_sep_id=sep, budget=P3.row_length)
    del whole, files
    meta = chunks.group_by(["path", "license_class"]).aggregate([])
    revision = chunks.column("revision")[0].as_py() if chunks.num_rows else ""
    table = family_documents.repo_family_table(docs.table, meta, revision)
    if docs.oversized:
        cols = [c for c in family_documents.BASE_COLUMNS if c in refs[0].schema().names]
        want = pa.array(docs.oversized, pa.string())
        fall = pa.concat_tables([r.read(columns=cols, filters=pc.field("path").isin(want)) for r in refs])
        fall = fall.cast(family_documents.BASE_SCHEMA)
        for c in ("paths", "offsets", "n_files"):
            fall = fall.append_column(table.schema.field(c), pa.nulls(fall.num_rows, table.schema.field(c).type))
        table = pa.concat_tables([table, fall.select(table.column_names)])
    table = table.replace_schema_metadata({family_documents.TOKENIZER_KEY: info["sha256"].encode()})
    n_files = docs.table.column("n_files").to_numpy() if docs.table.num_rows else np.zeros(0, np.int32)
    figures = {**docs.figures, "p3_repo_docs": table.num_rows,
               "p3_repo_tokens": int(pc.sum(table.column("n_tokens")).as_py() or 0),
               "multi_file_pieces": int((n_files > 1).sum()), "max_files_per_piece": int(n_files.max(initial=0)),
               "fallback_documents": table.num_rows - docs.table.num_rows}
    return Result({"p3_repo_documents": table}, figures)


def pieces_hold_whole_files(g):
    """Re-read from the data root: every repository piece splits back, at its header
    offsets, into the files it lists, and no file is in two pieces (SPEC 5b: a piece is
    cut only at file boundaries)."""
    t = g.read("p3_repo_documents", columns=["doc_key", "text", "paths", "offsets"])
    seen: set[str] = set()
    for key, text, paths, offsets in zip(*(t.column(c).to_pylist() for c in ("doc_key", "text", "paths", "offsets"))):
        if paths is None:
            continue  # a fallback chunk of an oversized file
        try:
            got = repo_documents.split_piece(text, paths, offsets)
        except ValueError as e:
            return False, f"{key}: {e}"
        if seen & set(paths) or [p for p, _ in got] != paths:
            return False, f"{key}: a file appears twice or out of place"
        seen |= set(paths)
    return True, f"{len(seen)} files in {g.figures['pieces']} pieces, {g.figures['oversized_files']} oversized"


STAGE = Stage(
    name="repo_documents", asset="p3_repo_documents", partitioning=Partitioning.REVISION, compute=compute, code_version="1",
    description="Curriculum phase 3 (SPEC 5b): a revision's files in include-dependency order, each after the file "
                "separator and its path, cut at file boundaries into 65,536-token pieces (one BOS each).",
    inputs=(catalog.TOKENIZED, catalog.TOKENIZER, catalog.TOKENIZER_MANIFEST),
    outputs=(catalog.FAMILY_DOCUMENTS["p3_repo"],), gates=(pieces_hold_whole_files,),
    figures=("files", "includes_resolved", "includes_after_includer", "pieces", "oversized_files", "p3_repo_docs",
             "p3_repo_tokens", "multi_file_pieces", "max_files_per_piece", "fallback_documents"),
)
