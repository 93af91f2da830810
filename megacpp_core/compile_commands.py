"""The per-revision compile command database of the libclang lane (SPEC §4, optional layer 5).

One database per repository revision, built from the files stage 0 read (``(path, bytes)``
pairs, POSIX paths relative to the source root). Every entry is
``{"file": PATH, "arguments": [...], "directory": "."}``: the file and every include
directory are relative to the source tree, so the database is independent of where the tree
is materialized (the semantic lane resolves them against its own tree root). **Nothing from
the corpus is run** to build it: no CMake configure, no build script, no ``setup.py``.

Two ways to build it, in this order:

1. **Shipped** — when the source ships a ``compile_commands.json`` (the shallowest one, ties
   broken by path), it is parsed (``arguments`` lists, or ``command`` strings split with
   :func:`shlex.split`). Its ``directory``/``file`` are absolute paths of the author's
   machine; the author's tree root is found by matching each entry's absolute file path
   against the tail of a path of our tree (the root that maps the most entries wins, ties →
   the shortest, then the smallest string), and every path is made relative to it. Entries
   whose file is not in our tree or not a C/C++/CUDA file (``.S``, ``.m`` …) are dropped,
   as are repeated entries of a file (the first is kept). Only these flags are kept (joined or separate spelling accepted):
   ``-I -isystem -iquote -D -U -std= -x -include``. Include directories (and ``-include``
   files) are rewritten into our tree when they lie inside the author's tree and dropped
   when they lie outside it (``/usr/include``, a build directory outside the tree, …); a
   forced ``-include`` of a file missing from our tree is dropped. Everything else is
   dropped: the compiler path and any wrapper (every positional word), ``-o X``, ``-c``,
   the ``-M*`` dependency flags, ``-W*``, optimization/codegen flags and anything plugin-like
   (``-fplugin=…``, ``-Xclang -load -Xclang X``, ``-B``), with the separate value of a
   dropped flag (:data:`DROPPED_WITH_VALUE`) dropped too. A ``.cu`` entry gets the lane's
   CUDA language arguments (:data:`CUDA_ARGS`) in place of its own ``-x``. A shipped file
   that is not valid JSON or has no usable entry is recorded in ``figures`` and the
   database is synthesized instead.
2. **Synthesized** — one entry per translation unit (``.c`` → ``-x c -std=c11``;
   ``.cc .cpp .cxx .c++`` → ``-x c++ -std=c++17``; ``.cu`` → :data:`CUDA_ARGS`); include
   directories: the TU's own directory first, then every directory of the tree that holds a
   header (:data:`HEADER_EXTENSIONS`), sorted, then the include roots (:func:`include_roots`:
   for every ``#include "a/b.h"`` of the tree's files, each directory ``D`` with a header
   ``D/a/b.h``), sorted; no defines. Each directory is passed twice,
   first all as ``-iquote D`` then all as ``-idirafter D``: quoted includes find the tree's
   headers before the system's, angle includes find the system's first. With plain ``-I``
   a header of the tree named like a system header shadows it for every TU — llama.cpp's
   ``common/jinja/string.h`` replaced ``<string.h>`` inside ``<cstring>`` ("no member named
   'memchr' in the global namespace" in 25 of a 60-TU sample).

CUDA (``.cu``) — measured with the semantic lane on 24 ``.cu`` files spread over
``vendor/llama.cpp/ggml/src/ggml-cuda`` (llama-cpp-python 0.3.36), libclang 18.1.1:
libclang accepts ``-x cuda --cuda-host-only -nocudainc -nocudalib`` (no driver error), but
clang's CUDA wrapper headers live in the resource directory the libclang wheel does not
ship, so ``__global__``/``__device__`` stay undefined unless a toolkit's ``cuda_runtime.h``
is found. Every one of those TUs ends with a fatal missing header in both modes
(``cuda_fp16.h`` without a toolkit; ``cublas_v2.h`` with a toolkit that lacks cuBLAS) —
libclang keeps the rest of the AST, so edges are still emitted. Call sites in the tree
seen / resolved into the tree / edges:

- ``-x c++`` + keyword defines: 11,501 / 7,530 / 4,681 without toolkit headers,
  17,676 / 8,685 / 4,844 with them;
- ``-x cuda --cuda-host-only -nocudainc -nocudalib``: 7,304 / 4,353 / 1,960 without,
  16,189 / 8,769 / 4,858 with them.

Host C++ with the CUDA keywords defined away (:data:`CUDA_KEYWORD_DEFINES`) is as good with
the toolkit and much better without it, so the database uses it; :data:`CUDA_MODES` keeps
both (``build_database(..., cuda_mode="cuda")``) for comparison.

Freshness: :func:`inputs_sha256` hashes the sorted list of every path plus the path and
content sha256 of each build file (:func:`is_build_file`: CMake, Make, Meson, Bazel,
autotools, gyp, SCons, Ninja, ``setup.py``, ``pyproject.toml``, ``compile_commands.json``,
…) and the database rules version :data:`DATABASE_VERSION`. A database records the
revision it was built for and that hash; :func:`check_current` (and :func:`load_database`)
refuse one built for another revision or other inputs with :class:`StaleDatabaseError`,
so a database is never reused across revisions and is regenerated whenever build files or
the file list change.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import shlex
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DATABASE_VERSION",
    "TU_EXTENSIONS",
    "HEADER_EXTENSIONS",
    "CUDA_ARGS",
    "CUDA_MODES",
    "CUDA_KEYWORD_DEFINES",
    "CompileDatabase",
    "StaleDatabaseError",
    "build_database",
    "check_current",
    "entry_language",
    "inputs_sha256",
    "is_build_file",
    "is_translation_unit",
    "load_database",
    "parse_shipped",
]

#: Version of the database rules; part of :func:`inputs_sha256`, so a rule change regenerates.
DATABASE_VERSION = "2"

#: Translation-unit extension (lower case) → language arguments of a synthesized entry.
_C_ARGS = ["-x", "c", "-std=c11"]
_CXX_ARGS = ["-x", "c++", "-std=c++17"]
#: CUDA keywords defined away when ``.cu`` files are parsed as host C++ (see module doc).
CUDA_KEYWORD_DEFINES = [
    "-D__CUDACC__", "-D__global__=", "-D__device__=", "-D__host__=", "-D__shared__=",
    "-D__constant__=", "-D__managed__=", "-D__forceinline__=inline", "-D__noinline__=",
    "-D__launch_bounds__(...)=", "-D__grid_constant__=",
]
#: The two measured ways of parsing ``.cu`` files (module doc): host C++ (used) and CUDA host.
CUDA_MODES = {
    "c++": ["-x", "c++", "-std=c++17", *CUDA_KEYWORD_DEFINES],
    "cuda": ["-x", "cuda", "--cuda-host-only", "-nocudainc", "-nocudalib", "-std=c++17"],
}
#: Language arguments of a ``.cu`` entry (the ``c++`` mode of :data:`CUDA_MODES`).
CUDA_ARGS = CUDA_MODES["c++"]
TU_EXTENSIONS = {
    ".c": _C_ARGS,
    ".cc": _CXX_ARGS, ".cpp": _CXX_ARGS, ".cxx": _CXX_ARGS, ".c++": _CXX_ARGS,
    ".cu": CUDA_ARGS,
}
#: Extensions (lower case) whose directories become include directories of a synthesized database.
HEADER_EXTENSIONS = frozenset({".h", ".hh", ".hpp", ".hxx", ".h++", ".inl", ".ipp", ".tpp", ".cuh"})

#: File names (exact) that describe a build.
BUILD_FILE_NAMES = frozenset({
    "CMakeLists.txt", "CMakePresets.json", "CMakeUserPresets.json", "meson.build", "meson_options.txt",
    "meson.options", "BUILD", "BUILD.bazel", "WORKSPACE", "WORKSPACE.bazel", "MODULE.bazel", "BUCK",
    "setup.py", "setup.cfg", "pyproject.toml", "compile_commands.json", "compile_flags.txt",
    "SConstruct", "SConscript", "build.ninja", "xmake.lua", "premake5.lua", "premake4.lua",
    "conanfile.txt", "conanfile.py", "vcpkg.json", "Kbuild", "Android.mk", "Application.mk",
    "build.zig", "Cargo.toml", "package.json", "binding.gyp",
})
#: File-name prefixes (``Makefile``, ``Makefile.am``, ``configure``, ``configure.ac`` …).
BUILD_FILE_PREFIXES = ("Makefile", "makefile", "GNUmakefile", "configure")
#: File-name suffixes (lower case).
BUILD_FILE_SUFFIXES = (".cmake", ".cmake.in", ".gyp", ".gypi", ".mk", ".bzl", ".ninja", ".pro", ".pri",
                       ".vcxproj", ".sln", ".meson")

#: Kept flags: spelled with the value joined (``-Ifoo``) or as the next argument (``-I foo``).
_KEEP_PATH = ("-isystem", "-iquote", "-include", "-I")  # longest first: "-include" before "-I"
_KEEP_VALUE = ("-D", "-U", "-x")
#: Dropped flags whose value is the next argument (so the value is dropped with them).
DROPPED_WITH_VALUE = frozenset({
    "-o", "-MF", "-MT", "-MQ", "-Xclang", "-Xpreprocessor", "-Xassembler", "-Xlinker", "-Xcompiler",
    "-B", "-L", "-l", "-arch", "-target", "-isysroot", "--sysroot", "-include-pch", "-imacros",
    "-idirafter", "-iprefix", "-iwithprefix", "-iwithprefixbefore", "-mllvm", "--param", "-aux-info",
    "-u", "-z", "-T", "-F", "-framework", "-gcc-toolchain", "--gcc-toolchain", "-dependency-file",
    "-serialize-diagnostics", "-ccc-gcc-name", "-Xcuda-ptxas", "-Xcuda-fatbinary", "-Xarch_host",
    "-Xarch_device", "-load", "-plugin", "-add-plugin", "-plugin-arg",
})


class StaleDatabaseError(ValueError):
    """A database was built for another revision or from other inputs (build files, file list)."""


@dataclass
class CompileDatabase:
    """The compile command database of one revision.

    ``entries``: one dict per TU, sorted by ``file``: ``file`` (POSIX path relative to the
    source tree), ``arguments`` (``list[str]``; language, standard, include directories
    relative to the tree, defines — no compiler, no input file) and ``directory`` (always
    ``"."``, the tree root). ``shipped``: the entries come from a ``compile_commands.json``
    of the source (``shipped_path``), else they were synthesized. ``inputs_sha256``: see
    :func:`inputs_sha256`. ``revision``: the revision it was built for. ``figures``: counts
    (``tus``, ``entries``, ``include_dirs`` …; for a shipped file also ``shipped_entries``,
    ``dropped_not_in_tree``, ``dropped_duplicates``, ``dropped_flags``,
    ``dropped_include_dirs``, ``author_root``; ``shipped_rejected`` when a shipped file
    could not be used).
    """

    entries: list[dict[str, Any]]
    shipped: bool
    shipped_path: str | None
    inputs_sha256: str
    revision: str
    figures: dict[str, Any] = field(default_factory=dict)
    version: str = DATABASE_VERSION

    def to_json(self) -> str:
        """Deterministic JSON (sorted keys, one entry per line)."""
        head = {k: v for k, v in self._as_dict().items() if k != "entries"}
        lines = [json.dumps(e, sort_keys=True, ensure_ascii=False) for e in self.entries]
        body = ",\n  ".join(lines)
        return (json.dumps(head, sort_keys=True, ensure_ascii=False)[:-1]
                + (', "entries": [\n  ' + body + "\n]}" if lines else ', "entries": []}') + "\n")

    def _as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "revision": self.revision, "inputs_sha256": self.inputs_sha256,
                "shipped": self.shipped, "shipped_path": self.shipped_path, "figures": self.figures,
                "entries": self.entries}

    @classmethod
    def from_json(cls, text: str | bytes) -> "CompileDatabase":
        """Parse :meth:`to_json` output. Raises ``ValueError`` on malformed input (no
        freshness check: use :func:`load_database` or :func:`check_current` for that)."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"compile database: not JSON: {e}") from e
        if not isinstance(doc, dict):
            raise ValueError("compile database: top level is not an object")
        missing = {"version", "revision", "inputs_sha256", "shipped", "entries"} - doc.keys()
        if missing:
            raise ValueError(f"compile database: missing keys {sorted(missing)}")
        entries = doc["entries"]
        if not isinstance(entries, list) or not all(
                isinstance(e, dict) and isinstance(e.get("file"), str) and isinstance(e.get("arguments"), list)
                and all(isinstance(a, str) for a in e["arguments"]) for e in entries):
            raise ValueError("compile database: entries must be objects with a file and a list of string arguments")
        return cls(entries=[{"file": e["file"], "arguments": list(e["arguments"]), "directory": e.get("directory", ".")}
                            for e in entries],
                   shipped=bool(doc["shipped"]), shipped_path=doc.get("shipped_path"),
                   inputs_sha256=str(doc["inputs_sha256"]), revision=str(doc["revision"]),
                   figures=dict(doc.get("figures") or {}), version=str(doc["version"]))

    def compile_commands(self, directory: str) -> list[dict[str, Any]]:
        """The standard ``compile_commands.json`` form for a tree materialized at
        ``directory`` (absolute): ``arguments`` start with a nominal compiler name
        (``cc``/``c++``) and end with the file."""
        out = []
        for e in self.entries:
            compiler = "cc" if entry_language(e) == "c" else "c++"
            out.append({"directory": directory, "file": e["file"], "arguments": [compiler, *e["arguments"], e["file"]]})
        return out


