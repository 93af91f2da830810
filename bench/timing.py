"""Shared timing helper of the ``bench/`` scripts (run as ``python bench/NAME.py``)."""

from __future__ import annotations

import os
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


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity (``os.sched_getaffinity``), or
    ``os.cpu_count()`` where that is unknown; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def full_cores_floor(cpu_seconds: float, cores: int | None = None) -> float:
    """The least wall time, in seconds, that ``cpu_seconds`` of CPU work can take on
    ``cores`` cores (default :func:`usable_cores`): every core busy from start to end,
    nothing waiting. A goal whose time budget is below it needs less CPU work, whatever
    the threads and processes do."""
    return cpu_seconds / (cores or usable_cores())
