"""Parse and enrich a pass's files ahead, in a worker waiting for the pass to start.

``megacpp run`` starts the workers of its second pass while its own process trains the
snapshot tokenizer (:mod:`megacpp_assets.snapshot_run`), which keeps about one core and a
half busy for several seconds: the workers would wait idle for their first chunk step.
The chunk stage's tree-sitter parse and enrichment of a file depend on its text and
stage-1 language alone (:func:`megacpp_core.chunk.parse_source`,
:func:`megacpp_core.enrich.enrich_file`), not on the tokenizer; only the splitting needs
it. So each waiting worker runs :func:`parse_ahead` on a thread of its own (at the
worker's low priority): the scrubbed files of the pass's shards, in the order the shards
will run, parsed and enriched into :data:`megacpp_core.memo.PARSED_AHEAD` under the
shard's partition key, until the memo is full (:data:`~megacpp_core.memo.MAX_AHEAD_BYTES`)
or the worker is given its first unit (``stop``). The chunk stage of that shard then takes
each file's values (:func:`megacpp_core.stages.chunk.ahead_taker`) instead of computing them again; a file not made ahead
(or dropped by the dedup decisions, which the scrubbed rows do not reflect) is computed as
before, so the stage's outputs are the same either way. Every worker of the pass does this
for every shard, since which worker will run a shard is decided only when it runs (a
shard made ahead by a worker that does not run it costs that worker's idle time).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from . import catalog, chunk, memo
from .runner import InputRef
from .stage import Partition
from .storage import DataRoot

__all__ = ["parse_ahead"]


def parse_ahead(root: DataRoot, snapshot: str, shards: Sequence[tuple[str, str]], enriching: bool,
                stop: threading.Event) -> dict:
    """Parse (and, with ``enriching``, enrich) the scrubbed files of each ``(source, shard)``
    of ``shards`` of ``snapshot``, in that order, into :data:`megacpp_core.memo.PARSED_AHEAD`
    (scope: the shard's partition key; key: :func:`megacpp_core.memo.text_key`). Returns
    ``{"files", "shards", "seconds", "ended", "unreadable"}``: files made ahead, shards
    made whole, wall seconds, why it ended (``"done"``; ``"stopped"``: ``stop``, any
    object with ``is_set()``, was set, checked before each shard's read and each file;
    ``"full"``: the memo refused a value; ``"off"``: this process keeps nothing across
    steps; ``"error"``: a file's parse or enrichment raised, which the chunk stage meets
    again and reports), and the shards whose scrubbed rows could not be read (an
    ``OSError``/``ValueError`` of the storage or parquet reader; skipped). A text held
    already under its shard (the same file twice: the rows are not deduplicated yet) is
    skipped. Never raises: it only saves later work."""
    from . import enrich

    t0 = time.perf_counter()
    files = made = 0
    ended, unreadable = "done", []
    if not memo.across_steps():
        return {"files": 0, "shards": 0, "seconds": 0.0, "ended": "off", "unreadable": []}
    try:
        if stop.is_set():  # before any shard (also with none)
            ended = "stopped"
        for source, shard in shards if ended == "done" else ():
            if stop.is_set():
                ended = "stopped"
                break
            part = Partition(snapshot, source, shard)
            try:
                t = InputRef(root, catalog.SCRUBBED, part).read(columns=["text", "language"]).to_pydict()
            except (OSError, ValueError):
                unreadable.append(part.key)
                continue
            for text, language in zip(t["text"], t["language"]):
                if stop.is_set():
                    ended = "stopped"
                    break
                key = memo.text_key(language, text) if text else None
                if key is None or memo.PARSED_AHEAD.holds(part.key, key):
                    continue
                parsed = chunk.parse_source(text, language)
                fe = enrich.enrich_file(text, language, parsed) if enriching else None
                if not memo.PARSED_AHEAD.put(part.key, key, (parsed, fe)):
                    ended = "full"
                    break
                files += 1
            if ended != "done":
                break
            made += 1
    except Exception:  # noqa: BLE001 — the chunk stage computes the same file and reports its error
        ended = "error"
    return {"files": files, "shards": made, "seconds": round(time.perf_counter() - t0, 3), "ended": ended,
            "unreadable": unreadable}
