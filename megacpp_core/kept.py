"""The kept files and documents of a snapshot, read shard by shard (there is no
snapshot-wide copy of the texts).

Stage 4 writes decisions only (keep/drop per ``doc_key``, from hashes and signatures);
readers that need the kept texts stream every revision's scrubbed shards, keep the rows
the decisions keep, and put them in **keep order** — ``(LICENSE_RANK[license_class],
source_order, path)``, the order every later stage follows. The result does not depend on
the number of shards.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .dedup import LICENSE_RANK
from .tables import lookup_codes

#: Columns that put kept files in keep order (with ``doc_key``, which every reader needs).
FILE_ORDER_COLUMNS = ["doc_key", "license_class", "source_order", "path"]
#: Columns that put documents (chunks) in snapshot keep order (with ``doc_key``).
DOCUMENT_ORDER_COLUMNS = ["doc_key", "license_class", "source", "path", "chunk_index"]


def _order(keys: dict[str, pa.Array]) -> pa.Array | None:
    """The indices that sort ``keys`` (name → aligned array) ascending, first key first;
    ``None`` when the rows are in that order already."""
    order = pc.sort_indices(pa.table(keys), sort_keys=[(k, "ascending") for k in keys])
    if pc.all(pc.equal(order, pa.array(np.arange(len(order), dtype=np.uint64)))).as_py() in (True, None):
        return None
    return order


def _sorted(table: pa.Table, keys: dict[str, pa.Array]) -> pa.Table:
    """``table`` taken in ascending order of ``keys`` (name → aligned array), first key first.

    ``table`` itself, not a copy, when its rows are in that order already (a shard's files
    and documents are written in keep order, so re-sorting one shard would copy every
    column, token planes included, for nothing: the format step on xl peaked at 1,044 MB
    with the copy, 979 MB without)."""
    order = _order(keys)
    return table if order is None else table.take(order)


def _ranks(table: pa.Table):
    return lookup_codes(table.column("license_class"), LICENSE_RANK, "license_class")


def kept_keys(decisions: pa.Table) -> pa.Array:
    """The ``doc_key`` of every kept file of a ``decisions`` table (string array)."""
    return decisions.filter(pc.field("keep")).column("doc_key").combine_chunks()


def iter_kept(refs: Iterable, keys: pa.Array, columns: list[str] | None = None) -> Iterator[pa.Table]:
    """The kept rows of each scrubbed shard (``refs``: input references with
    ``iter_batches``), one shard at a time, filtered record batch by record batch (the
    whole shard is never held); ``columns`` must include ``doc_key`` when given."""
    for ref in refs:
        batches = [b.filter(pc.is_in(b.column("doc_key"), value_set=keys)) for b in ref.iter_batches(columns)]
        if batches:
            yield pa.Table.from_batches(batches)


def keep_order(table: pa.Table) -> pa.Table:
    """``table`` (with ``license_class``, ``source_order``, ``path``) sorted in keep order."""
    return _sorted(table, {"r": _ranks(table), "s": table.column("source_order"), "p": table.column("path")})


def shard_kept(scrubbed, decisions, columns: list[str] | None = None) -> pa.Table:
    """The kept files of one scrubbed shard in keep order (``columns`` plus the keep-order
    columns; every column when None). ``scrubbed`` and ``decisions`` are input references;
    only the decisions of this shard's ``doc_key`` values are read (a filter applied row
    group by row group), so memory follows the shard, not the snapshot."""
    cols = None if columns is None else sorted(set(columns) | set(FILE_ORDER_COLUMNS))
    t = scrubbed.read(columns=cols)
    if not t.num_rows:
        return t
    mine = t.column("doc_key").combine_chunks()
    dec = decisions.read(columns=["doc_key", "keep"], filters=pc.field("doc_key").isin(mine) & (pc.field("keep") == True))  # noqa: E712
    return keep_order(t.filter(pc.is_in(t.column("doc_key"), value_set=dec.column("doc_key").combine_chunks())))


def document_order(table: pa.Table, source_order: dict[str, int]) -> pa.Table:
    """Documents (``license_class``, ``source``, ``path``, ``chunk_index``) in snapshot keep
    order: ``(LICENSE_RANK, source_order, path, chunk_index)``, ``source_order`` being the
    manifest position of each source. The order packing and the Megatron export follow; it
    does not depend on the number of shards."""
    order = document_order_indices(table, source_order)
    return table if order is None else table.take(order)


def document_order_indices(table: pa.Table, source_order: dict[str, int]) -> pa.Array | None:
    """The row indices (uint64) that put ``table``'s documents in :func:`document_order`,
    ``None`` when they are in it already; for a reader that walks the rows in that order
    instead of copying the table."""
    src = lookup_codes(table.column("source"), source_order, "source")
    return _order({"r": _ranks(table), "s": src, "p": table.column("path"), "c": table.column("chunk_index")})


def read_documents(refs: Iterable, source_order: dict[str, int], columns: list[str] | None = None,
                   drops: pa.Array | None = None) -> pa.Table:
    """Every document of the document shards ``refs`` (``chunks`` or ``tokenized`` input
    references) but the ``doc_key`` values in ``drops``, in :func:`document_order`
    (``columns`` plus the order columns). Holds the documents it returns: the pack and
    format stages call it with the columns they need."""
    cols = None if columns is None else list(dict.fromkeys(list(columns) + DOCUMENT_ORDER_COLUMNS))
    refs, parts = list(refs), []
    for ref in refs:
        t = ref.read(columns=cols)
        if drops is not None and len(drops) and t.num_rows:
            t = t.filter(pc.invert(pc.is_in(t.column("doc_key"), value_set=drops)))
        if t.num_rows:
            parts.append(t)
    if not parts:
        return refs[0].read(columns=cols).slice(0, 0) if refs else pa.table({})
    return document_order(pa.concat_tables(parts), source_order)


def kept_table(refs: Iterable, decisions: pa.Table, columns: list[str] | None = None) -> pa.Table:
    """Every kept file of the scrubbed shards ``refs`` in keep order (``columns`` plus the
    keep-order columns). Holds the kept rows of the snapshot: for snapshot-wide readers
    only (the tokenizer takes a bounded sample with :func:`sample`)."""
    cols = None if columns is None else sorted(set(columns) | set(FILE_ORDER_COLUMNS))
    parts = list(iter_kept(refs, kept_keys(decisions), cols))
    if not parts:
        return pa.table({})
    return keep_order(pa.concat_tables(parts))


class TextColumn:
    """A string column (``pa.Array`` or ``pa.ChunkedArray``) iterated as Python ``str``,
    ``batch`` rows converted at a time: only the arrow column is held, and every
    ``iter()`` starts over (so a trainer can read it twice). ``len()`` is the row count."""

    def __init__(self, column: pa.Array | pa.ChunkedArray, batch: int = 256):
        self.column, self.batch = column, batch

    def __len__(self) -> int:
        return len(self.column)

    def __iter__(self) -> Iterator[str]:
        chunks = self.column.chunks if isinstance(self.column, pa.ChunkedArray) else [self.column]
        for chunk in chunks:
            for lo in range(0, len(chunk), self.batch):
                yield from chunk.slice(lo, self.batch).to_pylist()


#: Spill record of :func:`sample`: the sha256 of a kept file's ``doc_key`` (four big-endian
#: words, so word order is byte order), its text's UTF-8 bytes, its shard and row.
_SAMPLE_RECORD = np.dtype([("h", "<u8", (4,)), ("n", "<i8"), ("shard", "<i4"), ("row", "<i4")])
#: Records per spill bucket of :func:`sample` (48 bytes each: 2 Mi records are 96 MiB).
SAMPLE_BUCKET_ROWS = 2 << 20


def _shard_kept_mask(t: pa.Table, decisions) -> np.ndarray:
    """``bool[n]``: the rows of a shard table (with ``doc_key``) that ``decisions`` keeps;
    ``decisions`` is a table (``doc_key``, ``keep``) or an input reference, read for this
    shard's keys only (a filter applied row group by row group)."""
    keys = t.column("doc_key").combine_chunks()
    if isinstance(decisions, pa.Table):
        dec = decisions.filter(pc.is_in(decisions.column("doc_key"), value_set=keys))
        dec = dec.filter(pc.field("keep"))
    else:
        dec = decisions.read(columns=["doc_key", "keep"],
                             filters=pc.field("doc_key").isin(keys) & (pc.field("keep") == True))  # noqa: E712
    return pc.is_in(keys, value_set=dec.column("doc_key").combine_chunks()).to_numpy(zero_copy_only=False)


