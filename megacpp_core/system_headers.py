"""System header search paths for the libclang lane: what a real compile would add.

The ``libclang`` wheel carries no clang resource directory, so each parse gets the system
compiler's own ``#include <...>`` search list (``cc -E -v`` / ``c++ -E -v`` on an empty
input; the compiler only prints its configuration, nothing from the corpus is compiled),
the Python headers and, when present, the CUDA toolkit's include directory. Every probe
runs once per process.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sysconfig

_SEARCH_START = "#include <...> search starts here:"
_SEARCH_END = "End of search list."


def _probe_compiler(compiler: str, language: str) -> list[str] | None:
    exe = shutil.which(compiler)
    if exe is None:
        return None
    env = dict(os.environ, LC_ALL="C", LANG="C")
    try:
        proc = subprocess.run([exe, "-E", "-x", language, "-", "-v"], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, errors="replace", timeout=30, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = proc.stderr.splitlines()
    try:
        start = lines.index(_SEARCH_START)
    except ValueError:
        return None
    dirs = []
    for line in lines[start + 1:]:
        if line.strip() == _SEARCH_END:
            break
        d = line.strip().removesuffix(" (framework directory)")
        if d and os.path.isdir(d):
            dirs.append(os.path.normpath(d))
    return dirs or None


@functools.lru_cache(maxsize=None)
def _compiler_include_dirs(language: str) -> tuple[str, ...]:
    for compiler in ("cc", "c++", "gcc", "clang"):
        got = _probe_compiler(compiler, language)
        if got:
            return tuple(got)
    return ()


def system_include_dirs(language: str) -> list[str]:
    """System include directories for ``language`` (``"c"``; anything else — ``"c++"``,
    ``"cpp"``, ``"cuda"``, ``"header"`` — means C++), in search order.

    ``$MEGACPP_SYSTEM_INCLUDES`` (``os.pathsep``-separated; set but empty means none)
    replaces everything. Otherwise: the ``#include <...> search starts here:`` block of
    ``cc -E -x c|c++ - -v </dev/null`` (falling back to ``c++``, ``gcc``, ``clang`` on
    ``PATH``; directories that do not exist are skipped), then :func:`python_include_dirs`.
    Probed once per process and language (cached). Never raises: no compiler → only the
    Python include directory.
    """
    override = os.environ.get("MEGACPP_SYSTEM_INCLUDES")
    if override is not None:
        return [d for d in override.split(os.pathsep) if d]
    lang = "c" if language == "c" else "c++"
    dirs = list(_compiler_include_dirs(lang))
    for d in python_include_dirs():
        if d not in dirs:
            dirs.append(d)
    return dirs


@functools.lru_cache(maxsize=1)
def python_include_dirs() -> list[str]:
    """The running interpreter's include directory (``sysconfig`` ``include``), when it
    holds ``Python.h``; else ``[]``."""
    inc = sysconfig.get_paths().get("include")
    return [os.path.normpath(inc)] if inc and os.path.isfile(os.path.join(inc, "Python.h")) else []


def cuda_include_dirs() -> list[str]:
    """A CUDA toolkit include directory for ``.cu`` TUs, found at run time:
    ``$MEGACPP_CUDA_INCLUDES`` (``os.pathsep``-separated; empty means none) when set, else
    ``$CUDA_HOME/include`` or ``$CUDA_PATH/include``, else ``../include`` next to the real
    path of ``nvcc`` on ``PATH``, else ``/usr/local/cuda/include`` (the default install
    location, which clang's own driver probes too) — the first that holds
    ``cuda_runtime.h``; else ``[]``. Cached per environment."""
    override = os.environ.get("MEGACPP_CUDA_INCLUDES")
    if override is not None:
        return [d for d in override.split(os.pathsep) if d]
    return list(_cuda_dirs_probe(os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), shutil.which("nvcc")))


@functools.lru_cache(maxsize=8)
def _cuda_dirs_probe(home: str | None, path: str | None, nvcc: str | None) -> tuple[str, ...]:
    roots = [r for r in (home, path) if r]
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    roots.append("/usr/local/cuda")
    for r in roots:
        inc = os.path.join(r, "include")
        if os.path.isfile(os.path.join(inc, "cuda_runtime.h")):
            return (os.path.normpath(inc),)
    return ()