# --------------------------------------------------------------------------- helpers

def is_build_file(path: str) -> bool:
    """True for files that describe a build (exact names, prefixes and suffixes above)."""
    name = posixpath.basename(path)
    low = name.lower()
    return (name in BUILD_FILE_NAMES or name.startswith(BUILD_FILE_PREFIXES)
            or low.endswith(BUILD_FILE_SUFFIXES))


def entry_language(entry: dict[str, Any]) -> str:
    """``"c"`` or ``"c++"`` for a database entry: from its last ``-x`` (``-x c`` → C, any
    other language → C++), else from the file extension (``.c`` → C)."""
    lang = None
    args = entry["arguments"]
    for i, a in enumerate(args):
        if a == "-x" and i + 1 < len(args):
            lang = args[i + 1]
        elif a.startswith("-x") and len(a) > 2:
            lang = a[2:]
    if lang is None:
        return "c" if _ext(entry["file"]) == ".c" else "c++"
    return "c" if lang == "c" else "c++"


def _ext(path: str) -> str:
    return posixpath.splitext(path)[1].lower()


def is_translation_unit(path: str) -> bool:
    """True for ``.c .cc .cpp .cxx .c++ .cu`` files (case-insensitive)."""
    return _ext(path) in TU_EXTENSIONS


