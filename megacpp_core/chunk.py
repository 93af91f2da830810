"""Stage 6 (SPEC §4): split C/C++ source into documents under an exact token budget.

A file is cut at syntactic boundaries found with tree-sitter: top-level units
(functions, classes, namespaces, typedefs, preprocessor lines, ...) are packed greedily
into chunks whose exact token count, measured with the caller's ``count_tokens`` on the
final chunk text, never exceeds ``budget``. A unit that is too big on its own is split
into its children (namespace/class/function bodies at member or statement boundaries),
then by lines, then by characters. Chunks tile the text exactly: nothing is truncated,
reordered or lost, and ``"".join(text[c.start:c.end] for c in chunks) == text``.

Units are the named children of a node. Comments lead the next unit, except a comment
starting on the line where the previous unit ends (a trailing comment). A cut between two
units falls after the end of the previous unit's line (leading blank lines and
indentation go with the next unit), or at the next unit when both share a line.

Unit kinds: ``function_definition`` -> FUNC_BODY; class/struct/union/enum specifiers
(also inside a ``declaration``) -> CLASS_DECL; ``namespace_definition`` -> NAMESPACE;
``type_definition``/``alias_declaration`` -> TYPEDEF; ``#include``/``#define``/
``#pragma`` and other preprocessor calls -> PREAMBLE (at any depth); ``field_declaration``
-> CLASS_MEMBER; ``comment`` -> COMMENT; ``template_declaration`` -> what it wraps;
anything else (``#if`` blocks, statements, ERROR nodes) -> OTHER.

Files whose tree has ERROR nodes (tree-sitter's error recovery; macros it cannot expand
are the usual cause) are cut by :func:`brace_cuts` instead: a brace-balanced splitter that
ends a unit at a ``;`` or ``}`` back at depth 0 or at a preprocessor line, skipping string
and character literals and comments. Its oversized units split at the statements one
brace level deeper, then by lines and characters, under the same exact budget.

Each document is assigned the smallest of :data:`BUCKETS` that holds it with its BOS
(:func:`bucket_for`); the stage asserts it for every document.

Offsets are Python ``str`` (code point) offsets; tree-sitter's UTF-8 byte offsets are
converted before use. Output depends only on the inputs (deterministic).
"""

from __future__ import annotations

import enum
import functools
from collections import deque
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import tree_sitter
import tree_sitter_c
import tree_sitter_cpp

from .brace_split import brace_cuts

__all__ = [
    "StructureCategory",
    "Chunk",
    "ChunkingError",
    "LANGUAGES",
    "BUCKETS",
    "ParsedSource",
    "bucket_for",
    "brace_cuts",
    "parse_source",
    "split_document",
    "split_document_with_stats",
]


class StructureCategory(enum.IntEnum):
    """Structural category of a span of source (values fixed by SPEC §4).

    Chunks use the member *name* as :attr:`Chunk.kind`. ``FUNC_SIGNATURE`` is a
    token-level category of SPEC §4 and is never produced as a chunk kind here.
    """

    OTHER = 0
    PREAMBLE = 1
    FUNC_SIGNATURE = 2
    FUNC_BODY = 3
    CLASS_DECL = 4
    CLASS_MEMBER = 5
    COMMENT = 6
    TYPEDEF = 7
    NAMESPACE = 8


class ChunkingError(ValueError):
    """A file cannot be split under the budget, or an output invariant failed.

    The message always starts with the ``doc_key`` passed to :func:`split_document`.
    """


@dataclass(frozen=True)
class Chunk:
    """One document cut from a source file.

    ``start``/``end`` are ``str`` offsets into the original text (``end`` exclusive).
    ``kind`` is a :class:`StructureCategory` name: the kind of the unit when the chunk is
    exactly one complete syntactic unit (with its leading comments and whitespace and the
    rest of its last line), otherwise ``"OTHER"``. ``name`` is the function, class,
    namespace or typedef name for such a chunk, else ``None``. ``n_tokens`` is the exact
    ``count_tokens(text[start:end])``.
    """

    start: int
    end: int
    kind: str
    name: str | None
    n_tokens: int


