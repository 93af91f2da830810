"""Seed morphemes of the stage-5 tokenizer: how often each candidate occurs inside the
identifiers of the training texts (:func:`megacpp_core.tokenizer.train_tokenizer` seeds
the BPE training with the ones found at least ``SEED_MIN_HITS`` times)."""

from __future__ import annotations

import re
import threading
from typing import Iterable

#: Characters of identifier lines counted at a time by :func:`measure_morphemes`.
MORPHEME_CHUNK = 1 << 22
#: Identifiers (optionally ``::``-qualified prefix) counted when measuring seed morphemes.
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:::)?")


def measure_morphemes(texts: Iterable[str], morphemes: Iterable[str],
                      stop: threading.Event | None = None) -> dict[str, int]:
    """``{morpheme: hits}``: occurrences of each morpheme inside the identifiers of ``texts``.

    Identifiers are ``[A-Za-z_][A-Za-z0-9_]*`` with an optional trailing ``::`` (so
    ``std::`` is counted from qualified names), one per line; overlapping hits inside one
    identifier are not double counted (``str.count`` semantics). The lines are counted
    :data:`MORPHEME_CHUNK` characters at a time (no hit spans a newline, unless a
    morpheme holds one or is empty: then in one piece). ``stop``, once set, ends the count
    early (the counts returned are then partial: for a caller that no longer needs them).
    """
    morphemes = list(morphemes)
    counts = dict.fromkeys(morphemes, 0)
    chunk = None if any(not m or "\n" in m for m in morphemes) else MORPHEME_CHUNK
    lines: list[str] = []
    size = 0
    for t in texts:
        if stop is not None and stop.is_set():
            return counts
        lines.append("\n".join(_IDENT.findall(t)))
        size += len(lines[-1]) + 1
        if chunk is not None and size >= chunk:
            stream, lines, size = "\n".join(lines), [], 0
            for m in counts:
                counts[m] += stream.count(m)
    stream = "\n".join(lines)
    for m in counts:
        counts[m] += stream.count(m)
    return counts
