"""Repository-level documents: the phase-3 ``p3_repo`` family's document builder (SPEC §5b).

A revision's kept files become a few long documents: the files concatenated in
**include-dependency order** (a header before every file that includes it; ties by path),
each written after the file-separator special token and its path
(:data:`FILE_HEADER`), and cut into **pieces** of at most ``budget`` tokens (65,536 for
``p3_repo``, the BOS included) only at file boundaries. One piece is one document (one
BOS). A single file longer than the budget is not cut here: it is returned apart, for
the caller to fall back to its phase-2 split (and count it).

Steps, each a pure function of its inputs (no order dependence, no Dagster):

1. :func:`include_spellings` — the ``#include`` targets of one file as written, from the
   tree-sitter ``preproc_include`` nodes (so an include inside a comment or a string does
   not count, one under ``#if`` does).
2. :func:`resolve_includes` — each spelling resolved to a file of the revision: the path
   relative to the including file's directory when that file exists (the ``"..."`` rule
   of C compilers), else the file whose path ends with ``/spelling`` (or equals it),
   shortest path first, then the lexicographically smaller. Spellings naming no file of
   the revision (system and third-party headers) are dropped.
3. :func:`include_order` — Kahn's topological sort with the ready files taken in path
   order, include cycles (two headers including each other behind guards) condensed
   first (networkx strongly connected components), so a file outside a cycle never goes
   before one of its includes and every revision has one order.
4. :func:`cut_pieces` — consecutive files of that order packed greedily into pieces of at
   most ``budget`` tokens.
"""

from __future__ import annotations

import functools
import heapq
import posixpath
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import tree_sitter
import tree_sitter_c
import tree_sitter_cpp

from .chunk import ParsedSource, grammar_of, parse_source, parser_for

#: Special token that opens every file of a repository piece (a fixed tokenizer ID,
#: SPEC §5 "file-separator markers"; :data:`megacpp_core.tokenizer.SPECIAL_TOKENS`).
FILE_SEP = "<FILE_SEP>"
#: What precedes each file's text in a piece: the separator, the path, a newline.
FILE_HEADER = FILE_SEP + "{path}\n"
#: ``p3_repo`` document budget in tokens, BOS included (SPEC §5b).
P3_BUDGET = 65_536


@functools.lru_cache(maxsize=None)
def _include_query(grammar: str) -> tree_sitter.Query:
    lang = tree_sitter.Language(tree_sitter_c.language() if grammar == "c" else tree_sitter_cpp.language())
    return tree_sitter.Query(lang, "(preproc_include path: (_) @path)")


def include_spellings(text: str, language: str, parsed: ParsedSource | None = None) -> list[str]:
    """The targets of the ``#include`` directives of ``text`` as written, in file order,
    without quotes or angle brackets (``"util/a.h"`` → ``util/a.h``). ``language`` is a
    stage-1 label (``c``, ``cpp``, ``header``, ``cuda``: :func:`megacpp_core.chunk.grammar_of`);
    raises ``ValueError`` for an unknown one. A macro include (``#include FOO_H``) has no
    spelling and is skipped. ``parsed``: the text's :class:`~megacpp_core.chunk.ParsedSource`
    (the same grammar's tree of the same bytes), when the caller has it; else the text is parsed."""
    grammar = grammar_of(language)
    if parsed is not None and parsed.grammar == grammar and parsed.text == text:
        src, tree = parsed.src, parsed.tree
    else:
        src = text.encode("utf-8", "surrogatepass")
        tree = parser_for(grammar).parse(src)
    nodes = tree_sitter.QueryCursor(_include_query(grammar)).captures(tree.root_node).get("path", [])
    out = []
    for node in sorted(nodes, key=lambda n: n.start_byte):
        raw = src[node.start_byte:node.end_byte].decode("utf-8", "surrogatepass")
        if len(raw) >= 2 and raw[0] in "\"<" and raw[-1] in "\">":
            out.append(raw[1:-1].strip())
    return out


