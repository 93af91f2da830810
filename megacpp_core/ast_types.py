"""The versioned tree-sitter node type -> ``ast_node_type`` bucket map (SPEC §4).

SPEC §4 gives the ``ast_node_type`` enrichment plane 256 buckets "from a versioned
node-type map: declarations 1–9, statements 10–19, expressions 20–29, types 30–39,
literals 40–49, operators 50–59, …". The map is the data file
``megacpp_core/data/ast_node_types/VERSION.json``; this module loads and validates it and
turns it into per-grammar lookup tables. Version ``v1`` declares these ranges (the first
six are the SPEC's, the rest continue them):

====================  =========  ==================================================
range                 ids        contents
====================  =========  ==================================================
unknown               0          padding, the BOS position, deliberately unmapped
declarations          1–9        function definition, declaration, class/struct/union,
                                 enum, namespace, typedef/alias, field, parameter, other
statements            10–19      compound, if, loops, switch/case, return, jump,
                                 expression statement, try/catch/throw, labeled, other
expressions           20–29      call, field access, subscript, assignment, binary,
                                 unary/update, cast/sizeof, conditional, lambda, other
types                 30–39      primitive, type identifier, sized, auto/decltype, ...
literals              40–49      number, char, string, raw string, escape, bool, null, ...
operators             50–59      arithmetic, comparison, logical, bitwise, assignment,
                                 ++/--, member access, scope ``::``, keyword ops, other
preprocessor          60–69      include, define, function-like define, call, #if…, ...
comments              70–71      comment (71 reserved)
identifiers           80–89      identifier, field, namespace, label, qualified, ...
punctuation           90–99      () {} [] ; , : other
templates             100–109    template declaration, parameters, arguments, concepts,
                                 requires
specifiers            110–119    storage class, qualifiers, attributes, virtual/explicit,
                                 access, exception specs, ``= default``/``= 0``, ref
extensions            120–129    GNU asm / ``__extension__``, MS declspec, calling
                                 conventions, pointer modifiers, CUDA (reserved)
declarators           130–139    function, pointer, reference, array, init, ...
initializers          140–149    braced lists, designators, constructor member inits
keywords              150–159    a keyword no other bucket claims (future grammars)
root                  240        ``translation_unit``
errors                250–255    250 ``ERROR`` node, 251 ``MISSING`` node
====================  =========  ==================================================

Resolution of a node kind ``(type name, is_named)``, deterministic and first hit wins:

1. the explicit ``named`` / ``anonymous`` lists of the map's buckets;
2. ``unmapped_ok``: patterns for the hidden grammar symbols (``_rule``, ``*_repeatN``,
   ``*_tokenN``, ``end``, hidden supertypes) that never occur as nodes of a tree, which
   resolve to ``default`` on purpose;
3. the ordered pattern ``rules`` (``prefix`` / ``suffix`` / ``regex`` full match, each
   for named kinds, anonymous tokens or both), e.g. suffix ``_declaration`` ->
   declarations-other, ``_expression`` -> expressions-other;
4. ``default`` (0). Every kind of the installed grammars resolves in steps 1–3 except the
   step-2 symbols (``tests/test_ast_types.py`` proves it), so 4 only catches kinds of a
   future grammar release.

Anonymous tokens are classified by their text alone: ``*`` is always arithmetic and ``&``
always bitwise, even inside a declarator; the parent node carries that context.

Callers map a node in O(1) with a table indexed by ``node.kind_id`` (which is the id of
the visible, possibly aliased, kind: ``type_identifier`` has its own ``kind_id`` while its
``grammar_id`` is ``identifier``)::

    table = bucket_table("cpp")          # uint8[node_kind_count]
    b = bucket_for_node(node, table)     # handles ERROR (kind_id 65535) and MISSING

``ERROR`` nodes have ``kind_id`` 65535, outside every table; :func:`bucket_for_node` maps
them (and any other id ``>= len(table)``) to the error bucket (250 in v1) and zero-width
``MISSING`` nodes (``node.is_missing``) to 251. Code that indexes the table directly must
do the same.

The map's SHA-256 (:func:`map_sha256`) is pinned in :data:`NODE_TYPE_MAP_SHA256`: a
changed ``v1.json`` is refused, since bucket ids may only move with a new map version.
This module does not import Dagster.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import tree_sitter
import tree_sitter_c
import tree_sitter_cpp

#: Version of the packaged map used by default (``data/ast_node_types/v1.json``).
NODE_TYPE_MAP_VERSION = "v1"
#: Pinned SHA-256 of the packaged map files, per version (see :func:`load_map`).
NODE_TYPE_MAP_SHA256 = {"v1": "02b8b1d4180ce5195fc348a8b09978bd69c8875fbc80663c8d4699193630c946"}
#: Number of buckets of the plane (SPEC §4: 256, stored as uint8).
N_BUCKETS = 256
#: Grammars with a lookup table: ``tree_sitter_c`` and ``tree_sitter_cpp``.
GRAMMARS = ("c", "cpp")
#: Buckets of v1 for an unknown kind / padding / BOS, an ``ERROR`` node and a ``MISSING``
#: node (the map declares them as ``default``, ``error_bucket`` and ``missing_bucket``).
UNKNOWN_BUCKET = 0
ERROR_BUCKET = 250
MISSING_BUCKET = 251

_TOP_KEYS = {"version", "description", "checked_against", "default", "error_bucket", "missing_bucket",
             "ranges", "buckets", "unmapped_ok", "rules"}
_REQUIRED_KEYS = _TOP_KEYS - {"description", "checked_against"}
_MATCH_KEYS = ("prefix", "suffix", "regex")


@dataclass(frozen=True)
class _Pattern:
    kind: str  # "prefix" | "suffix" | "regex"
    value: str
    named: bool | None  # None: named kinds and anonymous tokens
    regex: re.Pattern | None = None

    def matches(self, type_name: str, named: bool) -> bool:
        if self.named is not None and self.named != named:
            return False
        if self.kind == "prefix":
            return type_name.startswith(self.value)
        if self.kind == "suffix":
            return type_name.endswith(self.value)
        return self.regex.fullmatch(type_name) is not None


@dataclass(frozen=True)
class NodeTypeMap:
    """A validated node-type map (one ``VERSION.json``); build it with :func:`load_map`.

    ``ranges``: ``(name, lo, hi)`` sorted by ``lo``, non-overlapping, inside 0..255.
    ``names``: bucket id -> bucket name for every declared bucket.
    ``explicit``: ``(type name, is_named)`` -> bucket id.
    """

    version: str
    sha256: str
    default: int
    error_bucket: int
    missing_bucket: int
    ranges: tuple[tuple[str, int, int], ...]
    names: dict[int, str]
    explicit: dict[tuple[str, bool], int]
    unmapped_ok: tuple[_Pattern, ...]
    rules: tuple[tuple[_Pattern, int], ...]
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def resolve(self, type_name: str, named: bool) -> tuple[int, str]:
        """``(bucket, source)``; ``source`` is ``"explicit"``, ``"rule N"`` (index into the
        map's ``rules``), ``"unmapped_ok"`` or ``"default"``."""
        key = (type_name, bool(named))
        hit = self._cache.get(key)
        if hit is None:
            hit = self._resolve(*key)
            self._cache[key] = hit
        return hit

    def _resolve(self, type_name: str, named: bool) -> tuple[int, str]:
        if (type_name, named) in self.explicit:
            return self.explicit[(type_name, named)], "explicit"
        if any(p.matches(type_name, named) for p in self.unmapped_ok):
            return self.default, "unmapped_ok"
        for i, (p, bucket) in enumerate(self.rules):
            if p.matches(type_name, named):
                return bucket, f"rule {i}"
        return self.default, "default"

    def bucket_of(self, type_name: str, named: bool) -> int:
        """Bucket id (0..255) of a node kind; never raises (unknown kinds -> ``default``)."""
        return self.resolve(type_name, named)[0]

    def range_of(self, bucket: int) -> str | None:
        """Name of the range holding ``bucket``, ``None`` outside every range."""
        for name, lo, hi in self.ranges:
            if lo <= bucket <= hi:
                return name
        return None


def _map_path(version: str):
    if not re.fullmatch(r"v[0-9]+", version):
        raise ValueError(f"node-type map version {version!r} is not of the form v<N>")
    return resources.files("megacpp_core") / "data" / "ast_node_types" / f"{version}.json"


def _read(version: str, path: str | Path | None) -> bytes:
    src = _map_path(version) if path is None else Path(path)
    try:
        return src.read_bytes()
    except OSError as e:
        raise ValueError(f"node-type map {version} not readable at {src}: {e}") from None


def map_sha256(version: str = NODE_TYPE_MAP_VERSION, path: str | Path | None = None) -> str:
    """Hex SHA-256 of the raw bytes of the map file (record it next to the plane)."""
    return hashlib.sha256(_read(version, path)).hexdigest()


def _bucket_id(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"node-type map: {where}: bucket id {value!r} is not an integer")
    if not 0 <= value < N_BUCKETS:
        raise ValueError(f"node-type map: {where}: bucket {value} outside 0..{N_BUCKETS - 1}")
    return value


def _pattern(entry: Any, where: str, extra: set[str]) -> _Pattern:
    if not isinstance(entry, dict):
        raise ValueError(f"node-type map: {where}: not an object")
    kinds = [k for k in _MATCH_KEYS if k in entry]
    if len(kinds) != 1:
        raise ValueError(f"node-type map: {where}: needs exactly one of {'/'.join(_MATCH_KEYS)}, got {sorted(entry)}")
    unknown = set(entry) - {kinds[0], "named"} - extra
    if unknown:
        raise ValueError(f"node-type map: {where}: unknown keys {sorted(unknown)}")
    kind, value = kinds[0], entry[kinds[0]]
    if not isinstance(value, str) or not value:
        raise ValueError(f"node-type map: {where}: {kind} must be a non-empty string")
    named = entry.get("named")
    if named is not None and not isinstance(named, bool):
        raise ValueError(f"node-type map: {where}: 'named' must be true, false or null")
    regex = None
    if kind == "regex":
        try:
            regex = re.compile(value)
        except re.error as e:
            raise ValueError(f"node-type map: {where}: bad regex {value!r}: {e}") from None
    return _Pattern(kind, value, named, regex)


def _parse(raw: bytes, version: str, sha: str) -> NodeTypeMap:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"node-type map {version}: not valid UTF-8 JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"node-type map {version}: top level is not an object")
    if missing := _REQUIRED_KEYS - set(data):
        raise ValueError(f"node-type map {version}: missing keys {sorted(missing)}")
    if unknown := set(data) - _TOP_KEYS:
        raise ValueError(f"node-type map {version}: unknown keys {sorted(unknown)}")
    if data["version"] != version:
        raise ValueError(f"node-type map: file says version {data['version']!r}, expected {version!r}")

    ranges: list[tuple[str, int, int]] = []
    for i, r in enumerate(data["ranges"]):
        where = f"ranges[{i}]"
        if not isinstance(r, dict) or set(r) != {"name", "lo", "hi"}:
            raise ValueError(f"node-type map: {where}: needs exactly name, lo, hi")
        lo, hi = _bucket_id(r["lo"], f"{where}.lo"), _bucket_id(r["hi"], f"{where}.hi")
        if not isinstance(r["name"], str) or not r["name"]:
            raise ValueError(f"node-type map: {where}: name must be a non-empty string")
        if lo > hi:
            raise ValueError(f"node-type map: range {r['name']!r}: lo {lo} > hi {hi}")
        ranges.append((r["name"], lo, hi))
    if len({n for n, _, _ in ranges}) != len(ranges):
        raise ValueError("node-type map: duplicate range names")
    ranges.sort(key=lambda r: r[1])
    for (n1, lo1, hi1), (n2, lo2, hi2) in zip(ranges, ranges[1:]):
        if lo2 <= hi1:
            raise ValueError(f"node-type map: ranges {n1!r} [{lo1}..{hi1}] and {n2!r} [{lo2}..{hi2}] overlap")

    def in_range(bucket: Any, where: str) -> int:
        b = _bucket_id(bucket, where)
        if not any(lo <= b <= hi for _, lo, hi in ranges):
            raise ValueError(f"node-type map: {where}: bucket {b} is not inside any declared range")
        return b

    names: dict[int, str] = {}
    explicit: dict[tuple[str, bool], int] = {}
    for i, b in enumerate(data["buckets"]):
        where = f"buckets[{i}]"
        if not isinstance(b, dict) or set(b) != {"id", "name", "named", "anonymous"}:
            raise ValueError(f"node-type map: {where}: needs exactly id, name, named, anonymous")
        bid = in_range(b["id"], where)
        if bid in names:
            raise ValueError(f"node-type map: {where}: bucket {bid} declared twice")
        if not isinstance(b["name"], str) or not b["name"] or b["name"] in names.values():
            raise ValueError(f"node-type map: {where}: bucket name {b['name']!r} empty, not a string or repeated")
        names[bid] = b["name"]
        for flag, kinds in ((True, b["named"]), (False, b["anonymous"])):
            if not isinstance(kinds, list) or not all(isinstance(k, str) and k for k in kinds):
                raise ValueError(f"node-type map: {where}: named/anonymous must be lists of non-empty strings")
            for k in kinds:
                if (k, flag) in explicit:
                    raise ValueError(f"node-type map: {where}: {'named' if flag else 'anonymous'} kind {k!r} "
                                     f"already mapped to bucket {explicit[(k, flag)]}")
                explicit[(k, flag)] = bid

    def declared(bucket: Any, where: str) -> int:
        b = in_range(bucket, where)
        if b not in names:
            raise ValueError(f"node-type map: {where}: bucket {b} is not declared in 'buckets'")
        return b

    unmapped = []
    for i, u in enumerate(data["unmapped_ok"]):
        p = _pattern(u, f"unmapped_ok[{i}]", {"why"})
        if not isinstance(u.get("why"), str) or not u["why"]:
            raise ValueError(f"node-type map: unmapped_ok[{i}]: needs a 'why'")
        unmapped.append(p)
    rules = []
    for i, r in enumerate(data["rules"]):
        p = _pattern(r, f"rules[{i}]", {"bucket"})
        if "bucket" not in r:
            raise ValueError(f"node-type map: rules[{i}]: needs a bucket")
        rules.append((p, declared(r["bucket"], f"rules[{i}] ({p.kind} {p.value!r})")))

    m = NodeTypeMap(
        version=version, sha256=sha,
        default=declared(data["default"], "default"),
        error_bucket=declared(data["error_bucket"], "error_bucket"),
        missing_bucket=declared(data["missing_bucket"], "missing_bucket"),
        ranges=tuple(ranges), names=names, explicit=explicit,
        unmapped_ok=tuple(unmapped), rules=tuple(rules),
    )
    if m.bucket_of("ERROR", True) != m.error_bucket:
        raise ValueError(f"node-type map: named kind 'ERROR' resolves to {m.bucket_of('ERROR', True)}, "
                         f"not error_bucket {m.error_bucket}")
    return m


@functools.lru_cache(maxsize=None)
def _load(version: str, path: str | None) -> NodeTypeMap:
    raw = _read(version, path)
    sha = hashlib.sha256(raw).hexdigest()
    pinned = NODE_TYPE_MAP_SHA256.get(version)
    if path is None and pinned is not None and sha != pinned:
        raise ValueError(f"node-type map {version} changed (sha256 {sha} != pinned {pinned}); "
                         "bucket ids must not move: add a new map version instead")
    return _parse(raw, version, sha)


def load_map(version: str = NODE_TYPE_MAP_VERSION, path: str | Path | None = None) -> NodeTypeMap:
    """The validated map ``version`` (cached per process per ``(version, path)``).

    ``path`` reads another file instead of the packaged ``data/ast_node_types/VERSION.json``
    (its ``version`` field must still equal ``version``; no digest pin applies).

    Raises ``ValueError`` with the offending entry named when: the file is unreadable or not
    JSON; keys are missing or unknown; a bucket id is not an integer in 0..255; ranges
    overlap or have ``lo > hi``; a bucket, rule target, ``default``, ``error_bucket`` or
    ``missing_bucket`` lies outside every declared range or is not a declared bucket; a
    kind is listed twice; a regex does not compile; or the packaged file differs from
    :data:`NODE_TYPE_MAP_SHA256`.
    """
    return _load(version, None if path is None else str(Path(path).resolve()))


def bucket_of(type_name: str, named: bool, version: str = NODE_TYPE_MAP_VERSION) -> int:
    """Bucket id (0..255) of the node kind ``(node.type, node.is_named)`` under ``version``.

    Never raises for a kind name: unknown kinds resolve to the map's ``default`` (0).
    Note that ``("ERROR", True)`` gives the error bucket, but ``MISSING`` nodes carry the
    type of the token they stand for; use :func:`bucket_for_node` for real nodes.
    """
    return load_map(version).bucket_of(type_name, named)


def _language(grammar: str) -> tree_sitter.Language:
    if grammar == "c":
        return tree_sitter.Language(tree_sitter_c.language())
    if grammar == "cpp":
        return tree_sitter.Language(tree_sitter_cpp.language())
    raise ValueError(f"unknown grammar {grammar!r}; expected one of {GRAMMARS}")


def grammar_kinds(grammar: str) -> list[tuple[int, str, bool, bool]]:
    """``(kind_id, name, is_named, is_visible)`` for every id in ``range(node_kind_count)``."""
    lang = _language(grammar)
    return [(i, lang.node_kind_for_id(i) or "", bool(lang.node_kind_is_named(i)), bool(lang.node_kind_is_visible(i)))
            for i in range(lang.node_kind_count)]


def resolve_grammar(grammar: str, version: str = NODE_TYPE_MAP_VERSION) -> list[tuple[int, str, bool, bool, int, str]]:
    """``(kind_id, name, is_named, is_visible, bucket, source)`` for every kind of ``grammar``,
    ``source`` as in :meth:`NodeTypeMap.resolve`: a coverage report for artifacts and tests."""
    m = load_map(version)
    return [(i, n, named, vis, *m.resolve(n, named)) for i, n, named, vis in grammar_kinds(grammar)]


@functools.lru_cache(maxsize=None)
def bucket_table(grammar: str, version: str = NODE_TYPE_MAP_VERSION) -> np.ndarray:
    """Read-only ``uint8`` array of shape ``(node_kind_count,)`` of ``grammar`` ("c" or
    "cpp"): ``table[node.kind_id] == bucket_of(node.type, node.is_named)``. Covers every id
    in ``range(node_kind_count)``, aliased kinds included; ``ERROR`` nodes (``kind_id``
    65535) lie outside it (see :func:`bucket_for_node`). Cached per process; raises
    ``ValueError`` for another grammar name."""
    m = load_map(version)
    table = np.array([m.bucket_of(n, named) for _, n, named, _ in grammar_kinds(grammar)], dtype=np.uint8)
    table.setflags(write=False)
    return table


def bucket_for_node(node: tree_sitter.Node, table: np.ndarray, version: str = NODE_TYPE_MAP_VERSION) -> int:
    """Bucket of a parsed node: the error bucket for ``ERROR`` nodes and any ``kind_id``
    outside ``table``, the missing bucket for zero-width ``MISSING`` nodes, else
    ``table[node.kind_id]``. ``table`` is :func:`bucket_table` of the node's grammar."""
    m = load_map(version)
    kid = node.kind_id
    if node.is_error or kid >= table.shape[0]:
        return m.error_bucket
    if node.is_missing:
        return m.missing_bucket
    return int(table[kid])


def bucket_names(version: str = NODE_TYPE_MAP_VERSION) -> dict[int, str]:
    """Bucket id -> name (``"declaration.function_definition"``, ...) of the declared buckets."""
    return dict(load_map(version).names)
