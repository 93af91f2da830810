"""ScanCode for the license stage: one index per process, a result store, an exact prefilter.

:func:`run_scancode` is the only place the license stage (:class:`megacpp_core.license.Scanner`)
calls ScanCode: ``scancode.api.get_licenses`` on a text written to a temporary file, its
answer trimmed to what the stage reads (:func:`trim`). Three ways it does less work, none of
which changes an answer:

- **One index per process.** ScanCode keeps its license index in a process global; the first
  call loads it (:func:`load`, timed in :data:`LOAD`) and every later call of the process,
  every shard and revision a Dagster run or a ``megacpp run --workers`` worker executes,
  reuses it. Nothing loads it while every answer comes from the store.
- **A result store** (:class:`ResultStore`): trimmed answers on local disk, one JSON file
  per text, keyed by the text's SHA-256 under a namespace naming the ScanCode distribution,
  its version and the index file it loaded (:func:`namespace`): another version or a
  rebuilt index reads another namespace. A file that does not parse, names another text or
  namespace, or has the wrong shape is a miss. Writes are atomic (``os.replace``), so
  concurrent workers never read half a file; a store that cannot be written is skipped.
- **An exact candidate prefilter** (:func:`install_prefilter`, ScanCode
  :data:`PREFILTER_VERSIONS` only): ScanCode's approximate matching ranks every one of its
  ~37k rules against each query run with Python set operations
  (``licensedcode.match_set.compute_candidates``); most rules fail its own length and
  containment filters, and of the rest only the best ``10 × top`` reach the next step. The
  prefilter counts each rule's token overlap with numpy over an inverted index and hands
  ScanCode's unchanged function only the rules that can pass its filters and can still rank
  in that top (:func:`_survivors`), as a view of the index holding those rules alone (so
  the function does not walk all ~37k to skip the others); the rules it drops are exactly
  rules that function would have discarded, so its result is the same list in the same order.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

#: Version of the stored answer's format (part of the namespace).
STORE_FORMAT = 1
#: ScanCode versions whose ``compute_candidates`` / ``compare_token_sets`` the prefilter
#: mirrors; any other version runs ScanCode's own function unchanged.
PREFILTER_VERSIONS = frozenset({"32.5.0"})
#: Seconds :func:`load` spent in this process (``None`` until it ran), of which building
#: the prefilter's tables, and the number of loads (1 once loaded).
LOAD: dict[str, Any] = {"seconds": None, "tables_seconds": None, "loads": 0}

_EPS = 1e-7


def scancode_version() -> str:
    """``name==version`` of the installed ScanCode distribution."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("scancode-toolkit-mini", "scancode-toolkit"):
        try:
            return f"{name}=={version(name)}"
        except PackageNotFoundError:
            continue
    import scancode_config

    return f"scancode=={scancode_config.__version__}"


def _index_file() -> Path:
    import scancode_config
    from licensedcode.cache import LICENSE_INDEX_DIR, LICENSE_INDEX_FILENAME

    return Path(scancode_config.licensedcode_cache_dir) / LICENSE_INDEX_DIR / LICENSE_INDEX_FILENAME


def namespace() -> str:
    """What a stored answer is valid for: the store format, ScanCode's distribution and
    version, and the index file ScanCode loads (path, size, modification time; ``none``
    before ScanCode built it). Any change reads and writes another namespace."""
    try:
        st = _index_file().stat()
        index = f"{_index_file()}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        index = "none"
    return f"format={STORE_FORMAT};{scancode_version()};index={index}"


def text_key(text: str) -> str:
    """SHA-256 of ``text`` (UTF-8; lone surrogates kept as their bytes)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def trim(result: dict) -> dict:
    """The part of a ``get_licenses`` result the license stage reads: the detected SPDX
    expression and, per detection, each match's coverage and SPDX expression."""
    return {
        "detected_license_expression_spdx": result.get("detected_license_expression_spdx"),
        "license_detections": [
            {"matches": [{"match_coverage": m.get("match_coverage"), "license_expression_spdx": m.get("license_expression_spdx")}
                         for m in d.get("matches") or ()]}
            for d in result.get("license_detections") or ()
        ],
    }


