"""Stage 7 — chunk-level dedup (SPEC §4 "Dedup").

Only self-contained semantic units may be dropped: documents whose chunk ``kind`` is one
of :data:`WHITELIST` (FUNC_BODY, CLASS_DECL, TYPEDEF, NAMESPACE). OTHER, PREAMBLE,
FUNC_SIGNATURE, CLASS_MEMBER and COMMENT documents are never dropped, whatever their
content: deduping an ``#include`` block or a forward declaration in isolation breaks the
code around it. Two whitelisted documents are duplicates when they have the same kind and
their text is identical after collapsing whitespace runs (SHA-256 of the normalized
text); the first in input order (the snapshot keep order) is kept and every drop names
its kept twin, a kept chunk of the same kind. Any other ``kind`` value (unknown, misspelt,
lower-case or null) is treated as never-droppable.
"""

from __future__ import annotations

import hashlib
import re

import pyarrow as pa

WHITELIST = frozenset({"FUNC_BODY", "CLASS_DECL", "TYPEDEF", "NAMESPACE"})
NEVER_DROPPED = frozenset({"OTHER", "PREAMBLE", "FUNC_SIGNATURE", "CLASS_MEMBER", "COMMENT"})
_WS = re.compile(r"\s+")


def normalized_hash(text: str) -> str:
    """SHA-256 hex of ``text`` with whitespace runs collapsed to one space and stripped."""
    return hashlib.sha256(_WS.sub(" ", text).strip().encode("utf-8")).hexdigest()


def dedup_chunks(documents: pa.Table) -> tuple[pa.Table, pa.Table, dict]:
    """Drop duplicate whitelisted chunks from a documents table.

    ``documents`` needs ``doc_key``, ``kind`` and ``text`` columns, in keep order; other
    columns are carried through. Drops never include a kind outside :data:`WHITELIST`.
    Returns ``(kept_documents, drops, figures)``; ``drops`` has ``doc_key, kind,
    kept_twin``; figures count ``chunks_in``, ``chunks_out``, ``dropped`` per kind.
    """
    keys = documents.column("doc_key").to_pylist()
    kinds = documents.column("kind").to_pylist()
    texts = documents.column("text").to_pylist()
    first: dict[str, str] = {}
    keep_mask = []
    drops = {"doc_key": [], "kind": [], "kept_twin": []}
    dropped_by_kind: dict[str, int] = {}
    for key, kind, text in zip(keys, kinds, texts):
        if kind not in WHITELIST:
            keep_mask.append(True)
            continue
        h = kind + ":" + normalized_hash(text)
        twin = first.setdefault(h, key)
        if twin == key:
            keep_mask.append(True)
        else:
            keep_mask.append(False)
            drops["doc_key"].append(key)
            drops["kind"].append(kind)
            drops["kept_twin"].append(twin)
            dropped_by_kind[kind] = dropped_by_kind.get(kind, 0) + 1
    kept = documents.filter(pa.array(keep_mask, type=pa.bool_()))
    figures = {"chunks_in": len(keys), "chunks_out": kept.num_rows, "dropped": dict(sorted(dropped_by_kind.items()))}
    return kept, pa.table(drops, schema=pa.schema([("doc_key", pa.string()), ("kind", pa.string()), ("kept_twin", pa.string())])), figures
