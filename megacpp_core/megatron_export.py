"""The document-level Megatron export (SPEC §7): one ``.bin/.idx`` sequence per document
exactly as it enters the packed rows (after FIM), shared by the format stage and every
curriculum family.

Memory is one document shard. Each shard is read once (keys, texts, ids and the order
columns) and handled as whole arrays: the ids as one flat numpy array with the
documents' lengths (``list_flatten`` / ``list_value_length``), moved by FIM in one gather
(:func:`megacpp_core.fim.permute_ids`), range-checked, hashed and appended to the one
output pair in a single write (:meth:`megacpp_core.megatron.RawIndexedDatasetBuilder.add_documents`:
the raw writer, byte-identical to megatron-core's ``IndexedDatasetBuilder`` fed the same
documents one ``add_item``/``end_document`` at a time, tests/test_megatron.py); the
documents parquet gets the shard's ``doc_key`` and ``text`` arrow columns, a FIM
document's text being its ids' bytes (:func:`decoded_texts`). The output is the same
bytes as one ``write_indexed_dataset`` of every document, whatever the number of shards.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import fim, kept, megatron, pack_inputs, snapshot_tokenizer, tokenize
from . import tokenizer as tk
from .tables import ParquetStream, sha256_file

#: Writer of the document-level pair: the raw writer (one write per shard, no parts to
#: merge). megatron-core's builder takes one tensor per sequence, and its ``add_index``
#: (the per-shard merge this export used before) runs ``gc.collect()`` per part.
BACKEND = "raw"
#: Columns read from each document shard, besides the order columns
#: (:data:`megacpp_core.kept.DOCUMENT_ORDER_COLUMNS`); FIM moves ids by ``doc_key`` and length alone.
COLUMNS = ["doc_key", "text", "input_ids"]

#: The byte table of the snapshot tokenizer as one arrow array (index = id), by its
#: sha256: one at a time.
_BYTES: dict[str, pa.LargeBinaryArray] = {}


def token_bytes(tok, tokenizer_sha256: str | None) -> pa.LargeBinaryArray:
    """The bytes of every id of ``tok`` (:func:`megacpp_core.fim.token_byte_table`,
    through the per-process cache of :func:`megacpp_core.tokenize.byte_table`) as one
    ``LargeBinaryArray``, kept per process by ``tokenizer_sha256``."""
    got = _BYTES.get(tokenizer_sha256) if tokenizer_sha256 else None
    if got is None:
        table, _ = tokenize.byte_table(tok, tokenizer_sha256)
        got = pa.array(table, pa.large_binary())
        if tokenizer_sha256:
            _BYTES.clear()
            _BYTES[tokenizer_sha256] = got
    return got


def gate_tokenizer(ctx, tokenizer_sha256: str):
    """The snapshot tokenizer a stage parsed (:func:`megacpp_core.snapshot_tokenizer.load`,
    kept per process) for its verify gate to decode document zero with, when its sha256 is
    ``tokenizer_sha256``; None otherwise, or when it cannot be loaded (the gate then parses
    the committed ``tokenizer.json`` itself)."""
    try:
        tok, info = snapshot_tokenizer.load(ctx)
    except (OSError, ValueError, KeyError):
        return None
    return tok if info["sha256"] == tokenizer_sha256 else None


def _starts(lengths: np.ndarray) -> np.ndarray:
    """int64 offsets ``[0, l0, l0 + l1, …]`` (one more than ``lengths``)."""
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def decoded_texts(ids: np.ndarray, lengths: np.ndarray, tok, tokenizer_sha256: str | None = None) -> pa.LargeStringArray:
    """``tokenizer.decode(tok, doc[1:])`` of every document (``ids`` back to back,
    ``lengths`` tokens each, BOS first), as one arrow array.

    The tokenizer's decoder is byte-level: a document's text is its ids' bytes as UTF-8.
    They are gathered for all documents with one ``take`` of :func:`token_bytes`, and the
    whole array is checked as UTF-8 by arrow; only when some document's bytes are not
    valid UTF-8 (an id sequence that splits a character) is each document decoded by the
    tokenizer itself, which replaces such bytes. ``ValueError`` for an id the tokenizer
    does not have (as :func:`megacpp_core.tokenizer.decode`)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = _starts(lengths)
    first = np.zeros(ids.size, bool)
    first[starts[:-1][lengths > 0]] = True
    body = np.asarray(ids)[~first]
    table = token_bytes(tok, tokenizer_sha256)
    if body.size and int(body.max()) >= len(table):
        raise ValueError(f"token id out of range: min {int(body.min())}, max {int(body.max())}")
    got = pc.take(table, pa.array(body.astype(np.int64, copy=False)))
    token_offsets = np.frombuffer(got.buffers()[1], np.int64, count=len(got) + 1, offset=got.offset * 8)
    doc_offsets = token_offsets[_starts(np.maximum(lengths - 1, 0))]
    data = got.buffers()[2] if got.buffers()[2] is not None else pa.py_buffer(b"")
    texts = pa.LargeStringArray.from_buffers(len(lengths), pa.py_buffer(doc_offsets), data)
    try:
        texts.validate(full=True)
        return texts
    except pa.ArrowInvalid:  # some document's bytes are not UTF-8: the tokenizer's own (lossy) decode
        data = data.to_pybytes()
        out = []
        for i, (s, e) in enumerate(zip(doc_offsets[:-1].tolist(), doc_offsets[1:].tolist())):
            try:
                out.append(data[s:e].decode("utf-8"))
            except UnicodeDecodeError:
                out.append(tk.decode(tok, ids[starts[i] + 1:starts[i + 1]]))
        return pa.array(out, pa.large_string())


