"""The configurable data root (SPEC §2, §9) and manifest resolution for partitions."""


from dagster import ConfigurableResource

from megacpp_core.manifest import Manifest
from megacpp_core.snapshots import snapshot_manifest
from megacpp_core.stage import Partition, Partitioning
from megacpp_core.storage import DataRoot, open_root


class DataRootResource(ConfigurableResource):
    """Where every stage reads and writes: ``data_root`` — a local path or any fsspec URL
    (``s3://bucket/prefix``); default ``$MEGACPP_DATA_ROOT`` or ``./data``, read at call
    time. Object-store credentials come from the environment (``AWS_*`` for S3).

    A snapshot's manifest is the copy recorded under ``snapshots/NAME/manifest.yaml`` by
    ``megacpp run`` (or the sensor), else the shipped ``corpora/NAME.yaml``.
    """

    data_root: str = ""

    def root(self) -> DataRoot:
        """The data root (:class:`~megacpp_core.storage.DataRoot`)."""
        return open_root(self.data_root or None)

    def manifest(self, snapshot: str) -> Manifest:
        return snapshot_manifest(self.root(), snapshot)

    def resolve(self, partition_key: str, partitioning: Partitioning) -> tuple[DataRoot, Manifest, Partition]:
        """The data root, manifest and :class:`~megacpp_core.stage.Partition` of a Dagster
        partition key: ``SNAPSHOT`` for snapshot assets, ``SNAPSHOT/SOURCE`` for revision
        assets, ``SNAPSHOT/SOURCE|SHARD`` for revision × shard assets. Raises
        ``ValueError`` for a malformed key, ``KeyError`` for an unknown source."""
        root = self.root()
        partition = Partition.parse(str(partition_key), partitioning)
        manifest = snapshot_manifest(root, partition.snapshot)
        if partition.source is not None:
            manifest.source(partition.source)
        return root, manifest, partition
