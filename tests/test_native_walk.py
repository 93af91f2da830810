"""The native tree walk (megacpp_core.native): built by ``make install``, and the same
arrays, planes and records as the Python walk on real sdist files and on hostile input."""

from __future__ import annotations

import ctypes
import warnings

import numpy as np
import pytest

from megacpp_core import callees, chunk, enrich, tree_arrays
from megacpp_core.layout import SnapshotLayout
from megacpp_core.native import build, tswalk

ARRAYS = ("starts", "ends", "parents", "kind_ids", "depths", "sibs")
RECORDS = ("paint", "calls", "uses", "fn_defs", "type_defs", "has_error")
PLANES = ("structure", "ast_depth", "sibling_index", "ast_node_type")

HOSTILE = [
    "", "\n", "}}}}", ")(", "#if\n", "\x00\x01\x02\xff", "int", "int x = ;", "@@@", "class { {", 'R"x(', "/*",
    "template<", "int f() { return 1 }", "MACRO(x) { int a;\n",
    "int x = 1; // \udcff\udcfe lone surrogates of invalid UTF-8\n",  # surrogateescape'd bytes
    "// ü ✓ é\nint ß(int a) {\n\treturn a;\n}\n",
    "int a[] = {" + ",".join(str(i) for i in range(60_000)) + "};\n",  # one huge line
    "int f(int x) {\n" + "".join(f"  {'else ' if i else ''}if (x == {i}) return {i};\n" for i in range(1500)) + "}\n",
    "(" * 5000 + ")" * 5000,
    # call forms: named through fields, parentheses (a comment inside names nothing), or not at all
    "void t() { f(1); (g)(2); ((h))(3); ( /*c*/ k)(4); (*fp)(5); a[1](6); m()(7); o.p(8); q->r(9); ns::s(10);\n"
    "  u<int>(11); o.template v<int>(12); ::w(13); x.operator()(14); A::B::y<T>::z(15); f(;\n",
    bytes(range(256)).decode("latin-1") * 40,  # binary-looking text
    # the structure rules (native/rules.c against enrich._Walk._special): preprocessor blocks whose last line is
    # or is not #endif (also unterminated, indented, at the file's end without a newline), typedefs with several,
    # nested, parenthesized or no declarators, anonymous and nameless classes, aliases, members in and outside a
    # class body, prototypes and function pointers, templates holding several definitions, namespaces whose body is
    # too short to open, a definition whose declarator is missing
    "#if A\nint a;\n#else\nint b;\n#endif", "#ifdef B\nint c;\n  #endif // x\n", "#if C\n#elif D\n#endif\n",
    "#ifndef E\n#define E\n#endif\n#if F", "#endif\n#if G\n",  # a one-line block: the rule reads from offset 0
    "#if 1\n#endif\n\n#if 2\n  \t#endif",
    "typedef struct { int y; } A, *PA, (*PF)(int), B[3];\ntypedef int;\ntypedef int (T);\n",
    "struct { int a; } anon;\nstruct N;\nclass C : public B { using B::f; static_assert(1, \"\"); friend class D;\n"
    "  int (*fp)(int); int g(int); C(); ~C(); operator int() const; enum { X, Y } e; };\n",
    "using U = ns::V<int>;\nusing ns::W;\nstatic_assert(sizeof(int) == 4);\nint (f)(int);\nint (*g)(int);\n"
    "int h(int), k;\nvoid (*sig(int, void (*)(int)))(int);\n",
    "template <class T> struct Z { template <class U> int m(U u) { return 0; } };\n"
    "template <> int q<int>(int x) { return x; }\ntemplate <class T> T r(T t);\n",
    "namespace {}\nnamespace n {\n}\nnamespace o::p { inline namespace v1 { int s; } }\nextern \"C\" { int t(void); }\n",
    "int (x) { return 1; }\n() { }\nint ns::Klass<T>::method(int) const { return 0; }\n",
    # the subtree walk's cases (native/tswalk.c): aliased children (labels, fields, namespace and type names),
    # extras (comments and preprocessor lines) between any two tokens, hidden rules walked through, external
    # scanner tokens (raw strings), zero-width MISSING nodes, and nesting deep enough to grow its stack
    "struct /*a*/ S /*b*/ { int /*c*/ f; } s; int g(void) { lbl: /*d*/ goto lbl; return s . /*e*/ f; }\n"
    "namespace A /*f*/ { namespace B { template </*g*/class T> using V = T; } }\nA::B::V<int> v;\n"
    "auto l = [&](int x) /*h*/ -> int { return x; }; [[nodiscard]] int n(); int m = 0x1p3 + 1'000 + u8'a';\n"
    "void p() {\n#define Q 1\n  int q = Q; /* i */ }\nconst char *r = R\"d(raw)\"d\"; template<class T> concept C = "
    "requires(T t) { t.x; };\nint z = (1 + ;\nvector<vector<int>> w; int k = a<b>>c;\n",
    "{" * 3000 + "}" * 3000,
    "int f() { return " + "g(" * 2000 + ")" * 2000 + "; }\n",
]


