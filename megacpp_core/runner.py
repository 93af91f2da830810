"""Run one declared stage on one partition, without Dagster (the asset factory calls this).

:func:`run_stage` resolves the stage's declared inputs under the data root, calls its
compute, commits its outputs through :class:`~megacpp_core.storage.DataRoot` (every file
atomically, a sentinel last), persists its figures for the dataset card and evaluates its
gates once the outputs are committed (a gate may re-read them from the data root with
``g.read``; schema checks validate the tables the compute returned, which are the bytes
committed). It returns a :class:`StageResult`: the written files with
their sha256, the figures, the gate verdicts, the stage's plots of its figures (drawn
when every gate passed, inside the stage's ``wall_seconds``), the partition's **data version** (a sha256
over the output files' sha256s: identical outputs give the identical version, so nothing
downstream goes out of date) and the fingerprint of the stage's settings slice.

Before computing, the partition's previous outputs are removed (a sentinel first), so a
failed or killed run never leaves an older output that a downstream stage could mistake
for the current one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from . import layout, sharding
from .manifest import Manifest, Source
from .stage import (Dataset, Files, Kind, Partition, Partitioning, PerShard, Result, SettingsView, Shards, Stage, StageError,
                    Verdict)
from .storage import DataRoot, MissingOutputError, Written
from .tables import peak_rss_mb, release_memory, reset_peak_rss

log = logging.getLogger("megacpp.pipeline")

SUCCESS = "_SUCCESS"


@dataclass
class StageResult:
    """What one stage run produced (see the module docstring)."""

    stage: str
    partition: Partition
    outputs: dict[str, list[Written]]
    figures: dict[str, Any]
    checks: dict[str, Verdict] = field(default_factory=dict)
    data_version: str = ""
    settings_fingerprint: str = ""
    #: ``{name: PNG bytes}``: the stage's ``plots`` of its figures, drawn when every gate
    #: passed (empty otherwise, or when the stage declares none), for the asset's metadata
    plots: dict[str, bytes] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every gate passed."""
        return all(v[0] for v in self.checks.values())


