"""Streaming packing (SPEC §6): the plan reads document lengths, the rows are built one
packing group at a time.

1. **Plan over lengths.** Every ``tokenized`` shard gives ``(doc_key, license_class,
   source, path, chunk_index, n_tokens)`` — a bounded summary, never the ids. The documents
   (less the chunk-level dedup drops) are put in snapshot keep order
   (:func:`megacpp_core.kept.document_order`); each length becomes its length after FIM
   (:func:`fim_length`: FIM adds three marker tokens to a drawn document that still fits
   the row; the draw depends only on the seed and the doc key).
2. **Packing groups.** Consecutive documents in keep order, cut once a group would exceed
   ``pack_group_tokens`` (a setting). Best-fit decreasing runs within each group, so the
   fill is ≥ 99 % of the bound of its group once a group holds a few hundred rows, and the
   groups depend only on the documents and settings — never on the number of shards or
   the order work ran in.
3. **Files from the plan.** The row count of every group is known from its lengths, so the
   train/validation split (the last ``ceil(validation_fraction × rows)`` rows) and the
   file cuts (``max_docs_per_shard``) are fixed before any row is built.
4. **Rows, group by group.** A group reads only its documents from the shards, by row
   number, decoding only the row groups that hold them (:func:`read_rows`); applies FIM,
   builds its rows with :func:`megacpp_core.pack.build_rows` (the same best-fit
   decreasing as the plan), checks the row contract and appends them to the open files in
   1,024-row row groups (rows short of a row group wait on local disk). Memory is one
   group (``pack_group_tokens``) or one row group, not the snapshot.

With one group (any snapshot under ``pack_group_tokens``) the files are byte-identical to
packing the whole table at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import fim, kept, pack, pack_inputs
from . import tokenizer as tk
from .tables import ParquetStream

#: Columns of the length summary read from each tokenized shard.
SUMMARY_COLUMNS = kept.DOCUMENT_ORDER_COLUMNS + ["n_tokens"]
#: FIM counts summed over the groups (the rest of the FIM figures are the settings).
FIM_COUNTS = ("fim_psm", "fim_spm", "fim_skipped_too_long", "fim_doc_comment_masked_tokens", "fim_doc_comment_docs")


#: Tokens the row-contract check (:func:`megacpp_core.pack.check_rows`) takes at once:
#: rows longer than 8,192 are checked fewer at a time, so its matrices stay the size of
#: :data:`~megacpp_core.pack.CHECK_ROWS` rows of 8,192 whatever the row length.
CHECK_TOKENS = 128 * 8192


def check_batch_rows(row_length: int, rows: int | None = None) -> int:
    """Rows per :func:`~megacpp_core.pack.check_rows` call at ``row_length``: at most
    ``rows`` (default :data:`~megacpp_core.pack.CHECK_ROWS`) and at most
    :data:`CHECK_TOKENS` tokens, at least 1 (16 rows of 65,536 tokens, 64 of 16,384, 128
    of 8,192 or less)."""
    rows = pack.CHECK_ROWS if rows is None else rows
    return max(1, min(rows, CHECK_TOKENS // max(1, row_length)))


def fim_length(doc_key: str, n: int, cfg: fim.FimConfig, row_length: int) -> int:
    """Length (tokens, BOS included) of a document of ``n`` tokens after FIM: ``n + 3``
    when :func:`megacpp_core.fim.decide` draws it and the markers still fit ``row_length``
    (:func:`megacpp_core.fim.apply_fim`), else ``n``."""
    mode, _, _ = fim.decide(doc_key, n - 1, cfg)
    return n + fim.MARKERS if mode != "none" and n + fim.MARKERS <= row_length else n


@dataclass
class PackPlan:
    """The packing plan of a snapshot, from lengths only.

    ``docs``: ``doc_key``, ``ref`` (index of its tokenized shard), ``row`` (its row in
    that shard, int64), ``length`` (int64, after FIM) in keep order; ``groups``: ``[start, end)`` document ranges; ``group_rows``:
    rows per group; ``files``: ``{"file", "split", "start", "end", "docs"}`` global row
    ranges; ``validation_rows``; ``rows``.
    """

    docs: pa.Table
    groups: list[tuple[int, int]]
    group_rows: list[int]
    files: list[dict] = field(default_factory=list)
    validation_rows: int = 0
    rows: int = 0


def plan(refs: list, source_order: dict[str, int], drops: pa.Array, settings, *, group_tokens: int) -> PackPlan:
    """The :class:`PackPlan` of the tokenized shards ``refs`` (input references) less
    ``drops`` with the pack ``settings`` (``row_length``, ``validation_fraction``,
    ``max_docs_per_shard``, FIM). Reads the length summary only. Raises
    :class:`~megacpp_core.pack.PackingError` for a document longer than the row."""
    parts = []
    for i, ref in enumerate(refs):
        t = ref.read(columns=SUMMARY_COLUMNS)
        t = t.append_column("row", pa.array(np.arange(t.num_rows, dtype=np.int64)))
        if len(drops) and t.num_rows:
            t = t.filter(pc.invert(pc.is_in(t.column("doc_key"), value_set=drops)))
        parts.append(t.append_column("ref", pa.array(np.full(t.num_rows, i, dtype=np.int32))))
    summary = kept.document_order(pa.concat_tables(parts), source_order) if parts else None
    L = settings.row_length
    cfg = pack_inputs.fim_config(settings)
    keys = [] if summary is None else summary.column("doc_key").to_pylist()
    n_tokens = [] if summary is None else summary.column("n_tokens").to_pylist()
    lengths = np.fromiter((fim_length(k, n, cfg, L) for k, n in zip(keys, n_tokens)), dtype=np.int64, count=len(keys))
    groups, start, acc = [], 0, 0
    for i, n in enumerate(lengths.tolist()):
        if acc + n > group_tokens and i > start:
            groups.append((start, i))
            start, acc = i, 0
        acc += n
    if len(keys) > start:
        groups.append((start, len(keys)))
    group_rows, row_docs = [], []
    for a, b in groups:
        rows = pack.best_fit_decreasing(lengths[a:b].tolist(), L, keys[a:b])
        group_rows.append(len(rows))
        row_docs.extend(len(r) for r in rows)
    docs = pa.table({"doc_key": pa.array(keys, pa.string()),
                     "ref": summary.column("ref") if summary is not None else pa.array([], pa.int32()),
                     "row": summary.column("row") if summary is not None else pa.array([], pa.int64()),
                     "length": pa.array(lengths)})
    n = len(row_docs)
    n_val = math.ceil(n * settings.validation_fraction) if n > 1 else 0
    files = []
    for split, lo, hi in (("train", 0, n - n_val), ("validation", n - n_val, n)):
        start, shard = lo, 0
        while start < hi:
            end, acc = start, 0
            while end < hi and (acc + row_docs[end] <= settings.max_docs_per_shard or end == start):
                acc += row_docs[end]
                end += 1
            files.append({"file": f"{split}-{shard:05d}.parquet", "split": split, "start": start, "end": end, "docs": acc})
            start, shard = end, shard + 1
    return PackPlan(docs, groups, group_rows, files, n_val, n)


class _FileWriter:
    """The planned files, filled in row order. Each file is a
    :class:`~megacpp_core.tables.ParquetStream` with ``whole_row_groups``: rows short of a
    whole row group wait on local disk, so the bytes do not depend on where the packing
    groups end and memory holds one packing group or one row group, not both."""

    def __init__(self, out_dir: Path, files: list[dict], row_group_size: int):
        self.out_dir, self.files, self.rg = out_dir, files, row_group_size
        self.i, self.stream, self.tokens = 0, None, 0
        self.done: list[tuple[str, Path, dict]] = []

    def add(self, rows: pa.Table, first: int) -> None:
        """Append ``rows``, whose first row is global row ``first``."""
        pos = 0
        while pos < rows.num_rows:
            f = self.files[self.i]
            take = min(rows.num_rows - pos, f["end"] - (first + pos))
            self._write(rows.slice(pos, take))
            pos += take
            if first + pos == f["end"]:
                self._close()

    def _write(self, part: pa.Table) -> None:
        if self.stream is None:
            self.stream = ParquetStream(self.out_dir / self.files[self.i]["file"], part.schema, self.rg,
                                        whole_row_groups=True)
            self.tokens = 0
        self.tokens += int(pc.sum(part.column("valid_token_count")).as_py() or 0)
        self.stream.write(part)

    def _close(self) -> None:
        f = self.files[self.i]
        path = self.stream.close()
        self.done.append((f["file"], path, {"split": f["split"], "rows": f["end"] - f["start"], "docs": f["docs"],
                                            "tokens": self.tokens}))
        self.i, self.stream = self.i + 1, None

    def abort(self) -> None:
        """Remove the open file's temporary and spool files (after an error)."""
        if self.stream is not None:
            self.stream.abort()
            self.stream = None


