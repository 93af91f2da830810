"""Vectorized MinHash signatures and banded LSH for stage 4 (SPEC §4 "Dedup").

**Shingles.** A text is split into tokens = maximal runs of ``[A-Za-z0-9_]`` bytes of its
UTF-8 encoding (identical to :func:`megacpp_core.dedup.shingles`: non-ASCII characters,
whitespace and punctuation only separate tokens). A shingle is ``k`` consecutive tokens
(SPEC §4: k = 5); a text with ``1 ≤ n < k`` tokens has exactly one shingle of all its
tokens, a text without tokens has none.

**Shingle hash.** Instead of SHA-1 of the joined shingle bytes (datasketch's default
``hashfunc``, one Python call per shingle), every shingle is hashed in numpy:

* token hash ``h = Σ_j byte_j · P^j mod 2^64`` (bytes of the token, ``j`` from 0),
  then ``m = splitmix64(h)``;
* shingle hash ``s = Σ_t m_t · Q^t mod 2^64`` over its ``t < k`` tokens, and the 32-bit
  hash value ``hv = splitmix64(s) >> 32``.

:func:`shingle_hash32` is the same function for one shingle in plain Python; a datasketch
``MinHash(hashfunc=shingle_hash32)`` fed the shingles gives bit-identical signatures (a
test checks it). ``P``/``Q`` are odd 64-bit constants (the splitmix64 golden-ratio
increment and the FNV-1a 64 prime); splitmix64 is Steele, Lea & Flood, "Fast splittable
pseudorandom number generators", OOPSLA 2014.

**Permutations.** datasketch 2.x's ``"affine32"`` scheme, bit for bit: ``hv`` is pre-mixed
with the MurmurHash3 32-bit finalizer, then ``π_i(hv) = a_i · hv + b_i mod 2^32`` with
``(a, b)`` those of ``datasketch.MinHash(num_perm, seed, scheme="affine32").permutations``,
drawn as datasketch draws them (:func:`permutations`).
A signature is the per-permutation minimum over the shingle set, ``uint32[num_perm]``;
a text without shingles has the empty signature (all ``0xFFFFFFFF``, as datasketch).

**LSH.** A signature's band ``β`` (rows ``β·r … β·r + r − 1``) is reduced to one 64-bit
key; documents sharing a key in any band are candidate pairs. The index costs
``bands × (8 + 4)`` bytes per document (key + document id). Band ranges can be processed
in separate steps (one pod each); the union of their candidate pairs is the same set as
one pass over all bands, because a pair is a candidate iff one band matches.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import numpy as np

#: Odd multiplier of the token byte polynomial (splitmix64's golden-ratio increment).
P_TOKEN = 0x9E3779B97F4A7C15
#: Odd multiplier of the shingle token polynomial (the FNV-1a 64-bit prime).
Q_SHINGLE = 0x100000001B3
#: datasketch permutation scheme whose (a, b) and arithmetic are reproduced.
SCHEME = "affine32"
#: Shingles permuted per numpy block: the transient ``block × num_perm`` uint32 matrix
#: (512 KiB at 128 permutations) stays in cache; 1024 was fastest of 256…65536 measured
#: on the default corpus (implementation choice).
SHINGLE_BLOCK = 1024
#: Token bytes :func:`token_hashes` adds one position at a time (Horner's rule over the
#: tokens sorted by length): positions past it, in the few longer tokens, are summed in
#: one gather instead, so a token of a million word characters costs no million Python
#: steps. 64 covers every token of all but a handful of files of the default corpus
#: (its longest token in a revision: 25–100 bytes; implementation choice).
HORNER_STEPS = 64
#: Signatures whose band keys :func:`band_keys` computes at once: its uint64 temporaries
#: are ``block × bands`` (10 MiB a temporary at 20 bands), whatever the number of
#: signatures; one numpy call per row of all bands instead of one per row of each band,
#: which on small per-source sets was Python's overhead more than work (implementation
#: choice).
BAND_BLOCK = 1 << 16
#: Text bytes hashed per batch of documents in :func:`signatures` (bounds the per-batch
#: uint64 temporaries to a few dozen MiB; implementation choice).
BATCH_BYTES = 4 << 20
#: Pairs compared per numpy block (Jaccard estimates, earlier-band tests): bounds the
#: ``block × num_perm`` temporaries (two uint32 row gathers and a bool matrix) to about
#: 18 MiB at 128 permutations (implementation choice).
PAIR_BLOCK = 16384
#: Value of an empty signature slot (datasketch's max hash for affine32).
EMPTY = np.uint32(0xFFFFFFFF)

_U64 = np.uint64
_M64 = (1 << 64) - 1
_WORD = np.zeros(256, dtype=bool)
for _c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_":
    _WORD[_c] = True


def _splitmix64(z: np.ndarray) -> np.ndarray:
    z = z ^ (z >> _U64(30))
    z = z * _U64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> _U64(27))
    z = z * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


def _splitmix64_int(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3 32-bit finalizer on a ``uint32`` array (constants from MurmurHash3,
    the same pre-mix datasketch applies for ``"affine32"``); returns ``uint32``."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def shingle_hash32(shingle: bytes | Sequence[bytes]) -> int:
    """32-bit hash of one shingle (``b"tok1 tok2 …"`` or a sequence of token bytes),
    equal to what :func:`signatures` computes in numpy (module doc). Returns an int in
    ``[0, 2^32)``; usable as a datasketch ``hashfunc``."""
    tokens = shingle.split(b" ") if isinstance(shingle, (bytes, bytearray)) else shingle
    s, q = 0, 1
    for tok in tokens:
        h, p = 0, 1
        for byte in tok:
            h = (h + byte * p) & _M64
            p = (p * P_TOKEN) & _M64
        s = (s + _splitmix64_int(h) * q) & _M64
        q = (q * Q_SHINGLE) & _M64
    return _splitmix64_int(s) >> 32


def permutations(num_perm: int = 128, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)``, two ``uint32[num_perm]`` arrays: datasketch's affine32 permutation
    parameters for ``seed`` (``a`` odd), drawn as datasketch 2.x's
    ``MinHash._init_permutations`` draws them: numpy's legacy ``RandomState(seed)``
    (whose stream numpy keeps fixed), ``a = 2·randint(0, 2^31) + 1`` then
    ``b = randint(0, 2^32)``, both ``uint32``. Drawn here rather than through a
    ``datasketch.MinHash`` because importing datasketch imports scipy (36 MB of RSS and
    0.35 s a process, measured here) only for these numbers; ``tests/test_dedup_minhash.py``
    checks them against datasketch's. Raises ``ValueError`` for ``num_perm < 1``."""
    if num_perm < 1:
        raise ValueError(f"num_perm must be >= 1, got {num_perm}")
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return np.ascontiguousarray(a), np.ascontiguousarray(b)


