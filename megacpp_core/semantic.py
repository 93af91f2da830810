"""The libclang semantic graph lane (SPEC §4, optional layer 5).

Given a source tree materialized on disk (:func:`materialize_tree`) and its per-revision
compile command database (:mod:`megacpp_core.compile_commands`), :func:`run_semantic`
parses every translation unit with libclang (``clang.cindex`` of the ``libclang`` wheel,
18.1.1) in a pool of worker **processes** and emits the cross-file, semantically resolved
edges of the tree, keyed by clang USRs:

- ``call`` — a ``CALL_EXPR`` inside a function, method, constructor, destructor, conversion
  or function template (calls in lambdas count for the enclosing named function; calls in
  namespace-scope initializers are not call sites) → the callee the call refers to
  (``referenced``; a template specialization is mapped to its template, a member of a class
  template specialization to the member of the template). ``from`` is the innermost
  enclosing function-like declaration (its USR is also that of its other declarations).
- ``type`` — a ``CXX_BASE_SPECIFIER`` (from the class that derives) and the types of
  ``FIELD_DECL`` (from the enclosing record) and ``PARM_DECL`` (from the enclosing
  function): pointers, references and arrays are peeled to the pointee/element type, a
  template specialization is mapped to its template, and the edge is emitted when the
  declaration is a class, struct, union, enum, typedef or alias declared in the tree.
- ``include`` — ``#include`` directives (detailed processing record) whose includer and
  included file are both in the tree; their ``from_usr``/``to_usr`` are ``file:PATH``.

USRs are clang's (``c:@N@geo@F@scale#I#``; functions with internal linkage and typedefs
carry the base name of their file, ``c:main.cpp@F@total#…``), so they do not depend on
where the tree is materialized. Only code whose (expansion) location is a file under the
tree root is walked; system headers are parsed but not walked. ``from_file``/``from_line``
is the call site, the base specifier, field or parameter, or the directive. ``to_file``/``to_line`` is the callee's or
type's **definition** when one was seen in the tree — in the same TU first, else in any TU
of the run (smallest ``(file, line)``) — else its declaration (the first line of the
included file for ``include``). Files are POSIX paths relative to the tree root. Edges are
deduplicated and sorted, so the tables do not depend on completion order.

Call sites and resolution, per TU: a *call site* is a ``CALL_EXPR`` in a function (as
above) located in the tree (constructor calls, implicit ones included, are ``CALL_EXPR``
too). It is **resolved** when ``referenced`` is a function-like declaration (function,
method, constructor, destructor, conversion, function template) with a non-empty USR
located in some file — in the tree or in a system header — and **resolved into the tree**
when that declaration or its definition lies in the tree. Unresolved: compiler builtins
(``__builtin_*``, ``__sync_*``, ``__atomic_*`` …, which libclang declares implicitly at
their first use), implicit declarations of undeclared C functions, dependent calls in
templates, and calls through function pointers (``referenced`` is the pointer variable).
``call_coverage`` = resolved / seen over all TUs; ``call_coverage_tree`` = resolved into
the tree / seen. Only calls resolved into the tree become edges.

System headers (:func:`system_include_dirs`): found at run time by asking the system
compiler for its ``#include <...>`` search list; the libclang wheel has no clang resource
directory (``stddef.h``, ``stdarg.h``, ``float.h``… are missing: a bare parse of ``#include
<stddef.h>`` is a fatal error), and gcc's own include directory in that list
(``/usr/lib/gcc/<triple>/<N>/include`` on Debian) provides them: with the list as
``-isystem``, ``#include <vector>`` (C++17/20) and ``<stddef.h>``/``<stdarg.h>``/``<stdio.h>``
(C11) parse without any diagnostic. gcc's intrinsics headers (``immintrin.h``) use gcc
builtins clang does not know and produce (non-fatal) errors. The running interpreter's
include directory (``sysconfig``, when it holds ``Python.h``) is added, because the corpora
are Python-package sdists whose extension modules include ``<Python.h>``. ``.cu`` TUs also
get a CUDA toolkit include directory when one is found (:func:`cuda_include_dirs`).

Extra arguments of every parse (:data:`LANE_ARGUMENTS`): ``-ferror-limit=0`` (clang's
default limit of 20 errors turns an error-heavy TU into a fatal one and stops the parse),
``-fno-spell-checking`` (typo correction is slow and would invent references) and ``-w``
(warnings are not counted).

Statuses (``build_info.status``): ``ok`` (no error), ``errors`` (errors, none fatal),
``fatal`` (a fatal error such as a missing include — libclang keeps the rest of the AST and
its edges are kept; also a TU libclang refuses or a file missing from the tree), ``timeout``
(the worker was killed after ``timeout_s``) and ``crashed`` (the worker process died or
raised). ``tu_coverage`` = share of TUs that are ``ok`` or ``errors``.

Test hook (tests only): ``MEGACPP_SEMANTIC_TEST_HANG`` and ``MEGACPP_SEMANTIC_TEST_CRASH``,
comma-separated file names (a tree path or a base name), are read by :func:`run_semantic`
in the calling process when it starts and passed with each job; the worker parsing a named
file then sleeps forever (hang) or kills itself with ``SIGSEGV`` (crash).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing
import os
import posixpath
import time
from collections import defaultdict
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from .acquire import language_of
from .compile_commands import CompileDatabase, entry_language
from .system_headers import (  # noqa: F401  (re-exported: part of the lane's API)
    _cuda_dirs_probe,
    cuda_include_dirs,
    python_include_dirs,
    system_include_dirs,
)
from .libclang_worker import parse_tu, warm  # noqa: F401  (parse_tu: part of this module's API)

__all__ = [
    "EDGES_SCHEMA",
    "BUILD_INFO_SCHEMA",
    "LANE_ARGUMENTS",
    "SemanticResult",
    "UnsafePathError",
    "cuda_include_dirs",
    "lane_arguments",
    "materialize_tree",
    "parse_tu",
    "python_include_dirs",
    "run_semantic",
    "system_include_dirs",
]

#: Edge table: one row per unique edge, sorted by (kind, from_file, from_line, from_usr, to_usr, to_file, to_line).
EDGES_SCHEMA = pa.schema([
    ("from_usr", pa.string()),
    ("to_usr", pa.string()),
    ("kind", pa.string()),  # call | type | include
    ("from_file", pa.string()),
    ("to_file", pa.string()),
    ("from_line", pa.int32()),
    ("to_line", pa.int32()),
])

#: Per-TU provenance, sorted by file.
BUILD_INFO_SCHEMA = pa.schema([
    ("file", pa.string()),
    ("arguments", pa.list_(pa.string())),  # database arguments (tree-relative) + lane arguments + system includes
    ("shipped", pa.bool_()),
    ("status", pa.string()),  # ok | errors | fatal | timeout | crashed
    ("errors", pa.int32()),
    ("fatal", pa.int32()),
    ("call_sites", pa.int32()),
    ("calls_resolved", pa.int32()),
    ("calls_resolved_tree", pa.int32()),
    ("edges", pa.int32()),  # edges this TU emitted before cross-TU deduplication
    ("seconds", pa.float64()),  # parse + walk inside the worker; wall time until kill for timeout/crashed
    ("peak_rss_mb", pa.float64()),  # ru_maxrss of the worker process after this TU (MiB); null if it died
    ("message", pa.string()),  # first error/fatal diagnostic, or why the TU timed out/crashed; null otherwise
])

#: Arguments added to every parse (module doc).
LANE_ARGUMENTS = ["-ferror-limit=0", "-fno-spell-checking", "-w"]
STATUSES = ("ok", "errors", "fatal", "timeout", "crashed")
HANG_ENV = "MEGACPP_SEMANTIC_TEST_HANG"
CRASH_ENV = "MEGACPP_SEMANTIC_TEST_CRASH"
#: Seconds a fresh worker may take to start and load libclang before the run gives up on it.
WORKER_START_TIMEOUT_S = 120.0


class UnsafePathError(ValueError):
    """A path to materialize is absolute, contains ``..``/empty components, or the
    destination is not a fresh directory."""


def lane_arguments(entry: dict[str, Any]) -> list[str]:
    """The arguments a TU is parsed with, before tree-relative paths are made absolute:
    the database entry's arguments, :data:`LANE_ARGUMENTS`, the CUDA toolkit include
    directory for ``.cu`` files, then every system include directory as ``-isystem``."""
    extra: list[str] = []
    if posixpath.splitext(entry["file"])[1].lower() == ".cu":
        for d in cuda_include_dirs():
            extra += ["-isystem", d]
    for d in system_include_dirs(entry_language(entry)):
        extra += ["-isystem", d]
    return [*entry["arguments"], *LANE_ARGUMENTS, *extra]


_PATH_FLAGS = ("-isystem", "-iquote", "-idirafter", "-include", "-I")


def _absolute_arguments(args: list[str], root: str) -> list[str]:
    """Tree-relative paths of ``-I -isystem -iquote -idirafter -include`` made absolute under ``root``."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        for flag in _PATH_FLAGS:
            if a == flag and i + 1 < len(args):
                v = args[i + 1]
                out += [flag, v if os.path.isabs(v) else os.path.normpath(os.path.join(root, v))]
                i += 2
                break
            if a.startswith(flag) and a != flag:
                v = a[len(flag):]
                out.append(flag + (v if os.path.isabs(v) else os.path.normpath(os.path.join(root, v))))
                i += 1
                break
        else:
            out.append(a)
            i += 1
    return out


