"""The native tree walk: every node of a parsed tree into flat numpy arrays, in C.

py-tree-sitter exposes a tree node by node, and a Python cursor loop costs about 1 µs per
node (a 10 MB snapshot has 2.3 M nodes). ``_tswalk.so`` (built by
:mod:`megacpp_core.native.build` from ``tswalk.c`` and the tree-sitter core of the very
py-tree-sitter release installed) walks the ``TSTree`` of a :class:`tree_sitter.Tree`
through its subtrees, as the core's own cursor does (``tswalk.c`` says how), and fills the
arrays in one call, about 0.07 µs per node.

The ``TSTree`` pointer is read from the ``tree_sitter.Tree`` object right after its
``PyObject_HEAD`` (``tree_sitter/binding/types.h``). The library is used only when all of
these hold, else :func:`available` is False and callers keep their Python walk (same
output): the library exists, it was compiled from the installed py-tree-sitter release
(it reports the version), from the C sources beside this module (it reports their digest:
a library older than ``tswalk.c``, ``rules.c`` or ``brace.c`` is not used),
``tree_sitter.Tree`` has exactly that layout's size, the library exports every function of
:data:`_FUNCTIONS`, and ``MEGACPP_NATIVE_WALK`` is not ``0``.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tree_sitter

__all__ = ["NodeArrays", "available", "walk", "owners", "owner_planes", "nearest_role", "callees", "rules", "paint", "brace_cuts",
           "LIBRARY"]

#: The compiled library (``python -m megacpp_core.native.build``).
LIBRARY = Path(__file__).resolve().with_name("_tswalk.so")
#: Offset of the ``TSTree *`` in a ``tree_sitter.Tree``: the size of ``PyObject_HEAD``.
_TREE_OFFSET = object.__basicsize__
#: ``sizeof(Tree)`` of the binding: ``PyObject_HEAD`` and three pointers (tree, source, language).
_TREE_SIZE = _TREE_OFFSET + 3 * ctypes.sizeof(ctypes.c_void_p)

#: The functions the library must export (one built from an older ``tswalk.c`` lacks some).
_FUNCTIONS = ("megacpp_ts_count", "megacpp_ts_walk", "megacpp_ts_owners", "megacpp_ts_owner_planes",
              "megacpp_ts_nearest_role", "megacpp_ts_callees", "megacpp_ts_rules", "megacpp_paint", "megacpp_brace_cuts")

_lib: ctypes.CDLL | None = None
_checked = False


@dataclass
class NodeArrays:
    """Every node of a tree in pre-order (the indices of ``TreeCursor.goto_descendant``),
    each array ``int64[n]``: ``starts``/``ends`` in bytes, ``parents`` (-1 for the root),
    ``kind_ids`` (``Node.kind_id``), ``depths`` (number of ancestors) and ``sibs`` (index
    among the parent's children, the root 0), both clamped; ``picked``: ``int64[m]``, the
    indices of the nodes whose kind was flagged, in pre-order."""

    starts: np.ndarray
    ends: np.ndarray
    parents: np.ndarray
    kind_ids: np.ndarray
    depths: np.ndarray
    sibs: np.ndarray
    picked: np.ndarray


def _stale(lib: ctypes.CDLL) -> str | None:
    """Why ``lib`` was not built from the C sources beside it (``megacpp_ts_sources``
    against :func:`megacpp_core.native.build.sources_digest`), or None. Sources that are
    not there (an install without them) are not compared."""
    from .build import sources_digest

    try:
        want = sources_digest()
    except OSError:
        return None
    if not hasattr(lib, "megacpp_ts_sources"):
        return "was built from older C sources (it reports no digest of them)"
    lib.megacpp_ts_sources.restype = ctypes.c_char_p
    lib.megacpp_ts_sources.argtypes = []
    got = lib.megacpp_ts_sources().decode()
    return None if got == want else f"was built from other C sources (digest {got[:12]}, the sources' {want[:12]})"


def _load() -> ctypes.CDLL | None:
    """The library when every condition of the module docstring holds, else None (a
    warning says why when the library exists but cannot be used)."""
    global _lib, _checked
    if _checked:
        return _lib
    _checked = True
    if os.environ.get("MEGACPP_NATIVE_WALK", "1") == "0" or not LIBRARY.is_file():
        return None
    try:
        lib = ctypes.CDLL(str(LIBRARY))
        lib.megacpp_ts_version.restype = ctypes.c_char_p
        lib.megacpp_ts_version.argtypes = []
        built, installed = lib.megacpp_ts_version().decode(), importlib.metadata.version("tree-sitter")
    except (OSError, AttributeError, UnicodeDecodeError, importlib.metadata.PackageNotFoundError) as e:
        warnings.warn(f"{LIBRARY} cannot be used ({type(e).__name__}: {e}); using the Python walk. "
                      "Rebuild it: python -m megacpp_core.native.build", RuntimeWarning, stacklevel=3)
        return None
    if built != installed or tree_sitter.Tree.__basicsize__ != _TREE_SIZE:
        warnings.warn(f"{LIBRARY.name} was built for py-tree-sitter {built}, {installed} is installed "
                      f"(Tree size {tree_sitter.Tree.__basicsize__}, expected {_TREE_SIZE}); using the Python walk. "
                      "Rebuild it: python -m megacpp_core.native.build", RuntimeWarning, stacklevel=3)
        return None
    stale = _stale(lib)
    if stale:
        warnings.warn(f"{LIBRARY.name} {stale}; using the Python walk. Rebuild it: python -m megacpp_core.native.build",
                      RuntimeWarning, stacklevel=3)
        return None
    missing = [f for f in _FUNCTIONS if not hasattr(lib, f)]
    if missing:
        warnings.warn(f"{LIBRARY.name} lacks {', '.join(missing)} (built from an older tswalk.c); using the Python "
                      "walk. Rebuild it: python -m megacpp_core.native.build", RuntimeWarning, stacklevel=3)
        return None
    p = ctypes.c_void_p
    lib.megacpp_ts_count.restype = ctypes.c_uint32
    lib.megacpp_ts_count.argtypes = [p]
    lib.megacpp_ts_walk.restype = ctypes.c_int64
    lib.megacpp_ts_walk.argtypes = [p, ctypes.c_int64, p, ctypes.c_int64, p, p, p, p, p, p, p, p]
    lib.megacpp_ts_owners.restype = ctypes.c_int64
    lib.megacpp_ts_owners.argtypes = [ctypes.c_int64, p, p, p, ctypes.c_int64, p, p]
    lib.megacpp_ts_owner_planes.restype = ctypes.c_int64
    lib.megacpp_ts_owner_planes.argtypes = [ctypes.c_int64, p, p, p, ctypes.c_int64, p, ctypes.c_int64, p, p]
    lib.megacpp_ts_nearest_role.restype = ctypes.c_int64
    lib.megacpp_ts_nearest_role.argtypes = [ctypes.c_int64, p, p, ctypes.c_int64, p, ctypes.c_int64, ctypes.c_int64, p]
    lib.megacpp_ts_callees.restype = ctypes.c_int64
    lib.megacpp_ts_callees.argtypes = [p, ctypes.c_int64, p, p, *[ctypes.c_int64] * 3, p, p]
    lib.megacpp_ts_rules.restype = ctypes.c_int64
    lib.megacpp_ts_rules.argtypes = [p, p, ctypes.c_int64, ctypes.c_int64, p, p, p, p, p, p, ctypes.c_int64, p, p,
                                     ctypes.c_int64, p, p]
    lib.megacpp_paint.restype = None
    lib.megacpp_paint.argtypes = [p, ctypes.c_int64, ctypes.c_int64, p, p, p]
    lib.megacpp_brace_cuts.restype = ctypes.c_int64
    lib.megacpp_brace_cuts.argtypes = [p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, p, ctypes.c_int64]
    _lib = lib
    return lib


def available() -> bool:
    """True when :func:`walk` can run (see the module docstring)."""
    return _load() is not None


def _require() -> ctypes.CDLL:
    """The library; ``RuntimeError`` when it is not :func:`available`."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"the native tree walk is not available ({LIBRARY}); build it: "
                           "python -m megacpp_core.native.build")
    return lib


