"""Step logs captured in process (:mod:`megacpp_assets.compute_logs`): what a run prints
reaches both its log file (the UI's step logs) and where it went before, at the file
descriptor when there is one (Python, C and child-process output alike) and through
``sys.stdout`` when there is none (a ``megacpp run`` worker), with no helper process."""

from __future__ import annotations

import io
import json
import logging
import os
import queue
import re
import subprocess
import sys
import textwrap

from megacpp_assets.compute_logs import TeeComputeLogManager, TeeStream, tee_stream
from tests.conftest import PROJECT, environ, write_instance_config

BIG = "x" * 200_000  # more than one copy chunk (64 KiB)


def _child(code: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=PROJECT, capture_output=True, text=True,
                          timeout=120, **kw)


def _children(pid: int) -> list[int]:
    """Child process ids of ``pid`` (every thread's ``/proc`` children list)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out


def test_descriptor_capture_takes_python_c_and_child_output_and_still_prints_it_in_order(tmp_path):
    log = tmp_path / "logs" / "run.out"  # its directory does not exist yet
    r = _child(f"""
        import os, subprocess, sys
        from megacpp_assets.compute_logs import tee_stream
        print("before", flush=True)
        with tee_stream("stdout", {str(log)!r}):
            print("python line", flush=True)
            os.write(1, b"descriptor line\\n")
            subprocess.run(["sh", "-c", "echo child line"], check=True)
            sys.stdout.write("x" * {len(BIG)} + "\\n")
            print("unflushed tail")  # flushed by the end of the capture
        print("after", flush=True)
    """)
    assert r.returncode == 0, r.stderr
    inside = f"python line\ndescriptor line\nchild line\n{BIG}\nunflushed tail\n"
    assert log.read_text() == inside
    assert r.stdout == "before\n" + inside + "after\n"


def test_stderr_is_captured_apart_from_stdout(tmp_path):
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    r = _child(f"""
        import sys
        from megacpp_assets.compute_logs import tee_stream
        with tee_stream("stdout", {str(out)!r}), tee_stream("stderr", {str(err)!r}):
            print("to out")
            print("to err", file=sys.stderr)
    """)
    assert r.returncode == 0, r.stderr
    assert (out.read_text(), err.read_text()) == ("to out\n", "to err\n")
    assert (r.stdout, r.stderr) == ("to out\n", "to err\n")


def test_a_closed_terminal_does_not_lose_the_log(tmp_path):
    """Standard output is a pipe nobody reads any more: the copy to it fails, the log file
    still gets every line and the process goes on."""
    log = tmp_path / "run.out"
    r = _child(f"""
        import os
        from megacpp_assets.compute_logs import tee_stream
        rd, wr = os.pipe()
        os.dup2(wr, 1)
        os.close(wr)
        os.close(rd)  # writes to fd 1 now fail with EPIPE
        with tee_stream("stdout", {str(log)!r}):
            for i in range(3):
                os.write(1, f"line {{i}}\\n".encode())
        os.write(2, b"survived\\n")
    """)
    assert r.returncode == 0, r.stderr
    assert log.read_text() == "line 0\nline 1\nline 2\n"
    assert r.stderr.endswith("survived\n")


def test_a_full_non_blocking_terminal_is_waited_on_not_cut_off(tmp_path):
    """Standard output is a non-blocking pipe whose reader starts late: the copy waits
    for it to take more (EAGAIN) instead of dropping the rest; the reader gets all of it."""
    log = tmp_path / "run.out"
    r = _child(f"""
        import fcntl, os, threading, time
        from megacpp_assets.compute_logs import tee_stream
        rd, wr = os.pipe()
        fcntl.fcntl(wr, fcntl.F_SETFL, fcntl.fcntl(wr, fcntl.F_GETFL) | os.O_NONBLOCK)
        saved = os.dup(1)
        os.dup2(wr, 1)
        os.close(wr)
        got = []
        def reader():
            time.sleep(0.5)  # the pipe (64 KiB) fills meanwhile
            while chunk := os.read(rd, 1 << 16):
                got.append(chunk)
        t = threading.Thread(target=reader)
        t.start()
        with tee_stream("stdout", {str(log)!r}):
            for i in range(4):
                os.write(1, (str(i) * 50_000 + "\\n").encode())
        os.dup2(saved, 1)  # the pipe's last writer is gone: the reader sees its end
        t.join()
        print(sum(map(len, got)))
    """)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == 4 * 50_001 == len(log.read_bytes())


def test_a_process_without_stdout_logs_to_the_file_alone(tmp_path, monkeypatch):
    """``sys.stdout`` is None (the process started with descriptor 1 closed): a print in
    the capture goes to the log, nothing raises, and None is given back."""
    monkeypatch.setattr(sys, "stdout", None)
    log = tmp_path / "run.out"
    with tee_stream("stdout", str(log)):
        print("only in the log")
        sys.stdout.flush()
    assert sys.stdout is None
    assert log.read_text() == "only in the log\n"


def test_a_stream_without_descriptor_is_teed_and_given_back(tmp_path, monkeypatch):
    """A worker's ``sys.stdout`` (a queue, no file descriptor): replaced by a tee for the
    capture, so ``print`` and the progress-line handler reach the queue and the log; put
    back afterwards. Text that is not ASCII and a line without its end are kept."""
    from megacpp_assets.run_workers import stdout_handler
    from megacpp_assets.run_workers import _QueueWriter

    q = queue.Queue()
    worker_stdout = _QueueWriter(q, "out")
    monkeypatch.setattr(sys, "stdout", worker_stdout)
    lg = logging.getLogger("megacpp.test_compute_logs")
    lg.handlers[:] = [stdout_handler()]
    lg.propagate = False
    lg.setLevel(logging.INFO)
    log = tmp_path / "run.out"
    try:
        with tee_stream("stdout", str(log)):
            assert isinstance(sys.stdout, TeeStream)
            print("printed: naïve — ok")
            lg.info("progress line")
            sys.stdout.write("no end")
        assert sys.stdout is worker_stdout
        lg.info("after the capture")
    finally:
        lg.handlers[:] = []
    sent = "".join(q.get_nowait()[1] for _ in range(q.qsize()))
    printed, progress, tail = log.read_text(encoding="utf-8").split("\n")
    assert printed == "printed: naïve — ok" and re.fullmatch(r"\d\d:\d\d:\d\d  progress line", progress)
    assert tail == "no end"  # written as it came, no line end added
    head = f"{printed}\n{progress}\nno end"
    assert sent.startswith(head) and re.fullmatch(r"\d\d:\d\d:\d\d  after the capture\n", sent[len(head):])


def test_a_handler_that_kept_the_tee_writes_on_after_the_capture(tmp_path, monkeypatch):
    """A logging handler made during the capture holds the tee; after the capture its
    records still reach the original stream, and the closed log is left alone."""
    original = io.StringIO()
    monkeypatch.setattr(sys, "stdout", original)
    log = tmp_path / "run.out"
    with tee_stream("stdout", str(log)):
        handler = logging.StreamHandler(sys.stdout)  # bound to the tee, as a logger made in a run is
        handler.emit(logging.makeLogRecord({"msg": "during"}))
    handler.emit(logging.makeLogRecord({"msg": "after"}))
    assert log.read_text() == "during\n"
    assert original.getvalue() == "during\nafter\n"


def test_a_replaced_stream_is_not_put_back_over_a_newer_one(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    newer = io.StringIO()
    with tee_stream("stdout", str(tmp_path / "run.out")):
        sys.stdout = newer  # something else took stdout during the capture
    assert sys.stdout is newer


def test_unknown_stream_name_is_refused(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="stdout or stderr"):
        with tee_stream("stdin", str(tmp_path / "x")):
            pass


_JOB = """
import json, os, sys
from dagster import DagsterEventType, DagsterInstance, job, op

