"""Imported by ``megacpp run``'s fork server alone (:func:`megacpp_assets.run_workers.start_fork_server`):
imports every module of :data:`megacpp_assets.run_workers.PRELOAD` so each worker forked
from the server starts with them imported.

Python's fork server skips a preload module that raises ``ImportError`` but dies on any
other exception, and then no worker can start; importing them here, each guarded, turns
such a failure into one line on standard error (the worker imports the module itself
when it needs it, as a spawned worker would)."""

from __future__ import annotations

import importlib
import sys

from megacpp_assets.run_workers import PRELOAD

for _name in PRELOAD:
    try:
        importlib.import_module(_name)
    except Exception as _e:  # noqa: BLE001 — reported; the worker imports it again when needed
        print(f"megacpp run: the fork server could not import {_name} ({type(_e).__name__}: {_e}); "
              "workers import it themselves", file=sys.stderr)