class InputRef:
    """A declared input of a running stage: one dataset at one partition.

    Tables: :meth:`read` (selected columns), :meth:`parquet_file` (row groups, record
    batches), :meth:`metadata` (``megacpp.*`` lineage keys); files: :meth:`read_text`,
    :meth:`read_json`, :meth:`read_bytes`; directories: :meth:`files`, :meth:`sentinel`,
    :meth:`local` (local paths, downloaded from an object store when needed). Every read
    of a missing key raises :class:`~megacpp_core.storage.MissingOutputError` naming it.
    """

    def __init__(self, root: DataRoot, dataset: Dataset, partition: Partition):
        self._root = root
        self.dataset = dataset
        self.partition = partition
        self.key = dataset.key(partition)
        self.source = partition.source

    def __repr__(self) -> str:
        return f"InputRef({self.dataset.name} @ {self.partition.key})"

    @property
    def uri(self) -> str:
        return self._root.uri(self.key)

    def exists(self) -> bool:
        """True when the dataset is committed: its file, or its commit marker (``_SUCCESS``
        of shards, the marker file of a multi-file dataset)."""
        marker = self.dataset.marker_key(self.partition)
        if marker is not None:
            return self._root.exists(marker)
        if self.dataset.kind is Kind.FILES:
            return bool([k for k in self._root.list(self.key) if ".tmp-" not in k])
        return self._root.exists(self.key)

    def read(self, columns: list[str] | None = None, filters=None) -> pa.Table:
        """The table (only ``columns``; only the rows matching the pyarrow expression
        ``filters``, applied row group by row group)."""
        return self._root.read_table(self.key, columns=columns, filters=filters)

    def parquet_file(self):
        return self._root.parquet_file(self.key)

    def iter_batches(self, columns: list[str] | None = None, batch_size: int = 1024) -> Iterator[pa.RecordBatch]:
        """Record batches decoded one at a time on this thread (:meth:`DataRoot.iter_batches`)."""
        return self._root.iter_batches(self.key, columns=columns, batch_size=batch_size)

    def schema(self) -> pa.Schema:
        return self._root.read_schema(self.key)

    def metadata(self) -> dict[str, str]:
        """The ``megacpp.*`` key-value metadata of a parquet input (prefix stripped)."""
        md = self.schema().metadata or {}
        return {k.decode()[len("megacpp."):]: v.decode() for k, v in md.items() if k.startswith(b"megacpp.")}

    def read_bytes(self) -> bytes:
        return self._root.read_bytes(self.key)

    def version(self) -> tuple | None:
        """The stored object's version token (:meth:`~megacpp_core.storage.DataRoot.version`)."""
        return self._root.version(self.key)

    def read_text(self) -> str:
        return self._root.read_text(self.key)

    def read_json(self) -> Any:
        return self._root.read_json(self.key)

    def files(self) -> list[str]:
        """Names (relative to the dataset's directory) of the files of a directory dataset."""
        return [k[len(self.key) + 1:] for k in self._root.list(self.key)]

    def sentinel(self) -> dict:
        """The ``_SUCCESS`` sentinel of a sharded dataset; readers refuse a directory without
        it (:class:`megacpp_core.pack.IncompleteShardsError`)."""
        from .pack import IncompleteShardsError

        if not self._root.exists(f"{self.key}/{SUCCESS}"):
            raise IncompleteShardsError(f"{self.uri}: no {SUCCESS} sentinel; the shards are incomplete and must not be read")
        return self._root.read_json(f"{self.key}/{SUCCESS}")

    def read_member(self, name: str, columns: list[str] | None = None) -> pa.Table:
        """One parquet file of a directory dataset."""
        return self._root.read_table(f"{self.key}/{name}", columns=columns)

    @contextlib.contextmanager
    def local(self, names: list[str] | None = None) -> Iterator[Path]:
        """A local path of the dataset (the file, or a directory holding ``names`` of a
        directory dataset; every member when ``names`` is None). Raises
        :class:`~megacpp_core.storage.MissingOutputError` when there is nothing to copy."""
        if self.dataset.kind in (Kind.FILES, Kind.SHARDS):
            members = [f"{self.key}/{n}" for n in (names if names is not None else self.files())]
            if not members:
                raise MissingOutputError(f"{self.uri}: missing (materialize the upstream asset first)")
            with self._root.local_copy(members) as got:
                yield next(iter(got.values())).parent
        else:
            with self._root.local_copy([self.key]) as got:
                yield got[self.key]


def revision_shards(root: DataRoot, snapshot: str, source: str) -> list[str]:
    """The shard keys of a revision, from its shard plan. Raises
    :class:`~megacpp_core.storage.MissingOutputError` when the revision has not been
    acquired, :class:`~megacpp_core.sharding.ShardPlanError` for a malformed plan."""
    key = layout.shard_plan_key(snapshot, source)
    if not root.exists(key):
        raise MissingOutputError(f"{root.uri(key)}: missing — revision {snapshot}/{source} has no shard plan "
                                 "(materialize source_files for it first)")
    return sharding.shard_keys(root.read_json(key))


def _settings_object(manifest: Manifest) -> Any:
    """The settings a stage may declare: every :class:`~megacpp_core.manifest.Settings`
    field plus ``tokenizer`` (the manifest's pinned tokenizer, or None)."""
    return types.SimpleNamespace(**dataclasses.asdict(manifest.settings), tokenizer=manifest.tokenizer)


