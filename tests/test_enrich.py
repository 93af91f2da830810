"""Stage 6 enrichment (megacpp_core.enrich): units, structure and AST planes, edges, dep_level.

The fixtures under ``tests/fixtures/enrich`` were checked by hand; their chunk lists and
edges are pinned literally below.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from megacpp_core import ast_types, chunk, enrich
from megacpp_core.chunk import StructureCategory as S

FIXTURES = Path(__file__).parent / "fixtures" / "enrich"


def load(name: str) -> str:
    return (FIXTURES / name).read_text()


def whole(name: str, language: str):
    text = load(name)
    fe = enrich.enrich_file(text, language)
    return text, fe, enrich.document_enrichment(fe, 0, len(text))


def named_edges(doc, column: str) -> list[tuple[str, str]]:
    label = lambda i: f"{i}:{doc.chunks[i]['name']}"  # noqa: E731
    return [(label(e["from"]), label(e["to"])) for e in getattr(doc, column)]


# ----------------------------------------------------------------------------- pinned fixtures

def test_shapes_cpp_chunks_edges_levels():
    text, fe, doc = whole("shapes.cpp", "cpp")
    assert [(c["kind"], c["name"], c["dep_level"]) for c in doc.chunks] == [
        ("PREAMBLE", None, 0), ("PREAMBLE", None, 0), ("NAMESPACE", "geo", 0),
        ("CLASS_DECL", "Point", 3), ("CLASS_DECL", "Shape", 2), ("FUNC_SIGNATURE", "scale", 0),
        ("CLASS_DECL", "Circle", 1), ("CLASS_DECL", "Canvas", 1), ("FUNC_BODY", "Canvas::total", 1),
        ("FUNC_BODY", "scale", 2), ("FUNC_BODY", "norm", 3), ("NAMESPACE", "geo", 0), ("FUNC_BODY", "main", 0),
    ]
    # calls by name: Circle::area -> scale; total() -> area (defined in Circle); scale <-> norm;
    # main -> Circle (constructor), Canvas (add), Canvas::total
    assert named_edges(doc, "call_edges") == [
        ("6:Circle", "9:scale"), ("8:Canvas::total", "6:Circle"), ("9:scale", "10:norm"), ("10:norm", "9:scale"),
        ("12:main", "6:Circle"), ("12:main", "7:Canvas"), ("12:main", "8:Canvas::total"),
    ]
    # member Point origin; base class Shape; vector<Circle> member + const Circle& parameter; Point parameter
    assert named_edges(doc, "type_edges") == [
        ("4:Shape", "3:Point"), ("6:Circle", "4:Shape"), ("7:Canvas", "6:Circle"), ("10:norm", "3:Point"),
    ]
    # chunks tile the file in order
    assert doc.chunks[0]["start"] == 0 and doc.chunks[-1]["end"] == len(text)
    assert all(a["end"] == b["start"] for a, b in zip(doc.chunks, doc.chunks[1:]))


def test_ring_c_typedef_names_and_cycle_rule():
    _, _, doc = whole("ring.c", "c")
    assert [(c["kind"], c["name"]) for c in doc.chunks][3:] == [
        ("TYPEDEF", "ring_t"), ("TYPEDEF", "ring_visit"), ("FUNC_BODY", "ring_next"), ("FUNC_BODY", "ring_full"),
        ("FUNC_BODY", "ring_push"), ("FUNC_BODY", "ring_walk"), ("FUNC_SIGNATURE", "is_even"),
        ("FUNC_BODY", "is_odd"), ("FUNC_BODY", "is_even"),
    ]
    assert named_edges(doc, "call_edges") == [
        ("6:ring_full", "5:ring_next"), ("7:ring_push", "5:ring_next"), ("7:ring_push", "6:ring_full"),
        ("8:ring_walk", "5:ring_next"), ("10:is_odd", "11:is_even"), ("11:is_even", "10:is_odd"),
    ]
    assert named_edges(doc, "type_edges") == [
        ("6:ring_full", "3:ring_t"), ("7:ring_push", "3:ring_t"), ("8:ring_walk", "3:ring_t"),
        ("8:ring_walk", "4:ring_visit"),
    ]
    levels = {c["name"]: c["dep_level"] for c in doc.chunks if c["kind"] == "FUNC_BODY"}
    # roots: ring_push and ring_walk; a mutual recursion nothing else calls: first in
    # document order (is_odd) becomes a root at 0, is_even is 1
    assert levels == {"ring_next": 1, "ring_full": 1, "ring_push": 0, "ring_walk": 0, "is_odd": 0, "is_even": 1}


def test_templates_and_nested_namespaces():
    _, _, doc = whole("tmpl.hpp", "header")
    assert [(c["kind"], c["name"]) for c in doc.chunks] == [
        ("PREAMBLE", None), ("PREAMBLE", None), ("NAMESPACE", "util"), ("NAMESPACE", "detail"),
        ("CLASS_DECL", "Node"), ("NAMESPACE", "detail"), ("CLASS_DECL", "Stack"), ("FUNC_BODY", "twice"),
        ("TYPEDEF", "IntStack"), ("FUNC_BODY", "sum_twice"), ("NAMESPACE", "util"),
    ]
    assert named_edges(doc, "call_edges") == [("9:sum_twice", "7:twice")]
    assert named_edges(doc, "type_edges") == [("6:Stack", "4:Node")]


# ----------------------------------------------------------------------------- structure plane

def cats(text: str, fe, needle: str, occurrence: int = 0) -> set[int]:
    at = -1
    for _ in range(occurrence + 1):
        at = text.index(needle, at + 1)
    return {int(v) for v in fe.structure[at:at + len(needle)]}


def test_structure_categories_per_character():
    text, fe, _ = whole("shapes.cpp", "cpp")
    assert len(fe.structure) == len(text) and fe.structure.dtype == np.uint8
    assert cats(text, fe, "#include <cmath>") == {S.PREAMBLE}
    assert cats(text, fe, "// Geometry primitives.") == {S.COMMENT}
    assert cats(text, fe, "namespace geo {") == {S.NAMESPACE}
    assert cats(text, fe, "double x;") == {S.CLASS_MEMBER}
    assert cats(text, fe, "class Canvas {") == {S.CLASS_DECL}
    assert cats(text, fe, "double scale(double v);") == {S.FUNC_SIGNATURE}  # prototype
    assert cats(text, fe, "double scale(double v) ") == {S.FUNC_SIGNATURE}
    assert cats(text, fe, "return v * norm(Point{v, v});") == {S.FUNC_BODY}
    assert cats(text, fe, "void add(const Circle& c) ") == {S.FUNC_SIGNATURE}  # inline method
    assert cats(text, fe, "shapes_.push_back(c);") == {S.FUNC_BODY}
    assert cats(text, fe, "int main() ") == {S.FUNC_SIGNATURE}
    tmpl = load("tmpl.hpp")
    fe2 = enrich.enrich_file(tmpl, "header")
    assert cats(tmpl, fe2, "using IntStack = Stack<int>;") == {S.TYPEDEF}
    assert cats(tmpl, fe2, "#pragma once") == {S.PREAMBLE}


# ----------------------------------------------------------------------------- AST planes

def test_ast_planes_clamp_and_buckets():
    deep = "int f() { return " + "(" * 100 + "1" + ")" * 100 + "; }\n"
    wide = "int a[] = {" + ", ".join(str(i) for i in range(100)) + "};\n"
    text = deep + wide
    fe = enrich.enrich_file(text, "c")
    assert fe.ast_depth.max() == enrich.MAX_DEPTH == 63
    assert fe.sibling_index.max() == 63
    one = deep.index("1")
    assert fe.ast_depth[one] == 63
    plus = "int g(int v) { return v + v; }\n"
    fe = enrich.enrich_file(plus, "cpp")
    assert 50 <= fe.ast_node_type[plus.index("+")] <= 59  # operators
    num = "int h() { return 42; }\n"
    fe = enrich.enrich_file(num, "cpp")
    assert 40 <= fe.ast_node_type[num.index("42")] <= 49  # literals
    assert 30 <= fe.ast_node_type[num.index("int")] <= 39  # types


def test_error_nodes_get_the_error_bucket():
    text = "int f( { return 1; }\n}}}\n@@ $$\n"
    fe = enrich.enrich_file(text, "cpp")
    assert ast_types.ERROR_BUCKET in set(fe.ast_node_type.tolist())
    assert len(fe.structure) == len(text)


def test_non_ascii_planes_are_per_character():
    text = "// héllo wörld ✓\nint f() { return 1; }  // ∑\n"
    fe = enrich.enrich_file(text, "cpp")
    for plane in (fe.structure, fe.ast_depth, fe.sibling_index, fe.ast_node_type):
        assert len(plane) == len(text)
    assert fe.structure[text.index("✓")] == S.COMMENT
    assert fe.structure[text.index("return")] == S.FUNC_BODY


# ----------------------------------------------------------------------------- documents

def test_document_slices_and_clipping():
    text, fe, _ = whole("shapes.cpp", "cpp")
    start, end = text.index("class Circle"), text.index("\ndouble scale(double v) {")
    doc = enrich.document_enrichment(fe, start, end)
    assert doc.chunks[0]["start"] == 0 and doc.chunks[-1]["end"] == end - start
    assert [c["name"] for c in doc.chunks] == ["Circle", "Canvas", "Canvas::total"]
    # scale is outside this document: Circle's call to it has no edge here
    assert named_edges(doc, "call_edges") == [("2:Canvas::total", "0:Circle")]
    for name, plane in doc.planes.items():
        assert len(plane) == end - start, name
    with pytest.raises(ValueError):
        enrich.document_enrichment(fe, 5, 5)
    with pytest.raises(ValueError):
        enrich.document_enrichment(fe, 0, len(text) + 1)


def test_dep_levels_rule():
    assert enrich.dep_levels(0, []) == []
    assert enrich.dep_levels(3, []) == [0, 0, 0]
    assert enrich.dep_levels(4, [(0, 1), (1, 2), (0, 2), (2, 3)]) == [0, 1, 1, 2]
    assert enrich.dep_levels(3, [(0, 1), (1, 0), (2, 2)]) == [0, 1, 0]  # cycle; self edge ignored
    assert enrich.dep_levels(4, [(3, 1), (1, 2), (2, 1)]) == [0, 1, 2, 0]


def test_hostile_inputs_do_not_break_alignment():
    for text, lang in (("", "c"), ("\x00\x01\x02 binary \udcff\n", "cpp"), ("x" * 200_000 + "\n", "cpp"),
                       ("}}}}{{{{\n" * 50, "c"), ("#define A(x) x\n" * 10, "header")):
        fe = enrich.enrich_file(text, lang)
        assert len(fe.structure) == len(text)
        assert sum(u.end - u.start for u in fe.units) == len(text)
        if text:
            doc = enrich.document_enrichment(fe, 0, len(text))
            assert all(0 <= c["start"] < c["end"] <= len(text) for c in doc.chunks)


def test_parsed_source_is_shared_and_checked():
    text = load("ring.c")
    parsed = chunk.parse_source(text, "c")
    a = enrich.enrich_file(text, "c", parsed)
    b = enrich.enrich_file(text, "c")
    assert a.structure.tobytes() == b.structure.tobytes() and a.ast_node_type.tobytes() == b.ast_node_type.tobytes()
    with pytest.raises(ValueError):
        enrich.enrich_file(text + " ", "c", parsed)


def test_using_and_static_assert_are_members_only_inside_classes():
    text = ("using namespace std;\nusing std::vector;\nstatic_assert(sizeof(int) == 4, \"x\");\n"
            "class K {\n  using T = int;\n  using Base::f;\n  static_assert(true, \"y\");\n};\n"
            "int (*fp)(int);\nint proto(int);\n")
    fe = enrich.enrich_file(text, "cpp")
    assert cats(text, fe, "using namespace std;") == {S.OTHER}
    assert cats(text, fe, "using std::vector;") == {S.OTHER}
    assert cats(text, fe, "static_assert(sizeof(int) == 4, \"x\");") == {S.OTHER}
    assert cats(text, fe, "using Base::f;") == {S.CLASS_MEMBER}
    assert cats(text, fe, "static_assert(true, \"y\");") == {S.CLASS_MEMBER}
    assert cats(text, fe, "int (*fp)(int);") == {S.OTHER}  # a function pointer is not a prototype
    assert cats(text, fe, "int proto(int);") == {S.FUNC_SIGNATURE}
    kinds = {u.name: u.kind for u in fe.units}
    assert kinds.get("proto") == "FUNC_SIGNATURE" and "fp" not in kinds


def test_deep_else_if_ladder():
    n = 3000  # nests about 2n deep: the ancestor walk must not revisit every character per level
    text = "int f(int x) {\n" + "".join(f"  {'else ' if i else ''}if (x == {i}) return {i};\n" for i in range(n)) + "  return -1;\n}\n"
    fe = enrich.enrich_file(text, "cpp")
    assert fe.ast_depth.max() == 63 and len(fe.ast_node_type) == len(text)
    assert fe.structure[text.index("return -1")] == S.FUNC_BODY


def _innermost_by_painting(parsed):
    """Reference of the AST planes: every node paints its bytes in pre-order (an inner node
    over its ancestors); a character takes its first byte's node."""
    nodes = []
    c = parsed.tree.walk()
    depth = 0
    while True:
        nodes.append((c.node, depth))
        if c.goto_first_child():
            depth += 1
            continue
        while not c.goto_next_sibling():
            if not c.goto_parent():
                break
            depth -= 1
        else:
            continue
        break
    owner = np.full(len(parsed.src), -1, dtype=np.int64)
    sibs = []
    for i, (node, _) in enumerate(nodes):
        owner[node.start_byte:node.end_byte] = i
        parent = node.parent
        sibs.append(0 if parent is None else [ch.id for ch in parent.children].index(node.id))
    text = parsed.text
    char_bytes = np.asarray([len(text[:k].encode("utf-8", "surrogatepass")) for k in range(len(text))], dtype=np.int64)
    o = owner[char_bytes] if len(text) else owner[:0]
    table = ast_types.bucket_table(parsed.grammar)
    depth = np.asarray([min(nodes[k][1], 63) if k >= 0 else 0 for k in o], dtype=np.uint8)
    sib = np.asarray([min(sibs[k], 63) if k >= 0 else 0 for k in o], dtype=np.uint8)
    typ = np.asarray([(table[nodes[k][0].kind_id] if nodes[k][0].kind_id < len(table) else ast_types.ERROR_BUCKET)
                      if k >= 0 else 0 for k in o], dtype=np.uint8)
    return depth, sib, typ


