"""Imported by ``megacpp run``'s fork server alone (:func:`megacpp_assets.run_workers.start_fork_server`):
imports every module of :data:`megacpp_assets.run_workers.PRELOAD` so each worker forked
from the server starts with them imported.

Python's fork server skips a preload module that raises ``ImportError`` but dies on any
other exception, and then no worker can start; importing them here, each guarded, turns
such a failure into one line on standard error (the worker imports the module itself
when it needs it, as a spawned worker would).

The server ends when ``megacpp run`` does (its end of a pipe closes), by raising
``SystemExit``: a normal interpreter shut-down, which with these modules imported takes
one to two seconds, during which the server still holds the terminal's or pipe's
standard output and error that it inherited (so ``megacpp run | tee log`` waited for
it). Nothing of the server needs cleaning up (it holds no file, no database, and its
forked workers end with ``os._exit``), so its first exit handler flushes standard
output and error and ends the process at once (``os._exit``). Worker processes never
run exit handlers.

Once the modules are imported, their objects are moved out of the garbage collector's
reach (``gc.freeze``): every worker is forked from this state and
keeps those objects for its whole life, and a full collection in a worker no longer
walks them (on ``default``, 0.22 s a full collection in a worker before, 0.01 s after; a
pass-2 worker ran three to nine). Python's documentation recommends it for processes
forked without ``exec``: the collector then no longer writes to those objects either,
though reference counting still does.

The collector is off from before the imports to the freeze, as Python's documentation of
``gc.freeze`` advises for a process that forks without ``exec`` (``gc.disable()`` early,
``gc.freeze()`` before the forks; it is on again before the first fork, so every worker
collects): the imports
make few garbage cycles but millions of objects, so the automatic full collections their
allocations triggered walked ever more objects for little — on ``default``, seven of them
took 0.70 s of the server's 2.8 s of imports, and a last explicit one before the freeze
0.16–0.27 s (it freed 3,500 objects of 360,000), all on the way to the first worker's
start. What cycles the imports left are frozen with the rest, shared by every worker.

Last, the server makes the empty run database that every run database of a worker is
copied from (:func:`megacpp_assets.instance_storage.run_template`), so no worker makes
its own on the way to its first step."""

from __future__ import annotations

import atexit
import gc
import os
import sys

from megacpp_assets.run_workers import PRELOAD, import_guarded


def _exit_now() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


gc.disable()  # until the freeze below: the imports' allocations would trigger full collections
import_guarded(PRELOAD, "the fork server", "workers import it themselves")  # each guarded, reported

try:  # every worker's run databases are copies of it (instance_storage.run_template): made once, here
    from megacpp_assets.instance_storage import run_template

    run_template()
except Exception as _e:  # noqa: BLE001 — reported; each worker then makes its own
    print(f"megacpp run: the fork server could not make the run-database template ({type(_e).__name__}: {_e}); "
          "workers make it themselves", file=sys.stderr)

atexit.register(_exit_now)  # registered last: runs first
gc.freeze()
gc.enable()  # for the workers forked from here
