"""The libclang lane's worker side: what one pool process does with one translation unit.

:func:`parse_tu` parses a TU with libclang (the ``libclang`` wheel's ``clang.cindex``) and
walks its cursors, collecting USR-resolved call, type and include edges, definitions and
call counts; :func:`warm` loads libclang when a worker starts. The pool, timeouts, tree
materialization and table assembly are :mod:`megacpp_core.semantic`, which documents the
edge rules and statuses; this module never imports it (workers load only what they run).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import time
from typing import Any

_INDEX = None


def _clang():
    import clang.cindex as ci

    return ci


def _index():
    global _INDEX
    if _INDEX is None:
        _INDEX = _clang().Index.create()
    return _INDEX


def _rss_kb() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r // 1024 if sys.platform == "darwin" else r  # bytes on macOS, KiB elsewhere


def warm() -> int:
    """Worker start-up job: load libclang and create the index; returns the worker's pid."""
    _index()
    return os.getpid()


def _kind_ids():
    ci = _clang()
    K = ci.CursorKind
    T = ci.TypeKind
    func = {K.FUNCTION_DECL, K.CXX_METHOD, K.CONSTRUCTOR, K.DESTRUCTOR, K.CONVERSION_FUNCTION, K.FUNCTION_TEMPLATE}
    rec = {K.STRUCT_DECL, K.UNION_DECL, K.CLASS_DECL, K.CLASS_TEMPLATE, K.CLASS_TEMPLATE_PARTIAL_SPECIALIZATION}
    typedef = {K.TYPEDEF_DECL, K.TYPE_ALIAS_DECL, K.TYPE_ALIAS_TEMPLATE_DECL}
    return {
        "func": frozenset(k.value for k in func),
        "rec": frozenset(k.value for k in rec),
        "type_target": frozenset(k.value for k in rec | typedef | {K.ENUM_DECL}),
        "typedef": frozenset(k.value for k in typedef),
        "call": K.CALL_EXPR.value, "base": K.CXX_BASE_SPECIFIER.value, "field": K.FIELD_DECL.value,
        "parm": K.PARM_DECL.value, "include": K.INCLUSION_DIRECTIVE.value,
        "peel_pointee": frozenset(t.value for t in (T.POINTER, T.LVALUEREFERENCE, T.RVALUEREFERENCE, T.BLOCKPOINTER)),
        "peel_element": frozenset(t.value for t in (T.CONSTANTARRAY, T.INCOMPLETEARRAY, T.VARIABLEARRAY,
                                                    T.DEPENDENTSIZEDARRAY)),
    }


#: Name prefixes of compiler builtins (gcc and clang), which libclang declares implicitly.
_BUILTIN_PREFIXES = ("__builtin", "__sync_", "__atomic_", "__c11_atomic_", "__scoped_atomic_", "__hip_atomic_",
                     "__opencl_atomic_", "__nvvm_", "__arm_", "__ia32_")


