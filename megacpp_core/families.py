"""The curriculum's dataset families (SPEC §5b, seed 002): their registry and the phase-1
split.

Four phases, five families, each with its own row length (the packing budget, BOS
included) and its own kind of document:

- ``p1_simple`` (phase 1, 4,096): declaration-level chunks whose doc-comment share is
  below :data:`DOCRICH_MIN_SHARE`;
- ``p1_docrich`` (phase 1, 4,096): declaration-level chunks at or above it;
- ``p2_file`` (phase 2, 16,384): whole files, chunks in ``dep_level`` order, chunk graph;
- ``p3_repo`` (phase 3, 65,536): a revision's files in include order, cut only at file
  boundaries (:mod:`megacpp_core.repo_documents`);
- ``p4_structure`` (phase 4, 65,536): the ``p3`` documents with every enrichment plane.

The two phase-1 families split the same chunks, so a blend can weigh them against each
other without counting a chunk twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .fim import DOC_COMMENT_RE


@dataclass(frozen=True)
class Family:
    """One dataset family: ``name`` (asset and Megatron prefix stem), curriculum ``phase``
    (1–4), ``row_length`` in tokens (BOS included), what its documents are, and whether
    the snapshot's FIM settings apply (``fim``: not to repository documents, whose order
    across files is what they teach; a FIM middle span would cut across file separators)."""

    name: str
    phase: int
    row_length: int
    documents: str
    fim: bool = True


FAMILIES: tuple[Family, ...] = (
    Family("p1_simple", 1, 4_096, "declaration-level chunks below the doc-comment share threshold"),
    Family("p1_docrich", 1, 4_096, "declaration-level chunks at or above the doc-comment share threshold"),
    Family("p2_file", 2, 16_384, "whole files in source order, the chunk graph (each unit with its dep_level) carried"),
    Family("p3_repo", 3, 65_536, "a revision's files in include-dependency order, cut only at file boundaries", fim=False),
    Family("p4_structure", 4, 65_536, "the p3 documents with every enrichment plane and the chunk graph", fim=False),
)
BY_NAME = {f.name: f for f in FAMILIES}

#: A chunk is ``p1_docrich`` when at least this share of its UTF-8 bytes lies in
#: documentation comments (Doxygen ``/** */``, ``/*! */``, ``///``, ``//!``: the comments
#: the FIM doc-comment policy masks, :data:`megacpp_core.fim.DOC_COMMENT_RE`). Seed 002
#: gives no number; at 0.10, 76 of the ``default`` snapshot's 824 chunks (9.2 %, 283 k of
#: its 1.83 M tokens) are doc-rich; 28 % hold some doc comment, half hold none.
DOCRICH_MIN_SHARE = 0.10


def doc_comment_share(texts: pa.Array | pa.ChunkedArray | list[str]) -> np.ndarray:
    """``float64[n]``: for each text, the share of its UTF-8 bytes inside documentation
    comments (:data:`DOCRICH_MIN_SHARE`); 0.0 for an empty text. Lone surrogates are
    encoded as they stand (``surrogatepass``)."""
    values = texts.to_pylist() if isinstance(texts, (pa.Array, pa.ChunkedArray)) else texts
    out = np.zeros(len(values), dtype=np.float64)
    for i, t in enumerate(values):
        b = (t or "").encode("utf-8", "surrogatepass")
        if b:
            out[i] = sum(m.end() - m.start() for m in DOC_COMMENT_RE.finditer(b)) / len(b)
    return out


def split_phase1(chunks: pa.Table, min_share: float = DOCRICH_MIN_SHARE) -> dict[str, pa.Table]:
    """``{"p1_simple": …, "p1_docrich": …}``: the rows of ``chunks`` (a ``text`` column
    required) split by :func:`doc_comment_share` ≥ ``min_share``, each in the input's row
    order, every row in exactly one. Raises ``KeyError`` without a ``text`` column and
    ``ValueError`` for a ``min_share`` outside (0, 1]."""
    if not 0 < min_share <= 1:
        raise ValueError(f"min_share must be in (0, 1], got {min_share}")
    rich = doc_comment_share(chunks.column("text")) >= min_share
    return {"p1_simple": chunks.filter(pa.array(~rich)), "p1_docrich": chunks.filter(pa.array(rich))}
