"""Stage 6 enrichment (SPEC §4 "Enrichment"): structure columns of each document, per character.

One tree-sitter parse of a file (shared with the chunker, :class:`chunk.ParsedSource`) gives:

- **Per-character planes** (numpy uint8, one value per ``str`` character of the file):
  ``structure`` (:class:`~megacpp_core.chunk.StructureCategory` 0..8), ``ast_depth``
  (depth of the innermost node holding the character — named or anonymous, so a leaf such
  as an identifier, keyword, operator or punctuation token where there is one — root 0,
  clamped 63), ``sibling_index`` (its index among all its parent's children, clamped 63) and
  ``ast_node_type`` (its 256-bucket type from the versioned map of
  :mod:`megacpp_core.ast_types`). Stage 8 samples them per token
  (:func:`megacpp_core.tokenize.align_document`).
- **Units**: the file tiled into top-level declarations — the chunker's units (leading
  comments attached), recursing into namespace and ``extern "C"`` bodies, whose opening
  and closing lines become units of their own. Each unit has a kind (StructureCategory
  name), a name, the function and type names it defines, the functions it calls and the
  types it uses (base classes, member types, parameter types).
- **Per document** (:func:`document_enrichment`): the units overlapping the document,
  clipped to it, as its chunk list; ``call_edges`` and ``type_edges`` between them; and a
  ``dep_level`` per chunk.

Structure categories are painted outer node first, inner node over it: comments →
COMMENT; ``#include``/``#define``/``#pragma`` lines and the directive lines of ``#if``
blocks → PREAMBLE; a function definition → FUNC_SIGNATURE up to its body, the body →
FUNC_BODY; a function declaration (prototype) → FUNC_SIGNATURE; a class, struct, union or
enum with a body → CLASS_DECL, its fields, enumerators and member declarations →
CLASS_MEMBER (inline methods paint their own signature and body); ``typedef``/``using`` →
TYPEDEF; a namespace → NAMESPACE for its header and braces, its body's contents start
again from OTHER; everything else → OTHER.

Edges (SPEC §4): a call edge ``i -> j`` when chunk ``i`` calls, by name, a function
defined in chunk ``j`` of the same document (overloads and same-named methods all match:
resolution is by name, the libclang lane resolves exactly); a type edge ``i -> j`` when
chunk ``i`` names, as a base class, a member type or a parameter type, a class, struct,
union, enum or typedef defined in chunk ``j``. Self edges are dropped; edge lists are
sorted and unique.

Output depends only on the text and language (deterministic).
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from . import ast_types, callees, chunk, tree_arrays
from .native import tswalk
from .chunk import ParsedSource, StructureCategory

__all__ = ["ENRICHMENT_VERSION", "MAX_DEPTH", "Unit", "FileEnrichment", "DocumentEnrichment", "enrich_file",
           "file_units", "line_units", "document_enrichment", "dep_levels"]

#: Version of the enrichment rules; recorded with every enriched artifact.
ENRICHMENT_VERSION = "v1"
#: Clamp of ``ast_depth`` and ``sibling_index`` (SPEC §4: "clamped 63"; :mod:`megacpp_core.tree_arrays`).
MAX_DEPTH = tree_arrays.MAX_DEPTH

_S = StructureCategory
_PREAMBLE = {"preproc_include", "preproc_def", "preproc_function_def", "preproc_call"}
_PREPROC_BLOCKS = {"preproc_if", "preproc_ifdef", "preproc_elif", "preproc_else", "preproc_elifdef"}
_CLASSLIKE = {"class_specifier", "struct_specifier", "union_specifier", "enum_specifier"}
_MEMBERS = {"field_declaration", "enumerator", "friend_declaration"}  # only ever inside a class or enum body
_CLASS_ONLY_MEMBERS = {"using_declaration", "static_assert_declaration"}  # members only inside a class body
_TYPEDEFS = {"type_definition", "alias_declaration"}
_CONTAINERS = {"namespace_definition", "linkage_specification"}
#: Nodes whose subtree names types that count as type uses (base classes, members, parameters).
_TYPE_CONTEXTS = {"base_class_clause", "field_declaration", "parameter_declaration",
                  "optional_parameter_declaration", "variadic_parameter_declaration"}

#: Node kinds whose own rule records something (paint, a name, a call, a type use).
_RECORDED = (_PREAMBLE | _PREPROC_BLOCKS | _CLASSLIKE | _MEMBERS | _CLASS_ONLY_MEMBERS | _TYPEDEFS
             | {"comment", "function_definition", "declaration", "template_declaration", "namespace_definition",
                "call_expression", "type_identifier"})
#: Recorded kinds whose rule reads the node's fields or children, so the walk makes a
#: Python ``Node`` for them; the other rules need only the kind and the byte range (a call's
#: callee is found from its index: :func:`megacpp_core.callees.callee_spans`).
_WITH_NODE = (_CLASSLIKE | _TYPEDEFS | {"function_definition", "declaration", "template_declaration",
                                        "namespace_definition"})
#: Roles of node kinds for the two contexts of the rules (:class:`_Walk`).
_TYPE_CONTEXT, _STATEMENTS, _CLASS_BODY = 1, 2, 3
#: ``kind_id`` of tree-sitter's ERROR nodes.
_ERROR_KIND = 65535
#: Per grammar: ``uint8[65536]`` role of every ``kind_id`` (0: none).
_ROLES: dict[str, np.ndarray] = {}
#: Groups of the recorded kinds: a rule of :meth:`_Walk._special`, a type use, a call.
_OWN_RULE, _TYPE_USE, _CALL = 1, 2, 3
#: Per grammar: ``uint8[65536]`` group of every recorded ``kind_id`` (0: not recorded).
_GROUPS: dict[str, np.ndarray] = {}
#: The rule of each kind of :meth:`_Walk._special` as ``native/rules.c`` numbers them.
_RULE_CODES = {"comment": 1, **dict.fromkeys(_PREAMBLE, 2), "preproc_if": 3, "preproc_ifdef": 3, "preproc_elif": 4,
               "preproc_else": 4, "preproc_elifdef": 4, "function_definition": 5, "template_declaration": 6,
               **dict.fromkeys(_CLASSLIKE, 7), "declaration": 8, **dict.fromkeys(_MEMBERS, 9),
               **dict.fromkeys(_CLASS_ONLY_MEMBERS, 10), "alias_declaration": 11, "type_definition": 12,
               "namespace_definition": 13}
assert set(_RULE_CODES) == _RECORDED - {"call_expression", "type_identifier"} and _PREPROC_BLOCKS == {
    k for k, v in _RULE_CODES.items() if v in (3, 4)}
#: The kind tests of the rules as ``rules.c`` flags: class-like, function / parenthesized declarator, function definition.
_KIND_FLAGS = {**dict.fromkeys(_CLASSLIKE, 1), "function_declarator": 2, "parenthesized_declarator": 4,
               "function_definition": 8}
#: The categories ``rules.c`` paints, in its slot order.
_RULE_CATEGORIES = np.array([_S.COMMENT, _S.PREAMBLE, _S.FUNC_SIGNATURE, _S.FUNC_BODY, _S.CLASS_DECL, _S.CLASS_MEMBER,
                             _S.TYPEDEF, _S.NAMESPACE, _S.OTHER], dtype=np.int64)


@functools.lru_cache(maxsize=None)
def _native_tables(grammar: str) -> tuple[bytearray, bytes, bytes, np.ndarray]:
    """What :func:`megacpp_core.native.tswalk.rules` needs for ``grammar``: the walk's
    flag table with no ``Node`` wanted (every recorded kind 1), the rule and kind-flag
    tables (by ``kind_id``, all alias ids) and the field ids of ``body``, ``declarator``,
    ``type`` and ``name``."""
    _, recorded = _kinds(grammar)
    lang = ast_types._language(grammar)
    rule, flags = bytearray(65536), bytearray(65536)
    for i in range(lang.node_kind_count):
        name = lang.node_kind_for_id(i)
        flags[i] = _KIND_FLAGS.get(name, 0)
        if lang.node_kind_is_named(i):
            rule[i] = _RULE_CODES.get(name, 0)
    fields = np.array([lang.field_id_for_name(f) or 0 for f in ("body", "declarator", "type", "name")], dtype=np.int64)
    return bytearray(min(x, 1) for x in recorded), bytes(rule), bytes(flags), fields


@functools.lru_cache(maxsize=None)
def _kinds(grammar: str) -> tuple[dict[int, str], bytearray]:
    """``(kind_id -> type, recorded)`` over the named node kinds (all alias ids): the
    types of :data:`_RECORDED` and a 65,536-entry flag table of them (2 for the kinds of
    :data:`_WITH_NODE`, 1 for the others: :func:`megacpp_core.tree_arrays.walk`); the role
    of every kind goes to :data:`_ROLES`, the group of every recorded kind to :data:`_GROUPS`."""
    lang = ast_types._language(grammar)  # the grammar's kinds, as ast_types reads them
    names, recorded, role, group = {}, bytearray(65536), bytearray(65536), bytearray(65536)
    for i in range(lang.node_kind_count):
        name = lang.node_kind_for_id(i)
        if not lang.node_kind_is_named(i):
            continue
        if name in _RECORDED:
            names[i] = name
            recorded[i] = 2 if name in _WITH_NODE else 1
            group[i] = _TYPE_USE if name == "type_identifier" else _CALL if name == "call_expression" else _OWN_RULE
        if name in _TYPE_CONTEXTS:
            role[i] = _TYPE_CONTEXT
        elif name == "compound_statement":
            role[i] = _STATEMENTS
        elif name == "field_declaration_list":
            role[i] = _CLASS_BODY
    _ROLES[grammar] = np.frombuffer(bytes(role), dtype=np.uint8)
    _GROUPS[grammar] = np.frombuffer(bytes(group), dtype=np.uint8)
    return names, recorded


def _last_name(text: str) -> str:
    """``ns::Foo<int>::bar`` -> ``bar``: the last ``::`` component without template arguments."""
    depth, cut = 0, len(text)
    for i in range(len(text) - 1, -1, -1):  # strip a trailing template argument list
        ch = text[i]
        if ch == ">":
            depth += 1
        elif ch == "<":
            depth -= 1
            if depth == 0:
                cut = i
                break
        elif depth == 0:
            break
    text = text[:cut] if cut < len(text) and text.endswith(">") else text
    return text.rsplit("::", 1)[-1].strip()


def _declarator_name(node) -> str | None:
    """Name declared by a (possibly nested) declarator, last ``::`` component:
    ``*(*f)(int)`` -> ``f``, ``Canvas::total() const`` -> ``total``."""
    text = chunk.declarator_identifier(node)
    return (_last_name(text) or None) if text else None


def _is_function_declarator(node) -> bool:
    """True when a declarator declares a function (not a pointer to one: ``int (*fp)(int)``)."""
    while node is not None:
        if node.type == "function_declarator":
            inner = node.child_by_field_name("declarator")
            return inner is None or inner.type != "parenthesized_declarator"
        node = node.child_by_field_name("declarator")
    return False


@dataclass
class Unit:
    """One top-level declaration of a file: ``[start, end)`` in ``str`` offsets.

    ``kind`` is a StructureCategory name, ``name`` the declared name (or None).
    ``defines`` / ``types`` map defined function / type names to the ``str`` offset of the
    definition; ``calls`` / ``uses`` list ``(offset, name)`` of call sites and type uses.
    """

    start: int
    end: int
    kind: str
    name: str | None
    defines: list[tuple[int, str]] = field(default_factory=list)
    types: list[tuple[int, str]] = field(default_factory=list)
    calls: list[tuple[int, str]] = field(default_factory=list)
    uses: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class FileEnrichment:
    """Result of :func:`enrich_file`: per-character planes (uint8, ``len(text)`` each) and units."""

    structure: np.ndarray
    ast_depth: np.ndarray
    sibling_index: np.ndarray
    ast_node_type: np.ndarray
    units: list[Unit]


@dataclass
class DocumentEnrichment:
    """Structure of one document ``[start, end)`` of a file (offsets relative to the document).

    ``chunks``: list of dicts ``{start, end, kind, name, dep_level}`` in ``str`` offsets,
    in order, non-overlapping; ``call_edges`` / ``type_edges``: sorted unique lists of
    ``{"from": i, "to": j}`` chunk indices; ``planes``: the four per-character planes of
    :class:`FileEnrichment` sliced to the document (bytes, one per character).
    """

    chunks: list[dict]
    call_edges: list[dict]
    type_edges: list[dict]
    planes: dict[str, bytes]


class _Walk:
    """One pre-order cursor walk over the tree: node arrays of every node, named or
    anonymous (``starts``/``ends`` in bytes, ``parents``, ``depths`` and ``sibs`` clamped
    at :data:`MAX_DEPTH`, ``kind_ids``), ``has_error`` (an ERROR node occurs), and what the
    structure, edge and name rules record for their node kinds (``paint``: ``int64[k, 3]``
    rows ``(start byte, end byte, category)`` in pre-order, ``calls``, ``uses``,
    ``fn_defs``, ``type_defs``).

    The walk is :func:`megacpp_core.tree_arrays.walk` (native when the library is built,
    ``native`` forces one or the other; the same arrays either way). The structure rules
    (:meth:`_special`) run in C on the native walk (``native/rules.c``: the same records,
    tests/test_native_walk.py), else in Python with ``Node`` objects for the recorded
    kinds whose rule reads fields. The two contexts of the
    rules come from the arrays (numpy): whether a ``type_identifier`` lies in a
    base-class, member or parameter declaration (the nearest such declaration or
    ``compound_statement`` above it decides) and whether a node sits directly in a class
    body. Raises ``RuntimeError`` when ``native`` is True and the library is not available."""

    def __init__(self, parsed: ParsedSource, native: bool | None = None):
        names, recorded = _kinds(parsed.grammar)
        native = tswalk.available() if native is None else native
        tables = _native_tables(parsed.grammar) if native else None
        arrays, nodes = tree_arrays.walk(parsed.tree, tables[0] if native else recorded, native)
        self.starts, self.ends, self.parents, self.kind_ids = arrays.starts, arrays.ends, arrays.parents, arrays.kind_ids
        self.depths, self.sibs, ids = arrays.depths, arrays.sibs, arrays.picked
        starts, ends = self.starts[ids].tolist(), self.ends[ids].tolist()
        up = self.parents[ids]
        in_class = (up >= 0) & (_ROLES[parsed.grammar][self.kind_ids[np.maximum(up, 0)]] == _CLASS_BODY)
        self.has_error = bool((self.kind_ids == _ERROR_KIND).any())
        self.calls: list[tuple[int, str]] = []
        self.uses: list[tuple[int, str]] = []
        self.fn_defs: list[tuple[int, str]] = []
        self.type_defs: list[tuple[int, str]] = []
        src = parsed.src
        group = _GROUPS[parsed.grammar][self.kind_ids[ids]]  # type identifiers and calls: whole arrays
        own = np.flatnonzero(group == _OWN_RULE)
        if native:  # the same rules in C (native/rules.c); names decoded here
            rows, found = tswalk.rules(parsed.tree, src, ids[own], in_class[own], tables[1], tables[2], tables[3],
                                       _RULE_CATEGORIES)
            lists = (self.fn_defs, self.type_defs)
            for k, which, keep, a, b in found.tolist():
                name = _last_name(src[a:b].decode("utf-8", "replace"))
                if keep or name:
                    lists[which].append((starts[int(own[k])], name))
            self.paint = rows[:, 1:]
        else:
            self.paint = []  # _special appends (start_byte, end_byte, category) in pre-order
            kinds, in_class = self.kind_ids[ids].tolist(), in_class.tolist()
            for j in own.tolist():
                self._special(nodes[j], names[kinds[j]], starts[j], ends[j], src, in_class[j])
            self.paint = np.asarray(self.paint, dtype=np.int64).reshape(-1, 3)
        calls = np.flatnonzero(group == _CALL)
        if calls.size:
            cs, ce = callees.callee_spans(parsed.tree, parsed.grammar, ids[calls], native)
            self.calls = [(starts[j], src[a:b].decode("utf-8", "replace"))
                          for j, a, b in zip(calls.tolist(), cs.tolist(), ce.tolist()) if b > a]
        types = np.flatnonzero(group == _TYPE_USE)
        if types.size:
            inside = tree_arrays.nearest_role_is(ids[types], self.parents, _ROLES[parsed.grammar][self.kind_ids],
                                                 _TYPE_CONTEXT, _STATEMENTS)
            self.uses = [(starts[j], src[starts[j]:ends[j]].decode("utf-8", "replace"))
                         for j, ok in zip(types.tolist(), inside.tolist()) if ok]

    def _special(self, node, t: str, sb: int, eb: int, src: bytes, in_class: bool) -> None:
        """Record what ``node`` of type ``t`` contributes (``in_class``: its parent is a class body)."""
        paint = self.paint
        if t == "comment":
            paint.append((sb, eb, _S.COMMENT))
        elif t in _PREAMBLE:
            paint.append((sb, eb, _S.PREAMBLE))
        elif t in _PREPROC_BLOCKS:
            nl = src.find(b"\n", sb, eb)
            paint.append((sb, eb if nl < 0 else nl, _S.PREAMBLE))
            if t != "preproc_elif" and t != "preproc_else" and t != "preproc_elifdef":
                last = src.rfind(b"\n", sb, eb - 1) + 1
                if src.startswith(b"#endif", last) or src[last:eb].lstrip().startswith(b"#endif"):
                    paint.append((last, eb, _S.PREAMBLE))
        elif t == "function_definition":
            body = node.child_by_field_name("body")
            paint.append((sb, eb, _S.FUNC_SIGNATURE))
            if body is not None:
                paint.append((body.start_byte, body.end_byte, _S.FUNC_BODY))
            name = _declarator_name(node.child_by_field_name("declarator"))
            if name:
                self.fn_defs.append((sb, name))
        elif t == "template_declaration":
            inner = [ch for ch in node.named_children if ch.type == "function_definition"]
            if inner:
                paint.append((sb, inner[-1].start_byte, _S.FUNC_SIGNATURE))
        elif t in _CLASSLIKE:
            if node.child_by_field_name("body") is not None:
                paint.append((sb, eb, _S.CLASS_DECL))
                name = node.child_by_field_name("name")
                if name is not None:
                    self.type_defs.append((sb, _last_name(name.text.decode("utf-8", "replace"))))
        elif t == "declaration":
            typ = node.child_by_field_name("type")
            if typ is not None and typ.type in _CLASSLIKE and typ.child_by_field_name("body") is not None:
                paint.append((sb, eb, _S.CLASS_DECL))
            elif _is_function_declarator(node.child_by_field_name("declarator")):
                paint.append((sb, eb, _S.CLASS_MEMBER if in_class else _S.FUNC_SIGNATURE))
            elif in_class:
                paint.append((sb, eb, _S.CLASS_MEMBER))
        elif t in _MEMBERS or (t in _CLASS_ONLY_MEMBERS and in_class):
            paint.append((sb, eb, _S.CLASS_MEMBER))
        elif t in _TYPEDEFS:
            paint.append((sb, eb, _S.TYPEDEF))
            if t == "alias_declaration":
                name = node.child_by_field_name("name")
                if name is not None:
                    self.type_defs.append((sb, _last_name(name.text.decode("utf-8", "replace"))))
            else:
                for d in node.children_by_field_name("declarator"):
                    name = _declarator_name(d)
                    if name:
                        self.type_defs.append((sb, name))
        elif t == "namespace_definition":
            paint.append((sb, eb, _S.NAMESPACE))
            body = node.child_by_field_name("body")
            if body is not None and body.end_byte - body.start_byte >= 2:
                paint.append((body.start_byte + 1, body.end_byte - 1, _S.OTHER))


def _ast_planes(parsed: ParsedSource, w: _Walk, char_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-character (depth, sibling index, node-type bucket) of the innermost node.

    The innermost node of each character's first byte (:func:`megacpp_core.tree_arrays.innermost_planes`:
    each plane a per-node uint8 table looked up once per character). Characters outside
    every node get 0 in all three planes.
    """
    n = len(char_bytes)
    if not len(w.starts) or not n:
        z = np.zeros(n, dtype=np.uint8)
        return z, z.copy(), z.copy()
    table = ast_types.bucket_table(parsed.grammar)
    kid = w.kind_ids
    known = kid < len(table)
    per_node = [w.depths, w.sibs,  # the walk clamps both at MAX_DEPTH already
                np.where(known, table[np.where(known, kid, 0)], ast_types.ERROR_BUCKET)]
    depth, sib, typ = tree_arrays.innermost_planes(w.starts, w.ends, w.parents, char_bytes, per_node)
    return depth, sib, typ


