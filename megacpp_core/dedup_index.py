"""The keep-order index of a snapshot's files for the partitioned dedup step (stage 4),
built one source at a time on local disk.

**Keep order** (:mod:`megacpp_core.dedup`): ascending ``(LICENSE_RANK[license_class],
source_order, path, doc_key)``. Its global position — the *index* ``g`` of a file — is
computed without sorting the snapshot: a first pass counts the files of every (rank,
source) group from two small columns, so every group's first index is known; a source's
files are then sorted alone by ``(rank, path, doc_key)``, and a file's index is its group's
first index plus its place in the group. Memory is one source at a time.

Per source the index writes, in local keep order, an arrow IPC file (``doc_key``,
``content_sha256``, ``shard`` and ``row`` of the file in the source's scrubbed shards,
``g``) and a ``.npy`` signature matrix (``uint32[n_s, num_perm]``, from the ``minhash``
shards; a file without one gets it computed from its text). Both are read back memory-mapped
(:meth:`KeepIndex.source_table`, :meth:`KeepIndex.rows`), so a gather touches only the
pages it needs and releases them when done.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import minhash as mh
from .dedup import LICENSE_RANK
from .signatures import read_ref_signatures
from .tables import lookup_codes, release_memory

#: Scrubbed columns the index reads: everything but the text.
META_COLUMNS = ["doc_key", "source", "source_order", "path", "license_class", "content_sha256"]
#: Rows per record batch when texts are read (a batch's texts are the transient: at most
#: 256 files of ``max_file_bytes``).
TEXT_BATCH_ROWS = 256
RANKS = len(LICENSE_RANK)

_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i


def _by_source(refs: Sequence, what: str) -> dict[str, list]:
    """``{source: its refs}`` of inputs in source order; raises :class:`DedupInputError` when a
    source's refs are not contiguous."""
    out: dict[str, list] = {}
    for k, v in itertools.groupby(refs, key=lambda r: r.source):
        if k in out:
            raise DedupInputError(f"{what} inputs of source {k} are not contiguous")
        out[k] = list(v)
    return out


class DedupInputError(ValueError):
    """Bad input to the index: a file of another source, a duplicate ``doc_key``, a
    malformed ``content_sha256``, signatures that do not line up."""


