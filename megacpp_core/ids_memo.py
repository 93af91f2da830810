"""Token ids of whole texts, handed from one stage to a later one in the same process.

The chunk stage encodes every kept file whole (its exact token budgets need the counts),
and most files fit in one chunk whose text is the whole file (692 of 824 documents,
1.03 M of 1.83 M tokens on ``default``); the tokenize stage then encodes those same texts
again. When the two run in one Dagster step (the step group ``chunk__tokenize__…``, one
process), chunk puts each file's ids here and tokenize takes the ids of every document
whose text is one of them instead of encoding it again. Encoding is deterministic, so the
ids are the ones tokenize would compute; tokenize still decodes every document and
compares it with its text (its round-trip check), hit or miss.

The memo is keyed by the tokenizer's sha256 and the text itself (a dict lookup: the text's
hash, then a comparison of equal texts), holds one shard's texts at a time (:meth:`IdsMemo.begin`
drops what an earlier shard left), and at most :data:`MAX_TOKENS` ids (4 bytes each). It
keeps the texts it is keyed by alive from chunk to tokenize: one shard's kept text, which
the chunk stage held anyway. A stage that runs alone, in another process or pod, finds
it empty and encodes as before.
"""

from __future__ import annotations

import threading

import numpy as np

#: Ids the memo holds at most (uint32, 4 bytes each: 256 MiB). xl's largest shard has
#: about 9 M tokens; a put beyond the limit is dropped (its text is encoded again later).
MAX_TOKENS = 64 << 20


class IdsMemo:
    """``{text: uint32 ids}`` under one tokenizer sha256 (see the module docstring).
    Thread-safe: chunk puts from its encoding thread."""

    def __init__(self, max_tokens: int = MAX_TOKENS):
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        self._sha: str | None = None
        self._ids: dict[str, np.ndarray] = {}
        self._tokens = 0

    def begin(self, sha256: str) -> None:
        """Start holding ids made with the tokenizer ``sha256``; drops everything held."""
        with self._lock:
            self._sha, self._ids, self._tokens = sha256, {}, 0

    def put(self, sha256: str, text: str, ids: np.ndarray) -> bool:
        """Hold ``ids`` (uint32[n]) of ``text`` encoded by the tokenizer ``sha256``; False
        (nothing held) for another tokenizer than :meth:`begin`'s or beyond ``max_tokens``."""
        with self._lock:
            if sha256 != self._sha or self._tokens + len(ids) > self.max_tokens or text in self._ids:
                return False
            self._ids[text] = ids
            self._tokens += len(ids)
            return True

    def take(self, sha256: str, text: str) -> np.ndarray | None:
        """The ids held for ``text`` under the tokenizer ``sha256`` (removed from the memo),
        or None."""
        with self._lock:
            if sha256 != self._sha:
                return None
            ids = self._ids.pop(text, None)
            if ids is not None:
                self._tokens -= len(ids)
            return ids

    def clear(self) -> None:
        """Drop everything held (the tokenizer too)."""
        self.begin(None)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self._ids)


#: The process's memo (chunk puts, tokenize takes).
MEMO = IdsMemo()