def _units(parsed: ParsedSource) -> list[tuple[int, int, str, str | None]]:
    """Top-level units ``(start, end, kind, name)`` tiling the file, namespaces opened."""
    s = chunk._Splitter(parsed, len, 1 << 62, "")
    text = parsed.text
    out: list[tuple[int, int, str, str | None]] = []

    def walk(groups: list[tuple], lo: int, hi: int) -> None:
        for p in s.tile(groups, lo, hi):
            main = p.nodes[chunk._main(p.nodes)] if p.nodes else None
            body = main.child_by_field_name("body") if main is not None and main.type in _CONTAINERS else None
            if body is not None and (body.type != "declaration_list" or body.start_byte >= body.end_byte):
                body = None
            inner = s.groups(body) if body is not None else []
            if body is None or not inner:
                kind, name = s.kind(p.nodes)
                if name and kind == _S.TYPEDEF:
                    name = _last_name(name)
                if kind == _S.OTHER and main is not None and main.type == "declaration" \
                        and _is_function_declarator(main.child_by_field_name("declarator")):
                    kind, name = _S.FUNC_SIGNATURE, _declarator_name(main.child_by_field_name("declarator"))
                out.append((p.start, p.end, kind.name, name))
                continue
            kind, name = s.kind((main,)) if main.type == "namespace_definition" else (_S.OTHER, None)
            ob, cb = s.span(body)  # ob: the opening brace
            first, last = s.span(inner[0][0])[0], s.span(inner[-1][-1])[1]
            in_lo = min(max(s.cut(ob + 1, first), p.start), first)
            close = cb - 1 if text[cb - 1:cb] == "}" else cb
            in_hi = s.cut(last, close) if last <= close else last
            in_hi = max(in_lo, min(in_hi, p.end))
            if p.start < in_lo:
                out.append((p.start, in_lo, kind.name, name))
            walk(inner, in_lo, in_hi)
            if in_hi < p.end:
                out.append((in_hi, p.end, kind.name, name))

    root = parsed.tree.root_node
    walk(s.groups(root), 0, len(text))
    if not out and text:
        out.append((0, len(text), _S.OTHER.name, None))
    return out


