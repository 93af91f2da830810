"""Numpy views of a parsed tree as arrays over its nodes in pre-order (stage 6 enrichment):
the nodes themselves (:func:`walk`: offsets, parents, kinds, native or Python), ancestor
depth, index among siblings, the role of the nearest marked ancestor and the innermost
node of byte positions, each computed for all nodes at once from the arrays (the parent
array is ``int64[n]``, -1 for the root) instead of a Python walk per node.
"""

from __future__ import annotations

import numpy as np

from .native import tswalk

#: Clamp of ``ast_depth`` and ``sibling_index`` (SPEC §4: "clamped 63").
MAX_DEPTH = 63


def depths(parents: np.ndarray) -> np.ndarray:
    """``int64[n]``: number of ancestors of every node (pre-order parent array, -1 for the
    root), clamped at :data:`MAX_DEPTH`, by binary lifting over jumps of 32, 16, ..., 1."""
    n = len(parents)
    up = [np.where(parents < 0, n, parents)]
    up[0] = np.append(up[0], n)  # n: above the root
    for _ in range(5):
        up.append(up[-1][up[-1]])
    cur = np.arange(n)
    depth = np.zeros(n, dtype=np.int64)
    for k in range(5, -1, -1):
        nxt = up[k][cur]
        ok = nxt != n
        cur = np.where(ok, nxt, cur)
        depth += ok.astype(np.int64) << k
    return depth


def sibling_index(parents: np.ndarray) -> np.ndarray:
    """``int64[n]``: index of every node among its parent's children (the root: 0), clamped
    at :data:`MAX_DEPTH`; children follow each other in pre-order, so a stable sort by
    parent lists each parent's children in order."""
    n = len(parents)
    order = np.argsort(parents, kind="stable")
    ps = parents[order]
    first = np.flatnonzero(np.concatenate(([True], ps[1:] != ps[:-1])))
    rank = np.arange(n) - np.repeat(first, np.diff(np.append(first, n)))
    out = np.empty(n, dtype=np.int64)
    out[order] = np.minimum(rank, MAX_DEPTH)
    return out


def nearest_role_is(nodes: np.ndarray, parents: np.ndarray, roles: np.ndarray, yes: int, stop: int) -> np.ndarray:
    """``bool[m]`` for the node indices ``nodes``: is the nearest ancestor whose role
    (``roles``: ``uint8[n]`` per node) is ``yes`` or ``stop`` one of role ``yes`` (False
    when there is none)? In C when the library is available
    (:func:`megacpp_core.native.tswalk.nearest_role`), else walks up all of them at once."""
    if tswalk.available():
        got = tswalk.nearest_role(nodes, parents, roles, yes, stop)
        if got is not None:
            return got
    out = np.zeros(len(nodes), dtype=bool)
    cur = parents[nodes]
    act = np.flatnonzero(cur >= 0)
    while act.size:
        r = roles[cur[act]]
        hit = (r == yes) | (r == stop)
        out[act[r == yes]] = True
        act = act[~hit]
        cur[act] = parents[cur[act]]
        act = act[cur[act] >= 0]
    return out


def walk(tree, flags: bytearray, native: bool | None = None) -> tuple[tswalk.NodeArrays, list]:
    """Every node of ``tree`` (a ``tree_sitter.Tree``) in pre-order as
    :class:`~megacpp_core.native.tswalk.NodeArrays` (depths and sibling indices clamped at
    :data:`MAX_DEPTH`; ``picked``: the nodes whose ``flags[kind_id]`` is non-zero, ``flags``
    being 65,536 bytes), and per picked node its ``tree_sitter.Node`` when its flag is 2,
    else None. Native (:func:`megacpp_core.native.tswalk.walk`, then a cursor
    ``goto_descendant`` per Node wanted) when the library is available, else a Python
    cursor loop; ``native`` forces one or the other (``RuntimeError`` from the native walk
    when it is True and the library is not available). Both give the same result."""
    if tswalk.available() if native is None else native:
        arrays = tswalk.walk(tree, flags, MAX_DEPTH)
        c, nodes = tree.walk(), [None] * len(arrays.picked)
        goto = c.goto_descendant
        wanted = np.flatnonzero(np.frombuffer(flags, np.uint8)[arrays.kind_ids[arrays.picked]] == 2)
        for j, i in zip(wanted.tolist(), arrays.picked[wanted].tolist()):
            goto(i)
            nodes[j] = c.node
        return arrays, nodes
    starts, ends, parents, kind_ids, ids, nodes = [], [], [], [], [], []
    sa, ea, pa, ka = starts.append, ends.append, parents.append, kind_ids.append
    c = tree.walk()
    down, right, up = c.goto_first_child, c.goto_next_sibling, c.goto_parent
    stack: list[int] = []
    parent, n = -1, 0
    while True:
        node = c.node
        kid = node.kind_id
        sa(node.start_byte)
        ea(node.end_byte)
        pa(parent)
        ka(kid)
        if flags[kid]:
            ids.append(n)
            nodes.append(node if flags[kid] == 2 else None)
        if down():
            stack.append(parent)
            parent = n
            n += 1
            continue
        n += 1
        while not right():
            if not up():
                break
            parent = stack.pop()
        else:
            continue
        break
    p = np.asarray(parents, dtype=np.int64)
    arrays = tswalk.NodeArrays(np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64), p,
                               np.asarray(kind_ids, dtype=np.int64), depths(p), sibling_index(p),
                               np.asarray(ids, dtype=np.int64))
    return arrays, nodes


def innermost(starts: np.ndarray, ends: np.ndarray, parents: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``int64[m]``: for each byte offset of ``positions`` (non-decreasing), the innermost
    node holding it, -1 where none does: for nested intervals in pre-order, the last node
    starting at or before the position holds it unless it ended before; then an ancestor
    does. One linear native pass (:func:`megacpp_core.native.tswalk.owners`) when the
    library is available, else a vectorized walk up (each pass moves only the positions
    still outside their node, so deep chains such as long else-if ladders stay linear in
    the positions that move)."""
    if tswalk.available():
        idx = tswalk.owners(starts, ends, parents, positions)
        if idx is not None:
            return idx
    idx = np.searchsorted(starts, positions, side="right") - 1
    act = np.flatnonzero(idx >= 0)
    act = act[ends[idx[act]] <= positions[act]]
    while act.size:
        idx[act] = parents[idx[act]]
        act = act[idx[act] >= 0]
        act = act[ends[idx[act]] <= positions[act]]
    return idx


def innermost_planes(starts: np.ndarray, ends: np.ndarray, parents: np.ndarray, positions: np.ndarray,
                     per_node: list[np.ndarray]) -> list[np.ndarray]:
    """For each byte offset of ``positions`` (non-decreasing), the value of its
    :func:`innermost` node in each of ``per_node`` (``uint8[n]`` tables), 0 where no node
    holds it: one ``uint8[m]`` plane per table. In one native pass when the library is
    available (:func:`megacpp_core.native.tswalk.owner_planes`: no owner index array), else
    :func:`innermost` and a gather per table."""
    tables = np.zeros((len(per_node), len(starts) + 1), dtype=np.uint8)  # the last column: no node
    for row, values in zip(tables, per_node):
        row[:-1] = values
    if tswalk.available():
        got = tswalk.owner_planes(starts, ends, parents, positions, tables)
        if got is not None:
            return list(got)
    idx = innermost(starts, ends, parents, positions)
    idx[idx < 0] = len(starts)
    return [row[idx] for row in tables]
