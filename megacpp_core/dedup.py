"""Stage 4 (SPEC §4): snapshot-wide file deduplication across all sources.

Three passes over the files that survived quality, license and scrub, in this order:

1. **Exact** — SHA-256 of the UTF-8 text across every revision of the snapshot. Cheap,
   and removes the bulk (vendored copies of the same file). Counted as ``exact_removed``.
2. **Near, within a source** — MinHash over 5-token shingles with 128 permutations
   (:mod:`megacpp_core.minhash`: tokens are runs of ``[A-Za-z0-9_]``), LSH banding chosen
   by datasketch for Jaccard 0.7 under :data:`LSH_WEIGHTS` (b=20, r=6), on the exact
   survivors, pairs within one source only. Greedy in keep order: a file is dropped when
   an LSH candidate that is *kept* has estimated Jaccard ≥ the threshold, verified on
   the exact Jaccard of the shingle-hash sets (its twin is the most similar one by
   estimate, the earlier in keep order on a tie), so every near drop is within
   the threshold of its twin and a chain A~B, B~C with A !~ C keeps A and C.
3. **Cross-source** — the first 112 values of each signature as 14 bands × 8 rows
   (SPEC §4), candidate pairs across different sources only, confirmed by the 112-value
   Jaccard estimate ≥ the threshold and verified on the exact shingle-hash Jaccard, on
   the survivors of passes 1–2; confirmed pairs are
   merged with union-find into clusters. The cluster's first member in keep order is
   kept; every other member is dropped and names it. Union-find is transitive, so a
   member reached through a chain can be below the threshold to the kept member: its
   estimate is recorded and counted in ``cross_source_below_threshold``.
   The candidate pairs may be computed in separate band-range steps
   (:func:`cross_source_candidates`) and passed in; their union is the same set.

Keep policy (SPEC §4): the record first in *keep order* is kept, keep order being the
ascending key ``(LICENSE_RANK[license_class], source_order, path, doc_key)`` — most
permissive license first, then the earlier source in the manifest, then the
lexicographically smaller path. Decisions do not depend on input order.

Every dropped record names ``kept_twin``, a record that is kept (a drop whose first twin
was dropped by a later pass follows it to that twin's kept record), and ``jaccard``, the
128-permutation estimate to the kept twin (1.0 for a byte-identical copy).

Memory: the passes run on columns (:func:`deduplicate_columns`): the documents' strings
stay in arrow arrays, the signatures in one ``uint32[n, num_perm]`` matrix (512 bytes per
file) and the per-file state (keep order, source and sha256 codes, kind, twin, Jaccard) in
numpy arrays indexed by keep order; the LSH index is built one band at a time (one
``uint64`` key per file) and its candidate pairs come band by band, each pair once
(:func:`minhash.band_pair_blocks`), so only the pairs whose estimate reaches the threshold
are held, never the whole candidate set. The exact-Jaccard verification runs in blocks of
at most :data:`VERIFY_BLOCK_RECORDS` records' shingle-hash sets, streaming each block's
texts. Shingle hashes are computed per batch of texts (:data:`minhash.BATCH_BYTES`), and
only for the files that need them. :func:`deduplicate`
is the same on a list of :class:`DedupRecord` (tests, benchmarks).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import dedup_passes as passes
from . import minhash as mh
from .dedup_tables import CROSS, EXACT, KEPT, NEAR, DedupTables, build_tables, take_rows
from .tables import lookup_codes

if TYPE_CHECKING:
    from datasketch import MinHash

#: Keep-policy rank of each license class, lower kept first (SPEC §4 keep policy:
#: "license class, then source order, then path"; classes from the stage-2 license gate).
LICENSE_RANK = {"permissive": 0, "weak_copyleft": 1, "gpl2": 2, "unknown": 3, "refused": 4}

#: Shingles hashed per ``MinHash.update_batch`` call; bounds the transient memory per
#: document independently of its size (implementation choice, not a SPEC figure).
SHINGLE_BATCH = 4096

#: datasketch permutation scheme, pinned so signatures do not change if the library
#: default changes ("affine32" is the datasketch 2.x default; bijective, unbiased).
MINHASH_SCHEME = "affine32"

#: ``MinHashLSH`` (false-positive, false-negative) weights used to pick bands b and rows r.
#: Every candidate is re-checked against the Jaccard estimate, so a false positive costs one
#: signature comparison while a false negative is a missed duplicate: weight recall. At
#: 128 permutations / 0.7 this gives b=20, r=6, candidate probability 0.92 at J=0.7 and
#: 0.98 at J=0.75, versus 0.44 and 0.67 with datasketch's default (0.5, 0.5) (b=14, r=9);
#: probabilities from 1 - (1 - J^r)^b.
LSH_WEIGHTS = (0.1, 0.9)

_TOKEN = re.compile(r"[A-Za-z0-9_]+")


@dataclass(frozen=True)
class DedupRecord:
    """One file entering stage 4.

    ``doc_key`` is a stable, snapshot-unique key (e.g. ``"lz4-4.4.5/lz4libs/lz4.c"``);
    ``source_order`` is the index of ``source`` in the manifest; ``license_class`` must be
    a key of :data:`LICENSE_RANK`; ``text`` is the scrubbed file content, or None when
    the caller passes ``content_sha256`` (hex sha256 of the UTF-8 text) and a text loader
    to :func:`deduplicate` instead (the snapshot step then never holds the texts).
    """

    doc_key: str
    source: str
    source_order: int
    path: str
    license_class: str
    text: str | None
    content_sha256: str | None = None


#: Records whose shingle-hash sets one verification block holds
#: (:data:`megacpp_core.dedup_passes.VERIFY_BLOCK_RECORDS`).
VERIFY_BLOCK_RECORDS = passes.VERIFY_BLOCK_RECORDS

#: Cross-source pass (SPEC §4): 112 permutations as 14 bands × 8 rows.
CROSS_NUM_PERM, CROSS_BANDS, CROSS_ROWS = 112, 14, 8

#: Jaccard levels at which the LSH candidate probability is reported (issue "Must show" 2).
REPORT_JACCARD = (0.6, 0.7, 0.8, 0.9)

#: Columns of the ``duplicate_clusters`` table, one row per member of a cluster.
CLUSTER_COLUMNS = ("cluster_id", "cluster_size", "doc_key", "source", "is_kept", "kept_doc_key", "dup_kind",
                   "jaccard_to_kept")


@dataclass
class DedupResult:
    """Outcome of :func:`deduplicate`.

    ``decisions``: one dict per input record, sorted by ``doc_key``, with keys
    ``doc_key`` (str), ``keep`` (bool), ``dup_kind`` (``"exact"``, ``"near"``,
    ``"cross_source"`` or None), ``kept_twin`` (doc_key of a kept record, or None when
    kept), ``jaccard`` (float or None: 128-permutation MinHash estimate of the Jaccard
    similarity to ``kept_twin``, 1.0 for a byte-identical copy), ``cluster_id`` (int ≥ 0
    shared by a kept record and all records naming it, -1 for records in no duplicate
    group; ordinal in keep order of the kept member) and ``content_sha256`` (hex str).

    ``clusters``: the ``duplicate_clusters`` table as a list of dicts with
    :data:`CLUSTER_COLUMNS`, one per member (kept member first), ordered by
    ``cluster_id`` then keep order: ``cluster_size`` members (int), ``is_kept``,
    ``kept_doc_key`` and ``jaccard_to_kept`` (1.0 for the kept member).

    ``figures``: ``files_in``, ``exact_removed``, ``near_removed``,
    ``cross_source_removed``, ``files_out`` (``files_in == files_out + exact_removed +
    near_removed + cross_source_removed``), the three removal rates (fraction of
    ``files_in``), ``clusters``; the near pass's ``num_perm``, ``threshold``,
    ``shingle_k``, ``lsh_bands``, ``lsh_rows``, ``effective_threshold`` = (1/b)^(1/r) and
    ``candidate_probability`` {J: 1-(1-J^r)^b} for J in :data:`REPORT_JACCARD`; the same
    for the cross-source pass under ``cross_*`` keys, plus ``cross_candidate_pairs``,
    ``cross_confirmed_pairs``, ``cross_source_clusters``, ``cross_source_below_threshold``
    and ``largest_clusters`` (the ten largest: id, size, kept member, members).
    """

    decisions: list[dict]
    figures: dict = field(default_factory=dict)
    clusters: list[dict] = field(default_factory=list)


def shingles(text: str, k: int = 5) -> Iterator[bytes]:
    """Yield the k-token shingles of ``text`` lazily, as UTF-8 bytes.

    Tokenizer: maximal runs of ``[A-Za-z0-9_]+`` (identifiers, keywords, numbers);
    whitespace, punctuation, operators and non-ASCII characters only separate tokens, so
    reformatting does not change the shingles. Each shingle is ``k`` consecutive tokens
    joined by one space (``b"tok1 tok2 ... tokk"``). A text with fewer than ``k`` tokens
    (but at least one) yields exactly one shingle of all its tokens; a text with no token
    yields nothing. Memory is O(k) regardless of ``len(text)``.

    Raises ``ValueError`` when ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"shingle size k must be >= 1, got {k}")
    window: deque[str] = deque(maxlen=k)
    for match in _TOKEN.finditer(text):
        window.append(match.group())
        if len(window) == k:
            yield " ".join(window).encode("utf-8")
    if 0 < len(window) < k:
        yield " ".join(window).encode("utf-8")