class StageContext:
    """What a compute sees: its partition, its settings slice, its declared inputs, tools,
    a local cache and scratch space, and a progress logger. Anything undeclared raises."""

    def __init__(self, stage: Stage, root: DataRoot, manifest: Manifest, partition: Partition,
                 tools: dict[str, Any] | None = None, log_fn: Callable[[str], None] | None = None):
        self.stage = stage
        self._root = root
        self._manifest = manifest
        self.partition = partition
        self.snapshot = manifest.name
        self.settings = SettingsView(_settings_object(manifest), stage.settings, stage.name)
        self.sources: tuple[Source, ...] = manifest.sources
        self.source: Source | None = manifest.source(partition.source) if partition.source else None
        self._tools = dict(tools or {})
        self._log = log_fn or log.info
        self._inputs = {d.name: d for d in stage.inputs}
        self._cleanup = contextlib.ExitStack()

    def _declared(self, name: str) -> Dataset:
        try:
            return self._inputs[name]
        except KeyError:
            raise StageError(f"stage {self.stage.name} reads {name!r}, which it did not declare as an input "
                             f"(declared: {sorted(self._inputs)})") from None

    def input(self, name: str) -> InputRef:
        """The declared input ``name`` at this partition: a snapshot dataset at the
        snapshot, a revision dataset at this partition's revision, a shard dataset at this
        partition's shard (a per-revision stage reads a revision's shards with
        :meth:`inputs`)."""
        d = self._declared(name)
        p = self.partition
        if d.scope is Partitioning.SNAPSHOT:
            return InputRef(self._root, d, Partition(p.snapshot))
        if p.source is None or (d.scope is Partitioning.REVISION_SHARD and p.shard is None):
            raise StageError(f"stage {self.stage.name}: {name} is per {d.scope.value}; use ctx.inputs({name!r})")
        if d.scope is Partitioning.REVISION:
            return InputRef(self._root, d, Partition(p.snapshot, p.source))
        return InputRef(self._root, d, p)

    def inputs(self, name: str) -> list[InputRef]:
        """Every partition of a finer-grained input: one :class:`InputRef` per source (in
        manifest order) for a revision dataset read by a snapshot stage; per source and
        shard (shard order, from each revision's plan) for a shard dataset — only this
        revision's shards when the stage is per revision."""
        d = self._declared(name)
        p = self.partition
        if d.scope is Partitioning.SNAPSHOT:
            return [self.input(name)]
        sources = [p.source] if p.source is not None else [s.name for s in self.sources]
        if d.scope is Partitioning.REVISION:
            return [InputRef(self._root, d, Partition(p.snapshot, s)) for s in sources]
        return [InputRef(self._root, d, Partition(p.snapshot, s, k))
                for s in sources for k in revision_shards(self._root, p.snapshot, s)]

    def tool(self, name: str) -> Any:
        """A declared tool (a ScanCode scanner, …): the one the orchestrator handed in, else
        the stage's default."""
        if name not in self.stage.tools:
            raise StageError(f"stage {self.stage.name} did not declare tool {name!r}")
        if name not in self._tools:
            self._tools[name] = self.stage.tools[name]()
        return self._tools[name]

    @property
    def cache_dir(self) -> Path:
        """The local content cache of fetched sources (stays on the machine or pod)."""
        return self._root.cache_dir

    def scratch(self, prefix: str = "megacpp-"):
        """A local temporary directory (context manager), removed when the block ends."""
        return self._root.scratch(prefix)

    def workdir(self, prefix: str = "megacpp-") -> Path:
        """A local temporary directory that lives until the stage's outputs are committed:
        for :class:`~megacpp_core.stage.Files` outputs built on local disk."""
        return self._cleanup.enter_context(self._root.scratch(prefix))

    def log(self, message: str) -> None:
        """A progress line for the run log."""
        self._log(message)

    def output_key(self, name: str) -> str:
        """The data-root key of a declared output at this partition."""
        d = next(o for o in self.stage.outputs if o.name == name)
        return d.key(self.partition)


