"""Worker processes for ``megacpp run --workers N`` (SPEC §9): the per-revision work of a
pass runs on N processes at once, and so do the snapshot steps of the last pass
(:func:`megacpp_assets.snapshot_run.run_passes`).

Each worker is a fresh process (forked from a fork server, below) that opens the same Dagster instance from its
:class:`~dagster.InstanceRef` and executes its jobs in process, so the runs, their events
and the materializations are the instance's as usual (the UI lists them). A worker's
standard output and error (the per-step progress lines, failure reports) come back
through a queue and are printed by the caller, line by line, as they are written.

Why processes and not threads: every stage is CPU-bound Python. Why a fork server
(``forkserver``): a forked copy of a process that already ran polars or Arrow thread
pools, or holds SQLite connections, can deadlock or corrupt them, so workers are never
forked from the calling process; but a ``spawn``\ ed worker imports Dagster and the stage
libraries itself, about 3.5 s of CPU per worker per pass here (a quarter of a ``default``
run's Dagster overhead). The fork server is a fresh process that only imports
:data:`PRELOAD` (no work has run on a thread pool in it, no file is open) and forks every worker
from that state: a worker starts in milliseconds, and the imports are paid once per
``megacpp run`` (:func:`start_fork_server`, called before the caller imports Dagster,
runs them meanwhile). A worker takes the caller's environment and working directory at
the pool's creation (:class:`WorkerPool`), as a spawned one would, not the fork
server's. ``MEGACPP_WORKER_START=spawn`` spawns the workers instead.

Each worker loads the stages' heavy state once (ScanCode's license index, the snapshot
tokenizer) and keeps it for every unit of its pass (a pass starts fresh workers), so a
worker's peak is one step's peak (≤ 2 GiB in fresh processes, ``bench/scale.py``) plus
what it keeps: :func:`default_workers` gives one worker per core within
:data:`WORKER_MEMORY` of available memory per worker.
"""

from __future__ import annotations

import gc
import io
import logging
import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, ProcessPoolExecutor, wait

#: Memory budget of one worker (bytes): the largest worker peak of ``megacpp run --corpus
#: xl`` (2.2 GB in pass 1: ScanCode's index, 1.4 GB, kept while the worker runs the other
#: steps of large shards), rounded up to 3 GiB.
WORKER_MEMORY = 3 << 30

#: Modules the fork server imports once for every worker (:mod:`megacpp_assets.fork_preload`;
#: a module that fails to import is reported and left to the worker): the worker's own
#: code and Dagster's instance storage (``DagsterInstance.from_ref``: 1.6 s of imports a
#: worker), and the libraries the first pass's stages import on first use (ScanCode's
#: detection code without its index, detect-secrets, pandera with the pandas backend its
#: first validation registers: about 0.3 s a worker, hypothesis's import included).
#: Libraries only later passes use are in :data:`LATER_PASS_MODULES` instead. None of the
#: modules here opens a file or runs work on a thread pool at import; the two threads that exist after
#: the imports (pyarrow's jemalloc background thread, numpy's OpenBLAS) are re-created or
#: reset by those libraries' own ``fork`` handlers (``tests/test_run_workers.py`` runs
#: Arrow, numpy and polars in forked workers).
PRELOAD = (
    "megacpp_assets.snapshot_run", "megacpp_assets.definitions", "megacpp_assets.instance_storage",
    "megacpp_assets.compute_logs",
    "dagster._core.storage.base_storage", "dagster._core.storage.runs.sqlite",
    "dagster._core.storage.schedules.sqlite", "dagster._core.storage.event_log.sqlite",
    "licensedcode.detection", "detect_secrets", "pandera", "pandera.backends.pandas.register",
    "pandera.backends.pandas.builtin_checks",
)


#: Libraries that only the stages of passes after the first import on first use: networkx
#: (``p3_repo``'s include order) and matplotlib (the family datasets' plots and the
#: dataset card). They are not in :data:`PRELOAD`: the first pass's workers are forked
#: once the fork server has imported everything in it, and that start is on the run's
#: critical path (they are about 0.4 s of the server's imports; on ``default`` the first
#: run begins 0.6–0.8 s sooner without them). A later pass's worker imports them as it
#: starts (:func:`import_for_later_pass`), which is while the tokenizer trains in the
#: calling process (:func:`megacpp_assets.snapshot_run.run_passes`).
LATER_PASS_MODULES = ("networkx", "matplotlib.figure", "matplotlib.backends.backend_agg")


