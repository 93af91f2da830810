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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

#: Characters of parsed text :data:`PARSED` holds at most: a tree-sitter tree with its
#: source holds about 22 bytes per character (measured on ``default``'s kept files), so
#: 8 Mi characters are about 180 MB. A revision with more keeps its first files' trees.
MAX_PARSED_CHARS = 8 << 20


class TextMemo:
    """``{text: value}`` under one scope, at most ``limit`` in ``size(value)`` units (see the
    module docstring). Thread-safe."""

    def __init__(self, limit: int, size: Callable[[Any], int]):
        self.limit, self.size = limit, size
        self._lock = threading.Lock()
        self._scope: str | None = None
        self._values: dict[str, Any] = {}
        self._used = 0

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


#: The process's parses of one revision's files, from p3 to p4 (module docstring); the
#: scope is the revision's partition key.
PARSED = TextMemo(MAX_PARSED_CHARS, lambda parsed: len(parsed.text))
