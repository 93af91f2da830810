"""Fill-in-the-middle (FIM) for packed rows (SPEC §6; Bavarian et al. 2022, "Efficient
Training of Language Models to Fill in the Middle", arXiv:2207.14255).

A document ``[BOS] + body`` (``n`` body tokens) is cut at two token positions
``0 ≤ a ≤ b ≤ n`` into prefix ``body[:a]``, middle ``body[a:b]`` and suffix ``body[b:]``
and rearranged with the special markers of :data:`megacpp_core.tokenizer.SPECIAL_TOKENS`:

- PSM: ``BOS <FIM_PREFIX> prefix <FIM_SUFFIX> suffix <FIM_MIDDLE> middle``
- SPM: ``BOS <FIM_PREFIX> <FIM_SUFFIX> suffix <FIM_MIDDLE> prefix middle`` (the SPM
  variant of the paper's §B / bigcode's Megatron ``permute``, which keeps prefix and
  middle contiguous)

The transform is a permutation ``src`` (new position → old position, -1 for the three
markers) applied to the ids and to every token-aligned column; chunk spans are remapped
through it (a span cut by ``a`` or ``b`` becomes one span per piece, edges follow the
first piece). Which documents get FIM (``rate``, default 0.5 as in the paper's best
setting), PSM vs SPM (``spm_share``, default 0.5, the paper's joint PSM+SPM training) and
the cut points are drawn from a generator seeded by ``sha256(seed, doc_key)``: the
result depends on the document and the seed only, never on order or process.

Documentation-comment loss policy (``doc_comment_policy``): ``"mask"`` (default) clears
the loss on the tokens of the doc comment (``/** */``, ``/*! */``, ``///``, ``//!``) that
describes the middle span — the one that ends right before it (only whitespace between)
or opens it — so the model is not trained to write the answer's documentation from the
answer; ``"keep"`` leaves the loss alone.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import dataclass, field

import numpy as np

from . import pack, snapshot_tokenizer
from . import tokenizer as tk

FIM_PREFIX_ID = tk.SPECIAL_TOKENS.index("<FIM_PREFIX>")
FIM_MIDDLE_ID = tk.SPECIAL_TOKENS.index("<FIM_MIDDLE>")
FIM_SUFFIX_ID = tk.SPECIAL_TOKENS.index("<FIM_SUFFIX>")
MARKERS = 3
POLICIES = ("mask", "keep")
#: Doxygen/Javadoc documentation comments: ``/** … */``, ``/*! … */``, runs of ``///`` or ``//!`` lines.
DOC_COMMENT_RE = re.compile(rb"/\*[*!](?!/).*?\*/|(?://[/!][^\n]*(?:\n[ \t]*//[/!][^\n]*)*)", re.S)


@dataclass(frozen=True)
class FimConfig:
    """FIM settings: ``rate`` ∈ [0, 1] share of documents transformed, ``spm_share`` ∈ [0, 1]
    share of those in SPM order, ``seed`` int, ``doc_comment_policy`` in :data:`POLICIES`."""

    rate: float = 0.5
    spm_share: float = 0.5
    seed: int = 0
    doc_comment_policy: str = "mask"

    def __post_init__(self) -> None:
        if not (0.0 <= self.rate <= 1.0 and 0.0 <= self.spm_share <= 1.0):
            raise ValueError(f"FIM rate {self.rate} and SPM share {self.spm_share} must lie in [0, 1]")
        if self.doc_comment_policy not in POLICIES:
            raise ValueError(f"doc_comment_policy {self.doc_comment_policy!r} not in {POLICIES}")


@dataclass
class FimResult:
    """One document after FIM: ``mode`` in {"none", "psm", "spm"}, ``cuts`` (a, b) in body
    tokens, ``src`` int64 new→old position map (-1 = marker), ``doc`` the new
    :class:`~megacpp_core.pack.PackInput`, ``masked`` tokens cleared by the policy."""

    mode: str
    cuts: tuple[int, int]
    src: np.ndarray
    doc: pack.PackInput
    masked: int = 0
    reason: str = ""
    extra: dict = field(default_factory=dict)


def decide(doc_key: str, n_body: int, cfg: FimConfig) -> tuple[str, int, int]:
    """(mode, a, b) for a document with ``n_body`` tokens after BOS; deterministic in
    (``cfg.seed``, ``doc_key``). ``mode == "none"`` when the document is not drawn."""
    digest = hashlib.sha256(f"{cfg.seed}\x00{doc_key}".encode()).digest()
    # four independent 64-bit words of the digest: two uniforms in [0, 1), two cut points
    # (modulo bias below n_body / 2**64 — nil for any document length)
    w = [int.from_bytes(digest[i:i + 8], "little") for i in range(0, 32, 8)]
    draw, side = w[0] / 2.0**64, w[1] / 2.0**64
    a, b = sorted((w[2] % (n_body + 1), w[3] % (n_body + 1)))
    if draw >= cfg.rate:
        return "none", 0, 0
    return ("spm" if side < cfg.spm_share else "psm"), a, b


def permutation(n_tokens: int, mode: str, a: int, b: int) -> np.ndarray:
    """New→old position map (int64, length ``n_tokens + 3``; -1 = marker) for a document of
    ``n_tokens`` tokens including its BOS at 0 and body cuts ``a ≤ b``."""
    body = np.arange(1, n_tokens, dtype=np.int64)
    pre, mid, suf = body[:a], body[a:b], body[b:]
    m = np.array([-1], dtype=np.int64)
    if mode == "psm":
        parts = [np.zeros(1, np.int64), m, pre, m, suf, m, mid]
    elif mode == "spm":
        parts = [np.zeros(1, np.int64), m, m, suf, m, pre, mid]
    else:
        raise ValueError(f"mode {mode!r} not in ('psm', 'spm')")
    return np.concatenate(parts)


def marker_ids(mode: str) -> list[int]:
    """Marker ids in the order they appear in the permuted document."""
    if mode == "psm":
        return [FIM_PREFIX_ID, FIM_SUFFIX_ID, FIM_MIDDLE_ID]
    return [FIM_PREFIX_ID, FIM_SUFFIX_ID, FIM_MIDDLE_ID]


def remap_chunks(chunks: list[dict], src: np.ndarray, edges: dict[str, list[dict]]) -> tuple[list[dict], dict[str, list[dict]]]:
    """Remap chunk spans (old token positions, end exclusive) through ``src``.

    Each span becomes one span per maximal run of consecutive new positions whose old
    positions are consecutive and inside the span; pieces are sorted by new start. Edges
    (chunk indices) are rewritten to the first piece of each chunk. Returns
    ``(chunks, edges)``. ``src`` is a few contiguous runs (BOS, prefix, suffix, middle), so
    each span is cut arithmetically at the runs' old starts — O(chunks · runs).
    """
    keep = np.flatnonzero(src >= 0)
    old = src[keep]
    # runs of consecutive old positions at consecutive new positions
    brk = np.flatnonzero((np.diff(old) != 1) | (np.diff(keep) != 1)) + 1
    run_new = keep[np.concatenate([[0], brk])] if keep.size else keep
    run_old = old[np.concatenate([[0], brk])] if keep.size else old
    run_len = np.diff(np.concatenate([np.concatenate([[0], brk]), [len(old)]])) if keep.size else old
    order = np.argsort(run_old, kind="stable")
    o_start, o_new, o_len = run_old[order].tolist(), run_new[order].tolist(), run_len[order].tolist()
    pieces: list[tuple[int, int, dict]] = []
    for j, c in enumerate(chunks):
        s, e = c["start"], c["end"]
        r = bisect.bisect_right(o_start, s) - 1
        while s < e and 0 <= r < len(o_start):
            rs, rn, rl = o_start[r], o_new[r], o_len[r]
            hi = min(e, rs + rl)
            if s < rs or s >= rs + rl:
                raise ValueError(f"chunk {j} [{c['start']}, {c['end']}) is not covered by the permutation")
            ns = rn + (s - rs)
            pieces.append((ns, j, {**c, "start": ns, "end": ns + (hi - s)}))
            s = hi
            r += 1
    pieces.sort(key=lambda x: (x[0], x[1]))
    first: dict[int, int] = {}
    for k, (_, j, _) in enumerate(pieces):
        first.setdefault(j, k)
    new_edges = {e: [{"from": first[x["from"]], "to": first[x["to"]]} for x in v] for e, v in edges.items()}
    return [p[2] for p in pieces], new_edges


def _byte_level_table() -> np.ndarray:
    """uint16 ``code point -> byte`` of the GPT-2 byte→unicode table used by the ByteLevel
    pre-tokenizer, inverted (index: code point, 0-323; ``_NO_BYTE`` where no byte maps)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, k = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    inv = np.full(max(cs) + 1, _NO_BYTE, dtype=np.uint16)
    inv[cs] = bs
    return inv