#: ``language`` values accepted by :func:`split_document` (the stage-1 language labels);
#: ``c`` uses the C grammar, the others the C++ grammar.
LANGUAGES = ("c", "cpp", "header", "cuda")

#: Document length buckets in tokens, BOS included (SPEC §4 "Chunking": 4k, 8k, 16k, 64k,
#: 128k are real budgets, not labels).
BUCKETS = (4096, 8192, 16384, 65536, 131072)


def bucket_for(n_tokens_with_bos: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """The smallest bucket (tokens) holding a document of ``n_tokens_with_bos`` tokens.

    Raises ``ValueError`` when even the largest bucket is too small.
    """
    for b in buckets:
        if n_tokens_with_bos <= b:
            return b
    raise ValueError(f"a document of {n_tokens_with_bos} tokens exceeds the largest bucket {buckets[-1]}")

_PREAMBLE = {"preproc_include", "preproc_def", "preproc_function_def", "preproc_call"}
_CLASSLIKE = {"class_specifier", "struct_specifier", "union_specifier", "enum_specifier"}
_FIXED_KIND = {
    "function_definition": StructureCategory.FUNC_BODY,
    "namespace_definition": StructureCategory.NAMESPACE,
    "type_definition": StructureCategory.TYPEDEF,
    "alias_declaration": StructureCategory.TYPEDEF,
    "field_declaration": StructureCategory.CLASS_MEMBER,
    "comment": StructureCategory.COMMENT,
    **{t: StructureCategory.CLASS_DECL for t in _CLASSLIKE},
    **{t: StructureCategory.PREAMBLE for t in _PREAMBLE},
}
#: Syntactic splits nested deeper than this fall back to lines/characters. Real nesting
#: (namespace > class > function > loops > statement) stays far below it; it bounds the
#: cost of left-recursive chains (``1+1+...``, ``else if`` ladders), which would otherwise
#: recount a shrinking prefix once per level (quadratic). Chosen here, not from the SPEC.
MAX_SPLIT_DEPTH = 32

_NAMED_KINDS = {
    StructureCategory.FUNC_BODY,
    StructureCategory.CLASS_DECL,
    StructureCategory.NAMESPACE,
    StructureCategory.TYPEDEF,
}


def declarator_identifier(node) -> str | None:
    """Text of the identifier a (possibly nested) declarator declares: ``*(*f)(int)`` ->
    ``f``, ``Foo::bar(int) const`` -> ``Foo::bar``; ``None`` when there is none."""
    while node is not None:
        inner = node.child_by_field_name("declarator")
        if inner is None and node.type == "parenthesized_declarator" and node.named_children:
            inner = node.named_children[0]
        if inner is None:
            break
        node = inner
    return None if node is None else node.text.decode("utf-8", "replace")


def _main(nodes: tuple) -> int:
    """Index of the main node of a group: the last non-comment node (else the last)."""
    for i in range(len(nodes) - 1, -1, -1):
        if nodes[i].type != "comment":
            return i
    return len(nodes) - 1


@functools.lru_cache(maxsize=None)
def parser_for(grammar: str) -> tree_sitter.Parser:
    """One parser per grammar (``"c"`` or ``"cpp"``) per process; not thread-safe."""
    lang = tree_sitter_c.language() if grammar == "c" else tree_sitter_cpp.language()
    return tree_sitter.Parser(tree_sitter.Language(lang))


def grammar_of(language: str) -> str:
    """Tree-sitter grammar (``"c"`` or ``"cpp"``) of a stage-1 language label; headers
    are parsed with the C++ grammar."""
    if language not in LANGUAGES:
        raise ValueError(f"unknown language {language!r}; expected one of {LANGUAGES}")
    return "c" if language == "c" else "cpp"


@functools.lru_cache(maxsize=None)
def _error_query(grammar: str) -> tree_sitter.Query:
    lang = tree_sitter_c.language() if grammar == "c" else tree_sitter_cpp.language()
    return tree_sitter.Query(tree_sitter.Language(lang), "(ERROR) @e")


class ParsedSource:
    """One file parsed once and shared by chunking and enrichment.

    ``text`` (str), ``src`` its UTF-8 bytes (surrogates passed through), ``grammar``
    (``"c"``/``"cpp"``), ``tree`` the tree-sitter tree, ``b2c`` a numpy int64 array of
    ``len(src) + 1`` mapping a byte offset to the ``str`` offset of the character holding
    it (``None`` for ASCII text, where they are equal), ``has_error_nodes`` True when the
    tree contains an ERROR node (MISSING nodes alone do not count; found by a query on
    first use unless a walk over every node, :mod:`megacpp_core.enrich`'s, set it).
    """

    def __init__(self, text: str, language: str):
        self.text = text
        self.grammar = grammar_of(language)
        if text.isascii():
            self.b2c = None
            self.src = text.encode("ascii")
        else:
            self.src = text.encode("utf-8", "surrogatepass")
            lead = (np.frombuffer(self.src, np.uint8) & 0xC0) != 0x80
            self.b2c = np.concatenate(([0], np.cumsum(lead, dtype=np.int64)))
            # a continuation byte maps to the character that holds it
            self.b2c[:-1][~lead] -= 1
        self.tree = parser_for(self.grammar).parse(self.src)
        self._error_nodes: bool | None = None

    @property
    def has_error_nodes(self) -> bool:
        """True when the tree has an ERROR node: a query over the tree on first use, unless
        a walk over every node set it first (the setter)."""
        if self._error_nodes is None:
            root = self.tree.root_node
            self._error_nodes = bool(root.has_error) and bool(
                tree_sitter.QueryCursor(_error_query(self.grammar)).captures(root))
        return self._error_nodes

    @has_error_nodes.setter
    def has_error_nodes(self, value: bool) -> None:
        self._error_nodes = bool(value)

    def char(self, byte: int) -> int:
        """UTF-8 byte offset -> ``str`` offset (an end offset maps to the next character)."""
        return byte if self.b2c is None else int(self.b2c[byte])

    def chars(self, byte_offsets: np.ndarray) -> np.ndarray:
        """Vectorized :meth:`char` over an integer array."""
        return byte_offsets if self.b2c is None else self.b2c[byte_offsets]


def parse_source(text: str, language: str) -> ParsedSource:
    """Parse ``text`` with the grammar of ``language`` (see :class:`ParsedSource`).

    Raises ``ValueError`` for an unknown language.
    """
    return ParsedSource(text, language)


class _Piece(NamedTuple):
    """A span ``[start, end)`` to pack: whole syntactic nodes (``nodes``) or a fragment."""

    start: int
    end: int
    nodes: tuple  # tree_sitter.Node; () for line/character fragments
    n: int | None = None  # exact token count once known
    depth: int = 0  # syntactic expansions above this piece
    level: int | None = None  # brace level of a brace-splitter unit; None otherwise


class _Splitter:
    """State for one call of :func:`split_document_with_stats`."""

    def __init__(self, parsed: ParsedSource, count: Callable[[str], int], budget: int, key: str,
                 count_span: Callable[[int, int], int] | None = None):
        self.text, self.count, self.budget, self.key = parsed.text, count, budget, key
        self.count_span = count_span or (lambda a, b: count(self.text[a:b]))
        self.fallback_splits = 0
        self.src, self.b2c = parsed.src, parsed.b2c

    def char(self, byte: int) -> int:
        """UTF-8 byte offset -> ``str`` offset."""
        return byte if self.b2c is None else int(self.b2c[byte])

    def brace_pieces(self, lo: int, hi: int, level: int, depth: int) -> list[_Piece]:
        """Pieces of ``[lo, hi)`` cut by :func:`brace_cuts`: at depth 0 for the file
        (``level`` 0), one brace level inside the piece for an expansion (``level`` > 0,
        the pieces' nesting, kept for information)."""
        bounds = [lo, *brace_cuts(self.text, lo, hi, 0 if level == 0 else 1), hi]
        return [_Piece(a, b, (), None, depth, level) for a, b in zip(bounds, bounds[1:]) if a < b]

    def span(self, node) -> tuple[int, int]:
        """``str`` offsets ``(start, end)`` of a tree-sitter node."""
        return self.char(node.start_byte), self.char(node.end_byte)

    # -- kinds ---------------------------------------------------------------------
    def kind(self, nodes: tuple) -> tuple[StructureCategory, str | None]:
        """Kind and name of a group of whole nodes (leading comments + one main node)."""
        if not nodes:
            return StructureCategory.OTHER, None
        node = nodes[_main(nodes)]
        while node.type == "template_declaration":  # kind of what it wraps
            inner = [c for c in node.named_children if c.type not in ("template_parameter_list", "comment")]
            if not inner:
                break
            node = inner[-1]
        if node.type == "declaration":
            t = node.child_by_field_name("type")
            if t is not None and t.type in _CLASSLIKE and t.child_by_field_name("body") is not None:
                node = t
        kind = _FIXED_KIND.get(node.type, StructureCategory.OTHER)
        if kind not in _NAMED_KINDS:
            return kind, None
        if node.type in ("function_definition", "type_definition"):
            return kind, declarator_identifier(node.child_by_field_name("declarator"))
        target = node.child_by_field_name("name")
        return kind, None if target is None else target.text.decode("utf-8", "replace")

    # -- tiling ----------------------------------------------------------------------
    def cut(self, prev_end: int, next_start: int) -> int:
        """Boundary between two units: after the rest of the previous unit's line."""
        if prev_end == 0 or self.text[prev_end - 1] == "\n":
            return prev_end
        nl = self.text.find("\n", prev_end, next_start)
        return nl + 1 if nl >= 0 else next_start

    def tile(self, groups: list[tuple], lo: int, hi: int, depth: int = 0) -> list[_Piece]:
        """Pieces tiling ``[lo, hi)``, one per node group, cut between groups."""
        bounds = [lo]
        for prev, nxt in zip(groups, groups[1:]):
            bounds.append(self.cut(self.span(prev[-1])[1], self.span(nxt[0])[0]))
        bounds.append(hi)
        return [_Piece(a, b, g, None, depth) for a, b, g in zip(bounds, bounds[1:], groups) if a < b]

    def groups(self, parent) -> list[tuple]:
        """Named non-empty children of ``parent``; comments attach to a neighbour unit.

        A comment starting on the line where the previous unit ends is a trailing comment
        of that unit; other comments lead the next unit (or form a trailing COMMENT unit).
        """
        out: list[tuple] = []
        pending: list = []
        for c in parent.named_children:
            if c.start_byte >= c.end_byte:  # MISSING nodes inserted by error recovery
                continue
            if c.type == "comment":
                if out and not pending and b"\n" not in self.src[out[-1][-1].end_byte - 1 : c.start_byte]:
                    out[-1] += (c,)
                else:
                    pending.append(c)
            else:
                out.append((*pending, c))
                pending = []
        if pending:
            out.append(tuple(pending))
        return out

    def expand(self, p: _Piece) -> list[_Piece]:
        """Split an oversized piece: nodes, then children, then lines, then characters."""
        if p.level is not None and p.depth < MAX_SPLIT_DEPTH:  # brace splitter: one level deeper
            inner = self.brace_pieces(p.start, p.end, p.level + 1, p.depth + 1)
            if len(inner) > 1:
                return inner
        if p.nodes and p.depth < MAX_SPLIT_DEPTH:
            i = _main(p.nodes)
            if p.nodes[i].type == "comment":  # comments only: one piece each
                groups = [(n,) for n in p.nodes] if len(p.nodes) > 1 else []
            else:  # leading comments, the main node's children, trailing comments
                groups = [(n,) for n in p.nodes[:i]] + self.groups(p.nodes[i]) + [(n,) for n in p.nodes[i + 1 :]]
            if groups:
                return self.tile(groups, p.start, p.end, p.depth + 1)
        self.fallback_splits += 1
        cuts = [p.start]
        nl = self.text.find("\n", p.start, p.end - 1)
        while nl >= 0:
            cuts.append(nl + 1)
            nl = self.text.find("\n", nl + 1, p.end - 1)
        if len(cuts) > 1:
            cuts.append(p.end)
            return [_Piece(a, b, (), None, p.depth + 1) for a, b in zip(cuts, cuts[1:])]
        return self.split_chars(p)

    def split_chars(self, p: _Piece) -> list[_Piece]:
        """Cut a single oversized line into maximal prefixes that fit the budget.

        Gallops from a guess based on the piece's token density, then binary-searches the
        longest prefix whose count is <= budget. Raises :class:`ChunkingError` when one
        character alone exceeds the budget.
        """
        text, count, budget = self.text, self.count_span, self.budget
        density = (p.end - p.start) / max(p.n or 1, 1)  # chars per token
        out, lo = [], p.start
        while lo < p.end:
            rem = p.end - lo
            g = min(rem, max(1, int(budget * density)))
            n = count(lo, lo + g)
            if n <= budget:
                good, good_n, bad = g, n, rem + 1
                while good < rem:
                    g = min(rem, 2 * good)
                    n = count(lo, lo + g)
                    if n > budget:
                        bad = g
                        break
                    good, good_n = g, n
            else:
                good, good_n, bad = 0, 0, g
                while bad > 1:
                    g = bad // 2
                    n = count(lo, lo + g)
                    if n <= budget:
                        good, good_n = g, n
                        break
                    bad = g
            while bad - good > 1:
                g = (good + bad) // 2
                n = count(lo, lo + g)
                if n <= budget:
                    good, good_n = g, n
                else:
                    bad = g
            if good == 0:
                raise ChunkingError(
                    f"{self.key}: character {text[lo]!r} at offset {lo} alone exceeds the budget of {budget} tokens"
                )
            out.append(_Piece(lo, lo + good, (), good_n, p.depth + 1))
            lo += good
        return out

    # -- packing ---------------------------------------------------------------------
    def chunk(self, pieces: list[_Piece], n: int) -> Chunk:
        """The chunk spanning ``pieces`` (``n`` tokens); a unit's kind only if it is alone."""
        if len(pieces) == 1:
            kind, name = self.kind(pieces[0].nodes)
        else:
            kind, name = StructureCategory.OTHER, None
        return Chunk(pieces[0].start, pieces[-1].end, kind.name, name, n)

    def starts_chunk(self, p: _Piece, cur: list[_Piece]) -> bool:
        """True when oversized ``p`` is a function/class/namespace/typedef that follows a
        sibling (or a piece of one) in ``cur``; headers of enclosing units do not count."""
        return self.kind(p.nodes)[0] in _NAMED_KINDS and any(q.depth >= p.depth for q in cur)

    def pack(self, pieces: list[_Piece]) -> list[Chunk]:
        """Greedy packing; oversized pieces are expanded in place in the stream.

        Candidate chunks are sized by the sum of per-piece counts, then the assembled text
        is counted exactly and pieces are pushed back one at a time while it exceeds the
        budget. A chunk cut mid-line is shortened to its last line end if that keeps at
        least half of it. An oversized function/class/namespace/typedef starts a chunk.
        """
        text, count, budget = self.text, self.count_span, self.budget
        stream = deque(pieces)
        out: list[Chunk] = []
        cur: list[_Piece] = []
        est = 0

        def flush() -> None:
            nonlocal est
            if stream and text[cur[-1].end - 1] != "\n":  # prefer ending at a line end
                acc, keep = 0, 0
                for j, q in enumerate(cur):
                    acc += q.n
                    if text[q.end - 1] == "\n" and 2 * acc >= est:
                        keep = j + 1
                while keep and len(cur) > keep:
                    stream.appendleft(cur.pop())
            while True:
                n = cur[0].n if len(cur) == 1 else count(cur[0].start, cur[-1].end)
                if n <= budget:
                    break
                stream.appendleft(cur.pop())  # back off one unit: the estimate was low
            out.append(self.chunk(cur, n))
            cur.clear()
            est = 0

        while stream or cur:
            p = stream.popleft() if stream else None
            if p is not None and p.n is None:
                p = p._replace(n=count(p.start, p.end))
            if p is not None and p.n > budget and not self.starts_chunk(p, cur):
                stream.extendleft(reversed(self.expand(p)))
            elif p is None or (cur and est + p.n > budget):
                if p is not None:
                    stream.appendleft(p)
                flush()
            else:
                cur.append(p)
                est += p.n
        return out


def split_document_with_stats(
    text: str,
    language: str,
    count_tokens: Callable[[str], int],
    budget: int,
    doc_key: str = "",
    parsed: ParsedSource | None = None,
    count_span: Callable[[int, int], int] | None = None,
) -> tuple[list[Chunk], dict]:
    """Split ``text`` into contiguous :class:`Chunk` s of at most ``budget`` tokens each.

    ``language`` is one of :data:`LANGUAGES`; ``count_tokens(str) -> int`` is the exact
    token count (the real tokenizer, without special tokens); ``budget`` >= 1 tokens;
    ``parsed`` an already parsed :class:`ParsedSource` of ``text`` (parsed here if None);
    ``count_span(a, b)``, when given, is ``count_tokens(text[a:b])`` computed another way
    (:class:`megacpp_core.span_count.SpanCounter`) and used for every span other than the
    whole text. Returns ``(chunks, stats)`` with ``stats = {"parse_errors": bool (the tree
    has ERROR or MISSING nodes), "brace_fallback": bool (the tree has ERROR nodes, so the
    brace-balanced splitter cut the file), "units": int (top-level units; 1 for a file
    under the budget with ERROR nodes, whose one chunk needs no brace units),
    "fallback_splits": int (pieces split by lines or characters)}``.

    Guarantees (checked before returning): ``chunks`` tile ``text`` exactly, in order,
    with no empty chunk; each ``n_tokens == count_tokens(chunk text) <= budget``;
    ``[]`` for empty text. Pieces of a split unit are labelled ``"OTHER"``, and so are
    the chunks of the brace-balanced splitter.

    Raises ``ValueError`` for an unknown ``language`` or ``budget < 1``, and
    :class:`ChunkingError` (a ``ValueError`` naming ``doc_key``) when a single character
    exceeds the budget or an invariant fails. A byte-level BPE needs at most 4 tokens
    per character (its UTF-8 length), so with one any ``budget >= 4`` always succeeds.
    """
    if language not in LANGUAGES:
        raise ValueError(f"{doc_key}: unknown language {language!r}; expected one of {LANGUAGES}")
    if budget < 1:
        raise ValueError(f"{doc_key}: budget must be >= 1 token, got {budget}")
    if not text:
        return [], {"parse_errors": False, "brace_fallback": False, "units": 0, "fallback_splits": 0}
    parsed = parsed or ParsedSource(text, language)
    if parsed.text is not text and parsed.text != text:
        raise ValueError(f"{doc_key}: the parsed source is not this text")
    s = _Splitter(parsed, count_tokens, budget, doc_key, count_span)
    root = parsed.tree.root_node
    n = count_tokens(text)
    if parsed.has_error_nodes and n <= budget:  # one OTHER chunk, whatever the brace units
        chunks, n_units = [Chunk(0, len(text), StructureCategory.OTHER.name, None, n)], 1
    else:
        if parsed.has_error_nodes:
            units = s.brace_pieces(0, len(text), 0, 0)
        else:
            units = s.tile(s.groups(root), 0, len(text)) or [_Piece(0, len(text), ())]
        chunks = [s.chunk(units, n)] if n <= budget else s.pack(units)
        n_units = len(units)
    _check(chunks, text, budget, doc_key)
    return chunks, {"parse_errors": bool(root.has_error), "brace_fallback": parsed.has_error_nodes,
                    "units": n_units, "fallback_splits": s.fallback_splits}


def split_document(
    text: str,
    language: str,
    count_tokens: Callable[[str], int],
    budget: int,
    doc_key: str = "",
    parsed: ParsedSource | None = None,
    count_span: Callable[[int, int], int] | None = None,
) -> list[Chunk]:
    """Chunks of :func:`split_document_with_stats` without the stats (same contract)."""
    return split_document_with_stats(text, language, count_tokens, budget, doc_key, parsed, count_span)[0]


def _check(chunks: list[Chunk], text: str, budget: int, doc_key: str) -> None:
    """Raise :class:`ChunkingError` unless ``chunks`` tile ``text`` within ``budget``."""
    pos = 0
    for c in chunks:
        if c.start != pos or c.end <= c.start or not 0 <= c.n_tokens <= budget:
            raise ChunkingError(f"{doc_key}: invalid chunk {c} at offset {pos} (budget {budget})")
        pos = c.end
    if pos != len(text):
        raise ChunkingError(f"{doc_key}: chunks cover {pos} of {len(text)} characters")
