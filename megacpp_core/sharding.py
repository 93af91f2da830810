"""The shard dimension: how a repo revision splits into bounded, deterministic shards.

A revision of ``B`` bytes (the sum of its files' sizes, as acquired) splits into
``n = max(1, ceil(B / shard_bytes))`` shards (``settings.shard_bytes``, default 64 MiB:
the order of datatrove's and NeMo Curator's default input partitions). A file belongs to
shard ``int(sha256(path)[:16], 16) mod n``: a stable hash of its path inside the revision,
so the same revision and setting always give the same shards, on any machine and in any
order of work. Shard keys are zero-padded (``000`` … ``999``), so they sort as numbers.

The acquire stage writes one ``source_files`` table per shard and the revision's
**shard plan** (``revisions/SOURCE/shards.json``): the count, the setting, and per shard its
file count and bytes. Every per-document stage then runs per revision × shard; a reader
of a shard-scoped dataset (a snapshot-wide step) finds a revision's shards in its plan
(:func:`shard_keys`). A partition whose shard index is at or beyond its revision's count
(the shard axis of the Dagster grid is shared by every revision) holds no file: the
runner records it as empty and writes nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

#: Number of digits of a shard key (``000``); at most 10**SHARD_DIGITS shards per revision.
SHARD_DIGITS = 3
MAX_SHARDS = 10 ** SHARD_DIGITS


class ShardPlanError(ValueError):
    """A shard plan is missing, malformed or inconsistent with the setting that made it."""


def shard_key(i: int) -> str:
    """The partition key of shard ``i`` (``0 -> "000"``); raises ``ValueError`` out of range."""
    if not 0 <= i < MAX_SHARDS:
        raise ValueError(f"shard index {i} outside [0, {MAX_SHARDS})")
    return f"{i:0{SHARD_DIGITS}d}"


def shard_index(key: str) -> int:
    """The index of shard key ``key`` (``"007" -> 7``); raises ``ValueError`` when malformed."""
    if len(key) != SHARD_DIGITS or not key.isdigit():
        raise ValueError(f"shard key {key!r} is not {SHARD_DIGITS} digits")
    return int(key)


def shard_count(total_bytes: int, shard_bytes: int) -> int:
    """``max(1, ceil(total_bytes / shard_bytes))``, at most :data:`MAX_SHARDS`.

    Raises ``ValueError`` for a non-positive ``shard_bytes`` or a revision that would need
    more than :data:`MAX_SHARDS` shards (raise ``shard_bytes``)."""
    if shard_bytes <= 0:
        raise ValueError(f"settings.shard_bytes must be positive, got {shard_bytes}")
    n = max(1, -(-int(total_bytes) // int(shard_bytes)))
    if n > MAX_SHARDS:
        raise ValueError(f"{total_bytes} bytes at shard_bytes={shard_bytes} need {n} shards (> {MAX_SHARDS}); "
                         "raise settings.shard_bytes")
    return n


def shard_of(path: str, n: int) -> int:
    """The shard (``0 <= s < n``) of the file at ``path`` (POSIX, inside the revision):
    the first 64 bits of its UTF-8 sha256, modulo ``n``."""
    return int(hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()[:16], 16) % n


def assign(paths: Sequence[str], sizes: Sequence[int], shard_bytes: int) -> tuple[int, list[int]]:
    """``(n, shard of each path)`` for a revision whose files are ``paths`` with ``sizes`` bytes."""
    n = shard_count(sum(int(s) for s in sizes), shard_bytes)
    return n, [shard_of(p, n) for p in paths]


def plan(source: str, revision: str, shard_bytes: int, n: int, files: Sequence[int], nbytes: Sequence[int]) -> dict:
    """The JSON shard plan of a revision (see the module docstring)."""
    return {"source": source, "revision": revision, "shard_bytes": int(shard_bytes), "shards": n,
            "keys": [shard_key(i) for i in range(n)],
            "files": [int(x) for x in files], "bytes": [int(x) for x in nbytes]}


def shard_keys(plan_json: dict) -> list[str]:
    """The shard keys of a plan; raises :class:`ShardPlanError` when the plan is malformed."""
    try:
        n = int(plan_json["shards"])
        keys = [shard_key(i) for i in range(n)]
    except (KeyError, TypeError, ValueError) as e:
        raise ShardPlanError(f"malformed shard plan {plan_json!r:.200}: {e}") from e
    if plan_json.get("keys") not in (None, keys):
        raise ShardPlanError(f"shard plan keys {plan_json.get('keys')} do not match its count {n}")
    return keys


#: Figures that are the largest value of any shard, not a sum.
MAX_PREFIXES = ("max_", "largest_", "longest_")
#: Figures every shard reports alike (settings, versions, sizes of a fixed layout): the
#: first shard's value stands.
SAME = frozenset({"budget_tokens", "vocab_size", "row_length", "num_perm", "shingle_k", "shard_bytes", "source",
                  "tokenizer_sha256", "enrichment_version", "ast_node_type_map", "ast_node_type_map_sha256",
                  "platform_vocabulary", "platform_vocabulary_sha256", "vocabulary", "vocabulary_sha256", "labels"})
#: Rates recomputed from the merged counts: ``{figure: (numerator, denominator, digits)}``.
RATIOS = {"brace_fallback_rate": ("brace_fallback_files", "files", 4),
          "bytes_per_token": ("text_bytes", "tokens", 4),
          "mean_labels_per_document": ("labels_assigned", "documents", 4),
          "mb_per_cpu_second": ("bytes", None, 3)}


def merge_figures(parts: list[dict], _top: bool = True) -> dict:
    """The figures of a revision's (or a snapshot's) shards as one.

    Numbers add up, except: names in :data:`SAME` keep the first shard's value; names
    starting with one of :data:`MAX_PREFIXES` take the largest; names ending in ``_share``
    (a number or a dict of numbers) are the mean over the parts weighted by each part's
    ``tokens`` figure (1 when absent); the rates of
    :data:`RATIOS` are recomputed from the merged counts (``mb_per_cpu_second`` from the
    bytes and the summed ``wall_seconds``); ``agreement_rate`` (DEP-5) from the merged
    agreement counts. Dicts merge key by key (recursively, where the ``_share`` rule does
    not apply: a nested name such as ``rejected.encoded_share`` is a count of the filter
    of that name), lists concatenate, booleans and anything else keep the first shard's
    value. ``parts`` is not modified.
    """
    out: dict = {}
    for p in parts:
        for k, v in p.items():
            if k not in out:
                out[k] = v if not isinstance(v, dict) else merge_figures([v], _top=False)
            elif isinstance(v, bool) or v is None or k in SAME:
                continue
            elif isinstance(v, (int, float)) and isinstance(out[k], (int, float)):
                out[k] = max(out[k], v) if k.startswith(MAX_PREFIXES) else out[k] + v
            elif isinstance(v, dict) and isinstance(out[k], dict):
                out[k] = merge_figures([out[k], v], _top=False)
            elif isinstance(v, list) and isinstance(out[k], list):
                out[k] = out[k] + v
    if len(parts) > 1:
        for k in [k for k in out if k.endswith("_share") and _top]:
            got = [(p[k], p.get("tokens") or 1) for p in parts if k in p and p[k] is not None]
            total = sum(w for _, w in got) or 1
            if all(isinstance(v, dict) for v, _ in got):
                names = list(dict.fromkeys(n for v, _ in got for n in v))
                out[k] = {n: round(sum(v.get(n, 0) * w for v, w in got) / total, 4) for n in names}
            elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v, _ in got):
                out[k] = round(sum(v * w for v, w in got) / total, 4)
        for k, (num, den, digits) in RATIOS.items():
            if k not in out or not isinstance(out.get(num), (int, float)):
                continue
            if den is None:  # a throughput: MB over the summed compute seconds
                secs = out.get("wall_seconds") or 0
                out[k] = round(out[num] / 1e6 / secs, digits) if secs else None
            else:
                d = out.get(den) or 0
                out[k] = round(out[num] / d, digits) if d else 0.0
    if "agreement_rate" in out and isinstance(out.get("agreement"), dict):
        a, n = out["agreement"], out.get("compared") or 0
        out["agreement_rate"] = round((a.get("agree", 0) + a.get("same_class", 0)) / n, 4) if n else None
    return out
