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


def cgroup_cpu_limit(root: str = "/sys/fs/cgroup") -> float | None:
    """Cores the process's cgroup may use, from its CPU quota: cgroup v2's ``cpu.max``
    (``"QUOTA PERIOD"``, ``"max ..."`` for none) or v1's ``cpu/cpu.cfs_quota_us`` over
    ``cpu/cpu.cfs_period_us`` (``-1`` for none), read under ``root``; None when there is
    no quota or no such file (a container limited to 1.5 CPUs gives 1.5)."""
    def read(name: str) -> str | None:
        try:
            with open(os.path.join(root, name)) as f:
                return f.read().strip()
        except OSError:
            return None

    v2 = read("cpu.max")
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        if quota == "max" or not period:
            return None
        try:
            q, p = int(quota), int(period)
        except ValueError:
            return None
        return q / p if q > 0 and p > 0 else None
    quota, period = read("cpu/cpu.cfs_quota_us"), read("cpu/cpu.cfs_period_us")
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def usable_cores() -> float:
    """Cores this process may run on: its CPU affinity (``os.sched_getaffinity``, or
    ``os.cpu_count()`` where that is unknown), capped by its cgroup's CPU quota
    (:func:`cgroup_cpu_limit`, as a Kubernetes CPU limit sets it); at least 1."""
    try:
        cores = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cores = float(os.cpu_count() or 1)
    limit = cgroup_cpu_limit()
    return max(1.0, min(cores, limit) if limit is not None else cores)


def full_cores_floor(cpu_seconds: float, cores: float | None = None) -> float:
    """The least wall time, in seconds, that ``cpu_seconds`` of CPU work takes on ``cores``
    cores (default :func:`usable_cores`) when every core is busy from start to end and
    nothing waits. A goal whose time budget is below it cannot be met by overlapping that
    same work better; only less CPU work (fewer or cheaper operations) can meet it."""
    return cpu_seconds / (cores or usable_cores())