def assert_same_walk(parsed: chunk.ParsedSource, label: str) -> None:
    a, b = enrich._Walk(parsed, native=True), enrich._Walk(parsed, native=False)
    for name in ARRAYS:
        assert getattr(a, name).dtype == getattr(b, name).dtype == np.int64, (label, name)
        assert np.array_equal(getattr(a, name), getattr(b, name)), (label, name)
    for name in RECORDS:
        if name == "paint":  # int64[k, 3] rows; the native rules' (native/rules.c) against the Python ones
            assert a.paint.dtype == b.paint.dtype == np.int64 and a.paint.shape[1:] == (3,), label
            assert np.array_equal(a.paint, b.paint), (label, name)
        else:
            assert getattr(a, name) == getattr(b, name), (label, name)


def enrich_both(text: str, lang: str, monkeypatch) -> tuple[enrich.FileEnrichment, enrich.FileEnrichment]:
    native = enrich.enrich_file(text, lang)
    with monkeypatch.context() as m:
        m.setattr(tswalk, "_lib", None)
        m.setattr(tswalk, "_checked", True)
        python = enrich.enrich_file(text, lang)
    return native, python


def assert_same_enrichment(a: enrich.FileEnrichment, b: enrich.FileEnrichment, label: str) -> None:
    for name in PLANES:
        assert np.array_equal(getattr(a, name), getattr(b, name)), (label, name)
    assert a.units == b.units, label


def test_library_is_built_for_the_installed_binding():
    assert tswalk.available(), f"{tswalk.LIBRARY} is missing or unusable: run `make install`"
    lib = ctypes.CDLL(str(tswalk.LIBRARY))
    lib.megacpp_ts_version.restype = ctypes.c_char_p
    assert lib.megacpp_ts_version().decode() == build.importlib.metadata.version("tree-sitter")


@pytest.mark.parametrize("lang", ["c", "cpp"])
def test_hostile_input_walks_and_enriches_the_same(lang, monkeypatch):
    for k, text in enumerate(HOSTILE):
        parsed = chunk.parse_source(text, lang)
        assert_same_walk(parsed, f"{lang}#{k}")
        native, python = enrich_both(text, lang, monkeypatch)
        assert_same_enrichment(native, python, f"{lang}#{k}")
        assert len(native.ast_depth) == len(text)


def test_real_files_walk_and_enrich_the_same(tiny_run, monkeypatch):
    """Every kept file of the real ``tiny`` sdists: node arrays, rule records, planes and units."""
    root, _ = tiny_run
    kept = SnapshotLayout(root, "tiny").kept_files(["path", "language", "text"]).to_pydict()
    assert len(kept["path"]) > 50
    nodes = 0
    for path, lang, text in zip(kept["path"], kept["language"], kept["text"]):
        parsed = chunk.parse_source(text, lang)
        assert_same_walk(parsed, path)
        nodes += len(enrich._Walk(parsed).starts)
        native, python = enrich_both(text, lang, monkeypatch)
        assert_same_enrichment(native, python, path)
    assert nodes > 100_000


def test_picked_indices_are_cursor_descendant_indices():
    text = "#include <a.h>\nstruct S { int m; void f(); };\nint g(S s) { return h(s.m); } // c\n"
    parsed = chunk.parse_source(text, "cpp")
    _, recorded = enrich._kinds("cpp")
    arrays = tswalk.walk(parsed.tree, recorded, enrich.MAX_DEPTH)
    assert len(arrays.starts) == parsed.tree.root_node.descendant_count
    c = parsed.tree.walk()
    for i in range(len(arrays.starts)):
        c.goto_descendant(i)
        assert (c.node.start_byte, c.node.end_byte, c.node.kind_id) == \
            (arrays.starts[i], arrays.ends[i], arrays.kind_ids[i])
    assert [recorded[k] > 0 for k in arrays.kind_ids[arrays.picked]] == [True] * len(arrays.picked)
    assert sum(recorded[k] > 0 for k in arrays.kind_ids) == len(arrays.picked)