_NO_BYTE = 0xFFFF
_BYTE_OF = _byte_level_table()


def token_byte_table(tok, sha256: str | None = None) -> list[bytes]:
    """Bytes of every id of a byte-level BPE ``tokenizers.Tokenizer`` (index = id);
    ``sha256``: its ``tokenizer.json``'s, when known (its added tokens are then converted
    once per process, :func:`megacpp_core.snapshot_tokenizer.added_tokens`).

    Added tokens map to their content's UTF-8, model tokens through the inverse of the
    GPT-2 byte→unicode table used by the ByteLevel pre-tokenizer (a token with a character
    outside that table maps to its UTF-8), ids without a token to ``b""``. The model
    vocabulary is read in one call; its tokens (added ones aside) are mapped at once, as
    one array of code points through the inverse table (every character maps to one
    byte), and cut at their lengths.
    """
    n = tok.get_vocab_size(with_added_tokens=True)
    strings = [""] * n
    for s, i in tok.get_vocab(with_added_tokens=False).items():
        if 0 <= i < n:
            strings[i] = s
    added = {i: a.content for i, a in snapshot_tokenizer.added_tokens(tok, sha256).items() if 0 <= i < n}
    for i in added:
        strings[i] = ""  # their content's UTF-8, below
    cps = np.frombuffer("".join(strings).encode("utf-32-le"), dtype=np.uint32)
    mapped = _BYTE_OF[np.minimum(cps, len(_BYTE_OF) - 1)]
    mapped[cps >= len(_BYTE_OF)] = _NO_BYTE
    flat = mapped.astype(np.uint8).tobytes()  # a character outside the table gives 0xFF: not used
    out, o = [], 0
    for x in strings:
        e = o + len(x)
        out.append(flat[o:e])
        o = e
    bad = np.flatnonzero(mapped == _NO_BYTE)
    if bad.size:  # the tokens holding a character outside the table: their UTF-8
        bounds = np.cumsum([0] + [len(x) for x in strings])
        for i in np.unique(np.searchsorted(bounds, bad, side="right") - 1).tolist():
            out[i] = strings[i].encode("utf-8")
    for i, c in added.items():
        out[i] = c.encode("utf-8")
    return out


