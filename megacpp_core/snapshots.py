"""Snapshots on a data root: the manifest each one was materialized from.

``megacpp run`` (or the partition sensor) records the manifest of a snapshot under
``snapshots/NAME/manifest.yaml`` — its text as written — with ``manifest.origin.json``
naming the file it came from, so relative paths in it keep resolving against the
original directory. Every later reader (assets in any process or pod, the sensors, the
card) takes the recorded manifest, else the shipped ``corpora/NAME.yaml``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from . import layout
from .manifest import Manifest, ManifestError, load_manifest, parse_manifest, shipped_manifests
from .storage import DataRoot

log = logging.getLogger("megacpp.snapshots")


def origin_key(snapshot: str) -> str:
    """Key of the note naming where a recorded manifest came from."""
    return f"{layout.snapshot_prefix(snapshot)}/manifest.origin.json"


def record_manifest(root: DataRoot, manifest: Manifest) -> str:
    """Record ``manifest`` under ``snapshots/NAME/``; returns the manifest's key."""
    key = layout.manifest_key(manifest.name)
    root.write_text(key, manifest.path.read_text(encoding="utf-8"))
    root.write_json(origin_key(manifest.name), {"path": str(manifest.path)})
    return key


def recorded_manifest(root: DataRoot, snapshot: str) -> Manifest | None:
    """The manifest recorded for ``snapshot``, or None. Raises :class:`ManifestError` when it
    no longer parses."""
    key = layout.manifest_key(snapshot)
    if not root.exists(key):
        return None
    origin = Path(root.read_json(origin_key(snapshot))["path"]) if root.exists(origin_key(snapshot)) \
        else Path(root.uri(key))
    return parse_manifest(root.read_text(key), origin)


def snapshot_manifest(root: DataRoot, snapshot: str) -> Manifest:
    """The recorded manifest of ``snapshot``, else the shipped ``corpora/NAME.yaml``."""
    return recorded_manifest(root, snapshot) or load_manifest(snapshot)


def known_manifests(root: DataRoot) -> dict[str, Manifest]:
    """Every loadable manifest by snapshot name: shipped ones, then those recorded under
    the data root (which win). A manifest that does not load is logged and left out (it
    cannot be partitioned), never raised."""
    found: dict[str, Manifest] = {}
    for p in shipped_manifests():
        try:
            m = load_manifest(p)
        except ManifestError as e:
            log.warning("manifest %s left out: %s", p, e)
            continue
        found[m.name] = m
    for key in root.glob("snapshots/*/manifest.yaml"):
        name = key.split("/")[1]
        try:
            m = recorded_manifest(root, name)
        except ManifestError as e:
            log.warning("manifest %s left out: %s", root.uri(key), e)
            continue
        if m is not None:
            found[m.name] = m
    return dict(sorted(found.items()))
