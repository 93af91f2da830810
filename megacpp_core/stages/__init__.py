"""The stage registry: every pipeline stage, in the order of the asset graph (SPEC §4).

One module per stage declares its :class:`~megacpp_core.stage.Stage` (``STAGE``, or
``STAGES`` for a stage split into several steps); adding a stage is one new module plus
one line here. Stage modules never import each other (an import-linter contract): what
they share lives in small modules of :mod:`megacpp_core` named for what they do, and
their data flows only through the datasets of :mod:`megacpp_core.catalog`.
"""

from __future__ import annotations

import dataclasses

from ..stage import Partitioning, Stage, StageError  # noqa: F401  (StageError: what a failed-closed stage raises)
from . import (acquire, blends, chunk, chunk_dedup, compile_commands, dedup, families, family_chunks, format, license,
               lsh_bands, minhash, pack, quality, repo_documents, scrub, semantic_graph, structure_documents, tokenize,
               tokenizer)

STAGES: tuple[Stage, ...] = (
    acquire.STAGE,
    quality.STAGE,
    license.STAGE,
    scrub.STAGE,
    minhash.STAGE,
    compile_commands.STAGE,
    semantic_graph.STAGE,
    *lsh_bands.STAGES,
    dedup.STAGE,
    tokenizer.STAGE,
    chunk.STAGE,
    chunk_dedup.STAGE,
    tokenize.STAGE,
    pack.STAGE,
    format.STAGE,
    family_chunks.STAGE,
    repo_documents.STAGE,
    structure_documents.STAGE,
    *families.STAGES,
    blends.STAGE,
)


def by_name(name: str, stages: tuple[Stage, ...] = STAGES) -> Stage:
    """The stage called ``name`` (stage id or asset name); ``KeyError`` listing the known ones."""
    for s in stages:
        if name in (s.name, s.asset):
            return s
    raise KeyError(f"no stage {name!r} (known: {', '.join(s.name for s in stages)})")


def producers(stages: tuple[Stage, ...] = STAGES) -> dict[str, Stage]:
    """``{dataset name: the stage that writes it}``; raises ``ValueError`` when two stages
    write one dataset or a stage reads a dataset no earlier stage writes."""
    out: dict[str, Stage] = {}
    for s in stages:
        for d in s.inputs:
            if d.name not in out:
                raise ValueError(f"stage {s.name} reads {d.name}, which no earlier stage writes")
        for d in s.outputs:
            if d.name in out:
                raise ValueError(f"dataset {d.name} is written by {out[d.name].name} and {s.name}")
            out[d.name] = s
    return out


def sinks(stages: tuple[Stage, ...] = STAGES) -> list[Stage]:
    """The snapshot stages whose outputs no other stage reads (the Megatron export and each
    curriculum family), in registry order: what the dataset card waits for."""
    read = {d.name for s in stages for d in s.inputs}
    return [s for s in stages if s.partitioning is Partitioning.SNAPSHOT and not any(d.name in read for d in s.outputs)]


@dataclasses.dataclass(frozen=True)
class Phase:
    """One pass of a snapshot run: per revision, its ``early`` per-revision stages, then its
    ``shard`` stages on every shard, then its ``late`` per-revision stages (those reading a
    shard dataset of this pass: the libclang lane); then the ``snapshot`` stages."""

    early: tuple[Stage, ...]
    shard: tuple[Stage, ...]
    late: tuple[Stage, ...]
    snapshot: tuple[Stage, ...]

    @property
    def stages(self) -> tuple[Stage, ...]:
        return self.early + self.shard + self.late + self.snapshot


def phases(stages: tuple[Stage, ...] = STAGES) -> list[Phase]:
    """The passes a whole-snapshot run makes over ``stages`` (registry order, which is
    topological): a per-revision or per-shard stage that reads a snapshot dataset starts a
    new pass (the chunk shards wait for the dedup decisions and the tokenizer); anything
    else joins the pass of its latest input. Raises ``ValueError`` like :func:`producers`."""
    prod = producers(stages)
    index: dict[str, int] = {}
    for s in stages:
        p = 0
        for d in s.inputs:
            up = prod[d.name]
            p = max(p, index[up.name] + (up.partitioning is Partitioning.SNAPSHOT and s.partitioning is not Partitioning.SNAPSHOT))
        index[s.name] = p
    out = []
    for n in range(max(index.values(), default=-1) + 1):
        mine = [s for s in stages if index[s.name] == n]
        late: set[str] = set()
        for s in mine:
            if s.partitioning is Partitioning.REVISION and any(
                    index[prod[d.name].name] == n and (prod[d.name].partitioning is Partitioning.REVISION_SHARD
                                                       or prod[d.name].name in late) for d in s.inputs):
                late.add(s.name)
        out.append(Phase(
            early=tuple(s for s in mine if s.partitioning is Partitioning.REVISION and s.name not in late),
            shard=tuple(s for s in mine if s.partitioning is Partitioning.REVISION_SHARD),
            late=tuple(s for s in mine if s.name in late),
            snapshot=tuple(s for s in mine if s.partitioning is Partitioning.SNAPSHOT)))
    return out