class GateContext:
    """What a gate sees: the compute's :class:`~megacpp_core.stage.Result` values, the
    committed files (:meth:`read` re-reads them from the data root), the figures, the
    settings slice and the stage's inputs."""

    def __init__(self, ctx: StageContext, result: Result, written: dict[str, list[Written]]):
        self.ctx = ctx
        self.settings = ctx.settings
        self.figures = result.figures
        self._values = result.outputs
        self.written = written
        self._root = ctx._root

    def value(self, name: str) -> Any:
        """The value the compute returned for output ``name`` (a table, text, …)."""
        return self._values[name]

    def read(self, name: str, columns: list[str] | None = None) -> pa.Table:
        """Output table ``name`` as committed (re-read from the data root)."""
        return self._root.read_table(self.ctx.output_key(name), columns=columns)

    def output(self, name: str) -> InputRef:
        """A committed output as an :class:`InputRef` (directories, sentinels, local copies)."""
        d = next(o for o in self.ctx.stage.outputs if o.name == name)
        return InputRef(self._root, d, self.ctx.partition)

    def input(self, name: str) -> InputRef:
        return self.ctx.input(name)

    def inputs(self, name: str) -> list[InputRef]:
        return self.ctx.inputs(name)


def _shard_keys_written(root: DataRoot, d: Dataset, partition: Partition) -> list[str]:
    """Every committed key of shard dataset ``d`` under revision ``partition`` (any shard)."""
    head, _, tail = d.path.partition("{shard}")
    prefix = f"snapshots/{partition.snapshot}/{head.format(source=partition.source).rstrip('/')}"
    tail = tail.format(source=partition.source)
    return [k for k in root.list(prefix) if k.endswith(tail) and k[len(prefix) + 1:-len(tail)].isdigit()]


def _clear(root: DataRoot, d: Dataset, partition: Partition) -> None:
    if d.scope is Partitioning.REVISION_SHARD and partition.shard is None:
        for k in _shard_keys_written(root, d, partition):  # a per-revision stage re-splitting its revision
            root.delete(k)
        return
    key = d.key(partition)
    marker = d.marker_key(partition)
    if marker is not None:
        root.delete(marker)  # readers first lose the commit marker, then the files
    if d.kind in (Kind.SHARDS, Kind.FILES):
        root.delete_prefix(key)
    else:
        root.delete(key)
        root.delete_temporaries(key)


def _commit(root: DataRoot, d: Dataset, partition: Partition, value: Any) -> list[Written]:
    if d.scope is Partitioning.REVISION_SHARD and partition.shard is None:
        if not isinstance(value, PerShard):
            raise StageError(f"output {d.name} is per shard: expected PerShard, got {type(value).__name__}")
        return [w for shard, v in sorted(value.values.items())
                for w in _commit(root, d, Partition(partition.snapshot, partition.source, shard), v)]
    key = d.key(partition)
    if d.kind is Kind.PARQUET:
        if isinstance(value, (str, os.PathLike)):  # a parquet file the stage streamed to local scratch
            return [root.put_file(value, key, move=True)]
        if not isinstance(value, pa.Table):
            raise StageError(f"output {d.name}: expected a pyarrow.Table or a local parquet file, got {type(value).__name__}")
        return [root.write_table(key, value)]
    if d.kind is Kind.JSON:
        return [root.write_json(key, value)]
    if d.kind is Kind.TEXT:
        if isinstance(value, bytes):
            return [root.write_bytes(key, value)]
        return [root.write_text(key, value)]
    if d.kind is Kind.SHARDS:
        if not isinstance(value, Shards):
            raise StageError(f"output {d.name}: expected Shards, got {type(value).__name__}")
        written, files = [], []
        for name, table, info in value.files:
            if isinstance(table, (str, os.PathLike)):  # a file the stage streamed to local scratch
                w = root.put_file(table, f"{key}/{name}", move=True)
            else:
                w = root.write_table(f"{key}/{name}", table, row_group_size=value.row_group_size)
            written.append(w)
            files.append({**info, "file": name, "sha256": w.sha256})
        sentinel = {**value.sentinel, "files": files}
        written.append(root.write_json(f"{key}/{SUCCESS}", sentinel))
        return written
    if d.kind is Kind.FILES:
        if not isinstance(value, Files):
            raise StageError(f"output {d.name}: expected Files, got {type(value).__name__}")
        order = [n for n in sorted(value.files) if n not in value.order] + list(value.order)
        marker = d.marker_key(partition)
        if marker is not None and (not order or f"{key}/{order[-1]}" != marker):
            raise StageError(f"output {d.name}: its commit marker {marker} must be the last file written")
        return [root.put_file(value.files[n], f"{key}/{n}", move=True) for n in order]
    raise StageError(f"output {d.name}: unknown kind {d.kind}")


