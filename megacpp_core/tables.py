"""Deterministic, atomic parquet I/O shared by every stage.

Every stage writes its outputs through :func:`write_parquet` so that the same table always
produces byte-identical files (fixed compression, no pandas metadata, no timestamps) and
so that a killed writer never leaves a half-written file under its final name.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

#: Row-group size for packed-row shards (SPEC §6: 1,024-row row groups).
ROW_GROUP_SIZE = 1024


#: Schema-metadata keys kept in parquet outputs (lineage such as the tokenizer's sha256);
#: every other key is dropped so no library or wall-clock information leaks into the bytes.
METADATA_PREFIX = "megacpp."


def _malloc_trim():
    """glibc's ``malloc_trim``, or None off glibc."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def release_memory() -> None:
    """Hand the memory the arrow pool and the C heap hold but no longer use back to the
    system.

    A pool keeps freed pages for reuse, so the buffers of one large write or read (a
    parquet page, its compressed copy) would stay resident while the next one is allocated
    beside them. numpy's arrays come from glibc's malloc, whose mmap threshold rises with
    every large block freed (up to 32 MiB), so later blocks of that size come from the heap
    and stay resident when freed: ``malloc_trim(0)`` returns them. Measured on the LSH
    step over 6.4 M files: 190 MB kept resident after its pairs were spilled, without it."""
    pa.default_memory_pool().release_unused()
    if _TRIM is not None:
        _TRIM(0)


def reset_peak_rss() -> bool:
    """Reset this process's peak resident set size (``VmHWM``) to its current RSS.

    Writes ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0, proc(5)); returns False where
    that is not possible (another OS, a read-only /proc), in which case :func:`peak_rss_mb`
    reports the peak since the process started."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float | None:
    """This process's peak resident set size in MB (10**6 bytes) since the last
    :func:`reset_peak_rss`: ``VmHWM`` of ``/proc/self/status``; None where /proc is absent.
    Child processes (a pool a stage starts) are not included."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) * 1024 / 1e6, 1)
    except OSError:
        return None
    return None


def _leaf_paths(name: str, type_: pa.DataType) -> list[str]:
    """The parquet column paths of one arrow field: ``a`` for a primitive, ``a.list.element``
    for a list (compliant nested types), ``a.x`` for a struct's children, ``a.key_value.key``
    and ``.value`` for a map."""
    if pa.types.is_map(type_):
        return _leaf_paths(f"{name}.key_value.key", type_.key_type) + _leaf_paths(f"{name}.key_value.value", type_.item_type)
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
        return _leaf_paths(f"{name}.list.element", type_.value_type)
    if pa.types.is_struct(type_):
        return [p for f in type_ for p in _leaf_paths(f"{name}.{f.name}", f.type)]
    return [name]


def statistics_columns(schema: pa.Schema) -> list[str]:
    """The parquet column paths written with min/max statistics: every leaf column except the
    payload columns, a top-level ``large_string`` or ``large_binary`` (file contents, texts,
    per-character arrays). No reader prunes on a payload's min/max, and parquet-cpp copies
    each value it compares: a 12 MB file in a row group cost 46 MB more to write with them."""
    return [p for f in schema if not _is_payload(f.type) for p in _leaf_paths(f.name, f.type)]


