"""The card's plots drawn on two processes (:func:`megacpp_core.plots.draw_pngs`): the same
PNG bytes as drawn in one process, whatever happens to the forked child, and no child left
behind."""

from __future__ import annotations

import os
import time

import pytest

from megacpp_core import plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _figures(name: str, k: int) -> dict:
    lengths = {f"<={2 ** b}": (b * 37 + k * 11) % 300 for b in range(4, 13)}
    fill = {label: (i * 7 + k) % 40 for i, label in enumerate(plots.FILL_BINS)}
    return {"family": name, "document_lengths": lengths, "row_fill": fill, "fill": 0.9 + k / 100,
            "rows": 100 + k, "row_length": 4096, "docs": 1000 * (k + 1),
            "tokens_per_source": {f"source-{s}": 10_000 * (s + k + 1) for s in range(12)}}


@pytest.fixture(scope="module")
def fam() -> dict:
    names = ("p1_simple", "p1_docrich", "p2_file", "p3_repo", "p4_structure")
    return {n: _figures(n, k) for k, n in enumerate(names)} | {"p5_empty": None}


@pytest.fixture(scope="module")
def serial(fam) -> dict[str, bytes]:
    return plots.family_plots(fam)


@pytest.fixture
def forks(monkeypatch) -> list[int]:
    """The pids of the children :func:`plots.draw_pngs` forks (``os.fork`` as it is,
    recorded in the parent)."""
    pids: list[int] = []
    real = os.fork

    def fork():
        pid = real()
        if pid:
            pids.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", fork)
    return pids


def _reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # waited for already: no zombie, no process left
    return False


def _bar(values):
    return lambda fig: fig.subplots().bar(range(len(values)), values)


def _recorded(draw, log):
    """``draw`` that appends ``NAME PID`` to the file ``log`` (shared by parent and child)."""
    def wrapped(name):
        def go(fig):
            with open(log, "a") as f:
                f.write(f"{name} {os.getpid()}\n")
            draw(fig)
        return go
    return wrapped


def test_two_processes_draw_the_same_bytes(fam, serial, forks):
    assert list(serial) == ["family_document_lengths", "family_row_fill", "tokens_per_source"]
    assert all(v.startswith(PNG_SIGNATURE) for v in serial.values())
    two = plots.family_plots(fam, processes=2)
    assert list(two) == list(serial) and two == serial
    assert len(forks) == 1 and _reaped(forks[0])
    assert plots.family_plots({"p1_simple": None}, processes=2) == {}


def test_the_childs_share_is_drawn_by_the_child_alone(tmp_path, forks):
    """Each plot is drawn once: the child's share by the child (its PNGs come back through
    the pipe, this process does not draw them again), the rest here."""
    log = tmp_path / "drawn.txt"
    plan = {n: (_recorded(_bar(v), log)(n), (4.0, 3.0)) for n, v in (("a", [3, 4]), ("b", [1, 5, 2]), ("c", [2]))}
    two = plots.draw_pngs(plan, processes=2)
    serial = plots.draw_pngs({n: (_bar(v), (4.0, 3.0)) for n, v in (("a", [3, 4]), ("b", [1, 5, 2]), ("c", [2]))})
    assert two == serial
    drawn = [line.split() for line in log.read_text().splitlines()]
    assert sorted(n for n, _ in drawn) == ["a", "b", "c"]  # none drawn twice
    by = {n: int(pid) for n, pid in drawn}
    assert set(by.values()) == {os.getpid(), forks[0]} and _reaped(forks[0])


def test_plots_larger_than_a_pipe_buffer_come_back_whole(forks):
    import numpy as np

    noise = np.random.default_rng(0).random((400, 400, 3))
    plan = {"noise": (lambda fig: fig.subplots().imshow(noise), (6.0, 6.0)),
            "other noise": (lambda fig: fig.subplots().imshow(noise[::-1]), (6.0, 6.0))}  # one for the child
    serial = plots.draw_pngs(plan)
    assert min(len(v) for v in serial.values()) > 4 * 65_536  # several times what a pipe holds at once
    assert plots.draw_pngs(plan, processes=2) == serial
    assert len(forks) == 1 and _reaped(forks[0])


def test_a_failed_fork_draws_everything_here(fam, serial, monkeypatch):
    def no_fork():
        raise OSError("fork refused")

    monkeypatch.setattr(os, "fork", no_fork)
    assert plots.family_plots(fam, processes=2) == serial


def test_a_child_that_fails_is_replaced_by_this_process(forks):
    """A draw that raises in the child only (the child ends with status 1 and sends
    nothing): this process draws its share, and the bytes are the serial ones."""
    parent = os.getpid()
    real = {"a": (_bar([3, 4]), (4.0, 3.0)), "b": (_bar([1, 5, 2]), (4.0, 3.0))}

    def only_here(draw):
        def wrapped(fig):
            if os.getpid() != parent:
                raise RuntimeError("the child fails")
            draw(fig)
        return wrapped

    plan = {n: (only_here(d), size) for n, (d, size) in real.items()}
    assert plots.draw_pngs(plan, processes=2) == plots.draw_pngs(real)
    assert len(forks) == 1 and _reaped(forks[0])


def test_a_hung_child_is_ended_and_its_share_drawn_here(forks, monkeypatch):
    """A child that never sends (stuck) is killed after ``CHILD_TIMEOUT_SECONDS`` and
    reaped; this process draws its share."""
    monkeypatch.setattr(plots, "CHILD_TIMEOUT_SECONDS", 1.0)
    parent = os.getpid()
    real = {"a": (_bar([3, 4]), (4.0, 3.0)), "b": (_bar([1, 5, 2]), (4.0, 3.0))}

    def stuck_in_child(draw):
        def wrapped(fig):
            while os.getpid() != parent:
                time.sleep(10)
            draw(fig)
        return wrapped

    plan = {n: (stuck_in_child(d), size) for n, (d, size) in real.items()}
    assert plots.draw_pngs(plan, processes=2) == plots.draw_pngs(real)  # the child never ends by itself
    assert len(forks) == 1 and _reaped(forks[0])


def test_an_error_here_still_waits_for_the_child(forks):
    parent = os.getpid()

    def fails_here(fig):
        if os.getpid() == parent:
            raise ValueError("drawing failed here")
        fig.subplots().bar([0], [1])

    plan = {"a": (fails_here, (4.0, 3.0)), "b": (fails_here, (4.0, 3.0))}
    with pytest.raises(ValueError, match="drawing failed here"):
        plots.draw_pngs(plan, processes=2)
    assert len(forks) == 1 and _reaped(forks[0])
