"""Step logs (standard output and error) captured for the UI without helper processes.

Dagster's :class:`~dagster._core.storage.local_compute_log_manager.LocalComputeLogManager`
captures each run's (in process) or each step's (multiprocess executor) output into
``DAGSTER_HOME/storage/RUN_ID/compute_logs/KEY.out|.err``, which the UI shows as the
step's logs. It points the process's file descriptor at the file and starts, for each of
the two streams, a ``tail -F`` that copies the file back to the terminal and a Python
interpreter (``watch_orphans.py``) that kills the tail should the process die: four
processes per run, started and stopped in the run's path. Measured here
(``dagster._core.execution.compute_logs.mirror_stream_to_file`` on both streams, 20
times): 46 ms of wall time and 40 ms of CPU a run, and ``megacpp run --corpus default``
executes about 75 runs. On ``megacpp run``'s worker processes the capture caught nothing
at all: a worker's ``sys.stdout`` is a queue to the caller
(:class:`megacpp_assets.run_workers._QueueWriter`), which has no file descriptor, so
Dagster left it alone and the UI showed those runs' logs empty.

:class:`TeeComputeLogManager` keeps Dagster's files, layout, reading and live following
(it subclasses ``LocalComputeLogManager``; only the capture differs) and copies the
output in the process itself (:func:`tee_stream`):

- a stream with a file descriptor (the terminal, a pipe, a file: ``megacpp run``'s own
  process, a step process of ``dagster dev``) is captured at the descriptor, as Dagster
  does, so output of C and Rust code is caught too: the descriptor is pointed at the log
  file, and a thread of the process copies what the file gains to the original
  destination (:class:`_Follower`, what the ``tail`` did; it looks every
  :data:`POLL_SECONDS` and copies the rest when the capture ends). A process started
  during the run inherits the descriptor and writes into that run's log file, as under
  Dagster's capture;
- a stream without one (a worker's queue) is replaced, while the run lasts, by a text
  stream that writes to both the log file and the original stream. The progress lines
  of ``megacpp run`` follow the replacement (their handler writes to the current
  ``sys.stdout``: :func:`megacpp_assets.run_workers.stdout_handler`).

Nothing is started outside the process, so nothing can be orphaned: the thread ends with
the capture (or with the process).
"""

from __future__ import annotations

import io
import os
import select
import sys
import threading
from collections.abc import Generator, Sequence
from contextlib import contextmanager

from dagster import Field, Float, StringSource
from dagster._core.storage.compute_log_manager import CapturedLogContext, ComputeIOType
from dagster._core.storage.local_compute_log_manager import IO_TYPE_EXTENSION, LocalComputeLogManager
from dagster._utils import ensure_file, touch_file

#: Bytes copied from a log file to the terminal at a time (implementation choice).
CHUNK = 1 << 16
#: Seconds between two looks at a log file for new output to copy to the terminal, as
#: ``tail`` polls (``tail -F`` every second); implementation choice.
POLL_SECONDS = 0.1


def _fileno(stream) -> int | None:
    """``stream``'s file descriptor, or None when it has none (``io.UnsupportedOperation``,
    no ``fileno``, or a closed stream)."""
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return None


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (a pipe or terminal may take part of it; a
    non-blocking one that is full is waited on until it takes more)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [])


class _Follower:
    """Copies what is appended to the file ``path`` after byte ``start`` to the file
    descriptor ``mirror_fd`` (owned: closed by :meth:`stop`), from a thread that looks
    every :data:`POLL_SECONDS`, as ``tail -F -c +START`` would; a mirror that fails (a
    closed terminal) is dropped."""

    def __init__(self, path: str, start: int, mirror_fd: int):
        self._mirror = mirror_fd
        try:
            self._file = open(path, "rb", buffering=0)
        except BaseException:
            os.close(mirror_fd)
            raise
        try:
            self._file.seek(start)
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, name="megacpp-log-follower", daemon=True)
            self._thread.start()
        except BaseException:
            self._file.close()
            os.close(mirror_fd)
            raise

    def _copy(self) -> None:
        """Copy what the file gained; called by the thread, then by :meth:`stop` once the
        thread has ended (never both at once)."""
        while self._mirror >= 0 and (chunk := self._file.read(CHUNK)):
            try:
                _write_all(self._mirror, chunk)
            except OSError:
                os.close(self._mirror)
                self._mirror = -1

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self._copy()

    def stop(self) -> None:
        """End the thread, copy what is left up to the file's current end, close both."""
        self._stop.set()
        self._thread.join()
        try:
            self._copy()
        finally:
            self._file.close()
            if self._mirror >= 0:
                os.close(self._mirror)