def _valid(result: Any) -> bool:
    if not isinstance(result, dict) or set(result) != {"detected_license_expression_spdx", "license_detections"}:
        return False
    if not isinstance(result["detected_license_expression_spdx"], (str, type(None))):
        return False
    dets = result["license_detections"]
    return isinstance(dets, list) and all(
        isinstance(d, dict) and set(d) == {"matches"} and isinstance(d["matches"], list) and all(
            isinstance(m, dict) and set(m) == {"match_coverage", "license_expression_spdx"}
            and isinstance(m["match_coverage"], (int, float, type(None))) and not isinstance(m["match_coverage"], bool)
            and isinstance(m["license_expression_spdx"], (str, type(None))) for m in d["matches"])
        for d in dets)


class ResultStore:
    """Trimmed ScanCode answers on local disk (see the module docstring).

    ``directory``: the store's root; answers live in
    ``directory/<sha256 of the namespace>[:16]/<key[:2]>/<key>.json``. ``ns``: the namespace
    (default :func:`namespace`). ``hits`` / ``misses`` / ``errors`` count reads and
    failed writes.
    """

    def __init__(self, directory: str | os.PathLike, ns: str | None = None):
        self.ns = ns if ns is not None else namespace()
        self.root = Path(directory)
        self.dir = self.root / hashlib.sha256(self.ns.encode()).hexdigest()[:16]
        self.hits = self.misses = self.errors = 0

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, text: str) -> dict | None:
        """The stored answer for ``text``, or ``None`` (a miss) when there is none or it is
        not exactly an answer for this text and namespace."""
        key = text_key(text)
        try:
            rec = json.loads(self._path(key).read_text(encoding="utf-8"))
            ok = (isinstance(rec, dict) and rec.get("ns") == self.ns and rec.get("sha256") == key
                  and _valid(rec.get("result")))
        except (OSError, ValueError):
            ok = False
        if not ok:
            self.misses += 1
            return None
        self.hits += 1
        return rec["result"]

    def put(self, text: str, result: dict) -> None:
        """Store ``result`` (a :func:`trim` answer) for ``text``; atomic, never raises on I/O."""
        key = text_key(text)
        path = self._path(key)
        data = json.dumps({"ns": self.ns, "sha256": key, "result": result}, sort_keys=True)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:8]}-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            self.errors += 1


def load() -> float:
    """Load ScanCode's license index into this process, with the modules ``get_licenses``
    imports on its first call, and install the prefilter with its tables; once per process
    (later calls return 0 at once). Returns the seconds this call spent.

    The index is unpickled with the garbage collector off (its earlier state restored
    after) and its objects are then frozen out of later collections (``gc.freeze``), as
    :mod:`megacpp_assets.fork_preload` does with the fork server's imports. The unpickling
    makes about 1.4 million objects (37,542 rules, their postings and token sets) and no
    garbage: with the collector on, the collections their allocations trigger walk ever
    more of them, 3.8–4.0 s of the load against 1.6–1.8 s with it off (ScanCode 32.5.0's
    413 MB index, measured here); and left unfrozen, the next collections of the process
    would walk all of them again (0.5 s a full collection), though the index lives as
    long as the process. Freezing also keeps whatever garbage cycles exist at that moment
    until the process ends (reference counting still frees the rest). When the index file
    does not exist yet, ScanCode builds it (minutes, once per install): the collector
    stays on for that."""
    if LOAD["seconds"] is not None:
        return 0.0
    t0 = time.perf_counter()
    import packagedcode.utils  # noqa: F401  (imported by get_licenses on its first call)
    import scancode.api  # noqa: F401
    from licensedcode.cache import get_index

    enabled = gc.isenabled()
    if _index_file().is_file():
        gc.disable()
    try:
        idx = get_index()
        gc.freeze()
    finally:
        if enabled:
            gc.enable()
    t1 = time.perf_counter()
    if install_prefilter():
        _tables(idx)
    LOAD["seconds"], LOAD["tables_seconds"] = time.perf_counter() - t0, time.perf_counter() - t1
    LOAD["loads"] += 1
    return LOAD["seconds"]


def run_scancode(text: str) -> dict:
    """ScanCode's trimmed answer (:func:`trim`) for ``text`` (loading the index first if needed)."""
    load()
    from scancode.api import get_licenses

    fd, tmp = tempfile.mkstemp(suffix=".txt")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return trim(get_licenses(tmp))
    finally:
        os.unlink(tmp)


# -- the exact candidate prefilter ----------------------------------------------------

_ORIGINAL: dict[str, Any] = {}
_TABLES: dict[int, dict] = {}