def _is_payload(type_: pa.DataType) -> bool:
    return pa.types.is_large_string(type_) or pa.types.is_large_binary(type_)


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns written with parquet's dictionary encoding: the top-level columns that are
    neither nested (a list, struct or map) nor a payload (:func:`statistics_columns`).

    Nested columns hold token ids, offsets, per-token planes and boundaries. Dictionary
    encoded (pyarrow's default), each became a dictionary page (up to 94 KB for the token
    ids and offsets of a ``default`` shard) and bit-packed indices into it, which zstd
    compresses less well than the plain values, and building the dictionary took time.
    ``bench/parquet_writer.py`` rewrites the 248 parquet files of
    ``default``'s snapshot both ways: 2.86 s and 107.4 MB with the dictionary on these
    columns alone, 3.25 s and 113.8 MB with it on every column (the tokenized shards
    13.2 MB against 15.7 MB), the same tables read back. Payloads (one text per row)
    never repeat."""
    return [f.name for f in schema
            if not (pa.types.is_nested(f.type) or _is_payload(f.type))]


def _writer(sink, schema: pa.Schema) -> pq.ParquetWriter:
    """A ParquetWriter with the project's fixed settings: zstd level 3, statistics on every
    column but the payloads (:func:`statistics_columns`), dictionary encoding on the flat
    columns alone (:func:`dictionary_columns`), no arrow schema blob."""
    return pq.ParquetWriter(sink, schema, compression="zstd", compression_level=3,
                            use_dictionary=dictionary_columns(schema) or False,
                            write_statistics=statistics_columns(schema) or False, store_schema=False)


def write_parquet_to(table: pa.Table, sink, row_group_size: int = ROW_GROUP_SIZE) -> None:
    """Write ``table`` as parquet to ``sink`` (a path or a writable file object) with the
    project's fixed settings: zstd level 3, statistics on all but the payload columns, no
    arrow schema blob, and only the ``megacpp.*`` schema metadata (as parquet key-value
    metadata). The same table always gives the same bytes."""
    lineage = {k: v for k, v in (table.schema.metadata or {}).items() if k.startswith(METADATA_PREFIX.encode())}
    table = table.replace_schema_metadata(None)
    with _writer(sink, table.schema) as writer:
        writer.write_table(table, row_group_size=row_group_size)
        if lineage:
            writer.add_key_value_metadata(lineage)


class ParquetStream:
    """A local parquet file written table by table with the settings of
    :func:`write_parquet_to` (zstd 3, statistics but on payloads, no arrow schema blob).
    Written to ``path.tmp`` and renamed into place on a clean :meth:`close` (context-manager
    exit); on an error the temporary files are removed. The same tables in the same order
    always give the same bytes.

    By default each :meth:`write` appends its rows as row groups of at most
    ``row_group_size``, so memory follows one table, not the file. With
    ``whole_row_groups=True`` the file gets the row groups of one ``write_table`` of all
    its rows, whatever the sizes written (SPEC §6's 1,024-row row groups): rows short of a
    whole row group wait in an Arrow IPC spool file beside the output (``path.spool``), not
    in memory, and are read back memory-mapped when the row group fills. Memory is then
    one table being written plus, at a row group's write, the row group itself (1,024 rows
    of 65,536 tokens are 64 Mi tokens a list column), never the rows waiting in between.

    Unless made with ``release_each_write=False``, the writer's page and compression
    buffers are handed back to the system after each write (:func:`release_memory`), so a
    large batch does not stay resident after its write; a writer of many similar batches
    keeps them for the next one instead (handing them back after each shard and faulting
    them in again made the Megatron export's documents parquet of the default snapshot
    take 61 ms instead of 44 ms).
    """

    def __init__(self, path: str | os.PathLike, schema: pa.Schema, row_group_size: int = ROW_GROUP_SIZE,
                 whole_row_groups: bool = False, release_each_write: bool = True):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(self.path.name + ".tmp")
        self._spool_path = self.path.with_name(self.path.name + ".spool")
        self._schema = schema.remove_metadata()
        self._rows = row_group_size
        self._whole, self._held, self._spool, self._wrote = whole_row_groups, 0, None, False
        self._release = release_each_write
        self._writer = _writer(self._tmp, self._schema)

    def write(self, table: pa.Table) -> None:
        """Append ``table`` (its schema must equal the stream's, metadata aside)."""
        table = table.replace_schema_metadata(None).cast(self._schema)
        if not self._whole:
            self._write(table)
            return
        pos = 0
        if self._held:
            take = min(table.num_rows, self._rows - self._held)
            if self._held + take < self._rows:
                self._to_spool(table)
                return
            self._write_spooled(table.slice(0, take))
            pos = take
        whole = (table.num_rows - pos) // self._rows * self._rows
        if whole:
            self._write(table.slice(pos, whole))
        if pos + whole < table.num_rows:
            self._to_spool(table.slice(pos + whole))

    def _write(self, table: pa.Table) -> None:
        self._writer.write_table(table, row_group_size=self._rows)
        self._wrote = True
        if self._release:
            release_memory()

    def _to_spool(self, table: pa.Table) -> None:
        if self._spool is None:
            self._spool = pa.ipc.new_file(str(self._spool_path), self._schema)
        self._spool.write_table(table)
        self._held += table.num_rows

    def _write_spooled(self, tail: pa.Table | None) -> None:
        """Write the spooled rows, then ``tail``, as one table; empty the spool."""
        self._spool.close()
        self._spool = None
        with pa.memory_map(str(self._spool_path)) as src:
            held = pa.ipc.open_file(src).read_all()
            self._write(pa.concat_tables([held, tail]) if tail is not None else held)
            del held
        self._spool_path.unlink()
        self._held = 0

    def add_metadata(self, metadata: dict[str, str]) -> None:
        """Add parquet key-value metadata (``megacpp.*`` lineage keys) to the file."""
        self._writer.add_key_value_metadata(metadata)

    def close(self) -> Path:
        """Write what is spooled (with ``whole_row_groups``, an empty row group when no row
        was ever written, as ``write_table`` of an empty table), close the file and rename
        it into place. Returns the final path."""
        if self._whole and self._held:
            self._write_spooled(None)
        elif self._whole and not self._wrote:
            self._write(self._schema.empty_table())
        self._writer.close()
        os.replace(self._tmp, self.path)
        return self.path

    def __enter__(self) -> "ParquetStream":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def abort(self) -> None:
        """Close and remove the temporary files; nothing appears under the final name."""
        if self._spool is not None:
            self._spool.close()
            self._spool = None
        self._writer.close()
        self._tmp.unlink(missing_ok=True)
        self._spool_path.unlink(missing_ok=True)


def write_parquet(table: pa.Table, path: str | os.PathLike, row_group_size: int = ROW_GROUP_SIZE) -> Path:
    """Write ``table`` to the local ``path`` atomically and deterministically
    (:func:`write_parquet_to`; stages write through :mod:`megacpp_core.storage` instead).

    The file is written to ``path.tmp`` and renamed into place once closed. Returns the
    final path. Raises ``OSError`` when the directory cannot be written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    write_parquet_to(table, tmp, row_group_size)
    os.replace(tmp, path)
    return path


def read_parquet(path: str | os.PathLike, columns: list[str] | None = None) -> pa.Table:
    """Read a parquet file written by :func:`write_parquet`.

    Raises ``FileNotFoundError`` naming the path when it is missing.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing (materialize the upstream asset first)")
    return pq.read_table(path, columns=columns)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, streamed through one reused ``chunk``-byte buffer
    (1 MiB; no bytes object per read). ``OSError`` when the file cannot be read."""
    h = hashlib.sha256()
    buf = memoryview(bytearray(chunk))
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(buf[:n])
    return h.hexdigest()


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write UTF-8 text atomically (tmp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def value_counts(column: pa.ChunkedArray | pa.Array) -> dict[str, int]:
    """``{value: count}`` of a string column, sorted by value; nulls count under ``"none"``."""
    import pyarrow.compute as pc

    vc = pc.value_counts(column.fill_null("none")).to_pylist()
    return {d["values"]: d["counts"] for d in sorted(vc, key=lambda d: d["values"])}


def lookup_codes(column, mapping: dict[str, int], what: str, keys=None):
    """``int32`` array (chunked like ``column``): ``mapping[value]`` for each value of the
    string ``column``, looked up in arrow (``pc.index_in``, no Python loop over the rows).
    Raises ``ValueError`` naming the first value that is not a key of ``mapping`` (``what``
    names the column; ``keys``, an aligned column such as ``doc_key``, names its row)."""
    import pyarrow.compute as pc

    names = list(mapping)
    pos = pc.index_in(column, value_set=pa.array(names, pa.string()))
    if pos.null_count:
        at = pos.to_pylist().index(None)
        who = f"{keys[at].as_py()}: " if keys is not None else ""
        raise ValueError(f"{who}unknown {what} {column[at].as_py()!r}, expected one of {sorted(mapping)}")
    return pc.take(pa.array([mapping[n] for n in names], pa.int32()), pos)

