/* Pre-order walk of a tree-sitter tree into flat node arrays (stage 6 enrichment).
 *
 * Compiled by `python -m megacpp_core.native.build` together with the tree-sitter core of
 * the exact py-tree-sitter release installed (its sdist), and called through ctypes by
 * megacpp_core/native/tswalk.py with the TSTree pointer of a `tree_sitter.Tree`. It only
 * reads the tree; the Python object keeps owning it.
 */
#include <stdint.h>
#include "tree_sitter/api.h"

#ifndef MEGACPP_TS_VERSION
#error "MEGACPP_TS_VERSION (the py-tree-sitter release of the core) must be defined"
#endif

/* Built with -fvisibility=hidden: only these functions are exported. */
#define EXPORT __attribute__((visibility("default")))

/* The py-tree-sitter release whose core this library was compiled from. */
EXPORT const char *megacpp_ts_version(void) { return MEGACPP_TS_VERSION; }

/* Number of nodes a walk visits: every node, named or anonymous, the root included. */
EXPORT uint32_t megacpp_ts_count(const TSTree *tree) {
    return ts_node_descendant_count(ts_tree_root_node(tree));
}

/* Walks every node in pre-order (the order of ts_tree_cursor_goto_descendant's indices).
 * Per node i writes: starts[i], ends[i] (bytes), parents[i] (-1 for the root), kinds[i]
 * (ts_node_symbol), depths[i] (ancestors) and sibs[i] (index among the parent's children),
 * the last two clamped at `clamp`. picked[] receives, in order, the indices of the nodes
 * whose recorded[kind] is non-zero (`recorded`: 65,536 flags); *npicked their number.
 * Every array holds `cap` entries. Returns the number of nodes, or -1 when `cap` is short
 * (nothing else is valid then). */
EXPORT int64_t megacpp_ts_walk(const TSTree *tree, int64_t cap, const uint8_t *recorded, int64_t clamp,
                        int64_t *starts, int64_t *ends, int64_t *parents, int64_t *kinds,
                        int64_t *depths, int64_t *sibs, int64_t *picked, int64_t *npicked) {
    TSTreeCursor c = ts_tree_cursor_new(ts_tree_root_node(tree));
    int64_t n = 0, parent = -1, cur, depth = 0, sib = 0, np = 0;
    for (;;) {
        if (n >= cap) {
            ts_tree_cursor_delete(&c);
            return -1;
        }
        TSNode node = ts_tree_cursor_current_node(&c);
        TSSymbol kind = ts_node_symbol(node);
        starts[n] = ts_node_start_byte(node);
        ends[n] = ts_node_end_byte(node);
        parents[n] = parent;
        kinds[n] = kind;
        depths[n] = depth;
        sibs[n] = sib;
        if (recorded[kind]) picked[np++] = n;
        if (ts_tree_cursor_goto_first_child(&c)) {
            parent = n++;
            depth++;
            sib = 0;
            continue;
        }
        cur = n++;
        while (!ts_tree_cursor_goto_next_sibling(&c)) {
            if (!ts_tree_cursor_goto_parent(&c)) goto done;
            cur = parent;
            parent = parents[cur];
            depth--;
        }
        sib = sibs[cur] + 1;
    }
done:
    ts_tree_cursor_delete(&c);
    for (int64_t i = 0; i < n; i++) {
        if (depths[i] > clamp) depths[i] = clamp;
        if (sibs[i] > clamp) sibs[i] = clamp;
    }
    *npicked = np;
    return n;
}

/* The owners search of megacpp_ts_owners; with `tables` (t tables of n + 1 uint8 each,
 * entry n for "no node") it writes planes[u * m + k] = tables[u * (n + 1) + owner] instead
 * of out[k]. */
static int64_t owners_core(int64_t n, const int64_t *starts, const int64_t *ends, const int64_t *parents, int64_t m,
                           const int64_t *pos, int64_t *out, int64_t t, const uint8_t *tables, uint8_t *planes) {
    for (int64_t i = 0; i < n; i++)
        if ((i > 0 && starts[i] < starts[i - 1]) || parents[i] < -1 || parents[i] >= i) return -1;
    int64_t j = -1, cur = -1, last = INT64_MIN;
    for (int64_t k = 0; k < m; k++) {
        int64_t b = pos[k];
        if (b < last) return -1;
        last = b;
        int moved = 0;
        while (j + 1 < n && starts[j + 1] <= b) {
            j++;
            moved = 1;
        }
        int64_t x = moved ? j : cur;
        while (x >= 0 && ends[x] <= b) x = parents[x];
        cur = x;
        if (tables == 0) {
            out[k] = x;
        } else {
            int64_t row = x < 0 ? n : x;
            for (int64_t u = 0; u < t; u++) planes[u * m + k] = tables[u * (n + 1) + row];
        }
    }
    return 0;
}

