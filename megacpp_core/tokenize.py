"""Stage 8 — tokenize documents to uint32 ids with one BOS per document (SPEC §4, §6).

Input: the documents table of stage 6/7 (``doc_key``, ``text`` …). Output: the same rows
with ``input_ids`` list<uint32> = ``[BOS] + encode(text)`` and ``n_tokens`` (including
BOS). Gate: BOS first, every id < vocab size, and ``decode(ids[1:]) == text`` exactly for
every document (a failed round trip fails the stage naming the document). Before any of
that, :func:`check_tokenizer` refuses a tokenizer whose sha256 or vocabulary size differs
from the snapshot's manifest, the corpus manifest's pin or what the stage before recorded.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from . import ids_memo
from . import tokenizer as tk


class TokenizeError(ValueError):
    """A document failed the tokenize gate (vocab range or round trip)."""


def check_tokenizer(tok, info: dict, vocab_size: int | None = None, pinned_sha256: str | None = None,
                    upstream_sha256: str | None = None) -> None:
    """Refuse to tokenize with a tokenizer that is not the snapshot's (SPEC §4: the sha256
    and vocabulary size travel with every artifact).

    ``info`` is ``tokenizer_manifest.json``; ``tok`` the loaded tokenizer (its real size must
    equal ``info["vocab_size"]``); ``vocab_size`` the manifest setting; ``pinned_sha256`` the
    manifest's ``tokenizer.sha256`` pin; ``upstream_sha256`` what the stage before recorded.
    Raises :class:`~megacpp_core.tokenizer.TokenizerMismatchError` naming both values.
    """
    real = tok.get_vocab_size(with_added_tokens=True)
    tk.check_tokenizer_identity(info, vocab_size=real, where="tokenizer.json (loaded)")
    tk.check_tokenizer_identity(info, vocab_size=vocab_size, where="manifest settings.vocab_size")
    tk.check_tokenizer_identity(info, sha256=pinned_sha256, where="manifest tokenizer pin")
    tk.check_tokenizer_identity(info, sha256=upstream_sha256, where="chunked documents")


def tokenize_documents(documents: pa.Table, tok, vocab_size: int, batch: int = 256,
                       sha256: str | None = None) -> tuple[pa.Table, dict]:
    """Tokenize every document; return ``(table, figures)``.

    ``table`` = ``documents`` plus ``input_ids`` (list<uint32>) and ``n_tokens`` (int32).
    Raises :class:`TokenizeError` naming the first document whose ids reach the vocab
    size or whose decode differs from its text, ``ValueError`` if ``tok`` would match
    special tokens in text (load it with ``tokenizer.load_tokenizer``). Encoding and the
    round-trip decode run ``batch`` documents at a time in ``tokenizers``' thread pool;
    only the ids outlive a batch (a ``tokenizers`` ``Encoding`` holds its tokens, offsets
    and masks too: the 3,359 documents of xl's largest shard, 9.0 M tokens, in one call
    held about 1 GB of them).

    ``sha256``: the sha256 of ``tok``'s ``tokenizer.json``; when given, a document whose
    ids the chunk stage of this process made (a whole file, or a document of a file it
    split) takes those ids from
    :data:`megacpp_core.ids_memo.MEMO` instead of being encoded again (the same ids; its
    decode is checked all the same), and the memo is emptied at the end.
    """
    tk._require_literal_specials(tok)
    keys = documents.column("doc_key").to_pylist()
    texts = documents.column("text").to_pylist()
    out: list[np.ndarray] = []
    encode = tk.ids_encoder(tok)
    memo = ids_memo.MEMO if sha256 is not None else None
    try:
        for start in range(0, len(texts), batch):
            chunk = texts[start:start + batch]
            held = [memo.take(sha256, t) for t in chunk] if memo is not None else [None] * len(chunk)
            lists = [None if h is None else h.tolist() for h in held]
            todo = [j for j, h in enumerate(held) if h is None]
            for j, e in zip(todo, encode([chunk[j] for j in todo], add_special_tokens=False) if todo else ()):
                lists[j] = e.ids
            decoded = tok.decode_batch(lists, skip_special_tokens=False)
            for j, back in enumerate(decoded):
                key = keys[start + j]
                ids = held[j] if held[j] is not None else np.asarray(lists[j], dtype=np.uint32)
                if ids.size and int(ids.max()) >= vocab_size:
                    raise TokenizeError(f"{key}: token id {int(ids.max())} ≥ vocab size {vocab_size}")
                if back != chunk[j]:
                    raise TokenizeError(f"{key}: decode(encode(text)) != text")
                out.append(np.concatenate([np.array([tk.BOS_ID], dtype=np.uint32), ids]))
    finally:
        if memo is not None:
            memo.clear()
    lengths = np.array([len(x) for x in out], dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
    flat = np.concatenate(out) if out else np.zeros(0, dtype=np.uint32)
    ids_col = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat, type=pa.uint32())).cast(pa.list_(pa.uint32()))
    table = documents.append_column("input_ids", ids_col).append_column("n_tokens", pa.array(lengths))
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)
    figures = {"documents": len(texts), "tokens": int(lengths.sum()), "text_bytes": int(text_bytes),
               "bytes_per_token": round(text_bytes / max(1, int(lengths.sum()) - len(texts)), 4),
               "max_document_tokens": int(lengths.max()) if len(lengths) else 0}
    return table, figures


# --------------------------------------------------------------------------- alignment

class AlignmentError(ValueError):
    """Token spans or enrichment planes do not line up with a document (fails closed)."""


#: Character-level planes of stage 6 and the token-level plane each becomes (SPEC §4).
CHAR_PLANES = {"char_structure": "structure_ids", "char_ast_depth": "ast_depth",
               "char_sibling_index": "sibling_index", "char_ast_node_type": "ast_node_type"}
#: Planes sampled at the token's first non-whitespace character (the first character when
#: the token is all whitespace); ``structure_ids`` is sampled at the first character
#: (SPEC §4 "sampled at each token's first character").
_AST_SAMPLED = ("ast_depth", "sibling_index", "ast_node_type")
_WS = np.zeros(128, dtype=bool)
_WS[[9, 10, 11, 12, 13, 32]] = True

_BYTE_TABLES: dict[str, tuple[list[bytes], np.ndarray]] = {}


def byte_table(tok, sha256: str | None = None) -> tuple[list[bytes], np.ndarray]:
    """``(bytes per id, int64 byte length per id)`` of a byte-level tokenizer, cached per
    process by the tokenizer's sha256 when given (building it walks the whole vocabulary)."""
    from .fim import token_byte_lengths, token_byte_table

    if sha256 and sha256 in _BYTE_TABLES:
        return _BYTE_TABLES[sha256]
    table = token_byte_table(tok, sha256)
    out = (table, token_byte_lengths(table))
    if sha256:
        _BYTE_TABLES[sha256] = out
    return out