def read_rows(ref, rows: np.ndarray, columns: list[str]) -> pa.Table:
    """The rows ``rows`` (int64 row numbers of the file) of a parquet input, in file
    order: only the row groups that hold them are decoded (``ParquetFile.read_row_groups``),
    so a packing group of a few documents of a large file reads a few row groups, not the
    file. An input without ``parquet_file`` is read whole and taken from."""
    rows = np.unique(rows)
    if not hasattr(ref, "parquet_file"):
        return ref.read(columns=columns).take(pa.array(rows))
    with ref.parquet_file() as pf:
        md = pf.metadata
        starts = np.cumsum([0] + [md.row_group(i).num_rows for i in range(md.num_row_groups)])
        groups = np.unique(np.searchsorted(starts, rows, side="right") - 1)
        t = pf.read_row_groups(groups.tolist(), columns=columns, use_threads=False)
    # row numbers within the concatenation of the row groups read
    first = np.cumsum(np.concatenate([[0], starts[groups + 1] - starts[groups]]))[:-1]
    local = rows - starts[groups][np.searchsorted(groups, np.searchsorted(starts, rows, side="right") - 1)]
    local += first[np.searchsorted(groups, np.searchsorted(starts, rows, side="right") - 1)]
    return t.take(pa.array(local))


