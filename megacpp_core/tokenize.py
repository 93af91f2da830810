"""Stage 8 — tokenize documents to uint32 ids with one BOS per document (SPEC §4, §6).

Input: the documents table of stage 6/7 (``doc_key``, ``text`` …). Output: the same rows
with ``input_ids`` list<uint32> = ``[BOS] + encode(text)`` and ``n_tokens`` (including
BOS). Gate: BOS first, every id < vocab size, and ``decode(ids[1:]) == text`` exactly for
every document (a failed round trip fails the stage naming the document).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from . import tokenizer as tk


class TokenizeError(ValueError):
    """A document failed the tokenize gate (vocab range or round trip)."""


def tokenize_documents(documents: pa.Table, tok, vocab_size: int, batch: int = 256) -> tuple[pa.Table, dict]:
    """Tokenize every document; return ``(table, figures)``.

    ``table`` = ``documents`` plus ``input_ids`` (list<uint32>) and ``n_tokens`` (int32).
    Raises :class:`TokenizeError` naming the first document whose ids reach the vocab
    size or whose decode differs from its text.
    """
    keys = documents.column("doc_key").to_pylist()
    texts = documents.column("text").to_pylist()
    out: list[np.ndarray] = []
    for start in range(0, len(texts), batch):
        chunk = texts[start:start + batch]
        for j, ids in enumerate(tk.encode_batch(tok, chunk)):
            key = keys[start + j]
            if ids.size and int(ids.max()) >= vocab_size:
                raise TokenizeError(f"{key}: token id {int(ids.max())} ≥ vocab size {vocab_size}")
            if tk.decode(tok, ids) != chunk[j]:
                raise TokenizeError(f"{key}: decode(encode(text)) != text")
            out.append(np.concatenate([np.array([tk.BOS_ID], dtype=np.uint32), ids.astype(np.uint32)]))
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
