/* The structure rules of stage 6 enrichment (megacpp_core/enrich.py, _Walk._special) in C.
 *
 * Compiled into the same library as tswalk.c (`python -m megacpp_core.native.build`) and
 * called through ctypes by megacpp_core/native/tswalk.py (rules, paint), with the TSTree
 * pointer of a `tree_sitter.Tree`. For each node of a rule kind it records the same paint
 * intervals, in the same order, as the Python rule, and the byte spans of the names the
 * Python rule would read (the caller decodes them and takes their last `::` component).
 * The rule of a node comes from rule[symbol]; node kinds the rules test by type come from
 * flags[symbol]; both tables (65,536 entries) and the category values are built by
 * megacpp_core/node_rules.py from the grammar's kind names, so this file holds no names.
 */
#include <stdint.h>
#include "tree_sitter/api.h"

#define EXPORT __attribute__((visibility("default")))

/* rule[symbol] */
enum {
    R_NONE, R_COMMENT, R_PREAMBLE, R_PREPROC_BLOCK, R_PREPROC_BRANCH, R_FUNCTION, R_TEMPLATE, R_CLASSLIKE,
    R_DECLARATION, R_MEMBER, R_CLASS_ONLY_MEMBER, R_ALIAS, R_TYPEDEF, R_NAMESPACE
};
/* flags[symbol] */
enum { F_CLASSLIKE = 1, F_FN_DECLARATOR = 2, F_PAREN_DECLARATOR = 4, F_FN_DEFINITION = 8 };
/* Slots of cat[]: the StructureCategory values the caller passes. */
enum { C_COMMENT, C_PREAMBLE, C_SIGNATURE, C_BODY, C_CLASS_DECL, C_MEMBER, C_TYPEDEF, C_NAMESPACE, C_OTHER };
/* Slots of fields[]: the grammar's field ids (0 when it lacks one). */
enum { FD_BODY, FD_DECLARATOR, FD_TYPE, FD_NAME };
/* names: which list, and whether an empty name is kept. */
enum { N_FUNCTION = 0, N_TYPE = 1 };

typedef struct {
    int64_t *paint, *names;
    int64_t npaint, nnames, cap_paint, cap_names;
    int overflow;
} Out;

static void put_paint(Out *o, int64_t k, int64_t sb, int64_t eb, int64_t cat) {
    if (o->npaint >= o->cap_paint) {
        o->overflow = 1;
        return;
    }
    int64_t *r = o->paint + 4 * o->npaint++;
    r[0] = k, r[1] = sb, r[2] = eb, r[3] = cat;
}

static void put_name(Out *o, int64_t k, int64_t which, int64_t keep_empty, TSNode node) {
    if (o->nnames >= o->cap_names) {
        o->overflow = 1;
        return;
    }
    int64_t *r = o->names + 5 * o->nnames++;
    r[0] = k, r[1] = which, r[2] = keep_empty, r[3] = ts_node_start_byte(node), r[4] = ts_node_end_byte(node);
}

static TSNode field(TSNode node, int64_t id) {
    TSNode none = {0};
    return id ? ts_node_child_by_field_id(node, (TSFieldId)id) : none;
}

/* The first named child (py-tree-sitter's named_children[0]); a null node when none. */
static TSNode first_named(TSNode node) {
    TSNode none = {0};
    TSTreeCursor c = ts_tree_cursor_new(node);
    if (ts_tree_cursor_goto_first_child(&c)) {
        do {
            TSNode ch = ts_tree_cursor_current_node(&c);
            if (ts_node_is_named(ch)) {
                ts_tree_cursor_delete(&c);
                return ch;
            }
        } while (ts_tree_cursor_goto_next_sibling(&c));
    }
    ts_tree_cursor_delete(&c);
    return none;
}

/* chunk.declarator_identifier: the innermost declarator (a null node when none). */
static TSNode declarator_identifier(TSNode node, const int64_t *fields, const uint8_t *flags) {
    while (!ts_node_is_null(node)) {
        TSNode inner = field(node, fields[FD_DECLARATOR]);
        if (ts_node_is_null(inner) && (flags[ts_node_symbol(node)] & F_PAREN_DECLARATOR)) inner = first_named(node);
        if (ts_node_is_null(inner)) break;
        node = inner;
    }
    return node;
}