def token_byte_lengths(table: list[bytes]) -> np.ndarray:
    """int64 byte length of every id of a :func:`token_byte_table`."""
    return np.fromiter((len(b) for b in table), dtype=np.int64, count=len(table))


def doc_comment_token_spans(ids: np.ndarray, table: list[bytes], lengths: np.ndarray | None = None,
                            text_bytes: bytes | None = None) -> tuple[bytes, np.ndarray, list[tuple[int, int]]]:
    """(text bytes of ``ids[1:]``, byte offset of every token (len(ids)+1, BOS has width
    0), doc comments as byte spans) for one BOS-prefixed document. ``lengths`` (int64 byte
    length per id) avoids a per-token length lookup; ``text_bytes``, the document's UTF-8
    when the caller has it (stage 8 proved it equals the tokens' bytes), avoids joining
    the tokens' bytes; it is used only when its length matches."""
    ids = np.asarray(ids, dtype=np.int64)
    if lengths is None:
        lengths = token_byte_lengths(table)
    widths = lengths[ids]
    if widths.size:
        widths[0] = 0
    offsets = np.concatenate([[0], np.cumsum(widths)])
    if text_bytes is not None and len(text_bytes) == int(offsets[-1]):
        text = text_bytes
    else:
        text = b"".join([table[t] for t in ids[1:].tolist()])
    return text, offsets, [(m.start(), m.end()) for m in DOC_COMMENT_RE.finditer(text)]


