"""Curriculum phase 4 — the ``p4_structure`` documents of one revision (SPEC §5b), per revision.

Inputs: the revision's ``p3_repo_documents`` (the repository pieces and the fallback
chunks of files over 65,536 tokens), its ``tokenized`` shards (each kept file's language,
and the chunks of the fallback files), the snapshot ``tokenizer`` and, when
``settings.semantic_graph`` is on, the libclang lane's ``semantic_edges`` and
``build_info``. Output: the same documents — same keys, same ids — with the five
enrichment planes aligned to their tokens, the chunk graph in their token positions and
their platform labels (:mod:`megacpp_core.structure_documents`); the lane's cross-file
call/type edges join the graph when both files are in one piece. The structure is built
here whatever ``settings.enrichment`` says: it is what this family is. Memory follows the
revision, like ``p3_repo_documents``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from .. import catalog, family_documents, pack, repo_documents, snapshot_tokenizer, tokenize
from .. import structure_documents as sd
from .. import tokenizer as tk
from ..stage import Partitioning, Result, Stage, StageError

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


def compute(ctx) -> Result:
    tok, info = snapshot_tokenizer.load(ctx)
    ref = ctx.input(P3.name)
    pack.check_tokenizer({"tokenizer_sha256": ref.metadata().get("tokenizer_sha256")}, info["sha256"], None, ref.uri)
    p3 = ref.read()
    shards = ctx.inputs("tokenized")
    for r in shards:
        pack.check_tokenizer({"tokenizer_sha256": r.metadata().get("tokenizer_sha256")}, info["sha256"], None, r.uri)
    langs = pa.concat_tables([r.read(columns=["path", "language"]) for r in shards]) if shards else None
    languages = dict(zip(langs.column("path").to_pylist(), langs.column("language").to_pylist())) if langs else {}
    fb = p3.filter(pc.is_null(p3.column("paths")))
    fallback, texts = {}, {}
    if fb.num_rows:
        want = pc.unique(fb.column("path"))
        chunks = pa.concat_tables([r.read(columns=["doc_key", "path", "chunk_index", "text"],
                                          filters=pc.field("path").isin(want)) for r in shards])
        chunks = chunks.take(pc.sort_indices(chunks, sort_keys=[("path", "ascending"), ("chunk_index", "ascending")]))
        at: dict[str, int] = {}
        for key, path, text in zip(*(chunks.column(c).to_pylist() for c in ("doc_key", "path", "text"))):
            a = at.get(path, 0)
            fallback[key], at[path] = (a, a + len(text)), a + len(text)
            texts[path] = texts.get(path, "") + text
    table_bytes, lengths = tokenize.byte_table(tok, info["sha256"])
    sep = tok.token_to_id(repo_documents.FILE_SEP)
    if sep != FILE_SEP_ID:
        raise StageError(f"structure_documents: {repo_documents.FILE_SEP} is id {sep}, expected its fixed id {FILE_SEP_ID}")
    table, figs = sd.structure_table(p3, languages, fallback, texts, _lane(ctx), table_bytes, lengths, sep)
    table = table.replace_schema_metadata({family_documents.TOKENIZER_KEY: info["sha256"].encode()})
    figures = {"p4_structure_docs": figs.pop("docs"), **figs, "semantic_graph": bool(ctx.settings.semantic_graph)}
    return Result({P4.name: table}, figures)


#: Documents the gate reads back at once (their planes and chunk graph).
GATE_BATCH_DOCS = 64


def same_documents_as_p3(g):
    """Re-read from the data root: the ``p4_structure`` documents are the ``p3_repo``
    documents (same keys and ids, in order), every plane has one value per token, and no
    chunk holds a file separator (a chunk never crosses from one file into the next)."""
    p3 = g.input(P3.name).read(columns=["doc_key", "input_ids"])  # arrow, not Python objects
    keys3, ids3 = p3.column("doc_key"), p3.column("input_ids")
    sep, at = FILE_SEP_ID, 0
    for batch in g.output(P4.name).iter_batches(["doc_key", "input_ids", "chunk_boundaries", *pack.PLANES],
                                                 batch_size=GATE_BATCH_DOCS):
        m = batch.num_rows
        if at + m > p3.num_rows or batch.column(0).to_pylist() != keys3.slice(at, m).to_pylist():
            return False, "p4_structure keys differ from p3_repo's"
        ids = batch.column(1)
        if not ids.equals(ids3.slice(at, m).combine_chunks()):
            return False, "p4_structure ids differ from p3_repo's"
        n = pc.list_value_length(ids)
        for p in pack.PLANES:
            if not pc.all(pc.equal(pc.list_value_length(batch.column(p)), n)).as_py():
                return False, f"{p} does not have one value per token"
        offs, flat = ids.offsets.to_numpy(), ids.values.to_numpy(zero_copy_only=False)
        for j, (key, chunks) in enumerate(zip(batch.column(0).to_pylist(), batch.column(2).to_pylist())):
            if not sd.chunks_inside_files(flat[offs[j]:offs[j + 1]], chunks, sep):
                return False, f"{key}: a chunk crosses a file separator"
        at += m
    if at != p3.num_rows:
        return False, "p4_structure keys differ from p3_repo's"
    return True, (f"{p3.num_rows} documents as p3_repo's, planes aligned; {g.figures['chunks']} chunks, "
                  f"{g.figures['cross_file_call_edges'] + g.figures['cross_file_type_edges']} cross-file edges")


STAGE = Stage(
    name="structure_documents", asset="p4_structure_documents", partitioning=Partitioning.REVISION, compute=compute,
    code_version="1",
    description="Curriculum phase 4 (SPEC 5b): the p3_repo documents with every enrichment plane aligned to their tokens, "
                "the chunk graph in their token positions and platform labels; the libclang lane's cross-file edges "
                "when it is on.",
    inputs=(P3, catalog.TOKENIZED, catalog.TOKENIZER, catalog.TOKENIZER_MANIFEST, catalog.SEMANTIC_EDGES, catalog.BUILD_INFO),
    outputs=(P4,), settings=("semantic_graph",), gates=(same_documents_as_p3,),
    figures=("p4_structure_docs", "tokens", "chunks", "call_edges", "type_edges", "cross_file_call_edges",
             "cross_file_type_edges", "lane_edges_across_pieces", "chunks_without_tokens", "structure_token_share",
             "semantic_graph"),
)