def write_rows(p: PackPlan, refs: list, source_order: dict[str, int], settings, tok, tokenizer_sha256: str,
               vocab_size: int, out_dir: Path, row_group_size: int = 1024) -> tuple[list[tuple[str, Path, dict]], dict, dict, list]:
    """Build and write the rows of plan ``p`` group by group into ``out_dir`` (local).

    Returns ``(files, summary, fim figures, optional columns)``: ``files`` as
    ``[(name, local path, info)]`` for :class:`~megacpp_core.stage.Shards`, the row
    contract summary of :func:`megacpp_core.pack.check_rows` over every group (rows,
    tokens, docs, loss_tokens, padding_fraction), the FIM figures. Raises
    :class:`~megacpp_core.pack.RowContractError` for a bad row and ``RuntimeError`` when a
    group's rows disagree with the plan (inputs changed under the stage).
    """
    first = pack_inputs.columns_to_read(refs[0].schema().names)[0] if refs else []
    first = list(dict.fromkeys(first + kept.DOCUMENT_ORDER_COLUMNS))
    writer = _FileWriter(out_dir, p.files, row_group_size)
    try:
        return _write_groups(p, refs, source_order, settings, tok, tokenizer_sha256, vocab_size, writer, first)
    except BaseException:
        writer.abort()
        raise


def _write_groups(p: PackPlan, refs: list, source_order: dict[str, int], settings, tok, tokenizer_sha256: str,
                  vocab_size: int, writer: _FileWriter, first: list[str]):
    """:func:`write_rows`' loop over the packing groups, into ``writer``."""
    summary = {"rows": 0, "tokens": 0, "docs": 0, "loss_tokens": 0}
    fim_figs: dict = {}
    optional: list = []
    offset = 0
    keys_all, ref_all = p.docs.column("doc_key"), p.docs.column("ref").to_numpy()
    row_all = p.docs.column("row").to_numpy()
    for g, (a, b) in enumerate(p.groups):
        wanted = keys_all.slice(a, b - a)
        parts = []
        for r in np.unique(ref_all[a:b]).tolist():
            parts.append(read_rows(refs[r], row_all[a:b][ref_all[a:b] == r], first))
        docs = pa.concat_tables(parts)
        del parts
        order = kept.document_order_indices(docs, source_order)  # walked in this order, not copied
        got = docs.column("doc_key") if order is None else docs.column("doc_key").take(order)
        if got.to_pylist() != wanted.to_pylist():
            raise RuntimeError(f"packing group {g}: the tokenized shards no longer hold the planned documents")
        inputs, optional, figs, _ = pack_inputs.packed_documents(docs, settings, tok, tokenizer_sha256, order)
        del docs
        rows = pack.build_rows(inputs, settings.row_length, tk.BOS_ID, tk.PAD_ID, optional=optional)
        del inputs
        if rows.num_rows != p.group_rows[g]:
            raise RuntimeError(f"packing group {g}: {rows.num_rows} rows built, {p.group_rows[g]} planned")
        rows = rows.set_column(rows.schema.get_field_index("pack_id"), "pack_id",
                               pa.array(np.arange(offset, offset + rows.num_rows, dtype=np.int64)))
        step = check_batch_rows(settings.row_length)
        for a in range(0, rows.num_rows, step):  # the producer's assertion, a slice at a time
            s = pack.check_rows(rows.slice(a, step), settings.row_length, vocab_size, tk.BOS_ID, tk.PAD_ID,
                                where=f"packed rows (group {g}, rows from {a})")
            for k in summary:
                summary[k] += s[k]
        for k, v in figs.items():
            fim_figs[k] = fim_figs.get(k, 0) + v if k in FIM_COUNTS else v
        writer.add(rows, offset)
        offset += rows.num_rows
        del rows  # not held while the next group is built
    if writer.stream is not None:
        raise RuntimeError("packing ended inside a planned file")
    cells = summary["rows"] * settings.row_length
    summary["padding_fraction"] = float(1 - summary["tokens"] / cells) if cells else 0.0
    if not fim_figs:
        _, fim_figs = fim.apply_fim_all([], pack_inputs.fim_config(settings), settings.row_length)
    return writer.done, summary, fim_figs, optional
