/* Pre-order walk of a tree-sitter tree into flat node arrays (stage 6 enrichment).
 *
 * Compiled by `python -m megacpp_core.native.build` together with the tree-sitter core of
 * the exact py-tree-sitter release installed (its sdist), and called through ctypes by
 * megacpp_core/native/tswalk.py with the TSTree pointer of a `tree_sitter.Tree`. It only
 * reads the tree; the Python object keeps owning it.
 */
#include <stdint.h>
#include <stdlib.h>
#include "tree_sitter/api.h"
/* the core's internal headers, of the same release (see megacpp_ts_walk) */
#include "language.h"
#include "subtree.h"
#include "tree.h"

#ifndef MEGACPP_TS_VERSION
#error "MEGACPP_TS_VERSION (the py-tree-sitter release of the core) must be defined"
#endif

/* Built with -fvisibility=hidden: only these functions are exported. */
#define EXPORT __attribute__((visibility("default")))

/* The py-tree-sitter release whose core this library was compiled from. */
EXPORT const char *megacpp_ts_version(void) { return MEGACPP_TS_VERSION; }

#ifndef MEGACPP_TS_SOURCES
#error "MEGACPP_TS_SOURCES (the sha256 of the C sources, megacpp_core/native/build.py) must be defined"
#endif

/* The digest of the C sources this library was compiled from (build.sources_digest). */
EXPORT const char *megacpp_ts_sources(void) { return MEGACPP_TS_SOURCES; }

/* Number of nodes a walk visits: every node, named or anonymous, the root included. */
EXPORT uint32_t megacpp_ts_count(const TSTree *tree) {
    return ts_node_descendant_count(ts_tree_root_node(tree));
}

/* One subtree whose children the walk is going through: `children[i]` is the next, starting
 * at byte `pos`; `sci` counts the non-extra children passed (the index into the parent's
 * alias sequence `alias_seq`, NULL when its production has none); `vparent` is the node
 * index of the nearest visible subtree at or above it and `vdepth` the depth its visible
 * children get (a hidden subtree's visible children are its visible parent's children). */
typedef struct {
    const Subtree *children;
    uint32_t count, i, sci, pos;
    const TSSymbol *alias_seq;
    int64_t vparent, vdepth;
} Frame;

/* Makes room for `need` items of `size` bytes in *buf (capacity *cap, doubled as needed);
 * returns -1 when memory runs out. */
static int reserve(void **buf, int64_t *cap, int64_t need, size_t size) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *p = realloc(*buf, (size_t)c * size);
    if (!p) return -1;
    *buf = p;
    *cap = c;
    return 0;
}

/* Walks every node in pre-order (the order of ts_tree_cursor_goto_descendant's indices).
 * Per node i writes: starts[i], ends[i] (bytes), parents[i] (-1 for the root), kinds[i]
 * (ts_node_symbol), depths[i] (ancestors) and sibs[i] (index among the parent's children),
 * the last two clamped at `clamp`. picked[] receives, in order, the indices of the nodes
 * whose recorded[kind] is non-zero (`recorded`: 65,536 flags); *npicked their number.
 * Every array holds `cap` entries. Returns the number of nodes, -1 when `cap` is short, or
 * -2 when memory runs out (nothing else is valid then).
 *
 * The walk reads the subtrees themselves (the core's internal headers of this very
 * release), as the core's TSTreeCursor does: a child is a node when its subtree is visible
 * or the parent's production aliases it (extras are never aliased); a hidden child with
 * visible descendants is walked through, its visible children counting as its parent's;
 * a node's symbol is ts_language_public_symbol of its alias, else of its own symbol; a
 * child starts where the previous one ended plus its own padding (the first where its
 * parent starts), the root after its padding. The cursor recomputes parents, aliases and
 * positions at every step; one pass with an explicit stack of subtrees is about 1.5x
 * faster on `default` and gives the same arrays (tests/test_native_walk.py compares them
 * with py-tree-sitter's cursor on real and hostile files). */