def _string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(int64 offsets, uint8 data)`` of a null-free string array (either offset width;
    a sliced array's own offsets, not re-based)."""
    width = np.int64 if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type) else np.int32
    offsets = np.frombuffer(arr.buffers()[1], width, count=len(arr) + 1, offset=arr.offset * np.dtype(width).itemsize)
    data = arr.buffers()[2]
    return offsets.astype(np.int64), (np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8))


def splice_texts(texts: pa.Array, drawn: np.ndarray, replacements: pa.Array) -> pa.LargeStringArray:
    """``texts`` with the rows where ``drawn`` is set replaced, in order, by
    ``replacements`` (``pyarrow.compute.replace_with_mask`` as one ``large_string``
    array), built in one copy of the bytes: each run of consecutive rows from the same
    side is one slice. Both arrays must be free of nulls."""
    t_off, t_data = _string_buffers(texts)
    r_off, r_data = _string_buffers(replacements)
    rank = np.cumsum(drawn) - 1  # row -> its replacement, for drawn rows
    lengths = np.where(drawn, r_off[np.minimum(rank + 1, len(replacements))] - r_off[np.maximum(rank, 0)],
                       t_off[1:] - t_off[:-1])
    cuts = np.concatenate([[0], np.flatnonzero(drawn[1:] != drawn[:-1]) + 1, [len(drawn)]]).tolist()
    pieces = []
    for s, e in zip(cuts[:-1], cuts[1:]):
        if drawn[s]:
            pieces.append(r_data[r_off[rank[s]]:r_off[rank[e - 1] + 1]])
        else:
            pieces.append(t_data[t_off[s]:t_off[e]])
    data = np.concatenate(pieces) if pieces else np.zeros(0, np.uint8)
    return pa.LargeStringArray.from_buffers(len(drawn), pa.py_buffer(_starts(lengths)), pa.py_buffer(data))


def read_shard(ref, source_order: dict[str, int], drops: pa.Array) -> pa.Table:
    """One document shard's :data:`COLUMNS` and order columns but the ``doc_key`` values in
    ``drops``, in :func:`megacpp_core.kept.document_order` — as
    :func:`megacpp_core.kept.read_documents` of the one shard, read through its parquet
    file and copied by the filter only when it drops a row."""
    cols = list(dict.fromkeys(COLUMNS + kept.DOCUMENT_ORDER_COLUMNS))
    if hasattr(ref, "parquet_file"):
        with ref.parquet_file() as pf:
            t = pf.read(columns=cols)
    else:  # a reader with ``read`` alone
        t = ref.read(columns=cols)
    if drops is not None and len(drops) and t.num_rows:
        keep = pc.invert(pc.is_in(t.column("doc_key"), value_set=drops))
        if not pc.all(keep).as_py():
            t = t.filter(keep)
    return kept.document_order(t, source_order) if t.num_rows else t


