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
import pyarrow.compute as pc

WHITELIST = frozenset({"FUNC_BODY", "CLASS_DECL", "TYPEDEF", "NAMESPACE"})
NEVER_DROPPED = frozenset({"OTHER", "PREAMBLE", "FUNC_SIGNATURE", "CLASS_MEMBER", "COMMENT"})
_WS = re.compile(r"\s+")


def normalized_hash(text: str) -> str:
    """SHA-256 hex of ``text`` with whitespace runs collapsed to one space and stripped."""
    return hashlib.sha256(_WS.sub(" ", text).strip().encode("utf-8")).hexdigest()


DROPS_SCHEMA = pa.schema([("doc_key", pa.string()), ("kind", pa.string()), ("kept_twin", pa.string())])


def chunk_hashes(documents: pa.Table) -> pa.Table:
    """``documents`` (``doc_key``, ``kind``, ``text`` and any other columns, which are
    carried) reduced to its whitelisted rows, with ``text`` replaced by ``hash``: ``KIND:``
    plus :func:`normalized_hash` of the text. The summary the snapshot-wide decision reads
    (about 100 bytes per chunk instead of its text)."""
    wl = documents.filter(pc.is_in(documents.column("kind"), value_set=pa.array(sorted(WHITELIST), pa.string())))
    hashes = [k + ":" + normalized_hash(t) for k, t in zip(wl.column("kind").to_pylist(), wl.column("text").to_pylist())]
    return wl.drop_columns(["text"]).append_column("hash", pa.array(hashes, pa.string()))


def drops_from_hashes(hashes: pa.Table) -> tuple[pa.Table, dict[str, int]]:
    """The drops of a :func:`chunk_hashes` table in keep order: within each ``hash`` (kind
    and normalized text), every chunk after the first is dropped and names the first as
    its ``kept_twin``. A polars group-by; returns ``(drops, {kind: dropped})`` with drops
    in input order (:data:`DROPS_SCHEMA`)."""
    import polars as pl

    if hashes.num_rows == 0:
        return DROPS_SCHEMA.empty_table(), {}
    df = pl.from_arrow(hashes.select(["doc_key", "kind", "hash"])).with_row_index("i")
    twins = df.group_by("hash").agg(pl.col("doc_key").sort_by("i").first().alias("kept_twin"))
    drops = (df.join(twins, on="hash").filter(pl.col("doc_key") != pl.col("kept_twin"))
             .sort("i").select(["doc_key", "kind", "kept_twin"]))
    by_kind = {k: int(n) for k, n in drops.group_by("kind").len().sort("kind").iter_rows()}
    return drops.to_arrow().cast(DROPS_SCHEMA), by_kind


def dedup_chunks(documents: pa.Table) -> tuple[pa.Table, pa.Table, dict]:
    """Drop duplicate whitelisted chunks from a documents table (one table in memory: for
    small inputs and tests; the stage streams :func:`chunk_hashes` shard by shard).

    ``documents`` needs ``doc_key``, ``kind`` and ``text`` columns, in keep order; other
    columns are carried through. Drops never include a kind outside :data:`WHITELIST`.
    Returns ``(kept_documents, drops, figures)``; ``drops`` has ``doc_key, kind,
    kept_twin``; figures count ``chunks_in``, ``chunks_out``, ``dropped`` per kind.
    """
    drops, by_kind = drops_from_hashes(chunk_hashes(documents.select(["doc_key", "kind", "text"])))
    kept = documents.filter(pc.invert(pc.is_in(documents.column("doc_key"), value_set=drops.column("doc_key"))))
    figures = {"chunks_in": documents.num_rows, "chunks_out": kept.num_rows, "dropped": by_kind}
    return kept, drops, figures
