"""The ``Stage`` unit: everything about one pipeline stage, declared in one place.

A stage module under :mod:`megacpp_core.stages` declares one :class:`Stage`:

* its **partitioning** (:class:`Partitioning`: per repo revision, per revision × shard, or
  per snapshot);
* its **inputs** and **outputs**, each a :class:`Dataset` of the catalog
  (:mod:`megacpp_core.catalog`) bound to its key template under the data root and, for
  tables, to its pandera schema;
* its **settings**: the names of the manifest settings it reads (its slice; reading any
  other setting raises), whose fingerprint is recorded with every materialization;
* its **gates**: functions ``gate(ctx) -> (passed, detail)`` run on the committed outputs;
  the check name is the function's name; each output table with a schema adds a gate
  ``<dataset>_schema``;
* its **figures**: the names of the numbers its compute reports (asset metadata, the
  dataset card);
* a **code_version** (bump it when the stage's logic changes: its assets turn
  "unsynced" in the UI and ``megacpp run`` re-materializes them and what depends on them);
* its **compute**: one function ``compute(ctx) -> Result`` from input tables (read
  through ``ctx``) to output tables (returned in the :class:`Result`).

The runner (:mod:`megacpp_core.runner`) resolves inputs, commits outputs through the data
root (:mod:`megacpp_core.storage`) and evaluates gates; the asset factory
(``megacpp_assets.factory``) turns the same declarations into Dagster assets and
blocking asset checks. Nothing here imports Dagster.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

#: A gate's outcome: ``(passed, detail)``; the detail is shown with the asset check.
Verdict = tuple[bool, str]


class Partitioning(enum.Enum):
    """How a stage's work (and its outputs) is keyed (SPEC §5)."""

    #: one ``repo_revision`` partition per source of a snapshot (key ``SNAPSHOT/SOURCE``)
    REVISION = "revision"
    #: a revision split into bounded shards (key ``SNAPSHOT/SOURCE/SHARD``; in Dagster the
    #: multi-partition ``SNAPSHOT/SOURCE|SHARD``): the per-document stages
    #: (:mod:`megacpp_core.sharding`)
    REVISION_SHARD = "revision_shard"
    #: one ``snapshot`` partition per manifest (key ``SNAPSHOT``)
    SNAPSHOT = "snapshot"


class Kind(enum.Enum):
    """What a dataset is stored as."""

    PARQUET = "parquet"   # one parquet file; the compute returns a ``pyarrow.Table`` (or a local parquet file)
    JSON = "json"         # one JSON file; the compute returns a JSON-serializable object
    TEXT = "text"         # one UTF-8 file; the compute returns ``str``
    FILES = "files"       # several files under a directory key; the compute returns :class:`Files`
    SHARDS = "shards"     # parquet shards + a ``_SUCCESS`` sentinel written last; :class:`Shards`


@dataclass(frozen=True)
class Partition:
    """One partition of the graph: a snapshot, a revision (``source``) of it, or a shard."""

    snapshot: str
    source: str | None = None
    shard: str | None = None

    @property
    def key(self) -> str:
        """The Dagster partition key: ``SNAPSHOT``, ``SNAPSHOT/SOURCE`` or, for a shard (a
        multi-partition of the ``revision`` and ``shard`` dimensions), ``SNAPSHOT/SOURCE|SHARD``."""
        base = self.snapshot if self.source is None else f"{self.snapshot}/{self.source}"
        return base if self.shard is None else f"{base}|{self.shard}"

    @classmethod
    def parse(cls, key: str, partitioning: "Partitioning") -> "Partition":
        """The partition of Dagster key ``key`` (see :attr:`key`) for a stage with
        ``partitioning``; raises ``ValueError`` for a key of another form."""
        if partitioning is Partitioning.SNAPSHOT:
            if not key or "/" in key or "|" in key:
                raise ValueError(f"snapshot partition key {key!r} is not of the form SNAPSHOT")
            return cls(key)
        rev, bar, shard = key.partition("|")
        snapshot, sep, source = rev.partition("/")
        if not sep or not snapshot or not source or "/" in source:
            raise ValueError(f"partition key {key!r} is not of the form SNAPSHOT/SOURCE[|SHARD]")
        if partitioning is Partitioning.REVISION:
            if bar:
                raise ValueError(f"repo_revision partition key {key!r} has a shard")
            return cls(snapshot, source)
        if not bar or not shard:
            raise ValueError(f"revision × shard partition key {key!r} is not of the form SNAPSHOT/SOURCE|SHARD")
        return cls(snapshot, source, shard)

    @property
    def partitioning(self) -> Partitioning:
        if self.source is None:
            return Partitioning.SNAPSHOT
        return Partitioning.REVISION if self.shard is None else Partitioning.REVISION_SHARD


