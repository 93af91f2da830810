"""Stage 6 enrichment: the name each ``call_expression`` of a parsed file calls.

A call's name is what its call edges are resolved by (:mod:`megacpp_core.enrich`): ``f``
in ``f(x)``, ``ns::f(x)``, ``obj.f(x)``, ``p->f(x)``, ``f<T>(x)`` and ``(f)(x)``; a call
through any other expression (``(*fp)(x)``, ``a[i](x)``, ``g()(x)``) names nothing. From
the call's ``function`` field, :data:`CALLEE_STEPS` says for each node type how to go on
towards the name. ``default`` has about 74,000 calls; following the fields through
py-tree-sitter ``Node`` objects cost about 3 µs a call, so the native library
(:func:`megacpp_core.native.tswalk.callees`) follows them in C, and
:func:`callee_spans` falls back to the same rule on Python nodes (:func:`callee_node`)
when it is not built.
"""

from __future__ import annotations

import numpy as np
import tree_sitter

from .native import tswalk

__all__ = ["CALLEE_STEPS", "callee_node", "callee_spans"]

#: How the rule goes from a node of each type towards the called name: 1 the node is the
#: name, 2 its ``field`` child, 3 its ``name`` child, 4 its first named child; any other
#: type: the call names nothing.
CALLEE_STEPS = {"identifier": 1, "field_identifier": 1, "field_expression": 2, "qualified_identifier": 3,
                "template_function": 3, "template_method": 3, "parenthesized_expression": 4}

#: Per grammar: :data:`CALLEE_STEPS` as a 65,536-entry table by ``kind_id`` and the field
#: ids of ``function``, ``field`` and ``name`` (:func:`_table`).
_TABLES: dict[str, tuple[bytearray, tuple[int, int, int]]] = {}


def callee_node(call: tree_sitter.Node) -> tree_sitter.Node | None:
    """The ``identifier`` or ``field_identifier`` node naming what the ``call_expression``
    ``call`` calls, following :data:`CALLEE_STEPS` from its ``function`` field; None when it
    names nothing (or a child the rule needs is missing)."""
    fn = call.child_by_field_name("function")
    while fn is not None:
        way = CALLEE_STEPS.get(fn.type, 0)
        if way == 1:
            return fn
        if way == 2:
            fn = fn.child_by_field_name("field")
        elif way == 3:
            fn = fn.child_by_field_name("name")
        elif way == 4:
            fn = fn.named_children[0] if fn.named_children else None
        else:
            return None
    return None


def _table(grammar: str, lang: tree_sitter.Language) -> tuple[bytearray, tuple[int, int, int]]:
    """:data:`CALLEE_STEPS` for ``lang`` (the language of ``grammar``, which keys the cache; a
    tree's own ``Tree.language``):
    a step for every ``kind_id``, named or not, by the type name ``Node.type`` gives it, and
    the field ids of ``function``, ``field`` and ``name`` (0 for one the grammar lacks)."""
    got = _TABLES.get(grammar)
    if got is None:
        step = bytearray(65536)
        for i in range(lang.node_kind_count):
            step[i] = CALLEE_STEPS.get(lang.node_kind_for_id(i), 0)
        got = _TABLES[grammar] = (step, tuple(lang.field_id_for_name(f) or 0 for f in ("function", "field", "name")))
    return got


def callee_spans(tree: tree_sitter.Tree, grammar: str, calls: np.ndarray, native: bool) -> tuple[np.ndarray, np.ndarray]:
    """Byte ``(starts, ends)`` (``int64[m]`` each, -1 where a call names nothing) of
    :func:`callee_node` of each ``call_expression`` of ``tree`` at ``calls`` (``int64[m]``,
    the pre-order indices of :func:`megacpp_core.tree_arrays.walk`, those of
    ``TreeCursor.goto_descendant``); ``grammar`` names the tree's language (``Tree.language``). In C when
    ``native`` (:func:`megacpp_core.native.tswalk.callees`: ``RuntimeError`` when the
    library is not available), else through a cursor and Python nodes; the same spans
    either way. ``ValueError`` for an index outside the tree."""
    if native:
        return tswalk.callees(tree, calls, *_table(grammar, tree.language))
    idx = np.asarray(calls, dtype=np.int64)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= tree.root_node.descendant_count):
        raise ValueError(f"a call index outside the tree's {tree.root_node.descendant_count} nodes")
    c, out = tree.walk(), np.full((2, len(idx)), -1, dtype=np.int64)
    for k, i in enumerate(idx.tolist()):
        c.goto_descendant(i)
        fn = callee_node(c.node)
        if fn is not None:
            out[0, k], out[1, k] = fn.start_byte, fn.end_byte
    return out[0], out[1]