def minhash_signature(text: str, num_perm: int = 128, k: int = 5, seed: int = 1) -> MinHash:
    """datasketch ``MinHash`` of the k-token shingles of ``text`` (see :func:`shingles`),
    one shingle at a time through datasketch: the reference implementation of
    :func:`megacpp_core.minhash.signatures`, which returns the same ``hashvalues``.

    ``num_perm`` permutations with the given ``seed``, the pinned :data:`MINHASH_SCHEME`
    and :func:`megacpp_core.minhash.shingle_hash32` as hash function. Shingles are
    streamed into ``update_batch`` in batches of :data:`SHINGLE_BATCH`. A text without
    tokens gives an empty signature (``m.is_empty()``).

    Raises ``ValueError`` for ``k < 1`` or an invalid ``num_perm``. datasketch is imported
    here, not with the module (it imports scipy: about 0.35 s that ``megacpp run``'s own
    process, which only builds the asset graph, does not need).
    """
    from datasketch import MinHash

    m = MinHash(num_perm=num_perm, seed=seed, scheme=MINHASH_SCHEME, hashfunc=mh.shingle_hash32)
    stream = shingles(text, k)
    while batch := list(islice(stream, SHINGLE_BATCH)):
        m.update_batch(batch)
    return m


def keep_key(r: DedupRecord) -> tuple:
    """Keep-order key ``(license rank, source_order, path, doc_key)`` (module doc)."""
    return (LICENSE_RANK[r.license_class], r.source_order, r.path, r.doc_key)


