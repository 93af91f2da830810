"""The data root: one storage layer over fsspec for every stage's reads and writes (SPEC §2, §9).

A data root is a local directory (the embedded default, ``./data`` or
``$MEGACPP_DATA_ROOT``) or any fsspec URL: ``s3://bucket/prefix`` in production, and
``gs://`` or ``az://`` through the same code path (with ``gcsfs`` / ``adlfs`` installed).
Every output is addressed by a **key**, a POSIX path relative to the root
(``snapshots/tiny/revisions/lz4-4.4.5/quality_kept.parquet``).

Writes are atomic for readers: each file goes to a temporary key next to its final key
(``NAME.tmp-<random>``) and is then committed — ``os.replace`` on a local root, a
server-side copy and delete on an object store — so a reader never sees half a file
under its final key. Multi-file outputs commit their sentinel (``_SUCCESS``) last.
Parquet bytes are deterministic: zstd level 3, statistics on every column but the payloads
(:func:`megacpp_core.tables.statistics_columns`), no arrow schema blob and
no schema metadata except keys starting with ``megacpp.`` (lineage such as the
tokenizer sha256), so the same table gives byte-identical files on every backend.

Credentials for object stores come from the environment the backend reads
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL_S3`` for
S3-compatible stores; ``GOOGLE_APPLICATION_CREDENTIALS``; ``AZURE_STORAGE_*``); nothing
is stored in the project. What stays local to a process or pod: the content cache of
fetched sources (:attr:`DataRoot.cache_dir`) and scratch space (:meth:`DataRoot.scratch`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import posixpath
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from .tables import ROW_GROUP_SIZE, sha256_file, write_parquet_to

#: fsspec protocols that need an extra package, and the pip extra that installs it.
_PROTOCOL_EXTRAS = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs", "abfss": "adlfs"}
_READ_CHUNK = 1 << 20
#: Fault injection for the crash-safety tests: a process whose environment sets this to a
#: substring of a key kills itself with SIGKILL right before committing that key (the
#: temporary file fully written, the final key not yet there).
FAULT_KILL_ENV = "MEGACPP_FAULT_KILL_BEFORE_COMMIT"


def _fault_point(key: str) -> None:
    target = os.environ.get(FAULT_KILL_ENV)
    if target and target in key:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


class StorageError(RuntimeError):
    """The data root cannot be reached or a key cannot be read or written (names the URL)."""


class MissingOutputError(StorageError, FileNotFoundError):
    """A key that a stage needs does not exist: the upstream asset is not materialized."""


@dataclass(frozen=True)
class Written:
    """One committed file: its ``key``, ``sha256`` (hex of the bytes) and ``size`` in bytes."""

    key: str
    sha256: str
    size: int


class _HashingWriter(io.RawIOBase):
    """A write-only file object that forwards bytes to ``sink`` and hashes them (sha256)."""

    def __init__(self, sink):
        self._sink = sink
        self.hasher = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        mv = memoryview(b)
        self.hasher.update(mv)
        self.size += mv.nbytes
        self._sink.write(mv)
        return mv.nbytes

    def flush(self) -> None:
        self._sink.flush()


def is_url(location: str | os.PathLike) -> bool:
    """True when ``location`` names an fsspec protocol other than the local file system."""
    s = os.fspath(location)
    proto = s.split("://", 1)[0] if "://" in s else ""
    return bool(proto) and proto not in ("file", "local")


def _clean_key(key: str) -> str:
    k = posixpath.normpath(key.replace("\\", "/")).lstrip("/")
    if k in ("", ".") or k.startswith("../") or k == "..":
        raise StorageError(f"key {key!r} is not a path inside the data root")
    return k


#: Fields of an fsspec ``info`` that identify one version of an object (S3, GCS, Azure,
#: local fsspec backends), read by :meth:`DataRoot.version`.
_VERSION_FIELDS = ("ETag", "etag", "VersionId", "version_id", "generation", "LastModified", "last_modified",
                   "updated", "mtime")


class DataRoot:
    """A data root (local path or fsspec URL) with atomic, deterministic writes.

    ``location``: a directory path or URL (``s3://bucket/prefix``); ``cache_dir``: the
    local content cache of fetched sources (default ``ROOT/cache`` for a local root,
    else ``$MEGACPP_CACHE_DIR`` or ``~/.cache/megacpp/cache``). ``storage_options`` are
    passed to the fsspec backend (the environment is read by the backend otherwise).
    Raises :class:`StorageError` when the protocol's backend is not installed.
    """

    def __init__(self, location: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                 storage_options: dict[str, Any] | None = None):
        loc = os.fspath(location)
        self.is_local = not is_url(loc)
        if self.is_local:
            loc = loc[len("file://"):] if loc.startswith("file://") else loc
            self.url = str(Path(loc).expanduser().resolve())
            self.fs = fsspec.filesystem("file")
            self.base = self.url
        else:
            self.url = loc.rstrip("/")
            proto = self.url.split("://", 1)[0]
            try:
                self.fs, self.base = fsspec.core.url_to_fs(self.url, **(storage_options or {}))
            except (ImportError, ValueError) as e:
                extra = _PROTOCOL_EXTRAS.get(proto)
                hint = f" (install {extra})" if extra else ""
                raise StorageError(f"data root {self.url}: no fsspec backend for {proto}://{hint}: {e}") from e
            self.base = self.base.rstrip("/")
        if cache_dir is not None:
            self.cache_dir = Path(cache_dir)
        elif self.is_local:
            self.cache_dir = Path(self.url) / "cache"
        else:
            self.cache_dir = Path(os.environ.get("MEGACPP_CACHE_DIR") or Path.home() / ".cache" / "megacpp" / "cache")

    def __repr__(self) -> str:
        return f"DataRoot({self.url!r})"

    # ------------------------------------------------------------------ names

    def path(self, key: str) -> str:
        """The backend path of ``key`` (a local path, or ``bucket/prefix/key``); ``""`` is the root."""
        return f"{self.base}/{_clean_key(key)}" if key not in ("", "/") else self.base

    def uri(self, key: str) -> str:
        """A URL or local path of ``key`` for people (logs, metadata)."""
        return self.path(key) if self.is_local else f"{self.url}/{_clean_key(key)}"

    def local_path(self, key: str) -> Path:
        """The local file of ``key``; raises :class:`StorageError` on an object-store root
        (use :meth:`local_copy` there)."""
        if not self.is_local:
            raise StorageError(f"{self.uri(key)}: not a local data root")
        return Path(self.path(key))

    # ------------------------------------------------------------------ reads

    def exists(self, key: str) -> bool:
        """True when a file is stored under ``key``."""
        self._fresh(key)
        try:
            return bool(self.fs.isfile(self.path(key)))
        except FileNotFoundError:
            return False

    def list(self, prefix: str) -> list[str]:
        """Keys of every file under ``prefix`` (recursive), sorted; ``[]`` when none."""
        base = self.path(prefix)
        self._fresh(prefix)
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        return sorted(self._key(str(p)) for p in found)

    def _key(self, path: str) -> str:
        """The root-relative key of a backend ``path`` under this root (``path`` as is otherwise)."""
        root = self.base + "/"
        return path[len(root):] if path.startswith(root) else path

    def sizes(self, prefix: str) -> dict[str, int]:
        """``{key: bytes}`` of every file under ``prefix`` (recursive), from one listing
        (one request per thousand objects on an object store, not one per file); ``{}``
        when none."""
        base = self.path(prefix)
        self._fresh(prefix)
        try:
            found = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return {}
        return {self._key(str(p)): int(info.get("size") or 0) for p, info in sorted(found.items())}

    def glob(self, pattern: str) -> list[str]:
        """Keys matching a glob ``pattern`` relative to the root (``snapshots/*/manifest.yaml``), sorted."""
        self._fresh()
        root = self.base + "/"
        return sorted(str(p)[len(root):] for p in self.fs.glob(f"{root}{pattern}"))

    def _fresh(self, key: str = "") -> None:
        # Another process or pod may have written since this process listed: object-store
        # backends cache listings per process (and share one instance per process), and
        # invalidating one path keeps the listings below it, so drop them all before any
        # read or existence question.
        if not self.is_local:
            self.fs.invalidate_cache()

    def _missing(self, key: str) -> MissingOutputError:
        return MissingOutputError(f"{self.uri(key)}: missing (materialize the upstream asset first)")

    def open(self, key: str, mode: str = "rb"):
        """A binary file object for ``key`` (``rb``); raises :class:`MissingOutputError`."""
        self._fresh(key)
        try:
            return self.fs.open(self.path(key), mode)
        except FileNotFoundError:
            raise self._missing(key) from None

    def read_bytes(self, key: str) -> bytes:
        """The bytes stored under ``key``; raises :class:`MissingOutputError`."""
        with self.open(key) as f:
            return f.read()

    def read_text(self, key: str) -> str:
        """UTF-8 text stored under ``key``."""
        return self.read_bytes(key).decode("utf-8")

    def read_json(self, key: str) -> Any:
        """Parsed JSON stored under ``key``."""
        return json.loads(self.read_bytes(key))

    def version(self, key: str) -> tuple | None:
        """A token that changes whenever the object under ``key`` is replaced or rewritten,
        for a caller that keeps what it derived from the bytes (a parsed tokenizer, a
        digest) and wants to skip reading them again: a local file's device, inode, size
        and modification and change times in ns; an object store's ``ETag`` / version /
        generation / modification time with its size (what its ``info`` reports). ``None``
        when the backend reports none of them, or the key is missing (then read)."""
        if self.is_local:
            try:
                st = os.stat(self.path(key))
            except FileNotFoundError:
                return None
            return ("local", st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        self._fresh(key)
        try:
            info = self.fs.info(self.path(key))
        except FileNotFoundError:
            return None
        marks = tuple((k, str(info[k])) for k in _VERSION_FIELDS if info.get(k) not in (None, ""))
        return (("size", str(info.get("size"))),) + marks if marks else None

    def sha256(self, key: str) -> str:
        """Hex sha256 of the bytes under ``key``, streamed in 1 MiB chunks."""
        h = hashlib.sha256()
        with self.open(key) as f:
            while b := f.read(_READ_CHUNK):
                h.update(b)
        return h.hexdigest()

    def parquet_file(self, key: str) -> pq.ParquetFile:
        """A :class:`pyarrow.parquet.ParquetFile` (row groups, record batches, metadata)."""
        if not self.exists(key):
            raise self._missing(key)
        if self.is_local:
            return pq.ParquetFile(self.path(key))
        return pq.ParquetFile(self.fs.open(self.path(key), "rb"))

    def read_table(self, key: str, columns: list[str] | None = None, filters=None) -> pa.Table:
        """The parquet table under ``key`` (only ``columns`` when given; only the rows
        matching ``filters``, a pyarrow compute expression, when given — applied while
        reading, so memory follows the matching rows, not the file)."""
        if not self.exists(key):
            raise self._missing(key)
        if self.is_local:
            return pq.read_table(self.path(key), columns=columns, filters=filters)
        with self.fs.open(self.path(key), "rb") as f:
            return pq.read_table(f, columns=columns, filters=filters)

    def iter_batches(self, key: str, columns: list[str] | None = None, batch_size: int = 1024) -> Iterator[pa.RecordBatch]:
        """Record batches (``batch_size`` rows, only ``columns`` when given) of the parquet
        file under ``key``, decoded one at a time on the calling thread: no thread pool and,
        on a local root, no pre-buffering of the row group, so memory is one batch and the
        decoder's buffers. For readers that stream the texts of many files (dedup's
        candidate texts, the tokenizer's sample): :meth:`read_table` decodes on arrow's
        thread pool, whose allocator caches grow with the number of files read. Raises
        ``FileNotFoundError`` when ``key`` is missing."""
        if not self.exists(key):
            raise self._missing(key)
        with contextlib.ExitStack() as stack:
            src = self.path(key) if self.is_local else stack.enter_context(self.fs.open(self.path(key), "rb"))
            pf = stack.enter_context(pq.ParquetFile(src, pre_buffer=not self.is_local))
            yield from pf.iter_batches(batch_size=batch_size, columns=columns, use_threads=False)

    def read_schema(self, key: str) -> pa.Schema:
        """The arrow schema of the parquet file under ``key`` (with its ``megacpp.*`` metadata)."""
        return self.parquet_file(key).schema_arrow

    # ------------------------------------------------------------------ writes

    def _tmp_key(self, key: str) -> str:
        return f"{key}.tmp-{secrets.token_hex(4)}"

    def _commit(self, tmp: str, key: str) -> None:
        if self.is_local:
            os.replace(self.path(tmp), self.path(key))
        else:  # one object copied server-side, then the temporary one removed (no glob expansion)
            self.fs.cp_file(self.path(tmp), self.path(key))
            self.fs.rm_file(self.path(tmp))

    @contextlib.contextmanager
    def _atomic(self, key: str) -> Iterator[_HashingWriter]:
        key = _clean_key(key)
        tmp = self._tmp_key(key)
        if self.is_local:
            Path(self.path(key)).parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.fs.open(self.path(tmp), "wb") as raw:
                sink = _HashingWriter(raw)
                yield sink
            _fault_point(key)
            self._commit(tmp, key)
        except BaseException:
            with contextlib.suppress(Exception):
                self.fs.rm_file(self.path(tmp))
            raise

    def write_bytes(self, key: str, data: bytes) -> Written:
        """Store ``data`` under ``key`` atomically; returns its :class:`Written` record."""
        with self._atomic(key) as sink:
            sink.write(data)
        return Written(_clean_key(key), sink.hasher.hexdigest(), sink.size)

    def write_text(self, key: str, text: str) -> Written:
        """Store UTF-8 ``text`` under ``key`` atomically."""
        return self.write_bytes(key, text.encode("utf-8"))

    def write_json(self, key: str, obj: Any) -> Written:
        """Store ``obj`` as sorted-key, 2-space-indented JSON plus a newline (deterministic)."""
        return self.write_text(key, json.dumps(obj, sort_keys=True, indent=2) + "\n")

    def write_table(self, key: str, table: pa.Table, row_group_size: int = ROW_GROUP_SIZE) -> Written:
        """Write ``table`` as parquet under ``key``, atomically and deterministically (see
        the module docstring). Raises :class:`StorageError` when the root cannot be written."""
        with self._atomic(key) as sink:
            write_parquet_to(table, sink, row_group_size)
        return Written(_clean_key(key), sink.hasher.hexdigest(), sink.size)

    def put_file(self, local: str | os.PathLike, key: str, move: bool = False) -> Written:
        """Copy a local file to ``key`` atomically (streamed). With ``move`` on a local root,
        the file is hashed and renamed into place instead (it must be on the same file
        system, as :meth:`scratch` directories are)."""
        if move and self.is_local:
            digest, size = sha256_file(local), os.path.getsize(local)
            dest = Path(self.path(key))
            dest.parent.mkdir(parents=True, exist_ok=True)
            _fault_point(key)
            os.replace(local, dest)
            return Written(_clean_key(key), digest, size)
        with open(local, "rb") as src, self._atomic(key) as sink:
            shutil.copyfileobj(src, sink, _READ_CHUNK)
        return Written(_clean_key(key), sink.hasher.hexdigest(), sink.size)

    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""
        with contextlib.suppress(FileNotFoundError):
            if self.exists(key):
                self.fs.rm_file(self.path(key))

    def delete_temporaries(self, key: str) -> None:
        """Remove temporary keys of ``key`` (``KEY.tmp-*``) left by a writer that was killed
        before it committed (readers never open them; this keeps the root clean)."""
        escaped = "".join(f"[{c}]" if c in "*?[]" else c for c in _clean_key(key))
        for k in self.glob(f"{escaped}.tmp-*"):
            self.delete(k)

    def delete_prefix(self, prefix: str) -> None:
        """Remove every file under ``prefix``."""
        for k in self.list(prefix):
            self.delete(k)

    # ------------------------------------------------------------------ local views

    @contextlib.contextmanager
    def scratch(self, prefix: str = "megacpp-") -> Iterator[Path]:
        """A local temporary directory, removed afterwards (under the data root's
        ``.scratch/`` for a local root, so a commit is a rename; the system temp dir else).
        Its name starts with this process's pid, so :meth:`sweep_scratch` can remove what a
        killed process left."""
        base = None
        if self.is_local:
            base = Path(self.url) / ".scratch"
            base.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f"{os.getpid()}-{prefix}", dir=base) as d:
            yield Path(d)

    def sweep_scratch(self) -> int:
        """Remove the scratch directories of processes that no longer run (a SIGKILLed
        run leaves its Megatron files or libclang tree there); returns how many."""
        base = Path(self.url) / ".scratch" if self.is_local else None
        if base is None or not base.is_dir():
            return 0
        removed = 0
        for d in base.iterdir():
            pid = d.name.split("-", 1)[0]
            if not pid.isdigit():
                continue
            try:
                os.kill(int(pid), 0)
                continue  # still running
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            shutil.rmtree(d, ignore_errors=True)
            removed += 1
        return removed

    @contextlib.contextmanager
    def local_copy(self, keys: list[str]) -> Iterator[dict[str, Path]]:
        """Local files holding ``keys``: the files themselves on a local root, downloads
        into a scratch directory on an object store (removed afterwards)."""
        if self.is_local:
            missing = [k for k in keys if not self.exists(k)]
            if missing:
                raise self._missing(missing[0])
            yield {k: self.local_path(k) for k in keys}
            return
        self._fresh()
        with self.scratch("megacpp-copy-") as d:
            out = {}
            for k in keys:
                dest = d / _clean_key(k)
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    self.fs.get(self.path(k), str(dest))
                except FileNotFoundError:
                    raise self._missing(k) from None
                out[k] = dest
            yield out


def local_location(location: str) -> str | None:
    """The local directory a location names (``file://`` stripped, made absolute), or None
    for an object-store URL."""
    if is_url(location):
        return None
    loc = location[len("file://"):] if location.startswith("file://") else location
    return str(Path(loc).expanduser().resolve())


def default_location() -> str:
    """``$MEGACPP_DATA_ROOT`` or ``./data`` (a local path made absolute, or a URL as given)."""
    loc = os.environ.get("MEGACPP_DATA_ROOT") or "data"
    return local_location(loc) or loc


def open_root(location: str | os.PathLike | None = None) -> DataRoot:
    """A :class:`DataRoot` for ``location`` (default :func:`default_location`); the cache
    directory follows ``$MEGACPP_CACHE_DIR`` when it is set."""
    cache = os.environ.get("MEGACPP_CACHE_DIR")
    return DataRoot(location or default_location(), cache_dir=cache or None)
