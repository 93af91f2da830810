"""Where a snapshot's outputs live under the data root (SPEC §9).

Keys are POSIX paths relative to the data root (:mod:`megacpp_core.storage`). A snapshot's
outputs are under ``snapshots/SNAPSHOT/``: per-revision stage tables in
``revisions/SOURCE/``, then ``dedup/``, ``tokenizer/``, ``documents/``, ``tokenized/``,
``packed/`` (parquet shards and ``_SUCCESS``), ``megatron/`` (``.bin/.idx``), ``figures/``
(one JSON per stage and partition, read only by the dataset card), ``manifest.yaml`` (the
manifest the snapshot was materialized from) and ``card.md``. Each stage's datasets are
declared in :mod:`megacpp_core.catalog`. Fetched archives are content-addressed in the
local cache (``DATA_ROOT/cache`` for a local root).

:class:`SnapshotLayout` is the same layout as local paths, for tools and tests that work
on a local data root.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def snapshot_prefix(snapshot: str) -> str:
    """``snapshots/SNAPSHOT``."""
    return f"snapshots/{snapshot}"


def figures_key(snapshot: str, stage: str, source: str | None = None, shard: str | None = None) -> str:
    """Key of a stage's figures: ``figures/STAGE.json``, ``figures/STAGE/SOURCE.json`` or,
    per revision × shard, ``figures/STAGE/SOURCE/SHARD.json``."""
    rel = f"{stage}.json" if source is None else f"{stage}/{source}.json" if shard is None else f"{stage}/{source}/{shard}.json"
    return f"{snapshot_prefix(snapshot)}/figures/{rel}"


def shard_plan_key(snapshot: str, source: str) -> str:
    """Key of a revision's shard plan (written by acquire; :mod:`megacpp_core.sharding`)."""
    return f"{snapshot_prefix(snapshot)}/revisions/{source}/shards.json"


def read_figures(root, snapshot: str, stage: str, source: str | None = None,
                 sources: list[str] | None = None) -> dict[str, Any] | None:
    """A stage's persisted figures for a partition of ``root`` (a
    :class:`~megacpp_core.storage.DataRoot`), or None when it has not run. For a per-shard
    stage: at a revision, its shards' figures (the revision's plan) merged with
    :func:`megacpp_core.sharding.merge_figures`; at the snapshot (``source`` None), every
    revision's merged figures merged again — over ``sources`` (manifest order) when given,
    else over the revisions that have figures."""
    from . import sharding

    key = figures_key(snapshot, stage, source)
    if root.exists(key):
        return root.read_json(key)
    if source is None:
        if sources is None:
            prefix = f"{snapshot_prefix(snapshot)}/figures/{stage}/"
            sources = sorted({k[len(prefix):].split("/", 1)[0] for k in root.list(prefix.rstrip("/"))
                              if "/" in k[len(prefix):]})
        got = [f for f in (read_figures(root, snapshot, stage, s) for s in sources) if f]
        return sharding.merge_figures(got) if got else None
    if not root.exists(shard_plan_key(snapshot, source)):
        return None
    keys = sharding.shard_keys(root.read_json(shard_plan_key(snapshot, source)))
    parts = [figures_key(snapshot, stage, source, k) for k in keys]
    got = [root.read_json(k) for k in parts if root.exists(k)]
    return sharding.merge_figures(got) if got else None


def manifest_key(snapshot: str) -> str:
    """Key of the recorded manifest of a snapshot."""
    return f"{snapshot_prefix(snapshot)}/manifest.yaml"


def card_key(snapshot: str) -> str:
    """Key of the dataset card of a snapshot."""
    return f"{snapshot_prefix(snapshot)}/card.md"


def default_data_root() -> Path:
    """``$MEGACPP_DATA_ROOT`` or ``./data``, made absolute (local roots only)."""
    import os

    return Path(os.environ.get("MEGACPP_DATA_ROOT", "data")).resolve()