def _schema_verdict(root: DataRoot, d: Dataset, partition: Partition, value: Any) -> Verdict:
    """The schema gate of output ``d`` (every shard of a :class:`PerShard` value). A table
    the compute streamed to a local file is validated as committed, re-read from the data
    root one file (one shard) at a time."""
    if isinstance(value, PerShard):
        return _shards_verdict(root, d, partition, value)
    if d.kind is Kind.PARQUET and d.schema_file is not None:
        return tuple(d.schema_file(root.parquet_file(d.key(partition))))
    if d.kind is Kind.PARQUET and isinstance(value, (str, os.PathLike)):
        value = root.parquet_file(d.key(partition)).read(use_threads=False)  # no reader threads: memory is one table
        try:
            return tuple(d.schema(value))
        finally:
            del value
            release_memory()
    return tuple(d.schema(value))


def _shards_verdict(root: DataRoot, d: Dataset, partition: Partition, value: PerShard) -> Verdict:
    bad = [(k, detail) for k, v in sorted(value.values.items())
           for ok, detail in [_schema_verdict(root, d, Partition(partition.snapshot, partition.source, k), v)] if not ok]
    if bad:
        return False, f"shard {bad[0][0]}: {bad[0][1]}" + (f" (and {len(bad) - 1} more shards)" if len(bad) > 1 else "")
    return True, f"{len(value.values)} shard(s) valid"


def data_version(written: dict[str, list[Written]]) -> str:
    """Hex sha256 over ``key:sha256`` of every committed file, keys sorted (relative to the
    snapshot, so the same outputs under another data root give the same version)."""
    lines = sorted(f"{w.key.split('/', 2)[-1]}:{w.sha256}" for ws in written.values() for w in ws)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def settings_fingerprint(stage: Stage, manifest: Manifest, partition: Partition) -> str:
    """The fingerprint of ``stage``'s settings slice (plus the source pin for a stage that
    reads it), as recorded with its materializations."""
    extra = {}
    if stage.reads_source_pin and partition.source:
        extra["source_pin"] = manifest.source(partition.source).settings_key()
    return stage.settings_fingerprint(_settings_object(manifest), extra)


def run_stage(stage: Stage, root: DataRoot, manifest: Manifest, partition: Partition,
              tools: dict[str, Any] | None = None, log_fn: Callable[[str], None] | None = None) -> StageResult:
    """Run ``stage`` on ``partition`` (see the module docstring).

    Raises :class:`~megacpp_core.stage.StageError` when the compute fails closed, returns
    an undeclared output or figure, or misses a declared output; whatever the compute
    raises otherwise (a fetch error, a hostile archive) propagates with nothing committed
    for the partition.
    """
    t0 = time.perf_counter()
    if partition.partitioning is not stage.partitioning:
        raise StageError(f"stage {stage.name} is per {stage.partitioning.value}; got partition {partition.key!r}")
    ctx = StageContext(stage, root, manifest, partition, tools, log_fn)
    with ctx._cleanup:
        return _run(stage, root, manifest, partition, ctx, t0)