def file_units(text: str, language: str, parsed: ParsedSource | None = None) -> list[tuple[int, int, str, str | None]]:
    """The units ``(start, end, kind, name)`` of a file (``str`` offsets, tiling the text),
    exactly as :func:`enrich_file` numbers them: unit ``i`` here is ``FileEnrichment.units[i]``."""
    return _units(parsed or chunk.parse_source(text, language))


def line_units(text: str, units: list[tuple[int, int, str, str | None]], lines: np.ndarray) -> np.ndarray:
    """Unit index (int32) holding each 1-based line number of ``lines``; -1 outside the text.

    A line maps to the unit holding its first non-whitespace character (its first character
    when blank), so a line shared by two units goes to the one it starts in. Used to place
    libclang's (file, line) locations on the file's units.
    """
    lines = np.asarray(lines, dtype=np.int64)
    starts = np.concatenate([[0], np.flatnonzero(np.frombuffer(text.encode("utf-32-le", "surrogatepass"),
                                                                dtype=np.uint32) == 10) + 1])
    out = np.full(len(lines), -1, dtype=np.int32)
    if not units or not len(lines):
        return out
    ok = (lines >= 1) & (lines <= len(starts)) & (starts[np.clip(lines - 1, 0, len(starts) - 1)] < max(1, len(text)))
    ustarts = np.asarray([u[0] for u in units], dtype=np.int64)
    for k in np.flatnonzero(ok):
        pos = int(starts[lines[k] - 1])
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        stripped = len(text[pos:end]) - len(text[pos:end].lstrip())
        if pos + stripped < end:
            pos += stripped
        out[k] = int(np.searchsorted(ustarts, min(pos, len(text) - 1), side="right") - 1)
    return out