#: ``#include "a/b.h"`` / ``#include <a/b.h>`` lines (read as text; nothing is preprocessed).
_INCLUDE_RE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\n]+)[>"]', re.MULTILINE)


def include_paths(files: list[tuple[str, bytes]]) -> list[str]:
    """Sorted unique include paths with a directory part (``grpc/support/log.h``) named by
    the ``#include`` lines of the C/C++ files (TUs and headers); ``..``-relative and
    absolute ones are ignored."""
    seen: set[str] = set()
    for p, data in files:
        if _ext(p) in TU_EXTENSIONS or _ext(p) in HEADER_EXTENSIONS:
            for m in _INCLUDE_RE.finditer(data):
                inc = m.group(1).decode("utf-8", "replace").strip()
                if "/" in inc and not inc.startswith(("/", "../", "./")) and "/../" not in inc:
                    seen.add(inc)
    return sorted(seen)


def include_roots(paths: list[str], includes: list[str]) -> list[str]:
    """Directories ``D`` of the tree such that ``D/INC`` is a header of the tree for some
    include path ``INC`` of :func:`include_paths` — the roots project-relative includes
    (``#include <absl/base/config.h>``) are written against. Sorted; ``"."`` for the top."""
    by_suffix: dict[str, set[str]] = {}
    for p in paths:
        if _ext(p) not in HEADER_EXTENSIONS:
            continue
        parts = p.split("/")
        for k in range(1, len(parts) - 1):  # suffixes with at least one directory
            by_suffix.setdefault("/".join(parts[k:]), set()).add("/".join(parts[:k]))
        if len(parts) > 1:
            by_suffix.setdefault(p, set()).add(".")
    roots: set[str] = set()
    for inc in includes:
        roots |= by_suffix.get(inc, set())
    return sorted(roots)


def inputs_sha256(files: list[tuple[str, bytes]]) -> str:
    """sha256 (hex) over :data:`DATABASE_VERSION`, the sorted list of every path,
    ``(path, sha256(content))`` of every build file (:func:`is_build_file`) and the include
    paths of :func:`include_paths` (they choose the include roots). Other content changes
    do not change it (the database depends only on these)."""
    paths = sorted(p for p, _ in files)
    build = sorted((p, hashlib.sha256(d).hexdigest()) for p, d in files if is_build_file(p))
    doc = json.dumps({"version": DATABASE_VERSION, "paths": paths, "build_files": build,
                      "includes": include_paths(files)},
                     sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(doc.encode("utf-8", "surrogatepass")).hexdigest()


def _header_dirs(paths: list[str]) -> list[str]:
    dirs = {posixpath.dirname(p) or "." for p in paths if _ext(p) in HEADER_EXTENSIONS}
    return sorted(dirs)


def _dir_of(path: str) -> str:
    return posixpath.dirname(path) or "."


def _include_args(dirs: list[str]) -> list[str]:
    """Each directory as ``-iquote D`` (quoted includes: before the system headers), then
    each as ``-idirafter D`` (angle includes: after the system headers)."""
    return [x for d in dirs for x in ("-iquote", d)] + [x for d in dirs for x in ("-idirafter", d)]


# --------------------------------------------------------------------------- synthesis

def _synthesize(paths: list[str], cuda_args: list[str], includes: list[str] = ()) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    hdirs = _header_dirs(paths)
    roots = [d for d in include_roots(paths, list(includes)) if d not in set(hdirs)]
    hdirs = hdirs + roots
    entries = []
    langs: Counter[str] = Counter()
    for p in sorted(paths):
        ext = _ext(p)
        if ext not in TU_EXTENSIONS:
            continue
        own = _dir_of(p)
        dirs = [own] + [d for d in hdirs if d != own]
        lang = cuda_args if ext == ".cu" else TU_EXTENSIONS[ext]
        entries.append({"file": p, "arguments": [*lang, *_include_args(dirs)], "directory": "."})
        langs[ext] += 1
    return entries, {"tus": len(entries), "include_dirs": len(hdirs), "include_roots": len(roots),
                     "tus_by_extension": dict(sorted(langs.items()))}


# --------------------------------------------------------------------------- shipped

def _norm_abs(path: str) -> str:
    p = path.replace("\\", "/")
    return posixpath.normpath(p)


def _is_abs(path: str) -> bool:
    """POSIX absolute, or a Windows drive path (``C:/…``) once backslashes are slashes."""
    return path.startswith("/") or (len(path) > 2 and path[1] == ":" and path[2] == "/")


def _author_root(abs_files: list[str], tree: set[str]) -> str | None:
    """The author's tree root: for each absolute file, every prefix P such that the rest is
    a path of our tree; the prefix that maps the most entries wins (ties: shortest, then
    smallest)."""
    votes: Counter[str] = Counter()
    for f in abs_files:
        parts = f.split("/")
        seen = set()
        for i in range(1, len(parts)):
            rel = "/".join(parts[i:])
            if rel in tree:
                root = "/".join(parts[:i]) or "/"
                if root not in seen:
                    seen.add(root)
                    votes[root] += 1
    if not votes:
        return None
    return min(votes, key=lambda r: (-votes[r], len(r), r))


def _relative_to(root: str, path: str) -> str | None:
    """``path`` relative to ``root`` (both normalized absolute), or None when outside."""
    if path == root:
        return "."
    prefix = root if root.endswith("/") else root + "/"
    return path[len(prefix):] if path.startswith(prefix) else None


def _split_flag(args: list[str], i: int, names: tuple[str, ...]) -> tuple[str, str, int] | None:
    """Match a kept flag at ``args[i]`` (joined or separate value): (name, value, next index)."""
    a = args[i]
    for n in names:
        if a == n:
            return (n, args[i + 1], i + 2) if i + 1 < len(args) else None
        if a.startswith(n):
            return n, a[len(n):], i + 1
    return None


def _filter_arguments(args: list[str], directory: str, root: str, tree: set[str],
                      cuda_args: list[str] | None, fig: Counter) -> list[str]:
    """Kept flags of one shipped entry (module doc); ``cuda_args`` replaces ``-x`` of a ``.cu``."""
    is_cuda = cuda_args is not None
    kept: list[str] = []
    i = 0
    n = len(args)
    while i < n:
        a = args[i]
        if a in DROPPED_WITH_VALUE:
            fig["dropped_flags"] += 1
            i += 2
            continue
        m = _split_flag(args, i, _KEEP_PATH)
        if m:
            name, value, i = m
            value = value.replace("\\", "/")
            absval = _norm_abs(value if _is_abs(value) else posixpath.join(directory, value))
            rel = _relative_to(root, absval)
            if rel is None or rel.startswith("../"):
                fig["dropped_include_dirs" if name != "-include" else "dropped_forced_includes"] += 1
                continue
            if name == "-include":
                if rel not in tree:
                    fig["dropped_forced_includes"] += 1
                    continue
                kept += ["-include", rel]
            elif name == "-I":
                kept.append(f"-I{rel}")
            else:
                kept += [name, rel]
            continue
        m = _split_flag(args, i, _KEEP_VALUE)
        if m:
            name, value, i = m
            if name == "-x":
                if not is_cuda:
                    kept += ["-x", value]
                continue
            kept.append(f"{name}{value}")
            continue
        if a.startswith("-std="):
            kept.append(a)
            i += 1
            continue
        if a.startswith("-"):
            fig["dropped_flags"] += 1
        i += 1
    if cuda_args is not None:
        has_std = any(k.startswith("-std=") for k in kept)
        kept = [*(x for x in cuda_args if not (has_std and x.startswith("-std="))), *kept]
    return kept


def parse_shipped(text: bytes, shipped_path: str, paths: list[str],
                  cuda_args: list[str] = CUDA_ARGS) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Entries of a shipped ``compile_commands.json`` made relative to our tree (module doc).

    ``shipped_path``: its path in the tree (a relative ``directory`` is taken relative to
    it); ``paths``: every path of the tree; ``cuda_args``: language arguments that replace
    the ``-x`` of ``.cu`` entries. Returns ``(entries sorted by file, figures)``.
    Raises ``ValueError`` when the file is not a JSON list of entries or nothing maps into
    the tree.
    """
    try:
        doc = json.loads(text.decode("utf-8", "replace"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{shipped_path}: not JSON: {e}") from e
    if not isinstance(doc, list):
        raise ValueError(f"{shipped_path}: not a list of entries")
    tree = set(paths)
    base = "/" + (posixpath.dirname(shipped_path) or ".")
    raw = []
    for e in doc:
        if not isinstance(e, dict) or not isinstance(e.get("file"), str):
            continue
        directory = e.get("directory") if isinstance(e.get("directory"), str) else ""
        directory = directory.replace("\\", "/")
        directory = _norm_abs(directory if _is_abs(directory) else posixpath.join(base, directory))
        if isinstance(e.get("arguments"), list):
            args = [str(a) for a in e["arguments"]]
        elif isinstance(e.get("command"), str):
            try:
                args = shlex.split(e["command"])
            except ValueError:
                continue
        else:
            continue
        f = e["file"].replace("\\", "/")
        raw.append((_norm_abs(f if _is_abs(f) else posixpath.join(directory, f)), directory, args))
    if not raw:
        raise ValueError(f"{shipped_path}: no entry with a file and arguments or command")
    root = _author_root([r[0] for r in raw], tree)
    if root is None:
        raise ValueError(f"{shipped_path}: no entry's file is in the tree")
    fig: Counter[str] = Counter()
    out: dict[str, dict[str, Any]] = {}
    for absfile, directory, args in raw:
        rel = _relative_to(root, absfile)
        if rel is None or rel not in tree:
            fig["dropped_not_in_tree"] += 1
            continue
        if _ext(rel) not in TU_EXTENSIONS and _ext(rel) not in HEADER_EXTENSIONS:
            fig["dropped_not_c_family"] += 1  # assembly, Objective-C, … (not materialized)
            continue
        if rel in out:
            fig["dropped_duplicates"] += 1
            continue
        kept = _filter_arguments(args, directory, root, tree, cuda_args if _ext(rel) == ".cu" else None, fig)
        out[rel] = {"file": rel, "arguments": kept, "directory": "."}
    entries = [out[k] for k in sorted(out)]
    figures = {"shipped_entries": len(doc), "tus": len(entries), "author_root": root,
               "dropped_not_in_tree": fig["dropped_not_in_tree"], "dropped_duplicates": fig["dropped_duplicates"],
               "dropped_not_c_family": fig["dropped_not_c_family"],
               "dropped_flags": fig["dropped_flags"], "dropped_include_dirs": fig["dropped_include_dirs"],
               "dropped_forced_includes": fig["dropped_forced_includes"]}
    return entries, figures


def _shipped_candidates(paths: list[str]) -> list[str]:
    c = [p for p in paths if posixpath.basename(p) == "compile_commands.json"]
    return sorted(c, key=lambda p: (p.count("/"), p))


# --------------------------------------------------------------------------- public entry

def build_database(files: list[tuple[str, bytes]], revision: str, *, cuda_mode: str = "c++") -> CompileDatabase:
    """The compile command database of one revision (module doc for the rules).

    ``files``: ``(path, bytes)`` of every file of the source (stage 0's ``source_files``),
    paths POSIX and relative; ``revision``: the revision they were read at (stage 0's
    ``revision`` column). ``cuda_mode``: ``"c++"`` (default, measured better) or ``"cuda"``
    — how synthesized ``.cu`` entries are parsed (:data:`CUDA_MODES`). Deterministic: the
    same files give the same database (and the same :meth:`CompileDatabase.to_json`).
    Raises ``ValueError`` for an unknown ``cuda_mode``.
    """
    if cuda_mode not in CUDA_MODES:
        raise ValueError(f"cuda_mode must be one of {sorted(CUDA_MODES)}, not {cuda_mode!r}")
    paths = sorted({p for p, _ in files})
    content = dict(files)
    digest = inputs_sha256(files)
    rejected = []
    for cand in _shipped_candidates(paths):
        try:
            entries, figs = parse_shipped(content[cand], cand, paths, CUDA_MODES[cuda_mode])
        except ValueError as e:
            rejected.append(str(e))
            continue
        if entries:
            figs["entries"] = len(entries)
            if rejected:
                figs["shipped_rejected"] = rejected
            return CompileDatabase(entries, True, cand, digest, revision, figs)
        rejected.append(f"{cand}: no entry maps into the tree")
    entries, figs = _synthesize(paths, CUDA_MODES[cuda_mode], include_paths(files))
    figs["entries"] = len(entries)
    if cuda_mode != "c++":
        figs["cuda_mode"] = cuda_mode
    if rejected:
        figs["shipped_rejected"] = rejected
    return CompileDatabase(entries, False, None, digest, revision, figs)


def check_current(db: CompileDatabase, files: list[tuple[str, bytes]], revision: str) -> None:
    """Refuse a database that is not the one for these files at this revision.

    Raises :class:`StaleDatabaseError` naming what differs: the revision it was built for,
    its inputs hash (build files or file list changed) or its rules version.
    """
    if db.revision != revision:
        raise StaleDatabaseError(
            f"compile database was built for revision {db.revision!r}, not {revision!r}: rebuild it for this revision")
    if db.version != DATABASE_VERSION:
        raise StaleDatabaseError(f"compile database rules version {db.version!r} != {DATABASE_VERSION!r}: rebuild it")
    want = inputs_sha256(files)
    if db.inputs_sha256 != want:
        raise StaleDatabaseError(
            f"compile database inputs_sha256 {db.inputs_sha256[:12]}… does not match the files of revision "
            f"{revision!r} ({want[:12]}…): build files or the file list changed; rebuild it")


def load_database(text: str | bytes, files: list[tuple[str, bytes]], revision: str) -> CompileDatabase:
    """Parse a stored database and check it is current (:func:`check_current`).

    Raises ``ValueError`` on malformed JSON and :class:`StaleDatabaseError` (a ``ValueError``)
    when it was built for another revision or from other inputs.
    """
    db = CompileDatabase.from_json(text)
    check_current(db, files, revision)
    return db
