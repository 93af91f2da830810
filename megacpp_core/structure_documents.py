"""Structure documents: the phase-4 ``p4_structure`` family's document builder (SPEC §5b).

A ``p4_structure`` document is a ``p3_repo`` document — the same ``doc_key``, the same
token ids, the same text: a repository piece (``BOS``, then per file ``<FILE_SEP>``, its
path, a newline and its text), or the chunk of a file too long for any piece — with every
enrichment plane and the chunk graph of SPEC §4 aligned to **its own** token positions.
The piece's ids were made by encoding each file after its path header, so the stage-8
planes of the chunks (aligned to the chunks' tokens) do not line up with them; the
structure is built again at character level over the whole document and sampled per
token exactly as stage 8 does (:func:`megacpp_core.tokenize.align_document`):

1. **Segments.** A document's text is cut into segments: a path header (no structure:
   every plane 0, no chunk) or a slice ``[a, b)`` of one kept file (a whole file inside a
   piece, a chunk's span for a fallback document). :func:`piece_segments` /
   :func:`fallback_segments`.
2. **Per file**, one tree-sitter enrichment of the whole file
   (:func:`megacpp_core.enrich.enrich_file`); each file segment takes the file's
   character planes over ``[a, b)`` and the file units overlapping it as its chunks, with
   the intra-file call/type edges (:func:`megacpp_core.enrich.document_enrichment`: the
   tree-sitter name resolution, or the libclang lane's edges for a file it parsed without
   a fatal error, as stage 6 does). In a piece the whole file is one segment, so its
   chunk list is the file's unit list and edges between any two units of the file count
   (stage 6 sees only the units inside one chunk).
3. **Cross-file edges** (the libclang lane, when on): a resolved call or type edge whose
   two ends are units of two different files of the same document becomes an edge
   between their chunks (:class:`Lane`); an edge whose files went to two different pieces
   is counted (``lane_edges_across_pieces``), not carried.
4. ``dep_level`` of every chunk is the BFS depth in the document's whole graph
   (:func:`megacpp_core.enrich.dep_levels`), so a header's declarations sit below the
   files that use them once the lane links them.
5. **Tokens.** The document's token character spans
   (:func:`megacpp_core.tokenize.token_char_spans`: the ids must spell the text exactly,
   the file separator included, else :class:`~megacpp_core.tokenize.AlignmentError`),
   then :func:`megacpp_core.tokenize.align_document`: the five planes, one uint8 per token
   (BOS and header tokens 0), ``chunk_boundaries`` in document token positions (a chunk
   holds the tokens whose first character lies in it; one that no token starts in is
   dropped with its edges), ``call_edges`` / ``type_edges`` re-indexed, and the
   document's ``platform_ids`` (:func:`megacpp_core.platforms.scan_platforms`, at most 20).

Packing moves chunk spans by the document's row offset and edges by the chunks of the
earlier documents of the row (:func:`megacpp_core.pack.build_rows`), so in a packed row
every plane is aligned token-for-token and every span is a row position. Pure functions
of their inputs: the same revision gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import enrich, pack, platforms, repo_documents, tokenize

#: The columns a ``p4_structure`` table adds to the ``p3_repo`` columns (SPEC §6 optional
#: planes and structure), in :data:`megacpp_core.pack.OPTIONAL_COLUMNS` order.
STRUCTURE_COLUMNS = pack.OPTIONAL_COLUMNS
#: ``enrich`` plane name → stage-6 character plane name (:data:`megacpp_core.tokenize.CHAR_PLANES`).
_CHAR_OF = {"structure": "char_structure", "ast_depth": "char_ast_depth", "sibling_index": "char_sibling_index",
            "ast_node_type": "char_ast_node_type"}
#: Lane edge kinds carried into ``call_edges`` / ``type_edges``.
_KINDS = {"call": "call_edges", "type": "type_edges"}


@dataclass(frozen=True)
class Segment:
    """A run of a document's text starting at character ``at``: a path header
    (``path is None``, ``length`` characters) or ``[a, b)`` of the kept file ``path``."""

    at: int
    path: str | None
    a: int = 0
    b: int = 0
    length: int = 0

    @property
    def size(self) -> int:
        return self.length if self.path is None else self.b - self.a


@dataclass
class Lane:
    """The libclang lane's edges of one revision, in file-unit indices
    (:func:`megacpp_core.enrich.file_units`): ``intra`` ``{path: {"call": {(i, j)},
    "type": {…}}}`` for every file it parsed without a fatal error (these replace the
    tree-sitter edges of the file, as in stage 6), and ``cross`` — resolved
    ``(kind, from_path, from_unit, to_path, to_unit)`` edges between two kept files."""

    intra: dict[str, dict[str, set]] = field(default_factory=dict)
    cross: list[tuple[str, str, int, str, int]] = field(default_factory=list)


def lane_from_tables(edges: pa.Table, build_info: pa.Table) -> Lane:
    """The :class:`Lane` of a revision's ``semantic_edges`` (``kind``, ``from_file``,
    ``to_file``, ``from_chunk``, ``to_chunk``) and ``build_info`` (``file``, ``status``):
    only ``call`` and ``type`` edges with both ends on a kept file's unit (non-null
    chunks) and distinct ends; a file is covered when its status is ``ok`` or ``errors``.
    Cross-file edges are kept whatever the status of their files (libclang resolved them
    in some translation unit). Deterministic: sorted, unique."""
    bi = build_info.select(["file", "status"]).to_pydict()
    covered = sorted({f for f, st in zip(bi["file"], bi["status"]) if st in ("ok", "errors")})
    lane = Lane({f: {"call": set(), "type": set()} for f in covered})
    e = edges.select(["kind", "from_file", "to_file", "from_chunk", "to_chunk"]).to_pydict()
    cross = set()
    for kind, ff, tf, a, b in zip(e["kind"], e["from_file"], e["to_file"], e["from_chunk"], e["to_chunk"]):
        if kind not in _KINDS or a is None or b is None:
            continue
        if ff != tf:
            cross.add((kind, ff, int(a), tf, int(b)))
        elif ff in lane.intra and a != b:
            lane.intra[ff][kind].add((int(a), int(b)))
    lane.cross = sorted(cross)
    return lane


def piece_segments(paths: Sequence[str], offsets: Sequence[int], texts: Mapping[str, str]) -> list[Segment]:
    """The segments of a repository piece (:func:`megacpp_core.repo_documents.piece_text`):
    per file its :data:`~megacpp_core.repo_documents.FILE_HEADER`, then the whole file.
    ``offsets`` are the pieces' header offsets; raises ``ValueError`` when they disagree
    with the header lengths and ``texts``."""
    out, at = [], 0
    for p, off in zip(paths, offsets):
        if off != at:
            raise ValueError(f"piece: header of {p!r} at {off}, expected {at}")
        head = len(repo_documents.FILE_HEADER.format(path=p))
        out += [Segment(at, None, length=head), Segment(at + head, p, 0, len(texts[p]))]
        at += head + len(texts[p])
    return out


def fallback_segments(path: str, start: int, end: int) -> list[Segment]:
    """The one segment of a fallback document: characters ``[start, end)`` of ``path``."""
    return [Segment(0, path, start, end)]


@dataclass
class Structure:
    """Character-level structure of one document (step 1–4 of the module doc):
    ``planes`` ``{char_* name: bytes of len(text)}``, ``chunks`` ``[{start, end, kind,
    name, dep_level}]`` in characters, ``edges`` ``{"call_edges": [...], "type_edges":
    [...]}`` as ``{"from", "to"}`` chunk indices, and counts ``cross_call``,
    ``cross_type`` (lane edges between two files of the document)."""

    planes: dict[str, bytes]
    chunks: list[dict]
    edges: dict[str, list[dict]]
    cross_call: int = 0
    cross_type: int = 0


def document_structure(n_chars: int, segments: Sequence[Segment], files: Mapping[str, enrich.FileEnrichment],
                       lane: Lane | None = None) -> Structure:
    """The :class:`Structure` of a document of ``n_chars`` characters made of
    ``segments`` (in order, tiling the text), from the whole-file enrichments ``files``
    (``{path: FileEnrichment}``) and the ``lane`` (or None: tree-sitter edges only).
    Raises ``ValueError`` when the segments do not tile ``[0, n_chars)`` or a segment
    lies outside its file."""
    planes = {c: np.zeros(n_chars, np.uint8) for c in _CHAR_OF.values()}
    chunks: list[dict] = []
    edges: set[tuple[str, int, int]] = set()
    unit_at: dict[tuple[str, int], int] = {}
    at = 0
    for s in segments:
        if s.at != at:
            raise ValueError(f"segments do not tile the document: one starts at {s.at}, expected {at}")
        at += s.size
        if s.path is None or s.b <= s.a:
            continue
        fe = files[s.path]
        if not 0 <= s.a < s.b <= len(fe.structure):
            raise ValueError(f"{s.path}: segment [{s.a}, {s.b}) outside the file's {len(fe.structure)} characters")
        for name, col in _CHAR_OF.items():
            planes[col][s.at:s.at + s.size] = getattr(fe, name)[s.a:s.b]
        de = enrich.document_enrichment(fe, s.a, s.b, lane.intra.get(s.path) if lane is not None else None)
        base = len(chunks)
        units = [k for k, u in enumerate(fe.units) if u.end > s.a and u.start < s.b]
        unit_at.update({(s.path, k): base + j for j, k in enumerate(units)})
        chunks += [{**c, "start": c["start"] + s.at, "end": c["end"] + s.at} for c in de.chunks]
        for kind, col in _KINDS.items():
            edges |= {(kind, base + e["from"], base + e["to"]) for e in getattr(de, col)}
    if at != n_chars:
        raise ValueError(f"segments cover {at} of {n_chars} characters")
    cross = {"call": 0, "type": 0}
    for kind, fp, fu, tp, tu in (lane.cross if lane is not None else ()):
        a, b = unit_at.get((fp, fu)), unit_at.get((tp, tu))
        if a is not None and b is not None and a != b and (kind, a, b) not in edges:
            edges.add((kind, a, b))
            cross[kind] += 1
    levels = enrich.dep_levels(len(chunks), [(a, b) for _, a, b in edges])
    for c, lv in zip(chunks, levels):
        c["dep_level"] = lv
    out = {col: [{"from": a, "to": b} for k, a, b in sorted(edges) if k == kind] for kind, col in _KINDS.items()}
    return Structure({c: p.tobytes() for c, p in planes.items()}, chunks, out, cross["call"], cross["type"])


def token_structure(text: str, ids: np.ndarray, structure: Structure, table: list[bytes] | pa.LargeBinaryArray,
                    lengths: np.ndarray, doc_key: str = "") -> dict:
    """Step 5: ``{plane: uint8[len(ids)]}`` for the five planes, ``chunk_boundaries`` in
    token positions, ``call_edges``, ``type_edges`` (chunk indices after dropping chunks
    no token starts in) and ``platform_ids`` (sorted uint16 ids, ≤ 20) of one BOS-prefixed
    document. ``table``/``lengths``: the bytes of every id and their lengths
    (:func:`megacpp_core.tokenize.token_char_spans`). Raises
    :class:`~megacpp_core.tokenize.AlignmentError` naming ``doc_key`` when the ids do not
    spell ``text``."""
    spans = tokenize.token_char_spans(text, ids, table, lengths, doc_key)
    out = tokenize.align_document(text, ids, spans, structure.planes, structure.chunks, structure.edges["call_edges"],
                                  structure.edges["type_edges"], doc_key)
    out["platform_ids"] = platforms.scan_platforms(text)
    return out


def structure_columns(rows: list[dict]) -> dict[str, pa.Array]:
    """The :data:`STRUCTURE_COLUMNS` arrays of :func:`token_structure` results, one per
    document, typed as :data:`megacpp_core.pack.OPTIONAL_TYPES` (``platform_ids`` per
    document: ``list<uint16>``)."""
    out = {}
    for c in STRUCTURE_COLUMNS:
        if c in pack.PLANES:
            lens = np.fromiter((len(r[c]) for r in rows), np.int64, count=len(rows))
            offs = pa.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
            flat = np.concatenate([r[c] for r in rows]).astype(np.uint8) if rows else np.zeros(0, np.uint8)
            out[c] = pa.ListArray.from_arrays(offs, pa.array(flat, pa.uint8()))
        elif c == "platform_ids":
            out[c] = pa.array([r[c] for r in rows], pack.PLATFORM_TYPE)
        else:
            out[c] = pa.array([r[c] for r in rows], pack.OPTIONAL_TYPES[c])
    return out


def chunks_inside_files(ids: Sequence[int], chunks: Sequence[dict], file_sep_id: int) -> bool:
    """True when no chunk span ``[start, end)`` of a document holds a file separator
    token (a chunk never crosses from one file of a piece into the next)."""
    seps = np.flatnonzero(np.asarray(ids) == file_sep_id)
    if not len(seps) or not len(chunks):
        return True
    s = np.asarray([c["start"] for c in chunks], np.int64)
    e = np.asarray([c["end"] for c in chunks], np.int64)
    first = np.searchsorted(seps, s, side="left")  # first separator at or after each start
    return bool(np.all((first == len(seps)) | (seps[np.minimum(first, len(seps) - 1)] >= e)))


#: Documents turned into Python objects at once by :func:`structure_table` (their texts,
#: token structures and edges); the arrow columns are built per batch and concatenated.
#: Implementation choice: a revision of 28,627 files (boost 1.81) held 2.6 GB as one batch.
BATCH_DOCS = 64


class StructureBuilder:
    """:func:`structure_table` a batch of documents at a time, for a reader that streams a
    revision's ``p3_repo`` documents: :meth:`add` turns one batch into ``p4_structure``
    rows, :meth:`figures` gives the figures of every batch added so far. Holds across
    batches only per-file piece numbers (for ``lane_edges_across_pieces``), the counts, and
    the enrichment of the last fallback file.

    ``fallback_file(path) -> (text, {doc_key: (start, end)})``: an oversized file's whole
    text and the character span of each of its fallback documents; ``parsed(text)``
    (optional) a file's :class:`~megacpp_core.chunk.ParsedSource` when one was kept for it
    (:data:`megacpp_core.memo.PARSED`), or None (the file is parsed); ``enriched(text,
    language)`` (optional) a file's :class:`~megacpp_core.enrich.FileEnrichment` when one
    was kept for it (:data:`megacpp_core.memo.FILE_ENRICHMENT`), or None (the file is
    enriched here; ``held`` counts the others); the other arguments as in
    :func:`structure_table`."""

    def __init__(self, languages: Mapping[str, str], fallback_file: Callable[[str], tuple[str, Mapping[str, tuple[int, int]]]],
                 lane: Lane | None, table: list[bytes] | pa.LargeBinaryArray, lengths: np.ndarray, file_sep_id: int,
                 parsed: Callable[[str], object] | None = None,
                 enriched: Callable[[str, str], enrich.FileEnrichment | None] | None = None):
        from .chunk import StructureCategory

        self.languages, self.fallback_file, self.lane = languages, fallback_file, lane
        self.parsed = parsed or (lambda text: None)
        self.enriched = enriched or (lambda text, language: None)
        self.held = 0
        self.table, self.lengths, self.file_sep_id = table, lengths, file_sep_id
        self.categories = StructureCategory
        self.figs = dict.fromkeys(("chunks", "call_edges", "type_edges", "cross_file_call_edges", "cross_file_type_edges",
                                   "chunks_without_tokens"), 0)
        self.counts = np.zeros(len(StructureCategory), np.int64)
        self.piece_of: dict[str, int] = {}
        self.cached: tuple[str, enrich.FileEnrichment, Mapping[str, tuple[int, int]]] | None = None
        self.docs = self.tokens = 0

    def add(self, p3: pa.Table) -> pa.Table:
        """``p3`` (a batch of ``p3_repo`` documents, in the revision's row order) with
        :data:`STRUCTURE_COLUMNS` appended; Python objects for :data:`BATCH_DOCS` documents
        at a time. Raises as :func:`structure_table`."""
        parts: list[dict[str, pa.Array]] = []
        figs, lane = self.figs, self.lane
        for lo in range(0, p3.num_rows, BATCH_DOCS):
            cols = p3.slice(lo, BATCH_DOCS).select(["doc_key", "text", "paths", "offsets", "path"]).to_pydict()
            ids_col = p3.column("input_ids").slice(lo, BATCH_DOCS).combine_chunks()
            offs, flat = ids_col.offsets.to_numpy(), ids_col.values.to_numpy(zero_copy_only=False)
            rows = []
            for j, (key, text, paths, offsets, path) in enumerate(zip(*cols.values())):
                i = self.docs + lo + j
                ids = flat[offs[j]:offs[j + 1]]
                if paths is not None:
                    texts = dict(repo_documents.split_piece(text, paths, offsets))
                    segs = piece_segments(paths, offsets, texts)
                    files = {p: self._enrich(texts[p], self.languages[p]) for p in paths}
                    self.piece_of.update(dict.fromkeys(paths, i))
                else:
                    if self.cached is None or self.cached[0] != path:
                        whole, spans = self.fallback_file(path)
                        self.cached = (path, self._enrich(whole, self.languages[path]), spans)
                    a, b = self.cached[2][key]
                    segs, files = fallback_segments(path, a, b), {path: self.cached[1]}
                    self.piece_of.setdefault(path, -1 - i)
                st = document_structure(len(text), segs, files, lane)
                got = token_structure(text, ids, st, self.table, self.lengths, key)
                if not chunks_inside_files(ids, got["chunk_boundaries"], self.file_sep_id):
                    raise ValueError(f"{key}: a chunk crosses a file separator")
                rows.append(got)
                figs["chunks"] += len(got["chunk_boundaries"])
                figs["chunks_without_tokens"] += len(st.chunks) - len(got["chunk_boundaries"])
                figs["call_edges"] += len(got["call_edges"])
                figs["type_edges"] += len(got["type_edges"])
                figs["cross_file_call_edges"] += st.cross_call
                figs["cross_file_type_edges"] += st.cross_type
                self.counts += np.bincount(got["structure_ids"][1:], minlength=len(self.counts))[:len(self.counts)]
            parts.append(structure_columns(rows))
            del cols, ids_col, rows
        out = p3
        for c, arr in (structure_columns([]) if not parts else
                       {c: pa.concat_arrays([part[c] for part in parts]) for c in parts[0]}).items():
            out = out.append_column(pa.field(c, arr.type), arr)
        self.docs += p3.num_rows
        self.tokens += int(pc.sum(p3.column("n_tokens")).as_py() or 0)
        return out

    def _enrich(self, text: str, language: str) -> enrich.FileEnrichment:
        """:func:`megacpp_core.enrich.enrich_file` of one whole file: the enrichment kept
        for it, else computed on its kept parse when one of the same grammar was kept."""
        from .chunk import grammar_of

        fe = self.enriched(text, language)
        if fe is not None:
            self.held += 1
            return fe
        parsed = self.parsed(text)
        if parsed is not None and parsed.grammar != grammar_of(language):
            parsed = None
        return enrich.enrich_file(text, language, parsed)

    def figures(self) -> dict:
        """``docs``, ``tokens``, ``chunks``, ``call_edges``, ``type_edges``,
        ``cross_file_call_edges``, ``cross_file_type_edges``, ``lane_edges_across_pieces``,
        ``chunks_without_tokens``, ``structure_token_share`` over the batches added."""
        piece_of = self.piece_of
        across = sum(1 for _, fp, _, tp, _ in (self.lane.cross if self.lane is not None else ())
                     if fp in piece_of and tp in piece_of and piece_of[fp] != piece_of[tp])
        total = max(1, int(self.counts.sum()))
        return {**self.figs, "docs": self.docs, "tokens": self.tokens, "lane_edges_across_pieces": across,
                "structure_token_share": {c.name: round(int(self.counts[c]) / total, 4) for c in self.categories}}


def structure_table(p3: pa.Table, languages: Mapping[str, str], fallback: Mapping[str, tuple[int, int]],
                    fallback_texts: Mapping[str, str], lane: Lane | None, table: list[bytes] | pa.LargeBinaryArray,
                    lengths: np.ndarray, file_sep_id: int) -> tuple[pa.Table, dict]:
    """The ``p4_structure`` documents of one revision's ``p3_repo`` documents ``p3``
    (:func:`megacpp_core.family_documents.repo_family_table`: pieces with ``paths`` and
    ``offsets``; fallback chunks with null ``paths``), in ``p3``'s row order and with its
    columns, plus :data:`STRUCTURE_COLUMNS` (module doc); one :class:`StructureBuilder`
    batch.

    ``languages``: ``{path: stage-1 language}`` of the revision's kept files;
    ``fallback``: ``{doc_key: (start, end)}`` character span in its file of every fallback
    document; ``fallback_texts``: ``{path: whole file text}`` of their files; ``lane``:
    :func:`lane_from_tables` or None; ``table``/``lengths``: the bytes of every id of the
    tokenizer and their lengths (:func:`megacpp_core.tokenize.token_char_spans`); ``file_sep_id``: the ``<FILE_SEP>`` id.
    Returns ``(table, figures)`` with figures ``docs``, ``tokens``, ``chunks``,
    ``call_edges``, ``type_edges``, ``cross_file_call_edges``, ``cross_file_type_edges``,
    ``lane_edges_across_pieces``, ``chunks_without_tokens``, ``structure_token_share``.
    Raises ``ValueError`` (a piece whose headers are not at its offsets, a chunk across a
    file separator), ``KeyError`` (a file without a language or text) and
    :class:`~megacpp_core.tokenize.AlignmentError`."""
    b = StructureBuilder(languages, lambda path: (fallback_texts[path], fallback), lane, table, lengths, file_sep_id)
    out = b.add(p3)
    return out, b.figures()