/* enrich._is_function_declarator */
static int is_function_declarator(TSNode node, const int64_t *fields, const uint8_t *flags) {
    while (!ts_node_is_null(node)) {
        if (flags[ts_node_symbol(node)] & F_FN_DECLARATOR) {
            TSNode inner = field(node, fields[FD_DECLARATOR]);
            return ts_node_is_null(inner) || !(flags[ts_node_symbol(inner)] & F_PAREN_DECLARATOR);
        }
        node = field(node, fields[FD_DECLARATOR]);
    }
    return 0;
}

static int is_space_byte(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0x0b || c == 0x0c; }

static int endif_at(const uint8_t *src, int64_t nsrc, int64_t at, int64_t limit) {
    static const char e[6] = {'#', 'e', 'n', 'd', 'i', 'f'};
    if (at < 0 || at + 6 > limit || at + 6 > nsrc) return 0;
    for (int i = 0; i < 6; i++)
        if (src[at + i] != (uint8_t)e[i]) return 0;
    return 1;
}

/* One node's rule (enrich._Walk._special). */
static void rule_of(Out *o, int64_t k, TSNode node, int r, int in_class, const uint8_t *src, int64_t nsrc,
                    const uint8_t *flags, const int64_t *fields, const int64_t *cat) {
    int64_t sb = ts_node_start_byte(node), eb = ts_node_end_byte(node);
    switch (r) {
    case R_COMMENT:
        put_paint(o, k, sb, eb, cat[C_COMMENT]);
        break;
    case R_PREAMBLE:
        put_paint(o, k, sb, eb, cat[C_PREAMBLE]);
        break;
    case R_PREPROC_BLOCK:
    case R_PREPROC_BRANCH: {
        int64_t nl = -1;
        for (int64_t q = sb; q < eb && q < nsrc; q++)
            if (src[q] == '\n') {
                nl = q;
                break;
            }
        put_paint(o, k, sb, nl < 0 ? eb : nl, cat[C_PREAMBLE]);
        if (r == R_PREPROC_BLOCK) { /* last = src.rfind(b"\n", sb, eb - 1) + 1 (0 when none) */
            int64_t last = 0;
            for (int64_t q = (eb - 2 < nsrc - 1 ? eb - 2 : nsrc - 1); q >= sb; q--)
                if (src[q] == '\n') {
                    last = q + 1;
                    break;
                }
            int64_t s = last;
            while (s < eb && s < nsrc && is_space_byte(src[s])) s++;
            if (endif_at(src, nsrc, last, nsrc) || endif_at(src, nsrc, s, eb)) put_paint(o, k, last, eb, cat[C_PREAMBLE]);
        }
        break;
    }
    case R_FUNCTION: {
        TSNode body = field(node, fields[FD_BODY]);
        put_paint(o, k, sb, eb, cat[C_SIGNATURE]);
        if (!ts_node_is_null(body)) put_paint(o, k, ts_node_start_byte(body), ts_node_end_byte(body), cat[C_BODY]);
        TSNode name = declarator_identifier(field(node, fields[FD_DECLARATOR]), fields, flags);
        if (!ts_node_is_null(name)) put_name(o, k, N_FUNCTION, 0, name);
        break;
    }
    case R_TEMPLATE: {
        int64_t inner = -1;
        TSTreeCursor c = ts_tree_cursor_new(node);
        if (ts_tree_cursor_goto_first_child(&c)) {
            do {
                TSNode ch = ts_tree_cursor_current_node(&c);
                if (ts_node_is_named(ch) && (flags[ts_node_symbol(ch)] & F_FN_DEFINITION)) inner = ts_node_start_byte(ch);
            } while (ts_tree_cursor_goto_next_sibling(&c));
        }
        ts_tree_cursor_delete(&c);
        if (inner >= 0) put_paint(o, k, sb, inner, cat[C_SIGNATURE]);
        break;
    }
    case R_CLASSLIKE:
        if (!ts_node_is_null(field(node, fields[FD_BODY]))) {
            put_paint(o, k, sb, eb, cat[C_CLASS_DECL]);
            TSNode name = field(node, fields[FD_NAME]);
            if (!ts_node_is_null(name)) put_name(o, k, N_TYPE, 1, name);
        }
        break;
    case R_DECLARATION: {
        TSNode typ = field(node, fields[FD_TYPE]);
        if (!ts_node_is_null(typ) && (flags[ts_node_symbol(typ)] & F_CLASSLIKE) &&
            !ts_node_is_null(field(typ, fields[FD_BODY])))
            put_paint(o, k, sb, eb, cat[C_CLASS_DECL]);
        else if (is_function_declarator(field(node, fields[FD_DECLARATOR]), fields, flags))
            put_paint(o, k, sb, eb, in_class ? cat[C_MEMBER] : cat[C_SIGNATURE]);
        else if (in_class)
            put_paint(o, k, sb, eb, cat[C_MEMBER]);
        break;
    }
    case R_MEMBER:
        put_paint(o, k, sb, eb, cat[C_MEMBER]);
        break;
    case R_CLASS_ONLY_MEMBER:
        if (in_class) put_paint(o, k, sb, eb, cat[C_MEMBER]);
        break;
    case R_ALIAS: {
        put_paint(o, k, sb, eb, cat[C_TYPEDEF]);
        TSNode name = field(node, fields[FD_NAME]);
        if (!ts_node_is_null(name)) put_name(o, k, N_TYPE, 1, name);
        break;
    }
    case R_TYPEDEF: {
        put_paint(o, k, sb, eb, cat[C_TYPEDEF]);
        if (!fields[FD_DECLARATOR]) break;
        TSTreeCursor c = ts_tree_cursor_new(node);
        if (ts_tree_cursor_goto_first_child(&c)) {
            do {
                if (ts_tree_cursor_current_field_id(&c) != (TSFieldId)fields[FD_DECLARATOR]) continue;
                TSNode name = declarator_identifier(ts_tree_cursor_current_node(&c), fields, flags);
                if (!ts_node_is_null(name)) put_name(o, k, N_TYPE, 0, name);
            } while (ts_tree_cursor_goto_next_sibling(&c));
        }
        ts_tree_cursor_delete(&c);
        break;
    }
    case R_NAMESPACE: {
        put_paint(o, k, sb, eb, cat[C_NAMESPACE]);
        TSNode body = field(node, fields[FD_BODY]);
        if (!ts_node_is_null(body) && ts_node_end_byte(body) - ts_node_start_byte(body) >= 2)
            put_paint(o, k, ts_node_start_byte(body) + 1, ts_node_end_byte(body) - 1, cat[C_OTHER]);
        break;
    }
    default:
        break;
    }
}

