"""The document-level Megatron export (SPEC §7): one ``.bin/.idx`` sequence per document
exactly as it enters the packed rows (after FIM), shared by the format stage and every
curriculum family.

Memory is two document shards: the one being read and computed on this thread and the one
being written by the writer thread. Each shard is read once (keys, texts, ids and the
order columns; its tokenizer checked on the open file) and handled as whole arrays: the
ids as the flat ``values`` of the list column with the documents' lengths, moved by FIM
in one gather (:func:`megacpp_core.fim.apply_cuts` after the vectorised draws of
:func:`megacpp_core.fim.decide_all`), range-checked and handed to the writer thread,
which appends the documents parquet's row group (``doc_key``, ``text``), hashes the ids
and appends them to the one output pair in a single write
(:meth:`megacpp_core.megatron.RawIndexedDatasetBuilder.add_documents`: the raw writer,
byte-identical to megatron-core's ``IndexedDatasetBuilder`` fed the same documents one
``add_item``/``end_document`` at a time, tests/test_megatron.py) — the parquet's
compression on one core while the next shard is decoded on the other. A FIM document's
text is its ids' bytes: the source text cut at the byte offsets of the two cuts (from the
ids' byte lengths) with the markers' bytes between the pieces, built by one arrow
``take`` (:func:`fim_texts`); the per-token byte gather of :func:`decoded_texts` remains
for text that is not its ids' bytes. The output is the same bytes as one
``write_indexed_dataset`` of every document, whatever the number of shards.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import fim, kept, megatron, pack, pack_inputs, snapshot_tokenizer, tokenize
from . import tokenizer as tk
from .tables import ParquetStream, sha256_file

#: Writer of the document-level pair: the raw writer (one write per shard, no parts to
#: merge). megatron-core's builder takes one tensor per sequence, and its ``add_index``
#: (the per-shard merge this export used before) runs ``gc.collect()`` per part.
BACKEND = "raw"
#: Columns read from each document shard, besides the order columns
#: (:data:`megacpp_core.kept.DOCUMENT_ORDER_COLUMNS`); FIM moves ids by ``doc_key`` and length alone.
COLUMNS = ["doc_key", "text", "input_ids"]

def token_bytes(tok, tokenizer_sha256: str | None) -> pa.LargeBinaryArray:
    """The bytes of every id of ``tok`` (:func:`megacpp_core.fim.token_byte_table`) as one
    ``LargeBinaryArray``, kept per process by ``tokenizer_sha256``
    (:func:`megacpp_core.tokenize.byte_array`)."""
    return tokenize.byte_array(tok, tokenizer_sha256)


def gate_tokenizer(ctx, tokenizer_sha256: str):
    """The snapshot tokenizer a stage parsed, for its verify gate to decode document zero
    with, when it was parsed from bytes of sha256 ``tokenizer_sha256``: the one this
    process keeps (:func:`megacpp_core.snapshot_tokenizer.parsed`, no file read), else
    :func:`megacpp_core.snapshot_tokenizer.load` of the stage's inputs; None when neither
    has that sha256 or the inputs cannot be loaded (the gate then parses the committed
    ``tokenizer.json`` itself)."""
    tok = snapshot_tokenizer.parsed(tokenizer_sha256)
    if tok is not None:
        return tok
    try:
        tok, info = snapshot_tokenizer.load(ctx)
    except (OSError, ValueError, KeyError):
        return None
    return tok if info["sha256"] == tokenizer_sha256 else None


#: :func:`token_byte_lengths` of the byte table of :func:`token_bytes`, by the same sha256.
_WIDTHS: dict[str, np.ndarray] = {}


def token_byte_lengths(tok, tokenizer_sha256: str | None) -> np.ndarray:
    """Byte length of every id of ``tok`` (index = id): :func:`token_bytes`' offsets'
    differences, as uint8 when every token has at most 255 bytes (a gather of a byte
    table is twice as fast), else int64; kept per process by ``tokenizer_sha256``."""
    got = _WIDTHS.get(tokenizer_sha256) if tokenizer_sha256 else None
    if got is None:
        table = token_bytes(tok, tokenizer_sha256)
        offsets = np.frombuffer(table.buffers()[1], np.int64, count=len(table) + 1, offset=table.offset * 8)
        got = np.diff(offsets)
        got = got.astype(np.uint8) if not got.size or int(got.max()) <= 255 else got
        if tokenizer_sha256:
            _WIDTHS.clear()
            _WIDTHS[tokenizer_sha256] = got
    return got


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
    if body.size and int(body.max()) >= len(token_bytes(tok, tokenizer_sha256)):
        raise ValueError(f"token id out of range: min {int(body.min())}, max {int(body.max())}")
    doc_offsets, data = tokenize.ids_bytes(tok, tokenizer_sha256, body.astype(np.int64, copy=False),
                                           _starts(np.maximum(lengths - 1, 0)))
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


def fim_texts(texts: pa.Array, ids: np.ndarray, lengths: np.ndarray, mode: np.ndarray, a: np.ndarray, b: np.ndarray,
              tok, tokenizer_sha256: str | None) -> pa.LargeStringArray | None:
    """The text column of documents after FIM: ``texts`` (one null-free string per
    document, its ids' bytes as UTF-8) with each drawn document (``mode`` int8[n] > 0,
    body cuts ``a``/``b`` int64[n], :func:`megacpp_core.fim.decide_all`) rearranged as
    its ids are — PSM ``<FIM_PREFIX> pre <FIM_SUFFIX> suf <FIM_MIDDLE> mid``, SPM
    ``<FIM_PREFIX> <FIM_SUFFIX> suf <FIM_MIDDLE> pre mid`` — so each equals
    ``decoded_texts`` of its FIM ids. ``ids`` are the documents' ids before FIM
    (``lengths`` int[n] tokens each, BOS first); the pieces' byte sizes are sums of the
    ids' byte lengths (:func:`token_byte_lengths`, one ``np.add.reduceat``), the text is
    cut there and all pieces and markers are put in order by one arrow ``take``. None
    when that cannot give the ids' bytes: a null text, a drawn text whose byte length is
    not its ids' bytes, or a result that is not UTF-8 (a cut inside a character; the
    caller then decodes as :func:`decoded_texts` does). ``ValueError`` for an id the
    tokenizer does not have."""
    if texts.null_count:
        return None
    n = np.asarray(lengths, dtype=np.int64)
    count = n.size
    t_off, _ = _string_buffers(texts)
    drawn = np.flatnonzero(mode > 0)
    widths = token_byte_lengths(tok, tokenizer_sha256)
    if ids.size and int(ids.max()) >= widths.size:
        raise ValueError(f"token id out of range: min {int(ids.min())}, max {int(ids.max())}")
    start = _starts(n)[drawn]
    bounds = np.stack([start + 1, start + 1 + a[drawn], start + 1 + b[drawn], start + n[drawn]], axis=1).ravel()
    per_token = np.take(widths, ids)
    # byte sizes of [body start, cut a), [a, b), [b, end), [end, next body start) (the
    # bounds never decrease): bounds at the end of the ids start empty ranges, so reduceat
    # (which needs bounds inside the array) runs its last range to the end instead
    inside = int(np.searchsorted(bounds, ids.size))
    sums = np.zeros(bounds.size, np.int64)
    if inside:
        got = np.add.reduceat(per_token, bounds[:inside], dtype=np.int64)
        got[:-1][bounds[1:inside] == bounds[:inside - 1]] = 0  # reduceat gives an empty range its first element
        sums[:inside] = got
    pre, mid, suf = (sums.reshape(-1, 4)[:, k] for k in range(3))
    text_len = t_off[1:] - t_off[:-1]
    if not np.array_equal(pre + mid + suf, text_len[drawn]):
        return None
    cut = np.repeat(t_off[1:, None], 2, axis=1)  # non-drawn: whole text, then two empty pieces
    cut[drawn, 0] = t_off[:-1][drawn] + pre
    cut[drawn, 1] = cut[drawn, 0] + mid
    offsets = np.concatenate([np.stack([t_off[:-1], cut[:, 0], cut[:, 1]], axis=1).ravel(), t_off[-1:]])
    data = texts.buffers()[2] if texts.buffers()[2] is not None else pa.py_buffer(b"")
    pieces = pa.Array.from_buffers(pa.large_binary(), 3 * count, [None, pa.py_buffer(offsets), data])
    table = token_bytes(tok, tokenizer_sha256)
    marks = pa.array([table[fim.FIM_PREFIX_ID].as_py(), table[fim.FIM_SUFFIX_ID].as_py(),
                      table[fim.FIM_MIDDLE_ID].as_py(), b""], pa.large_binary())
    p_, s_, m_, e_ = range(3 * count, 3 * count + 4)
    order = np.full((count, 6), e_, np.int64)  # six output slots per document, empty by default
    order[:, :3] = 3 * np.arange(count)[:, None] + np.arange(3)
    pre_i, mid_i, suf_i = (3 * np.arange(count) + k for k in range(3))
    layouts = {1: (p_, pre_i, s_, suf_i, m_, mid_i), 2: (p_, s_, suf_i, m_, pre_i, mid_i)}
    for m, layout in layouts.items():
        sel = mode == m
        for slot, what in enumerate(layout):
            order[sel, slot] = what[sel] if isinstance(what, np.ndarray) else what
    got = pa.concat_arrays([pieces, marks]).take(pa.array(order.ravel()))
    got_off = np.frombuffer(got.buffers()[1], np.int64, count=len(got) + 1, offset=got.offset * 8)
    out_data = got.buffers()[2] if got.buffers()[2] is not None else pa.py_buffer(b"")
    out = pa.LargeStringArray.from_buffers(count, pa.py_buffer(np.ascontiguousarray(got_off[::6])), out_data)
    try:
        out.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return out


def _check_file_tokenizer(pf, tokenizer_sha256: str | None, ref) -> None:
    """With ``tokenizer_sha256``, the open parquet file's ``megacpp.tokenizer_sha256``
    metadata must name it (:func:`megacpp_core.pack.check_tokenizer`:
    ``TokenizerMismatchError`` naming ``ref``)."""
    if tokenizer_sha256 is None:
        return
    recorded = (pf.schema_arrow.metadata or {}).get(b"megacpp.tokenizer_sha256")
    pack.check_tokenizer({"tokenizer_sha256": recorded.decode() if recorded is not None else None},
                         tokenizer_sha256, None, getattr(ref, "uri", str(ref)))


def read_shard(ref, source_order: dict[str, int], drops: pa.Array, tokenizer_sha256: str | None = None) -> pa.Table:
    """One document shard's :data:`COLUMNS` and order columns but the ``doc_key`` values in
    ``drops``, in :func:`megacpp_core.kept.document_order` — as
    :func:`megacpp_core.kept.read_documents` of the one shard, read through its parquet
    file and copied by the filter only when it drops a row. With ``tokenizer_sha256``, the
    shard's ``megacpp.tokenizer_sha256`` metadata must name it, read from the same open
    file (:func:`megacpp_core.pack.check_tokenizer`: ``TokenizerMismatchError``)."""
    cols = list(dict.fromkeys(COLUMNS + kept.DOCUMENT_ORDER_COLUMNS))
    if hasattr(ref, "parquet_file"):
        with ref.parquet_file() as pf:
            _check_file_tokenizer(pf, tokenizer_sha256, ref)
            t = pf.read(columns=cols)
    else:  # a reader with ``read`` alone
        t = ref.read(columns=cols)
    if drops is not None and len(drops) and t.num_rows:
        keep = pc.invert(pc.is_in(t.column("doc_key"), value_set=drops))
        if not pc.all(keep).as_py():
            t = t.filter(keep)
    return kept.document_order(t, source_order) if t.num_rows else t


#: Documents a stored-in-order shard is read in at once by :func:`iter_shard`: 256
#: documents of at most 65,536 tokens (the longest family row) are at most 16 Mi tokens.
EXPORT_BATCH_DOCS = 256


def iter_shard(ref, source_order: dict[str, int], drops: pa.Array, tokenizer_sha256: str | None = None,
               batch_docs: int = EXPORT_BATCH_DOCS) -> Iterator[pa.Table]:
    """:func:`read_shard` in pieces: one shard's documents in keep order, as tables of at
    most ``batch_docs`` documents when the shard is stored in keep order already (the
    per-revision repository documents, written that way: memory is one batch, not the
    revision), else the whole shard (a ``tokenized``-like shard, bounded by
    ``shard_bytes``). The order is decided from the order columns alone. Same errors as
    :func:`read_shard`."""
    if not hasattr(ref, "parquet_file"):
        yield read_shard(ref, source_order, drops, tokenizer_sha256)
        return
    cols = list(dict.fromkeys(COLUMNS + kept.DOCUMENT_ORDER_COLUMNS))
    with ref.parquet_file() as pf:
        in_order = False
        if pf.metadata.num_rows > batch_docs:
            keys = pf.read(columns=list(dict.fromkeys(["doc_key"] + kept.DOCUMENT_ORDER_COLUMNS)))
            if drops is not None and len(drops):
                keys = keys.filter(pc.invert(pc.is_in(keys.column("doc_key"), value_set=drops)))
            in_order = kept.document_order_indices(keys, source_order) is None
            del keys
        if in_order:
            _check_file_tokenizer(pf, tokenizer_sha256, ref)
            for batch in pf.iter_batches(batch_size=batch_docs, columns=cols, use_threads=False):
                t = pa.Table.from_batches([batch])
                if drops is not None and len(drops):
                    t = t.filter(pc.invert(pc.is_in(t.column("doc_key"), value_set=drops)))
                if t.num_rows:
                    yield t
            return
    yield read_shard(ref, source_order, drops, tokenizer_sha256)


def shard_documents(docs: pa.Table, settings, tok, tokenizer_sha256: str | None, vocab_size: int
                    ) -> tuple[np.ndarray, np.ndarray, pa.Table]:
    """One shard's documents (``doc_key``, ``text``, ``input_ids``, in keep order) as the
    export writes them: ``(ids, lengths, documents)`` — the ids after FIM back to back
    (uint32[T]), each document's length (int64[n], tokens) and its ``(doc_key, text)``
    table (a FIM document's text its ids' bytes, :func:`fim_texts`, else
    :func:`decoded_texts`; the others' text as read). The ids are the list column's flat
    ``values`` between its first and last offset, no per-row step. ``ValueError`` naming
    the document for an id outside ``[0, vocab_size)``."""
    col = docs.column("input_ids").combine_chunks()
    offsets = col.offsets.to_numpy().astype(np.int64)
    values = col.values.to_numpy(zero_copy_only=False)
    flat = values[offsets[0]:offsets[-1]].astype(np.uint32, copy=False)  # as pack_inputs reads them
    lengths = np.diff(offsets)
    keys = docs.column("doc_key").combine_chunks()
    cfg = pack_inputs.fim_config(settings)
    mode, a, b = fim.decide_all(keys.to_pylist() if cfg.rate > 0 else (), lengths, cfg, settings.row_length)
    ids, new_lengths, drawn = fim.apply_cuts(flat, lengths, mode, a, b)
    if ids.size and int(ids.max()) >= vocab_size:
        bad = int(np.argmax(ids >= vocab_size))
        doc = int(np.searchsorted(_starts(new_lengths), bad, side="right")) - 1
        raise ValueError(f"document {doc} ({keys[doc].as_py()}): token id {int(ids[bad])} >= vocab_size {vocab_size}")
    texts = docs.column("text").combine_chunks()
    if drawn.any():
        spliced = fim_texts(texts, flat, lengths, mode, a, b, tok, tokenizer_sha256)
        if spliced is not None:
            texts = spliced
        else:
            fim_part = decoded_texts(ids[np.repeat(drawn, new_lengths)], new_lengths[drawn], tok, tokenizer_sha256)
            texts = (splice_texts(texts, drawn, fim_part) if not texts.null_count
                     else pc.replace_with_mask(pc.cast(texts, pa.large_string()), pa.array(drawn), fim_part))
    return ids, new_lengths, pa.table({"doc_key": keys, "text": pc.cast(texts, pa.large_string())})


def document_level(refs: list, drops: pa.Array, source_order: dict[str, int], settings, tok, info: dict, d: Path,
                   prefix: Path, docs_out: ParquetStream, check_tokenizer: bool = False,
                   batch_docs: int | None = None) -> dict:
    """Write ``prefix.bin/.idx`` (int32 ids) from the document shards ``refs`` (input
    references of ``tokenized``-like tables with :data:`COLUMNS` and the order columns)
    but the ``doc_key`` values in ``drops``; ``settings`` gives the row length and FIM
    (:func:`megacpp_core.pack_inputs.fim_config`), ``info`` the tokenizer's ``sha256``
    and ``vocab_size``; ``d`` is local scratch space (unused: the pair is written in
    place, atomically). Each shard's documents, in keep order, after FIM — exactly the
    sequences that enter the rows (:func:`shard_documents`) — are appended to the pair,
    and ``(doc_key, text)`` of each sequence goes to ``docs_out``, in shard order, by one
    writer thread (the parquet's compression and the ids' sha256 overlap the next read).
    With ``batch_docs``, a shard stored in keep order is read that many documents at a time
    (:func:`iter_shard`; give ``docs_out`` ``whole_row_groups`` so its bytes do not
    depend on the batches); without, a shard at a time. Memory is two shards' (or batches') ids and texts: the
    enrichment planes and the chunk graph are not read, since FIM draws its spans from
    the ``doc_key`` and the length only (:func:`megacpp_core.fim.decide`). With
    ``check_tokenizer`` each shard's recorded tokenizer must be ``info["sha256"]``
    (:func:`read_shard`). Returns ``{"sequences", "documents", "tokens", "dtype",
    "backend", "bin_sha256", "idx_sha256", "parts"}`` (``parts``: the shards that had
    documents). ``ValueError`` naming the shard for an id outside the vocabulary;
    nothing is left at ``prefix`` then."""
    vocab_size = info["vocab_size"]
    dtype = megatron.megatron_dtype(vocab_size)
    digest = hashlib.sha256()
    parts = sequences = tokens = 0
    wanted = info["sha256"] if check_tokenizer else None

    def append(builder, out: np.ndarray, lengths: np.ndarray, table: pa.Table) -> None:
        docs_out.write(table)
        digest.update(out)
        builder.add_documents(out, lengths)

    with megatron.atomic_builder(prefix, dtype, BACKEND) as (builder, _, tmp_idx), \
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="megatron-export") as writer:
        pending = None  # on an error the executor's exit waits for it, then the builder's exit removes the pair
        for j, ref in enumerate(refs):
            had = False
            for docs in (iter_shard(ref, source_order, drops, wanted, batch_docs) if batch_docs
                         else [read_shard(ref, source_order, drops, wanted)]):
                if not docs.num_rows:
                    continue
                try:
                    ids, lengths, table = shard_documents(docs, settings, tok, info["sha256"], vocab_size)
                except ValueError as e:
                    raise ValueError(f"shard {j} ({getattr(ref, 'uri', ref)}): {e}") from e
                del docs
                # the ids are in [0, vocab_size): an int32 view holds them unchanged
                out = ids.view(np.int32) if dtype == np.int32 and ids.dtype == np.uint32 else ids.astype(dtype, copy=False)
                if pending is not None:
                    pending.result()  # one part in the writer at a time, in order
                pending = writer.submit(append, builder, out, lengths, table)
                had, sequences, tokens = True, sequences + len(lengths), tokens + out.size
            parts += had
        if pending is not None:
            pending.result()
        builder.finalize(tmp_idx)
    return {"sequences": sequences, "documents": sequences, "tokens": tokens, "dtype": dtype.name, "backend": BACKEND,
            "bin_sha256": digest.hexdigest(), "idx_sha256": sha256_file(megatron.idx_path(prefix)), "parts": parts}
