"""Curriculum phase 3 — the ``p3_repo`` documents of one revision (SPEC §5b), per revision.

Input: the revision's ``tokenized`` shards (every chunk: the chunks tile each kept file,
so joining a file's chunk texts in ``chunk_index`` order gives the file back), the
snapshot ``tokenizer`` and its ``tokenizer_sample_ids`` (a file the tokenizer trained on
is not encoded again: its ids after the path header are built from its own,
:func:`megacpp_core.sample_ids.after_header`). The files are put in include-dependency order and cut into pieces
of at most 65,536 tokens at file boundaries (:mod:`megacpp_core.repo_documents`); a file
over the budget alone falls back to its ``p2_file`` split (its chunks), counted in
``oversized_files``.

Streamed in three passes (:class:`~megacpp_core.repo_documents.RevisionSpill`,
:func:`~megacpp_core.repo_documents.plan_pieces`,
:func:`~megacpp_core.repo_documents.piece_tables`): one ``tokenized`` shard at a time
(``shard_bytes``) is joined into files, parsed for includes, encoded and spilled to local
disk; the order and the pieces come from per-file summaries (path, includes, token count);
the pieces are then built 64 at a time from the spill. The rows are written in snapshot
keep order (:func:`megacpp_core.kept.document_order`: license rank, path, then piece or
chunk number), so the family step and the Megatron export read them as stored, a row
group at a time, without re-sorting a revision. Memory: one shard, the per-file
summaries, and one 64-document row group of the output (:class:`~megacpp_core.tables.ParquetStream`
``whole_row_groups``). A file the revision's chunk step left its ``#include`` spellings
for in this process (:data:`megacpp_core.memo.FILE_INCLUDES`, ``megacpp run``'s workers)
is not parsed again (``files_with_held_includes``).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import catalog, families, family_documents, memo, pack, repo_documents, sample_ids, snapshot_tokenizer
from .. import tokenizer as tk
from ..dedup import LICENSE_RANK
from ..stage import Partitioning, Result, Stage
from ..tables import ParquetStream

P3 = families.BY_NAME["p3_repo"]
FILE_COLUMNS = ["file_key", "path", "language", "license_class", "revision", "chunk_index", "text"]
#: Columns of a fallback chunk's order key, read for the oversized files only.
FALLBACK_KEY_COLUMNS = ["path", "license_class", "chunk_index"]


def _spill_shard(ref, spill: repo_documents.RevisionSpill, license_of: dict[str, str], where: dict[str, int],
                 j: int, bodies) -> str | None:
    """Join one ``tokenized`` shard's chunks into files and spill them; record each
    file's license class (the least permissive of its chunks') and shard. ``bodies(keys,
    files)`` gives the body ids known without encoding (:func:`_sample_bodies`). Returns
    the shard's revision label (None for an empty shard)."""
    chunks = ref.read(columns=FILE_COLUMNS)
    if not chunks.num_rows:
        return None
    chunks = chunks.take(pc.sort_indices(chunks, sort_keys=[("path", "ascending"), ("chunk_index", "ascending")]))
    files: dict[str, tuple[str, list[str]]] = {}
    classes: dict[str, list[str]] = {}
    keys: dict[str, str] = {}
    for key, path, lang, cls, text in zip(*(chunks.column(c).to_pylist()
                                            for c in ("file_key", "path", "language", "license_class", "text"))):
        files.setdefault(path, (lang, []))[1].append(text)
        classes.setdefault(path, []).append(cls)
        keys[path] = key
    revision = chunks.column("revision")[0].as_py()
    del chunks
    joined = {p: (lang, "".join(texts)) for p, (lang, texts) in files.items()}
    spill.add(joined, bodies(keys, joined))
    for p, cs in classes.items():
        license_of[p], where[p] = family_documents.worst_license(cs), j
    return revision


