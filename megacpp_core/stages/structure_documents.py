"""Curriculum phase 4 — the ``p4_structure`` documents of one revision (SPEC §5b), per revision.

Inputs: the revision's ``p3_repo_documents`` (the repository pieces and the fallback
chunks of files over 65,536 tokens), its ``tokenized`` shards (each kept file's language,
and the chunks of the fallback files), the snapshot ``tokenizer`` and, when
``settings.semantic_graph`` is on, the libclang lane's ``semantic_edges`` and
``build_info``. Output: the same documents — same keys, same ids — with the five
enrichment planes aligned to their tokens, the chunk graph in their token positions and
their platform labels (:mod:`megacpp_core.structure_documents`); the lane's cross-file
call/type edges join the graph when both files are in one piece. The structure is built
here whatever ``settings.enrichment`` says: it is what this family is. Streamed: the
``p3_repo_documents`` are read 64 at a time in their stored (keep) order and written as
they are built (:class:`~megacpp_core.structure_documents.StructureBuilder`); an oversized
file's text is read back from its shard when its first fallback chunk comes. Memory: the
per-file languages and piece numbers, one batch, one 64-document output row group
(:data:`~megacpp_core.family_documents.DOCUMENT_ROW_GROUP`). When the ``p3_repo`` stage
ran just before in this process (one step), each file's tree-sitter parse is taken from
it (:data:`megacpp_core.memo.PARSED`, at most
:data:`~megacpp_core.memo.MAX_PARSED_BYTES`) instead of parsed again; the memo is
emptied when the stage ends. A file the revision's chunk step enriched in this process
(:data:`megacpp_core.memo.FILE_ENRICHMENT`, ``megacpp run``'s workers) is not enriched
again (``files_with_held_enrichment``); what the revision left there is dropped when the
stage ends.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import catalog, family_documents, memo, pack, repo_documents, snapshot_tokenizer, tokenize
from .. import structure_documents as sd
from .. import tokenizer as tk
from ..stage import Partitioning, Result, Stage, StageError
from ..tables import ParquetStream

P3, P4 = catalog.FAMILY_DOCUMENTS["p3_repo"], catalog.FAMILY_DOCUMENTS["p4_structure"]
#: The file separator's fixed id (special tokens sit at fixed ids, SPEC §4).
FILE_SEP_ID = tk.SPECIAL_TOKENS.index(repo_documents.FILE_SEP)


def _lane(ctx) -> sd.Lane | None:
    """The revision's lane edges when the lane is on; :class:`StageError` when it is on
    but the revision has no lane output."""
    if not ctx.settings.semantic_graph:
        return None
    edges, info = ctx.input("semantic_edges"), ctx.input("build_info")
    if not edges.exists() or not info.exists():
        raise StageError(f"structure_documents: the libclang lane is on but {ctx.partition.source} has no semantic_edges "
                         "(materialize semantic_graph for this revision first)")
    return sd.lane_from_tables(edges.read(), info.read())


def _fallback_loader(shards: list):
    """``path -> (whole text, {doc_key: (start, end)})`` of an oversized file from the
    ``tokenized`` shards: its chunks (read with a path filter) joined in ``chunk_index``
    order, and each chunk's character span in the file."""

    def load(path: str):
        chunks = pa.concat_tables([r.read(columns=["doc_key", "chunk_index", "text"], filters=pc.field("path") == path)
                                   for r in shards])
        chunks = chunks.take(pc.sort_indices(chunks.column("chunk_index")))
        spans, at, texts = {}, 0, []
        for key, text in zip(chunks.column("doc_key").to_pylist(), chunks.column("text").to_pylist()):
            spans[key], at = (at, at + len(text)), at + len(text)
            texts.append(text)
        return "".join(texts), spans

    return load