def test_owners_equal_the_numpy_search_and_refuse_unsorted_input(monkeypatch):
    text = "namespace n {\nint f(int x) {\n  if (x) { return g(x, 1); }\n  return 0;\n}\n}  \n"
    parsed = chunk.parse_source(text, "cpp")
    w = enrich._Walk(parsed, native=False)
    positions = np.arange(len(parsed.src) + 3, dtype=np.int64)
    with monkeypatch.context() as m:
        m.setattr(tswalk, "_lib", None)
        m.setattr(tswalk, "_checked", True)
        expected = enrich._ast_planes(parsed, w, positions)  # the numpy search
    idx = tswalk.owners(w.starts, w.ends, w.parents, positions)
    assert idx is not None and idx.dtype == np.int64 and idx[-1] == -1  # past the end: no node
    assert parsed.tree.root_node.child(0).child(0).type == "namespace" and idx[0] == 2  # its first leaf
    for got, want in zip(enrich._ast_planes(parsed, w, positions), expected):
        assert np.array_equal(got, want)
    assert tswalk.owners(w.starts, w.ends, w.parents, positions[::-1].copy()) is None  # positions going back
    assert tswalk.owners(w.starts[::-1].copy(), w.ends, w.parents, positions) is None  # node starts going back
    tables = np.random.default_rng(0).integers(0, 256, (3, len(w.starts) + 1), dtype=np.uint8)
    planes = tswalk.owner_planes(w.starts, w.ends, w.parents, positions, tables)  # the same search, looked up
    assert planes.dtype == np.uint8 and np.array_equal(planes, tables[:, np.where(idx < 0, len(w.starts), idx)])
    assert tswalk.owner_planes(w.starts, w.ends, w.parents, positions[::-1].copy(), tables) is None
    with pytest.raises(ValueError):
        tswalk.owner_planes(w.starts, w.ends, w.parents, positions, tables[:, :-1])


def test_walk_refuses_wrong_arguments():
    parsed = chunk.parse_source("int x;\n", "c")
    _, recorded = enrich._kinds("c")
    with pytest.raises(TypeError):
        tswalk.walk(parsed.tree.root_node, recorded, 63)
    with pytest.raises(ValueError):
        tswalk.walk(parsed.tree, bytearray(10), 63)


def test_a_library_of_another_release_is_not_used(monkeypatch):
    monkeypatch.setattr(tswalk, "_lib", None)
    monkeypatch.setattr(tswalk, "_checked", False)
    monkeypatch.setattr(tswalk.importlib.metadata, "version", lambda name: "0.0.0")
    with pytest.warns(RuntimeWarning, match="built for py-tree-sitter"):
        assert not tswalk.available()
    with pytest.raises(RuntimeError, match="not available"):
        tswalk.walk(chunk.parse_source("int x;", "c").tree, bytearray(65536), 63)
    monkeypatch.setattr(tswalk, "_checked", False)


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setattr(tswalk, "_lib", None)
    monkeypatch.setattr(tswalk, "_checked", False)
    monkeypatch.setenv("MEGACPP_NATIVE_WALK", "0")
    assert not tswalk.available()
    text = "struct A { int x; };\nint f(A a) { return a.x; }\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fe = enrich.enrich_file(text, "cpp")  # the Python walk, silently
    assert [u.kind for u in fe.units] == ["CLASS_DECL", "FUNC_BODY"]
    monkeypatch.setattr(tswalk, "_checked", False)


def test_build_compiles_a_loadable_library(tmp_path):
    """The build step of ``make install``, into a new file (the sdist is already kept in the
    virtualenv by the install, so this compiles only)."""
    out = build.build(build.Path(build.sys.prefix) / "share" / "megacpp", tmp_path / "walk.so")
    lib = ctypes.CDLL(str(out))
    lib.megacpp_ts_version.restype = ctypes.c_char_p
    assert lib.megacpp_ts_version().decode() == build.importlib.metadata.version("tree-sitter")
    lib.megacpp_ts_sources.restype = ctypes.c_char_p
    assert lib.megacpp_ts_sources().decode() == build.sources_digest()
    assert not list(tmp_path.glob("*.tmp*"))


def test_the_library_in_use_is_built_from_the_sources_beside_it(monkeypatch, tmp_path):
    """The library the tests use reports the digest of today's tswalk.c, rules.c and
    brace.c; one built from other sources (or too old to report them) is not used."""
    lib = tswalk._require()
    assert lib.megacpp_ts_sources().decode() == build.sources_digest()
    monkeypatch.setattr(tswalk, "_lib", None)
    monkeypatch.setattr(tswalk, "_checked", False)
    monkeypatch.setattr(build, "sources_digest", lambda directory=build.HERE: "0" * 64)
    with pytest.warns(RuntimeWarning, match="built from other C sources"):
        assert not tswalk.available()
    for name in build.SOURCES:  # the digest covers each source
        (tmp_path / name).write_bytes((build.HERE / name).read_bytes())
    monkeypatch.undo()
    assert build.sources_digest(tmp_path) == build.sources_digest()
    (tmp_path / "brace.c").write_bytes((build.HERE / "brace.c").read_bytes() + b"\n")
    assert build.sources_digest(tmp_path) != build.sources_digest()
    monkeypatch.setattr(tswalk, "_checked", False)