def _prefilter_on() -> bool:
    from licensedcode import match_set

    return "compute_candidates" in _ORIGINAL and match_set.compute_candidates is _compute_candidates


def install_prefilter(on: bool = True) -> bool:
    """Route ``licensedcode.match_set.compute_candidates`` through the prefilter (``on``) or
    back to ScanCode's own function. Only for :data:`PREFILTER_VERSIONS`; returns whether the
    prefilter is on."""
    from licensedcode import match_set

    if "compute_candidates" not in _ORIGINAL:
        _ORIGINAL["compute_candidates"] = match_set.compute_candidates
    on = on and scancode_version().split("==")[-1] in PREFILTER_VERSIONS
    match_set.compute_candidates = _compute_candidates if on else _ORIGINAL["compute_candidates"]
    return on


def _tables(idx) -> dict:
    """Per-index numpy tables: an inverted index token -> rules and each rule's filter figures."""
    import numpy as np

    t = _TABLES.get(id(idx))
    if t is not None and t["sets"] is idx.sets_by_rid:
        return t
    sets, rules = idx.sets_by_rid, idx.rules_by_rid
    n = len(sets)
    lengths = np.zeros(n, dtype=np.int64)
    parts = []
    for rid, s in enumerate(sets):
        if s:
            parts.append(np.array(s.tolist(), dtype=np.int64))
            lengths[rid] = len(parts[-1])
    tok = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    rows = np.repeat(np.arange(n, dtype=np.int64), lengths)[np.argsort(tok, kind="stable")]
    vocab = max(len(idx.dictionary), int(tok.max()) + 1 if len(tok) else 0)
    t = {
        "sets": sets, "n": n, "vocab": vocab, "rows": rows, "legalese": idx.len_legalese,
        "ptr": np.concatenate([[0], np.cumsum(np.bincount(tok, minlength=vocab))]),
        # compare_token_sets drops a rule without a high (legalese) match, below these
        # lengths or below its minimum containment
        "min_high": np.maximum([r.get_min_high_matched_length(True) for r in rules], 1),
        "min_len": np.maximum([r.get_min_matched_length(True) for r in rules], 1),
        "length": np.array([r.get_length(True) for r in rules], dtype=np.float64),
        "min_cont": np.array([r._minimum_containment or 0.0 for r in rules], dtype=np.float64),
    }
    _TABLES.clear()
    _TABLES[id(idx)] = t
    return t


def _overlap(t: dict, tids):
    """Per rule: how many of the token ids ``tids`` its token set holds."""
    import numpy as np

    if not len(tids):
        return np.zeros(t["n"], dtype=np.int64)
    ptr, rows = t["ptr"], t["rows"]  # each token's rules: one slice of the inverted index, copied once
    return np.bincount(np.concatenate([rows[s:e] for s, e in zip(ptr[tids].tolist(), ptr[tids + 1].tolist())]),
                       minlength=t["n"])


def _grid(x):
    """Bounds, in tenths, of ``round(x, 1)`` for each value of ``x`` (float64 error margin)."""
    import numpy as np

    return np.floor(x * 10 - _EPS).astype(np.int64), np.ceil(x * 10 + _EPS).astype(np.int64)