/* For each byte position pos[k] (non-decreasing), the innermost node holding it: the last
 * node (pre-order arrays of megacpp_ts_walk, n nodes each, starts non-decreasing, every
 * parent before its child) starting at or before it, or the nearest ancestor of that node
 * that ends after it; -1 when none does. Writes out[k]. Returns 0, or -1 when the starts or
 * positions are not non-decreasing or a parent index is not in [-1, i) (nothing is valid
 * then). Linear in n + m: while no new node starts, the next position's answer is an
 * ancestor-or-self of the previous one. */
EXPORT int64_t megacpp_ts_owners(int64_t n, const int64_t *starts, const int64_t *ends, const int64_t *parents,
                          int64_t m, const int64_t *pos, int64_t *out) {
    return owners_core(n, starts, ends, parents, m, pos, out, 0, 0, 0);
}

/* megacpp_ts_owners' search, each position's owner looked up at once in t per-node tables
 * (`tables`: t rows of n + 1 uint8, the last entry of each for a position no node holds):
 * planes[u * m + k] for table u and position k. Same return values. */
EXPORT int64_t megacpp_ts_owner_planes(int64_t n, const int64_t *starts, const int64_t *ends, const int64_t *parents,
                                       int64_t m, const int64_t *pos, int64_t t, const uint8_t *tables,
                                       uint8_t *planes) {
    return owners_core(n, starts, ends, parents, m, pos, 0, t, tables, planes);
}

/* For each node index nodes[k] (pre-order arrays of megacpp_ts_walk, n nodes), whether the
 * nearest ancestor whose role (roles[i], per node) is `yes` or `stop` has role `yes`: out[k]
 * is 1, else 0 (also when there is none). Returns 0, or -1 when an index is outside [0, n)
 * or a parent is not an earlier node (nothing is valid then). */
EXPORT int64_t megacpp_ts_nearest_role(int64_t n, const int64_t *parents, const uint8_t *roles, int64_t m,
                                       const int64_t *nodes, int64_t yes, int64_t stop, uint8_t *out) {
    for (int64_t k = 0; k < m; k++) {
        int64_t x = nodes[k];
        if (x < 0 || x >= n) return -1;
        out[k] = 0;
        for (int64_t up = parents[x]; up >= 0; x = up, up = parents[x]) {
            if (up >= x) return -1; /* every parent precedes its child: no cycle */
            if (roles[up] == yes) {
                out[k] = 1;
                break;
            }
            if (roles[up] == stop) break;
        }
    }
    return 0;
}

/* The callee names of call expressions (the rule of megacpp_core.callees.callee_node). For
 * each node index idx[k] (pre-order indices of megacpp_ts_walk), its `f_function` field
 * child is followed while step[symbol] (65,536 entries) says how: 1, the node is the name:
 * its byte span goes to cs[k], ce[k]; 2, go to its `f_field` child; 3, to its `f_name`
 * child; 4, to its first named child; 0, the call has no name. Where there is none (or a
 * child is missing), cs[k] = ce[k] = -1. Returns 0, or -1 when an index is outside the
 * tree (nothing is valid then). */
EXPORT int64_t megacpp_ts_callees(const TSTree *tree, int64_t m, const int64_t *idx, const uint8_t *step,
                                  int64_t f_function, int64_t f_field, int64_t f_name, int64_t *cs, int64_t *ce) {
    TSNode root = ts_tree_root_node(tree);
    int64_t total = ts_node_descendant_count(root);
    TSTreeCursor c = ts_tree_cursor_new(root);
    for (int64_t k = 0; k < m; k++) {
        cs[k] = ce[k] = -1;
        if (idx[k] < 0 || idx[k] >= total) {
            ts_tree_cursor_delete(&c);
            return -1;
        }
        ts_tree_cursor_goto_descendant(&c, (uint32_t)idx[k]);
        TSNode fn = ts_node_child_by_field_id(ts_tree_cursor_current_node(&c), (TSFieldId)f_function);
        while (!ts_node_is_null(fn)) {
            uint8_t s = step[ts_node_symbol(fn)];
            if (s == 1) {
                cs[k] = ts_node_start_byte(fn);
                ce[k] = ts_node_end_byte(fn);
                break;
            } else if (s == 2) {
                fn = ts_node_child_by_field_id(fn, (TSFieldId)f_field);
            } else if (s == 3) {
                fn = ts_node_child_by_field_id(fn, (TSFieldId)f_name);
            } else if (s == 4) {
                fn = ts_node_named_child(fn, 0);
            } else {
                break;
            }
        }
    }
    ts_tree_cursor_delete(&c);
    return 0;
}
