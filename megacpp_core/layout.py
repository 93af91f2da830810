"""Where every stage's outputs live under the data root (SPEC §9).

``DATA_ROOT`` defaults to ``./data`` or ``$MEGACPP_DATA_ROOT``. A snapshot's outputs are
under ``DATA_ROOT/snapshots/SNAPSHOT/``: per-revision stage tables in
``revisions/SOURCE/``, then ``dedup/``, ``tokenizer/``, ``documents/``, ``tokenized/``,
``packed/`` (parquet shards and ``_SUCCESS``), ``megatron/`` (``.bin/.idx``), ``figures/``
(one JSON per stage, read by the dataset card) and ``card.md``. Fetched archives are
content-addressed under ``DATA_ROOT/cache/``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .tables import atomic_write_text


def default_data_root() -> Path:
    """``$MEGACPP_DATA_ROOT`` or ``./data``, made absolute."""
    return Path(os.environ.get("MEGACPP_DATA_ROOT", "data")).resolve()


@dataclass(frozen=True)
class SnapshotLayout:
    """Paths of one snapshot's outputs under a data root."""

    data_root: Path
    snapshot: str

    @property
    def cache(self) -> Path:
        return self.data_root / "cache"

    @property
    def root(self) -> Path:
        return self.data_root / "snapshots" / self.snapshot

    def revision(self, source: str) -> Path:
        return self.root / "revisions" / source

    def stage_dir(self, name: str) -> Path:
        return self.root / name

    @property
    def card(self) -> Path:
        return self.root / "card.md"

    def figures_path(self, stage: str, source: str | None = None) -> Path:
        base = self.root / "figures"
        return base / (f"{stage}.json" if source is None else f"{stage}/{source}.json")

    def write_figures(self, stage: str, figures: dict[str, Any], source: str | None = None) -> Path:
        """Persist a stage's figures (sorted-key JSON) for the dataset card."""
        return atomic_write_text(self.figures_path(stage, source), json.dumps(figures, sort_keys=True, indent=2) + "\n")

    def read_figures(self, stage: str, source: str | None = None) -> dict[str, Any] | None:
        p = self.figures_path(stage, source)
        return json.loads(p.read_text()) if p.exists() else None
