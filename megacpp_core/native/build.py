"""Build the native tree walk (``_tswalk.so`` next to this file): ``python -m megacpp_core.native.build``.

``make install`` runs it. Steps:

1. The installed py-tree-sitter release (``importlib.metadata``) is looked up, and its
   source distribution is fetched with pip (``pip download --no-binary tree-sitter
   --no-deps``) into ``--src-dir`` (default: ``share/megacpp`` under the interpreter's
   prefix, so a virtualenv keeps it) unless it is already there. Its sha256 must be the one
   pinned in :data:`SDIST_SHA256` for that release (a release not pinned there is refused).
   The sdist carries the tree-sitter core the binding was compiled from
   (``tree_sitter/core/lib``).
2. The archive is unpacked with the ``data`` extraction filter (no links out, no absolute
   paths; Python 3.11.4 or later), and the binding's ``Tree`` struct is checked to start
   with the ``TSTree`` pointer that :mod:`megacpp_core.native.tswalk` reads.
3. ``cc`` (``$CC``) compiles the core's single-file build ``lib.c`` with ``tswalk.c``,
   ``rules.c`` (enrichment's structure rules) and ``brace.c`` (the brace-balanced
   splitter's lexer, which needs no tree-sitter);
   flags and macros as py-tree-sitter's own ``setup.py`` (C11, ``_POSIX_C_SOURCE``,
   ``_DEFAULT_SOURCE``, hidden symbols with ``TREE_SITTER_HIDE_SYMBOLS``; only the
   ``megacpp_*`` functions are exported), into a temporary file that is then renamed
   into place.

Nothing from a corpus is compiled or run. Exits non-zero with the reason on any failure;
without the library, enrichment runs its Python walk (same output, slower).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The library :mod:`megacpp_core.native.tswalk` loads.
LIBRARY = HERE / "_tswalk.so"
#: sha256 of the py-tree-sitter sdists the build accepts, by release (the release is pinned
#: in ``pyproject.toml``; a new pin needs its sdist's hash here).
SDIST_SHA256 = {"0.26.1": "9919cbaf02d17fa9a4cd0e6da496aecf901b758e6eacf122eee393e3ef08aacd"}
#: The start of py-tree-sitter's ``Tree`` object (``tree_sitter/binding/types.h``) that the
#: loader relies on: the ``TSTree`` pointer right after ``PyObject_HEAD``.
_TREE_STRUCT = re.compile(r"typedef struct \{\s*PyObject_HEAD\s*TSTree \*tree;")


#: Our C sources compiled into the library, in order (their digest is built in).
SOURCES = ("tswalk.c", "rules.c", "brace.c")


def sources_digest(directory: Path = HERE) -> str:
    """Hex sha256 over the bytes of :data:`SOURCES` in ``directory``, each preceded by its
    name and length: what a library built from them reports (``megacpp_ts_sources``), so a
    library older than the sources it sits beside is not used. ``OSError`` when one is
    missing."""
    h = hashlib.sha256()
    for name in SOURCES:
        data = (directory / name).read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


#: The core's single-file build, inside an unpacked sdist.
_LIB_C = Path("tree_sitter", "core", "lib", "src", "lib.c")


def _sdist(version: str, src_dir: Path) -> Path:
    """The unpacked py-tree-sitter ``version`` sdist under ``src_dir`` (fetched when absent)."""
    root = src_dir / f"tree_sitter-{version}"
    if (root / _LIB_C).is_file():
        return root
    if version not in SDIST_SHA256:
        raise SystemExit(f"py-tree-sitter {version} has no pinned sdist sha256 in {__name__}.SDIST_SHA256")
    if not hasattr(tarfile, "data_filter"):
        raise SystemExit("unpacking the sdist safely needs Python 3.11.4 or later (tarfile's data filter)")
    src_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=src_dir) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", "tree-sitter", "--no-deps",
                        "--dest", tmp, f"tree-sitter=={version}"], check=True)
        archives = sorted(Path(tmp).glob("tree_sitter-*.tar.gz"))
        if len(archives) != 1:
            raise SystemExit(f"expected one tree-sitter {version} sdist, pip gave {[a.name for a in Path(tmp).iterdir()]}")
        digest = hashlib.sha256(archives[0].read_bytes()).hexdigest()
        if digest != SDIST_SHA256[version]:
            raise SystemExit(f"{archives[0].name}: sha256 {digest}, pinned {SDIST_SHA256[version]}")
        with tarfile.open(archives[0]) as tar:
            tar.extractall(tmp, filter="data")
        unpacked = Path(tmp) / f"tree_sitter-{version}"
        if not (unpacked / _LIB_C).is_file():
            raise SystemExit(f"the tree-sitter {version} sdist has no {_LIB_C.as_posix()}")
        shutil.rmtree(root, ignore_errors=True)
        unpacked.rename(root)
    return root


def build(src_dir: Path, out: Path = LIBRARY, cc: str | None = None) -> Path:
    """Compile ``_tswalk.so`` for the installed py-tree-sitter into ``out``; returns ``out``.

    Raises ``SystemExit`` (with the reason) when the release has no pinned sdist hash, the
    sdist's hash or contents differ, or its ``Tree`` struct differs from what the loader
    reads; ``subprocess.CalledProcessError`` when pip cannot fetch the sdist or the
    compiler fails."""
    version = importlib.metadata.version("tree-sitter")
    root = _sdist(version, src_dir)
    types_h = (root / "tree_sitter" / "binding" / "types.h").read_text(encoding="utf-8")
    if not _TREE_STRUCT.search(types_h):
        raise SystemExit(f"py-tree-sitter {version}: its Tree struct does not start with the TSTree pointer; "
                         "the native walk does not support this release")
    lib = root / "tree_sitter" / "core" / "lib"
    cc = cc or os.environ.get("CC") or "cc"
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    cmd = [cc, "-O2", "-shared", "-fPIC", "-std=c11", "-fvisibility=hidden", "-D_POSIX_C_SOURCE=200112L",
           "-D_DEFAULT_SOURCE", "-DTREE_SITTER_HIDE_SYMBOLS",
           f'-DMEGACPP_TS_VERSION="{version}"', f'-DMEGACPP_TS_SOURCES="{sources_digest()}"',
           f"-I{lib / 'include'}", f"-I{lib / 'src'}",
           str(root / _LIB_C), *(str(HERE / name) for name in SOURCES),
           "-o", str(tmp)]
    try:
        subprocess.run(cmd, check=True)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: ``[--src-dir DIR] [--out FILE]``; prints the library built."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src-dir", type=Path, default=Path(sys.prefix) / "share" / "megacpp",
                    help="where the py-tree-sitter sdist is kept (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=LIBRARY, help="library path (default: %(default)s)")
    args = ap.parse_args(argv)
    out = build(args.src_dir, args.out)
    print(f"native tree walk: {out} (py-tree-sitter {importlib.metadata.version('tree-sitter')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