def test_build_refuses_a_binding_of_another_layout(tmp_path, monkeypatch):
    version = build.importlib.metadata.version("tree-sitter")
    src = tmp_path / "src"
    types_h = src / f"tree_sitter-{version}" / "tree_sitter" / "binding" / "types.h"
    lib_c = src / f"tree_sitter-{version}" / "tree_sitter" / "core" / "lib" / "src" / "lib.c"
    for p in (types_h, lib_c):
        p.parent.mkdir(parents=True)
    lib_c.write_text("")
    types_h.write_text("typedef struct {\n    PyObject_HEAD\n    PyObject *source;\n    TSTree *tree;\n} Tree;\n")
    with pytest.raises(SystemExit, match="does not start with the TSTree pointer"):
        build.build(src, tmp_path / "walk.so")
    assert not (tmp_path / "walk.so").exists()


def test_a_library_that_cannot_be_loaded_falls_back_with_a_warning(tmp_path, monkeypatch):
    bad = tmp_path / "_tswalk.so"
    bad.write_bytes(b"not a shared object")
    monkeypatch.setattr(tswalk, "LIBRARY", bad)
    monkeypatch.setattr(tswalk, "_lib", None)
    monkeypatch.setattr(tswalk, "_checked", False)
    with pytest.warns(RuntimeWarning, match="cannot be used"):
        assert not tswalk.available()
    fe = enrich.enrich_file("struct A { int x; };\n", "cpp")  # the Python walk
    assert [u.kind for u in fe.units] == ["CLASS_DECL"]
    monkeypatch.setattr(tswalk, "_checked", False)


def test_nearest_role_equals_the_numpy_walk_and_refuses_bad_arrays(monkeypatch):
    text = "class A : public B<C> { D d; void f(E e) { F f; { G g; } } };\nint h(H h, I (*i)(J)) { K k; }\n"
    parsed = chunk.parse_source(text, "cpp")
    w = enrich._Walk(parsed, native=True)
    roles = enrich._ROLES["cpp"][w.kind_ids]
    nodes = np.arange(len(w.starts), dtype=np.int64)
    for yes, stop in ((enrich._TYPE_CONTEXT, enrich._STATEMENTS), (enrich._STATEMENTS, enrich._TYPE_CONTEXT)):
        with monkeypatch.context() as m:
            m.setattr(tswalk, "_lib", None)
            m.setattr(tswalk, "_checked", True)
            want = tree_arrays.nearest_role_is(nodes, w.parents, roles, yes, stop)  # the numpy walk
        assert want.any() and not want.all()
        got = tswalk.nearest_role(nodes, w.parents, roles, yes, stop)
        assert got is not None and got.dtype == bool and np.array_equal(got, want)
    parents = w.parents.copy()
    parents[-1] = len(parents) - 1  # its own parent: refused, not a loop
    assert tswalk.nearest_role(nodes, parents, roles, 1, 2) is None
    assert tswalk.nearest_role(np.array([len(nodes)]), w.parents, roles, 1, 2) is None
    with pytest.raises(ValueError):
        tswalk.nearest_role(nodes, w.parents, roles[:-1], 1, 2)


def test_owners_refuse_inconsistent_node_arrays():
    parsed = chunk.parse_source("int f(int x) { return x; }\n", "c")
    w = enrich._Walk(parsed, native=True)
    positions = np.arange(len(parsed.src), dtype=np.int64)
    with pytest.raises(ValueError, match="node arrays"):
        tswalk.owners(w.starts, w.ends[:-1], w.parents, positions)
    for bad_parent in (len(w.starts) - 1, -2):  # a parent after its child, or below -1
        parents = w.parents.copy()
        parents[-1] = bad_parent
        assert tswalk.owners(w.starts, w.ends, parents, positions) is None


CALLS = ("void t() { f(1); (g)(2); ((h))(3); ( /*c*/ k)(4); (*fp)(5); a[1](6); m()(7); o.p(8); q->r(9);\n"
         "  ns::s(10); u<int>(11); o.template v<int>(12); ::w(13); A::B::y<T>::z(14); n.e(1).d(2); }\n")