def compute(ctx) -> Result:
    tok, info = snapshot_tokenizer.load(ctx)
    ref = ctx.input(P3.name)
    pack.check_tokenizer({"tokenizer_sha256": ref.metadata().get("tokenizer_sha256")}, info["sha256"], None, ref.uri)
    shards = ctx.inputs("tokenized")
    for r in shards:
        pack.check_tokenizer({"tokenizer_sha256": r.metadata().get("tokenizer_sha256")}, info["sha256"], None, r.uri)
    languages: dict[str, str] = {}
    for r in shards:
        t = r.read(columns=["path", "language"])
        languages.update(zip(t.column("path").to_pylist(), t.column("language").to_pylist()))
    lengths, table_bytes = tokenize.byte_table(tok, info["sha256"])[1], tokenize.byte_array(tok, info["sha256"])
    sep = tok.token_to_id(repo_documents.FILE_SEP)
    if sep != FILE_SEP_ID:
        raise StageError(f"structure_documents: {repo_documents.FILE_SEP} is id {sep}, expected its fixed id {FILE_SEP_ID}")
    scope = ctx.partition.key  # p3_repo's parses of this revision's files, when it ran in this step
    builder = sd.StructureBuilder(languages, _fallback_loader(shards), _lane(ctx), table_bytes, lengths, sep,
                                  parsed=lambda text: memo.PARSED.take(scope, text),
                                  enriched=lambda text, lang: memo.FILE_ENRICHMENT.take(scope, memo.text_key(lang, text)))
    out_path = ctx.workdir("p4-") / "p4_structure_documents.parquet"
    try:
        with ParquetStream(out_path, _schema(ref), family_documents.DOCUMENT_ROW_GROUP, whole_row_groups=True) as out:
            for batch in ref.iter_batches(batch_size=sd.BATCH_DOCS):
                t = builder.add(pa.Table.from_batches([batch]))
                out.write(t)
            out.add_metadata({family_documents.TOKENIZER_KEY.decode(): info["sha256"]})
    finally:
        memo.PARSED.clear()
        memo.FILE_ENRICHMENT.drop(scope)
    figs = builder.figures()
    figures = {"p4_structure_docs": figs.pop("docs"), **figs, "semantic_graph": bool(ctx.settings.semantic_graph),
               "files_with_held_enrichment": builder.held}
    return Result({P4.name: out_path}, figures)


def _schema(ref) -> pa.Schema:
    """The ``p4_structure`` schema: the ``p3_repo`` columns, then :data:`~megacpp_core.structure_documents.STRUCTURE_COLUMNS`."""
    cols = sd.structure_columns([])
    return pa.schema(list(ref.schema().remove_metadata()) + [pa.field(c, a.type) for c, a in cols.items()])


#: Documents the gate reads back at once (their planes and chunk graph).
GATE_BATCH_DOCS = 64


def _documents(batches) -> Iterator[tuple[str, np.ndarray]]:
    """``(doc_key, ids)`` of every document of record batches with ``doc_key`` and ``input_ids``."""
    for batch in batches:
        ids = batch.column(1)
        offs, flat = ids.offsets.to_numpy(), ids.values.to_numpy(zero_copy_only=False)
        for j, key in enumerate(batch.column(0).to_pylist()):
            yield key, flat[offs[j]:offs[j + 1]]


def same_documents_as_p3(g):
    """Re-read from the data root, both sides a batch at a time: the ``p4_structure``
    documents are the ``p3_repo`` documents (same keys and ids, in order), every plane has
    one value per token, and no chunk holds a file separator (a chunk never crosses from
    one file into the next)."""
    p3 = _documents(g.input(P3.name).iter_batches(["doc_key", "input_ids"], batch_size=GATE_BATCH_DOCS))
    sep, n_docs = FILE_SEP_ID, 0
    for batch in g.output(P4.name).iter_batches(["doc_key", "input_ids", "chunk_boundaries", *pack.PLANES],
                                                 batch_size=GATE_BATCH_DOCS):
        ids = batch.column(1)
        n = pc.list_value_length(ids)
        for p in pack.PLANES:
            if not pc.all(pc.equal(pc.list_value_length(batch.column(p)), n)).as_py():
                return False, f"{p} does not have one value per token"
        chunks = batch.column(2).to_pylist()
        for j, (key, mine) in enumerate(_documents([batch.select([0, 1])])):
            theirs = next(p3, None)
            if theirs is None or theirs[0] != key:
                return False, "p4_structure keys differ from p3_repo's"
            if not np.array_equal(theirs[1], mine):
                return False, "p4_structure ids differ from p3_repo's"
            if not sd.chunks_inside_files(mine, chunks[j], sep):
                return False, f"{key}: a chunk crosses a file separator"
        n_docs += batch.num_rows
    if next(p3, None) is not None:
        return False, "p4_structure keys differ from p3_repo's"
    return True, (f"{n_docs} documents as p3_repo's, planes aligned; {g.figures['chunks']} chunks, "
                  f"{g.figures['cross_file_call_edges'] + g.figures['cross_file_type_edges']} cross-file edges")


STAGE = Stage(
    name="structure_documents", asset="p4_structure_documents", partitioning=Partitioning.REVISION, compute=compute,
    code_version="2",
    description="Curriculum phase 4 (SPEC 5b): the p3_repo documents with every enrichment plane aligned to their tokens, "
                "the chunk graph in their token positions and platform labels; the libclang lane's cross-file edges "
                "when it is on.",
    inputs=(P3, catalog.TOKENIZED, catalog.TOKENIZER, catalog.TOKENIZER_MANIFEST, catalog.SEMANTIC_EDGES, catalog.BUILD_INFO),
    outputs=(P4,), settings=("semantic_graph",), gates=(same_documents_as_p3,),
    figures=("p4_structure_docs", "tokens", "chunks", "call_edges", "type_edges", "cross_file_call_edges",
             "cross_file_type_edges", "lane_edges_across_pieces", "chunks_without_tokens", "structure_token_share",
             "semantic_graph", "files_with_held_enrichment"),
)