@dataclass(frozen=True)
class SnapshotLayout:
    """Local paths of one snapshot's outputs under a local data root."""

    data_root: Path
    snapshot: str

    @property
    def cache(self) -> Path:
        return Path(self.data_root) / "cache"

    @property
    def root(self) -> Path:
        return Path(self.data_root) / snapshot_prefix(self.snapshot)

    def revision(self, source: str) -> Path:
        return self.root / "revisions" / source

    def shard(self, source: str, shard: str = "000") -> Path:
        """Directory of one shard of a revision (``revisions/SOURCE/shards/SHARD``)."""
        return self.revision(source) / "shards" / shard

    def _shard_refs(self, name: str) -> list:
        """A reader per shard (every revision's plan, shard order) of ``revisions/*/shards/*/NAME.parquet``."""
        import pyarrow.parquet as pq

        from . import sharding

        class _Ref:
            def __init__(self, path):
                self.path = path

            def read(self, columns=None, filters=None):
                return pq.read_table(self.path, columns=columns, filters=filters)

            def parquet_file(self):
                return pq.ParquetFile(self.path)

            def iter_batches(self, columns=None, batch_size=1024):
                return pq.ParquetFile(self.path, pre_buffer=False).iter_batches(batch_size, columns=columns,
                                                                                use_threads=False)

        refs = []
        for plan in sorted(self.root.glob("revisions/*/shards.json")):
            for k in sharding.shard_keys(json.loads(plan.read_text())):
                if (plan.parent / "shards" / k / f"{name}.parquet").exists():
                    refs.append(_Ref(plan.parent / "shards" / k / f"{name}.parquet"))
        return refs

    def kept_files(self, columns: list[str] | None = None):
        """The kept files of the snapshot (every revision's scrubbed shards filtered by the
        dedup decisions) in keep order, as one ``pyarrow.Table`` (:mod:`megacpp_core.kept`)."""
        import pyarrow.parquet as pq

        from . import kept

        decisions = pq.read_table(self.stage_dir("dedup") / "decisions.parquet", columns=["doc_key", "keep"])
        return kept.kept_table(self._shard_refs("scrubbed"), decisions, columns)

    def documents(self, name: str = "tokenized", columns: list[str] | None = None, without_drops: bool = False):
        """Every shard's ``chunks`` or ``tokenized`` documents as one ``pyarrow.Table`` in
        snapshot keep order (:func:`megacpp_core.kept.read_documents`; sources in the order
        of the recorded manifest); ``without_drops``: leave out the chunk-level dedup drops,
        as the pack and format stages do."""
        import pyarrow.parquet as pq

        import yaml

        from . import kept

        refs = self._shard_refs(name)
        recorded = Path(self.data_root) / manifest_key(self.snapshot)
        sources = (yaml.safe_load(recorded.read_text()) or {}).get("sources", []) if recorded.exists() else []
        names = [s["name"] for s in sources if isinstance(s, dict) and "name" in s]
        names += sorted({r.path.parts[-4] for r in refs} - set(names))  # revisions/SOURCE/shards/SHARD/x
        order = {n: i for i, n in enumerate(names)}
        drops = None
        if without_drops:
            drops = pq.read_table(self.stage_dir("documents") / "chunk_drops.parquet",
                                  columns=["doc_key"]).column("doc_key").combine_chunks()
        return kept.read_documents(refs, order, columns, drops)

    def stage_dir(self, name: str) -> Path:
        return self.root / name

    @property
    def card(self) -> Path:
        return Path(self.data_root) / card_key(self.snapshot)

    def figures_path(self, stage: str, source: str | None = None) -> Path:
        return Path(self.data_root) / figures_key(self.snapshot, stage, source)

    def read_figures(self, stage: str, source: str | None = None) -> dict[str, Any] | None:
        """A stage's figures for a partition (:func:`read_figures`); None when it has not run."""
        from .storage import open_root

        return read_figures(open_root(str(self.data_root)), self.snapshot, stage, source)
