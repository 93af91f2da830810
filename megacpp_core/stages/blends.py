"""Specialist blends — Megatron ``--data-path`` lists per specialist and phase (SPEC §5b), per snapshot.

Inputs: every curriculum family's Megatron dataset (``families/FAMILY/megatron``), so the
blends are written once every family is. From the versioned blend file
(``megacpp_core/data/blends/v1.yaml``, :func:`megacpp_core.blends.load`) it writes, under
``blends/``:

- ``SPECIALIST/phaseN.txt`` — one ``weight prefix`` pair per line (weights normalized to
  sum to 1, 6 decimals): Megatron's ``--data-path`` arguments, or the file itself as its
  ``--data-args-path``;
- ``index.json`` (written last: the commit marker) — the blend file version and, per
  specialist and phase, its title, token share, row length, families, weights, prefixes
  and the ``.txt`` file.

Prefixes are relative to the snapshot directory (``DATA_ROOT/snapshots/SNAPSHOT``:
``families/p1_simple/megatron/SNAPSHOT_p1_simple_text_document``), so the files are the
same bytes wherever the data root lives; run Megatron from the snapshot directory or
prepend it. Gate: every prefix of every list has its committed ``.bin`` and ``.idx``.
"""

from __future__ import annotations

import json

from .. import blends as blend_file
from .. import catalog, families
from ..stage import Files, Partitioning, Result, Stage

INDEX = "index.json"


def prefix_of(snapshot: str, family: str) -> str:
    """A family's Megatron prefix relative to the snapshot directory."""
    return f"{catalog.FAMILY_MEGATRON[family].path}/{snapshot}_{family}_text_document"


def compute(ctx) -> Result:
    b = blend_file.load()
    prefixes = {f: prefix_of(ctx.snapshot, f) for f in catalog.FAMILY_MEGATRON}
    d = ctx.workdir("blends-")
    files, index = {}, {"version": b.version, "snapshot": ctx.snapshot, "prefixes_relative_to": f"snapshots/{ctx.snapshot}",
                        "specialists": {}}
    for name in blend_file.SPECIALISTS:
        title, phases = b.specialists[name]
        entry = index["specialists"][name] = {"title": title, "phases": {}}
        for ph in blend_file.PHASES:
            paths, weights = blend_file.megatron_blend(b, name, ph, prefixes)
            args = blend_file.data_path(b, name, ph, prefixes)
            rel = f"{name}/phase{ph}.txt"
            (d / name).mkdir(exist_ok=True)
            (d / rel).write_text("".join(f"{w} {p}\n" for w, p in zip(args[::2], args[1::2])))
            files[rel] = d / rel
            fams = list(b.phase(name, ph).families)
            entry["phases"][str(ph)] = {"share": phases[ph].share, "row_length": families.BY_NAME[fams[0]].row_length,
                                        "families": fams, "weights": [round(w, 6) for w in weights], "prefixes": paths,
                                        "data_path": args, "file": rel}
    (d / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    files[INDEX] = d / INDEX
    figures = {"blend_version": b.version, "specialists": len(blend_file.SPECIALISTS),
               "blends": len(blend_file.SPECIALISTS) * len(blend_file.PHASES),
               "prefixes": sorted(set(prefixes.values())),
               "phase_shares": {name: {str(ph): p.share for ph, p in b.specialists[name][1].items()}
                                for name in blend_file.SPECIALISTS}}
    return Result({"blends": Files(files, order=(INDEX,))}, figures)


def every_prefix_exists(g):
    """Every prefix of every committed ``phaseN.txt`` is a committed ``.bin`` and ``.idx``
    of its family's Megatron dataset (re-read from the data root), each list names the
    index's prefixes and its weights sum to 1."""
    have = set()
    for d in catalog.FAMILY_MEGATRON.values():
        have |= {f"{d.path}/{name}" for name in g.input(d.name).files()}
    checked = set()
    ref = g.output("blends")
    with ref.local([INDEX, *(n for n in ref.files() if n != INDEX)]) as out:  # index first: ``out`` is its directory
        index = json.loads((out / INDEX).read_text())
        for spec in index["specialists"].values():
            for e in spec["phases"].values():
                words = (out / e["file"]).read_text().split()
                weights, prefixes = [float(w) for w in words[::2]], words[1::2]
                if prefixes != e["prefixes"] or abs(sum(weights) - 1) > 1e-5:
                    return False, f"{e['file']}: prefixes or weights differ from the index"
                for p in prefixes:
                    missing = [p + ext for ext in (".bin", ".idx") if p + ext not in have]
                    if missing:
                        return False, f"{e['file']}: {', '.join(missing)} not committed"
                    checked.add(p)
    return True, f"{len(checked)} prefixes of {g.figures['blends']} blends exist"


STAGE = Stage(
    name="blends", asset="blends", partitioning=Partitioning.SNAPSHOT, compute=compute, code_version="1",
    kinds=("text",),
    description="Specialist blends (SPEC 5b): per specialist and curriculum phase, Megatron's --data-path weight/prefix "
                "list over the family datasets (blends/SPECIALIST/phaseN.txt and blends/index.json), from the versioned "
                "blend file.",
    inputs=tuple(catalog.FAMILY_MEGATRON.values()),
    outputs=(catalog.BLENDS,), gates=(every_prefix_exists,),
    figures=("blend_version", "specialists", "blends", "prefixes", "phase_shares"),
)
