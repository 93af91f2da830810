/* The brace-balanced splitter's lexer (stage 6, megacpp_core/brace_split.py) in C.
 *
 * Compiled into the same library as tswalk.c by `python -m megacpp_core.native.build` and
 * called through ctypes by megacpp_core/native/tswalk.py (brace_cuts). It follows the
 * Python regex _BRACE_LEX of brace_split.py exactly (re.finditer over a str, leftmost
 * match at each position, the alternatives' first characters are disjoint):
 *
 *   R"delim( ... )delim"   delim: 0..16 characters, none of ( ) \ " nor whitespace
 *   "..."  '...'           a backslash takes the next character unless it is \n;
 *                          an unescaped \n or the end before the closing quote: no match
 *   // ...                 to the line end; a backslash before \n or \r\n continues it
 *   / * ... * /            to the first closing * /; none: no match
 *   ^[ \t]*#...            at a line start only, to the line end as a // comment
 *   { } ;
 *
 * A position where nothing matches is skipped. "Whitespace" is Python's str.isspace
 * (the \s of a str pattern).
 */
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))

/* Python's Py_UNICODE_ISSPACE: the characters of str.isspace(). */
static int is_space(uint32_t c) {
    if (c < 128) return c == ' ' || (c >= 9 && c <= 13) || (c >= 28 && c <= 31);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* End of (?:\\\r?\n|[^\n])* from q: the rest of a line with its continuations. */
static int64_t line_rest(const uint32_t *t, int64_t q, int64_t n) {
    while (q < n) {
        uint32_t c = t[q];
        if (c == '\\' && q + 1 < n && t[q + 1] == '\n') {
            q += 2;
        } else if (c == '\\' && q + 2 < n && t[q + 1] == '\r' && t[q + 2] == '\n') {
            q += 3;
        } else if (c == '\n') {
            break;
        } else {
            q++;
        }
    }
    return q;
}

/* End of the quoted literal opened by t[p] (quote qc), or -1 when it does not close. */
static int64_t quoted(const uint32_t *t, int64_t p, int64_t n, uint32_t qc) {
    for (int64_t q = p + 1; q < n;) {
        uint32_t c = t[q];
        if (c == '\\') {
            if (q + 1 < n && t[q + 1] != '\n') {
                q += 2;
                continue;
            }
            return -1;
        }
        if (c == qc) return q + 1;
        if (c == '\n') return -1;
        q++;
    }
    return -1;
}

/* End of the raw string literal R"delim(...)delim" at p, or -1. */
static int64_t raw_string(const uint32_t *t, int64_t p, int64_t n) {
    int64_t d = p + 2, k = 0;
    while (d + k < n && k <= 16) {
        uint32_t c = t[d + k];
        if (c == '(' || c == ')' || c == '\\' || c == '"' || is_space(c)) break;
        k++;
    }
    if (k > 16 || d + k >= n || t[d + k] != '(') return -1;
    for (int64_t q = d + k + 1; q + k + 1 < n; q++) {
        if (t[q] != ')' || t[q + k + 1] != '"') continue;
        int64_t i = 0;
        while (i < k && t[q + 1 + i] == t[d + i]) i++;
        if (i == k) return q + k + 2;
    }
    return -1;
}

/* End of the block comment at p, or -1 when it does not close. */
static int64_t block_comment(const uint32_t *t, int64_t p, int64_t n) {
    for (int64_t q = p + 2; q + 1 < n; q++)
        if (t[q] == '*' && t[q + 1] == '/') return q + 2;
    return -1;
}

/* The unit ends of brace_split.brace_cuts over t[0:n] (the code points of text[lo:hi]),
 * as offsets into t: after each ; or } that leaves the depth at `level`, and each
 * preprocessor line at that depth, the cut falls after the rest of its line; cuts are
 * strictly increasing and inside (0, n). `line_start`: whether a line starts at t[0]
 * (text[lo - 1] is \n, or lo is 0). Writes at most `cap` cuts to out; returns their
 * number, or -1 when `cap` is short (there are never more cuts than \n in t). */
EXPORT int64_t megacpp_brace_cuts(const uint32_t *t, int64_t n, int64_t line_start, int64_t level,
                                  int64_t *out, int64_t cap) {
    int64_t p = 0, depth = 0, count = 0, last = 0, nl_from = 0, nl_at = -1;
    while (p < n) {
        uint32_t c = t[p];
        int64_t end = -1;
        int cuts_here = 0; /* 1: a ; or }, 2: a preprocessor line */
        if (c == '{') {
            depth++;
            p++;
            continue;
        } else if (c == '}' || c == ';') {
            if (c == '}') depth = depth > 0 ? depth - 1 : 0;
            end = p + 1;
            cuts_here = 1;
        } else if (c == 'R' && p + 1 < n && t[p + 1] == '"') {
            end = raw_string(t, p, n);
        } else if (c == '"' || c == '\'') {
            end = quoted(t, p, n, c);
        } else if (c == '/' && p + 1 < n && t[p + 1] == '/') {
            end = line_rest(t, p + 2, n);
        } else if (c == '/' && p + 1 < n && t[p + 1] == '*') {
            end = block_comment(t, p, n);
        } else if ((c == ' ' || c == '\t' || c == '#') && (p == 0 ? line_start : t[p - 1] == '\n')) {
            int64_t q = p;
            while (q < n && (t[q] == ' ' || t[q] == '\t')) q++;
            if (q < n && t[q] == '#') {
                end = line_rest(t, q + 1, n);
                cuts_here = 2;
            }
        }
        if (end < 0) {
            p++;
            continue;
        }
        p = end;
        if (!cuts_here || depth != level) continue;
        if (nl_at < 0 || end < nl_from || end > nl_at) { /* the first \n at or after end */
            nl_from = end;
            nl_at = end;
            while (nl_at < n && t[nl_at] != '\n') nl_at++;
        }
        int64_t cut = nl_at < n ? nl_at + 1 : n;
        if (last < cut && cut < n) {
            if (count >= cap) return -1;
            out[count++] = cut;
            last = cut;
        }
    }
    return count;
}