def describing_comment(text: bytes, comments: list[tuple[int, int]], mid_start: int, mid_end: int) -> tuple[int, int] | None:
    """The doc comment (byte span) that describes the middle ``[mid_start, mid_end)``: the
    last one ending at or before ``mid_start`` with only whitespace between, or the first
    one starting inside the middle with only whitespace before it; None otherwise."""
    if mid_end <= mid_start:
        return None
    for cs, ce in comments:
        if mid_start <= cs < mid_end and not text[mid_start:cs].strip():
            return cs, ce
    before = [c for c in comments if c[1] <= mid_start and not text[c[1]:mid_start].strip()]
    return before[-1] if before else None


def apply_fim(doc: pack.PackInput, cfg: FimConfig, row_length: int, byte_table: list[bytes] | None = None,
              byte_lengths: np.ndarray | None = None, text: str | None = None) -> FimResult:
    """FIM-transform one BOS-prefixed document (see the module docstring).

    Every token-aligned value moves with the tokens: ``ids``, ``loss_keep``, the planes
    in ``extras`` (markers get 0); chunk spans and edges are remapped with
    :func:`remap_chunks`; per-document values (``platform_ids``) are unchanged. A drawn
    document whose three markers would overflow ``row_length`` is left whole
    (``reason == "too_long"``). The doc-comment policy needs ``byte_table``
    (:func:`token_byte_table`); without it, or when the bytes do not add up, nothing is
    masked (``reason`` says why).
    """
    n = len(doc.ids)
    mode, a, b = decide(doc.doc_key, n - 1, cfg)
    ident = np.arange(n, dtype=np.int64)
    if mode == "none":
        return FimResult("none", (0, 0), ident, doc)
    if n + MARKERS > row_length:
        return FimResult("none", (a, b), ident, doc, reason="too_long")
    src = permutation(n, mode, a, b)
    is_marker = src < 0
    take = np.where(is_marker, 0, src)
    ids = np.asarray(doc.ids, dtype=np.uint32)[take]
    ids[is_marker] = np.array(marker_ids(mode), dtype=np.uint32)
    keep = np.ones(n, np.uint8) if doc.loss_keep is None else np.asarray(doc.loss_keep, np.uint8)
    masked, reason = 0, ""
    if cfg.doc_comment_policy == "mask":
        if byte_table is None:
            reason = "no_byte_table"
        else:
            raw = None if text is None else text.encode("utf-8", "surrogatepass")
            blob, offsets, comments = doc_comment_token_spans(np.asarray(doc.ids), byte_table, byte_lengths, raw)
            span = describing_comment(blob, comments, int(offsets[1 + a]), int(offsets[1 + b]))
            if span is not None:
                starts, ends = offsets[:-1], offsets[1:]
                hit = (ends > span[0]) & (starts < span[1]) & (np.arange(n) > 0)
                masked = int((hit & (keep == 1)).sum())
                keep = keep.copy()
                keep[hit] = 0
    new_keep = keep[take]
    new_keep[is_marker] = 1
    extras = dict(doc.extras)
    for p in pack.PLANES:
        if p in extras:
            v = np.asarray(extras[p], dtype=np.uint8)[take]
            v[is_marker] = 0
            extras[p] = v
    if "chunk_boundaries" in extras:
        edges = {e: list(extras.get(e) or []) for e in pack.EDGE_COLUMNS if e in extras}
        extras["chunk_boundaries"], new_edges = remap_chunks(list(extras["chunk_boundaries"]), src, edges)
        extras.update(new_edges)
    new = pack.PackInput(ids, doc.doc_key, doc.source, doc.revision, doc.path, doc.chunk_index,
                         loss_keep=new_keep, extras=extras)
    return FimResult(mode, (a, b), src, new, masked=masked, reason=reason)


