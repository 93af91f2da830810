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


def write_parquet(table: pa.Table, path: str | os.PathLike, row_group_size: int = ROW_GROUP_SIZE) -> Path:
    """Write ``table`` to ``path`` atomically and deterministically.

    The file is written to ``path.tmp`` and renamed into place once closed. Schema
    metadata is dropped so that no library or wall-clock information leaks into the
    bytes. Compression is zstd level 3.

    Returns the final path. Raises ``OSError`` when the directory cannot be written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    table = table.replace_schema_metadata(None)
    pq.write_table(
        table,
        tmp,
        compression="zstd",
        compression_level=3,
        row_group_size=row_group_size,
        write_statistics=True,
        store_schema=False,
    )
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
    """Hex SHA-256 of a file's bytes, streamed in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
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