SchemaCheck = Callable[[Any], Verdict]


@dataclass(frozen=True)
class Dataset:
    """A stage output that later stages may read, addressed under the snapshot's prefix.

    ``path``: key template relative to ``snapshots/SNAPSHOT/`` with ``{source}`` /
    ``{shard}`` fields for revision and shard scope (``revisions/{source}/license.parquet``).
    Multi-file datasets name their commit ``marker`` (shards: ``_SUCCESS``).
    ``schema``: for parquet tables, ``validate(table) -> (passed, detail)`` (a pandera
    schema of :mod:`megacpp_checks.schemas`); it becomes the blocking check
    ``<name>_schema``. ``description``: what a row (or the file) is.
    """

    name: str
    scope: Partitioning
    path: str
    kind: Kind = Kind.PARQUET
    schema: SchemaCheck | None = None
    description: str = ""
    #: for a parquet table that may exceed memory: ``validate(pyarrow.parquet.ParquetFile)
    #: -> (passed, detail)``, run on the committed file (row group by row group) instead of
    #: ``schema`` on the whole table, for the same ``<name>_schema`` check
    schema_file: Callable[[Any], Verdict] | None = None
    #: for a multi-file (``FILES``) dataset, the file that commits it, relative to its
    #: directory (``{snapshot}`` allowed): readers and freshness check it, and it is
    #: removed first and written last
    marker: str | None = None

    def marker_key(self, partition: Partition) -> str | None:
        """The data-root key of the commit marker (``_SUCCESS`` for shards), or None."""
        if self.kind is Kind.SHARDS:
            return f"{self.key(partition)}/_SUCCESS"
        if self.marker is None:
            return None
        return f"{self.key(partition)}/{self.marker.format(snapshot=partition.snapshot)}"

    def key(self, partition: Partition) -> str:
        """The data-root key of this dataset for ``partition`` (which must match the scope)."""
        if self.scope is not Partitioning.SNAPSHOT and partition.source is None:
            raise ValueError(f"dataset {self.name} is per {self.scope.value}; partition {partition.key!r} has no source")
        if self.scope is Partitioning.REVISION_SHARD and partition.shard is None:
            raise ValueError(f"dataset {self.name} is per revision × shard; partition {partition.key!r} has no shard")
        rel = self.path.format(source=partition.source, shard=partition.shard)
        return f"snapshots/{partition.snapshot}/{rel}"

    @property
    def schema_check(self) -> str | None:
        """Name of the generated schema gate, or None."""
        return f"{self.name}_schema" if self.schema is not None else None


@dataclass(frozen=True)
class Files:
    """A multi-file output: ``{relative name: local path}`` of files produced in scratch
    space; committed in ``order`` (the last one is the commit marker readers check)."""

    files: dict[str, Any]
    order: tuple[str, ...] = ()


@dataclass(frozen=True)
class Shards:
    """A sharded parquet output: ``[(file name, table, extra figures for the file)]`` and
    the sentinel fields; the runner writes every file, then ``_SUCCESS`` with the files'
    sha256s (SPEC §6), last."""

    files: list[tuple[str, Any, dict]]
    sentinel: dict
    row_group_size: int = 1024


@dataclass(frozen=True)
class PerShard:
    """The value of a per-shard output written by a per-revision stage (acquire, which
    decides the shards): ``{shard key: value}`` for every shard of the revision. A value of
    a parquet dataset is a ``pyarrow.Table`` or the path of a local parquet file the stage
    streamed (written with :class:`~megacpp_core.tables.ParquetStream` in scratch space
    such as ``ctx.workdir()``), which the runner moves into place."""

    values: dict[str, Any]


