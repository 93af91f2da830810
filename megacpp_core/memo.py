"""Values computed from whole texts, handed from one stage to a later one in the same process.

Two stages of one Dagster step (one process; in production one pod) sometimes compute the
same thing from the same texts. :class:`TextMemo` holds such values from the first stage
for the second: keyed by a scope (the tokenizer, the revision) and the text itself (a dict
lookup: the text's hash, then a comparison of equal texts), taken once, within a size
limit (a value beyond it is not held, and the later stage computes it again). A stage that
runs alone, in another process or pod, finds the memo empty and computes as before; the
values are those it would compute, so the outputs are the same either way.

Memos in use:

* :data:`megacpp_core.ids_memo.MEMO`: the chunk stage's whole-file token ids, for the
  tokenize stage (step ``chunk__tokenize__…``).
* :data:`PARSED`: the ``p3_repo`` stage parses every file of a revision for its
  ``#include`` lines (:func:`megacpp_core.repo_documents.include_spellings`); the
  ``p4_structure`` stage then enriches every file (:func:`megacpp_core.enrich.enrich_file`),
  which parses it again. p3 keeps each :class:`~megacpp_core.chunk.ParsedSource` here and
  p4 takes it (step ``repo_documents__structure_documents``): one tree-sitter parse per
  file instead of two (about 1.25 s of the 4.8 s p4 took on ``default``).

A step that runs several stages empties every memo when it ends (:func:`clear_all`).

**Ahead of a pass.** :data:`PARSED_AHEAD` holds each file's parse and enrichment made by
a worker of the next pass while it waits for that pass (``megacpp run`` starts it during
the tokenizer's training, which leaves a core idle): :mod:`megacpp_core.parse_ahead`. The
chunk stage takes them instead of parsing and enriching the file; it is a
:class:`ScopedMemo` (the same key, the shard's partition key as scope) and is filled only
where values are kept across steps.

**Across steps.** Two more values of a file are kept longer, in a :class:`ScopedMemo`, by a
process that runs many steps one after another (``megacpp run``'s workers switch this on
with :func:`keep_across_steps`; a step run alone, by the Dagster UI's executor or in its
own pod, never puts anything there). The chunk stage (a revision's shard, step
``chunk__tokenize__…``) parses and enriches every kept file; the same revision's
``p3_repo`` and ``p4_structure`` stages (step ``repo_documents__structure_documents``,
which starts once every shard of the revision is chunked) parse every file again, for
its ``#include`` lines and for the same enrichment. When the chunk stage ran in this
process, it leaves:

* :data:`FILE_INCLUDES`: each file's ``#include`` spellings
  (:func:`megacpp_core.repo_documents.include_spellings`), which ``p3_repo`` takes
  instead of parsing the file;
* :data:`FILE_ENRICHMENT`: each file's :class:`~megacpp_core.enrich.FileEnrichment`
  (:func:`megacpp_core.enrich.enrich_file`, its planes read-only), which ``p4_structure``
  takes instead of enriching it again.

Both are pure functions of the file's text and stage-1 language, the memo's key (the
language and the text's sha256, :func:`text_key`: no text is kept alive), so a value
taken is the one the later stage would compute. The scope is the revision's partition
key: ``p3_repo`` and ``p4_structure`` drop what their revision left when they end, and a
put that would pass the memo's limit first drops the oldest other revisions (a revision
whose later step ran in another worker). In ``megacpp run`` a revision's later step is
released when its last chunk step ends, and a worker is given a unit only when it is
free, so the step mostly goes to the worker that has just chunked the revision; a miss
costs only the work done again.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Callable
from typing import Any

#: Bytes of parses :data:`PARSED` holds at most, as :func:`parsed_bytes` estimates them
#: (192 MiB: about 9 M characters of ASCII code). A revision with more keeps its first
#: files' parses.
MAX_PARSED_BYTES = 192 << 20
#: Bytes a tree-sitter tree and its source take per UTF-8 byte of source (22.4 measured:
#: ``default``'s 762 scrubbed files, 10.66 M characters, 239 MB more resident once parsed).
TREE_BYTES_PER_BYTE = 22


#: Every memo of this process (:func:`clear_all`).
_ALL: weakref.WeakSet[TextMemo] = weakref.WeakSet()


class TextMemo:
    """``{text: value}`` under one scope, at most ``limit`` in ``size(value)`` units (see the
    module docstring). Thread-safe."""

    def __init__(self, limit: int, size: Callable[[Any], int]):
        self.limit, self.size = limit, size
        self._lock = threading.Lock()
        self._scope: str | None = None
        self._values: dict[str, Any] = {}
        self._used = 0
        _ALL.add(self)

    def begin(self, scope: str | None) -> None:
        """Start holding values of ``scope``; drops everything held."""
        with self._lock:
            self._scope, self._values, self._used = scope, {}, 0

    def put(self, scope: str, text: str, value: Any) -> bool:
        """Hold ``value`` computed from ``text`` under ``scope``; False (nothing held) for
        another scope than :meth:`begin`'s, a text held already, or beyond ``limit``."""
        with self._lock:
            n = self.size(value)
            if scope is None or scope != self._scope or self._used + n > self.limit or text in self._values:
                return False
            self._values[text] = value
            self._used += n
            return True

    def take(self, scope: str, text: str) -> Any:
        """The value held for ``text`` under ``scope`` (removed from the memo), or None."""
        with self._lock:
            if scope is None or scope != self._scope:
                return None
            value = self._values.pop(text, None)
            if value is not None:
                self._used -= self.size(value)
            return value

    def clear(self) -> None:
        """Drop everything held (the scope too)."""
        self.begin(None)

    def __len__(self) -> int:
        return len(self._values)