def compute(ctx) -> Result:
    tok, info = snapshot_tokenizer.load(ctx)
    refs = ctx.inputs("tokenized")
    for ref in refs:
        pack.check_tokenizer({"tokenizer_sha256": ref.metadata().get("tokenizer_sha256")}, info["sha256"], None, ref.uri)
    sep = tok.token_to_id(repo_documents.FILE_SEP)
    work = ctx.workdir("p3-")
    scope = ctx.partition.key
    memo.PARSED.begin(scope)  # the files' trees, for p4_structure in this step (megacpp_core.memo)
    held = [0]

    def held_spellings(text: str, language: str) -> list[str] | None:
        got = memo.FILE_INCLUDES.take(scope, memo.text_key(language, text))  # left by this revision's chunk steps here
        held[0] += got is not None
        return got

    spill = repo_documents.RevisionSpill(work / "files.arrow", lambda s: tk.encode_batch(tok, s),
                                         keep_parsed=lambda text, parsed: memo.PARSED.put(scope, text, parsed),
                                         known_spellings=held_spellings)
    license_of: dict[str, str] = {}
    shard_of: dict[str, int] = {}
    revisions = set()
    known = [0]

    def bodies(keys: dict[str, str], files: dict[str, tuple[str, str]]) -> dict[str, np.ndarray]:
        out = _sample_bodies(tok, info["sha256"], ctx.input("tokenizer_sample_ids"), keys, files)
        known[0] += len(out)
        return out

    try:
        for j, ref in enumerate(refs):
            revisions.add(_spill_shard(ref, spill, license_of, shard_of, j, bodies))
    finally:
        spill.close()
        memo.FILE_INCLUDES.drop(scope)
    revisions.discard(None)
    revision = min(revisions) if revisions else ""
    pieces, figs = repo_documents.plan_pieces(spill, P3.row_length)
    # Keep order: (license rank, path, number) over the pieces (first file, piece index)
    # and the fallback chunks of the oversized files (path, chunk index).
    keys = [(LICENSE_RANK[family_documents.worst_license([license_of[q] for q in ps])], ps[0], i, "piece")
            for i, ps in enumerate(pieces.pieces)]
    fallback_rows = 0
    for j in sorted({shard_of[p] for p in pieces.oversized}):
        want = pa.array([p for p in pieces.oversized if shard_of[p] == j], pa.string())
        t = refs[j].read(columns=FALLBACK_KEY_COLUMNS, filters=pc.field("path").isin(want))
        keys += [(LICENSE_RANK[c], p, i, "chunks") for p, c, i in
                 zip(*(t.column(c).to_pylist() for c in ("path", "license_class", "chunk_index")))]
    keys.sort()
    out_path = work / "p3_repo_documents.parquet"
    schema = pa.schema(list(family_documents.BASE_SCHEMA) + [repo_documents.DOCUMENTS_SCHEMA.field(c)
                                                              for c in ("paths", "offsets", "n_files")])
    tokens = 0
    with ParquetStream(out_path, schema, family_documents.DOCUMENT_ROW_GROUP, whole_row_groups=True) as out:
        at = 0
        while at < len(keys):
            end = at
            while end < len(keys) and keys[end][3] == keys[at][3] and (keys[at][3] == "piece" or keys[end][1] == keys[at][1]):
                end += 1
            if keys[at][3] == "piece":
                for part in repo_documents.piece_tables(ctx.partition.source, spill, pieces, bos_id=tk.BOS_ID,
                                                        file_sep_id=sep,
                                                        which=[k[2] for k in keys[at:end]]):
                    t = family_documents.repo_family_table(part, license_of, revision)
                    tokens += int(pc.sum(t.column("n_tokens")).as_py() or 0)
                    out.write(t)
            else:
                t = _fallback(refs[shard_of[keys[at][1]]], keys[at][1], [k[2] for k in keys[at:end]], schema)
                fallback_rows += t.num_rows
                tokens += int(pc.sum(t.column("n_tokens")).as_py() or 0)
                out.write(t)
            at = end
        out.add_metadata({family_documents.TOKENIZER_KEY.decode(): info["sha256"]})
    n_files = np.fromiter((len(ps) for ps in pieces.pieces), dtype=np.int64, count=len(pieces.pieces))
    figures = {**figs, "p3_repo_docs": len(pieces.pieces) + fallback_rows, "p3_repo_tokens": tokens,
               "multi_file_pieces": int((n_files > 1).sum()), "max_files_per_piece": int(n_files.max(initial=0)),
               "fallback_documents": fallback_rows, "files_from_sample_ids": known[0], "files_with_held_includes": held[0]}
    return Result({"p3_repo_documents": out_path}, figures)