@pytest.mark.parametrize("name,text,lang", [
    ("directives", "/* c */\n#pragma once\n\n#include <a.h>\n\n\n#define X 1\n\nint x;\n  \n", "cpp"),
    ("blocks", "#if A\nint a;\n#else\nint b;\n#endif\n\nstruct S {\n  int m;  \n\n};\n", "c"),
    ("broken", "MACRO(x) { int a = 1;\n  if (a) { b(); }\n\n  ", "cpp"),
    ("unicode", "// ü ✓\nint ß(int a) {\n\treturn a; // é\n}\n\n", "cpp"),
    *[(p.name, p.read_text(), "c" if p.suffix == ".c" else "cpp") for p in sorted(FIXTURES.glob("*")) if p.is_file()],
])
def test_ast_planes_equal_painting_every_node(name, text, lang):
    parsed = chunk.parse_source(text, lang)
    fe = enrich.enrich_file(text, lang, parsed)
    depth, sib, typ = _innermost_by_painting(parsed)
    assert np.array_equal(fe.ast_depth, depth), name
    assert np.array_equal(fe.sibling_index, sib), name
    assert np.array_equal(fe.ast_node_type, typ), name


@pytest.mark.parametrize("lang", ["c", "cpp"])
def test_walk_finds_error_nodes_as_the_query_does(lang):
    texts = ["}}}}", ")(", "#if\n", "\x00\x01", "int", "int x = ;", "a b c d e f", "@@@", "class { {", 'R"x(',
             "/*", '"abc', "template<", "# 1 2 3\n)))", "int f() { return 1 }", "MACRO(x) { int a;\n", "int a;\n"]
    for text in texts:
        by_query = chunk.parse_source(text, lang).has_error_nodes
        parsed = chunk.parse_source(text, lang)
        enrich.enrich_file(text, lang, parsed)  # sets has_error_nodes from its walk
        assert parsed.has_error_nodes == by_query, text