def enrich_file(text: str, language: str, parsed: ParsedSource | None = None) -> FileEnrichment:
    """Per-character planes and units of one file (see the module docstring).

    ``language`` is a stage-1 label (:data:`megacpp_core.chunk.LANGUAGES`); ``parsed`` the
    file's :class:`ParsedSource` when the chunker already has it. Planes are numpy uint8
    arrays of ``len(text)`` (``str`` characters). Raises ``ValueError`` for an unknown
    language or a ``parsed`` of another text.
    """
    parsed = parsed or chunk.parse_source(text, language)
    if parsed.text is not text and parsed.text != text:
        raise ValueError("the parsed source is not this text")
    w = _Walk(parsed)
    parsed.has_error_nodes = w.has_error  # the splitter needs no query of its own
    nb = len(parsed.src)
    if parsed.b2c is None:
        char_bytes = np.arange(len(text), dtype=np.int64)
    else:
        char_bytes = np.flatnonzero((np.frombuffer(parsed.src, np.uint8) & 0xC0) != 0x80).astype(np.int64)
    byte_plane = np.zeros(nb, dtype=np.uint8)
    if tswalk.available():
        tswalk.paint(byte_plane, w.paint)
    else:
        for sb, eb, v in w.paint.tolist():
            byte_plane[sb:eb] = v
    structure = byte_plane if parsed.b2c is None else byte_plane[char_bytes]  # ASCII: bytes are characters
    depth, sib, typ = _ast_planes(parsed, w, char_bytes)

    units = [Unit(a, b, k, n) for a, b, k, n in _units(parsed)]
    if units:
        ustarts = np.asarray([u.start for u in units], dtype=np.int64)

        def assign(items: list[tuple[int, str]], attr: str) -> None:
            if not items:
                return
            pos = parsed.chars(np.asarray([b for b, _ in items], dtype=np.int64))
            which = np.maximum(np.searchsorted(ustarts, pos, side="right") - 1, 0)
            lists = [getattr(u, attr) for u in units]
            for (_, name), p, u in zip(items, pos.tolist(), which.tolist()):
                lists[u].append((p, name))

        assign(w.fn_defs, "defines")
        assign(w.type_defs, "types")
        assign(w.calls, "calls")
        assign(w.uses, "uses")
    return FileEnrichment(structure, depth, sib, typ, units)