def _tree_pointer(tree: tree_sitter.Tree) -> int:
    """The ``TSTree *`` of ``tree`` (see the module docstring); ``TypeError`` for an object
    that is not a ``tree_sitter.Tree``."""
    if type(tree) is not tree_sitter.Tree:
        raise TypeError(f"expected a tree_sitter.Tree, got {type(tree).__name__}")
    return ctypes.c_void_p.from_address(id(tree) + _TREE_OFFSET).value


def walk(tree: tree_sitter.Tree, flagged: bytearray, clamp: int) -> NodeArrays:
    """:class:`NodeArrays` of ``tree``; ``flagged``: 65,536 bytes, non-zero for the
    ``kind_id`` values whose nodes go to ``picked``; ``clamp``: the cap of depths and
    sibling indices. The GIL is released during the walk.

    Raises ``RuntimeError`` when the library is not :func:`available`, ``TypeError`` for
    an object that is not a ``tree_sitter.Tree``, ``ValueError`` for a flag table of
    another size, ``MemoryError`` when the walk's own stack cannot grow."""
    lib = _require()
    ptr = _tree_pointer(tree)
    if len(flagged) != 65536:
        raise ValueError(f"the kind flag table has {len(flagged)} entries, not 65,536")
    n = int(lib.megacpp_ts_count(ptr))
    out = np.empty((7, n), dtype=np.int64)
    npicked = ctypes.c_int64(0)
    flags = (ctypes.c_uint8 * 65536).from_buffer(flagged)
    got = lib.megacpp_ts_walk(ptr, n, flags, clamp, *(out[i].ctypes.data for i in range(7)), ctypes.byref(npicked))
    if got == -2:
        raise MemoryError(f"native tree walk: no memory for the stack of a tree of {n} nodes")
    if got != n:  # the count comes from the same tree: a mismatch means a broken library
        raise RuntimeError(f"native tree walk visited {got} nodes, the tree has {n}")
    return NodeArrays(out[0], out[1], out[2], out[3], out[4], out[5], out[6, :npicked.value].copy())