EXPORT int64_t megacpp_ts_walk(const TSTree *tree, int64_t cap, const uint8_t *recorded, int64_t clamp,
                        int64_t *starts, int64_t *ends, int64_t *parents, int64_t *kinds,
                        int64_t *depths, int64_t *sibs, int64_t *picked, int64_t *npicked) {
    const TSLanguage *lang = tree->language;
    const Subtree root = tree->root;
    Frame *stack = NULL;
    int64_t *nsib = NULL; /* nsib[d]: children given so far to the open visible node at depth d - 1 */
    int64_t stack_cap = 0, nsib_cap = 0, top = 0, n = 0, np = 0, out = -2;
    if (cap < 1) return -1;
    uint32_t start = ts_subtree_padding(root).bytes;
    TSSymbol kind = ts_language_public_symbol(lang, ts_subtree_symbol(root));
    starts[0] = start;
    ends[0] = start + ts_subtree_size(root).bytes;
    parents[0] = -1;
    kinds[0] = kind;
    depths[0] = 0;
    sibs[0] = 0;
    if (recorded[kind]) picked[np++] = 0;
    n = 1;
    if (ts_subtree_child_count(root) > 0) {
        if (reserve((void **)&stack, &stack_cap, 1, sizeof(Frame)) || reserve((void **)&nsib, &nsib_cap, 2, sizeof(int64_t)))
            goto fail;
        stack[top++] = (Frame){ts_subtree_children(root), ts_subtree_child_count(root), 0, 0, start,
                               ts_language_alias_sequence(lang, root.ptr->production_id), 0, 1};
        nsib[1] = 0;
    }
    while (top > 0) {
        Frame *f = &stack[top - 1];
        if (f->i == f->count) {
            top--;
            continue;
        }
        const Subtree child = f->children[f->i];
        const uint32_t at = f->pos, size = ts_subtree_size(child).bytes;
        TSSymbol alias = 0;
        bool visible = ts_subtree_visible(child);
        if (!ts_subtree_extra(child)) {
            if (f->alias_seq) {
                alias = f->alias_seq[f->sci];
                visible |= alias != 0;
            }
            f->sci++;
        }
        f->pos += size;
        if (++f->i < f->count) f->pos += ts_subtree_padding(f->children[f->i]).bytes;
        const int64_t vparent = f->vparent, vdepth = f->vdepth; /* f moves if the stack grows */
        if (visible) {
            if (n >= cap) {
                out = -1;
                goto fail;
            }
            kind = ts_language_public_symbol(lang, alias ? alias : ts_subtree_symbol(child));
            starts[n] = at;
            ends[n] = at + size;
            parents[n] = vparent;
            kinds[n] = kind;
            depths[n] = vdepth;
            sibs[n] = nsib[vdepth]++;
            if (recorded[kind]) picked[np++] = n;
            if (ts_subtree_child_count(child) > 0) {
                if (reserve((void **)&stack, &stack_cap, top + 1, sizeof(Frame)) ||
                    reserve((void **)&nsib, &nsib_cap, vdepth + 2, sizeof(int64_t)))
                    goto fail;
                stack[top++] = (Frame){ts_subtree_children(child), ts_subtree_child_count(child), 0, 0, at,
                                       ts_language_alias_sequence(lang, child.ptr->production_id), n, vdepth + 1};
                nsib[vdepth + 1] = 0;
            }
            n++;
        } else if (ts_subtree_visible_child_count(child) > 0) {
            if (reserve((void **)&stack, &stack_cap, top + 1, sizeof(Frame))) goto fail;
            stack[top++] = (Frame){ts_subtree_children(child), ts_subtree_child_count(child), 0, 0, at,
                                   ts_language_alias_sequence(lang, child.ptr->production_id), vparent, vdepth};
        }
    }
    free(stack);
    free(nsib);
    for (int64_t i = 0; i < n; i++) {
        if (depths[i] > clamp) depths[i] = clamp;
        if (sibs[i] > clamp) sibs[i] = clamp;
    }
    *npicked = np;
    return n;
fail:
    free(stack);
    free(nsib);
    return out;
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