def apply_fim_all(docs: list[pack.PackInput], cfg: FimConfig, row_length: int,
                  byte_table: list[bytes] | None = None, byte_lengths: np.ndarray | None = None,
                  texts: list[str] | None = None) -> tuple[list[pack.PackInput], dict]:
    """:func:`apply_fim` over ``docs``; returns the new documents and figures
    (``fim_psm``, ``fim_spm``, ``fim_skipped_too_long``, ``fim_doc_comment_masked_tokens``,
    ``fim_doc_comment_docs``, the config). ``byte_lengths`` and ``texts`` (aligned with
    ``docs``) are optional speed-ups for the doc-comment policy."""
    out, figs = [], {"fim_psm": 0, "fim_spm": 0, "fim_skipped_too_long": 0,
                     "fim_doc_comment_masked_tokens": 0, "fim_doc_comment_docs": 0}
    lengths = byte_lengths
    if lengths is None and byte_table is not None:
        lengths = token_byte_lengths(byte_table)
    for i, d in enumerate(docs):
        r = apply_fim(d, cfg, row_length, byte_table, lengths, None if texts is None else texts[i])
        out.append(r.doc)
        if r.mode != "none":
            figs[f"fim_{r.mode}"] += 1
        figs["fim_skipped_too_long"] += r.reason == "too_long"
        figs["fim_doc_comment_masked_tokens"] += r.masked
        figs["fim_doc_comment_docs"] += r.masked > 0
    figs.update(fim_rate=cfg.rate, fim_spm_share=cfg.spm_share, fim_seed=cfg.seed,
                fim_doc_comment_policy=cfg.doc_comment_policy)
    return out, figs


#: Segments of one document in :func:`permute_ids`: BOS, the three markers and the three pieces.
_SEGMENTS = 7


def decide_all(doc_keys, lengths: np.ndarray, cfg: FimConfig, row_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mode, a, b)`` arrays for BOS-prefixed documents of ``lengths`` tokens (BOS
    included, each ≥ 1; ``doc_keys`` a sequence of ``str``, one per document): ``mode``
    int8[n] 0 (left whole), 1 (PSM) or 2 (SPM), ``a`` and ``b`` int64[n] the body cuts —
    exactly :func:`decide` per document, a drawn document whose markers would overflow
    ``row_length`` left whole. One sha256 digest per key (hashlib has no batch call), the
    four 64-bit words of every digest read as one ``uint64[n, 4]`` array and the draws,
    sides and cuts taken with numpy (``uint64 → float64`` rounds as ``int / float`` does).
    With ``rate == 0`` nothing is drawn (no hashing). ``ValueError`` when a length is < 1."""
    n = np.asarray(lengths, dtype=np.int64)
    mode, a, b = np.zeros(n.size, np.int8), np.zeros(n.size, np.int64), np.zeros(n.size, np.int64)
    if cfg.rate <= 0 or not n.size:
        return mode, a, b
    if int(n.min()) < 1:
        raise ValueError(f"document {int(np.argmin(n))} has no tokens (FIM needs the BOS)")
    head = f"{cfg.seed}\x00"
    digests = b"".join([hashlib.sha256(f"{head}{k}".encode()).digest() for k in doc_keys])
    w = np.frombuffer(digests, dtype="<u8").reshape(n.size, 4)
    draw, side = w[:, 0].astype(np.float64) / 2.0**64, w[:, 1].astype(np.float64) / 2.0**64
    width = n.astype(np.uint64)  # n_body + 1 cut positions
    x, y = (w[:, 2] % width).astype(np.int64), (w[:, 3] % width).astype(np.int64)
    drawn = (draw < cfg.rate) & (n + MARKERS <= row_length)
    mode[drawn] = np.where(side[drawn] < cfg.spm_share, 2, 1)
    a[drawn], b[drawn] = np.minimum(x, y)[drawn], np.maximum(x, y)[drawn]
    return mode, a, b


def permute_ids(flat: np.ndarray, lengths: np.ndarray, doc_keys, cfg: FimConfig, row_length: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FIM's id moves for many BOS-prefixed documents at once, with numpy over the flat ids.

    ``flat`` holds the documents' ids back to back (``lengths`` tokens each, BOS included),
    ``doc_keys`` their keys. Returns ``(ids, lengths, drawn)``: the documents after FIM,
    back to back (``flat``'s dtype), their lengths (int64[n], 3 more for a transformed
    document) and the bool mask of the transformed ones. Each document's ids are exactly
    ``apply_fim(doc).doc.ids`` (:func:`decide_all`, then :func:`apply_cuts`); only the ids
    move, so the doc-comment policy (a loss mask) plays no part."""
    mode, a, b = decide_all(doc_keys, lengths, cfg, row_length)
    return apply_cuts(flat, lengths, mode, a, b)