/* The rules of the m nodes idx[k] (pre-order indices of megacpp_ts_walk), in order:
 * in_class[k] says whether node k's parent is a class body. Paint intervals go to
 * paint[4 * i ..] as (k, start byte, end byte, category), names to names[5 * i ..] as
 * (k, list: 0 functions / 1 types, keep an empty name, start byte, end byte), each in the
 * Python rule's order. Returns 0 with *npaint and *nnames set; -1 when an index is outside
 * the tree; -2 when cap_paint or cap_names is short (call again with more room). */
EXPORT int64_t megacpp_ts_rules(const TSTree *tree, const uint8_t *src, int64_t nsrc, int64_t m, const int64_t *idx,
                                const uint8_t *in_class, const uint8_t *rule, const uint8_t *flags,
                                const int64_t *fields, const int64_t *cat, int64_t cap_paint, int64_t *paint,
                                int64_t *npaint, int64_t cap_names, int64_t *names, int64_t *nnames) {
    TSNode root = ts_tree_root_node(tree);
    int64_t total = ts_node_descendant_count(root);
    Out o = {paint, names, 0, 0, cap_paint, cap_names, 0};
    TSTreeCursor c = ts_tree_cursor_new(root);
    for (int64_t k = 0; k < m && !o.overflow; k++) {
        if (idx[k] < 0 || idx[k] >= total) {
            ts_tree_cursor_delete(&c);
            return -1;
        }
        ts_tree_cursor_goto_descendant(&c, (uint32_t)idx[k]);
        TSNode node = ts_tree_cursor_current_node(&c);
        rule_of(&o, k, node, rule[ts_node_symbol(node)], in_class[k], src, nsrc, flags, fields, cat);
    }
    ts_tree_cursor_delete(&c);
    if (o.overflow) return -2;
    *npaint = o.npaint;
    *nnames = o.nnames;
    return 0;
}

/* plane[sb:eb] = v for each interval in order (Python slice bounds, clamped to [0, n]). */
EXPORT void megacpp_paint(uint8_t *plane, int64_t n, int64_t k, const int64_t *sb, const int64_t *eb, const int64_t *v) {
    for (int64_t i = 0; i < k; i++) {
        int64_t a = sb[i] < 0 ? 0 : (sb[i] > n ? n : sb[i]);
        int64_t b = eb[i] < 0 ? 0 : (eb[i] > n ? n : eb[i]);
        for (int64_t q = a; q < b; q++) plane[q] = (uint8_t)v[i];
    }
}