def shard_documents(docs: pa.Table, settings, tok, tokenizer_sha256: str | None, vocab_size: int
                    ) -> tuple[np.ndarray, np.ndarray, pa.Table]:
    """One shard's documents (``doc_key``, ``text``, ``input_ids``, in keep order) as the
    export writes them: ``(ids, lengths, documents)`` — the ids after FIM back to back,
    each document's length, and its ``(doc_key, text)`` table (a FIM document's text
    decoded from its ids, :func:`decoded_texts`; the others' text as read). ``ValueError``
    naming the document for an id outside ``[0, vocab_size)``."""
    col = docs.column("input_ids").combine_chunks()
    flat = pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.uint32, copy=False)  # as pack_inputs reads them
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    keys = docs.column("doc_key").combine_chunks()
    cfg = pack_inputs.fim_config(settings)
    ids, lengths, drawn = fim.permute_ids(flat, lengths, keys.to_pylist() if cfg.rate > 0 else (), cfg,
                                          settings.row_length)
    if ids.size and int(ids.max()) >= vocab_size:
        bad = int(np.argmax(ids >= vocab_size))
        doc = int(np.searchsorted(_starts(lengths), bad, side="right")) - 1
        raise ValueError(f"document {doc} ({keys[doc].as_py()}): token id {int(ids[bad])} >= vocab_size {vocab_size}")
    texts = docs.column("text").combine_chunks()
    if drawn.any():
        fim_texts = decoded_texts(ids[np.repeat(drawn, lengths)], lengths[drawn], tok, tokenizer_sha256)
        texts = (splice_texts(texts, drawn, fim_texts) if not texts.null_count
                 else pc.replace_with_mask(pc.cast(texts, pa.large_string()), pa.array(drawn), fim_texts))
    return ids, lengths, pa.table({"doc_key": keys, "text": pc.cast(texts, pa.large_string())})


def document_level(refs: list, drops: pa.Array, source_order: dict[str, int], settings, tok, info: dict, d: Path,
                   prefix: Path, docs_out: ParquetStream) -> dict:
    """Write ``prefix.bin/.idx`` (int32 ids) from the document shards ``refs`` (input
    references of ``tokenized``-like tables with :data:`COLUMNS` and the order columns)
    but the ``doc_key`` values in ``drops``; ``settings`` gives the row length and FIM
    (:func:`megacpp_core.pack_inputs.fim_config`), ``info`` the tokenizer's ``sha256``
    and ``vocab_size``; ``d`` is local scratch space (unused: the pair is written in
    place, atomically). Each shard's documents, in keep order, after FIM — exactly the
    sequences that enter the rows (:func:`shard_documents`) — are appended to the pair,
    and ``(doc_key, text)`` of each sequence goes to ``docs_out``. Memory is one shard's
    ids and texts: the enrichment planes and the chunk graph are not read, since FIM
    draws its spans from the ``doc_key`` and the length only
    (:func:`megacpp_core.fim.decide`). Returns ``{"sequences", "documents", "tokens",
    "dtype", "backend", "bin_sha256", "idx_sha256", "parts"}`` (``parts``: the shards
    that had documents). ``ValueError`` naming the shard for an id outside the
    vocabulary; nothing is left at ``prefix`` then."""
    vocab_size = info["vocab_size"]
    dtype = megatron.megatron_dtype(vocab_size)
    digest = hashlib.sha256()
    parts = sequences = tokens = 0
    with megatron.atomic_builder(prefix, dtype, BACKEND) as (builder, _, tmp_idx):
        for j, ref in enumerate(refs):
            docs = read_shard(ref, source_order, drops)
            if not docs.num_rows:
                continue
            try:
                ids, lengths, table = shard_documents(docs, settings, tok, info["sha256"], vocab_size)
            except ValueError as e:
                raise ValueError(f"shard {j} ({getattr(ref, 'uri', ref)}): {e}") from e
            out = ids.astype(dtype, copy=False)
            digest.update(out)
            builder.add_documents(out, lengths)
            docs_out.write(table)
            parts, sequences, tokens = parts + 1, sequences + len(lengths), tokens + out.size
        builder.finalize(tmp_idx)
    return {"sequences": sequences, "documents": sequences, "tokens": tokens, "dtype": dtype.name, "backend": BACKEND,
            "bin_sha256": digest.hexdigest(), "idx_sha256": sha256_file(megatron.idx_path(prefix)), "parts": parts}