class TeeStream(io.TextIOBase):
    """A text stream writing to ``stream`` and appending to ``log`` (a text file, flushed
    at each write so the UI follows it) until :meth:`end_log`; after it, to ``stream``
    alone (a handler that took this stream during the capture keeps working).
    ``stream`` may be None (Python's ``sys.stdout`` when the process started with that
    descriptor closed): then the log alone gets the text. ``encoding``, ``errors`` and
    ``isatty`` are the original stream's; it has no file descriptor."""

    def __init__(self, stream, log):
        self._stream, self._log = stream, log

    def end_log(self) -> None:
        """Flush the log and stop writing to it (the capture ended; the caller closes it)."""
        if self._log is not None:
            self._log.flush()
            self._log = None

    @property
    def encoding(self):
        return getattr(self._stream, "encoding", "utf-8")

    @property
    def errors(self):
        return getattr(self._stream, "errors", "strict")

    def isatty(self) -> bool:
        return bool(getattr(self._stream, "isatty", lambda: False)())

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if self._log is not None:
            self._log.write(s)
            self._log.flush()
        return self._stream.write(s) if self._stream is not None else len(s)

    def flush(self) -> None:
        if self._log is not None:
            self._log.flush()
        if self._stream is not None:
            self._stream.flush()


@contextmanager
def tee_stream(name: str, path: str) -> Generator[None, None, None]:
    """Capture ``sys.<name>`` (``"stdout"`` or ``"stderr"``) into the file ``path``
    (appended to, created if missing) while still writing it where it went (module doc):
    at its file descriptor when it has one, else by replacing ``sys.<name>`` with a
    :class:`TeeStream` until the block ends (restored only if nothing replaced it
    meanwhile; a ``None`` stream gives a tee to the log alone). Raises ``ValueError``
    for another ``name``."""
    if name not in ("stdout", "stderr"):
        raise ValueError(f"stream must be stdout or stderr, got {name!r}")
    ensure_file(path)
    stream = getattr(sys, name)
    fd = _fileno(stream)
    if fd is None:
        with open(path, "a", encoding="utf-8", errors="replace") as log:
            tee = TeeStream(stream, log)
            setattr(sys, name, tee)
            try:
                yield
            finally:
                try:
                    tee.flush()
                finally:
                    tee.end_log()
                    if getattr(sys, name) is tee:
                        setattr(sys, name, stream)
        return
    stream.flush()
    saved = os.dup(fd)
    try:
        log_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            start = os.fstat(log_fd).st_size
            os.dup2(log_fd, fd)
        finally:
            os.close(log_fd)
        follower = _Follower(path, start, os.dup(saved))
    except BaseException:  # the stream goes back where it went
        os.dup2(saved, fd)
        os.close(saved)
        raise
    try:
        yield
    finally:
        try:
            stream.flush()
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            follower.stop()


class TeeComputeLogManager(LocalComputeLogManager):
    """``LocalComputeLogManager`` whose capture runs in the process (module doc): same
    files (``BASE_DIR/storage/RUN_ID/compute_logs``), same reading and following in the UI.

    Instance configuration (``compute_logs:`` in ``dagster.yaml``): ``base_dir``, the
    instance's home, as the storage's (``env: DAGSTER_HOME``; the logs go where
    Dagster's default puts them, under its ``storage/``), and Dagster's optional
    ``polling_timeout``."""

    def __init__(self, base_dir: str, polling_timeout: float | None = None, inst_data=None):
        from dagster._core.instance.ref import compute_logs_directory

        super().__init__(compute_logs_directory(base_dir), polling_timeout=polling_timeout, inst_data=inst_data)

    @classmethod
    def config_type(cls):
        return {"base_dir": StringSource, "polling_timeout": Field(Float, is_required=False)}

    @classmethod
    def from_config_value(cls, inst_data, config_value) -> "TeeComputeLogManager":
        return cls(inst_data=inst_data, **config_value)

    @contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Generator[CapturedLogContext, None, None]:
        out = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDOUT])
        err = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDERR])
        with tee_stream("stdout", out), tee_stream("stderr", err):
            yield CapturedLogContext(log_key)
        touch_file(self.complete_artifact_path(log_key))  # as Dagster's: the capture is complete
