"""Shared timing helper of the ``bench/`` scripts (run as ``python bench/NAME.py``)."""

from __future__ import annotations

import time
from typing import Callable


def best_of(fn: Callable[[], object], repeats: int = 3) -> float:
    """Smallest wall time in seconds of ``repeats`` calls of ``fn`` (``time.perf_counter``)."""
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