def dep_levels(n: int, edges: list[tuple[int, int]]) -> list[int]:
    """BFS depth of each of ``n`` chunks in a document's dependency graph.

    ``edges`` are ``(user, dependency)`` pairs (call and type edges, ``from -> to``).
    Rule: the roots are the chunks nothing in the document depends on (in-degree 0); they
    get level 0 and a breadth-first search from all of them at once gives every reachable
    chunk its shortest distance from a root. Chunks reachable only through a cycle (mutual
    recursion with no outside user) are left over: the first of them in document order
    becomes a new root at level 0 and the search continues, until every chunk has a level.
    So a function used by nothing else is 0, what it calls is 1, and so on; in a cycle
    entered from outside, each member gets its distance from that entry. Deterministic.
    """
    out_adj: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for a, b in sorted(set(edges)):
        if a != b:
            out_adj[a].append(b)
            indeg[b] += 1
    level = [-1] * n
    queue: deque[int] = deque()
    for i in range(n):
        if indeg[i] == 0:
            level[i] = 0
            queue.append(i)

    def bfs() -> None:
        while queue:
            u = queue.popleft()
            for v in out_adj[u]:
                if level[v] < 0:
                    level[v] = level[u] + 1
                    queue.append(v)

    bfs()
    for i in range(n):
        if level[i] < 0:
            level[i] = 0
            queue.append(i)
            bfs()
    return level