_BYTE_ARRAYS: dict[str, pa.LargeBinaryArray] = {}


def byte_array(tok, sha256: str | None = None) -> pa.LargeBinaryArray:
    """:func:`byte_table`'s bytes of every id as one arrow ``LargeBinaryArray`` (index =
    id), for gathering the bytes of many ids with one ``take``; kept per process by the
    tokenizer's sha256 when given (the latest tokenizer's only)."""
    got = _BYTE_ARRAYS.get(sha256) if sha256 else None
    if got is None:
        got = pa.array(byte_table(tok, sha256)[0], pa.large_binary())
        if sha256:
            _BYTE_ARRAYS.clear()
            _BYTE_ARRAYS[sha256] = got
    return got


def ids_bytes(tok, sha256: str | None, ids: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, pa.Buffer]:
    """The bytes of token ``ids`` (int64, each in ``[0, vocabulary size)``) back to back,
    gathered with one arrow ``take`` of :func:`byte_array` (kept by ``sha256``), and the
    byte offset in them of each token position of ``bounds`` (int64, ascending, at most
    ``len(ids)``: document starts and the end, for instance): ``(int64 offsets
    [len(bounds)], data buffer)``; the bytes of the ids ``ids[bounds[i]:bounds[i + 1]]``
    are ``data[offsets[i]:offsets[i + 1]]``. An id outside the vocabulary raises arrow's
    ``IndexError``; callers check first."""
    return table_bytes(byte_array(tok, sha256), ids, bounds)


def table_bytes(table: pa.LargeBinaryArray, ids: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, pa.Buffer]:
    """:func:`ids_bytes` on a given byte table (``table[i]``: the bytes of id ``i``)."""
    got = table.take(pa.array(ids))
    token_offsets = np.frombuffer(got.buffers()[1], np.int64, count=len(got) + 1, offset=got.offset * 8)
    data = got.buffers()[2] if got.buffers()[2] is not None else pa.py_buffer(b"")
    return token_offsets[bounds], data