# ----------------------------------------------------------------------------- documents of a file
def _reference_document_edges(fe, start: int, end: int) -> tuple[list[dict], list[dict]]:
    """The call and type edges of ``document_enrichment`` as first written: every item of
    every overlapping unit checked against the document's span, one by one."""
    picked = [u for u in fe.units if not (u.end <= start or u.start >= end)]
    fn_at: dict[str, list[int]] = {}
    ty_at: dict[str, list[int]] = {}
    for i, u in enumerate(picked):
        for p, name in u.defines:
            if start <= p < end:
                fn_at.setdefault(name, []).append(i)
        for p, name in u.types:
            if start <= p < end:
                ty_at.setdefault(name, []).append(i)
    calls, types = set(), set()
    for i, u in enumerate(picked):
        for p, name in u.calls:
            if start <= p < end:
                calls.update((i, j) for j in fn_at.get(name, ()) if j != i)
        for p, name in u.uses:
            if start <= p < end:
                types.update((i, j) for j in ty_at.get(name, ()) if j != i)
    return ([{"from": a, "to": b} for a, b in sorted(calls)], [{"from": a, "to": b} for a, b in sorted(types)])


def _assert_units_hold_their_items(fe, text: str, label: str) -> None:
    """The units tile the text and each unit's definitions, calls and uses lie in it: what
    lets ``document_enrichment`` check only the units a document cuts."""
    assert [u.start for u in fe.units[1:]] == [u.end for u in fe.units[:-1]], label
    if text:
        assert fe.units[0].start == 0 and fe.units[-1].end == len(text), label
    for u in fe.units:
        for items in (u.defines, u.types, u.calls, u.uses):
            assert all(u.start <= p < u.end for p, _ in items), (label, u.start, u.end, items[:3])


