"""The versioned node-type -> ast_node_type bucket map: coverage of both grammars, SPEC
ranges, table == per-name lookup on parsed nodes, ERROR/MISSING, refusal of bad maps,
determinism and the pinned digest."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tree_sitter
import tree_sitter_c
import tree_sitter_cpp

from megacpp_core import ast_types as A

MAP_FILE = Path(A.__file__).parent / "data" / "ast_node_types" / "v1.json"

CPP_SNIPPET = r'''
#include <vector>
#include "local/config.h"
#define SQUARE(x) ((x) * (x))
#define LIMIT 64
#if defined(USE_FAST) && LIMIT > 10
#  define FAST 1
#elif LIMIT
#  define FAST 0
#else
#  error "no limit"
#endif
#ifdef __GNUC__
#pragma once
#endif

namespace engine::detail {
namespace fs = std::filesystem;
using Index = std::size_t;
typedef unsigned long long u64;
extern "C" int c_entry(int);

template <typename T, typename... Rest, int N = 4, template <class> class Box = std::vector>
concept Small = sizeof(T) <= N && requires(T t) { { t.size() } -> std::same_as<Index>; typename T::value_type; t.clear(); };

enum class Color : unsigned char { Red = 1, Green, Blue = Red << 2 };

struct [[nodiscard]] Point { int x : 4; int y; mutable float w = 0.5f; };
union Bits { unsigned u; float f; };

class Widget final : public Base, private virtual Other {
public:
    explicit Widget(int n) noexcept : n_{n}, data_(n) {}
    Widget(const Widget&) = default;
    Widget& operator=(Widget&&) = delete;
    virtual ~Widget() override = default;
    virtual void draw() const = 0;
    operator bool() const { return n_ != 0; }
    auto size() const -> Index { return data_.size(); }
    static constexpr int kMax = 1 << 10;
    friend class Inspector;
    template <class U> U as() const & { return static_cast<U>(n_); }
protected:
    int n_;
private:
    std::vector<double> data_;
};

static_assert(sizeof(Point) == 8, "layout");

template <class... Ts>
auto sum(Ts... ts) { return (ts + ... + 0); }

int run(int argc, char** argv) try {
    Widget w{3};
    Point p = {.x = 1, .y = 2};
    auto [a, b] = std::pair{1, 2.0};
    int arr[4] = {0};
    int* ptr = &arr[1];
    int& ref = *ptr;
    for (int i = 0, j = 10; i < j; ++i, --j) { arr[i % 4] += i; continue; }
    for (auto& v : arr) v <<= 1;
    while (argc-- > 0) { if (argc == 2) break; else if (!argv) goto done; }
    do { ref ^= 0x1F; } while (false);
    switch (argc) { case 0: [[fallthrough]]; case 1: ref |= 1; break; default: ref = -1; }
    auto lam = [&, ptr](int k) mutable -> int { return k * *ptr; };
    decltype(lam(1)) r = argc > 1 ? lam(2) : lam(3);
    const char* s = "hi\n" "there";
    const char* raw = R"xy(raw "text")xy";
    char c = 'c'; wchar_t wc = L'w';
    auto q = new int[4]; delete[] q;
    w.draw(); x = p.*pm;
    long long big = 123'456ULL; double d = 1.5e-3; auto ud = 12_km;
    bool flag = true && !false || nullptr == ptr;
    r = static_cast<int>(d) + (int)d + sizeof d + alignof(double);
    throw std::runtime_error("boom");
done:
    co_return;
} catch (const std::exception& e) {
    return 1;
} catch (...) {
    throw;
}
}  // namespace engine::detail
/* block comment */
'''

C_SNIPPET = r'''
#include <stdio.h>
#include <stdint.h>
#define MAX(a, b) ((a) > (b) ? (a) : (b))

typedef struct node { struct node *next; int value; unsigned flags : 3; } node_t;
enum state { IDLE, BUSY = 4 };
static const volatile int counter = 0;
extern _Atomic long ticks;
register int r;
static inline int __attribute__((always_inline)) add(int a, int b) { return a + b; }

int sum(const int *restrict xs, size_t n, ...) {
    int s = 0;
    for (size_t i = 0; i < n; i++) s += xs[i];
    struct point { int x, y; } p = { .x = 1, .y = 2 }, q = { [0] = 3 };
    int arr[] = { [2] = 5, [0 ... 1] = 1 };
    node_t *head = NULL, *cur = &(node_t){ .value = 1 };
    while (cur != NULL) { cur = cur->next; }
    if (n > 3 && !(s & 0xff)) s >>= 1; else s = ~s;
    switch (s % 3) { case 0: s -= 1; break; default: break; }
    do { s--; } while (s > 100);
    __asm__ volatile ("nop" : "=r"(s) : "r"(n) : "memory");
    char c = '\n'; const char *str = u8"utf" "8";
    long v = _Generic(s, int: 1, default: 0);
    size_t al = _Alignof(double) + sizeof(int) + offsetof(node_t, value);
    goto out;
out:
    return s ? s : MAX(s, 1);  // trailing comment
}
'''

BROKEN_CPP = "int f( { return 1 + ; }\nclass X { int y }\nvoid g() { if (x) { }\n"


def _parser(grammar: str) -> tree_sitter.Parser:
    mod = tree_sitter_c if grammar == "c" else tree_sitter_cpp
    return tree_sitter.Parser(tree_sitter.Language(mod.language()))


def _walk(node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def _parse(grammar: str, src: str):
    return _parser(grammar).parse(src.encode("utf-8")).root_node


def _write_map(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "v1.json"
    p.write_text(json.dumps(data), encoding="utf-8")
    return p


@pytest.fixture()
def raw_map() -> dict:
    return json.loads(MAP_FILE.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- coverage


@pytest.mark.parametrize("grammar", A.GRAMMARS)
def test_every_kind_of_both_grammars_resolves(grammar):
    rows = A.resolve_grammar(grammar)
    lang = tree_sitter.Language((tree_sitter_c if grammar == "c" else tree_sitter_cpp).language())
    assert len(rows) == lang.node_kind_count and [r[0] for r in rows] == list(range(lang.node_kind_count))
    bad = []
    for kid, name, named, visible, bucket, source in rows:
        ok = 0 <= bucket <= 255 and source != "default"
        if visible:
            ok = ok and bucket != A.UNKNOWN_BUCKET and source != "unmapped_ok"
        if source == "unmapped_ok":
            # deliberately unmapped kinds are hidden symbols, never nodes of a tree
            ok = ok and not visible and bucket == A.UNKNOWN_BUCKET
        if not ok:
            bad.append((kid, name, "named" if named else "anonymous", "visible" if visible else "hidden", bucket, source))
    assert not bad, f"{grammar}: {len(bad)} node kinds not mapped:\n" + "\n".join(map(repr, bad))
    counts = {s: sum(1 for r in rows if r[5].split()[0] == s) for s in ("explicit", "rule", "unmapped_ok", "default")}
    print(f"{grammar}: {len(rows)} kinds, {sum(r[3] for r in rows)} visible, {counts}")
    assert counts["explicit"] > 0 and counts["rule"] > 0 and counts["default"] == 0


@pytest.mark.parametrize("grammar", A.GRAMMARS)
def test_table_shape_dtype_and_ids(grammar):
    table = A.bucket_table(grammar)
    lang = tree_sitter.Language((tree_sitter_c if grammar == "c" else tree_sitter_cpp).language())
    assert table.dtype == np.uint8 and table.shape == (lang.node_kind_count,)
    assert not table.flags.writeable
    assert A.bucket_table(grammar) is table  # cached per process
    names = A.bucket_names()
    for i in range(lang.node_kind_count):
        assert table[i] == A.bucket_of(lang.node_kind_for_id(i), lang.node_kind_is_named(i))
        assert int(table[i]) in names


def test_unknown_grammar_refused():
    with pytest.raises(ValueError, match="unknown grammar"):
        A.bucket_table("rust")


# --------------------------------------------------------------------------- SPEC ranges


SPEC_RANGES = {"declarations": (1, 9), "statements": (10, 19), "expressions": (20, 29), "types": (30, 39),
               "literals": (40, 49), "operators": (50, 59)}


def test_declared_ranges_match_spec():
    m = A.load_map()
    ranges = {n: (lo, hi) for n, lo, hi in m.ranges}
    for name, span in SPEC_RANGES.items():
        assert ranges[name] == span
    assert ranges["unknown"] == (0, 0) and m.default == A.UNKNOWN_BUCKET == 0
    assert m.error_bucket == A.ERROR_BUCKET == 250 and m.missing_bucket == A.MISSING_BUCKET == 251
    assert m.range_of(250) == m.range_of(251) == "errors"
    assert A.bucket_names()[0] == "unknown"


@pytest.mark.parametrize("kind,named,category", [
    ("function_definition", True, "declarations"),
    ("declaration", True, "declarations"),
    ("class_specifier", True, "declarations"),
    ("enum_specifier", True, "declarations"),
    ("namespace_definition", True, "declarations"),
    ("type_definition", True, "declarations"),
    ("field_declaration", True, "declarations"),
    ("parameter_declaration", True, "declarations"),
    ("if_statement", True, "statements"),
    ("for_range_loop", True, "statements"),
    ("return_statement", True, "statements"),
    ("if", False, "statements"),
    ("while", False, "statements"),
    ("return", False, "statements"),
    ("call_expression", True, "expressions"),
    ("lambda_expression", True, "expressions"),
    ("fold_expression", True, "expressions"),
    ("primitive_type", True, "types"),
    ("type_identifier", True, "types"),
    ("sized_type_specifier", True, "types"),
    ("number_literal", True, "literals"),
    ("string_literal", True, "literals"),
    ("raw_string_literal", True, "literals"),
    ("char_literal", True, "literals"),
    ("true", True, "literals"),
    ("+", False, "operators"),
    ("<<", False, "operators"),
    ("<<=", False, "operators"),
    ("->", False, "operators"),
    ("::", False, "operators"),
    ("preproc_include", True, "preprocessor"),
    ("#ifdef", False, "preprocessor"),
    ("comment", True, "comments"),
    ("identifier", True, "identifiers"),
    ("field_identifier", True, "identifiers"),
    ("(", False, "punctuation"),
    ("{", False, "punctuation"),
    (";", False, "punctuation"),
    (",", False, "punctuation"),
    ("template_declaration", True, "templates"),
    ("type_qualifier", True, "specifiers"),
    ("attribute_specifier", True, "specifiers"),
    ("gnu_asm_expression", True, "extensions"),
    ("ms_call_modifier", True, "extensions"),
    ("pointer_declarator", True, "declarators"),
    ("initializer_list", True, "initializers"),
    ("ERROR", True, "errors"),
])
def test_representative_kinds_land_in_their_range(kind, named, category):
    m = A.load_map()
    assert m.range_of(A.bucket_of(kind, named)) == category, (kind, A.bucket_of(kind, named))


def test_operator_classes_and_sub_buckets():
    b = A.bucket_of
    names = A.bucket_names()
    assert names[b("function_definition", True)] == "declaration.function_definition"
    assert b("if_statement", True) == b("if", False) == b("else_clause", True)
    assert b("while_statement", True) == b("for_statement", True) == b("do", False)
    assert b("break", False) == b("continue_statement", True) == b("goto", False)
    assert len({b(op, False) for op in ("+", "==", "&&", "<<", "+=", "++", "->", "::")}) == 8
    assert b("<<", False) == b("&", False) == b("bitand", False)
    assert b("=", False) == b("<<=", False) == b("and_eq", False)
    assert b("&&", False) == b("and", False) == b("!", False)
    assert b(".", False) == b("->", False) == b("->*", False)
    assert b("(", False) != b("{", False) != b(";", False) != b(",", False)
    # same name, different kind: keyword token vs named node
    assert b("decltype", True) == b("decltype", False)
    assert b("auto", True) != b("auto", False)  # C++ placeholder type vs C storage class
    # unknown names fall back to the default instead of raising; rules catch new families
    assert b("no_such_node_kind_xyz", True) == 0
    assert b("frobnicate_expression", True) == b("parenthesized_expression", True)
    assert b("frobnicate_declaration", True) == b("friend_declaration", True)
    assert A.load_map().resolve("frobnicate_statement", True)[1].startswith("rule")


# --------------------------------------------------------------------------- parsed nodes


@pytest.mark.parametrize("grammar,src", [("cpp", CPP_SNIPPET), ("c", C_SNIPPET)])
def test_table_lookup_equals_name_lookup_on_parsed_nodes(grammar, src):
    root = _parse(grammar, src)
    assert not root.has_error, "snippet should parse cleanly"
    table = A.bucket_table(grammar)
    seen_types, aliased = set(), 0
    n = 0
    for node in _walk(root):
        n += 1
        assert node.kind_id < len(table), (node.type, node.kind_id)
        expect = A.bucket_of(node.type, node.is_named)
        assert table[node.kind_id] == expect, (node.type, node.is_named, node.kind_id)
        assert A.bucket_for_node(node, table) == expect
        if node.is_named or node.type.strip():
            assert expect != 0, f"parsed node {node.type!r} mapped to the unknown bucket"
        seen_types.add(node.type)
        aliased += node.kind_id != node.grammar_id
    assert n > 300 and aliased > 0  # alias ids (e.g. type_identifier over identifier) were exercised
    m = A.load_map()
    seen_ranges = {m.range_of(A.bucket_of(t, True)) for t in seen_types} | {
        m.range_of(A.bucket_of(t, False)) for t in seen_types}
    for category in SPEC_RANGES:
        assert category in seen_ranges


def test_error_and_missing_nodes():
    root = _parse("cpp", BROKEN_CPP)
    table = A.bucket_table("cpp")
    errors = missing = 0
    for node in _walk(root):
        if node.type == "ERROR":
            errors += 1
            assert node.is_error and node.kind_id >= len(table)
            assert A.bucket_for_node(node, table) == A.ERROR_BUCKET
            assert A.bucket_of(node.type, node.is_named) == A.ERROR_BUCKET
        elif node.is_missing:
            missing += 1
            assert A.bucket_for_node(node, table) == A.MISSING_BUCKET
            assert table[node.kind_id] == A.bucket_of(node.type, node.is_named)  # the token it stands for
        else:
            assert A.bucket_for_node(node, table) == table[node.kind_id] == A.bucket_of(node.type, node.is_named)
    assert errors > 0 and missing > 0


# --------------------------------------------------------------------------- refusal


def test_valid_copy_loads_from_path(tmp_path, raw_map):
    m = A.load_map(path=_write_map(tmp_path, raw_map))
    ref = A.load_map()
    assert m.explicit == ref.explicit and m.ranges == ref.ranges and len(m.rules) == len(ref.rules)


def _corrupt_bucket_300(d):
    d["buckets"][1]["id"] = 300


def _corrupt_named_300(d):
    d["rules"][0]["bucket"] = 300


def _corrupt_overlap(d):
    d["ranges"][2]["lo"] = 5  # statements 5..19 overlaps declarations 1..9


def _corrupt_rule_outside(d):
    d["rules"].append({"suffix": "_thing", "named": True, "bucket": 75})  # 72..79 is no range


def _corrupt_rule_undeclared(d):
    d["rules"].append({"suffix": "_thing", "named": True, "bucket": 38})  # in types, not declared


def _corrupt_bucket_outside(d):
    d["buckets"].append({"id": 200, "name": "nowhere", "named": ["x_kind"], "anonymous": []})


def _corrupt_duplicate_kind(d):
    d["buckets"][2]["named"].append("function_definition")


def _corrupt_bool_id(d):
    d["default"] = False


def _corrupt_bad_regex(d):
    d["rules"].insert(0, {"regex": "([", "named": None, "bucket": 9})


def _corrupt_two_matchers(d):
    d["rules"][0]["prefix"] = "x"


def _corrupt_version(d):
    d["version"] = "v2"


def _corrupt_lo_gt_hi(d):
    d["ranges"][1]["lo"], d["ranges"][1]["hi"] = 9, 1


@pytest.mark.parametrize("corrupt,message", [
    (_corrupt_bucket_300, r"bucket 300 outside 0\.\.255"),
    (_corrupt_named_300, r"rules\[0\].*bucket 300 outside 0\.\.255"),
    (_corrupt_overlap, r"ranges 'declarations' \[1\.\.9\] and 'statements' \[5\.\.19\] overlap"),
    (_corrupt_rule_outside, r"rules\[\d+\] \(suffix '_thing'\): bucket 75 is not inside any declared range"),
    (_corrupt_rule_undeclared, r"bucket 38 is not declared"),
    (_corrupt_bucket_outside, r"bucket 200 is not inside any declared range"),
    (_corrupt_duplicate_kind, r"named kind 'function_definition' already mapped to bucket 1"),
    (_corrupt_bool_id, r"default: bucket id False is not an integer"),
    (_corrupt_bad_regex, r"bad regex"),
    (_corrupt_two_matchers, r"exactly one of prefix/suffix/regex"),
    (_corrupt_version, r"version 'v2', expected 'v1'"),
    (_corrupt_lo_gt_hi, r"lo 9 > hi 1"),
])
def test_corrupted_map_is_refused(tmp_path, raw_map, corrupt, message):
    data = copy.deepcopy(raw_map)
    corrupt(data)
    with pytest.raises(ValueError, match=message):
        A.load_map(path=_write_map(tmp_path, data))


def test_not_json_and_missing_file_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid UTF-8 JSON"):
        A.load_map(path=bad)
    with pytest.raises(ValueError, match="not readable"):
        A.load_map(path=tmp_path / "absent.json")
    with pytest.raises(ValueError, match="not of the form"):
        A.load_map(version="../v1")


def test_changed_packaged_map_refused(monkeypatch):
    monkeypatch.setitem(A.NODE_TYPE_MAP_SHA256, "v1", "0" * 64)
    A._load.cache_clear()
    try:
        with pytest.raises(ValueError, match="changed .*bucket ids must not move"):
            A.load_map()
    finally:
        monkeypatch.undo()
        A._load.cache_clear()
    assert A.load_map().version == "v1"


# --------------------------------------------------------------------------- determinism


def test_map_sha256_pinned_and_stable():
    digest = hashlib.sha256(MAP_FILE.read_bytes()).hexdigest()
    assert A.map_sha256() == A.map_sha256() == digest == A.NODE_TYPE_MAP_SHA256[A.NODE_TYPE_MAP_VERSION]
    assert A.load_map().sha256 == digest
    assert A.NODE_TYPE_MAP_VERSION == "v1"


def test_tables_deterministic_across_processes():
    code = ("import hashlib; from megacpp_core import ast_types as A; "
            "print(A.map_sha256(), *(hashlib.sha256(A.bucket_table(g).tobytes()).hexdigest() for g in A.GRAMMARS))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
            for _ in range(2)}
    here = " ".join([A.map_sha256(), *(hashlib.sha256(A.bucket_table(g).tobytes()).hexdigest() for g in A.GRAMMARS)])
    assert outs == {here}


def test_module_has_no_dagster_import():
    code = "import sys; import megacpp_core.ast_types; print('dagster' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