def _survivors(t: dict, qset, matchable, top: int, high_resemblance: bool, threshold: float) -> list[int]:
    """Rule ids (of ``matchable``) that ``compute_candidates`` may keep after its step 1:

    1. the rules ``compare_token_sets`` does not discard: a high-token overlap of at least
       ``max(1, min_high_matched_length_unique)``, an overlap of at least
       ``max(1, min_matched_length_unique)``, and a containment (overlap / unique length)
       not below the rule's minimum containment (compared with a margin: a rule this close
       is kept and ScanCode decides);
    2. with ``high_resemblance``, those whose rounded resemblance can reach ``threshold``;
       otherwise those that can still rank among the ``10 × top`` best: a rule is dropped
       only when at least ``10 × top`` rules that certainly pass (1) are certainly above it —
       the lowest value their rounded score vector (``is_highly_resemblant``,
       ``containment``, ``resemblance``², ``matched_length / 20``, each ``round(x, 1)``)
       can take is above the highest value the dropped rule's can take, compared in the
       order ScanCode sorts them. ScanCode keeps exactly its ``10 × top`` best, none of which
       is dropped, so its steps 2 and 3 see the same candidates in the same order.
    """
    import numpy as np

    tids = np.array(qset.tolist(), dtype=np.int64)
    tids = tids[tids < t["vocab"]]
    inter = _overlap(t, tids)
    high = _overlap(t, tids[tids < t["legalese"]])
    length, min_cont = t["length"], t["min_cont"]
    counted = (high >= t["min_high"]) & (inter >= t["min_len"]) & _matchable_mask(t, matchable)
    odd = counted & (length <= 0)  # never ranked here: ScanCode decides
    counted &= length > 0
    containment = inter / np.where(length > 0, length, 1)
    maybe = counted & ~(containment < min_cont - _EPS)
    sure = counted & ((min_cont == 0) | (containment >= min_cont + _EPS))
    rids = np.flatnonzero(maybe)
    matched, ulen = inter[rids].astype(np.float64), length[rids]
    resemblance = matched / (len(qset) + ulen - matched)
    r_lo, r_hi = _grid(resemblance)
    b_lo, b_hi = (r_lo / 10 >= threshold).astype(np.int64), (r_hi / 10 >= threshold).astype(np.int64)
    if high_resemblance:
        keep = b_hi > 0
    else:
        c_lo, c_hi = _grid(matched / ulen)
        a_lo, a_hi = _grid(resemblance ** 2)
        m_lo, m_hi = _grid(matched / 20)

        def code(b, c, a, m):  # the lexicographic order of (b, c, a, m) as one integer
            return (((b * 64 + c + 8) * 64 + a + 8) << 40) + m + 8

        lows = np.sort(code(b_lo, c_lo, a_lo, m_lo)[sure[rids]])
        above = len(lows) - np.searchsorted(lows, code(b_hi, c_hi, a_hi, m_hi), side="right")
        keep = above < top * 10
    return sorted(rids[keep].tolist() + np.flatnonzero(odd).tolist())


def _matchable_mask(t: dict, matchable):
    """``matchable`` (a set of rule ids) as a boolean mask over the rules."""
    import numpy as np

    ids = np.fromiter(matchable, dtype=np.int64, count=len(matchable))
    mask = np.zeros(t["n"], dtype=bool)
    mask[ids[(ids >= 0) & (ids < t["n"])]] = True
    return mask


class _Rules:
    """What ``compute_candidates`` reads of a license index (``len_legalese`` and the
    per-rule ``rules_by_rid``, ``sets_by_rid``, ``msets_by_rid``), for the rules ``rids``
    alone (ascending ids of ``idx``), renumbered ``0..len(rids) - 1`` in the same order."""

    __slots__ = ("len_legalese", "rules_by_rid", "sets_by_rid", "msets_by_rid")

    def __init__(self, idx, rids: list[int]):
        self.len_legalese = idx.len_legalese
        self.rules_by_rid = [idx.rules_by_rid[r] for r in rids]
        self.sets_by_rid = [idx.sets_by_rid[r] for r in rids]
        self.msets_by_rid = [idx.msets_by_rid[r] for r in rids]


def _compute_candidates(query_run, idx, matchable_rids, top=50, high_resemblance=False,
                        high_resemblance_threshold=0.8, _use_bigrams=False):
    """``licensedcode.match_set.compute_candidates`` over the rules :func:`_survivors` keeps.

    ScanCode's function walks every rule of the index (about 37k) to skip those not in
    ``matchable_rids``; it is given a view of the kept rules instead (:class:`_Rules`),
    renumbered in ascending order. Inside it a rule id only indexes the view's per-rule
    lists and breaks ties between equal score vectors in its sorts, and the renumbering
    keeps the ids' order, so the answer is the same list in the same order; its rule ids
    are mapped back, since its caller indexes the whole index's tables with them."""
    original = _ORIGINAL["compute_candidates"]
    if _use_bigrams:
        return original(query_run, idx, matchable_rids, top, high_resemblance, high_resemblance_threshold, _use_bigrams)
    from licensedcode.match_set import build_set_and_mset

    qset, _ = build_set_and_mset(query_run.matchable_tokens(), _use_bigrams=False)
    kept = _survivors(_tables(idx), qset, matchable_rids, top, high_resemblance, high_resemblance_threshold)
    got = original(query_run, _Rules(idx, kept), range(len(kept)), top, high_resemblance, high_resemblance_threshold,
                   _use_bigrams)
    return [(scores, kept[rid], rule, inter) for scores, rid, rule, inter in got]