@functools.lru_cache(maxsize=32)
def near_lsh_params(threshold: float = 0.7, num_perm: int = 128) -> tuple[int, int]:
    """``(b, r)`` that datasketch ``MinHashLSH`` picks for ``threshold`` and ``num_perm``
    under :data:`LSH_WEIGHTS` (b=20, r=6 at the SPEC defaults), by datasketch 2.x's own
    rule (``datasketch.lsh._optimal_param``): over every ``b·r ≤ num_perm``, the first
    pair, ``b`` then ``r`` ascending, that minimizes ``w_fp·FP + w_fn·FN`` with
    ``FP = ∫_0^t 1 − (1 − s^r)^b ds`` and ``FN = ∫_t^1 1 − (1 − (1 − s^r)^b) ds``. datasketch
    integrates with scipy's ``quad``; the integrands are polynomials of degree ``b·r ≤
    num_perm``, so a Gauss–Legendre rule of ``num_perm // 2 + 2`` nodes integrates them
    exactly here, without importing datasketch and scipy (see
    :func:`megacpp_core.minhash.permutations`). ``tests/test_dedup_minhash.py`` checks
    the pairs against datasketch's on 65 settings (a one-off comparison over 792 —
    thresholds 0.01–0.99 × 16–256 permutations × two weightings — found none that
    differ). Raises ``ValueError`` where
    datasketch's ``MinHashLSH`` refuses the settings: a threshold outside [0, 1],
    ``num_perm < 2``, or a best pair with fewer than 2 bands."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0.0, 1.0], got {threshold}")
    if num_perm < 2:
        raise ValueError(f"num_perm must be >= 2, got {num_perm}")
    x, w = np.polynomial.legendre.leggauss(num_perm // 2 + 2)
    lo_s, lo_w = (x + 1) * threshold / 2, w * threshold / 2  # nodes and weights on [0, t]
    hi_s, hi_w = threshold + (x + 1) * (1 - threshold) / 2, w * (1 - threshold) / 2  # on [t, 1]
    fp_weight, fn_weight = LSH_WEIGHTS
    best, opt = float("inf"), (0, 0)
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            fp = float(np.dot(lo_w, 1 - (1 - lo_s ** float(r)) ** float(b)))
            fn = float(np.dot(hi_w, 1 - (1 - (1 - hi_s ** float(r)) ** float(b))))  # datasketch's form
            error = fp * fp_weight + fn * fn_weight
            if error < best:
                best, opt = error, (b, r)
    if opt[0] < 2:
        raise ValueError(f"threshold {threshold} with {num_perm} permutations gives {opt[0]} band (b < 2)")
    return opt


def cross_source_candidates(sig: np.ndarray, source_ids: np.ndarray, band_lo: int = 0, band_hi: int = CROSS_BANDS,
                            rows: int = CROSS_ROWS) -> np.ndarray:
    """Cross-source LSH candidate pairs from bands ``band_lo … band_hi − 1``.

    ``sig`` is ``uint32[n, p]`` with ``p ≥ band_hi × rows`` (only those columns are read;
    an LSH band-range step passes just its own columns as bands ``0 … hi − lo − 1``: a
    band's key is seeded with its index, so only a 2^-64 key collision could differ),
    ``source_ids`` ``int[n]``. Empty signatures never pair. Returns ``int64[m, 2]``
    row-index pairs (``i < j``, sorted, unique, different sources). The union over band
    ranges covering ``[0, CROSS_BANDS)`` equals the one-range result."""
    return mh.band_pairs(sig, rows, band_lo, band_hi, group=np.asarray(source_ids), cross_group=True,
                         skip=mh.is_empty(sig))


def _lsh_report(bands: int, rows: int) -> dict:
    return {"effective_threshold": mh.effective_threshold(bands, rows),
            "candidate_probability": {str(j): round(mh.candidate_probability(j, bands, rows), 6) for j in REPORT_JACCARD}}


def keep_order_indices(docs: pa.Table) -> np.ndarray:
    """``int64[n]``: the rows of ``docs`` in keep order, ascending ``(LICENSE_RANK[license_class],
    source_order, path, doc_key)`` (strings compare as UTF-8 bytes, i.e. code points, as
    Python does). ``docs`` needs those four columns. Raises ``ValueError`` naming the first
    row (input order) whose ``license_class`` is not in :data:`LICENSE_RANK`."""
    rank = lookup_codes(docs.column("license_class"), LICENSE_RANK, "license_class", docs.column("doc_key"))
    key = pa.table({"r": rank, "s": docs.column("source_order"), "p": docs.column("path"), "k": docs.column("doc_key")})
    return pc.sort_indices(key, sort_keys=[(c, "ascending") for c in "rspk"]).to_numpy().astype(np.int64)


def _codes(col) -> np.ndarray:
    """``int64[n]``: equal values of the string column ``col`` get equal codes."""
    col = pa.chunked_array([col]) if isinstance(col, pa.Array) else col
    return pc.index_in(col, value_set=pc.unique(col)).to_numpy().astype(np.int64)


def _first_of_code(code: np.ndarray) -> np.ndarray:
    """``int64[n]``: for each row, the first row holding its code."""
    if code.size == 0:
        return np.zeros(0, np.int64)
    _, first = np.unique(code, return_index=True)
    return first.astype(np.int64)[code]


def deduplicate_columns(
    docs: pa.Table,
    sig: np.ndarray | None = None,
    have_sig: np.ndarray | None = None,
    cross_pairs: np.ndarray | None = None,
    num_perm: int = 128,
    threshold: float = 0.7,
    shingle_k: int = 5,
    seed: int = 1,
    verify_exact: bool = True,
    load_texts: Callable[[set[str]], Iterator[tuple[str, str]]] | None = None,
) -> DedupTables:
    """Exact, near (within source) and cross-source dedup of the documents of ``docs``
    (module doc), holding per-document state in columns only.

    ``docs`` has ``doc_key``, ``source``, ``path``, ``license_class``, ``content_sha256``
    (strings, no nulls) and ``source_order`` (int); one row per document, any order (rows
    already in keep order, see :func:`keep_order_indices`, are not copied). ``sig`` is
    ``uint32[n, num_perm]`` aligned with the rows (None: every signature computed);
    ``have_sig`` ``bool[n]`` marks the rows whose signature is given (default all): the
    others are computed from their texts and written into ``sig`` in place when the rows
    are in keep order. ``cross_pairs`` ``int[m, 2]`` are cross-source candidate pairs as
    row indices of ``docs`` (None: computed from ``sig``). ``load_texts(doc_keys)`` yields
    ``(doc_key, text)`` for the records whose signature is missing or that are in a
    candidate pair whose estimate reaches the threshold (the exact-Jaccard check keeps
    their shingle-hash sets, ``uint32`` each, not the texts).

    Memory per document: the signature row (4 bytes per permutation), the arrow strings,
    and about a hundred bytes of numpy columns (keep order, codes, kind, twin, Jaccard);
    the LSH index is built one band at a time (8 + 8 bytes per document). Returns
    :class:`DedupTables`; decisions equal those of :func:`deduplicate` on the same records.

    Raises ``ValueError`` on a duplicate ``doc_key``, a ``license_class`` not in
    :data:`LICENSE_RANK`, a null ``content_sha256``, ``num_perm < CROSS_NUM_PERM``, a
    ``sig`` or ``cross_pairs`` of the wrong shape or range, texts needed without
    ``load_texts`` or a loader that misses some; ``UnicodeEncodeError`` for a text holding
    lone surrogates.
    """
    n = docs.num_rows
    keys = docs.column("doc_key")
    if n and pc.count_distinct(keys).as_py() != n:
        dup = np.flatnonzero(_first_of_code(_codes(keys)) != np.arange(n))[0]
        raise ValueError(f"duplicate doc_key {keys[int(dup)].as_py()!r}")
    perm = keep_order_indices(docs)
    if num_perm < CROSS_NUM_PERM:
        raise ValueError(f"num_perm must be >= {CROSS_NUM_PERM} for the cross-source pass, got {num_perm}")
    if docs.column("content_sha256").null_count:
        raise ValueError("content_sha256 has nulls")
    in_order = bool(np.array_equal(perm, np.arange(n)))
    cols = {c: (docs.column(c) if in_order else docs.column(c).take(pa.array(perm))).combine_chunks()
            for c in ("doc_key", "source", "content_sha256")}
    keys = cols["doc_key"]
    if sig is None:
        sig, have = np.empty((n, num_perm), dtype=np.uint32), np.zeros(n, dtype=bool)
    else:
        sig = np.asarray(sig, dtype=np.uint32)
        if sig.shape != (n, num_perm):
            raise ValueError(f"signatures of shape {sig.shape}, expected ({n}, {num_perm})")
        have = np.ones(n, dtype=bool) if have_sig is None else np.asarray(have_sig, dtype=bool)
        if not in_order:
            sig, have = sig[perm], have[perm]

    def texts_of(idx: Sequence[int]) -> Iterator[tuple[int, str]]:
        """``(index, text)`` of the records ``idx`` (keep order), from the loader."""
        if not len(idx):
            return
        if load_texts is None:
            raise ValueError(f"texts of {len(idx)} records are needed, first {keys[int(idx[0])].as_py()}, "
                             "and no text loader was given")
        want = dict(zip(take_rows(keys, np.asarray(idx, dtype=np.int64)).to_pylist(), idx))
        for key, text in load_texts(set(want)):
            if key in want:
                yield want.pop(key), text
        if want:
            raise ValueError(f"the text loader did not return {len(want)} records, first {next(iter(want))}")

    missing = np.flatnonzero(~have).tolist()
    if missing:
        got = dict(texts_of(missing))
        sig[missing] = mh.signatures([got.pop(i) for i in missing], num_perm=num_perm, seed=seed, k=shingle_k)
    empty = mh.is_empty(sig)
    src = _codes(cols["source"])
    sha = _codes(cols["content_sha256"])

    def verify(pairs: np.ndarray) -> np.ndarray:
        return passes.verify_pairs(pairs, texts_of, threshold, shingle_k, VERIFY_BLOCK_RECORDS)

    # Pass 1, exact: twin[i] is the index (keep order) of the record i was dropped for.
    twin = _first_of_code(sha)
    kind = np.where(twin != np.arange(n), EXACT, KEPT).astype(np.int8)
    twin[kind == KEPT] = -1

    # Pass 2, near within a source (the xl snapshot has 3.6 M candidate pairs; only those
    # whose estimate reaches the threshold are held).
    b, r_ = near_lsh_params(threshold, num_perm)
    near_candidates, near_rejected = passes.near_pass(sig, kind, twin, empty, threshold, b, r_, group=src,
                                                      verify=verify if verify_exact else None)

    # Pass 3, cross-source: union-find over confirmed candidate pairs among survivors.
    if cross_pairs is None:
        cand = cross_source_candidates(sig, src)
    else:
        cp = np.asarray(cross_pairs, dtype=np.int64).reshape(-1, 2)
        if len(cp) and (cp.min() < 0 or cp.max() >= n):
            raise ValueError(f"cross_pairs name rows outside [0, {n})")
        if not in_order:
            inv = np.empty(n, dtype=np.int64)
            inv[perm] = np.arange(n)
            cp = inv[cp]
        cand = mh.merge_pairs([np.sort(cp, axis=1)])
        cand = cand[src[cand[:, 0]] != src[cand[:, 1]]] if len(cand) else cand

    def cross_rows(idx: np.ndarray) -> np.ndarray:
        return sig[idx, :CROSS_NUM_PERM]

    cross = passes.cross_pass(cand, kind, twin, (kind == KEPT) & ~empty, cross_rows, threshold,
                              verify if verify_exact else None)

    # Resolve every drop to a kept record and estimate its Jaccard to it (1.0 for a
    # byte-identical copy).
    dropped, same = passes.resolve(kind, twin)
    jac = np.full(n, np.nan)
    jac[dropped[same]] = 1.0
    rest = dropped[~same]
    jac[rest] = mh.estimate_jaccard(sig, rest, twin[rest])

    decisions, clusters, cluster_figures = build_tables(keys, cols["source"], cols["content_sha256"], kind, twin, jac)
    exact_removed, near_removed, cross_removed = (int((kind == k).sum()) for k in (EXACT, NEAR, CROSS))
    rate = (lambda x: round(x / n, 6)) if n else (lambda x: 0.0)
    near_rep, cross_rep = _lsh_report(b, r_), _lsh_report(CROSS_BANDS, CROSS_ROWS)
    figures = {
        "files_in": n,
        "exact_removed": exact_removed,
        "near_removed": near_removed,
        "cross_source_removed": cross_removed,
        "files_out": n - exact_removed - near_removed - cross_removed,
        "exact_removal_rate": rate(exact_removed),
        "near_removal_rate": rate(near_removed),
        "cross_source_removal_rate": rate(cross_removed),
        "clusters": cluster_figures["clusters"],
        "num_perm": num_perm,
        "threshold": threshold,
        "shingle_k": shingle_k,
        "lsh_bands": b,
        "lsh_rows": r_,
        "effective_threshold": near_rep["effective_threshold"],
        "candidate_probability": near_rep["candidate_probability"],
        "near_candidate_pairs": near_candidates,
        "near_rejected_by_exact": near_rejected,
        "verify_exact": verify_exact,
        "cross_num_perm": CROSS_NUM_PERM,
        "cross_lsh_bands": CROSS_BANDS,
        "cross_lsh_rows": CROSS_ROWS,
        "cross_effective_threshold": cross_rep["effective_threshold"],
        "cross_candidate_probability": cross_rep["candidate_probability"],
        "cross_candidate_pairs": cross["candidate_pairs"],
        "cross_confirmed_pairs": cross["confirmed_pairs"],
        "cross_rejected_by_exact": cross["rejected"],
        "cross_source_clusters": cross["clusters"],
        "cross_source_below_threshold": cross["below_threshold"],
        "largest_clusters": cluster_figures["largest_clusters"],
    }
    return DedupTables(decisions, clusters, figures)


def deduplicate(
    records: Sequence[DedupRecord],
    num_perm: int = 128,
    threshold: float = 0.7,
    shingle_k: int = 5,
    seed: int = 1,
    signatures: Mapping[str, np.ndarray] | None = None,
    cross_pairs: Sequence[tuple[str, str]] | None = None,
    verify_exact: bool = True,
    load_texts: Callable[[set[str]], Iterator[tuple[str, str]]] | None = None,
) -> DedupResult:
    """Exact, near (within source) and cross-source dedup of ``records`` (module doc):
    :func:`deduplicate_columns` on the records' columns, for callers holding records.

    Defaults are the SPEC §4 figures: 128 permutations, Jaccard 0.7, 5-token shingles;
    the cross-source pass uses the first 112 signature values as 14 × 8 bands.
    ``signatures`` optionally maps ``doc_key`` to a precomputed ``uint32[num_perm]``
    signature (the per-revision ``minhash_signatures`` asset); missing ones are computed.
    ``cross_pairs`` optionally gives the cross-source candidate pairs as doc_key pairs
    (the merged band-range steps); pairs naming unknown keys are ignored. The result
    depends only on the set of records (and pairs), not their order.

    With ``verify_exact`` (default), a pair confirmed by the MinHash estimate is dropped
    or merged only when the exact Jaccard of the two sets of 32-bit shingle hashes is
    also ≥ ``threshold`` (the false-positive check of candidate-verification dedup
    pipelines): the estimate's standard error is √(J(1−J)/p) ≈ 0.04 at J = 0.7,
    p = 128, so without it pairs at J ≈ 0.65 would be dropped. Rejections are counted in
    ``near_rejected_by_exact`` and ``cross_rejected_by_exact``.

    ``load_texts(doc_keys)`` yields ``(doc_key, text)`` for the records given without
    text: only those whose signature is missing, or that are in a candidate pair whose
    estimate reaches the threshold. Records without text must carry ``content_sha256``.

    Raises ``ValueError`` on a duplicate ``doc_key``, a ``license_class`` not in
    :data:`LICENSE_RANK`, ``num_perm < CROSS_NUM_PERM`` or a precomputed signature of the
    wrong shape; ``UnicodeEncodeError`` for a text holding lone surrogates.
    """
    for r in records:
        if r.text is None and (r.content_sha256 is None or load_texts is None):
            raise ValueError(f"{r.doc_key}: no text, and no content_sha256 and text loader to stand in for it")
    docs = pa.table({
        "doc_key": pa.array([r.doc_key for r in records], pa.string()),
        "source": pa.array([r.source for r in records], pa.string()),
        "source_order": pa.array([r.source_order for r in records], pa.int64()),
        "path": pa.array([r.path for r in records], pa.string()),
        "license_class": pa.array([r.license_class for r in records], pa.string()),
        "content_sha256": pa.array([r.content_sha256 or hashlib.sha256(r.text.encode("utf-8")).hexdigest()
                                    for r in records], pa.string()),
    })
    n = len(records)
    sig, have = np.empty((n, num_perm), dtype=np.uint32), np.zeros(n, dtype=bool)
    for i, r in enumerate(records if signatures is not None else ()):
        got = signatures.get(r.doc_key)
        if got is not None:
            got = np.asarray(got, dtype=np.uint32)
            if got.shape != (num_perm,):
                raise ValueError(f"{r.doc_key}: signature shape {got.shape}, expected ({num_perm},)")
            sig[i], have[i] = got, True
    pairs = None
    if cross_pairs is not None:
        row = {r.doc_key: i for i, r in enumerate(records)}
        pairs = np.array([(row[a], row[b]) for a, b in cross_pairs if a in row and b in row], np.int64).reshape(-1, 2)
    given = {r.doc_key: r.text for r in records if r.text is not None}

    def texts(keys: set[str]) -> Iterator[tuple[str, str]]:
        rest = {k for k in keys if k not in given}
        yield from ((k, given[k]) for k in sorted(keys) if k in given)
        if rest:
            yield from load_texts(rest)

    out = deduplicate_columns(docs, sig, have, pairs, num_perm=num_perm, threshold=threshold, shingle_k=shingle_k,
                              seed=seed, verify_exact=verify_exact, load_texts=texts)
    return DedupResult(decisions=out.decisions.to_pylist(), figures=out.figures, clusters=out.clusters.to_pylist())


def raw_source_records(manifest, cache, names: Sequence[str] | None = None) -> list[DedupRecord]:
    """C/C++ files of a manifest's sources read straight from their (cached) archives, as
    ``DedupRecord``s with class ``permissive`` — no quality, license or scrub stage — for
    benchmarks and corpus-level tests. ``names`` restricts to those sources; files that
    are not valid UTF-8 are skipped. Order: manifest order, then archive order."""
    from . import acquire

    out = []
    for src in manifest.sources:
        if names is not None and src.name not in names:
            continue
        for path, data in acquire.acquire_source(src, cache).files:
            if acquire.language_of(path) is None:
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            out.append(DedupRecord(f"{src.name}/{path}", src.name, src.order, path, "permissive", text))
    return out