def children(pid):
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out

seen = {}

@op
def speak():
    print("op says hello", flush=True)
    os.write(1, b"descriptor says hello\\n")
    seen["children"] = children(os.getpid())

@job
def printing_job():
    speak()

def run(instance):
    result = printing_job.execute_in_process(instance=instance)
    assert result.success
    captured = [e for e in instance.all_logs(result.run_id) if e.dagster_event
                and e.dagster_event.event_type == DagsterEventType.LOGS_CAPTURED]
    assert len(captured) == 1
    manager = instance.compute_log_manager
    key = manager.build_log_key_for_run(result.run_id, captured[0].dagster_event.logs_captured_data.file_key)
    return {"manager": type(manager).__name__, "complete": manager.is_capture_complete(key),
            "stdout": manager.get_log_data(key).stdout.decode(), "children": seen["children"],
            "path": manager.get_captured_local_path(key, "out")}
"""


def test_a_dagster_run_logs_through_the_instance_without_helper_processes(tmp_path):
    """The instance ``megacpp run`` configures captures a run's output in process, in a
    process with real descriptors: the UI's log data has the op's Python and descriptor
    output, the capture is complete, the output still reaches the terminal, and no process
    was started while the op ran (Dagster's own capture starts a ``tail`` and a watcher
    per stream)."""
    home = tmp_path / "home"
    home.mkdir()
    write_instance_config(home)
    with environ(DAGSTER_HOME=str(home)):
        r = _child(_JOB + """
with DagsterInstance.get() as instance:
    res = run(instance)
sys.stderr.write("RESULT " + json.dumps(res) + "\\n")
""")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stderr.rsplit("RESULT ", 1)[1])
    assert res["manager"] == "TeeComputeLogManager" and res["complete"]
    assert "op says hello\n" in res["stdout"] and "descriptor says hello\n" in res["stdout"]
    assert "op says hello\n" in r.stdout and "descriptor says hello\n" in r.stdout
    assert res["children"] == []
    assert res["path"].startswith(str(home / "storage"))


def test_a_worker_run_logs_its_prints_to_the_ui_and_the_queue(tmp_path, monkeypatch):
    """A worker's ``sys.stdout`` has no descriptor: the op's print reaches both the run's
    log (empty under Dagster's own capture) and the worker's queue."""
    from dagster import DagsterInstance

    from megacpp_assets.run_workers import _QueueWriter

    home = tmp_path / "home"
    home.mkdir()
    write_instance_config(home)
    scope: dict = {}
    exec(_JOB, scope)
    q = queue.Queue()
    with environ(DAGSTER_HOME=str(home)):
        with DagsterInstance.get() as instance:
            assert isinstance(instance.compute_log_manager, TeeComputeLogManager)
            before = set(_children(os.getpid()))  # processes earlier tests of this session left
            monkeypatch.setattr(sys, "stdout", _QueueWriter(q, "out"))
            res = scope["run"](instance)
            sys.stdout.flush()
            monkeypatch.undo()
    assert res["complete"] and "op says hello\n" in res["stdout"]
    assert "op says hello\n" in "".join(q.get_nowait()[1] for _ in range(q.qsize()))
    assert set(res["children"]) <= before
