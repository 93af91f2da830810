"""Plots of the curriculum families (SPEC §8 "figures users look at"): PNG images drawn
with matplotlib's Agg canvas from the family stages' figures, for the dataset card (files
next to ``card.md``) and the Dagster UI (markdown metadata with ``data:image/png``
images).

Three plots, from each family stage's figures (:mod:`megacpp_core.stages.families`):

- ``family_document_lengths`` — per family, documents per length bin (tokens with BOS,
  powers of two: the ``document_lengths`` figure);
- ``family_row_fill`` — per family, packed rows per fill bin (valid tokens / row length,
  tenths: the ``row_fill`` figure), with the family's overall fill;
- ``tokens_per_source`` — tokens per source, stacked by family (``tokens_per_source``).

:func:`family_plot` draws one family's two histograms side by side (its asset's metadata).

Deterministic: the same figures give the same PNG bytes (no pyplot state, fixed size,
dpi and font, no ``Software`` or date metadata, ``svg.hashsalt`` fixed). matplotlib is
imported only when a plot is drawn.
"""

from __future__ import annotations

import base64
import io
import os
import select
import signal
import struct
import sys
import time
from collections.abc import Callable, Mapping

#: Fill bins of the ``row_fill`` figure: tenths of the row length, the last one closed.
FILL_BINS = tuple(f"{10 * k}-{10 * (k + 1)}%" for k in range(10))
#: Pixels per inch of every PNG.
DPI = 100
_RC = {"svg.hashsalt": "megacpp", "font.family": "DejaVu Sans", "font.size": 8, "axes.titlesize": 9,
       "figure.max_open_warning": 0}