def _run(stage: Stage, root: DataRoot, manifest: Manifest, partition: Partition, ctx: StageContext,
         t0: float) -> StageResult:
    for d in stage.outputs:
        _clear(root, d, partition)
    fig_key = layout.figures_key(partition.snapshot, stage.name, partition.source, partition.shard)
    root.delete(fig_key)  # no stale figures
    written: dict[str, list[Written]] = {}
    ran = False
    shards = (revision_shards(root, partition.snapshot, partition.source)
              if partition.partitioning is Partitioning.REVISION_SHARD else None)
    if shards is not None and partition.shard not in shards:
        result = Result({}, {"empty_shard": True})
        checks = {c: (True, f"shard {partition.shard} is beyond the {len(shards)} shard(s) of {partition.source}: "
                            "no file, nothing written") for c in stage.check_names}
    elif stage.enabled is not None and not getattr(ctx.settings, stage.enabled):
        result = Result({}, {"enabled": False})
        checks = {c: (True, f"stage {stage.name} is off for this snapshot (settings.{stage.enabled}: false)")
                  for c in stage.check_names}
    else:
        ran = True
        release_memory()
        reset_peak_rss()
        result = stage.compute(ctx)
        release_memory()
        got, want = set(result.outputs), {d.name for d in stage.outputs}
        if got != want:
            raise StageError(f"stage {stage.name} returned outputs {sorted(got)}, declared {sorted(want)}")
        undeclared = sorted(set(result.figures) - set(stage.figures))
        if undeclared:
            raise StageError(f"stage {stage.name} reported undeclared figures {undeclared}")
        for d in stage.outputs:
            written[d.name] = _commit(root, d, partition, result.outputs[d.name])
        checks = {}
        gctx = GateContext(ctx, result, written)
        for gate in stage.gates:
            try:
                checks[gate.__name__] = tuple(gate(gctx))
            except Exception as e:  # a gate that cannot run has not passed
                checks[gate.__name__] = (False, f"gate raised {type(e).__name__}: {e}")
        for d in stage.outputs:
            if d.schema is not None:
                checks[d.schema_check] = _schema_verdict(root, d, partition, result.outputs[d.name])
    figures = dict(result.figures)
    # the stage's images of its figures are part of its work (drawn here, timed with it);
    # a drawing that fails fails the stage, once its figures are persisted below
    images, plot_error = {}, None
    if stage.plots is not None and all(v[0] for v in checks.values()):
        try:
            images = stage.plots(figures)
        except Exception as e:  # noqa: BLE001 — raised again after the figures are written
            plot_error = e
    figures["wall_seconds"] = round(time.perf_counter() - t0, 3)
    if ran:
        figures["max_rss_mb"] = peak_rss_mb()  # the step's own process: compute, commit and gates
    if shards is None or partition.shard in shards:
        root.write_json(fig_key, figures)
    if plot_error is not None:
        raise plot_error
    res = StageResult(stage.name, partition, written, figures, checks, data_version(written),
                      settings_fingerprint(stage, manifest, partition), images)
    brief = ", ".join(f"{k}={figures[k]}" for k in ("files", "files_out", "documents", "tokens", "rows", "vocab_size")
                      if isinstance(figures.get(k), int))
    rss = f"{figures['max_rss_mb']:7.0f} MB" if figures.get("max_rss_mb") is not None else " " * 10
    log.info("%-12s %-28s %7.1fs %s  %s", stage.name, partition.key, figures["wall_seconds"], rss, brief)
    return res


def output_uris(root: DataRoot, res: StageResult) -> dict[str, str]:
    """``{dataset name: URI}`` of a result's outputs (directories for multi-file outputs)."""
    out = {}
    for name, ws in res.outputs.items():
        if len(ws) == 1:
            out[name] = root.uri(ws[0].key)
        elif ws:
            out[name] = root.uri(ws[0].key.rsplit("/", 1)[0])
    return out