def owners(starts: np.ndarray, ends: np.ndarray, parents: np.ndarray, positions: np.ndarray) -> np.ndarray | None:
    """``int64[m]``: for each byte offset of ``positions`` (``int64[m]``, non-decreasing),
    the index of the innermost node holding it (the last node starting at or before it,
    else that node's nearest ancestor ending after it), -1 where none does, over nodes in
    pre-order given as ``int64[n]`` arrays (as :class:`NodeArrays`); the same as the
    vectorized search of :func:`megacpp_core.tree_arrays.innermost`, in one linear pass.
    None when the node starts or the positions are not non-decreasing, or a node's parent
    is not an earlier node (-1 for none). Raises ``RuntimeError`` when the library is not
    :func:`available`, ``ValueError`` when the three node arrays differ in length."""
    lib = _require()
    arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in (starts, ends, parents, positions)]
    if not len(arrays[0]) == len(arrays[1]) == len(arrays[2]):
        raise ValueError(f"node arrays of {len(arrays[0])}, {len(arrays[1])} and {len(arrays[2])} entries")
    out = np.empty(len(arrays[3]), dtype=np.int64)
    ok = lib.megacpp_ts_owners(len(arrays[0]), arrays[0].ctypes.data, arrays[1].ctypes.data, arrays[2].ctypes.data,
                               len(arrays[3]), arrays[3].ctypes.data, out.ctypes.data)
    return out if ok == 0 else None


def owner_planes(starts: np.ndarray, ends: np.ndarray, parents: np.ndarray, positions: np.ndarray,
                 tables: np.ndarray) -> np.ndarray | None:
    """``tables[:, owners(...)]`` without the owner indices: for each position of
    :func:`owners`' search, the entry of its innermost node in every row of ``tables``
    (``uint8[t, n + 1]``, the last column for a position no node holds), as
    ``uint8[t, m]``. None when :func:`owners` gives None. Raises ``RuntimeError`` when the
    library is not :func:`available`, ``ValueError`` for arrays of other lengths."""
    lib = _require()
    arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in (starts, ends, parents, positions)]
    tab = np.ascontiguousarray(tables, dtype=np.uint8)
    n = len(arrays[0])
    if not n == len(arrays[1]) == len(arrays[2]) or tab.ndim != 2 or tab.shape[1] != n + 1:
        raise ValueError(f"node arrays of {n}, {len(arrays[1])} and {len(arrays[2])} entries, tables {tab.shape}")
    out = np.empty((tab.shape[0], len(arrays[3])), dtype=np.uint8)
    ok = lib.megacpp_ts_owner_planes(n, arrays[0].ctypes.data, arrays[1].ctypes.data, arrays[2].ctypes.data,
                                     len(arrays[3]), arrays[3].ctypes.data, tab.shape[0], tab.ctypes.data,
                                     out.ctypes.data)
    return out if ok == 0 else None