_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def row_fill_histogram(valid, row_length: int) -> dict[str, int]:
    """``{FILL_BINS label: rows}`` of per-row valid token counts ``valid`` (any integer
    sequence or array) in rows of ``row_length`` tokens; every label present (zeros
    included), a full row in the last bin. Raises ``ValueError`` for ``row_length < 1``
    or a count outside ``[0, row_length]``."""
    import numpy as np

    if row_length < 1:
        raise ValueError(f"row_length must be >= 1, got {row_length}")
    v = np.asarray(valid, dtype=np.int64)
    if v.size and (v.min() < 0 or v.max() > row_length):
        raise ValueError(f"valid token counts must lie in [0, {row_length}]")
    k = np.minimum(v * 10 // row_length, 9)
    counts = np.bincount(k, minlength=10)
    return {label: int(c) for label, c in zip(FILL_BINS, counts)}


def png(draw, size: tuple[float, float]) -> bytes:
    """PNG bytes of a figure of ``size`` inches drawn by ``draw(fig)`` on a fresh Agg
    canvas (:data:`DPI`), without pyplot and without time or software metadata."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=size, dpi=DPI, layout="constrained")
        FigureCanvasAgg(fig)
        draw(fig)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _bins(hist: Mapping[str, int]) -> list[tuple[int, int]]:
    """``(upper bound, count)`` of a ``{"<=N": count}`` histogram, by bound."""
    return sorted((int(k[2:]), int(v)) for k, v in hist.items())


def _lengths_axis(ax, hist: Mapping[str, int], title: str, color: str) -> None:
    bins = _bins(hist)
    labels = [f"≤{b:,}" if b < 1024 else f"≤{b // 1024}K" for b, _ in bins]
    ax.bar(range(len(bins)), [c for _, c in bins], color=color)
    ax.set_xticks(range(len(bins)), labels, rotation=60)
    ax.set_title(title)
    ax.set_ylabel("documents")


def _fill_axis(ax, hist: Mapping[str, int], fill: float | None, title: str, color: str) -> None:
    ax.bar(range(len(FILL_BINS)), [int(hist.get(b, 0)) for b in FILL_BINS], color=color)
    ax.set_xticks(range(len(FILL_BINS)), [b.split("-")[0] + "%" for b in FILL_BINS], rotation=60)
    ax.set_title(title + (f" (fill {100 * fill:.1f} %)" if fill is not None else ""))
    ax.set_ylabel("rows")
    ax.set_xlabel("row fill ≥")


def _grid(n: int) -> tuple[int, int]:
    cols = min(3, max(1, n))
    return -(-n // cols), cols


def family_plots(fam: Mapping[str, dict | None], processes: int = 1) -> dict[str, bytes]:
    """``{plot name: PNG bytes}`` of the three snapshot plots (module doc) from
    ``{family: its stage's figures or None}``; families without figures are left out, and
    with none at all the result is ``{}``. ``processes``: with 2 or more, the plots are
    drawn on two processes (:func:`draw_pngs`); the bytes are the same."""
    have = {name: f for name, f in fam.items() if f}
    if not have:
        return {}
    names = list(have)
    rows, cols = _grid(len(names))
    colors = {n: _COLORS[i % len(_COLORS)] for i, n in enumerate(names)}

    def lengths(fig):
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
        for ax, n in zip(axes, names):
            _lengths_axis(ax, have[n].get("document_lengths") or {}, f"{n} ({have[n].get('docs', 0):,} documents)", colors[n])
        for ax in axes[len(names):]:
            ax.set_visible(False)
        fig.suptitle("Document length per family (tokens with BOS)")

    def fill(fig):
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
        for ax, n in zip(axes, names):
            _fill_axis(ax, have[n].get("row_fill") or {}, have[n].get("fill"),
                       f"{n}: {have[n].get('rows', 0):,} rows of {have[n].get('row_length', 0):,}", colors[n])
        for ax in axes[len(names):]:
            ax.set_visible(False)
        fig.suptitle("Row fill per family")

    sources = sorted({s for f in have.values() for s in (f.get("tokens_per_source") or {})})

    def tokens(fig):
        ax = fig.subplots()
        left = [0] * len(sources)
        for n in names:
            per = have[n].get("tokens_per_source") or {}
            vals = [int(per.get(s, 0)) for s in sources]
            ax.barh(range(len(sources)), vals, left=left, color=colors[n], label=f"{n} ({sum(vals):,})")
            left = [a + b for a, b in zip(left, vals)]
        ax.set_yticks(range(len(sources)), sources)
        ax.invert_yaxis()
        ax.set_xlabel("tokens (with BOS), stacked by family")
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1e6:g} M" if x >= 1e6 or x == 0 else f"{x / 1e3:g} K")
        fig.legend(loc="outside lower center", ncols=min(5, len(names)))
        ax.set_title("Tokens per source and per family")

    return draw_pngs({"family_document_lengths": (lengths, (3.6 * cols, 2.8 * rows)),
                      "family_row_fill": (fill, (3.6 * cols, 2.8 * rows)),
                      "tokens_per_source": (tokens, (9.0, 1.8 + 0.32 * max(1, len(sources))))}, processes)


def draw_pngs(plan: Mapping[str, tuple[Callable, tuple[float, float]]], processes: int = 1) -> dict[str, bytes]:
    """``{name: png(draw, size)}`` for every ``name: (draw, size)`` of ``plan``, in its order.

    With ``processes >= 2`` (and ``os.fork``), a forked child draws a share of the plots
    while this process draws the rest: the plan is split in two by figure area (inches²,
    a proxy of the drawing time: most of it lays out and renders text and bars over the
    figure), the child sends its PNGs back through a pipe and ends with ``os._exit``. The
    child runs nothing but matplotlib on objects it inherited (no pickling: ``draw`` may
    be a closure) and writes nothing else (its standard streams go to ``os.devnull``).
    Should the fork fail, or the child end without sending every PNG, or not end within
    :data:`CHILD_TIMEOUT_SECONDS` of this process's own drawing (it is then killed), this
    process draws them itself, so the result never depends on the child. The bytes are
    those of :func:`png` either way (deterministic, module doc)."""
    names = list(plan)
    if processes < 2 or len(names) < 2 or not hasattr(os, "fork"):
        return {n: png(*plan[n]) for n in names}
    area = {n: plan[n][1][0] * plan[n][1][1] for n in names}
    mine: list[str] = []
    theirs: list[str] = []
    for n in sorted(names, key=lambda n: (-area[n], names.index(n))):  # largest first, to the lighter side
        (mine if sum(area[m] for m in mine) <= sum(area[t] for t in theirs) else theirs).append(n)
    got = _forked(theirs, plan)
    try:
        out = {n: png(*plan[n]) for n in mine}
    finally:
        sent = got()  # always waited for, so no child is left behind
    out.update(sent)
    return {n: out[n] if n in out else png(*plan[n]) for n in names}


#: How long (s) :func:`draw_pngs` waits for its child's PNGs before it ends the child
#: (``SIGKILL``) and draws them itself: the child draws in well under a second here, so
#: only a child stuck on something it inherited (a lock another thread held at the fork)
#: waits that long.
CHILD_TIMEOUT_SECONDS = 60.0


def _forked(names: list[str], plan) -> Callable[[], dict[str, bytes]]:
    """Start a child drawing ``names`` of ``plan``; return a call that waits for it (at
    most :data:`CHILD_TIMEOUT_SECONDS` from the call, then ends it) and gives what it sent
    (``{}`` when the fork failed, or the child failed, did not end in time, or sent a
    short or malformed payload)."""
    # a child of a process whose tokenizers used their thread pool prints a warning unless
    # the setting is explicit; "true" is their default (the child never encodes); set once
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    read, write = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        return dict
    if pid == 0:  # the child: writes nothing but its PNGs (its streams may be a parent's queue)
        code = 1
        try:
            os.close(read)
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            sys.stdout = sys.stderr = open(quiet, "w", closefd=False)  # noqa: SIM115 — the process ends below
            for n in names:
                data, name = png(*plan[n]), n.encode()
                payload = struct.pack("<II", len(name), len(data)) + name + data
                view = memoryview(payload)
                while view:
                    view = view[os.write(write, view):]
            code = 0
        finally:
            os._exit(code)
    os.close(write)

    def wait() -> dict[str, bytes]:
        chunks, deadline = [], time.monotonic() + CHILD_TIMEOUT_SECONDS
        poller = select.poll()  # not select(): a descriptor number past 1,023 is fine
        poller.register(read, select.POLLIN)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not poller.poll(left * 1000):
                    os.kill(pid, signal.SIGKILL)  # not done in time: ended, and its share drawn here
                    os.waitpid(pid, 0)
                    return {}
                chunk = os.read(read, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(read)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            return {}
        payload, out, at = b"".join(chunks), {}, 0
        while at + 8 <= len(payload):
            k, m = struct.unpack_from("<II", payload, at)
            out[payload[at + 8:at + 8 + k].decode()] = payload[at + 8 + k:at + 8 + k + m]
            at += 8 + k + m
        return out if at == len(payload) and set(out) == set(names) else {}

    return wait


def family_plot(figures: Mapping) -> bytes:
    """PNG bytes of one family's document-length and row-fill histograms side by side,
    from its stage's figures (``family``, ``document_lengths``, ``row_fill``, ``fill``,
    ``rows``, ``row_length``, ``docs``)."""
    name = figures.get("family", "family")

    def draw(fig):
        a, b = fig.subplots(1, 2)
        _lengths_axis(a, figures.get("document_lengths") or {}, f"{name}: {figures.get('docs', 0):,} documents", _COLORS[0])
        _fill_axis(b, figures.get("row_fill") or {}, figures.get("fill"),
                   f"{figures.get('rows', 0):,} rows of {figures.get('row_length', 0):,}", _COLORS[1])

    return png(draw, (8.0, 3.0))


def markdown_images(images: Mapping[str, bytes], titles: Mapping[str, str] | None = None) -> str:
    """Markdown with each PNG inline as a ``data:image/png;base64`` image (for a Dagster
    markdown metadata value), titled by ``titles`` or its name."""
    titles = titles or {}
    return "\n\n".join(f"**{titles.get(k, k)}**\n\n![{titles.get(k, k)}](data:image/png;base64,"
                       f"{base64.b64encode(v).decode('ascii')})" for k, v in images.items())
