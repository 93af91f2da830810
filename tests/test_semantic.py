"""The libclang semantic lane (megacpp_core.semantic) and its per-revision compile command
database (megacpp_core.compile_commands): exact edges on a hand-written multi-file C++
fixture, database synthesis/shipped/freshness rules, per-TU timeouts and crashes in worker
processes, coverage on a real sdist of the default corpus, and hostile inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from megacpp_core import acquire, semantic
from megacpp_core import compile_commands as cc
from megacpp_core.manifest import load_manifest

from .conftest import SHARED_CACHE

FIXTURE = Path(__file__).parent / "fixtures" / "semantic_cpp"

#: lz4-4.4.5 (default corpus), all 8 TUs, measured on the development machine (gcc 12
#: system headers, Python.h of the running interpreter): tu_coverage 1.0 (8/8 ok),
#: call_coverage 0.914 (1202/1315), call_coverage_tree 0.615 (809/1315; the rest are libc
#: and CPython API calls, and compiler builtins, which count as unresolved). Floors a bit below.
LZ4_TU_COVERAGE_FLOOR = 0.9
LZ4_CALL_COVERAGE_FLOOR = 0.85
LZ4_CALL_COVERAGE_TREE_FLOOR = 0.55

# USRs of the fixture (readable names in comments)
SHAPE = "c:@N@geo@S@Shape"  # geo::Shape
CIRCLE = "c:@N@geo@S@Circle"  # geo::Circle
POINT = "c:@N@geo@S@Point"  # geo::Point
LENGTH = "c:point.h@N@geo@T@Length"  # typedef geo::Length
AREA = "c:@N@geo@S@Shape@F@area#1"  # geo::Shape::area() const
CIRCLE_AREA = "c:@N@geo@S@Circle@F@area#1"  # geo::Circle::area() const
CIRCLE_CTOR = "c:@N@geo@S@Circle@F@Circle#d#d#d#"  # geo::Circle::Circle(double, double, double)
CONTAINS = "c:@N@geo@S@Circle@F@contains#&1$@N@geo@S@Point#1"  # geo::Circle::contains(const Point&) const
SCALE_INT = "c:@N@geo@F@scale#I#"  # geo::scale(int)
SCALE_DOUBLE = "c:@N@geo@F@scale#d#"  # geo::scale(double)
LEGACY_SCALE = "c:@N@legacy@F@scale#I#"  # legacy::scale(int)
TWICE = "c:@N@geo@FT@>1#Ttwice#t0.0#S0_#"  # template <class T> T geo::twice(T)
MAIN = "c:@F@main#"  # main()
TOTAL = "c:main.cpp@F@total#&1$@N@geo@S@Shape#"  # static total(const geo::Shape&)

MAIN_CPP, UTIL_CPP, UTIL_H = "src/main.cpp", "src/util.cpp", "src/util.h"
BASE_H, CIRCLE_H, POINT_H = "include/shapes/base.h", "include/shapes/circle.h", "include/shapes/point.h"

#: (kind, from_usr, to_usr, from_file, from_line, to_file, to_line) — the whole edge table.
EXPECTED_EDGES = {
    # calls: overloads, namespaces, the template, methods and a constructor across files;
    # targets are definitions (found in another TU when the caller's TU only declares them)
    ("call", TOTAL, AREA, MAIN_CPP, 4, BASE_H, 8),  # virtual, pure: the declaration
    ("call", MAIN, CIRCLE_CTOR, MAIN_CPP, 7, UTIL_CPP, 9),
    ("call", MAIN, SCALE_INT, MAIN_CPP, 8, UTIL_CPP, 6),
    ("call", MAIN, SCALE_DOUBLE, MAIN_CPP, 9, UTIL_CPP, 7),
    ("call", MAIN, LEGACY_SCALE, MAIN_CPP, 10, UTIL_CPP, 23),
    ("call", MAIN, TWICE, MAIN_CPP, 11, UTIL_H, 9),
    ("call", MAIN, CONTAINS, MAIN_CPP, 13, UTIL_CPP, 13),
    ("call", MAIN, TOTAL, MAIN_CPP, 14, MAIN_CPP, 4),
    ("call", CIRCLE_AREA, SCALE_DOUBLE, UTIL_CPP, 11, UTIL_CPP, 7),  # scale(Length) → the double overload
    ("call", CONTAINS, TWICE, UTIL_CPP, 16, UTIL_H, 9),
    # types: base class into the other header, member types, a typedef, parameter types
    ("type", CIRCLE, SHAPE, CIRCLE_H, 8, BASE_H, 5),
    ("type", CONTAINS, POINT, CIRCLE_H, 12, POINT_H, 7),
    ("type", CIRCLE, POINT, CIRCLE_H, 15, POINT_H, 7),
    ("type", CIRCLE, LENGTH, CIRCLE_H, 16, POINT_H, 5),
    ("type", POINT, LENGTH, POINT_H, 8, POINT_H, 5),
    ("type", POINT, LENGTH, POINT_H, 9, POINT_H, 5),
    ("type", TOTAL, SHAPE, MAIN_CPP, 4, BASE_H, 5),
    ("type", CONTAINS, POINT, UTIL_CPP, 13, POINT_H, 7),
    # includes (both ends in the tree)
    ("include", f"file:{CIRCLE_H}", f"file:{BASE_H}", CIRCLE_H, 3, BASE_H, 1),
    ("include", f"file:{CIRCLE_H}", f"file:{POINT_H}", CIRCLE_H, 4, POINT_H, 1),
    ("include", f"file:{MAIN_CPP}", f"file:{CIRCLE_H}", MAIN_CPP, 1, CIRCLE_H, 1),
    ("include", f"file:{MAIN_CPP}", f"file:{UTIL_H}", MAIN_CPP, 2, UTIL_H, 1),
    ("include", f"file:{UTIL_CPP}", f"file:{UTIL_H}", UTIL_CPP, 1, UTIL_H, 1),
    ("include", f"file:{UTIL_CPP}", f"file:{CIRCLE_H}", UTIL_CPP, 2, CIRCLE_H, 1),
}


def fixture_files() -> list[tuple[str, bytes]]:
    return sorted((p.relative_to(FIXTURE).as_posix(), p.read_bytes()) for p in FIXTURE.rglob("*") if p.is_file())


def edge_set(table: pa.Table) -> set[tuple]:
    return {(r["kind"], r["from_usr"], r["to_usr"], r["from_file"], r["from_line"], r["to_file"], r["to_line"])
            for r in table.to_pylist()}


def run_tree(files, tmp: Path, revision: str = "rev", **kw) -> semantic.SemanticResult:
    db = cc.build_database(files, revision)
    tree = tmp / "tree"
    semantic.materialize_tree(files, tree, db)
    return semantic.run_semantic(tree, db, **kw)


@pytest.fixture(scope="module")
def fixture_result(tmp_path_factory):
    return run_tree(fixture_files(), tmp_path_factory.mktemp("semantic-fixture"), workers=2, timeout_s=60)


# --------------------------------------------------------------------------- fixture edges

def test_fixture_edge_set_is_pinned(fixture_result):
    r = fixture_result
    assert r.edges.schema == semantic.EDGES_SCHEMA
    assert edge_set(r.edges) == EXPECTED_EDGES
    assert r.edges.num_rows == len(EXPECTED_EDGES)  # deduplicated
    rows = r.edges.to_pylist()
    keys = [(e["kind"], e["from_file"], e["from_line"], e["from_usr"], e["to_usr"], e["to_file"], e["to_line"])
            for e in rows]
    assert keys == sorted(keys)
    calls = {(e["from_usr"], e["from_line"]): e["to_usr"] for e in rows if e["kind"] == "call"}
    # overloads resolve to different USRs; same-named functions in two namespaces stay apart
    assert calls[(MAIN, 8)] == SCALE_INT and calls[(MAIN, 9)] == SCALE_DOUBLE and calls[(MAIN, 10)] == LEGACY_SCALE
    assert len({SCALE_INT, SCALE_DOUBLE, LEGACY_SCALE}) == 3
    # the template call resolves to the template's USR, not to a specialization
    assert calls[(MAIN, 11)] == TWICE and "@FT@" in TWICE
    # the base-class edge points into the other header
    base = [e for e in rows if e["kind"] == "type" and e["from_usr"] == CIRCLE and e["to_usr"] == SHAPE]
    assert [(b["from_file"], b["to_file"]) for b in base] == [(CIRCLE_H, BASE_H)]


def test_fixture_build_info_and_figures(fixture_result):
    r = fixture_result
    assert r.build_info.schema == semantic.BUILD_INFO_SCHEMA
    bi = r.build_info.to_pylist()
    assert [b["file"] for b in bi] == [MAIN_CPP, UTIL_CPP]
    assert all(b["status"] == "ok" and b["errors"] == 0 and b["fatal"] == 0 and not b["shipped"] for b in bi)
    assert [(b["call_sites"], b["calls_resolved"], b["calls_resolved_tree"]) for b in bi] == [(8, 8, 8), (3, 3, 3)]
    assert bi[0]["arguments"][:3] == ["-x", "c++", "-std=c++17"]
    assert set(semantic.LANE_ARGUMENTS) <= set(bi[0]["arguments"])
    assert all(b["peak_rss_mb"] > 10 and b["seconds"] >= 0 for b in bi)
    f = r.figures
    assert (f["tus_total"], f["tus_ok"], f["tus_fatal"], f["tus_timeout"], f["tus_crashed"]) == (2, 2, 0, 0, 0)
    assert f["tu_coverage"] == 1.0 and f["call_coverage"] == 1.0 and f["call_sites"] == 11
    assert (f["edges_call"], f["edges_type"], f["edges_include"]) == (10, 8, 6)
    assert f["tus_per_second_per_process"] > 0 and 0 < len(f["peak_rss_mb_per_worker"]) <= 2


def test_results_do_not_depend_on_workers_or_order(fixture_result, tmp_path):
    one = run_tree(fixture_files(), tmp_path, workers=1, timeout_s=60)
    assert one.edges.equals(fixture_result.edges)
    cols = ["file", "arguments", "status", "errors", "fatal", "call_sites", "calls_resolved", "edges"]
    assert one.build_info.select(cols).equals(fixture_result.build_info.select(cols))


# --------------------------------------------------------------------------- database

SYNTH_FILES = [
    ("CMakeLists.txt", b"project(x)\n"),
    ("README.md", b"# x\n"),
    ("a.c", b"int a;\n"),
    ("include/z.h", b"int z(void);\n"),
    ("lib/deep/w.hpp", b"#pragma once\n"),
    ("lib/x.cpp", b"int x;\n"),
    ("lib/y.CC", b"int y;\n"),
    ("gpu/k.cu", b"__global__ void k() {}\n"),
    ("gpu/k.cuh", b"#pragma once\n"),
    ("src/impl.inl", b"\n"),
]


def test_synthesized_database_languages_include_dirs_no_defines():
    db = cc.build_database(SYNTH_FILES, "r1")
    assert not db.shipped and db.shipped_path is None and db.revision == "r1"
    hdirs = ["gpu", "include", "lib/deep", "src"]  # every directory holding a header, sorted

    def inc(own):
        dirs = [own] + [d for d in hdirs if d != own]
        return [x for d in dirs for x in ("-iquote", d)] + [x for d in dirs for x in ("-idirafter", d)]

    assert db.entries == [
        {"file": "a.c", "arguments": ["-x", "c", "-std=c11", *inc(".")], "directory": "."},
        {"file": "gpu/k.cu", "arguments": [*cc.CUDA_ARGS, *inc("gpu")], "directory": "."},
        {"file": "lib/x.cpp", "arguments": ["-x", "c++", "-std=c++17", *inc("lib")], "directory": "."},
        {"file": "lib/y.CC", "arguments": ["-x", "c++", "-std=c++17", *inc("lib")], "directory": "."},
    ]
    for e in db.entries:
        defines = [a for a in e["arguments"] if a.startswith(("-D", "-U"))]
        assert defines == ([] if not e["file"].endswith(".cu") else cc.CUDA_KEYWORD_DEFINES)
    assert cc.CUDA_ARGS[:3] == ["-x", "c++", "-std=c++17"]
    assert db.figures["tus"] == 4 and db.figures["include_dirs"] == 4
    cuda = cc.build_database(SYNTH_FILES, "r1", cuda_mode="cuda")
    assert cuda.entries[1]["arguments"][:6] == ["-x", "cuda", "--cuda-host-only", "-nocudainc", "-nocudalib", "-std=c++17"]
    with pytest.raises(ValueError):
        cc.build_database(SYNTH_FILES, "r1", cuda_mode="hip")


def shipped_files(extra=()):
    author = "/home/alice/work/proj"
    commands = [
        {"directory": f"{author}/build", "file": f"{author}/src/a.c",
         "arguments": ["/usr/bin/ccache", "/usr/bin/gcc", "-I../include", f"-I{author}/third_party", "-isystem",
                       "/usr/include/openssl", "-iquote", f"{author}/src", "-DFOO=1", "-D", "BAR", "-UBAZ",
                       "-std=gnu99", "-include", f"{author}/include/cfg.h", "-Wall", "-Werror=format", "-O2",
                       "-fPIC", "-MD", "-MF", "a.o.d", "-MT", "a.o", "-fplugin=/opt/evil.so", "-Xclang", "-load",
                       "-Xclang", "/opt/evil2.so", "-B/opt/bin", "-o", "CMakeFiles/a.o", "-c", f"{author}/src/a.c"]},
        {"directory": f"{author}/build", "file": "../src/b.cpp",
         "command": f"/usr/bin/c++ -I{author}/include -I/opt/outside -x c++ -std=c++20 -DQ=\"a b\" -o b.o -c ../src/b.cpp"},
        {"directory": f"{author}/build", "file": f"{author}/src/a.c", "arguments": ["gcc", "-DDUP", "-c", "a.c"]},
        {"directory": f"{author}/build", "file": f"{author}/build/generated.c", "arguments": ["gcc", "-c", "generated.c"]},
        {"directory": f"{author}/build", "file": f"{author}/gpu/k.cu", "arguments": ["nvcc", "-x", "cu", "-DK", "-c", "k.cu"]},
        {"directory": f"{author}/build", "file": f"{author}/src/start.S", "arguments": ["cc", "-c", "../src/start.S"]},
    ]
    files = [
        ("build/compile_commands.json", json.dumps(commands).encode()),
        ("deeper/sub/compile_commands.json", b"[]"),  # deeper: not chosen
        ("include/cfg.h", b"#define CFG 1\n"),
        ("src/a.c", b"int a;\n"),
        ("src/b.cpp", b"int b;\n"),
        ("src/unlisted.c", b"int u;\n"),
        ("src/start.S", b"nop\n"),
        ("gpu/k.cu", b"void k() {}\n"),
        *extra,
    ]
    return sorted(files)


def test_shipped_compile_commands_is_relativized_and_filtered():
    db = cc.build_database(shipped_files(), "r1")
    assert db.shipped and db.shipped_path == "build/compile_commands.json"
    assert db.entries == [
        {"file": "gpu/k.cu", "arguments": [*cc.CUDA_ARGS, "-DK"], "directory": "."},
        {"file": "src/a.c", "directory": ".", "arguments": [
            "-Iinclude", "-Ithird_party", "-iquote", "src", "-DFOO=1", "-DBAR", "-UBAZ", "-std=gnu99",
            "-include", "include/cfg.h"]},
        {"file": "src/b.cpp", "directory": ".", "arguments": ["-Iinclude", "-x", "c++", "-std=c++20", "-DQ=a b"]},
    ]
    f = db.figures
    assert f["author_root"] == "/home/alice/work/proj"
    assert (f["shipped_entries"], f["tus"], f["dropped_not_in_tree"], f["dropped_duplicates"]) == (6, 3, 1, 1)
    assert f["dropped_not_c_family"] == 1  # src/start.S
    assert f["dropped_include_dirs"] == 2  # /usr/include/openssl, /opt/outside
    # the lane uses it: materialized with an absolute directory, parsed with these arguments
    cmds = db.compile_commands("/tmp/x")
    assert cmds[1] == {"directory": "/tmp/x", "file": "src/a.c", "arguments": ["cc", *db.entries[1]["arguments"], "src/a.c"]}


def test_shipped_database_drives_the_lane(tmp_path):
    author = "/srv/ci/checkout"
    commands = [{"directory": f"{author}/out", "file": f"{author}/app/main.c",
                 "arguments": ["cc", f"-I{author}/api", "-DGREETING=greet", "-c", f"{author}/app/main.c"]}]
    files = [("out/compile_commands.json", json.dumps(commands).encode()),
             ("api/greet.h", b"int greet(int x);\n"),
             ("api/greet.c", b"#include \"greet.h\"\nint greet(int x) { return x; }\n"),
             ("app/main.c", b"#include <greet.h>\nint main(void) { return GREETING(1); }\n")]
    r = run_tree(files, tmp_path, workers=1, timeout_s=60)
    bi = r.build_info.to_pylist()
    assert [(b["file"], b["status"], b["shipped"]) for b in bi] == [("app/main.c", "ok", True)]
    assert bi[0]["arguments"][:2] == ["-Iapi", "-DGREETING=greet"]
    assert ("call", "c:@F@main", "c:@F@greet", "app/main.c", 2, "api/greet.h", 1) in edge_set(r.edges)
    assert r.figures["shipped"] is True


def test_invalid_shipped_file_falls_back_to_synthesis():
    db = cc.build_database([("compile_commands.json", b"{not json"), ("a.c", b"int a;\n")], "r")
    assert not db.shipped and [e["file"] for e in db.entries] == ["a.c"]
    assert "not JSON" in db.figures["shipped_rejected"][0]


def test_inputs_sha256_tracks_build_files_and_file_list_and_refuses_other_revisions():
    files = shipped_files()
    db = cc.build_database(files, "rev-a")
    text = db.to_json()
    assert text == cc.build_database(list(reversed(files)), "rev-a").to_json()  # deterministic
    back = cc.CompileDatabase.from_json(text)
    assert back == db and back.to_json() == text
    assert cc.load_database(text, files, "rev-a") == db

    base = cc.inputs_sha256(files)
    changed_build = [(p, d + b" " if p == "build/compile_commands.json" else d) for p, d in files]
    added_cmake = files + [("cmake/flags.cmake", b"set(X 1)\n")]
    added_file = files + [("src/new.c", b"int n;\n")]
    edited_source = [(p, b"int a = 2;\n" if p == "src/a.c" else d) for p, d in files]
    assert cc.inputs_sha256(changed_build) != base
    assert cc.inputs_sha256(added_cmake) != base
    assert cc.inputs_sha256(added_file) != base
    assert cc.inputs_sha256(edited_source) == base  # the database depends only on paths and build files
    for name in ("CMakeLists.txt", "Makefile.am", "meson.build", "BUILD.bazel", "WORKSPACE", "configure.ac",
                 "setup.py", "pyproject.toml", "x/binding.gyp", "a/b/rules.mk"):
        assert cc.is_build_file(name), name
    assert not cc.is_build_file("src/build.c") and not cc.is_build_file("README.md")

    with pytest.raises(cc.StaleDatabaseError, match="built for revision 'rev-a', not 'rev-b'"):
        cc.load_database(text, files, "rev-b")
    with pytest.raises(cc.StaleDatabaseError, match="build files or the file list changed"):
        cc.check_current(db, changed_build, "rev-a")
    with pytest.raises(cc.StaleDatabaseError):
        cc.check_current(db, added_file, "rev-a")
    with pytest.raises(ValueError):
        cc.CompileDatabase.from_json("[]")


# --------------------------------------------------------------------------- timeouts, crashes

def test_hung_tu_is_killed_and_replaced_and_crash_is_counted(tmp_path, monkeypatch):
    files = fixture_files() + [
        ("src/crash.cpp", b'#include "util.h"\nint crash_me() { return geo::scale(1); }\n'),
        ("src/hang.cpp", b'#include "util.h"\nint hang_me() { return geo::scale(2); }\n'),
    ]
    monkeypatch.setenv(semantic.HANG_ENV, "hang.cpp")
    monkeypatch.setenv(semantic.CRASH_ENV, "src/crash.cpp")
    # one worker: crash.cpp kills it, hang.cpp runs on its replacement and is killed after
    # the timeout, and main.cpp/util.cpp still parse on the next replacement
    r = run_tree(files, tmp_path, workers=1, timeout_s=3.0)
    status = {b["file"]: b["status"] for b in r.build_info.to_pylist()}
    assert status == {"src/crash.cpp": "crashed", "src/hang.cpp": "timeout", MAIN_CPP: "ok", UTIL_CPP: "ok"}
    msg = {b["file"]: b["message"] for b in r.build_info.to_pylist()}
    assert msg["src/hang.cpp"] == "killed after 3 s" and msg["src/crash.cpp"] == "worker process died"
    f = r.figures
    assert (f["tus_total"], f["tus_ok"], f["tus_timeout"], f["tus_crashed"]) == (4, 2, 1, 1)
    assert f["tu_coverage"] == 0.5
    assert f["worker_processes"] == 3  # the first worker, its replacement after the crash, and after the timeout
    assert edge_set(r.edges) == EXPECTED_EDGES  # nothing from the killed TUs, everything from the others


# --------------------------------------------------------------------------- real source

def test_real_source_coverage_lz4(tmp_path):
    src = next(s for s in load_manifest("default").sources if s.name == "lz4-4.4.5")
    got = acquire.acquire_source(src, SHARED_CACHE)
    db = cc.build_database(got.files, got.revision)
    assert not db.shipped and len(db.entries) == 8
    cc.check_current(db, got.files, got.revision)
    tree = tmp_path / "lz4"
    written = semantic.materialize_tree(got.files, tree, db)
    assert len(written) == 13 and (tree / "compile_commands.json").is_file()
    r = semantic.run_semantic(tree, db, workers=2, timeout_s=120)
    f = r.figures
    assert f["tus_total"] == 8 and f["tus_timeout"] == 0 and f["tus_crashed"] == 0
    assert f["tu_coverage"] >= LZ4_TU_COVERAGE_FLOOR, f
    assert f["call_coverage"] >= LZ4_CALL_COVERAGE_FLOOR, f
    assert f["call_coverage_tree"] >= LZ4_CALL_COVERAGE_TREE_FLOOR, f
    # a cross-TU call from the Python binding into the vendored library, to its definition
    edges = edge_set(r.edges)
    assert any(e[0] == "call" and e[1] == "c:_frame.c@F@compress" and e[2] == "c:@F@LZ4F_compressFrame"
               and e[3] == "lz4/frame/_frame.c" and e[5] == "lz4libs/lz4frame.c" for e in edges)
    assert ("include", "file:lz4libs/lz4frame.c", "file:lz4libs/lz4frame.h") in {e[:3] for e in edges}


# --------------------------------------------------------------------------- system headers

def test_system_headers_found_at_run_time(tmp_path, monkeypatch):
    dirs = semantic.system_include_dirs("c++")
    assert dirs and all(Path(d).is_dir() for d in dirs)
    files = [("a.cpp", b"#include <vector>\n#include <cstring>\n#include <stddef.h>\n"
                       b"size_t n() { std::vector<int> v(3); return v.size() + std::strlen(\"x\"); }\n"),
             ("b.c", b"#include <stddef.h>\n#include <stdarg.h>\n#include <stdio.h>\n"
                     b"int f(int k, ...) { va_list ap; va_start(ap, k); va_end(ap); return printf(\"%d\", k); }\n")]
    r = run_tree(files, tmp_path / "ok", workers=2, timeout_s=60)
    assert [(b["file"], b["status"]) for b in r.build_info.to_pylist()] == [("a.cpp", "ok"), ("b.c", "ok")]
    # a.cpp: vector's constructor, size(), strlen — resolved into system headers; b.c: printf
    # is, the va_start/va_end builtins (implicitly declared by clang) are not
    counts = [(b["call_sites"], b["calls_resolved"], b["calls_resolved_tree"]) for b in r.build_info.to_pylist()]
    assert counts == [(3, 3, 0), (3, 1, 0)] and r.edges.num_rows == 0
    monkeypatch.setenv("MEGACPP_SYSTEM_INCLUDES", "")  # override: no system headers at all
    assert semantic.system_include_dirs("c") == []
    r = run_tree(files, tmp_path / "none", workers=1, timeout_s=60)
    assert {b["status"] for b in r.build_info.to_pylist()} == {"fatal"}


# --------------------------------------------------------------------------- hostile inputs

def test_empty_tree_returns_empty_tables(tmp_path):
    r = run_tree([("README", b"nothing to see\n")], tmp_path)
    assert r.edges.num_rows == 0 and r.edges.schema == semantic.EDGES_SCHEMA
    assert r.build_info.num_rows == 0 and r.build_info.schema == semantic.BUILD_INFO_SCHEMA
    assert r.figures["tus_total"] == 0 and r.figures["tu_coverage"] == 0.0 and r.figures["worker_processes"] == 0


def test_binary_and_invalid_utf8_tus_do_not_crash_the_run(tmp_path):
    files = fixture_files() + [
        ("src/binary.c", bytes(range(256)) * 8),
        ("src/latin1.cpp", b"int f\xe9() { return 1; }\nint g() { return f\xe9(); } // caf\xe9\n"
                           b'const char* s = "\xff\xfe\xc3\x28";\n'),
        ("src/nul.cpp", b"int a = 1;\x00\x00 int b = a;\n"),
        ("src/empty.cpp", b""),
    ]
    r = run_tree(files, tmp_path, workers=2, timeout_s=60)
    status = {b["file"]: b["status"] for b in r.build_info.to_pylist()}
    assert set(status) == {MAIN_CPP, UTIL_CPP, "src/binary.c", "src/latin1.cpp", "src/nul.cpp", "src/empty.cpp"}
    assert status[MAIN_CPP] == status[UTIL_CPP] == status["src/empty.cpp"] == "ok"
    assert status["src/binary.c"] in ("errors", "fatal") and status["src/latin1.cpp"] in ("errors", "fatal")
    assert "crashed" not in status.values() and "timeout" not in status.values()
    assert EXPECTED_EDGES <= edge_set(r.edges)


def test_materialize_tree_refuses_unsafe_paths(tmp_path):
    for bad in ("/etc/passwd.h", "../up.c", "a/../../b.c", "a//b.c", "./a.c", "C:/x.c", "a\\b.c"):
        with pytest.raises(semantic.UnsafePathError):
            semantic.materialize_tree([(bad, b"int x;\n")], tmp_path / f"t{abs(hash(bad))}")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    with pytest.raises(semantic.UnsafePathError):
        semantic.materialize_tree([("a.c", b"")], tmp_path / "used")
    with pytest.raises(semantic.UnsafePathError):
        semantic.materialize_tree([("a.c", b""), ("a.c", b"")], tmp_path / "dup")
    written = semantic.materialize_tree([("a.c", b"int a;\n"), ("notes.txt", b"x"), ("d/e.h", b"")], tmp_path / "ok")
    assert written == ["a.c", "d/e.h"] and not (tmp_path / "ok" / "notes.txt").exists()
    with pytest.raises(ValueError):
        semantic.run_semantic(tmp_path / "ok", cc.build_database([("a.c", b"")], "r"), workers=0)
    with pytest.raises(FileNotFoundError):
        semantic.run_semantic(tmp_path / "missing", cc.build_database([("a.c", b"")], "r"))


def test_include_roots_resolve_project_relative_includes(tmp_path):
    files = [
        ("third_party/abseil/absl/base/config.h", b"#define ABSL 1\n"),
        ("src/core/lib.h", b'#include <absl/base/config.h>\nint lib(void);\n'),
        ("src/core/lib.c", b'#include "core/lib.h"\n#include <absl/base/config.h>\nint lib(void) { return ABSL; }\n'),
        ("src/main.c", b'#include "core/lib.h"\n#include <missing/nowhere.h>\nint main(void) { return lib(); }\n'),
    ]
    assert cc.include_paths(files) == ["absl/base/config.h", "core/lib.h", "missing/nowhere.h"]
    paths = [p for p, _ in files]
    assert cc.include_roots(paths, cc.include_paths(files)) == ["src", "third_party/abseil"]
    db = cc.build_database(files, "r1")
    args = next(e["arguments"] for e in db.entries if e["file"] == "src/core/lib.c")
    pairs = list(zip(args, args[1:]))
    for root in ("src", "third_party/abseil"):
        assert ("-iquote", root) in pairs and ("-idirafter", root) in pairs
    assert db.figures["include_roots"] == 2
    semantic.materialize_tree(files, tmp_path, db)
    res = semantic.run_semantic(tmp_path, db, workers=1, timeout_s=60)
    status = dict(zip(res.build_info.column("file").to_pylist(), res.build_info.column("status").to_pylist()))
    assert status["src/core/lib.c"] == "ok"  # both project-relative includes resolve
    assert status["src/main.c"] == "fatal"  # a header absent from the tree stays missing
    # the include lines are inputs of the database
    changed = [(p, d.replace(b"<absl/base/config.h>", b"<absl/base/other.h>")) for p, d in files]
    assert cc.inputs_sha256(changed) != cc.inputs_sha256(files)


def test_progress_callback_reports_every_tu(tmp_path):
    files = [(f"src/f{i}.c", f"int f{i}(void) {{ return {i}; }}\n".encode()) for i in range(3)]
    db = cc.build_database(files, "r1")
    semantic.materialize_tree(files, tmp_path, db)
    seen = []
    semantic.run_semantic(tmp_path, db, workers=1, timeout_s=60, progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (3, 3) and [d for d, _ in seen] == sorted(d for d, _ in seen)
