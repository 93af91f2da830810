"""Stage 6 — chunk and enrich (SPEC §4 "Chunking", "Enrichment").

Per revision × shard. Inputs: the shard's kept files (its scrubbed rows the snapshot's
dedup ``decisions`` keep, in keep order, :func:`megacpp_core.kept.shard_kept`), the
snapshot ``tokenizer`` (exact budgets) with its ``tokenizer_sample_ids`` (the ids of the
files it trained on: those files are not encoded again, :mod:`megacpp_core.sample_ids`)
and, when the libclang lane is on, the revision's ``semantic_edges`` and ``build_info``. Memory follows the shard (``shard_bytes``), not the
snapshot. Output: the shard's ``chunks`` — documents split at declaration boundaries under ``row_length - 1`` tokens (one
slot is the BOS), each with its bucket and, unless ``settings.enrichment`` is off, the
character-level enrichment: structure and AST planes, chunk list, call/type edges,
platform labels. Files whose tree has ERROR nodes are cut by the brace-balanced splitter
(``brace_fallback_rate``). For the files the lane parsed without a fatal error, its
intra-file edges replace tree-sitter's. The splitter is :mod:`megacpp_core.chunk`, the
enrichment :mod:`megacpp_core.enrich`. In a process that runs many steps (``megacpp
run``'s workers), each file's ``#include`` spellings and enrichment are left for the
revision's ``p3_repo`` and ``p4_structure`` stages (:data:`megacpp_core.memo.FILE_INCLUDES`,
:data:`~megacpp_core.memo.FILE_ENRICHMENT`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from .. import catalog, chunk, ids_memo, memo, sample_ids, snapshot_tokenizer, span_count
from .. import kept as kept_files
from .. import tokenizer as tk
from ..pack import CHUNK_TYPE, EDGE_TYPE, PLATFORM_TYPE
from ..stage import Partition, Partitioning, Result, Stage, StageError
from ..tables import value_counts

DOCUMENTS_SCHEMA = pa.schema([
    ("doc_key", pa.string()), ("file_key", pa.string()), ("source", pa.string()), ("path", pa.string()),
    ("revision", pa.string()), ("language", pa.string()), ("license_class", pa.string()),
    ("chunk_index", pa.int32()), ("n_chunks", pa.int32()), ("start", pa.int64()), ("end", pa.int64()),
    ("kind", pa.string()), ("name", pa.string()), ("n_text_tokens", pa.int32()), ("bucket", pa.int32()),
    ("text", pa.large_string()),
])
#: Enrichment columns (character level; the tokenize stage aligns them to tokens). The
#: ``char_*`` planes hold one uint8 per ``str`` character of ``text`` as bytes;
#: ``char_chunk_boundaries`` are character offsets relative to the document.
ENRICHED_COLUMNS = pa.schema([
    ("char_chunk_boundaries", pa.list_(CHUNK_TYPE)),
    ("call_edges", pa.list_(EDGE_TYPE)),
    ("type_edges", pa.list_(EDGE_TYPE)),
    ("platform_ids", PLATFORM_TYPE),
    ("char_structure", pa.large_binary()),
    ("char_ast_depth", pa.large_binary()),
    ("char_sibling_index", pa.large_binary()),
    ("char_ast_node_type", pa.large_binary()),
])
#: Parquet key-value metadata naming the tokenizer the exact budgets were counted with.
TOKENIZER_KEY = b"megacpp.tokenizer_sha256"


def semantic_unit_edges(ctx) -> tuple[dict[str, dict[str, set]], dict]:
    """The libclang lane's intra-file edges of this partition's revision: ``{doc_key of a
    covered file: {"call": {(unit, unit)}, "type": {...}}}`` and figures. A file is covered when it is a translation unit
    libclang parsed without a fatal error (status ``ok`` or ``errors``); its tree-sitter
    edges are replaced by these. Raises :class:`StageError` naming the source when the lane
    is on but a revision has no lane output."""
    out: dict[str, dict[str, set]] = {}
    for edges_ref, info_ref in zip(ctx.inputs("semantic_edges"), ctx.inputs("build_info")):
        if not edges_ref.exists():
            raise StageError(f"chunk: the libclang lane is on but {edges_ref.source} has no semantic_edges "
                             "(materialize semantic_graph for this revision first)")
        bi = info_ref.read(columns=["file", "status"]).to_pydict()
        covered = {f for f, st in zip(bi["file"], bi["status"]) if st in ("ok", "errors")}
        e = edges_ref.read().to_pydict()
        for kind, ff, tf, a, b in zip(e["kind"], e["from_file"], e["to_file"], e["from_chunk"], e["to_chunk"]):
            if kind in ("call", "type") and ff == tf and ff in covered and a is not None and b is not None and a != b:
                out.setdefault(f"{edges_ref.source}/{ff}", {"call": set(), "type": set()})[kind].add((a, b))
        for f in covered:
            out.setdefault(f"{edges_ref.source}/{f}", {"call": set(), "type": set()})
    return out, {"semantic_graph": True, "semantic_covered_files": len(out)}


def chunk_rows(d: dict, tok, tokenizer_sha256: str, budget: int, enriching: bool,
               lane_edges: dict[str, dict[str, set]] | None = None,
               keep_ids: Callable[[str, np.ndarray], object] | None = None,
               known_ids: Sequence[np.ndarray | None] | None = None,
               keep_file: Callable[[str, str, object, object], object] | None = None,
               ahead: Callable[[str, str], tuple | None] | None = None) -> tuple[dict[str, list], dict]:
    """The documents of the kept files ``d`` (columns of :func:`kept.shard_kept` as lists):
    ``(columns, tallies)``. Columns are those of :data:`DOCUMENTS_SCHEMA`, plus
    :data:`ENRICHED_COLUMNS` when ``enriching``; tallies count parse-error, brace-fallback
    and split files, fallback splits, documents with the lane's edges, the enrichment's
    seconds and the characters the span counters encoded. ``bench/enrich.py`` times this
    function against tree-sitter's parse.

    Each file is parsed once; its enrichment walk runs first, since its walk over every
    node also tells the splitter whether the tree has ERROR nodes. Whole files are encoded
    (ids only, no offsets) in batches by a background thread meanwhile
    (:class:`_WholeCounts`), and most fit whole; the ids of a file over ``budget`` are
    kept and its spans are counted from them
    (:class:`~megacpp_core.span_count.SpanCounter`), encoding only each span's ends.
    ``keep_ids(text, ids)``, when given, receives every file's whole ids (uint32[n]; the
    stage hands them to tokenize through :data:`megacpp_core.ids_memo.MEMO`) and the ids
    of every document of a split file (:meth:`~megacpp_core.span_count.SpanCounter.ids`:
    its counter's pieces, not a new encoding of the document).
    ``known_ids[i]``, when given and not None, is file ``i``'s ids already (uint32[n], the
    tokenizer's sample ids, :mod:`megacpp_core.sample_ids`): that file is not encoded.
    ``keep_file(text, language, parsed, enrichment)``, when given, receives every non-empty
    file's :class:`~megacpp_core.chunk.ParsedSource` and its
    :class:`~megacpp_core.enrich.FileEnrichment` (None when not ``enriching``) once the
    file is split (the stage hands what later stages of the revision need through
    :data:`megacpp_core.memo.FILE_INCLUDES` and :data:`~megacpp_core.memo.FILE_ENRICHMENT`).
    ``ahead(text, language)``, when given, is a file's ``(parse, enrichment or None)`` made
    ahead of the stage (:func:`ahead_taker`), or None: such a file is not parsed, nor
    enriched when it has its enrichment (the same values: both depend on the text and
    language alone). ``tally["files_parsed_ahead"]`` counts them; ``enrich_seconds``
    counts only the enrichment done here.
    """
    from .. import enrich, platforms

    lane_edges = lane_edges or {}
    cols: dict[str, list] = {f.name: [] for f in DOCUMENTS_SCHEMA}
    if enriching:
        cols.update({f.name: [] for f in ENRICHED_COLUMNS})
    tally = {"parse_errors": 0, "brace_files": 0, "fallback_splits": 0, "split_files": 0, "lane_docs": 0,
             "enrich_seconds": 0.0, "span_encoded_chars": 0, "files_parsed_ahead": 0}
    tk._require_literal_specials(tok)
    whole = _WholeCounts(tok, d["text"], budget, keep_ids, known_ids)
    prepared: tuple = ()
    current: list = [None, 0]

    def counter(text: str) -> int:
        if text is current[0]:
            return current[1]
        return tk.count_tokens(tok, text)

    try:
        for i, text in enumerate(d["text"]):
            key, language = d["doc_key"][i], d["language"][i]
            made = ahead(text, language) if ahead is not None and text else None
            tally["files_parsed_ahead"] += made is not None
            parsed, fe = made if made is not None else (chunk.parse_source(text, language) if text else None, None)
            if enriching and text and fe is None:
                te = time.perf_counter()
                fe = enrich.enrich_file(text, language, parsed)
                tally["enrich_seconds"] += time.perf_counter() - te
            elif not enriching:
                fe = None
            n_whole, ids = whole.get(i)  # after parsing and enriching, so the encoding runs alongside
            current[:] = [text, n_whole]
            spans = None
            if ids is not None:
                margin, lengths, prefixes, soft = prepared = prepared or span_count.prepare(tok, tokenizer_sha256)
                spans = span_count.SpanCounter(tok, text, ids, lengths, margin, prefixes, soft)
            chunks, stats = chunk.split_document_with_stats(text, language, counter, budget, key, parsed, spans)
            tally["parse_errors"] += bool(stats.get("parse_errors"))
            tally["brace_files"] += bool(stats.get("brace_fallback"))
            tally["fallback_splits"] += int(stats.get("fallback_splits", 0))
            tally["split_files"] += len(chunks) > 1
            for j, c in enumerate(chunks):
                doc_text = text[c.start:c.end]
                if keep_ids is not None and spans is not None and len(chunks) > 1:
                    keep_ids(doc_text, spans.ids(c.start, c.end))
                for name, value in (("doc_key", f"{key}#{j}"), ("file_key", key),
                                    ("source", d["source"][i]), ("path", d["path"][i]), ("revision", d["archive_sha256"][i]),
                                    ("language", language), ("license_class", d["license_class"][i]),
                                    ("chunk_index", j), ("n_chunks", len(chunks)), ("start", c.start), ("end", c.end),
                                    ("kind", c.kind), ("name", c.name), ("n_text_tokens", c.n_tokens),
                                    ("bucket", chunk.bucket_for(c.n_tokens + 1)), ("text", doc_text)):
                    cols[name].append(value)
                if enriching:
                    te = time.perf_counter()
                    override = lane_edges.get(key)
                    de = enrich.document_enrichment(fe, c.start, c.end, override)
                    tally["lane_docs"] += override is not None
                    cols["char_chunk_boundaries"].append(de.chunks)
                    cols["call_edges"].append(de.call_edges)
                    cols["type_edges"].append(de.type_edges)
                    cols["platform_ids"].append(platforms.scan_platforms(doc_text))
                    for name, plane in de.planes.items():
                        cols[f"char_{name}"].append(plane)
                    tally["enrich_seconds"] += time.perf_counter() - te
            tally["span_encoded_chars"] += spans.encoded_chars if spans is not None else 0  # the documents' ids too
            if keep_file is not None and text:
                keep_file(text, language, parsed, fe)
    finally:
        whole.close()
    return cols, tally


#: Limits of one whole-file encoding batch of :class:`_WholeCounts`: files, characters
#: (a batch closes with the file that reaches either).
ENCODE_BATCH_FILES = 256
ENCODE_BATCH_CHARS = 1 << 18


class _WholeCounts:
    """Token counts of whole files, encoded in batches (:data:`ENCODE_BATCH_FILES`,
    :data:`ENCODE_BATCH_CHARS`) by one background thread while the caller parses and
    enriches (the tokenizer releases the GIL), at most two batches ahead of the file being
    read. ``get(i)`` is ``(count, ids)`` of file ``i``, called for ``i = 0, 1, ...`` in
    order; ``ids`` a uint32 array kept only for files over ``budget`` (``None`` otherwise).
    ``keep(text, ids)`` (optional) receives every file's ids, from the encoding thread.
    ``known[i]`` (optional), when not None, is file ``i``'s ids: it is not encoded.
    Errors of the encoding are raised by ``get``; :meth:`close` ends the thread."""

    def __init__(self, tok, texts: list[str], budget: int, keep: Callable[[str, np.ndarray], object] | None = None,
                 known: Sequence[np.ndarray | None] | None = None):
        from concurrent.futures import ThreadPoolExecutor

        self.tok, self.texts, self.budget, self.keep = tok, texts, budget, keep
        self.known = known if known is not None else [None] * len(texts)
        bounds, chars = [0], 0
        for i, t in enumerate(texts):
            chars += len(t)
            if chars >= ENCODE_BATCH_CHARS or i + 1 - bounds[-1] >= ENCODE_BATCH_FILES:
                bounds.append(i + 1)
                chars = 0
        if bounds[-1] != len(texts):
            bounds.append(len(texts))
        self.bounds = bounds  # batch k is texts[bounds[k]:bounds[k + 1]]
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="chunk-encode")
        self.batches = {k: self.pool.submit(self._encode, k) for k in range(min(2, len(bounds) - 1))}
        self.k, self.counts, self.over = -1, [], {}

    def _encode(self, k: int) -> tuple[list[int], dict[int, np.ndarray]]:
        lo, hi = self.bounds[k], self.bounds[k + 1]
        counts, over = [], {}
        todo = [i for i in range(lo, hi) if self.known[i] is None]
        fresh = iter(self.tok.encode_batch_fast([self.texts[i] for i in todo], add_special_tokens=False) if todo else ())
        for i in range(lo, hi):
            ids = self.known[i]
            if ids is None:
                e = next(fresh)
                n = len(e)
                ids = np.asarray(e.ids, dtype=np.uint32) if self.keep is not None or n > self.budget else None
            else:
                n = len(ids)
            counts.append(n)
            if self.keep is not None:
                self.keep(self.texts[i], ids)
            if n > self.budget:
                over[i] = ids
        return counts, over

    def get(self, i: int) -> tuple[int, np.ndarray | None]:
        """``(count, ids or None)`` of file ``i`` (see the class docstring)."""
        while self.k < 0 or i >= self.bounds[self.k + 1]:
            self.k += 1
            self.counts, self.over = self.batches.pop(self.k).result()
            if self.k + 2 < len(self.bounds) - 1:
                self.batches[self.k + 2] = self.pool.submit(self._encode, self.k + 2)
        return self.counts[i - self.bounds[self.k]], self.over.pop(i, None)

    def close(self) -> None:
        """Stop the background thread (batches not started are dropped)."""
        for f in self.batches.values():
            f.cancel()
        self.pool.shutdown(wait=True)


def ahead_taker(scope: str) -> Callable[[str, str], tuple | None]:
    """``ahead`` of :func:`chunk_rows` for a process that keeps values across steps: the
    ``(parse, enrichment or None)`` an idle worker made of a file before this stage ran
    (:mod:`megacpp_core.parse_ahead`), taken from :data:`megacpp_core.memo.PARSED_AHEAD`
    under the shard's partition key ``scope``, or None."""
    def take(text: str, language: str) -> tuple | None:
        if not len(memo.PARSED_AHEAD):  # nothing made ahead: no key to hash
            return None
        return memo.PARSED_AHEAD.take(scope, memo.text_key(language, text))
    return take


def _file_keeper(scope: str) -> Callable[[str, str, object, object], None]:
    """``keep_file`` of :func:`chunk_rows` for a process that keeps values across steps
    (:func:`megacpp_core.memo.across_steps`): each file's ``#include`` spellings
    (:func:`megacpp_core.repo_documents.include_spellings` of its parse) and its
    enrichment (planes made read-only) are held under the revision's partition key
    ``scope``, for the revision's ``p3_repo`` and ``p4_structure`` stages."""
    from .. import repo_documents

    def keep(text: str, language: str, parsed, fe) -> None:
        key = memo.text_key(language, text)
        memo.FILE_INCLUDES.put(scope, key, repo_documents.include_spellings(text, language, parsed))
        if fe is not None:
            for plane in (fe.structure, fe.ast_depth, fe.sibling_index, fe.ast_node_type):
                plane.setflags(write=False)
            memo.FILE_ENRICHMENT.put(scope, key, fe)
    return keep


def compute(ctx) -> Result:
    from .. import ast_types, enrich, platforms

    tok, info = snapshot_tokenizer.load(ctx)
    s = ctx.settings
    budget = s.row_length - 1
    enriching = s.enrichment
    kept = kept_files.shard_kept(ctx.input("scrubbed"), ctx.input("decisions"))
    d = kept.to_pydict()
    schema = DOCUMENTS_SCHEMA
    if enriching:
        for f in ENRICHED_COLUMNS:
            schema = schema.append(f)
    if enriching and s.semantic_graph:
        lane_edges, lane_figs = semantic_unit_edges(ctx)
    else:
        lane_edges, lane_figs = {}, {"semantic_graph": False}
    sha = info["sha256"]
    ids_memo.MEMO.begin(sha)  # the whole files' ids, for tokenize in this step (ids_memo)
    known = sample_ids.verified(tok, d["text"], sample_ids.read(ctx.input("tokenizer_sample_ids"), d["doc_key"],
                                                                 d["content_sha256"], sha), sha)
    across = memo.across_steps()
    try:
        cols, tally = chunk_rows(d, tok, sha, budget, enriching, lane_edges,
                                 keep_ids=lambda text, ids: ids_memo.MEMO.put(sha, text, ids), known_ids=known,
                                 keep_file=_file_keeper(Partition(ctx.partition.snapshot, ctx.partition.source).key)
                                 if across else None, ahead=ahead_taker(ctx.partition.key) if across else None)
    finally:
        memo.PARSED_AHEAD.drop(ctx.partition.key)  # what this shard's files left (rows the decisions drop)
    parse_errors, brace_files, fallback = tally["parse_errors"], tally["brace_files"], tally["fallback_splits"]
    split_files, lane_docs, enrich_seconds = tally["split_files"], tally["lane_docs"], tally["enrich_seconds"]
    table = pa.table(cols, schema=schema).replace_schema_metadata({TOKENIZER_KEY: info["sha256"].encode()})
    if lane_edges:  # the covered files of this shard (the lane covers the whole revision)
        lane_figs["semantic_covered_files"] = sum(1 for k in d["doc_key"] if k in lane_edges)
    n_tokens = np.asarray(cols["n_text_tokens"], dtype=np.int64)
    buckets = np.asarray(cols["bucket"], dtype=np.int64)
    over_bucket = int(np.sum(n_tokens + 1 > buckets))
    figures = {"files": kept.num_rows, "documents": table.num_rows, "files_split": split_files, "budget_tokens": budget,
               "max_document_tokens": int(n_tokens.max(initial=0)), "parse_error_files": parse_errors,
               "brace_fallback_files": brace_files,
               "brace_fallback_rate": round(brace_files / max(1, kept.num_rows), 4),
               "fallback_splits": fallback, "kinds": value_counts(table.column("kind")),
               "buckets": {str(k): int(v) for k, v in zip(*np.unique(buckets, return_counts=True))},
               "documents_over_bucket": over_bucket, "tokenizer_sha256": info["sha256"],
               "files_with_sample_ids": sum(x is not None for x in known), "files_parsed_ahead": tally["files_parsed_ahead"],
               "enrichment": enriching}
    if enriching:
        figures.update({
            "enrichment_version": enrich.ENRICHMENT_VERSION, "enrich_seconds": round(enrich_seconds, 3),
            "ast_node_type_map": ast_types.NODE_TYPE_MAP_VERSION, "ast_node_type_map_sha256": ast_types.map_sha256(),
            "platform_vocabulary": platforms.VOCAB_VERSION, "platform_vocabulary_sha256": platforms.load_vocabulary().sha256,
            "chunks": int(sum(len(x) for x in cols["char_chunk_boundaries"])),
            "call_edges": int(sum(len(x) for x in cols["call_edges"])),
            "type_edges": int(sum(len(x) for x in cols["type_edges"])),
            "platform_labels": platforms.figures(cols["platform_ids"]),
            **lane_figs, "documents_with_semantic_edges": lane_docs,
        })
    return Result({"chunks": table}, figures)


def budgets_hold(g):
    """Every document fits ``row_length - 1`` tokens and its bucket with its BOS."""
    f = g.figures
    return (f["max_document_tokens"] <= f["budget_tokens"] and f["documents_over_bucket"] == 0,
            f"max {f['max_document_tokens']} ≤ {f['budget_tokens']}; {f['documents_over_bucket']} documents over their bucket")


STAGE = Stage(
    name="chunk", asset="chunked_documents", partitioning=Partitioning.REVISION_SHARD, compute=compute, code_version="2",
    description="Stage 6: tree-sitter split at declaration boundaries under an exact token budget (brace-balanced "
                "fallback for files with ERROR nodes), buckets, and enrichment: structure/AST planes, chunk graph, "
                "platform labels; the libclang lane's edges replace tree-sitter's for the files it covers.",
    inputs=(catalog.SCRUBBED, catalog.DECISIONS, catalog.TOKENIZER, catalog.TOKENIZER_MANIFEST, catalog.TOKENIZER_SAMPLE_IDS,
            catalog.SEMANTIC_EDGES, catalog.BUILD_INFO),
    outputs=(catalog.CHUNKS,), settings=("row_length", "enrichment", "semantic_graph"), gates=(budgets_hold,),
    figures=("files", "documents", "files_split", "budget_tokens", "max_document_tokens", "parse_error_files",
             "brace_fallback_files", "brace_fallback_rate", "fallback_splits", "kinds", "buckets", "documents_over_bucket",
             "tokenizer_sha256", "files_with_sample_ids", "files_parsed_ahead", "enrichment", "enrichment_version", "enrich_seconds", "ast_node_type_map",
             "ast_node_type_map_sha256", "platform_vocabulary", "platform_vocabulary_sha256", "chunks", "call_edges",
             "type_edges", "platform_labels", "semantic_graph", "semantic_covered_files",
             "documents_with_semantic_edges"),
)