def import_guarded(names: Iterable[str], who: str, then: str) -> list[str]:
    """Import each module of ``names`` with the garbage collector off meanwhile (its
    earlier state restored after), as :mod:`megacpp_assets.fork_preload` imports
    :data:`PRELOAD`; a module raising at import (any ``Exception``) is reported on
    standard error as ``megacpp run: WHO could not import NAME (Type: message); THEN``
    and skipped. Returns the names that failed."""
    import importlib

    failed = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as e:  # noqa: BLE001 — reported; whoever needs the module imports it again
                failed.append(name)
                print(f"megacpp run: {who} could not import {name} ({type(e).__name__}: {e}); {then}", file=sys.stderr)
    finally:
        if enabled:
            gc.enable()
    return failed


def import_for_later_pass() -> list[str]:
    """Import :data:`LATER_PASS_MODULES` in this process (:func:`import_guarded`); returns
    the names that failed (the stage that uses one imports it again and meets the error)."""
    return import_guarded(LATER_PASS_MODULES, "a worker", "the stage that uses it imports it itself")


#: Niceness a later pass's worker takes as it starts (:func:`lower_priority`; the highest,
#: 19, in Linux's range): it yields the CPU to any process at the default 0.
LATER_PASS_NICE = 19


def lower_priority(nice: int = LATER_PASS_NICE) -> int:
    """Raise this process's niceness to ``nice`` (never lowers it: an unprivileged process
    could not lower it again); returns the niceness it has now. A later pass's pool starts
    while the calling process runs the earlier pass's snapshot steps, the critical path
    (the dedup decisions, the tokenizer's training, which leaves part of the cores idle):
    at this niceness the workers' start-up (:func:`import_for_later_pass`, the instance,
    the warm-up) takes only the CPU those steps leave. Afterwards the calling process only
    waits for the workers, which all run at the same niceness, so it costs their steps
    nothing on a machine running ``megacpp run`` alone. A system without ``os.nice``, or
    one that refuses the change (``OSError``), leaves the priority as it is (0 is returned
    without ``os.nice``)."""
    if not hasattr(os, "nice"):
        return 0
    now = os.nice(0)
    try:
        return os.nice(nice - now) if now < nice else now
    except OSError:
        return now


def start_method() -> str:
    """``"forkserver"`` (the default), or ``"spawn"`` when ``MEGACPP_WORKER_START=spawn``;
    ``ValueError`` for any other value."""
    method = os.environ.get("MEGACPP_WORKER_START", "forkserver")
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"MEGACPP_WORKER_START must be forkserver or spawn, got {method!r}")
    return method


def start_fork_server() -> None:
    """Start this process's fork server now (with :data:`PRELOAD`) unless it runs already
    or workers are spawned: it imports in the background, so a caller that will start a
    :class:`WorkerPool` later overlaps those imports with its own work."""
    if start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["megacpp_assets.fork_preload"])  # imports PRELOAD, each guarded
    forkserver.ensure_running()