#: What each call of CALLS names, in order (``m()(7)`` names only the inner ``m``; the field of
#: ``o.template v<int>`` is a ``dependent_name``, which names nothing; ``n.e(1).d(2)`` names
#: ``d``, then its callee object's call ``e``).
CALLED = ["f", "g", "h", "m", "p", "r", "s", "u", "w", "z", "d", "e"]


@pytest.mark.parametrize("native", [True, False])
def test_callee_names_of_each_call_form(native):
    parsed = chunk.parse_source(CALLS, "cpp")
    w = enrich._Walk(parsed, native=native)
    assert [name for _, name in w.calls] == CALLED
    starts = [CALLS.index(c) for c in ("f(1)", "(g)", "((h))", "m()", "o.p", "q->r", "ns::s", "u<int>", "::w", "A::B",
                                         "n.e", "n.e")]
    assert [at for at, _ in w.calls] == starts  # each at the start of its call expression (bytes: ASCII text)


def test_native_callee_spans_refuse_wrong_arguments():
    parsed = chunk.parse_source(CALLS, "cpp")
    w = enrich._Walk(parsed, native=True)
    step, fields = callees._table("cpp", parsed.tree.language)
    calls = np.flatnonzero(w.kind_ids == parsed.tree.root_node.child(0).child_by_field_name("body").named_children[0]
                           .named_children[0].kind_id)
    starts, ends = tswalk.callees(parsed.tree, calls, step, fields)
    assert CALLS.encode()[starts[0]:ends[0]] == b"f" and starts.dtype == np.int64
    with pytest.raises(ValueError, match="outside the tree"):
        tswalk.callees(parsed.tree, np.array([len(w.starts)]), step, fields)
    with pytest.raises(ValueError, match="outside the tree"):
        tswalk.callees(parsed.tree, np.array([-1]), step, fields)
    with pytest.raises(ValueError, match="65,536"):
        tswalk.callees(parsed.tree, calls, bytearray(10), fields)
    with pytest.raises(TypeError):
        tswalk.callees(parsed.tree.root_node, calls, step, fields)


def test_a_library_without_a_function_falls_back_with_a_warning(monkeypatch):
    """A ``_tswalk.so`` built from an older ``tswalk.c`` (one exported function missing)."""
    monkeypatch.setattr(tswalk, "_lib", None)
    monkeypatch.setattr(tswalk, "_checked", False)
    monkeypatch.setattr(tswalk, "_FUNCTIONS", tswalk._FUNCTIONS + ("megacpp_ts_not_there",))
    with pytest.warns(RuntimeWarning, match="lacks megacpp_ts_not_there"):
        assert not tswalk.available()
    w = enrich._Walk(chunk.parse_source(CALLS, "cpp"))  # the Python walk and rule
    assert [name for _, name in w.calls] == CALLED
    monkeypatch.setattr(tswalk, "_checked", False)


def _old_callee_name(call) -> str | None:
    """The callee rule as enrichment wrote it on Python nodes before it moved to
    ``megacpp_core.callees`` (kept here as an independent reference)."""
    fn = call.child_by_field_name("function")
    while fn is not None:
        t = fn.type
        if t in ("identifier", "field_identifier"):
            return fn.text.decode("utf-8", "replace")
        if t == "field_expression":
            fn = fn.child_by_field_name("field")
        elif t in ("qualified_identifier", "template_function", "template_method"):
            fn = fn.child_by_field_name("name")
        elif t == "parenthesized_expression":
            fn = fn.named_children[0] if fn.named_children else None
        else:
            return None
    return None


def test_calls_equal_the_reference_rule_on_real_files(tiny_run):
    """Every call expression of every kept file of the real ``tiny`` sdists, found by a
    plain cursor walk and named by the reference rule: the walk's calls, native and
    Python, are exactly those (offset and name, in pre-order)."""
    root, _ = tiny_run
    kept = SnapshotLayout(root, "tiny").kept_files(["language", "text"]).to_pydict()
    total = 0
    for lang, text in zip(kept["language"], kept["text"]):
        parsed = chunk.parse_source(text, lang)
        want, c = [], parsed.tree.walk()
        for i in range(parsed.tree.root_node.descendant_count):
            c.goto_descendant(i)
            node = c.node
            if node.type == "call_expression" and node.is_named:
                name = _old_callee_name(node)
                if name:
                    want.append((node.start_byte, name))
        total += len(want)
        assert enrich._Walk(parsed, native=True).calls == want == enrich._Walk(parsed, native=False).calls
    assert total > 1000
