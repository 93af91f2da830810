"""The documents of the curriculum families (SPEC §5b, :mod:`megacpp_core.families`),
built from the tokenized documents of one shard (phases 1 and 2) or one revision
(phase 3), never by tokenizing a chunk again.

Every family table has the columns the packing and Megatron stages read
(:data:`BASE_SCHEMA`: ``doc_key``, provenance, ``license_class``, ``chunk_index``,
``n_tokens``, ``text``, ``input_ids`` with one BOS first) and, for ``p2_file``, the
enrichment planes and the chunk graph (:data:`megacpp_core.pack.OPTIONAL_TYPES`):

- **phase 1** (:func:`phase1_documents`): each tokenized document that fits the family's
  row (4,096 tokens, BOS included) as it is; a longer one is cut into pieces by token ids,
  at the start of a declaration unit (``chunk_boundaries``) when one falls inside the
  budget, else after the last token ending a line, else at the budget (stepped back to a
  character boundary). A piece is ``[BOS] + ids[a:c]``; its text is the decoded ids, and
  the pieces' texts concatenate to the document's text exactly (checked: fails closed).
  The pieces are then split into ``p1_simple`` and ``p1_docrich`` by their
  documentation-comment share (:func:`megacpp_core.families.split_phase1`).
- **phase 2** (:func:`file_documents`): the documents of one file (its chunks, in
  ``chunk_index`` order, which is source order: the chunks tile the file) joined into one
  document of ``[BOS] + body₁ + body₂ + …`` when that fits 16,384 tokens, so the ids
  decode to the whole file. The enrichment planes are joined the same way and the chunk
  graph is carried: every unit of ``chunk_boundaries`` keeps its ``dep_level`` with its
  span moved to the joined positions, and ``call_edges`` / ``type_edges`` are re-indexed
  to the joined unit list. Units stay in source order, where a C or C++ file declares
  before it uses; reordering them by ``dep_level`` would tear ``#if``/``#endif`` and
  namespace blocks apart, so ``dep_level`` order is what the carried graph gives a reader,
  not a permutation of the text. A file over the budget falls back to its chunks, each a
  document (≤ 8,192 tokens). ``platform_ids`` (per chunk, at most 20) are not carried.
- **phase 3** (:func:`repo_family_table`): the pieces of
  :func:`megacpp_core.repo_documents.revision_documents` with provenance; a file over the
  budget falls back to its ``p2_file`` split (counted by the caller).

Every function is a pure function of its inputs: the same shard gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import pack
from .dedup import LICENSE_RANK

#: Columns every family table has, in this order (types of the stage-8 ``tokenized`` table).
BASE_SCHEMA = pa.schema([
    ("doc_key", pa.string()), ("file_key", pa.string()), ("source", pa.string()), ("revision", pa.string()),
    ("path", pa.string()), ("language", pa.string()), ("license_class", pa.string()), ("chunk_index", pa.int32()),
    ("n_tokens", pa.int32()), ("text", pa.string()), ("input_ids", pa.list_(pa.uint32())),
])
BASE_COLUMNS = BASE_SCHEMA.names
#: Optional columns a ``p2_file`` document carries (SPEC §6 optional planes and structure).
P2_OPTIONAL = (*pack.PLANES, "chunk_boundaries", *pack.EDGE_COLUMNS)
#: Columns of the tokenized table the builders read.
READ_COLUMNS = BASE_COLUMNS + ["n_chunks", *P2_OPTIONAL]
#: Parquet key-value metadata naming the tokenizer the ids were made with (as on ``tokenized``).
TOKENIZER_KEY = b"megacpp.tokenizer_sha256"
#: Rows per row group of the per-revision documents files (``p3_repo``, ``p4_structure``):
#: 64 documents of at most 65,536 tokens are at most 4 Mi tokens, so a reader that wants a
#: few documents (a packing group) decodes a few row groups, not the revision. These are
#: intermediate documents, not packed shards (SPEC §6's 1,024-row row groups are the
#: packed rows').
DOCUMENT_ROW_GROUP = 64
#: Separator between a document's key and a piece number (``lz4-4.4.5/lib/lz4.c#0~001``).
PIECE_SEP = "~"


class FamilyError(ValueError):
    """A family document that breaks its own contract (a piece whose text does not join
    back to its document, a document over the family's budget)."""


def token_flags(table: Sequence[bytes], lengths: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(ends_line, starts_inside_char)``: ``bool[vocab]`` flags of a byte-level
    tokenizer's ids (``table``: bytes per id, and ``lengths`` their int64 byte lengths when
    the caller has them: :func:`megacpp_core.tokenize.byte_table`): the token's bytes end
    with ``\\n``; its first byte is a UTF-8 continuation byte (cutting before it would
    split a character)."""
    if lengths is None:
        from .fim import token_byte_lengths

        lengths = token_byte_lengths(table)
    flat = np.frombuffer(b"".join(table), dtype=np.uint8)
    ends, inside = np.zeros(len(table), dtype=bool), np.zeros(len(table), dtype=bool)
    has = lengths > 0
    if has.any():  # each id's first and last byte, gathered from the joined table at once
        stop = np.cumsum(lengths)[has]
        ends[has] = flat[stop - 1] == 0x0A
        inside[has] = (flat[stop - lengths[has]] & 0xC0) == 0x80
    return ends, inside


#: :func:`tokenizer_flags` of the snapshot tokenizer this process used last, by its sha256.
_FLAGS: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def tokenizer_flags(tok, sha256: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`token_flags` of ``tok``'s byte table (:func:`megacpp_core.tokenize.byte_table`),
    cached per process by the tokenizer's sha256 (every shard of a snapshot asks again)."""
    from .tokenize import byte_table

    if sha256 not in _FLAGS:
        flags = token_flags(*byte_table(tok, sha256))
        _FLAGS.clear()  # one snapshot tokenizer at a time
        _FLAGS[sha256] = flags
    return _FLAGS[sha256]


def cut_positions(ids: np.ndarray, unit_starts: Sequence[int], ends_line: np.ndarray, starts_inside: np.ndarray,
                  budget: int) -> list[int]:
    """Where the pieces of one BOS-prefixed document start (``ids[0]`` is BOS; the first
    piece starts at 1): each piece ``[a, c)`` holds at most ``budget − 1`` tokens, and ``c``
    is the last unit start inside ``(a, a + budget − 1]``, else the last position after a
    line-ending token there, else ``a + budget − 1`` stepped back past tokens that start
    inside a character (module doc). ``[1]`` when the document fits. Raises ``ValueError``
    for ``budget < 2`` and :class:`FamilyError` when a budget's worth of tokens holds no
    character boundary (only possible for a budget under 5: a character is at most 4 bytes)."""
    if budget < 2:
        raise ValueError(f"budget must be >= 2 tokens, got {budget}")
    n = len(ids)
    units = np.unique(np.asarray([s for s in unit_starts if 1 < s < n], dtype=np.int64))
    lines = np.flatnonzero(ends_line[ids[1:n - 1]]) + 2 if n > 2 else np.zeros(0, np.int64)
    cuts, a = [1], 1
    while n - a > budget - 1:
        limit = a + budget - 1
        c = 0
        for cand in (units, lines):
            k = np.searchsorted(cand, limit, side="right") - 1
            if k >= 0 and cand[k] > a:
                c = int(cand[k])
                break
        if not c:
            c = limit
            while c > a + 1 and starts_inside[ids[c]]:
                c -= 1
            if starts_inside[ids[c]]:
                raise FamilyError(f"no character boundary within {budget - 1} tokens after position {a}")
        cuts.append(c)
        a = c
    return cuts


def _pieces_of(row: dict, ids: np.ndarray, cuts: list[int], decode: Callable[[np.ndarray], str], bos_id: int) -> list[dict]:
    ends = cuts[1:] + [len(ids)]
    out = []
    for k, (a, c) in enumerate(zip(cuts, ends)):
        body = ids[a:c]
        piece = {col: row[col] for col in BASE_COLUMNS}
        piece["doc_key"] = f"{row['doc_key']}{PIECE_SEP}{k:03d}"
        piece["n_tokens"] = len(body) + 1
        piece["text"] = decode(body)
        piece["input_ids"] = np.concatenate(([bos_id], body)).astype(np.uint32)
        out.append(piece)
    if "".join(p["text"] for p in out) != row["text"]:
        raise FamilyError(f"{row['doc_key']}: its {len(out)} pieces do not join back to its text")
    return out


def phase1_documents(docs: pa.Table, budget: int, decode: Callable[[np.ndarray], str], ends_line: np.ndarray,
                     starts_inside: np.ndarray, bos_id: int) -> tuple[pa.Table, dict]:
    """The phase-1 documents of one shard's tokenized ``docs`` (:data:`BASE_COLUMNS` and
    ``chunk_boundaries``), in row order: rows within ``budget`` unchanged, longer ones cut
    (module doc; :func:`cut_positions`, ``decode(ids) -> str`` the tokenizer's exact
    decode). Returns ``(table of BASE_SCHEMA, figures)`` with ``split_documents`` (rows
    cut) and ``pieces`` (rows they became). Raises :class:`FamilyError` when a piece's
    text does not join back."""
    n_tok = docs.column("n_tokens").to_numpy()
    long = np.flatnonzero(n_tok > budget)
    base = docs.select(BASE_COLUMNS).cast(BASE_SCHEMA)
    if not len(long):
        return base, {"split_documents": 0, "pieces": 0}
    ids_col = docs.column("input_ids").combine_chunks()
    bounds = docs.column("chunk_boundaries").combine_chunks() if "chunk_boundaries" in docs.column_names else None
    rows, pieces = [], 0
    for i in range(docs.num_rows):
        if n_tok[i] <= budget:
            rows.append(("row", i))
            continue
        ids = ids_col[i].values.to_numpy(zero_copy_only=False)
        starts = [u["start"] for u in bounds[i].as_py()] if bounds is not None else []
        row = base.slice(i, 1).to_pylist()[0]
        made = _pieces_of(row, ids, cut_positions(ids, starts, ends_line, starts_inside, budget), decode, bos_id)
        pieces += len(made)
        rows.append(("pieces", made))
    parts, run = [], []
    for kind, v in rows:  # consecutive unchanged rows are taken as one slice
        if kind == "row":
            run.append(v)
            continue
        if run:
            parts.append(base.take(pa.array(run, pa.int64())))
            run = []
        parts.append(pa.Table.from_pylist(v, schema=BASE_SCHEMA))
    if run:
        parts.append(base.take(pa.array(run, pa.int64())))
    return pa.concat_tables(parts).combine_chunks(), {"split_documents": int(len(long)), "pieces": pieces}


def _join_file(rows: list[dict], bos_id: int, optional: Sequence[str]) -> dict:
    """One ``p2_file`` document from a file's chunk rows (``chunk_index`` order)."""
    out = {c: rows[0][c] for c in BASE_COLUMNS}
    out["doc_key"] = f"{rows[0]['file_key']}#file"
    out["chunk_index"] = 0
    out["text"] = "".join(r["text"] for r in rows)
    bodies = [np.asarray(r["input_ids"][1:], dtype=np.uint32) for r in rows]
    out["input_ids"] = np.concatenate([np.asarray([bos_id], np.uint32), *bodies])
    out["n_tokens"] = len(out["input_ids"])
    for p in (c for c in optional if c in pack.PLANES):
        out[p] = np.concatenate([np.asarray(rows[0][p][:1], np.uint8)] + [np.asarray(r[p][1:], np.uint8) for r in rows])
    if "chunk_boundaries" in optional:
        units, edges, shift, first = [], {e: [] for e in pack.EDGE_COLUMNS if e in optional}, 0, 0
        for r, body in zip(rows, bodies):
            for u in r["chunk_boundaries"] or []:
                units.append({**u, "start": u["start"] + shift, "end": u["end"] + shift})
            for e in edges:
                edges[e] += [{"from": x["from"] + first, "to": x["to"] + first} for x in r[e] or []]
            shift += len(body)
            first += len(r["chunk_boundaries"] or [])
        out["chunk_boundaries"] = units
        out.update(edges)
    return out


def file_documents(docs: pa.Table, budget: int, bos_id: int) -> tuple[pa.Table, dict]:
    """The ``p2_file`` documents of one shard's tokenized ``docs`` (:data:`READ_COLUMNS`
    that are present, every chunk of each of its files), in row order of each file's first
    chunk (module doc). Returns ``(table, figures)``: :data:`BASE_SCHEMA` plus the
    :data:`P2_OPTIONAL` columns ``docs`` has; figures ``whole_files`` (files joined) and
    ``fallback_files`` (files over ``budget``, kept as their chunks). Raises
    :class:`FamilyError` when a file's chunks are not all in ``docs``."""
    optional = [c for c in P2_OPTIONAL if c in docs.column_names]
    schema = pa.schema(list(BASE_SCHEMA) + [pa.field(c, pack.OPTIONAL_TYPES[c]) for c in optional])
    t = docs.select(BASE_COLUMNS + optional + ["n_chunks"])
    files = t.column("file_key").to_pylist()
    n_tok = t.column("n_tokens").to_numpy().astype(np.int64)
    n_chunks = t.column("n_chunks").to_numpy()
    chunk = t.column("chunk_index").to_numpy()
    members: dict[str, list[int]] = {}
    for i, f in enumerate(files):
        members.setdefault(f, []).append(i)
    # rows as they are (a one-chunk file, a file over budget) are taken by index; a
    # joined file is built in Python and put in its place: ``slots`` holds, per output
    # row, its index in the taken rows or -1 - its index in the joined ones
    taken, joined, slots, whole, fallback = [], [], [], 0, 0
    for f, idx in members.items():
        idx = sorted(idx, key=lambda i: chunk[i])
        if [int(chunk[i]) for i in idx] != list(range(int(n_chunks[idx[0]]))):
            raise FamilyError(f"{f}: chunks {[int(chunk[i]) for i in idx]} of {int(n_chunks[idx[0]])} in this shard")
        if len(idx) > 1 and 1 + int((n_tok[idx] - 1).sum()) <= budget:
            slots.append(-1 - len(joined))
            joined.append(_join_file(t.take(pa.array(idx, pa.int64())).to_pylist(), bos_id, optional))
            whole += 1
            continue
        if 1 + int((n_tok[idx] - 1).sum()) > budget:
            fallback += 1
        slots += range(len(taken), len(taken) + len(idx))
        taken += idx
    rows = t.select(schema.names).take(pa.array(taken, pa.int64())).cast(schema)
    if joined:
        at = np.asarray(slots, np.int64)
        rows = pa.concat_tables([rows, pa.Table.from_pylist(joined, schema=schema)]).take(
            pa.array(np.where(at >= 0, at, len(taken) - 1 - at)))
    table = rows.combine_chunks() if slots else schema.empty_table()
    return table, {"whole_files": whole + sum(len(v) == 1 for v in members.values()), "fallback_files": fallback}


def worst_license(classes: Sequence[str]) -> str:
    """The least permissive of ``classes`` by :data:`megacpp_core.dedup.LICENSE_RANK` (a
    repository piece is as free as its most restricted file); ``KeyError`` for an unknown
    class."""
    return max(classes, key=LICENSE_RANK.__getitem__)


def repo_family_table(pieces: pa.Table, files: pa.Table | Mapping[str, str], revision: str) -> pa.Table:
    """The ``p3_repo`` rows of :func:`megacpp_core.repo_documents.revision_documents`'
    ``pieces`` (:data:`megacpp_core.repo_documents.DOCUMENTS_SCHEMA`) with provenance from
    ``files`` (a table with ``path`` and ``license_class`` of the revision's files, or
    ``{path: license_class}``):
    :data:`BASE_SCHEMA` plus ``paths``, ``offsets`` and ``n_files``. ``file_key`` and
    ``doc_key`` are the piece key, ``path`` its first file, ``chunk_index`` the piece
    number, ``language`` ``"repository"``, ``license_class`` the least permissive of its
    files (:func:`worst_license`)."""
    cls = (dict(zip(files.column("path").to_pylist(), files.column("license_class").to_pylist()))
           if isinstance(files, pa.Table) else files)
    paths = pieces.column("paths").to_pylist()
    n = pieces.num_rows
    cols = {
        "doc_key": pieces.column("doc_key"), "file_key": pieces.column("doc_key"), "source": pieces.column("source"),
        "revision": pa.array([revision] * n, pa.string()), "path": pa.array([p[0] for p in paths], pa.string()),
        "language": pa.array(["repository"] * n, pa.string()),
        "license_class": pa.array([worst_license([cls[q] for q in p]) for p in paths], pa.string()),
        "chunk_index": pc.cast(pieces.column("piece_index"), pa.int32()),
        "n_tokens": pc.cast(pieces.column("n_tokens"), pa.int32()),
        "text": pc.cast(pieces.column("text"), pa.string()), "input_ids": pieces.column("input_ids"),
        "paths": pieces.column("paths"), "offsets": pieces.column("offsets"), "n_files": pieces.column("n_files"),
    }
    return pa.table(cols, schema=pa.schema(list(BASE_SCHEMA) + [pieces.schema.field(c) for c in ("paths", "offsets",
                                                                                                  "n_files")]))