def _sample_bodies(tok, tokenizer_sha256: str, ref, keys: dict[str, str],
                   files: dict[str, tuple[str, str]]) -> dict[str, np.ndarray]:
    """``{path: ids of path + "\n" + text}`` for the files (``{path: (language, text)}``,
    ``keys``: their ``doc_key``) whose own ids the tokenizer's sample holds (same text
    hash, decoding to the text: :func:`megacpp_core.sample_ids.verified`) and whose body
    :func:`megacpp_core.sample_ids.after_header` can build from them; the others are left to
    the encoder."""
    paths = sorted(files)
    texts = [files[p][1] for p in paths]
    shas = [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts]
    known = sample_ids.verified(tok, texts, sample_ids.read(ref, [keys[p] for p in paths], shas, tokenizer_sha256),
                                tokenizer_sha256)
    out = {}
    for p, ids in zip(paths, known):
        body = None if ids is None else sample_ids.after_header(tok, tokenizer_sha256, p, files[p][1], ids)
        if body is not None:
            out[p] = body
    return out


def _fallback(ref, path: str, chunk_indices: list[int], schema: pa.Schema) -> pa.Table:
    """The chunks ``chunk_indices`` of one oversized file (its ``p2_file`` split), in
    ``chunk_index`` order, as rows of the family table (no ``paths``, ``offsets``,
    ``n_files``)."""
    cols = [c for c in family_documents.BASE_COLUMNS if c in ref.schema().names]
    t = ref.read(columns=cols, filters=(pc.field("path") == path) & pc.field("chunk_index").isin(chunk_indices))
    t = t.take(pc.sort_indices(t.column("chunk_index"))).cast(family_documents.BASE_SCHEMA)
    for c in ("paths", "offsets", "n_files"):
        t = t.append_column(schema.field(c), pa.nulls(t.num_rows, schema.field(c).type))
    return t


#: Documents the gate reads back at once.
GATE_BATCH_DOCS = 64


def pieces_hold_whole_files(g):
    """Re-read from the data root: every repository piece splits back, at its header
    offsets, into the files it lists, and no file is in two pieces (SPEC 5b: a piece is
    cut only at file boundaries)."""
    seen: set[str] = set()
    for batch in g.output("p3_repo_documents").iter_batches(["doc_key", "text", "paths", "offsets"], batch_size=GATE_BATCH_DOCS):
        for key, text, paths, offsets in zip(*(batch.column(c).to_pylist() for c in ("doc_key", "text", "paths", "offsets"))):
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
    name="repo_documents", asset="p3_repo_documents", partitioning=Partitioning.REVISION, compute=compute, code_version="2",
    description="Curriculum phase 3 (SPEC 5b): a revision's files in include-dependency order, each after the file "
                "separator and its path, cut at file boundaries into 65,536-token pieces (one BOS each).",
    inputs=(catalog.TOKENIZED, catalog.TOKENIZER, catalog.TOKENIZER_MANIFEST, catalog.TOKENIZER_SAMPLE_IDS),
    outputs=(catalog.FAMILY_DOCUMENTS["p3_repo"],), gates=(pieces_hold_whole_files,),
    figures=("files", "includes_resolved", "includes_after_includer", "pieces", "oversized_files", "p3_repo_docs",
             "p3_repo_tokens", "multi_file_pieces", "max_files_per_piece", "fallback_documents", "files_from_sample_ids",
             "files_with_held_includes"),
)