def parsed_bytes(parsed) -> int:
    """Estimated memory of a :class:`~megacpp_core.chunk.ParsedSource`: the tree and source
    (:data:`TREE_BYTES_PER_BYTE` per source byte) plus its byte-to-character map (8 bytes
    per source byte, non-ASCII text only)."""
    return TREE_BYTES_PER_BYTE * len(parsed.src) + (parsed.b2c.nbytes if parsed.b2c is not None else 0)


#: The process's parses of one revision's files, from p3 to p4 (module docstring); the
#: scope is the revision's partition key.
PARSED = TextMemo(MAX_PARSED_BYTES, parsed_bytes)


def clear_all() -> None:
    """Empty every step memo of this process (every :class:`TextMemo`: :data:`PARSED`,
    :data:`megacpp_core.ids_memo.MEMO`): called when a step that ran several stages ends,
    so nothing one of them handed on outlives the step (a stage that failed, or a later
    stage not selected, would otherwise leave it until the next step). The memos kept
    across steps (:class:`ScopedMemo`) are not emptied."""
    for m in list(_ALL):
        m.clear()


_ACROSS_STEPS = [False]


def keep_across_steps(on: bool = True) -> None:
    """Let (``on``) or stop the :class:`ScopedMemo` memos holding values in this process
    (module docstring: ``megacpp run``'s workers); stopping empties them."""
    _ACROSS_STEPS[0] = bool(on)
    if not on:
        FILE_INCLUDES.clear()
        FILE_ENRICHMENT.clear()
        PARSED_AHEAD.clear()


def across_steps() -> bool:
    """Whether this process keeps values across steps (:func:`keep_across_steps`)."""
    return _ACROSS_STEPS[0]


def text_key(language: str, text: str) -> tuple[str, bytes]:
    """The key of ``text`` of stage-1 ``language`` in a :class:`ScopedMemo`: the language and
    the sha256 of the text's UTF-8 (surrogates passed through), so a memo holds no text
    alive (0.8 ms a megabyte of code: 8.6 ms for ``default``'s 10.7 M characters)."""
    return language, hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class ScopedMemo:
    """``{(language, sha256 of text): value}`` (:func:`text_key`) for several scopes
    (revisions, or shards) at once, kept across steps while :func:`across_steps` holds, at most
    ``limit`` in ``size(value)`` units; each value is given once (:meth:`take` removes it).
    A put that would pass the limit drops whole scopes other than its own, oldest first,
    when that makes room; one that cannot fit even then (its own scope holds too much,
    or the value alone is over the limit) is refused and drops nothing. With
    ``evict=False`` a put never drops another scope: one that does not fit is refused
    (a memo filled in order of need keeps what it filled first). Thread-safe."""

    def __init__(self, limit: int, size: Callable[[Any], int], evict: bool = True):
        self.limit, self.size, self.evict = limit, size, evict
        self._lock = threading.Lock()
        self._scopes: dict[str, dict[tuple[str, bytes], tuple[Any, int]]] = {}  # oldest scope first
        self._scope_used: dict[str, int] = {}
        self._used = 0

    def put(self, scope: str, key: tuple[str, bytes], value: Any) -> bool:
        """Hold ``value`` under ``scope`` and ``key`` (:func:`text_key` of the text and
        language it was computed from); False (nothing held, nothing dropped) when this
        process does not keep values across steps, the key is held already, or the value
        does not fit."""
        if not across_steps() or scope is None:
            return False
        n = self.size(value)
        with self._lock:
            held = self._scopes.get(scope, {})
            if key in held or self._scope_used.get(scope, 0) + n > self.limit or (
                    not self.evict and self._used + n > self.limit):
                return False
            for old in [s for s in self._scopes if s != scope]:
                if self._used + n <= self.limit:
                    break
                self._drop(old)
            self._scopes.setdefault(scope, held)[key] = (value, n)
            self._scope_used[scope] = self._scope_used.get(scope, 0) + n
            self._used += n
            return True

    def holds(self, scope: str, key: tuple[str, bytes]) -> bool:
        """Whether a value is held for ``key`` under ``scope``."""
        with self._lock:
            return key in self._scopes.get(scope, {})

    def take(self, scope: str, key: tuple[str, bytes]) -> Any:
        """The value held for ``key`` under ``scope`` (removed), or None."""
        with self._lock:
            got = self._scopes.get(scope, {}).pop(key, None)
            if got is None:
                return None
            self._scope_used[scope] -= got[1]
            self._used -= got[1]
            return got[0]

    def drop(self, scope: str) -> None:
        """Drop everything held under ``scope``."""
        with self._lock:
            self._drop(scope)

    def _drop(self, scope: str) -> None:
        self._scopes.pop(scope, None)
        self._used -= self._scope_used.pop(scope, 0)

    def clear(self) -> None:
        """Drop everything held."""
        with self._lock:
            self._scopes, self._scope_used, self._used = {}, {}, 0

    def scopes(self) -> list[str]:
        """The scopes holding values, oldest first."""
        with self._lock:
            return [s for s, v in self._scopes.items() if v]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._scopes.values())