def sample(refs: list, decisions, max_bytes: int, workdir=None, bucket_rows: int = SAMPLE_BUCKET_ROWS) -> pa.Table:
    """A bounded, deterministic sample of the kept files (``doc_key`` string, ``text``
    large_string), in keep order: every kept file when their UTF-8 text totals at most
    ``max_bytes``; else the files taken in ascending sha256 of their ``doc_key`` while the
    total stays within ``max_bytes`` (each file that still fits is taken: the same files
    whatever the shard count or the order of work).

    ``decisions``: the dedup decisions as a table (``doc_key``, ``keep``) or an input
    reference (read per shard, for that shard's keys only). Memory is one shard plus the
    sample: the first pass writes one record per kept file (hash, bytes, shard, row) to
    hash buckets of about ``bucket_rows`` on local disk (``workdir``, a temporary
    directory when None), read back in hash order; the second reads the chosen rows."""
    import hashlib
    import tempfile
    from pathlib import Path

    from .spill import BucketSpill, bucket_count, bucket_of

    refs = list(refs)
    with tempfile.TemporaryDirectory(dir=workdir, prefix="sample-") as tmp:
        counts = [ref.parquet_file().metadata.num_rows for ref in refs]
        buckets = bucket_count(sum(counts), bucket_rows)
        total = 0
        with BucketSpill(Path(tmp), buckets, _SAMPLE_RECORD, "sample") as spill:
            for k, ref in enumerate(refs):
                t = ref.read(columns=["doc_key", "text"])
                if not t.num_rows:
                    continue
                rows = np.flatnonzero(_shard_kept_mask(t, decisions))
                if not len(rows):
                    continue
                n = pc.binary_length(pc.cast(t.column("text"), pa.large_binary())).to_numpy()[rows]
                keys = t.column("doc_key").take(pa.array(rows)).to_pylist()
                del t
                rec = np.empty(len(rows), _SAMPLE_RECORD)
                digests = np.frombuffer(b"".join(hashlib.sha256(x.encode("utf-8")).digest() for x in keys), ">u8")
                rec["h"] = digests.reshape(-1, 4).astype(np.uint64)
                rec["n"], rec["shard"], rec["row"] = n, k, rows
                total += int(n.sum())
                spill.add(bucket_of(rec["h"][:, 0], buckets), rec)
            spill.flush()
            chosen = [np.zeros(0, _SAMPLE_RECORD)]
            used = 0
            for b in range(buckets):
                rec = spill.read(b)
                if total > max_bytes:
                    h = rec["h"]
                    rec = rec[np.lexsort((h[:, 3], h[:, 2], h[:, 1], h[:, 0]))]
                    take, used = _fits(rec["n"], max_bytes - used, used)
                    rec = rec[take]
                chosen.append(rec)
        chosen = np.concatenate(chosen)
    parts = []
    for k in np.unique(chosen["shard"]).tolist():
        rows = np.sort(chosen["row"][chosen["shard"] == k])
        t = refs[k].read(columns=FILE_ORDER_COLUMNS + ["text"])
        parts.append(t.take(pa.array(rows.astype(np.int64))))
    if not parts:
        return pa.table({"doc_key": pa.array([], pa.string()), "text": pa.array([], pa.large_string())})
    m = keep_order(pa.concat_tables(parts))
    return pa.table({"doc_key": m.column("doc_key").combine_chunks(),
                     "text": m.column("text").cast(pa.large_string()).combine_chunks()})


def _fits(n: np.ndarray, room: int, used: int) -> tuple[np.ndarray, int]:
    """The files (``int64`` positions in ``n``, their bytes in hash order) a greedy scan takes
    with ``room`` bytes left: every file that still fits. Returns ``(positions, bytes used
    in all)``. The scan only moves forward, over windows that double while they fit whole
    (a run that fits is one cumsum) or hold no file that fits, so it is linear in ``n``."""
    taken, pos, w = [], 0, 64
    while pos < len(n):  # with no room left, files of 0 bytes still fit
        c = np.cumsum(n[pos:pos + w])
        k = int(np.searchsorted(c, room, side="right"))
        if k:
            taken.append(np.arange(pos, pos + k))
            room, used, pos = room - int(c[k - 1]), used + int(c[k - 1]), pos + k
        if k == len(c):
            w *= 2
            continue
        w = 64
        while pos < len(n):  # n[pos] no longer fits: the next one that does
            nxt = np.flatnonzero(n[pos:pos + w] <= room)
            if len(nxt):
                pos += int(nxt[0])
                break
            pos, w = pos + w, w * 2
        w = 64
    return (np.concatenate(taken) if taken else np.zeros(0, np.int64)), used
