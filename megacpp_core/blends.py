"""Per-specialist blends of the curriculum families (SPEC §5b, seed 002).

A versioned blend file (``megacpp_core/data/blends/vN.yaml``) gives, for each of the eight
specialists of seed 002, the share of training tokens of each curriculum phase and, inside a
phase, the weights of its families (:mod:`megacpp_core.families`). A phase's families share
one row length, so one phase of one specialist is one Megatron blend:
:func:`data_path` turns it into the ``--data-path`` list (``weight prefix weight prefix
…``) and :func:`megatron_blend` into the ``(prefixes, weights)`` pair of megatron-core's
``GPTDatasetConfig.blend``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from .families import BY_NAME

#: The blend file version the pipeline writes by default.
VERSION = 1
#: The eight specialists of seed 002, in its order.
SPECIALISTS = ("algorithms", "templates", "memory_raii", "build_toolchain", "service_orchestration", "testing",
               "systems_c", "compilers_toolchain")
PHASES = (1, 2, 3, 4)


class BlendError(ValueError):
    """A blend file or a blend request that cannot be honoured; the message names the
    specialist, phase or family."""


@dataclass(frozen=True)
class Phase:
    """One phase of a specialist's diet: ``share`` of its training tokens (0–1) and
    ``families`` ``{family name: weight}`` (weights > 0, normalized by :func:`data_path`)."""

    share: float
    families: dict[str, float]


@dataclass(frozen=True)
class Blends:
    """A validated blend file: ``version`` and ``specialists`` ``{name: (title, {phase: Phase})}``."""

    version: int
    specialists: dict[str, tuple[str, dict[int, Phase]]]

    def phase(self, specialist: str, phase: int) -> Phase:
        """The :class:`Phase` ``phase`` of ``specialist``; :class:`BlendError` when unknown."""
        if specialist not in self.specialists:
            raise BlendError(f"unknown specialist {specialist!r}; known: {', '.join(self.specialists)}")
        phases = self.specialists[specialist][1]
        if phase not in phases:
            raise BlendError(f"specialist {specialist!r} has no phase {phase}")
        return phases[phase]


def load(path: str | Path | None = None, version: int = VERSION) -> Blends:
    """Read and validate a blend file (default: the packaged ``blends/v{version}.yaml``).

    Rules: the file's ``version`` is ``version``; exactly the eight :data:`SPECIALISTS`
    (kept in that order); every specialist has the four :data:`PHASES`, shares ≥ 0 summing
    to 1 (within 1e-9); every family is known, belongs to its phase and has a weight > 0.
    Raises :class:`BlendError` naming the first rule broken, ``FileNotFoundError`` for a
    missing file."""
    if path is None:
        text = resources.files("megacpp_core").joinpath(f"data/blends/v{version}.yaml").read_text()
    else:
        text = Path(path).read_text()
    raw = yaml.safe_load(text) or {}
    if raw.get("version") != version:
        raise BlendError(f"blend file version {raw.get('version')!r}, expected {version}")
    specs = raw.get("specialists") or {}
    if set(specs) != set(SPECIALISTS):
        raise BlendError(f"blend file specialists {sorted(specs)}, expected {sorted(SPECIALISTS)}")
    out: dict[str, tuple[str, dict[int, Phase]]] = {}
    for name in SPECIALISTS:  # the seed's order, whatever the file's
        spec = specs[name]
        phases = {}
        for ph, body in (spec.get("phases") or {}).items():
            fams = {str(f): float(w) for f, w in (body.get("families") or {}).items()}
            for f, w in fams.items():
                if f not in BY_NAME:
                    raise BlendError(f"{name} phase {ph}: unknown family {f!r}")
                if BY_NAME[f].phase != int(ph):
                    raise BlendError(f"{name} phase {ph}: family {f} belongs to phase {BY_NAME[f].phase}")
                if not w > 0:
                    raise BlendError(f"{name} phase {ph}: family {f} has weight {w}, expected > 0")
            share = float(body.get("share", -1))
            if not fams or share < 0:
                raise BlendError(f"{name} phase {ph}: needs a share >= 0 and at least one family")
            phases[int(ph)] = Phase(share, fams)
        if tuple(sorted(phases)) != PHASES:
            raise BlendError(f"{name}: phases {sorted(phases)}, expected {list(PHASES)}")
        total = sum(p.share for p in phases.values())
        if not math.isclose(total, 1.0, abs_tol=1e-9):
            raise BlendError(f"{name}: phase shares sum to {total}, expected 1")
        out[name] = (str(spec.get("title", name)), phases)
    return Blends(version, out)


def megatron_blend(blends: Blends, specialist: str, phase: int, prefixes: dict[str, str]) -> tuple[list[str], list[float]]:
    """``(prefixes, weights)`` of one specialist's phase, for megatron-core's
    ``GPTDatasetConfig.blend``: the phase's families in the file's order, weights
    normalized to sum to 1. ``prefixes`` maps family names to their Megatron dataset
    prefixes (``…/FAMILY_text_document``); :class:`BlendError` names a family without one."""
    ph = blends.phase(specialist, phase)
    missing = [f for f in ph.families if f not in prefixes]
    if missing:
        raise BlendError(f"{specialist} phase {phase}: no Megatron dataset for {', '.join(missing)}")
    total = sum(ph.families.values())
    return [str(prefixes[f]) for f in ph.families], [w / total for w in ph.families.values()]


def data_path(blends: Blends, specialist: str, phase: int, prefixes: dict[str, str]) -> list[str]:
    """Megatron's ``--data-path`` arguments for one specialist's phase: ``[weight, prefix,
    …]`` with weights written to 6 decimals (:func:`megatron_blend`)."""
    paths, weights = megatron_blend(blends, specialist, phase, prefixes)
    return [x for p, w in zip(paths, weights) for x in (f"{w:.6f}", p)]
