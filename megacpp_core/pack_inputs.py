"""Tokenized documents as packing inputs, after FIM — shared by the pack and format stages
(the document-level Megatron export writes exactly the sequences that enter the rows).

FIM is deterministic by seed and doc key (:mod:`megacpp_core.fim`), so both stages get
identical sequences from the same tokenized table and settings.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from . import pack, tokenize

#: Columns of the tokenized table every packing input needs.
BASE_COLUMNS = ["doc_key", "source", "revision", "path", "chunk_index", "input_ids"]


def columns_to_read(names: list[str]) -> tuple[list[str], list[str]]:
    """``(columns to read, optional enrichment columns present)`` for a tokenized table
    whose columns are ``names``."""
    optional = [c for c in pack.OPTIONAL_COLUMNS if c in names]
    return BASE_COLUMNS + ["text"] + optional, optional


def tokenized_shards(ctx, tokenizer_sha256: str) -> list:
    """Every ``tokenized`` shard input of the snapshot (manifest order, then shard keys);
    each must name the snapshot tokenizer, else
    :class:`~megacpp_core.pack.TokenizerMismatchError`."""
    refs = ctx.inputs("tokenized")
    for ref in refs:
        pack.check_tokenizer({"tokenizer_sha256": ref.metadata().get("tokenizer_sha256")}, tokenizer_sha256, None, ref.uri)
    return refs


def chunk_drops(ctx) -> pa.Array:
    """The ``doc_key`` of every chunk the chunk-level dedup dropped (string array)."""
    return ctx.input("chunk_drops").read(columns=["doc_key"]).column("doc_key").combine_chunks()


def pack_inputs(docs: pa.Table, optional: list[str], order: pa.Array | None = None) -> list[pack.PackInput]:
    """One :class:`~megacpp_core.pack.PackInput` per row of ``docs``, in row order or in
    ``order`` (row indices; the table is walked, not copied, in that order); planes are
    sliced from one flat array per column, not built as Python lists."""
    ids = docs.column("input_ids").combine_chunks()
    offsets = ids.offsets.to_numpy()
    flat = ids.values.to_numpy(zero_copy_only=False).astype(np.uint32, copy=False)
    planes = [c for c in optional if c in pack.PLANES]
    flat_planes = {}
    for c in planes:
        col = docs.column(c).combine_chunks()
        flat_planes[c] = (col.offsets.to_numpy(), col.values.to_numpy(zero_copy_only=False))
    d = docs.select([c for c in BASE_COLUMNS if c != "input_ids"] + [c for c in optional if c not in planes]).to_pydict()
    inputs = []
    for i in (range(docs.num_rows) if order is None else order.to_numpy().tolist()):
        extras = {c: d[c][i] for c in optional if c not in flat_planes}
        for c, (offs, vals) in flat_planes.items():
            extras[c] = vals[offs[i]:offs[i + 1]]
        inputs.append(pack.PackInput(flat[offsets[i]:offsets[i + 1]], d["doc_key"][i], d["source"][i], d["revision"][i],
                                     d["path"][i], d["chunk_index"][i], extras=extras))
    return inputs


def fim_config(settings):
    """The snapshot's :class:`megacpp_core.fim.FimConfig` from its settings (``fim_rate``,
    ``fim_spm_share``, ``fim_seed``, ``fim_doc_comment_policy``)."""
    from . import fim

    return fim.FimConfig(rate=settings.fim_rate, spm_share=settings.fim_spm_share, seed=settings.fim_seed,
                         doc_comment_policy=settings.fim_doc_comment_policy)


def apply_fim(inputs: list[pack.PackInput], texts, settings, tok,
              tokenizer_sha256: str | None = None) -> tuple[list[pack.PackInput], dict]:
    """FIM over pack inputs with the snapshot's settings (``row_length`` bounds the
    markers); returns the permuted inputs and FIM figures."""
    from . import fim

    cfg = fim_config(settings)
    table, lengths = tokenize.byte_table(tok, tokenizer_sha256) if cfg.rate > 0 and cfg.doc_comment_policy == "mask" else (None, None)
    return fim.apply_fim_all(inputs, cfg, settings.row_length, table, lengths,
                             texts if table is not None else None)


class TextsInOrder:
    """``docs``' ``text`` column as a sequence in ``order`` (row indices, or row order when
    ``None``), each text made a Python string only when FIM asks for it (the doc-comment
    policy reads the texts of the documents it draws), not all at once."""

    def __init__(self, column: pa.ChunkedArray, order: pa.Array | None = None):
        self._column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        self._order = None if order is None else order.to_numpy()

    def __len__(self) -> int:
        return len(self._column) if self._order is None else len(self._order)

    def __getitem__(self, i: int) -> str:
        return self._column[int(i if self._order is None else self._order[i])].as_py()


def packed_documents(docs: pa.Table, settings, tok, tokenizer_sha256: str | None = None, order: pa.Array | None = None
                     ) -> tuple[list[pack.PackInput], list[str], dict, pa.Table | None]:
    """The tokenized documents as pack inputs after FIM (in row order, or in ``order``:
    row indices, walking the table without copying it), the optional enrichment columns
    they carry, FIM figures and, without ``order``, the raw table (``doc_key``, ``text``,
    ``input_ids``; ``None`` with an ``order``). ``docs`` must hold :func:`columns_to_read`
    of its own column names."""
    _, optional = columns_to_read(docs.column_names)
    inputs = pack_inputs(docs, optional, order)
    inputs, figs = apply_fim(inputs, TextsInOrder(docs.column("text"), order), settings, tok, tokenizer_sha256)
    return inputs, optional, figs, (docs.select(["doc_key", "text", "input_ids"]) if order is None else None)