def document_enrichment(fe: FileEnrichment, start: int, end: int,
                        unit_edges: dict[str, set[tuple[int, int]]] | None = None) -> DocumentEnrichment:
    """The structure of the document ``text[start:end]`` of a file enriched as ``fe``.

    Chunks are the units overlapping ``[start, end)`` clipped to it, with offsets relative
    to ``start``; definitions, calls and type uses count only where they lie inside the
    document (item by item only in the units it cuts: the units tile the file and hold
    their items). ``unit_edges`` (``{"call": {(i, j)}, "type": {(i, j)}}`` between file
    units, e.g. the libclang lane's resolved edges) replaces the tree-sitter edges: an edge
    is kept when both units overlap the document, and ``dep_level`` follows the edges
    used. Raises ``ValueError`` for an empty or out-of-range span.
    """
    n = len(fe.structure)
    if not 0 <= start < end <= n:
        raise ValueError(f"document span [{start}, {end}) outside the file's {n} characters")
    chunks: list[dict] = []
    picked: list[Unit] = []
    index_of: dict[int, int] = {}
    for k, u in enumerate(fe.units):
        if u.end <= start or u.start >= end:
            continue
        index_of[k] = len(chunks)
        chunks.append({"start": max(u.start, start) - start, "end": min(u.end, end) - start,
                       "kind": u.kind, "name": u.name, "dep_level": 0})
        picked.append(u)
    if unit_edges is not None:
        sets = {kind: {(index_of[a], index_of[b]) for a, b in unit_edges.get(kind, ())
                       if a in index_of and b in index_of and a != b} for kind in ("call", "type")}
        return _finish(fe, start, end, chunks, sets["call"], sets["type"])
    # items lie in their unit, but the file's last may hold a zero-width one at the very end
    names = [(u.defines, u.types, u.calls, u.uses) if start <= u.start and u.end <= end and u.end < n else
             tuple([x for x in items if start <= x[0] < end] for items in (u.defines, u.types, u.calls, u.uses))
             for u in picked]
    fn_at: dict[str, list[int]] = {}
    ty_at: dict[str, list[int]] = {}
    for i, (defines, typedefs, _, _) in enumerate(names):
        for _, name in defines:
            fn_at.setdefault(name, []).append(i)
        for _, name in typedefs:
            ty_at.setdefault(name, []).append(i)
    calls: set[tuple[int, int]] = set()
    types: set[tuple[int, int]] = set()
    for (at, out, k) in ((fn_at, calls, 2), (ty_at, types, 3)):
        if not at:
            continue
        for i, items in enumerate(names):
            for _, name in items[k]:
                js = at.get(name)
                if js is not None:
                    out.update((i, j) for j in js if j != i)
    return _finish(fe, start, end, chunks, calls, types)


def _finish(fe: FileEnrichment, start: int, end: int, chunks: list[dict], calls: set, types: set) -> DocumentEnrichment:
    levels = dep_levels(len(chunks), list(calls | types))
    for c, lv in zip(chunks, levels):
        c["dep_level"] = lv
    planes = {name: getattr(fe, name)[start:end].tobytes()
              for name in ("structure", "ast_depth", "sibling_index", "ast_node_type")}
    return DocumentEnrichment(chunks, [{"from": a, "to": b} for a, b in sorted(calls)],
                              [{"from": a, "to": b} for a, b in sorted(types)], planes)