def step_groups(stages: tuple[Stage, ...] = STAGES) -> list[tuple[Stage, ...]]:
    """The stages that share one Dagster step, in registry order: within each lane of a
    pass (:func:`phases`: a revision's early stages, its shard stages, its late stages),
    consecutive stages that are not ``heavy`` run as one step (one ``multi_asset``: still
    one asset and one set of blocking checks per stage). In production a step is a pod,
    so the cheap per-file and per-shard stages of one partition start one pod instead of
    one each; locally a step's own events and input-version lookups are saved (on
    ``default``: 206 → 110 steps). A ``heavy`` stage keeps its own step, pod and pool, and
    the snapshot stages (each large) keep one step each. Every stage is in exactly one
    group; a group of one is a plain asset."""
    out: list[tuple[Stage, ...]] = []
    for ph in phases(stages):
        for lane in (ph.early, ph.shard, ph.late):
            run: list[Stage] = []
            for s in lane:
                if s.heavy:
                    out.extend(g for g in (tuple(run), (s,)) if g)
                    run = []
                else:
                    run.append(s)
            if run:
                out.append(tuple(run))
        out.extend((s,) for s in ph.snapshot)
    order = {s.name: i for i, s in enumerate(stages)}
    return sorted(out, key=lambda g: order[g[0].name])


@dataclasses.dataclass(frozen=True)
class SnapshotGroup:
    """Snapshot assets that run one after another in one run (``assets``, in registry
    order), once every group in ``after`` (indices into the list of groups) is done."""

    assets: tuple[str, ...]
    after: frozenset[int]


def snapshot_groups(planned, stages: tuple[Stage, ...] = STAGES) -> list[SnapshotGroup]:
    """The snapshot stages named in ``planned`` (asset names; the out-of-date snapshot
    assets of one pass) as groups that may run at once, each waiting only for the groups
    it reads from: the dependency graph among them (through any snapshot stage, planned
    or not), transitively reduced, with each chain — a stage whose one reduced
    predecessor has it as its one reduced successor — kept in one group. Groups are in
    registry order, so each group's ``after`` names only earlier groups.

    On ``default``'s second pass: ``chunk_dedup``; ``packed_rows → megatron_dataset``
    (after ``chunk_dedup``); ``p1_simple_dataset`` and ``p1_docrich_dataset`` (after it);
    ``p2_file_dataset``, ``p3_repo_dataset``, ``p4_structure_dataset`` (at once, from the
    start); ``blends`` (after the five family datasets). Raises ``KeyError`` for a name that is
    not a snapshot stage's asset."""
    snap = [s for s in stages if s.partitioning is Partitioning.SNAPSHOT]
    wanted, known = set(planned), {s.asset for s in snap}
    for a in planned:
        if a not in known:
            raise KeyError(f"{a!r} is not a snapshot stage's asset")
    prod = producers(stages)
    upstream: dict[str, set[str]] = {}  # every snapshot stage each one reads, transitively
    for s in snap:  # registry order is topological
        ups: set[str] = set()
        for d in s.inputs:
            p = prod[d.name]
            if p.partitioning is Partitioning.SNAPSHOT:
                ups |= {p.asset} | upstream[p.asset]
        upstream[s.asset] = ups
    order = [s.asset for s in snap if s.asset in wanted]
    preds = {a: upstream[a] & wanted for a in order}
    reduced = {a: {b for b in ps if not any(b in upstream[c] for c in ps if c != b)} for a, ps in preds.items()}
    succs: dict[str, set[str]] = {a: set() for a in order}
    for a, ps in reduced.items():
        for b in ps:
            succs[b].add(a)
    group_of: dict[str, int] = {}
    chains: list[list[str]] = []
    for a in order:
        ps = reduced[a]
        if len(ps) == 1 and len(succs[next(iter(ps))]) == 1:
            g = group_of[next(iter(ps))]
            chains[g].append(a)
        else:
            g = len(chains)
            chains.append([a])
        group_of[a] = g
    return [SnapshotGroup(tuple(c), frozenset(group_of[b] for a in c for b in reduced[a]) - {i})
            for i, c in enumerate(chains)]


def run(name: str, root, manifest, source: str | None = None, shard: str | None = None, **kwargs):
    """Run the stage ``name`` on the revision ``source`` (or the snapshot) of ``manifest``
    under the data root ``root`` (a :class:`~megacpp_core.storage.DataRoot`, path or URL):
    the same code the Dagster asset runs, for tools and tests.

    For a per revision × shard stage, ``shard`` names one shard ("000"); left out, every
    shard of the revision's plan runs in order and the result of the last one is returned.
    Raises :class:`~megacpp_core.storage.MissingOutputError` when a per-shard stage runs on
    a revision with no shard plan yet.
    """
    from ..runner import revision_shards, run_stage
    from ..stage import Partition, Partitioning
    from ..storage import DataRoot

    if not isinstance(root, DataRoot):
        root = DataRoot(root)
    src = source.name if hasattr(source, "name") else source
    stage = by_name(name)
    if stage.partitioning is Partitioning.REVISION_SHARD and src is not None:
        keys = [shard] if shard is not None else revision_shards(root, manifest.name, src)
        result = None
        for k in keys:
            result = run_stage(stage, root, manifest, Partition(manifest.name, src, k), **kwargs)
        return result
    return run_stage(stage, root, manifest, Partition(manifest.name, src), **kwargs)