def default_workers() -> int:
    """Usable cores (``sched_getaffinity``), capped by ``MemAvailable`` / :data:`WORKER_MEMORY`; at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
        cores = min(cores, avail // WORKER_MEMORY)
    except (OSError, StopIteration, ValueError):
        pass
    return max(1, int(cores))


class _QueueWriter(io.TextIOBase):
    """A text stream sending each completed line to ``queue`` as ``(stream, line)``."""

    def __init__(self, queue, stream: str):
        self._queue, self._stream, self._buf = queue, stream, ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self._buf += s
        if "\n" in self._buf:
            done, self._buf = self._buf.rsplit("\n", 1)
            self._queue.put((self._stream, done + "\n"))
        return len(s)

    def flush(self) -> None:
        if self._buf:
            self._queue.put((self._stream, self._buf))
            self._buf = ""


class _CurrentStdout(logging.StreamHandler):
    """A ``StreamHandler`` writing to whatever ``sys.stdout`` is at each record."""

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ and setStream assign it
        pass


def stdout_handler() -> logging.Handler:
    """The handler of ``megacpp run``'s progress lines (``HH:MM:SS  message``): it writes
    to the current ``sys.stdout`` at each record, so a run's log capture that replaces
    ``sys.stdout`` (a worker's: :mod:`megacpp_assets.compute_logs`) gets the lines."""
    handler = _CurrentStdout()
    handler.setFormatter(logging.Formatter("%(asctime)s  %(message)s", "%H:%M:%S"))
    return handler


_WORKER = None
#: Objects this worker found frozen when it started: those of the fork server's imports
#: (:mod:`megacpp_assets.fork_preload`); 0 in a spawned worker.
FROZEN_AT_START = 0


def _init(factory: Callable, args: tuple, queue, env: dict[str, str], cwd: str) -> None:
    """Worker initializer: take the caller's environment and working directory, route
    stdout/stderr to ``queue``, then build the worker's state. That state (the instance,
    the jobs) lives as long as the worker, so it is frozen out of the garbage collector's
    full collections as the fork server's modules are (:mod:`megacpp_assets.fork_preload`);
    then the state's ``after_init()``, when it has one, is called (work started there is
    not frozen with it). Before each unit, :func:`_call` calls its ``before_unit()``."""
    global _WORKER, FROZEN_AT_START
    FROZEN_AT_START = gc.get_freeze_count()
    if os.environ != env:
        os.environ.clear()
        os.environ.update(env)
    os.chdir(cwd)
    sys.stdout, sys.stderr = _QueueWriter(queue, "out"), _QueueWriter(queue, "err")
    _WORKER = factory(*args)
    gc.collect()  # nothing left over from building it is frozen with it
    gc.freeze()
    after = getattr(_WORKER, "after_init", None)  # e.g. start work for while the worker waits
    if after is not None:
        after()


def _ready() -> int:
    """A no-op unit: its process has started and built its state."""
    return os.getpid()


def _call(method: str, *args):
    before = getattr(_WORKER, "before_unit", None)  # e.g. stop work the worker did while it waited
    try:
        if before is not None:
            before()
        return getattr(_WORKER, method)(*args)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


class WorkerPool:
    """``n`` worker processes, each holding ``factory(*args)``; :meth:`run_units` calls its
    methods for units of work. Use as a context manager (the workers end on exit).

    Processes start when units are first submitted, or at once with :meth:`start`: a pool
    started while other work runs (``megacpp run`` starts the next pass's workers while
    the snapshot steps of a pass run) has imported and built its state by the time its
    first unit comes."""

    def __init__(self, n: int, factory: Callable, args: tuple):
        method = start_method()
        if method == "forkserver":
            start_fork_server()
        ctx = multiprocessing.get_context(method)
        self.n = n
        self._queue = ctx.Queue()
        self._pool = ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_init,
                                         initargs=(factory, args, self._queue, dict(os.environ), os.getcwd()))
        self._printer = threading.Thread(target=self._print, daemon=True)
        self._printer.start()

    def _print(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            stream, text = item
            out = sys.stdout if stream == "out" else sys.stderr
            out.write(text)
            out.flush()

    def start(self) -> "WorkerPool":
        """Start all ``n`` processes now (one no-op unit each, submitted before any
        process is idle, so the executor spawns one process per unit); returns self."""
        self._ready = [self._pool.submit(_ready) for _ in range(self.n)]
        return self

    def run_units(self, units: Iterable[tuple[str, tuple]],
                  done: Callable[[str, tuple, object], tuple[bool, list[tuple[str, tuple]]]],
                  priority: Callable[[tuple[str, tuple]], object] | None = None) -> bool:
        """Run ``(method, args)`` units on the workers, at most ``n`` at once. After each,
        ``done(method, args, result)`` (in this process) says whether it succeeded and which
        units it releases; released units start before the ones queued earlier (depth
        first), or, with ``priority``, the waiting unit with the largest ``priority(unit)``
        starts first (ties in that same order). True when every unit succeeded; after the
        first failure (or exception) no further unit starts and the running ones finish.
        An exception is printed."""
        pending = list(units)[::-1]
        running: dict = {}
        ok = True
        while pending or running:
            while ok and pending and len(running) < self.n:
                at = len(pending) - 1 if priority is None else max(range(len(pending)),
                                                                    key=lambda j: (priority(pending[j]), j))
                method, args = pending.pop(at)
                try:
                    running[self._pool.submit(_call, method, *args)] = (method, args)
                except BrokenExecutor as e:  # a started worker died before this unit (its start-up failed)
                    print(f"megacpp run: worker failed before {method}{args}: {type(e).__name__}: {e}", file=sys.stderr)
                    ok, pending = False, []
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                method, args = running.pop(fut)
                try:
                    good, more = done(method, args, fut.result())
                except Exception as e:  # a worker died or raised: report, stop starting units
                    print(f"megacpp run: worker failed in {method}{args}: {type(e).__name__}: {e}", file=sys.stderr)
                    good, more = False, []
                ok = ok and good
                pending += more[::-1]
            if not ok:
                pending = []
        return ok

    def release(self) -> None:
        """Tell the workers to end without waiting for them: each ends in the background
        while the caller goes on (a forked worker exits at once, with ``os._exit``; a
        spawned one shuts its interpreter down, a second or so when it holds ScanCode's
        index); :meth:`__exit__` later waits for them. Call with no unit running (after
        :meth:`run_units`)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._queue.put(None)
        self._printer.join()