def nearest_role(nodes: np.ndarray, parents: np.ndarray, roles: np.ndarray, yes: int, stop: int) -> np.ndarray | None:
    """:func:`megacpp_core.tree_arrays.nearest_role_is` in C: ``bool[m]`` for the node
    indices ``nodes`` (``int64[m]``) over the parent array ``parents`` (``int64[n]``, -1
    for the root) and the per-node ``roles`` (``uint8[n]``). None when an index is outside
    the arrays or a parent does not precede its child. Raises ``RuntimeError`` when the
    library is not :func:`available`, ``ValueError`` when ``roles`` and ``parents`` differ
    in length."""
    lib = _require()
    par = np.ascontiguousarray(parents, dtype=np.int64)
    rol = np.ascontiguousarray(roles, dtype=np.uint8)
    idx = np.ascontiguousarray(nodes, dtype=np.int64)
    if len(par) != len(rol):
        raise ValueError(f"{len(par)} parents and {len(rol)} roles")
    out = np.empty(len(idx), dtype=np.uint8)
    ok = lib.megacpp_ts_nearest_role(len(par), par.ctypes.data, rol.ctypes.data, len(idx), idx.ctypes.data, int(yes),
                                     int(stop), out.ctypes.data)
    return out.astype(bool) if ok == 0 else None


def callees(tree: tree_sitter.Tree, calls: np.ndarray, step: bytearray, fields: tuple[int, int, int]
            ) -> tuple[np.ndarray, np.ndarray]:
    """The byte span of the callee name of each call node ``calls`` (``int64[m]``, pre-order
    indices of :func:`walk` over ``tree``): ``(starts, ends)``, ``int64[m]`` each, -1 where a
    call has none. From the node's ``function`` field, each node met is looked up in
    ``step`` (65,536 bytes by ``kind_id``): 1, it is the name; 2, go to its ``field`` child;
    3, to its ``name`` child; 4, to its first named child; 0, no name. ``fields``: the
    grammar's field ids of ``function``, ``field`` and ``name`` (0 for a field the grammar
    lacks). The rule of :func:`megacpp_core.callees.callee_node`, in C.

    Raises ``RuntimeError`` when the library is not :func:`available`, ``TypeError`` for an
    object that is not a ``tree_sitter.Tree``, ``ValueError`` for a step table of another
    size or an index outside the tree."""
    lib = _require()
    ptr = _tree_pointer(tree)
    if len(step) != 65536:
        raise ValueError(f"the step table has {len(step)} entries, not 65,536")
    idx = np.ascontiguousarray(calls, dtype=np.int64)
    out = np.empty((2, len(idx)), dtype=np.int64)
    table = (ctypes.c_uint8 * 65536).from_buffer(step)
    if lib.megacpp_ts_callees(ptr, len(idx), idx.ctypes.data, table, *fields, out[0].ctypes.data, out[1].ctypes.data):
        raise ValueError(f"a call index outside the tree's {int(lib.megacpp_ts_count(ptr))} nodes")
    return out[0], out[1]