# --------------------------------------------------------------------------- materialize

def _safe_parts(path: str) -> list[str]:
    if not isinstance(path, str) or not path or path.startswith(("/", "\\")) or "\\" in path or "\x00" in path \
            or (len(path) > 1 and path[1] == ":"):
        raise UnsafePathError(f"refusing to materialize {path!r}: not a relative POSIX path")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePathError(f"refusing to materialize {path!r}: empty, '.' or '..' component")
    return parts


def materialize_tree(files: list[tuple[str, bytes]], dest: Path, database: CompileDatabase | None = None) -> list[str]:
    """Write the C/C++ files of a source (``acquire.language_of`` not None: ``.c .cc .cpp
    .cxx .c++ .h .hh .hpp .hxx .h++ .inl .ipp .tpp .cu .cuh``) under ``dest``, and, when a
    ``database`` is given, its ``compile_commands.json`` (standard form, ``directory`` =
    absolute ``dest``) at ``dest/compile_commands.json``.

    ``dest`` must not exist or be an empty directory (so no pre-existing symlink can
    redirect a write). Every path must be relative POSIX without empty, ``.`` or ``..``
    components; files are created exclusively (``O_EXCL``, ``O_NOFOLLOW``), so a duplicate
    path is refused too. Raises :class:`UnsafePathError`. Returns the written tree paths,
    sorted.
    """
    dest = Path(dest)
    if dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir()))):
        raise UnsafePathError(f"refusing to materialize into {dest}: not a fresh empty directory")
    dest.mkdir(parents=True, exist_ok=True)
    chosen = sorted((p, d) for p, d in files if language_of(p) is not None)
    for p, _ in chosen:
        _safe_parts(p)
    written = []
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for p, data in chosen:
        target = dest.joinpath(*p.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(target, flags, 0o644)
        except FileExistsError as e:
            raise UnsafePathError(f"refusing to materialize {p!r}: path written twice") from e
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        written.append(p)
    if database is not None:
        cc_path = dest / "compile_commands.json"
        if cc_path.exists():
            raise UnsafePathError(f"refusing to overwrite {cc_path}")
        cc_path.write_text(json.dumps(database.compile_commands(str(dest.resolve())), indent=1, sort_keys=True) + "\n")
    return written


# --------------------------------------------------------------------------- pool

@dataclass
class SemanticResult:
    """Output of :func:`run_semantic`.

    ``edges``: :data:`EDGES_SCHEMA` table (unique, sorted); ``build_info``:
    :data:`BUILD_INFO_SCHEMA` table, one row per database entry, sorted by file;
    ``figures``: ``tus_total``, ``tus_ok``/``tus_errors``/``tus_fatal``/``tus_timeout``/
    ``tus_crashed``, ``tu_coverage`` ((ok + errors) / total; 0.0 without TUs),
    ``call_sites``, ``calls_resolved``, ``calls_resolved_tree``, ``call_coverage``
    (resolved / call sites; 0.0 without call sites), ``call_coverage_tree``,
    ``edges``/``edges_call``/``edges_type``/``edges_include``, ``walk_errors`` (AST nodes the
    Python bindings could not represent, skipped with their subtree), ``wall_seconds``,
    ``parse_seconds`` (sum of per-TU worker seconds), ``workers``, ``worker_processes``
    (processes started, replacements included), ``tus_per_second_per_process``
    (TUs / wall seconds / workers), ``peak_rss_mb_per_worker`` (peak ``ru_maxrss`` of each
    worker process that finished a TU, MiB, descending), ``peak_rss_mb_max``,
    ``timeout_s``, ``revision``, ``shipped``, ``system_include_dirs`` (``{"c": [...],
    "c++": [...]}``), ``cuda_include_dirs``.
    """

    edges: pa.Table
    build_info: pa.Table
    figures: dict[str, Any] = field(default_factory=dict)


def _mp_context():
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class _Slot:
    """One single-process executor and the job running in it."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.executor: cf.ProcessPoolExecutor | None = None
        self.future: cf.Future | None = None
        self.job: dict | None = None
        self.started = 0.0
        self.state = "down"  # down | warming | idle | busy
        self.processes = 0

    def start(self) -> None:
        self.executor = cf.ProcessPoolExecutor(max_workers=1, mp_context=self.ctx)
        self.future = self.executor.submit(warm)
        self.started = time.monotonic()
        self.state = "warming"
        self.processes += 1

    def submit(self, job: dict) -> None:
        self.job = job
        self.future = self.executor.submit(parse_tu, job)
        self.started = time.monotonic()
        self.state = "busy"

    def kill(self) -> None:
        """Kill the worker process (a hung TU) and drop the executor."""
        ex, self.executor = self.executor, None
        if ex is None:
            return
        procs = list(getattr(ex, "_processes", {}).values())  # private, but the only handle on the worker
        for p in procs:
            try:
                p.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
        ex.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.join(timeout=10)
        self.state = "down"

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor = None
        self.state = "down"


def _hook_names(var: str) -> set[str]:
    return {n.strip() for n in os.environ.get(var, "").split(",") if n.strip()}


def _hooked(names: set[str], file: str) -> bool:
    return file in names or posixpath.basename(file) in names


def _safe_rel(path: str) -> bool:
    try:
        _safe_parts(path)
        return True
    except UnsafePathError:
        return False


def run_semantic(tree_root: str | Path, database: CompileDatabase, *, workers: int = 2,
                 timeout_s: float = 60.0, progress=None) -> SemanticResult:
    """Parse every TU of ``database`` under ``tree_root`` in ``workers`` processes.

    Each worker slot is a single-process ``ProcessPoolExecutor`` (``forkserver`` start
    method where available, else ``spawn``) that runs one TU at a time (:func:`parse_tu`).
    A TU still running after ``timeout_s`` seconds (counted from its submission to a
    warmed-up worker) gets its worker process killed and replaced, and is counted
    ``timeout``; a worker that dies (``BrokenProcessPool``) or raises is replaced and its TU
    counted ``crashed``. Neither blocks nor fails the run. Entries with an unsafe path or a
    file missing from the tree are ``fatal`` without being dispatched. Results do not
    depend on completion order (see :class:`SemanticResult`).

    ``progress(done, total)``, when given, is called each time TUs finish (any status).

    Raises ``ValueError`` for ``workers < 1`` or ``timeout_s <= 0``,
    ``FileNotFoundError`` when ``tree_root`` is not a directory, and ``RuntimeError`` when
    a worker cannot start (libclang not loadable) three times in a row.
    """
    if workers < 1 or not timeout_s > 0:
        raise ValueError("workers must be ≥ 1 and timeout_s > 0")
    root_path = Path(tree_root)
    if not root_path.is_dir():
        raise FileNotFoundError(f"tree root {tree_root} is not a directory")
    root = os.path.normpath(os.path.abspath(root_path))
    t_start = time.monotonic()
    hang, crash = _hook_names(HANG_ENV), _hook_names(CRASH_ENV)

    rows: dict[str, dict[str, Any]] = {}
    recorded: dict[str, list[str]] = {}
    jobs: list[dict[str, Any]] = []
    for e in sorted(database.entries, key=lambda e: e["file"]):
        f = e["file"]
        if f in recorded:
            continue
        args = lane_arguments(e)
        recorded[f] = args
        if not _safe_rel(f) or not os.path.isfile(os.path.join(root, *f.split("/"))):
            rows[f] = _failed_row(f, "fatal", 0.0, "file is not in the tree" if _safe_rel(f) else "unsafe path")
            rows[f]["fatal"] = 1
            continue
        jobs.append({"root": root, "file": f, "arguments": _absolute_arguments(args, root),
                     "hang": _hooked(hang, f), "crash": _hooked(crash, f)})

    pool_info = _run_pool(jobs, min(workers, len(jobs)), timeout_s, rows, progress)
    wall = time.monotonic() - t_start
    return _assemble(rows, recorded, database, pool_info, wall, workers, timeout_s)


def _failed_row(file: str, status: str, seconds: float, message: str) -> dict[str, Any]:
    return {"file": file, "status": status, "errors": 0, "fatal": 0, "call_sites": 0, "calls_resolved": 0,
            "calls_resolved_tree": 0, "edges": [], "defs": {}, "seconds": seconds, "peak_rss_kb": None,
            "message": message, "pid": None}


def _run_pool(jobs: list[dict], n: int, timeout_s: float, rows: dict[str, dict], progress=None) -> dict[str, int]:
    """Run ``jobs`` on ``n`` slots, filling ``rows`` (file → worker result or failure row).
    Returns ``{"worker_processes": …}``."""
    if not jobs:
        return {"worker_processes": 0}
    ctx = _mp_context()
    pending = list(reversed(jobs))
    slots = [_Slot(ctx) for _ in range(n)]
    start_failures = 0
    reported = -1
    try:
        for s in slots:
            s.start()
        while pending or any(s.state == "busy" for s in slots):
            for s in slots:
                if s.state == "idle" and pending:
                    s.submit(pending.pop())
            active = {s.future: s for s in slots if s.state in ("busy", "warming")}
            if not active:
                break
            now = time.monotonic()
            deadlines = [s.started + (timeout_s if s.state == "busy" else WORKER_START_TIMEOUT_S)
                         for s in active.values()]
            wait_for = max(0.0, min(deadlines) - now)
            done, _ = cf.wait(list(active), timeout=min(wait_for, 5.0) + 0.01, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                s = active[fut]
                elapsed = time.monotonic() - s.started
                if s.state == "warming":
                    try:
                        fut.result()
                        s.state = "idle"
                        start_failures = 0
                    except Exception as e:  # noqa: BLE001
                        start_failures += 1
                        s.kill()
                        if start_failures >= 3:
                            raise RuntimeError(f"libclang worker could not start: {e!r}") from e
                        s.start()
                    continue
                job = s.job
                try:
                    res = fut.result()
                    rows[job["file"]] = res
                    s.state = "idle"
                except BrokenProcessPool:
                    rows[job["file"]] = _failed_row(job["file"], "crashed", elapsed, "worker process died")
                    s.kill()
                    s.start()
                except Exception as e:  # noqa: BLE001 - a Python error in the worker: count, replace
                    rows[job["file"]] = _failed_row(job["file"], "crashed", elapsed, f"worker raised {e!r}"[:300])
                    s.kill()
                    s.start()
            if progress is not None:
                finished = sum(1 for j in jobs if j["file"] in rows)
                if finished != reported:
                    reported = finished
                    progress(finished, len(jobs))
            now = time.monotonic()
            for s in slots:
                if s.future is None or s.future.done():
                    continue
                if s.state == "busy" and now - s.started > timeout_s:
                    rows[s.job["file"]] = _failed_row(s.job["file"], "timeout", now - s.started,
                                                      f"killed after {timeout_s:g} s")
                    s.kill()
                    s.start()
                elif s.state == "warming" and now - s.started > WORKER_START_TIMEOUT_S:
                    start_failures += 1
                    s.kill()
                    if start_failures >= 3:
                        raise RuntimeError("libclang worker did not start within "
                                           f"{WORKER_START_TIMEOUT_S:g} s three times")
                    s.start()
    finally:
        for s in slots:
            if s.state in ("warming", "busy"):
                s.kill()
            else:
                s.close()
    return {"worker_processes": sum(s.processes for s in slots)}


def _assemble(rows: dict[str, dict], recorded: dict[str, list[str]], database: CompileDatabase,
              pool_info: dict[str, int], wall: float, workers: int, timeout_s: float) -> SemanticResult:
    # definitions seen anywhere in the run → fallback targets of edges that only saw a declaration
    defs: dict[str, tuple[str, int]] = {}
    for f in sorted(rows):
        for usr, loc in rows[f].get("defs", {}).items():
            loc = tuple(loc)
            if usr not in defs or loc < defs[usr]:
                defs[usr] = loc
    edges: set[tuple] = set()
    per_tu_edges: dict[str, int] = {}
    for f in sorted(rows):
        es = rows[f].get("edges", [])
        per_tu_edges[f] = len(es)
        for fu, tu_, kind, ff, tf, fl, tl, is_def in es:
            if not is_def and kind != "include" and tu_ in defs:
                tf, tl = defs[tu_]
            edges.add((fu, tu_, kind, ff, tf, int(fl), int(tl)))
    ordered = sorted(edges, key=lambda e: (e[2], e[3], e[5], e[0], e[1], e[4], e[6]))
    cols = list(zip(*ordered)) if ordered else [[] for _ in range(7)]
    edges_table = pa.table({name: list(col) for name, col in zip(EDGES_SCHEMA.names, cols)}, schema=EDGES_SCHEMA)

    files = sorted(rows)
    bi = {name: [] for name in BUILD_INFO_SCHEMA.names}
    for f in files:
        r = rows[f]
        bi["file"].append(f)
        bi["arguments"].append(recorded.get(f, []))
        bi["shipped"].append(bool(database.shipped))
        bi["status"].append(r["status"])
        for c in ("errors", "fatal", "call_sites", "calls_resolved", "calls_resolved_tree"):
            bi[c].append(int(r.get(c) or 0))
        bi["edges"].append(per_tu_edges.get(f, 0))
        bi["seconds"].append(float(r.get("seconds") or 0.0))
        rss = r.get("peak_rss_kb")
        bi["peak_rss_mb"].append(None if rss is None else round(rss / 1024.0, 3))
        bi["message"].append(r.get("message"))
    build_info = pa.table(bi, schema=BUILD_INFO_SCHEMA)

    counts = {s: sum(1 for f in files if rows[f]["status"] == s) for s in STATUSES}
    total = len(files)
    sites = sum(int(rows[f].get("call_sites") or 0) for f in files)
    res = sum(int(rows[f].get("calls_resolved") or 0) for f in files)
    res_tree = sum(int(rows[f].get("calls_resolved_tree") or 0) for f in files)
    peak_by_pid: dict[int, int] = defaultdict(int)
    for f in files:
        r = rows[f]
        if r.get("pid") is not None and r.get("peak_rss_kb") is not None:
            peak_by_pid[r["pid"]] = max(peak_by_pid[r["pid"]], int(r["peak_rss_kb"]))
    peaks = sorted((round(v / 1024.0, 1) for v in peak_by_pid.values()), reverse=True)
    kinds = {k: sum(1 for e in ordered if e[2] == k) for k in ("call", "type", "include")}
    figures = {
        "revision": database.revision,
        "shipped": bool(database.shipped),
        "tus_total": total,
        **{f"tus_{s}": counts[s] for s in STATUSES},
        "tu_coverage": round((counts["ok"] + counts["errors"]) / total, 6) if total else 0.0,
        "call_sites": sites,
        "calls_resolved": res,
        "calls_resolved_tree": res_tree,
        "call_coverage": round(res / sites, 6) if sites else 0.0,
        "call_coverage_tree": round(res_tree / sites, 6) if sites else 0.0,
        "edges": len(ordered),
        **{f"edges_{k}": v for k, v in kinds.items()},
        "walk_errors": sum(int(rows[f].get("walk_errors") or 0) for f in files),
        "wall_seconds": round(wall, 3),
        "parse_seconds": round(sum(float(rows[f].get("seconds") or 0.0) for f in files
                                   if rows[f]["status"] not in ("timeout", "crashed")), 3),
        "workers": workers,
        "worker_processes": pool_info.get("worker_processes", 0),
        "tus_per_second_per_process": round(total / wall / workers, 4) if wall > 0 and total else 0.0,
        "peak_rss_mb_per_worker": peaks,
        "peak_rss_mb_max": peaks[0] if peaks else 0.0,
        "timeout_s": timeout_s,
        "system_include_dirs": {"c": system_include_dirs("c"), "c++": system_include_dirs("c++")},
        "cuda_include_dirs": cuda_include_dirs(),
    }
    return SemanticResult(edges_table, build_info, figures)