class _Walker:
    """Walks one parsed TU (see module doc); collects edges, definitions and call counts."""

    def __init__(self, tu, root: str):
        self.ci = _clang()
        self.lib = self.ci.conf.lib
        self.k = _kind_ids()
        self.tu = tu
        self.root = root
        self.prefix = root.rstrip(os.sep) + os.sep
        self.rel_by_ptr: dict[int, str | None] = {}
        self.edges: set[tuple] = set()
        self.defs: dict[str, tuple[str, int]] = {}
        self.call_sites = self.resolved = self.resolved_tree = self.walk_errors = 0

    # -- locations
    def _rel_name(self, name: str) -> str | None:
        ap = os.path.normpath(name if os.path.isabs(name) else os.path.join(self.root, name))
        if not ap.startswith(self.prefix):
            return None
        return ap[len(self.prefix):].replace(os.sep, "/")

    def loc(self, cursor) -> tuple[str | None, int, bool]:
        """(tree-relative file or None, line, has a file) of a cursor's expansion location."""
        f, line, _, _ = cursor.location._get_instantiation()
        if f is None:
            return None, line, False
        return self.file_rel(f), line, True

    def file_rel(self, f) -> str | None:
        if f is None:
            return None
        key = ctypes.cast(f.obj, ctypes.c_void_p).value
        if key not in self.rel_by_ptr:
            try:
                self.rel_by_ptr[key] = self._rel_name(f.name)
            except UnicodeDecodeError:
                self.rel_by_ptr[key] = None
        return self.rel_by_ptr[key]

    # -- helpers
    def usr(self, cursor) -> str:
        try:
            return cursor.get_usr() or ""
        except UnicodeDecodeError:
            return ""

    def canonical(self, cursor):
        """A template specialization (or a member of one) → the template (member)."""
        for _ in range(4):
            t = self.lib.clang_getSpecializedCursorTemplate(cursor)
            if t is None:
                return cursor
            cursor = t
        return cursor

    def implicit(self, decl) -> bool:
        """A compiler builtin (clang declares it implicitly at its first use, so its
        "location" is that call) or an implicit C function declaration (null extent)."""
        try:
            if decl.spelling.startswith(_BUILTIN_PREFIXES):
                return True
        except UnicodeDecodeError:
            return False
        return decl.extent.start.line == 0

    def target(self, decl) -> tuple[str, int, bool] | None:
        """(file, line, is_definition) of a declaration in the tree: its definition if in the
        tree, else the declaration; None when neither is in the tree."""
        d = decl.get_definition()
        if d is not None:
            df, dl, _ = self.loc(d)
            if df is not None:
                return df, dl, True
        f, line, _ = self.loc(decl)
        if f is not None:
            return f, line, False
        return None

    def add_def(self, cursor, usr: str, kind: int) -> None:
        if not usr:
            return
        if kind in self.k["typedef"] or cursor.is_definition():
            f, line, _ = self.loc(cursor)
            if f is not None:
                cur = self.defs.get(usr)
                if cur is None or (f, line) < cur:
                    self.defs[usr] = (f, line)

    def type_decl(self, ty):
        k = self.k
        for _ in range(16):
            tk = ty._kind_id  # not ty.kind: the bindings raise on kinds they do not know (_Float16)
            if tk in k["peel_pointee"]:
                ty = ty.get_pointee()
            elif tk in k["peel_element"]:
                ty = ty.element_type
            else:
                break
        d = ty.get_declaration()
        if d is None or d._kind_id not in k["type_target"]:
            return None
        d = self.canonical(d)
        return d if d._kind_id in k["type_target"] else None

    def type_edge(self, from_usr: str, cursor, ty, line_from: tuple[str, int]) -> None:
        if not from_usr:
            return
        d = self.type_decl(ty)
        if d is None:
            return
        to_usr = self.usr(d)
        tgt = self.target(d)
        if not to_usr or tgt is None:
            return
        self.edges.add((from_usr, to_usr, "type", line_from[0], tgt[0], line_from[1], tgt[1], tgt[2]))

    # -- walk
    def walk(self) -> None:
        k = self.k
        stack: list[tuple[Any, str, str]] = []
        for c in self.tu.cursor.get_children():
            f, line, _ = self.loc(c)
            if f is None:
                continue
            if c._kind_id == k["include"]:
                try:
                    inc = c.get_included_file()
                except Exception:  # noqa: BLE001 - unresolved include
                    inc = None
                to = self.file_rel(inc)
                if to is not None:
                    self.edges.add((f"file:{f}", f"file:{to}", "include", f, to, line, 1, True))
                continue
            stack.append((c, "", ""))
        stack.reverse()
        while stack:
            c, func_usr, rec_usr = stack.pop()
            try:
                func_usr, rec_usr = self.visit(c, func_usr, rec_usr)
                children = list(c.get_children())
            except (ValueError, UnicodeDecodeError, AttributeError):
                # a node the Python bindings cannot represent: skip it and its subtree
                self.walk_errors += 1
                continue
            for ch in reversed(children):
                stack.append((ch, func_usr, rec_usr))

    def visit(self, c, func_usr: str, rec_usr: str) -> tuple[str, str]:
        """Handle one in-tree node; returns the (function, record) context of its children."""
        k = self.k
        kind = c._kind_id
        if kind in k["func"]:
            func_usr = self.usr(c)
            self.add_def(c, func_usr, kind)
        elif kind in k["type_target"]:
            u = self.usr(c)
            self.add_def(c, u, kind)
            if kind in k["rec"]:
                rec_usr = u
        elif kind == k["call"]:
            if func_usr:
                self.call(c, func_usr)
        elif kind == k["base"] or kind == k["field"] or (kind == k["parm"] and func_usr):
            f, line, _ = self.loc(c)
            if f is not None:
                self.type_edge(func_usr if kind == k["parm"] else rec_usr, c, c.type, (f, line))
        return func_usr, rec_usr

    def call(self, c, func_usr: str) -> None:
        f, line, _ = self.loc(c)
        if f is None:
            return
        self.call_sites += 1
        r = c.referenced
        if r is None or r._kind_id not in self.k["func"]:
            return  # unresolved, or a call through a pointer / object variable
        r = self.canonical(r)
        to_usr = self.usr(r)
        if not to_usr or self.implicit(r):
            return
        rf, rline, has_file = self.loc(r)
        tgt = self.target(r)
        if not has_file and tgt is None:
            return
        self.resolved += 1
        if tgt is None:
            return
        self.resolved_tree += 1
        self.edges.add((func_usr, to_usr, "call", f, tgt[0], line, tgt[1], tgt[2]))