def apply_cuts(flat: np.ndarray, lengths: np.ndarray, mode: np.ndarray, a: np.ndarray, b: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`permute_ids` for the choices of :func:`decide_all` (``mode`` int8[n], cuts
    ``a``/``b`` int64[n] with ``0 ≤ a ≤ b ≤ lengths - 1`` where drawn) on ``flat`` (ids
    back to back, ``lengths`` tokens each, BOS first): ``(ids, lengths, drawn)`` —
    ``flat``'s dtype, int64[n] (3 more for a drawn document), bool[n]; ``flat`` itself when
    nothing is drawn. Every document is cut into the seven segments of its layout (whole,
    or BOS, markers and pieces), and all are gathered with one int64 index array (each
    segment's source offset repeated over its tokens, plus the output position). Cuts
    outside a document raise ``IndexError`` or move another document's ids."""
    n = np.asarray(lengths, dtype=np.int64)
    drawn = mode > 0
    if not drawn.any():
        return flat, n, drawn
    start = np.zeros(n.size, np.int64)
    np.cumsum(n[:-1], out=start[1:])
    src = np.zeros((n.size, _SEGMENTS), np.int64)  # first source token of each segment (0 for a marker)
    size = np.zeros((n.size, _SEGMENTS), np.int64)
    mark = np.full((n.size, _SEGMENTS), -1, np.int64)  # marker id, -1 for none
    psm = mode == 1
    body = start + 1
    pieces = {"pre": (body, a), "mid": (body + a, b - a), "suf": (body + b, n - 1 - b)}
    layout = {1: ("P", "pre", "S", "suf", "M", "mid"), 2: ("P", "S", "suf", "M", "pre", "mid")}
    ids = {"P": FIM_PREFIX_ID, "S": FIM_SUFFIX_ID, "M": FIM_MIDDLE_ID}
    src[:, 0], size[:, 0] = start, np.where(drawn, 1, n)
    for col in range(1, _SEGMENTS):
        for m, sel in ((1, psm), (2, mode == 2)):
            what = layout[m][col - 1]
            if what in ids:
                size[sel, col], mark[sel, col] = 1, ids[what]
            else:
                src[sel, col], size[sel, col] = pieces[what][0][sel], pieces[what][1][sel]
    src, size, mark = src.ravel(), size.ravel(), mark.ravel()
    out_start = np.zeros(size.size, np.int64)
    np.cumsum(size[:-1], out=out_start[1:])
    take = np.repeat(src - out_start, size)
    take += np.arange(take.size, dtype=np.int64)
    out = np.take(np.asarray(flat), take)
    is_marker = mark >= 0
    out[out_start[is_marker]] = mark[is_marker]
    return out, n + MARKERS * drawn, drawn