def _assert_documents_match_reference(fe, text: str, label: str, rng: np.random.Generator, spans: int = 40) -> None:
    n = len(text)
    cuts = [(0, n)] + [(u.start, u.end) for u in fe.units]
    for _ in range(spans):
        a, b = sorted(int(x) for x in rng.integers(0, n + 1, size=2))
        if a < b:
            cuts.append((a, b))
    for a, b in cuts:
        doc = enrich.document_enrichment(fe, a, b)
        assert (doc.call_edges, doc.type_edges) == _reference_document_edges(fe, a, b), (label, a, b)


HOSTILE_DOCUMENTS = [
    ("calls across units", "int f(void);\nint g(void) { return f(); }\nint f(void) { return g() + h(); }\n"
                           "struct T { int x; };\nstruct T t; int h(void) { struct T u; return f(); }\n", "c"),
    ("namespaces", "namespace a { struct S {}; void f() { S s; g(); } }\nnamespace b { void g() { a::f(); } }\n", "cpp"),
    ("one long line", "int f(){return 1;} " * 300 + "\n", "c"),
    ("broken", "MACRO(x) { int a = f(1);\n  if (a) { b(); }\n\n  int f(int q) { return q; }", "cpp"),
    ("unicode", "// ü ✓\nint ß(int a) {\n\treturn ß(a); // é\n}\nint \udcff(void) { return ß(1); }\n", "cpp"),
    ("binary", "\x00\x01 int f(){ f(); }\x02\n" * 20, "c"),
]


