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


def tokenize_documents(documents: pa.Table, tok, vocab_size: int, batch: int = 4096) -> tuple[pa.Table, dict]:
    """Tokenize every document; return ``(table, figures)``.

    ``table`` = ``documents`` plus ``input_ids`` (list<uint32>) and ``n_tokens`` (int32).
    Raises :class:`TokenizeError` naming the first document whose ids reach the vocab
    size or whose decode differs from its text, ``ValueError`` if ``tok`` would match
    special tokens in text (load it with ``tokenizer.load_tokenizer``). Encoding and the
    round-trip decode run ``batch`` documents at a time in ``tokenizers``' thread pool.
    """
    tk._require_literal_specials(tok)
    keys = documents.column("doc_key").to_pylist()
    texts = documents.column("text").to_pylist()
    out: list[np.ndarray] = []
    for start in range(0, len(texts), batch):
        chunk = texts[start:start + batch]
        encodings = tok.encode_batch(chunk, add_special_tokens=False)
        decoded = tok.decode_batch([e.ids for e in encodings], skip_special_tokens=False)
        for j, (enc, back) in enumerate(zip(encodings, decoded)):
            key = keys[start + j]
            ids = np.asarray(enc.ids, dtype=np.uint32)
            if ids.size and int(ids.max()) >= vocab_size:
                raise TokenizeError(f"{key}: token id {int(ids.max())} ≥ vocab size {vocab_size}")
            if back != chunk[j]:
                raise TokenizeError(f"{key}: decode(encode(text)) != text")
            out.append(np.concatenate([np.array([tk.BOS_ID], dtype=np.uint32), ids]))
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