def resolve_includes(paths: Sequence[str], spellings: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """``{path: [included paths of the revision]}`` (module doc, step 2), each list in
    first-include order without repeats or self-includes. ``paths``: the revision's file
    paths (``/``-separated, relative); ``spellings``: :func:`include_spellings` per path
    (missing paths include nothing)."""
    have = set(paths)
    by_tail: dict[str, list[str]] = {}
    for p in paths:
        parts = p.split("/")
        for k in range(len(parts)):
            by_tail.setdefault("/".join(parts[k:]), []).append(p)
    for tail in by_tail.values():
        tail.sort(key=lambda p: (len(p), p))
    out: dict[str, list[str]] = {}
    for p in sorted(paths):
        seen: list[str] = []
        for s in spellings.get(p, ()):
            rel = posixpath.normpath(posixpath.join(posixpath.dirname(p), s))
            target = rel if rel in have else (by_tail.get(posixpath.normpath(s).lstrip("/"), [None])[0])
            if target is not None and target != p and target not in seen:
                seen.append(target)
        out[p] = seen
    return out


def _greedy(nodes: list[str], waiting: dict[str, set[str]], includers: dict[str, list[str]]) -> list[str]:
    """Kahn's sort of ``nodes`` with ready files in path order; when none is ready (an
    include cycle), the file with the fewest includes still unplaced goes next."""
    ready = [p for p in nodes if not waiting[p]]
    heapq.heapify(ready)
    order: list[str] = []
    left = set(nodes)
    while left:
        if not ready:
            heapq.heappush(ready, min(left, key=lambda q: (len(waiting[q]), q)))
        p = heapq.heappop(ready)
        if p not in left:
            continue
        left.discard(p)
        order.append(p)
        for r in includers[p]:
            if r in left and p in waiting[r]:
                waiting[r].discard(p)
                if not waiting[r]:
                    heapq.heappush(ready, r)
    return order


def include_order(paths: Sequence[str], includes: Mapping[str, Sequence[str]]) -> list[str]:
    """Every path of ``paths`` once, each file after the files it includes (module doc,
    step 3). The include graph's strongly connected components (networkx
    ``condensation``) are placed in topological order, the ready component with the
    smallest path first; a component of one file is that file; inside an include cycle the
    files go in path order as far as their includes allow, and when none is ready the one
    with the fewest includes still unplaced goes next (ties by path). ``includes`` as
    :func:`resolve_includes` returns (targets outside ``paths`` are ignored)."""
    import networkx as nx

    nodes = sorted(set(paths))
    have = set(nodes)
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from((q, p) for p in nodes for q in includes.get(p, ()) if q in have and q != p)
    comp = nx.condensation(g)
    first = {c: min(comp.nodes[c]["members"]) for c in comp.nodes}
    order: list[str] = []
    for c in nx.lexicographical_topological_sort(comp, key=first.__getitem__):
        members = sorted(comp.nodes[c]["members"])
        if len(members) == 1:
            order += members
            continue
        inside = set(members)
        waiting = {p: {q for q in g.predecessors(p) if q in inside} for p in members}
        includers = {p: sorted(r for r in g.successors(p) if r in inside) for p in members}
        order += _greedy(members, waiting, includers)
    return order


@dataclass
class Pieces:
    """Output of :func:`cut_pieces`: ``pieces`` (lists of paths, in order, one document
    each), ``oversized`` (paths of files whose own tokens plus BOS exceed the budget, left
    out of every piece) and ``tokens`` per piece (BOS included)."""

    pieces: list[list[str]] = field(default_factory=list)
    oversized: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


def cut_pieces(order: Sequence[str], file_tokens: Mapping[str, int], budget: int = P3_BUDGET) -> Pieces:
    """Consecutive files of ``order`` packed greedily into pieces of at most ``budget``
    tokens, one BOS each (module doc, step 4). ``file_tokens[path]``: tokens of the file with
    its separator and path header (no BOS). A piece is closed when the next file does
    not fit; a file that does not fit even alone goes to ``oversized``. Raises
    ``ValueError`` for ``budget < 2`` or a negative token count."""
    if budget < 2:
        raise ValueError(f"budget must be >= 2 tokens, got {budget}")
    out, cur, used = Pieces(), [], 1
    for p in order:
        n = file_tokens[p]
        if n < 0:
            raise ValueError(f"{p}: negative token count {n}")
        if n + 1 > budget:
            out.oversized.append(p)
            continue
        if cur and used + n > budget:
            out.pieces.append(cur)
            out.tokens.append(used)
            cur, used = [], 1
        cur.append(p)
        used += n
    if cur:
        out.pieces.append(cur)
        out.tokens.append(used)
    return out


def piece_text(paths: Sequence[str], texts: Mapping[str, str]) -> str:
    """The text of one piece: each file's :data:`FILE_HEADER` then its text, in order (the
    caller adds the BOS)."""
    return "".join(FILE_HEADER.format(path=p) + texts[p] for p in paths)


#: Columns of :func:`revision_documents`' table: a piece's text view and its token ids.
DOCUMENTS_SCHEMA = pa.schema([
    ("doc_key", pa.string()), ("source", pa.string()), ("piece_index", pa.int32()),
    ("paths", pa.list_(pa.string())), ("offsets", pa.list_(pa.int64())),
    ("n_files", pa.int32()), ("n_tokens", pa.int64()), ("text", pa.large_string()),
    ("input_ids", pa.list_(pa.uint32())),
])


@dataclass
class RevisionDocuments:
    """Output of :func:`revision_documents`: ``table`` (:data:`DOCUMENTS_SCHEMA`, one row
    per piece, in include order), ``oversized`` (paths over the budget alone, for the
    phase-2 fallback) and figures (``files``, ``includes_resolved``,
    ``includes_after_includer``: resolved includes placed after their includer, which only
    an include cycle allows; ``pieces``, ``oversized_files``)."""

    table: pa.Table
    oversized: list[str]
    figures: dict


#: Pieces turned into one arrow table at a time by :func:`piece_tables`.
PIECE_BATCH = 64


def _ids_array(ids: Sequence) -> pa.ListArray:
    """``list<uint32>`` of token-id sequences (lists or arrays)."""
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    offsets = np.zeros(len(ids) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate([np.asarray(x, np.uint32) for x in ids]) if ids else np.zeros(0, np.uint32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.uint32()))


class RevisionSpill:
    """The files of one revision, added a shard at a time (pass 1 of the streamed
    documents): each file's ``#include`` spellings are parsed (:func:`include_spellings`),
    its body ``path + "\n" + text`` is encoded, and its text and ids are appended to an
    Arrow IPC file at ``path`` on local disk (one record batch per :meth:`add`). Memory
    holds per file its path, spellings, body token count and spill position, plus the
    shard being added; never the revision's texts or ids (its parses only through
    ``keep_parsed``, within that memo's limit).

    ``encode(strings) -> [ids]`` as in :func:`revision_documents`. ``keep_parsed(text,
    parsed)``, when given, receives each file's :class:`~megacpp_core.chunk.ParsedSource`
    (the stage hands them to ``p4_structure`` through :data:`megacpp_core.memo.PARSED`).
    ``known_spellings(text, language)``, when given, returns a file's spellings found
    already (:data:`megacpp_core.memo.FILE_INCLUDES`) or None; such a file is not parsed,
    and ``keep_parsed`` does not get it.
    """

    SCHEMA = pa.schema([("text", pa.large_string()), ("ids", pa.list_(pa.uint32()))])

    def __init__(self, path, encode: Callable[[list[str]], list],
                 keep_parsed: Callable[[str, ParsedSource], object] | None = None,
                 known_spellings: Callable[[str, str], list[str] | None] | None = None):
        self.path, self.encode, self.keep_parsed = path, encode, keep_parsed
        self.known_spellings = known_spellings
        self.where: dict[str, tuple[int, int]] = {}
        self.spellings: dict[str, list[str]] = {}
        self.body_tokens: dict[str, int] = {}
        self._batches = 0
        self._writer = pa.ipc.new_file(str(path), self.SCHEMA)

    def add(self, files: Mapping[str, tuple[str, str]], bodies: Mapping[str, np.ndarray] | None = None) -> None:
        """Spill ``files`` (``{path: (language, text)}``, one shard's files); ``bodies``
        (optional) gives some files' body ids already (``{path: uint32[n]}``, made from the
        tokenizer's sample ids, :func:`megacpp_core.sample_ids.after_header`): only the
        others are encoded. Raises ``ValueError`` for a path added before (a file in two
        shards of one revision) and from :func:`include_spellings` for an unknown language."""
        paths = sorted(files)
        again = [q for q in paths if q in self.where]
        if again:
            raise ValueError(f"{again[0]}: a file in two shards of one revision")
        if not paths:
            return
        for q in paths:
            language, text = files[q]
            known = self.known_spellings(text, language) if self.known_spellings is not None and text else None
            if known is not None:
                self.spellings[q] = known
                continue
            if self.keep_parsed is None or not text:
                self.spellings[q] = include_spellings(text, language)
                continue
            parsed = parse_source(text, language)
            self.spellings[q] = include_spellings(text, language, parsed)
            self.keep_parsed(text, parsed)
        bodies = bodies or {}
        todo = [q for q in paths if q not in bodies]
        fresh = dict(zip(todo, self.encode([f"{q}\n{files[q][1]}" for q in todo]) if todo else ()))
        ids = [bodies[q] if q in bodies else fresh[q] for q in paths]
        for i, q in enumerate(paths):
            self.where[q], self.body_tokens[q] = (self._batches, i), len(ids[i])
        self._writer.write_batch(pa.record_batch([pa.array([files[q][1] for q in paths], pa.large_string()),
                                                  _ids_array(ids)], schema=self.SCHEMA))
        self._batches += 1

    def close(self) -> None:
        """Close the spill file (before :func:`plan_pieces` and :func:`piece_tables`)."""
        self._writer.close()


def plan_pieces(spill: RevisionSpill, budget: int = P3_BUDGET) -> tuple[Pieces, dict]:
    """Pass 2: the include order of the spilled files and its pieces (module doc, steps
    2–4), from the per-file summary alone. Returns ``(pieces, figures)`` with figures
    ``files``, ``includes_resolved``, ``includes_after_includer`` (resolved includes placed
    after their includer, which only an include cycle allows), ``pieces``,
    ``oversized_files``. Raises ``ValueError`` from :func:`cut_pieces`."""
    paths = sorted(spill.where)
    includes = resolve_includes(paths, spill.spellings)
    order = include_order(paths, includes)
    pos = {p: i for i, p in enumerate(order)}
    after = sum(pos[q] > pos[p] for p, qs in includes.items() for q in qs)
    pieces = cut_pieces(order, {p: 1 + spill.body_tokens[p] for p in order}, budget)
    figures = {"files": len(paths), "includes_resolved": sum(map(len, includes.values())),
               "includes_after_includer": int(after), "pieces": len(pieces.pieces), "oversized_files": len(pieces.oversized)}
    return pieces, figures


def piece_tables(source: str, spill: RevisionSpill, pieces: Pieces, *, bos_id: int, file_sep_id: int,
                 which: Sequence[int] | None = None, batch: int = PIECE_BATCH) -> Iterator[pa.Table]:
    """Pass 3: the pieces ``which`` (indices into ``pieces.pieces``; all, in piece order,
    when None) as :data:`DOCUMENTS_SCHEMA` tables of at most ``batch`` rows, each file's
    text and ids read back from the memory-mapped spill (see :func:`revision_documents` for
    the columns). Memory is one batch of pieces."""
    head, sep = np.asarray([bos_id], np.uint32), np.asarray([file_sep_id], np.uint32)
    which = range(len(pieces.pieces)) if which is None else which
    with pa.memory_map(str(spill.path)) as src:
        reader = pa.ipc.open_file(src)
        cols: dict[str, list] = {f.name: [] for f in DOCUMENTS_SCHEMA}
        for k, i in enumerate(which):
            ps = pieces.pieces[i]
            offsets, at, parts, texts = [], 0, [head], {}
            for p in ps:
                b, r = spill.where[p]
                rec = reader.get_batch(b)
                texts[p] = rec.column(0)[r].as_py()
                offsets.append(at)
                at += len(FILE_HEADER.format(path=p)) + len(texts[p])
                parts += [sep, rec.column(1)[r].values.to_numpy()]
            ids = np.concatenate(parts)
            cols["doc_key"].append(f"{source}/@p3/{i:05d}")
            cols["source"].append(source)
            cols["piece_index"].append(i)
            cols["paths"].append(list(ps))
            cols["offsets"].append(offsets)
            cols["n_files"].append(len(ps))
            cols["n_tokens"].append(len(ids))
            cols["text"].append(piece_text(ps, texts))
            cols["input_ids"].append(ids)
            if len(cols["doc_key"]) == batch or k == len(which) - 1:
                yield pa.table(cols, schema=DOCUMENTS_SCHEMA)
                cols = {f.name: [] for f in DOCUMENTS_SCHEMA}


def revision_documents(source: str, files: Mapping[str, tuple[str, str]],
                       encode: Callable[[list[str]], list[list[int]]], *, bos_id: int, file_sep_id: int,
                       budget: int = P3_BUDGET) -> RevisionDocuments:
    """The ``p3_repo`` documents of one revision, as text and as token ids (module doc,
    steps 1–4), in one table: the three passes (:class:`RevisionSpill`,
    :func:`plan_pieces`, :func:`piece_tables`) over ``files`` given at once, spilled to a
    temporary directory. The stage streams the same passes shard by shard.

    ``files``: ``{path: (language, text)}`` of the revision's kept files (``language`` as
    in :func:`include_spellings`); ``encode(strings) -> [ids]`` (lists or uint32 arrays) is the snapshot
    tokenizer without special tokens. The separator is inserted **by id**: the tokenizer
    never turns text into a special token, so a file holding the string ``<FILE_SEP>``
    (or ``<BOS>``) stays text. A piece's ``input_ids`` are ``bos_id``, then per file
    ``file_sep_id`` and ``encode(path + "\n" + text)``; ``n_tokens`` is their count (≤
    ``budget``). ``text`` is the same piece as text (:func:`piece_text`), ``offsets[i]`` the
    character offset of ``paths[i]``'s :data:`FILE_HEADER` in it (:func:`split_piece`
    inverts it exactly). ``doc_key`` is ``SOURCE/@p3/NNNNN``. The same files always give
    the same table. Raises ``ValueError`` from :func:`cut_pieces`."""
    with tempfile.TemporaryDirectory(prefix="p3-spill-") as tmp:
        spill = RevisionSpill(Path(tmp) / "files.arrow", encode)
        try:
            spill.add(files)
        finally:
            spill.close()
        pieces, figures = plan_pieces(spill, budget)
        parts = list(piece_tables(source, spill, pieces, bos_id=bos_id, file_sep_id=file_sep_id))
    table = pa.concat_tables(parts) if parts else DOCUMENTS_SCHEMA.empty_table()
    return RevisionDocuments(table, pieces.oversized, figures)


def split_piece(text: str, paths: Sequence[str], offsets: Sequence[int]) -> list[tuple[str, str]]:
    """``[(path, file text)]`` of one piece, from its ``paths`` and header ``offsets``
    (the inverse of :func:`piece_text`). Raises ``ValueError`` when a header is not where
    ``offsets`` puts it or the offsets do not increase."""
    out = []
    ends = list(offsets[1:]) + [len(text)]
    for p, a, b in zip(paths, offsets, ends):
        head = FILE_HEADER.format(path=p)
        if b < a or text[a:a + len(head)] != head:
            raise ValueError(f"piece: no header for {p!r} at offset {a}")
        out.append((p, text[a + len(head):b]))
    return out


def split_ids(ids: Sequence[int], file_sep_id: int) -> list[list[int]]:
    """The per-file token runs of one piece's ids (BOS first): the ids after each
    ``file_sep_id``, up to the next one. Raises ``ValueError`` when the ids do not start
    with a BOS followed by a separator."""
    ids = list(ids)
    if len(ids) < 2 or ids[1] != file_sep_id:
        raise ValueError("a p3 piece starts with BOS then the file separator")
    cuts = [i for i, t in enumerate(ids) if t == file_sep_id] + [len(ids)]
    return [ids[a + 1:b] for a, b in zip(cuts[:-1], cuts[1:])]
