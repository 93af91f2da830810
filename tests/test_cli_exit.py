"""The ``megacpp`` console script ends without the interpreter's finalization
(:func:`megacpp_assets.cli.entry`): its exit code, its last output and the exit handlers
must all survive that."""

from __future__ import annotations

import os
import subprocess
import sys

from .conftest import PROJECT


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, timeout=300)


def test_entry_keeps_the_exit_code_flushes_output_and_runs_exit_handlers():
    r = _python(
        "import atexit, logging, sys\n"
        "from megacpp_assets import cli\n"
        "atexit.register(lambda: print('exit handler ran'))\n"
        "def fake(argv=None):\n"
        "    print('x' * 200_000, end='')\n"  # more than a pipe's buffer, unflushed
        "    sys.stderr.write('last words')\n"
        "    logging.getLogger('megacpp.test').warning('logged at the end')\n"
        "    return 3\n"
        "class Kept:\n"
        "    def __del__(self):\n"
        "        print('collected at finalization')\n"
        "kept = Kept()\n"
        "import weakref\n"
        "weakref.finalize(kept, print, 'weakref finalizer ran')\n"  # an exit handler (atexit)
        "cli.main = fake\n"
        "cli.entry()\n"
        "print('never printed')\n")
    assert r.returncode == 3, r.stderr[-2000:]
    # exit handlers ran (weakref's first: registered last); the interpreter's finalization,
    # which would collect ``kept``, did not
    assert r.stdout == "x" * 200_000 + "weakref finalizer ran\nexit handler ran\n", r.stdout[200_000:]
    assert r.stderr.startswith("last words") and "logged at the end" in r.stderr


def test_the_console_script_reports_errors_with_their_exit_codes(tmp_path):
    missing = tmp_path / "no-such-manifest.yaml"
    r = subprocess.run([sys.executable, "-m", "megacpp_assets.cli", "run", "--corpus", str(missing),
                        "--data-root", str(tmp_path / "root"), "--workers", "1"],
                       cwd=PROJECT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "DAGSTER_HOME": str(tmp_path / "home")})
    assert r.returncode == 2 and "megacpp run:" in r.stderr, (r.returncode, r.stderr[-2000:])
    r = subprocess.run([sys.executable, "-m", "megacpp_assets.cli", "run", "--workers", "0"],
                       cwd=PROJECT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--workers must be at least 1" in r.stderr
    r = _python("from megacpp_assets import cli\ncli.main = lambda argv=None: 1 / 0\ncli.entry()\n")
    assert r.returncode == 1 and "ZeroDivisionError" in r.stderr  # an exception leaves the normal way


def test_a_run_through_the_console_script_leaves_whole_databases(tmp_path):
    """``megacpp run`` (here with its passes replaced by writes to the instance) closes the
    Dagster instance it opened before ending without finalization: nothing is left in a
    write-ahead log, and a new process reads what it wrote."""
    from dagster import DagsterInstance

    from .conftest import environ, make_data_root

    root, home = make_data_root(tmp_path / "root"), tmp_path / "home"
    home.mkdir()
    code = (
        "import sys\n"
        "from megacpp_assets import cli, snapshot_run\n"
        "def passes(run, workers):\n"
        "    run.instance.add_dynamic_partitions('cli_exit_probe', ['a', 'b'])\n"
        "    return True\n"
        "snapshot_run.run_passes = passes\n"
        f"cli.entry(['run', '--corpus', 'tiny', '--data-root', {str(root)!r}, '--workers', '1'])\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "DAGSTER_HOME": str(home)})
    assert r.returncode == 0 and "Done in" in r.stdout, r.stderr[-2000:]
    wal = [p for p in home.rglob("*-wal") if p.stat().st_size]
    assert not wal, wal
    with environ(DAGSTER_HOME=str(home)), DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_dynamic_partitions("cli_exit_probe") == ["a", "b"]
        assert "tiny/pybind11-3.1.0" in instance.get_dynamic_partitions("repo_revision")