def sha_words(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``uint64[n, 4]``: the 32 bytes of each lowercase hex SHA-256 string of ``col``, big
    endian per word (equal strings give equal rows). Raises :class:`DedupInputError` for a
    value that is not 64 lowercase hex digits."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    n = len(col)
    if n == 0:
        return np.zeros((0, 4), np.uint64)
    col = col.cast(pa.string())
    if col.null_count:
        raise DedupInputError("content_sha256 has nulls")
    lengths = pc.binary_length(col).to_numpy()
    if (lengths != 64).any():
        raise DedupInputError(f"content_sha256 {col[int(np.flatnonzero(lengths != 64)[0])].as_py()!r} is not a hex SHA-256")
    offsets = np.frombuffer(col.buffers()[1], dtype=np.int32)[col.offset:col.offset + n + 1]
    data = np.frombuffer(col.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
    nib = _HEX[data].reshape(n, 4, 16)
    if (nib == 255).any():
        bad = int(np.flatnonzero((nib == 255).any(axis=(1, 2)))[0])
        raise DedupInputError(f"content_sha256 {col[bad].as_py()!r} is not a lowercase hex SHA-256")
    words = np.zeros((n, 4), dtype=np.uint64)
    for q in range(16):
        words = (words << np.uint64(4)) | nib[:, :, q].astype(np.uint64)
    return words


@dataclass
class Source:
    """One source of the index: its scrubbed and minhash shard inputs, its file count and
    its number of files of each license rank (``rank_counts``, ``int64[RANKS]``)."""

    name: str
    order: int
    scrubbed: list
    minhash: list = field(default_factory=list)
    n: int = 0
    rank_counts: np.ndarray = field(default_factory=lambda: np.zeros(RANKS, np.int64))


class KeepIndex:
    """The keep-order index over the scrubbed shards ``scrubbed`` and the signatures
    ``minhash`` (input references in manifest then shard order, each with ``.source``),
    written under ``workdir``.

    After :meth:`build`: ``n`` files; :meth:`locate` maps indices to (source, local row);
    :meth:`source_table` / :meth:`source_signatures` read one source back; :meth:`rows`
    gathers signature rows and :meth:`keys` doc keys for any indices; :meth:`texts_of`
    streams texts. Raises :class:`DedupInputError` on inconsistent input (see the class)."""

    def __init__(self, scrubbed: Sequence, minhash: Sequence, workdir: str | Path, num_perm: int):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.num_perm = num_perm
        by_source, mh_by = _by_source(scrubbed, "scrubbed"), _by_source(minhash, "minhash")
        if set(mh_by) - set(by_source):
            raise DedupInputError(f"signatures of sources without scrubbed files: {sorted(set(mh_by) - set(by_source))}")
        if [s for s in by_source if s in mh_by] != list(mh_by):
            raise DedupInputError("the minhash inputs are not in the order of the scrubbed inputs' sources")
        self.sources: list[Source] = []
        for name, refs in by_source.items():
            src = Source(name, -1, refs, mh_by.get(name, []))
            orders = set()
            for ref in refs:  # pass 0: two small columns per shard
                t = ref.read(columns=["license_class", "source_order"])
                if t.num_rows:
                    rank = lookup_codes(t.column("license_class"), LICENSE_RANK, "license_class").to_numpy()
                    src.rank_counts += np.bincount(rank, minlength=RANKS)
                    orders.update(pc.unique(t.column("source_order")).to_pylist())
            if len(orders) > 1:
                raise DedupInputError(f"source {name}: files with several source_order values {sorted(orders)}")
            src.order = orders.pop() if orders else -1
            src.n = int(src.rank_counts.sum())
            self.sources.append(src)
        seen = [s.order for s in self.sources if s.n]
        if len(set(seen)) != len(seen):
            raise DedupInputError(f"two sources share a source_order: {seen}")
        # Groups (rank, source) in keep order: rank first, then source_order.
        by_order = sorted(range(len(self.sources)), key=lambda i: self.sources[i].order)
        counts = np.array([[self.sources[i].rank_counts[r] for i in by_order] for r in range(RANKS)],
                          np.int64).reshape(RANKS, len(by_order))
        first = (np.cumsum(counts.ravel()) - counts.ravel()).reshape(RANKS, len(by_order))
        self.group_first = np.zeros((RANKS, len(self.sources)), np.int64)
        self.group_first[:, by_order] = first
        self.n = int(counts.sum())
        if self.n >= 1 << 31:
            raise DedupInputError(f"{self.n} files: indices must stay below 2^31")
        # Lookup of index -> (source, local): the non-empty groups sorted by first index.
        cells = [(int(self.group_first[r, s]), s, r) for s in range(len(self.sources)) for r in range(RANKS)
                 if self.sources[s].rank_counts[r]]
        cells.sort()
        self._cell_first = np.array([c[0] for c in cells], np.int64)
        self._cell_source = np.array([c[1] for c in cells], np.int64)
        starts = [np.concatenate(([0], np.cumsum(s.rank_counts))) for s in self.sources]
        self._cell_local = np.array([starts[c[1]][c[2]] for c in cells], np.int64)

    # -- building -------------------------------------------------------------------------

    def build(self, spill_sha=None, minhash_rows: np.ndarray | None = None,
              log=lambda m: None) -> int:
        """Sort and write every source (module doc); returns how many signatures were
        computed from texts, :data:`TEXT_BATCH_ROWS` at a time (files missing from the
        ``minhash`` inputs: their texts are read even when exact verification is off).
        ``spill_sha(words uint64[m, 4], g int64[m])`` receives every file's hash and index
        (the exact pass); ``minhash_rows`` (``int32[total minhash rows]``) gets, at each row
        of the concatenated minhash inputs, the index of that file.

        Raises :class:`DedupInputError` for a signature of no scrubbed file of its source or
        a second signature of one file (a stale or rewritten ``minhash`` shard)."""
        mh_row = computed = 0
        for s, src in enumerate(self.sources):
            t = self._read_source(src)
            if t.num_rows != src.n:
                raise DedupInputError(f"source {src.name}: {t.num_rows} files read, {src.n} counted")
            g = self._indices(s, t)
            sig, have = np.empty((src.n, self.num_perm), np.uint32), np.zeros(src.n, bool)
            keys = t.column("doc_key")
            for ref in src.minhash:
                mk, ms = read_ref_signatures(ref)
                if not len(mk):
                    continue
                if ms.shape[1] != self.num_perm:
                    raise DedupInputError(f"{ref.uri}: signatures of {ms.shape[1]} permutations, expected {self.num_perm}")
                at = pc.fill_null(pc.index_in(mk, value_set=keys), -1).to_numpy().astype(np.int64)
                if (at < 0).any():
                    raise DedupInputError(f"{ref.uri}: signature of {mk[int(np.flatnonzero(at < 0)[0])].as_py()!r}, "
                                          f"no scrubbed file of {src.name}: the minhash step is stale")
                u, c = np.unique(at, return_counts=True)
                dup = np.concatenate((at[have[at]], u[c > 1]))
                if len(dup):
                    raise DedupInputError(f"{ref.uri}: a second signature of {keys[int(dup[0])].as_py()!r}")
                sig[at], have[at] = ms, True
                if minhash_rows is not None:
                    minhash_rows[mh_row:mh_row + len(mk)] = g[at]
                mh_row += len(mk)
                del mk, ms
            missing = np.flatnonzero(~have)
            for lo in range(0, len(missing), TEXT_BATCH_ROWS):  # a batch of texts at a time
                got = list(self._texts(t, missing[lo:lo + TEXT_BATCH_ROWS].tolist(), src))
                sig[[r for r, _ in got]] = mh.signatures([text for _, text in got], num_perm=self.num_perm)
            if len(missing):
                log(f"{src.name}: {len(missing)} signatures computed from the texts")
                computed += len(missing)
            out = pa.table({"doc_key": keys, "content_sha256": t.column("content_sha256"),
                            "shard": t.column("shard"), "row": t.column("row"), "g": pa.array(g, pa.int64())})
            with pa.OSFile(str(self._path(s, "arrow")), "wb") as f, pa.ipc.new_file(f, out.schema) as w:
                w.write_table(out)
            np.save(self._path(s, "npy"), sig)
            if spill_sha is not None and src.n:
                spill_sha(sha_words(t.column("content_sha256")), g)
            del t, out, sig, keys
            release_memory()
        return computed

    def _read_source(self, src: Source) -> pa.Table:
        parts = []
        for k, ref in enumerate(src.scrubbed):
            t = ref.read(columns=META_COLUMNS)
            parts.append(t.append_column("shard", pa.array(np.full(t.num_rows, k, np.int32)))
                         .append_column("row", pa.array(np.arange(t.num_rows, dtype=np.int32))))
        t = pa.concat_tables(parts).combine_chunks() if parts else pa.table({c: pa.array([], pa.string()) for c in META_COLUMNS})
        if not t.num_rows:
            return t
        keys = t.column("doc_key")
        other = pc.not_equal(t.column("source"), src.name)
        if pc.any(other).as_py():
            raise DedupInputError(f"source {src.name}: a file of source {t.column('source').filter(other)[0].as_py()!r}")
        prefix = pc.starts_with(keys, f"{src.name}/")
        if not pc.all(prefix).as_py():
            bad = keys.filter(pc.invert(prefix))[0].as_py()
            raise DedupInputError(f"source {src.name}: doc_key {bad!r} does not start with '{src.name}/'")
        if pc.count_distinct(keys).as_py() != t.num_rows:
            vc = pc.value_counts(keys)
            raise DedupInputError(f"duplicate doc_key {vc.filter(pc.greater(vc.field('counts'), 1))[0]['values'].as_py()!r}")
        rank = lookup_codes(t.column("license_class"), LICENSE_RANK, "license_class", keys)
        order = pc.sort_indices(pa.table({"r": rank, "p": t.column("path"), "k": keys}),
                                sort_keys=[("r", "ascending"), ("p", "ascending"), ("k", "ascending")])
        return t.take(order).append_column("rank", rank.take(order)).combine_chunks()

    def _indices(self, s: int, t: pa.Table) -> np.ndarray:
        """``int64[n_s]``: the index of each of source ``s``'s files (``t`` sorted, with ``rank``)."""
        if not t.num_rows:
            return np.zeros(0, np.int64)
        rank = t.column("rank").to_numpy()
        start = np.concatenate(([0], np.cumsum(self.sources[s].rank_counts)))
        return self.group_first[rank, s] + (np.arange(len(rank)) - start[rank])

    def _path(self, s: int, ext: str) -> Path:
        return self.dir / f"source-{s:05d}.{ext}"

    # -- reading back ---------------------------------------------------------------------

    def locate(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(source int64[m], local row int64[m])`` of indices ``g``."""
        g = np.asarray(g, dtype=np.int64)
        cell = np.searchsorted(self._cell_first, g, side="right") - 1
        return self._cell_source[cell], self._cell_local[cell] + (g - self._cell_first[cell])

    def source_table(self, s: int) -> pa.Table:
        """Source ``s``'s index table (``doc_key``, ``content_sha256``, ``shard``, ``row``,
        ``g``) in local keep order, memory-mapped."""
        return pa.ipc.open_file(pa.memory_map(str(self._path(s, "arrow")))).read_all()

    def source_signatures(self, s: int, mmap: bool = False) -> np.ndarray:
        """Source ``s``'s ``uint32[n_s, num_perm]`` signatures in local keep order."""
        return np.load(self._path(s, "npy"), mmap_mode="r" if mmap else None)

    def _by_source(self, g: np.ndarray):
        """``(source, positions in g, local rows)`` for every source that ``g`` touches."""
        src, local = self.locate(g)
        order = np.argsort(src, kind="stable")
        cuts = np.flatnonzero(np.diff(src[order])) + 1
        for part in np.split(order, cuts) if len(order) else []:
            yield int(src[part[0]]), part, local[part]

    def rows(self, g: np.ndarray, columns: slice = slice(None)) -> np.ndarray:
        """``uint32[m, k]``: the signature rows of indices ``g`` (the permutations ``columns``
        selects), gathered from the memory-mapped matrices (unmapped again afterwards)."""
        g = np.asarray(g, dtype=np.int64)
        out = np.empty((len(g), len(range(self.num_perm)[columns])), np.uint32)
        for s, pos, local in self._by_source(g):
            m = self.source_signatures(s, mmap=True)
            out[pos] = m[local][:, columns]
            del m
        return out

    def keys(self, g: np.ndarray) -> pa.Array:
        """The ``doc_key`` strings of indices ``g`` (in that order)."""
        g = np.asarray(g, dtype=np.int64)
        parts, where = [], []
        for s, pos, local in self._by_source(g):
            parts.append(self.source_table(s).column("doc_key").take(pa.array(local)).combine_chunks())
            where.append(pos)
        if not parts:
            return pa.array([], pa.string())
        got = pa.concat_arrays(parts)
        inv = np.empty(len(g), np.int64)
        inv[np.concatenate(where)] = np.arange(len(g))
        return got.take(pa.array(inv))

    def texts_of(self, g: Sequence[int]) -> Iterator[tuple[int, str]]:
        """``(index, text)`` of the files ``g``, read from their scrubbed shards: only the row
        groups holding them, :data:`TEXT_BATCH_ROWS` rows at a time."""
        g = np.asarray(g, dtype=np.int64)
        for s, pos, local in self._by_source(g):
            t = self.source_table(s)
            yield from ((int(g[pos[q]]), text) for q, text in self._texts(t, local.tolist(), self.sources[s],
                                                                           positions=True))

    def _texts(self, t: pa.Table, local: list[int], src: Source, positions: bool = False) -> Iterator[tuple[int, str]]:
        """``(q or local row, text)`` of rows ``local`` of a source table ``t`` (``shard``,
        ``row``, ``doc_key``); ``q`` is the position in ``local`` when ``positions``."""
        shard = t.column("shard").to_numpy()[local]
        row = t.column("row").to_numpy()[local]
        want_keys = t.column("doc_key").take(pa.array(local, pa.int64())).to_pylist()
        for k in np.unique(shard).tolist():
            mine = np.flatnonzero(shard == k)
            pf = src.scrubbed[k].parquet_file()
            ends = np.cumsum([pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)])
            by_row = {int(row[q]): int(q) for q in mine}
            for rg in np.unique(np.searchsorted(ends, row[mine], side="right")).tolist():
                at = int(ends[rg - 1]) if rg else 0
                for batch in pf.iter_batches(batch_size=TEXT_BATCH_ROWS, row_groups=[rg], columns=["doc_key", "text"],
                                             use_threads=False):
                    hit = [r for r in range(at, at + batch.num_rows) if r in by_row]
                    if hit:
                        idx = pa.array([r - at for r in hit], pa.int64())
                        got_keys = batch.column(0).take(idx).to_pylist()
                        for r, key, text in zip(hit, got_keys, batch.column(1).take(idx).to_pylist()):
                            q = by_row[r]
                            if key != want_keys[q]:
                                raise DedupInputError(f"{src.scrubbed[k].uri}: row {r} holds {key!r}, the index "
                                                  f"{want_keys[q]!r}: the shard changed while dedup read it")
                            yield (q if positions else local[q]), text
                    at += batch.num_rows
