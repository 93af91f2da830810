"""The configurable data root (SPEC §2, §9) and manifest resolution for partitions."""


import os
from pathlib import Path

from dagster import ConfigurableResource

from megacpp_core.layout import SnapshotLayout
from megacpp_core.manifest import Manifest, Source, load_manifest, split_partition_key


class DataRootResource(ConfigurableResource):
    """Where every stage reads and writes: ``data_root`` (default ``$MEGACPP_DATA_ROOT`` or ``./data``).

    A snapshot's manifest is the copy recorded under ``snapshots/NAME/manifest.yaml``
    by ``megacpp run`` (or the sensor), else the shipped ``corpora/NAME.yaml``.
    """

    data_root: str = ""

    def root(self) -> Path:
        """The configured root, else ``$MEGACPP_DATA_ROOT`` read at call time, else ``./data``."""
        return Path(self.data_root or os.environ.get("MEGACPP_DATA_ROOT", "data")).resolve()

    def layout(self, snapshot: str) -> SnapshotLayout:
        return SnapshotLayout(self.root(), snapshot)

    def manifest(self, snapshot: str) -> Manifest:
        recorded = self.layout(snapshot).root / "manifest.yaml"
        return load_manifest(recorded if recorded.exists() else snapshot)

    def for_revision(self, partition_key: str) -> tuple[SnapshotLayout, Manifest, Source]:
        """Resolve a ``repo_revision`` key ``SNAPSHOT/SOURCE`` to its layout, manifest and source."""
        snapshot, source = split_partition_key(partition_key)
        manifest = self.manifest(snapshot)
        return self.layout(snapshot), manifest, manifest.source(source)

    def for_snapshot(self, snapshot: str) -> tuple[SnapshotLayout, Manifest]:
        return self.layout(snapshot), self.manifest(snapshot)