def includes_bytes(spellings) -> int:
    """Estimated memory of a list of ``#include`` spellings (CPython: 56 bytes a list and
    8 a slot, about 49 bytes a short ASCII string plus its characters)."""
    return 56 + sum(57 + len(s) for s in spellings)


def enrichment_bytes(fe) -> int:
    """Estimated memory of a :class:`~megacpp_core.enrich.FileEnrichment`: its four planes'
    bytes, 250 bytes a unit and 160 an entry of a unit's definitions, types, calls and
    uses (a tuple and its name; calibrated with ``tracemalloc`` on ``default``'s
    pybind11 files, where the estimate is within 15 %)."""
    planes = sum(getattr(fe, n).nbytes for n in ("structure", "ast_depth", "sibling_index", "ast_node_type"))
    items = sum(len(u.defines) + len(u.types) + len(u.calls) + len(u.uses) for u in fe.units)
    return planes + 250 * len(fe.units) + 160 * items


#: Bytes of ``#include`` spellings :data:`FILE_INCLUDES` holds at most (16 MiB).
MAX_INCLUDES_BYTES = 16 << 20
#: Bytes of enrichments :data:`FILE_ENRICHMENT` holds at most, as :func:`enrichment_bytes`
#: estimates them (192 MiB, as :data:`MAX_PARSED_BYTES`: about 33 M characters of code at
#: ``default``'s 6.1 bytes a character; all of ``default`` is 65 MB). Scopes whose later
#: step ran in another worker stay until a put needs their room, so this is also what a
#: worker may keep of them.
MAX_ENRICHMENT_BYTES = 192 << 20
#: Each kept file's ``#include`` spellings, from the chunk stage to ``p3_repo`` (module docstring).
FILE_INCLUDES = ScopedMemo(MAX_INCLUDES_BYTES, includes_bytes)
#: Each kept file's enrichment, from the chunk stage to ``p4_structure`` (module docstring).
FILE_ENRICHMENT = ScopedMemo(MAX_ENRICHMENT_BYTES, enrichment_bytes)


def ahead_bytes(value) -> int:
    """Estimated memory of a :data:`PARSED_AHEAD` value ``(parse, enrichment or None)``
    (:func:`parsed_bytes` plus :func:`enrichment_bytes`)."""
    parsed, fe = value
    return parsed_bytes(parsed) + (enrichment_bytes(fe) if fe is not None else 0)


#: Bytes of parses and enrichments :data:`PARSED_AHEAD` holds at most (256 MiB a worker:
#: all of ``default``'s 10.7 M characters take about 300 MB, so the largest shards' files
#: are held, the rest parsed by the chunk stage as before).
MAX_AHEAD_BYTES = 256 << 20
#: Each kept file's parse and enrichment made ahead of its chunk stage by an idle worker
#: (:mod:`megacpp_core.parse_ahead`); scope: the shard's partition key. Filled in the
#: order the shards will run and never evicting: what does not fit is not made ahead.
PARSED_AHEAD = ScopedMemo(MAX_AHEAD_BYTES, ahead_bytes, evict=False)