def shingle_hashes(texts: Sequence[str], k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Hash the k-token shingles of every text (module doc) in one vectorized pass.

    Returns ``(hv, offsets)``: ``hv`` is ``uint32[n_shingles]`` in text order (shingle
    order within a text), ``offsets`` is ``int64[len(texts) + 1]`` so the shingles of
    text ``i`` are ``hv[offsets[i]:offsets[i + 1]]`` (possibly empty). Raises
    ``ValueError`` for ``k < 1`` and ``UnicodeEncodeError`` for lone surrogates.
    """
    if k < 1:
        raise ValueError(f"shingle size k must be >= 1, got {k}")
    n_docs = len(texts)
    if n_docs == 0:
        return np.zeros(0, np.uint32), np.zeros(1, np.int64)
    encoded = [t.encode("utf-8") for t in texts]
    # One separator byte between texts so no token crosses a text boundary.
    buf = np.frombuffer(b"\n".join(encoded) + b"\n", dtype=np.uint8)
    lens = np.fromiter((len(e) + 1 for e in encoded), dtype=np.int64, count=n_docs)
    doc_start = np.concatenate(([0], np.cumsum(lens)[:-1]))
    edge = np.diff(_WORD[buf].view(np.int8), prepend=np.int8(0), append=np.int8(0))  # +1 a run starts, -1 it ended
    starts = np.flatnonzero(edge == 1)
    ends = np.flatnonzero(edge == -1)
    del edge
    n_tok = starts.size
    if n_tok == 0:
        return np.zeros(0, np.uint32), np.zeros(n_docs + 1, np.int64)
    m = _splitmix64(token_hashes(buf, starts, ends - starts))
    tok_doc = np.searchsorted(doc_start, starts, side="right") - 1
    tok_per_doc = np.bincount(tok_doc, minlength=n_docs)
    first_tok = np.concatenate(([0], np.cumsum(tok_per_doc)[:-1]))
    qpow = [_U64(pow(Q_SHINGLE, t, 1 << 64)) for t in range(k)]

    # Full shingles: token i starts one when tokens i .. i+k-1 are in the same text.
    n_full = max(n_tok - k + 1, 0)
    s = np.zeros(n_full, dtype=np.uint64)
    for t in range(k):
        s += m[t:t + n_full] * qpow[t]
    full_ok = tok_doc[:n_full] == tok_doc[k - 1:k - 1 + n_full] if n_full else np.zeros(0, bool)
    s_doc = tok_doc[:n_full][full_ok]
    s = s[full_ok]
    # Short texts (1 <= tokens < k): one shingle of all their tokens.
    short = np.flatnonzero((tok_per_doc > 0) & (tok_per_doc < k))
    if short.size:
        extra = np.zeros(short.size, dtype=np.uint64)
        for t in range(k - 1):
            has = tok_per_doc[short] > t
            extra[has] += m[first_tok[short[has]] + t] * qpow[t]
        s = np.concatenate((s, extra))
        s_doc = np.concatenate((s_doc, short))
        order = np.argsort(s_doc, kind="stable")
        s, s_doc = s[order], s_doc[order]
    hv = (_splitmix64(s) >> _U64(32)).astype(np.uint32)
    offsets = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(np.bincount(s_doc, minlength=n_docs), out=offsets[1:])
    return hv, offsets


def token_hashes(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``h = Σ_j buf[start + j] · P^j mod 2^64`` (module doc) of every token, ``uint64[n]``
    in the order given: ``buf`` ``uint8``, ``starts`` and ``lengths`` (each ≥ 1) ``int64[n]``.

    Horner's rule run over all tokens at once: sorted longest first (a stable sort of the
    lengths, numpy's radix sort below 65,536 bytes), position ``j`` adds
    ``buf[start + j] · P^j`` to the leading tokens longer than ``j``, a prefix of that
    order, so each step is one gather and one multiply-add and the steps together touch
    each token byte once. Positions from
    :data:`HORNER_STEPS` on, in the few longer tokens, are added in one gather and one
    ``np.add.reduceat``. Gathering every byte with its power and reducing per token, as
    :func:`shingle_hashes` did before, made it take twice as long on the default corpus
    (0.20–0.21 s against 0.11 s for its 16 scrubbed shards, 12 MB);
    ``tests/test_dedup_minhash.py`` checks the result against the definition."""
    n = lengths.size
    if n == 0:
        return np.zeros(0, np.uint64)
    longest = int(lengths.max())
    order = np.argsort(lengths.astype(np.uint16) if longest < 1 << 16 else lengths, kind="stable")[::-1]
    first = starts[order]
    longer = n - np.cumsum(np.bincount(lengths, minlength=longest + 1))[:-1]  # tokens longer than j, j < longest
    h = np.zeros(n, np.uint64)
    power = 1
    for j in range(min(longest, HORNER_STEPS)):
        k = int(longer[j])
        v = np.take(buf, first[:k] + j).astype(np.uint64)
        v *= _U64(power)
        h[:k] += v
        power = (power * P_TOKEN) & _M64
    if longest > HORNER_STEPS:  # the tails of the longest tokens: every byte with its power
        k = int(longer[HORNER_STEPS])
        rest = lengths[order[:k]] - HORNER_STEPS
        cstart = np.zeros(k, np.int64)
        np.cumsum(rest[:-1], out=cstart[1:])
        rel = np.arange(int(rest.sum()), dtype=np.int64) - np.repeat(cstart, rest)
        pw = np.full(longest, _U64(P_TOKEN), np.uint64)
        pw[0] = 1
        pw = np.cumprod(pw, dtype=np.uint64)
        pos = np.repeat(first[:k] + HORNER_STEPS, rest) + rel
        h[:k] += np.add.reduceat(buf[pos].astype(np.uint64) * pw[HORNER_STEPS + rel], cstart)
    out = np.empty(n, np.uint64)
    out[order] = h
    return out


def signatures_from_hashes(hv: np.ndarray, offsets: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """MinHash signatures ``uint32[n_docs, num_perm]`` from :func:`shingle_hashes` output
    and affine32 permutations ``(a, b)`` (:func:`permutations`). Rows of texts without
    shingles are all :data:`EMPTY`. Works in blocks of :data:`SHINGLE_BLOCK` shingles."""
    n_docs = offsets.size - 1
    sig = np.full((n_docs, a.size), EMPTY, dtype=np.uint32)
    if hv.size == 0:
        return sig
    fm = fmix32(hv)[:, None]
    doc_of = np.repeat(np.arange(n_docs), np.diff(offsets))
    for lo in range(0, hv.size, SHINGLE_BLOCK):
        hi = min(lo + SHINGLE_BLOCK, hv.size)
        phv = np.multiply(fm[lo:hi], a)
        phv += b
        d = doc_of[lo:hi]
        seg = np.flatnonzero(np.concatenate(([True], d[1:] != d[:-1])))
        mins = np.minimum.reduceat(phv, seg, axis=0)
        docs = d[seg]
        np.minimum(sig[docs], mins, out=mins)
        sig[docs] = mins  # segments of one block name distinct documents
    return sig


def signatures(texts: Iterable[str], num_perm: int = 128, seed: int = 1, k: int = 5) -> np.ndarray:
    """MinHash signatures of ``texts``: ``uint32[n, num_perm]``, row ``i`` for text ``i``.

    Equal, bit for bit, to ``datasketch.MinHash(num_perm, seed, scheme="affine32",
    hashfunc=shingle_hash32)`` updated with the text's shingles. Texts are processed in
    batches of about :data:`BATCH_BYTES`, so memory stays bounded whatever the corpus size.
    Raises ``ValueError`` for ``k < 1`` or ``num_perm < 1``.
    """
    a, b = permutations(num_perm, seed)
    out: list[np.ndarray] = []
    batch: list[str] = []
    size = 0
    for t in texts:
        batch.append(t)
        size += len(t)
        if size >= BATCH_BYTES:
            out.append(signatures_from_hashes(*shingle_hashes(batch, k), a, b))
            batch, size = [], 0
    if batch or not out:
        out.append(signatures_from_hashes(*shingle_hashes(batch, k), a, b))
    return np.concatenate(out) if len(out) > 1 else out[0]


def is_empty(sig: np.ndarray, block: int = 8192) -> np.ndarray:
    """``bool[n]``: rows of ``sig`` (``uint32[n, p]``) that are empty signatures (compared
    ``block`` rows at a time, so the transient is ``block × p`` bytes, not ``n × p``)."""
    out = np.empty(sig.shape[0], dtype=bool)
    for lo in range(0, sig.shape[0], block):
        out[lo:lo + block] = np.all(sig[lo:lo + block] == EMPTY, axis=1)
    return out


def estimate_jaccard(sig: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """``float64[len(i)]``: fraction of equal signature slots of rows ``i`` and ``j``
    (the MinHash estimator of Jaccard similarity, Broder 1997), :data:`PAIR_BLOCK` pairs
    at a time (the ``bool[block, p]`` comparison is the only temporary)."""
    i, j = np.asarray(i), np.asarray(j)
    out = np.zeros(len(i))
    for a in range(0, len(i), PAIR_BLOCK):
        out[a:a + PAIR_BLOCK] = (sig[i[a:a + PAIR_BLOCK]] == sig[j[a:a + PAIR_BLOCK]]).mean(axis=1)
    return out


def candidate_probability(jaccard: float, bands: int, rows: int) -> float:
    """Probability ``1 − (1 − J^r)^b`` that a pair of Jaccard ``J`` shares at least one of
    ``b`` bands of ``r`` rows (Leskovec, Rajaraman & Ullman, *Mining of Massive Datasets*,
    §3.4)."""
    return 1.0 - (1.0 - jaccard ** rows) ** bands


def effective_threshold(bands: int, rows: int) -> float:
    """``(1/b)^(1/r)``: the Jaccard where the banding S-curve is steepest (MMDS §3.4.3)."""
    return (1.0 / bands) ** (1.0 / rows)


def band_keys(sig: np.ndarray, rows: int, band_lo: int, band_hi: int) -> np.ndarray:
    """64-bit keys ``uint64[n, band_hi − band_lo]`` of bands ``band_lo … band_hi − 1`` of
    ``sig`` (``uint32[n, p]``, band ``β`` = columns ``β·rows … β·rows + rows − 1``).

    A key is splitmix64 of a polynomial of the band's values, so equal bands give equal
    keys; unequal bands collide with probability ~2^-64 (a collision only adds a
    candidate, which is then confirmed on the signatures). Raises ``ValueError`` when the
    bands do not fit in ``p`` columns."""
    n, p = sig.shape
    if not 0 <= band_lo <= band_hi or band_hi * rows > p:
        raise ValueError(f"bands [{band_lo}, {band_hi}) x {rows} rows do not fit {p} permutations")
    keys = np.empty((n, band_hi - band_lo), dtype=np.uint64)
    seeds = np.arange(band_lo + 1, band_hi + 1, dtype=np.uint64)  # band β starts from β + 1
    for lo in range(0, n, BAND_BLOCK):  # every band at once, a block of rows at a time
        hi = min(lo + BAND_BLOCK, n)
        acc = np.repeat(seeds[None, :], hi - lo, axis=0)
        for r in range(rows):  # row r of every band: columns β·rows + r, a strided view of ``sig``
            acc = _splitmix64(acc * _U64(Q_SHINGLE) + sig[lo:hi, band_lo * rows + r:band_hi * rows:rows].astype(np.uint64))
        keys[lo:hi] = acc
    return keys


def _bucket_pairs(kc: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``int64[m]`` codes ``i · 2^32 + j`` (``i < j``) of all pairs of rows ``ids`` sharing
    a key of ``kc`` (``uint64[len(ids)]``, one band's keys); a bucket of ``s`` rows gives
    ``s(s−1)/2`` codes. Unsorted."""
    order = np.argsort(kc, kind="stable")
    ks, ids = kc[order], ids[order]
    if ks.size < 2:
        return np.zeros(0, dtype=np.int64)
    brk = np.flatnonzero(np.concatenate(([True], ks[1:] != ks[:-1], [True])))
    sizes = np.diff(brk)
    found = []
    two = brk[:-1][sizes == 2]  # most buckets are pairs: one vector operation for all of them
    if two.size:
        a, b = ids[two].astype(np.int64), ids[two + 1].astype(np.int64)
        found.append((np.minimum(a, b) << 32) | np.maximum(a, b))
    for bstart, bsize in zip(brk[:-1][sizes > 2], sizes[sizes > 2]):
        members = np.sort(ids[bstart:bstart + bsize]).astype(np.int64)
        ii, jj = np.triu_indices(bsize, 1)
        found.append((members[ii] << 32) | members[jj])
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def bucket_pairs(kc: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``int64[m]`` codes ``i · 2^32 + j`` (``i < j``) of every pair of ``ids`` (``int64``
    row ids below 2^31) sharing a key of ``kc`` (``uint64``, aligned): a bucket of ``s``
    rows gives ``s(s−1)/2`` codes. Unsorted."""
    return _bucket_pairs(kc, ids)


def _decode(codes: np.ndarray) -> np.ndarray:
    """``int64[m, 2]`` pairs of :func:`_bucket_pairs` codes."""
    return np.stack((codes >> 32, codes & 0xFFFFFFFF), axis=1) if codes.size else np.zeros((0, 2), dtype=np.int64)


def _rows_of(n: int, skip: np.ndarray | None) -> np.ndarray:
    if n >= 1 << 31:
        raise ValueError(f"{n} rows: pair codes hold row indices below 2^31")
    return np.arange(n) if skip is None else np.flatnonzero(~skip)


def _select_group(pairs: np.ndarray, group: np.ndarray | None, cross_group: bool) -> np.ndarray:
    if group is None or not len(pairs):
        return pairs
    same = group[pairs[:, 0]] == group[pairs[:, 1]]
    return pairs[~same] if cross_group else pairs[same]


def candidate_pairs(keys: np.ndarray, group: np.ndarray | None = None, cross_group: bool = False,
                    skip: np.ndarray | None = None) -> np.ndarray:
    """Candidate pairs of rows sharing a key in any column of ``keys`` (``uint64[n, nb]``).

    ``group`` (``int[n]``, e.g. the source index) with ``cross_group=False`` keeps pairs
    within one group, with ``cross_group=True`` pairs across groups; ``skip`` (``bool[n]``)
    excludes rows (e.g. empty signatures). Returns ``int64[m, 2]`` with ``i < j``, unique,
    sorted lexicographically. A bucket of ``s`` rows yields all ``s(s−1)/2`` pairs.
    Raises ``ValueError`` for ``n ≥ 2^31`` rows.
    """
    idx_all = _rows_of(keys.shape[0], skip)
    codes = [_bucket_pairs(keys[idx_all, col], idx_all) for col in range(keys.shape[1])]
    return _select_group(_decode(np.unique(np.concatenate(codes))) if codes else _decode(np.zeros(0, np.int64)),
                         group, cross_group)


def band_pair_blocks(sig: np.ndarray, rows: int, band_lo: int, band_hi: int, group: np.ndarray | None = None,
                     cross_group: bool = False, skip: np.ndarray | None = None) -> Iterator[np.ndarray]:
    """The candidate pairs of bands ``band_lo … band_hi − 1`` of ``sig`` (``uint32[n, p]``)
    one band at a time, each pair once: band ``β`` yields ``int64[m, 2]`` (``i < j``,
    sorted) of the rows sharing its key and no key of an earlier band of the range.

    The blocks are disjoint and their union is :func:`band_pairs` of the same arguments,
    so a caller can count and filter candidates while holding one band's pairs and one
    band's keys (8 bytes per row), never the whole candidate set. ``group``, ``cross_group``
    and ``skip`` as in :func:`candidate_pairs`. Raises ``ValueError`` when the bands do not
    fit ``sig`` or for ``n ≥ 2^31`` rows."""
    if not 0 <= band_lo <= band_hi or band_hi * rows > sig.shape[1]:
        raise ValueError(f"bands [{band_lo}, {band_hi}) x {rows} rows do not fit {sig.shape[1]} permutations")
    idx_all = _rows_of(sig.shape[0], skip)
    for beta in range(band_lo, band_hi):
        codes = np.sort(_bucket_pairs(band_keys(sig, rows, beta, beta + 1)[idx_all, 0], idx_all))
        kept = [np.zeros((0, 2), dtype=np.int64)]
        for a in range(0, len(codes), PAIR_BLOCK):  # decode, filter and test one block at a time
            p = _select_group(_decode(codes[a:a + PAIR_BLOCK]), group, cross_group)
            if beta > band_lo and len(p):
                ki, kj = band_keys(sig[p[:, 0]], rows, band_lo, beta), band_keys(sig[p[:, 1]], rows, band_lo, beta)
                p = p[~(ki == kj).any(axis=1)]
            kept.append(p)
        del codes
        yield np.concatenate(kept)


def band_pairs(sig: np.ndarray, rows: int, band_lo: int, band_hi: int, group: np.ndarray | None = None,
               cross_group: bool = False, skip: np.ndarray | None = None) -> np.ndarray:
    """:func:`candidate_pairs` of :func:`band_keys` ``(sig, rows, band_lo, band_hi)``, the
    same ``int64[m, 2]`` array, from :func:`band_pair_blocks` (one band's keys at a time,
    ``8`` bytes per row instead of ``8 × bands``). Raises ``ValueError`` when the bands do
    not fit ``sig``."""
    return merge_pairs(band_pair_blocks(sig, rows, band_lo, band_hi, group, cross_group, skip))


def merge_pairs(parts: Iterable[np.ndarray]) -> np.ndarray:
    """Union of candidate-pair arrays (``int64[m, 2]`` each, row indices below 2^31) from
    band-range steps: unique rows sorted lexicographically, the same array a one-step run
    produces."""
    codes = [(p[:, 0] << 32) | p[:, 1] for p in (np.asarray(p, dtype=np.int64).reshape(-1, 2) for p in parts)]
    return _decode(np.unique(np.concatenate(codes))) if codes else np.zeros((0, 2), dtype=np.int64)


class UnionFind:
    """Disjoint sets over ``0 … n−1`` with path halving and union by smaller root id
    (so a set's root is its smallest member: deterministic, independent of union order)."""

    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        p = self.parent
        while p[x] != x:
            p[x] = p[p[x]]
            x = p[x]
        return x

    def union(self, x: int, y: int) -> None:
        rx, ry = self.find(x), self.find(y)
        if rx != ry:
            if ry < rx:
                rx, ry = ry, rx
            self.parent[ry] = rx

    def groups(self) -> dict[int, list[int]]:
        """``{root: sorted members}`` for every set of two or more members."""
        out: dict[int, list[int]] = {}
        for x in range(len(self.parent)):
            out.setdefault(self.find(x), []).append(x)
        return {r: m for r, m in out.items() if len(m) > 1}