def decode_ids(tok, sha256: str | None, ids: np.ndarray) -> str:
    """:func:`megacpp_core.tokenizer.decode` of ``ids`` (one document's or piece's, any
    integer dtype) for a byte-level tokenizer: its ids' bytes (:func:`ids_bytes`, one
    ``take``) as UTF-8, or, when they are not valid UTF-8 (an id sequence that splits a
    character), the tokenizer's own lossy decode. ``ValueError`` for an id outside the
    vocabulary, as :func:`~megacpp_core.tokenizer.decode`.

    The byte table gives an added token its content's UTF-8
    (:func:`megacpp_core.fim.token_byte_table`). ``tokenizers`` decodes an added token
    whose content is written only in the byte-level alphabet as byte symbols instead, so
    one that holds a symbol standing for another byte (``Ġx``: `` x``) would differ.
    ``default``'s tokenizer has none of those among its 31,135 added tokens (checked one
    by one against its decode), and the tokenize stage's round trip, made with the
    tokenizer's own decode, refuses a document holding one."""
    ids = np.asarray(ids, dtype=np.int64).ravel()
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= len(byte_array(tok, sha256))):
        raise ValueError(f"token id out of range: min {int(ids.min())}, max {int(ids.max())}")
    offsets, data = ids_bytes(tok, sha256, ids, np.asarray([0, ids.size], np.int64))
    try:
        return data.to_pybytes()[offsets[0]:offsets[1]].decode("utf-8") if ids.size else ""
    except UnicodeDecodeError:
        return tk.decode(tok, ids)


def _spelled(table: list[bytes] | pa.LargeBinaryArray, body: np.ndarray, src: bytes) -> bool:
    """Whether the bytes of token ids ``body`` (int64, in range) are exactly ``src``:
    one arrow ``take`` of a ``LargeBinaryArray`` table (:func:`byte_array`), or a join of
    a ``list[bytes]`` one (:func:`byte_table`)."""
    if not isinstance(table, pa.Array):
        return b"".join([table[i] for i in body.tolist()]) == src
    offsets, data = table_bytes(table, body, np.asarray([0, body.size], np.int64))
    return data.slice(int(offsets[0]), int(offsets[1] - offsets[0])).equals(pa.py_buffer(src))