@pytest.mark.parametrize("label,text,lang", [
    *HOSTILE_DOCUMENTS,
    *[(p.name, p.read_text(), "c" if p.suffix == ".c" else "cpp") for p in sorted(FIXTURES.glob("*")) if p.is_file()],
])
def test_document_edges_equal_checking_every_item(label, text, lang):
    fe = enrich.enrich_file(text, lang)
    _assert_units_hold_their_items(fe, text, label)
    _assert_documents_match_reference(fe, text, label, np.random.default_rng(7))


def test_document_edges_equal_checking_every_item_on_real_files(tiny_run):
    """Every kept file of the real ``tiny`` sdists, whole, unit by unit and in random spans."""
    from megacpp_core.layout import SnapshotLayout

    root, _ = tiny_run
    kept = SnapshotLayout(root, "tiny").kept_files(["path", "language", "text"]).to_pydict()
    rng = np.random.default_rng(11)
    edges = 0
    for path, lang, text in zip(kept["path"], kept["language"], kept["text"]):
        if not text:
            continue
        fe = enrich.enrich_file(text, lang)
        _assert_units_hold_their_items(fe, text, path)
        _assert_documents_match_reference(fe, text, path, rng, spans=8)
        doc = enrich.document_enrichment(fe, 0, len(text))
        edges += len(doc.call_edges) + len(doc.type_edges)
    assert edges > 0  # the real files do have edges to compare


def test_an_item_at_the_files_end_counts_as_outside_every_document():
    """A zero-width item at the file's very end (a MISSING name at end of file) sits in the
    last unit but outside every document ``[start, end)``, as the item-by-item rule says:
    the last unit's items are always checked. Built by hand: no parse seen here makes one."""
    text = "int f(void);\nint g(void) { return f(); }\n"
    fe = enrich.enrich_file(text, "c")
    n = len(text)
    last = fe.units[-1]
    last.uses.append((n, "T"))
    fe.units[0].types.append((fe.units[0].start, "T"))
    for a, b in [(0, n), (last.start, n), (0, last.end)]:
        doc = enrich.document_enrichment(fe, a, b)
        assert (doc.call_edges, doc.type_edges) == _reference_document_edges(fe, a, b), (a, b)
    assert enrich.document_enrichment(fe, 0, n).type_edges == []