@dataclass
class Result:
    """What a compute returns: one value per declared output (by dataset name) and figures."""

    outputs: dict[str, Any]
    figures: dict[str, Any] = field(default_factory=dict)


#: ``gate(ctx: megacpp_core.runner.GateContext) -> (passed, detail)``
Gate = Callable[[Any], Verdict]


class StageError(RuntimeError):
    """A stage failed closed (a gate that must not let anything through, or bad input);
    nothing downstream may read its outputs. The message names the stage and the cause."""


@dataclass(frozen=True)
class Stage:
    """A declared pipeline stage (see the module docstring).

    ``name``: the stage id (``quality``; figures and logs use it). ``asset``: the Dagster
    asset name (``quality_files``). ``heavy``: a pod class of
    ``megacpp_assets.profiles.HEAVY_STEP_TAGS`` (its own Kubernetes pod and pool) or None.
    ``tools``: ``{name: default factory}`` of the tools the compute asks for with
    ``ctx.tool(name)`` (under Dagster, a ``ConfigurableResource`` of the same name hands
    in its instance). ``enabled``: a setting name that switches the
    stage off (its outputs are removed and its gates pass as "off"), or None.
    """

    name: str
    asset: str
    partitioning: Partitioning
    compute: Callable[[Any], Result]  # compute(ctx: megacpp_core.runner.StageContext)
    code_version: str
    description: str
    inputs: tuple[Dataset, ...] = ()
    outputs: tuple[Dataset, ...] = ()
    settings: tuple[str, ...] = ()
    gates: tuple[Gate, ...] = ()
    figures: tuple[str, ...] = ()
    heavy: str | None = None
    tools: dict[str, Callable[[], Any]] = field(default_factory=dict)
    enabled: str | None = None
    #: asset kinds shown in the UI
    kinds: tuple[str, ...] = ("parquet",)
    #: whether a revision partition of this stage needs its source's pin (acquire only)
    reads_source_pin: bool = False
    #: ``plots(figures) -> {name: PNG bytes}``: images of the stage's figures for the UI
    #: (``megacpp_core.plots``; drawn by the runner when every gate passed, the asset shows
    #: them as markdown metadata), or None
    plots: Callable[[dict], dict[str, bytes]] | None = None

    def __post_init__(self) -> None:
        names = [g.__name__ for g in self.gates] + [d.schema_check for d in self.outputs if d.schema_check]
        if len(names) != len(set(names)):
            raise ValueError(f"stage {self.name}: duplicate check names {names}")
        for d in self.outputs:
            splits = self.partitioning is Partitioning.REVISION and d.scope is Partitioning.REVISION_SHARD
            if d.scope is not self.partitioning and not splits:
                raise ValueError(f"stage {self.name} is per {self.partitioning.value} but writes {d.name} per {d.scope.value}")
        if self.enabled is not None and self.enabled not in self.settings:
            raise ValueError(f"stage {self.name}: switch {self.enabled!r} must be one of its settings")

    @property
    def check_names(self) -> tuple[str, ...]:
        """Every blocking check of the stage's asset: its gates, then one schema check per
        output table with a schema."""
        return tuple([g.__name__ for g in self.gates] + [d.schema_check for d in self.outputs if d.schema_check])

    def settings_fingerprint(self, settings: Any, extra: dict | None = None) -> str:
        """Hex sha256 (16 chars) of this stage's slice of ``settings`` (and ``extra`` pins),
        recorded with every materialization; a change makes the partition out of date."""
        blob = {name: _jsonable(getattr(settings, name)) for name in self.settings}
        blob.update(extra or {})
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def _jsonable(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


class SettingsView:
    """The slice of a :class:`~megacpp_core.manifest.Settings` a stage declared; reading any
    other setting raises ``AttributeError`` naming the stage (the slice is the contract
    that decides which settings changes re-run which stages)."""

    def __init__(self, settings: Any, names: Iterable[str], stage: str):
        object.__setattr__(self, "_settings", settings)
        object.__setattr__(self, "_names", frozenset(names))
        object.__setattr__(self, "_stage", stage)

    def __getattr__(self, name: str) -> Any:
        if name not in self._names:
            raise AttributeError(f"stage {self._stage} did not declare setting {name!r} (declared: {sorted(self._names)})")
        return getattr(self._settings, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("settings are read-only")
