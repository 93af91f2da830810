"""Numpy views of a parsed tree as arrays over its nodes in pre-order (stage 6 enrichment):
ancestor depth, index among siblings and the role of the nearest marked ancestor, each
computed for all nodes at once from the parent array (``int64[n]``, -1 for the root)
instead of a Python walk per node.
"""

from __future__ import annotations

import numpy as np

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
    when there is none)? Walks up all of them at once."""
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