def parse_tu(job: dict[str, Any]) -> dict[str, Any]:
    """Worker: parse ONE translation unit with libclang and walk it (module doc).

    ``job``: ``root`` (absolute tree root), ``file`` (tree-relative TU path), ``arguments``
    (absolute-path arguments), ``hang``/``crash`` (test hook flags). Returns a dict:
    ``file``, ``status`` (``ok``/``errors``/``fatal``), ``errors``, ``fatal`` (diagnostic
    counts, severity error / fatal), ``message`` (first error-or-fatal diagnostic),
    ``call_sites``, ``calls_resolved``, ``calls_resolved_tree``, ``edges`` (list of
    ``(from_usr, to_usr, kind, from_file, to_file, from_line, to_line, to_is_definition)``),
    ``defs`` (``{usr: (file, line)}`` of definitions in the tree), ``walk_errors``,
    ``seconds`` (parse + walk), ``peak_rss_kb`` (``ru_maxrss`` of this process, KiB), ``pid``.
    Never raises for a bad TU (libclang's refusal is a ``fatal`` status); the hooks above
    make it hang or die on purpose.
    """
    if job.get("crash"):
        os.kill(os.getpid(), signal.SIGSEGV)
        os._exit(139)
    if job.get("hang"):
        while True:
            time.sleep(3600)
    ci = _clang()
    t0 = time.perf_counter()
    root = job["root"]
    out: dict[str, Any] = {"file": job["file"], "pid": os.getpid(), "edges": [], "defs": {}, "call_sites": 0,
                           "calls_resolved": 0, "calls_resolved_tree": 0, "errors": 0, "fatal": 0, "message": None}
    path = os.path.join(root, *job["file"].split("/"))
    try:
        tu = _index().parse(path, args=job["arguments"],
                            options=ci.TranslationUnit.PARSE_DETAILED_PROCESSING_RECORD)
    except ci.TranslationUnitLoadError as e:
        out.update(status="fatal", fatal=1, message=f"libclang could not parse the TU: {e}",
                   seconds=time.perf_counter() - t0, peak_rss_kb=_rss_kb())
        return out
    errors = fatal = 0
    message = None
    for d in tu.diagnostics:
        sev = d.severity
        if sev >= 3:
            if sev >= 4:
                fatal += 1
            else:
                errors += 1
            if message is None:
                try:
                    message = d.spelling[:300]
                except UnicodeDecodeError:
                    message = "(undecodable diagnostic)"
    w = _Walker(tu, os.path.normpath(root))
    w.walk()
    out.update(
        status="fatal" if fatal else ("errors" if errors else "ok"), errors=errors, fatal=fatal, message=message,
        call_sites=w.call_sites, calls_resolved=w.resolved, calls_resolved_tree=w.resolved_tree,
        edges=sorted(w.edges), defs=w.defs, walk_errors=w.walk_errors,
    )
    del tu, w
    out["seconds"] = time.perf_counter() - t0
    out["peak_rss_kb"] = _rss_kb()
    return out
