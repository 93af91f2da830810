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
"""

from __future__ import annotations

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
    """Empty every memo of this process (every :class:`TextMemo`: :data:`PARSED`,
    :data:`megacpp_core.ids_memo.MEMO`): called when a step that ran several stages ends,
    so nothing one of them handed on outlives the step (a stage that failed, or a later
    stage not selected, would otherwise leave it until the next step)."""
    for m in list(_ALL):
        m.clear()