def token_char_spans(text: str, ids: np.ndarray, table: list[bytes] | pa.LargeBinaryArray, lengths: np.ndarray,
                     doc_key: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Character span ``[start, end)`` of every token of a BOS-prefixed document.

    ``ids`` uint32 ``[BOS, t1, ...]``; returns two int32 arrays of ``len(ids)``: BOS gets
    ``(0, 0)``; a token holding part of a multi-byte character spans that whole character
    (so two neighbours may share it). The tokens' bytes must concatenate to exactly the
    UTF-8 of ``text`` (surrogates passed through); otherwise :class:`AlignmentError` names
    the document — a missing or extra span never produces metadata. ``table``: the bytes
    of every id, :func:`byte_array` (checked with one ``take``) or :func:`byte_table`'s
    list; ``lengths`` their byte lengths.
    """
    body = np.asarray(ids[1:], dtype=np.int64)
    src = text.encode("utf-8", "surrogatepass")
    if body.size and (body.max() >= len(lengths)):
        raise AlignmentError(f"{doc_key}: token id {int(body.max())} outside the byte table")
    widths = lengths[body]
    if int(widths.sum()) != len(src) or (widths.size and int(widths.min()) == 0):
        raise AlignmentError(f"{doc_key}: token byte spans cover {int(widths.sum())} of {len(src)} bytes")
    if not _spelled(table, body, src):
        raise AlignmentError(f"{doc_key}: token bytes do not spell the document text")
    ends = np.cumsum(widths)
    starts = ends - widths
    if text.isascii():
        cs, ce = starts, ends
    else:
        lead = (np.frombuffer(src, np.uint8) & 0xC0) != 0x80
        b2c = np.cumsum(lead, dtype=np.int64) - 1  # byte -> index of the character holding it
        cs, ce = b2c[starts], b2c[ends - 1] + 1
    zero = np.zeros(1, dtype=np.int32)
    return np.concatenate([zero, cs.astype(np.int32)]), np.concatenate([zero, ce.astype(np.int32)])


def align_document(text: str, ids: np.ndarray, spans: tuple[np.ndarray, np.ndarray], char_planes: dict[str, bytes],
                   char_chunks: list[dict], call_edges: list[dict], type_edges: list[dict],
                   doc_key: str = "") -> dict:
    """Token-level enrichment of one document from its stage-6 character-level columns.

    ``spans`` from :func:`token_char_spans`; ``char_planes`` maps the :data:`CHAR_PLANES`
    names to bytes of ``len(text)``; ``char_chunks`` are ``{start, end, kind, name,
    dep_level}`` in characters. Returns ``{plane: uint8 array of len(ids)}`` for the five
    planes of :data:`megacpp_core.pack.PLANES` (BOS gets 0 everywhere), plus
    ``chunk_boundaries`` in token positions (a chunk holds the tokens whose first
    character lies in it; a chunk no token starts in is dropped and its edges with it),
    ``call_edges`` and ``type_edges`` re-indexed to the kept chunks. ``dep_levels`` is the
    token's chunk ``dep_level + 1`` (clamped 255), 0 outside every chunk and on BOS.
    Raises :class:`AlignmentError` naming the document when a plane does not have one
    value per character or a chunk or edge points outside the document.
    """
    n = len(ids)
    cs = spans[0][1:].astype(np.int64)
    ce = spans[1][1:].astype(np.int64)
    out: dict = {}
    if cs.size:
        sample = cs.copy()
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        ws = np.zeros(len(codes), dtype=bool)
        small = codes < 128
        ws[small] = _WS[codes[small]]
        idx = np.where(ws, len(codes), np.arange(len(codes)))
        nxt = np.minimum.accumulate(idx[::-1])[::-1]  # next non-whitespace character at or after
        cand = nxt[cs]
        sample = np.where(cand < ce, cand, cs)
    for col, plane in CHAR_PLANES.items():
        raw = char_planes.get(col)
        if raw is None or len(raw) != len(text):
            raise AlignmentError(f"{doc_key}: {col} has {0 if raw is None else len(raw)} values for {len(text)} characters")
        a = np.zeros(n, dtype=np.uint8)
        if cs.size:
            vals = np.frombuffer(raw, dtype=np.uint8)
            a[1:] = vals[sample if plane in _AST_SAMPLED else cs]
        out[plane] = a
    dep = np.zeros(n, dtype=np.uint8)
    keep: dict[int, int] = {}
    chunks: list[dict] = []
    for j, c in enumerate(char_chunks):
        if not 0 <= c["start"] < c["end"] <= len(text):
            raise AlignmentError(f"{doc_key}: chunk {j} [{c['start']}, {c['end']}) outside {len(text)} characters")
        t0 = int(np.searchsorted(cs, c["start"], side="left"))
        t1 = int(np.searchsorted(cs, c["end"], side="left"))
        if t1 <= t0:
            continue
        keep[j] = len(chunks)
        chunks.append({**c, "start": t0 + 1, "end": t1 + 1})
        dep[t0 + 1:t1 + 1] = min(int(c["dep_level"]), 254) + 1
    out["dep_levels"] = dep
    out["chunk_boundaries"] = chunks
    for name, edges in (("call_edges", call_edges), ("type_edges", type_edges)):
        kept = []
        for e in edges or []:
            if not (0 <= e["from"] < len(char_chunks) and 0 <= e["to"] < len(char_chunks)):
                raise AlignmentError(f"{doc_key}: {name} {e} outside its {len(char_chunks)} chunks")
            if e["from"] in keep and e["to"] in keep:
                kept.append({"from": keep[e["from"]], "to": keep[e["to"]]})
        out[name] = kept
    return out


def _list_array(values: list[np.ndarray], typ: pa.ListType) -> pa.Array:
    """A list array from numpy arrays in one concatenation (no per-element Python objects)."""
    lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    np_type = typ.value_type.to_pandas_dtype()
    flat = np.concatenate(values).astype(np_type, copy=False) if values else np.zeros(0, dtype=np_type)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=typ.value_type))


def token_enriched_columns() -> pa.Schema:
    """The token-aligned enrichment columns :func:`align_enrichment` adds: token character
    spans (int32), the five planes (uint8 per token), ``chunk_boundaries`` in token
    positions; the re-indexed ``call_edges``/``type_edges`` follow them."""
    from . import pack

    return pa.schema([("token_char_start", pa.list_(pa.int32())), ("token_char_end", pa.list_(pa.int32())),
                      *[(p, pack.OPTIONAL_TYPES[p]) for p in pack.PLANES],
                      ("chunk_boundaries", pack.OPTIONAL_TYPES["chunk_boundaries"])])


#: Documents whose character planes :func:`align_enrichment` turns into Python objects at
#: once. Implementation choice: the whole largest xl shard (qemu 7.2, 9.0 M tokens, 64 MiB
#: of text) as one batch peaked at 1,957 MiB, its per-character plane lists most of it.
ALIGN_BATCH_DOCS = 64


def align_enrichment(table: pa.Table, tok, tokenizer_sha256: str) -> tuple[pa.Table, dict]:
    """Replace the chunk stage's character-level columns of tokenized documents by
    token-aligned ones (:func:`align_document`): ``token_char_start/end``, the five planes,
    ``chunk_boundaries`` in token positions and re-indexed edges.

    ``table``: tokenized documents with ``input_ids`` and the ``char_*`` columns. Returns
    ``(table, figures)``; figures: the share of tokens per StructureCategory and the chunks
    dropped for holding no token start. Raises :class:`AlignmentError` naming the document
    on any misalignment (fails closed).
    """
    from . import pack
    from .chunk import StructureCategory

    columns = token_enriched_columns()
    lengths = byte_table(tok, tokenizer_sha256)[1]
    table_bytes = byte_array(tok, tokenizer_sha256)
    ids_col = table.column("input_ids").combine_chunks()
    offsets = ids_col.offsets.to_numpy()
    flat = ids_col.values.to_numpy(zero_copy_only=False)
    new: dict[str, list] = {f.name: [] for f in columns}
    new["call_edges"], new["type_edges"] = [], []
    counts = np.zeros(len(StructureCategory), dtype=np.int64)
    dropped = 0
    wanted = ["doc_key", "text", "char_chunk_boundaries", "call_edges", "type_edges", *CHAR_PLANES]
    for lo in range(0, table.num_rows, ALIGN_BATCH_DOCS):  # Python objects for one batch at a time
        d = table.slice(lo, ALIGN_BATCH_DOCS).select(wanted).to_pydict()
        for j, key in enumerate(d["doc_key"]):
            i = lo + j
            ids = flat[offsets[i]:offsets[i + 1]]
            spans = token_char_spans(d["text"][j], ids, table_bytes, lengths, key)
            al = align_document(d["text"][j], ids, spans, {c: d[c][j] for c in CHAR_PLANES},
                                d["char_chunk_boundaries"][j], d["call_edges"][j], d["type_edges"][j], key)
            new["token_char_start"].append(spans[0])
            new["token_char_end"].append(spans[1])
            for p in pack.PLANES:
                new[p].append(al[p])
            new["chunk_boundaries"].append(al["chunk_boundaries"])
            new["call_edges"].append(al["call_edges"])
            new["type_edges"].append(al["type_edges"])
            dropped += len(d["char_chunk_boundaries"][j]) - len(al["chunk_boundaries"])
            counts += np.bincount(al["structure_ids"][1:], minlength=len(counts))[:len(counts)]
        del d
    table = table.drop_columns(["char_chunk_boundaries", "call_edges", "type_edges", *CHAR_PLANES])
    for f in columns:
        vals = new[f.name]
        if pa.types.is_list(f.type) and not pa.types.is_struct(f.type.value_type):
            arr = _list_array([np.asarray(v) for v in vals], f.type)
        else:
            arr = pa.array(vals, type=f.type)
        table = table.append_column(f, arr)
    for e in pack.EDGE_COLUMNS:
        table = table.append_column(pa.field(e, pack.OPTIONAL_TYPES[e]), pa.array(new[e], type=pack.OPTIONAL_TYPES[e]))
    total = max(1, int(counts.sum()))
    figures = {"structure_token_share": {c.name: round(int(counts[c]) / total, 4) for c in StructureCategory},
               "chunks_without_tokens": int(dropped),
               "token_chunks": int(sum(len(x) for x in new["chunk_boundaries"]))}
    return table, figures