def rules(tree: tree_sitter.Tree, src: bytes, nodes: np.ndarray, in_class: np.ndarray, rule: bytes, flags: bytes,
          fields: np.ndarray, categories: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The structure rules of :class:`megacpp_core.enrich._Walk` for the nodes ``nodes``
    (``int64[m]``, pre-order indices of :func:`walk` over ``tree``, parsed from ``src``),
    in C (``rules.c``). ``in_class`` (``bool[m]``): a node's parent is a class body;
    ``rule``/``flags`` (65,536 bytes each, by ``kind_id``): a node's rule and the kind
    tests the rules make; ``fields`` (``int64[4]``): the grammar's field ids of ``body``,
    ``declarator``, ``type`` and ``name`` (0: none); ``categories`` (``int64[9]``): the
    category values painted. Returns ``(paint, names)``: ``int64[p, 4]`` rows ``(k, start
    byte, end byte, category)`` and ``int64[q, 5]`` rows ``(k, list, keep_empty, start
    byte, end byte)`` (list 0: function names, 1: type names; the span of the name's
    text), in the rules' order. Raises ``RuntimeError`` when the library is not
    :func:`available`, ``TypeError`` for an object that is not a ``tree_sitter.Tree``,
    ``ValueError`` for tables of another size or an index outside the tree."""
    lib = _require()
    ptr = _tree_pointer(tree)
    if len(rule) != 65536 or len(flags) != 65536:
        raise ValueError(f"the rule and flag tables have {len(rule)} and {len(flags)} entries, not 65,536")
    idx = np.ascontiguousarray(nodes, dtype=np.int64)
    cls = np.ascontiguousarray(in_class, dtype=np.uint8)
    fld = np.ascontiguousarray(fields, dtype=np.int64)
    cat = np.ascontiguousarray(categories, dtype=np.int64)
    if len(cls) != len(idx) or len(fld) != 4 or len(cat) != 9:
        raise ValueError("in_class must match the nodes; fields has 4 entries, categories 9")
    tables = [np.frombuffer(t, dtype=np.uint8) for t in (rule, flags)]
    src_buf = np.frombuffer(src, dtype=np.uint8) if src else np.zeros(1, np.uint8)
    n_paint, n_names = ctypes.c_int64(0), ctypes.c_int64(0)
    cap_paint, cap_names = 3 * len(idx) + 1, len(idx) + 16  # at most 3 paints a node; names grow below
    while True:
        paint = np.empty((cap_paint, 4), dtype=np.int64)
        names = np.empty((cap_names, 5), dtype=np.int64)
        got = lib.megacpp_ts_rules(ptr, src_buf.ctypes.data, len(src), len(idx), idx.ctypes.data, cls.ctypes.data,
                                   tables[0].ctypes.data, tables[1].ctypes.data, fld.ctypes.data, cat.ctypes.data,
                                   cap_paint, paint.ctypes.data, ctypes.byref(n_paint), cap_names, names.ctypes.data,
                                   ctypes.byref(n_names))
        if got == -1:
            raise ValueError(f"a node index outside the tree's {int(lib.megacpp_ts_count(ptr))} nodes")
        if got == 0:
            return paint[:n_paint.value], names[:n_names.value]
        cap_names *= 4  # -2: a typedef with many declarators


def paint(plane: np.ndarray, intervals: np.ndarray) -> None:
    """``plane[start:end] = value`` for each row ``(start, end, value)`` of ``intervals``
    (``int64[k, 3]``), in order, into ``plane`` (``uint8[n]``, C-contiguous, changed in
    place; bounds clamped to ``[0, n]`` as a slice's). Raises ``RuntimeError`` when the
    library is not :func:`available`, ``ValueError`` for a plane that is not contiguous
    uint8 or intervals of another shape."""
    lib = _require()
    if plane.dtype != np.uint8 or not plane.flags.c_contiguous or plane.ndim != 1:
        raise ValueError("the plane must be a contiguous uint8 vector")
    rows = np.ascontiguousarray(intervals, dtype=np.int64).reshape(-1, 3)
    cols = [np.ascontiguousarray(rows[:, i]) for i in range(3)]
    lib.megacpp_paint(plane.ctypes.data, len(plane), len(rows), *(c.ctypes.data for c in cols))


def brace_cuts(codes: np.ndarray, line_start: bool, level: int) -> np.ndarray:
    """The unit ends of :func:`megacpp_core.brace_split.brace_cuts` over one range of a
    text, from ``brace.c`` (the same lexer as the Python regex, in C): ``codes`` the range's
    code points (``uint32[n]``, ``text[lo:hi]`` as UTF-32), ``line_start`` whether a line
    starts at its first one (``lo`` is 0 or ``text[lo - 1]`` is ``\\n``), ``level`` the
    brace depth a unit ends at. Returns the cuts as ``int64[k]`` offsets into ``codes``,
    strictly increasing, inside ``(0, n)``. Raises ``RuntimeError`` when the library is
    not :func:`available`."""
    lib = _require()
    t = np.ascontiguousarray(codes, dtype=np.uint32)
    out = np.empty(int(np.count_nonzero(t == 10)) + 1, dtype=np.int64)  # a cut follows a distinct \n
    got = lib.megacpp_brace_cuts(t.ctypes.data, len(t), int(bool(line_start)), int(level), out.ctypes.data, len(out))
    if got < 0:  # more cuts than line ends: a broken library
        raise RuntimeError(f"native brace lexer returned more cuts than the {len(out) - 1} line ends of the text")
    return out[:got]
