"""The passes of ``megacpp run`` over one snapshot (SPEC §9), on one or several processes.

Per pass (:func:`megacpp_core.stages.phases`): for every revision its ``early`` assets
(one ``revision_job`` run), its shards (one ``shard_job`` run per out-of-date shard), its
``late`` assets; then the snapshot assets of the pass. These
units depend only on their own revision (:class:`PassUnits`), so with ``workers`` > 1 they
run on worker processes (:class:`megacpp_assets.run_workers.WorkerPool`) as soon as their
revision allows — the shards of one large revision spread over every worker — each
worker opening the same Dagster instance. Once every unit of the pass is done, its
snapshot steps run in the calling process (one ``snapshot_job`` run), except those of
the last pass with more than one worker: they run on the pass's workers as groups that do
not depend on each other at once (:class:`SnapshotUnits`, one ``snapshot_job`` run per
group; :func:`run_passes`). Outputs do not depend on the number of workers or on the
order units finish in (``tests/test_shards.py``).
"""

from __future__ import annotations

import multiprocessing
import os
import posixpath
import re
import sys
import time

from dagster import AssetKey, DagsterInstance

from megacpp_assets import freshness
from megacpp_assets.factory import CARD_CODE_VERSION, LatestMaterializations, group_step_name, register_shards
from megacpp_assets.job_subsets import JobSubsets
from megacpp_core import layout
from megacpp_core.stage import Partition, Partitioning
from megacpp_core.stages import phases, sinks, snapshot_groups, step_groups

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
#: The dataset card's asset: a snapshot step of the last pass, after every other.
CARD = "dataset_card"


class SnapshotRun:
    """The jobs, instance and plan of one ``megacpp run``; the same object is rebuilt in each
    worker (:meth:`in_worker`). ``stages``: the stage declarations (default the registry)."""

    def __init__(self, manifest, root, instance, rerun: bool, stages=None):
        self.stages_arg = stages  # what a worker rebuilds from (None: the registry)
        if stages is None:
            from megacpp_assets.definitions import defs as definitions
            from megacpp_core.stages import STAGES as stages
        else:
            from megacpp_assets.definitions import build_definitions

            definitions = build_definitions(stages)
        self.manifest, self.root, self.instance, self.rerun, self.stages = manifest, root, instance, rerun, stages
        self.revision_job = definitions.resolve_job_def("revision_job")
        self.shard_job = definitions.resolve_job_def("shard_job")
        self.snapshot_job = definitions.resolve_job_def("snapshot_job")
        self.passes = phases(stages)
        self.latest = LatestMaterializations(instance, kept=True)  # one materialization index per process
        self.subsets = JobSubsets(instance)  # one in-process job per selection, per process
        self.step_of = {s.asset: group_step_name(g) for g in step_groups(stages) for s in g}
        self.n_sources = len(manifest.sources)
        # the parse-ahead of a later pass's worker (:meth:`parse_ahead`): the pass and the event
        # that says it began, the thread and its stop flag, the shards' order, its figures
        self._ahead_pass: tuple = (0, None)
        self._ahead: tuple | None = None
        self._ahead_order: list[str] = []
        self.ahead_figures: dict = {}

    @classmethod
    def in_worker(cls, manifest_path: str, root_url: str, instance_ref, rerun: bool, stages,
                  later_pass: bool = False, ahead: int = 0, started=None) -> "SnapshotRun":
        """The worker's copy: the manifest, data root and instance are opened again. A
        worker of a pass after the first (``later_pass``) lowers its priority
        (:func:`megacpp_assets.run_workers.lower_priority`: it starts while this pass's
        snapshot steps run in the calling process) and imports the libraries only those
        passes use (:data:`megacpp_assets.run_workers.LATER_PASS_MODULES`). With ``ahead``
        (a pass number), once the worker has built its state (:meth:`after_init`) it parses
        that pass's files ahead until its first unit or until ``started`` (a
        ``multiprocessing`` event the calling process sets when that pass begins) is set
        (:meth:`parse_ahead`)."""
        import logging

        from megacpp_assets.run_workers import import_for_later_pass, lower_priority, stdout_handler
        from megacpp_core.manifest import load_manifest
        from megacpp_core.storage import open_root

        lg = logging.getLogger("megacpp")
        lg.handlers[:] = [stdout_handler()]
        lg.setLevel(logging.INFO)
        lg.propagate = False
        if later_pass:
            lower_priority()
            import_for_later_pass()
        from megacpp_core import memo

        run = cls(load_manifest(manifest_path), open_root(root_url), DagsterInstance.from_ref(instance_ref), rerun, stages)
        memo.keep_across_steps()  # a worker runs many steps: a revision's chunk step leaves its files' facts for p3/p4
        n = ahead or 1  # the pass this worker runs
        # a pool started ahead (the next pass's, during the tokenizer) does it while idle
        run.warm(run.selections(n, snapshot="groups" if n == len(run.passes) else ""))
        run._ahead_pass = (ahead, started)
        return run

    def after_init(self) -> None:
        """Called by the worker once its state is built and frozen
        (:func:`megacpp_assets.run_workers._init`): starts :meth:`parse_ahead` when
        :meth:`in_worker` was given a pass, so nothing the thread makes is frozen with the
        worker's long-lived state."""
        n, started = self._ahead_pass
        if n:
            self.parse_ahead(n, started)

    def parse_ahead(self, n: int, started=None) -> None:
        """Start parsing and enriching pass ``n``'s files ahead on a thread of this process
        (:func:`megacpp_core.parse_ahead.parse_ahead`: the scrubbed files of its shards, in
        the order :class:`PassUnits` starts them), when the pass chunks files and has no
        early units (its shards are known now); it stops at :meth:`before_unit`, or once
        ``started`` (an object with ``is_set()``) is set: a worker with no unit yet then
        leaves the cores to the others. Its figures go to ``ahead_figures`` (``{}`` until it
        ends) and one line to the worker's output.
        Nothing raised: what it does not make, the chunk stage makes. As the pass's shards
        start in that order, each shard unit drops what was made for the shards before it
        (:meth:`_drop_ahead`): they ran already, here or in another worker; the pass's
        first snapshot step drops the rest. ``MEGACPP_PARSE_AHEAD=0`` switches it off (a
        worker then holds no more memory than before: the memo takes up to
        :data:`megacpp_core.memo.MAX_AHEAD_BYTES`)."""
        import threading

        from megacpp_core import parse_ahead

        self.before_unit()  # a thread of an earlier call ends first
        self.ahead_figures = {}
        if os.environ.get("MEGACPP_PARSE_AHEAD", "1") == "0":  # off: e.g. to keep a worker's memory flat
            return
        if (not 1 <= n <= len(self.passes) or not any(s.name == "chunk" for s in self.passes[n - 1].shard)
                or self.passes[n - 1].early):
            return
        stop = _Either(threading.Event(), started)

        def work() -> None:
            try:
                shards = _pass_shards(self, n) if not stop.is_set() else []
                self._ahead_order = [Partition(self.manifest.name, src, k).key for src, k in shards]
                self.ahead_figures = parse_ahead.parse_ahead(self.root, self.manifest.name, shards,
                                                             self.manifest.settings.enrichment, stop)
            except Exception as e:  # noqa: BLE001 — only a head start (the shard plans: the units meet them too)
                self.ahead_figures = {"ended": f"error: {type(e).__name__}: {e}"}

        self._ahead = (threading.Thread(target=work, name="parse-ahead", daemon=True), stop.mine)
        self._ahead[0].start()

    def _drop_ahead(self, key: str | None, keep: bool) -> None:
        """Drop the files made ahead (:meth:`parse_ahead`) for the shards that start before
        shard ``key``, and for ``key`` itself unless ``keep`` (its chunk stage runs here);
        ``key`` None: all of them, and the memory they held is handed back
        (:func:`megacpp_core.tables.release_memory`)."""
        from megacpp_core import memo
        from megacpp_core.tables import release_memory

        order = self._ahead_order
        if key is None and order:
            memo.PARSED_AHEAD.clear()
            self._ahead_order = []
            release_memory()
        elif key in order:
            at = order.index(key) + (not keep)
            for old in order[:at]:
                memo.PARSED_AHEAD.drop(old)
            self._ahead_order = order[at:]

    def before_unit(self) -> None:
        """Called by the worker before each unit (:func:`megacpp_assets.run_workers._call`):
        stops the parse-ahead thread and waits for it (it checks before each shard's read
        and each file; a file's parse and enrichment, and a read, finish first), so the
        unit runs alone (tree-sitter's parsers are not shared between threads); then prints
        what it made (:meth:`parse_ahead`)."""
        ahead = self._ahead
        if ahead is not None:
            self._ahead = None
            ahead[1].set()
            ahead[0].join()
            f = self.ahead_figures
            print(f"parse ahead: {f.get('files', 0)} files of {f.get('shards', 0)} whole shards in "
                  f"{f.get('seconds', 0.0):.1f}s ({f.get('ended')}"
                  + (f"; unreadable: {', '.join(f['unreadable'])}" if f.get("unreadable") else "") + ")", flush=True)

    def selections(self, n: int, units: bool = True, snapshot: str = "") -> list[tuple[str, tuple[str, ...]]]:
        """The ``(job name, asset names)`` of the runs a fresh ``megacpp run`` (every asset
        out of date) makes in pass ``n`` (1-based): with ``units``, its revisions' early
        and late assets and its shards' assets; its snapshot assets with ``snapshot``
        ``"one"`` (one run of them all, the card with the last pass's: :meth:`snapshot`)
        or ``"groups"`` (the last pass on workers: one run per :class:`SnapshotUnits`
        group, the card alone or after a group no other group reads from)."""
        out: list[tuple[str, tuple[str, ...]]] = []
        if units:
            early, shard, late = self.pass_assets(n)
            out += [("revision_job", tuple(early)), ("shard_job", tuple(shard)), ("revision_job", tuple(late))]
        snap = [s.asset for s in self.passes[n - 1].snapshot]
        last = n == len(self.passes)
        if snapshot == "one":
            out.append(("snapshot_job", tuple(snap + [CARD] * last)))
        elif snapshot == "groups":
            groups = snapshot_groups(snap, self.stages)
            out += [("snapshot_job", g.assets) for g in groups]
            if last:  # the card alone, or in the run of a group no other reads from (:class:`SnapshotUnits`)
                read = {i for g in groups for i in g.after}
                out += [("snapshot_job", (CARD,))] + [("snapshot_job", g.assets + (CARD,))
                                                       for i, g in enumerate(groups) if i not in read]
        return [(job, assets) for job, assets in out if assets]

    def warm(self, selections: list[tuple[str, tuple[str, ...]]] = ()) -> None:
        """Do ahead what this process's runs would do on their way to their first step:
        with the pooled event log, the empty run database its run databases are copied
        from (:func:`megacpp_assets.instance_storage.run_template`; a worker forked from
        the fork server has it already); the job subset of each of ``selections``
        (:meth:`selections`: the runs this process makes in a fresh run) with its
        snapshots (:class:`~megacpp_assets.job_subsets.JobSubsets`, kept for the runs:
        10–35 ms each; the first snapshot in a process also imports Dagster's snapshot
        modules and builds its type caches, about 45 ms) and, unless every asset is run
        again, the freshness plan of one partition (the instance's first queries through
        this process's connections). Nothing is written to the instance or the data root,
        and nothing raised: an error here is met again by the run, which reports it (or,
        for the template, the storage makes its databases as Dagster does). ``megacpp run``
        calls it while the fork server still imports, and each worker as it starts (a
        later pass's while the tokenizer trains)."""
        from megacpp_assets.instance_storage import PooledSqliteEventLogStorage, run_template

        try:
            if isinstance(self.instance.event_log_storage, PooledSqliteEventLogStorage):
                run_template()
        except Exception:  # noqa: BLE001 — see above
            pass
        if not self.manifest.sources:
            return
        try:
            for job, assets in selections:  # the job names are this object's attributes
                self.subsets.prepare(getattr(self, job), frozenset(AssetKey(a) for a in assets))
            if not self.rerun:
                freshness.plan(self.instance, self.stages, self.root, self.manifest,
                               Partition(self.manifest.name, self.manifest.sources[0].name), latest=self.latest)
        except Exception:  # noqa: BLE001 — only a head start: the run meets the same error and reports it
            pass

    # -- one revision's part of a pass (runs in a worker when workers > 1) ---------------

    def _out_of_date(self, part, assets) -> list[str]:
        if self.rerun:
            return assets
        return [x.asset for x in freshness.plan(self.instance, self.stages, self.root, self.manifest, part,
                                                latest=self.latest, only=assets)]

    def _materialize(self, job, part, assets, label, say_skip=True, todo=None) -> bool:
        todo = self._out_of_date(part, assets) if todo is None else todo
        if not todo:
            if say_skip:
                print(f"{label} {part.key} (current; skipped)")
            return True
        why = "" if self.rerun or len(todo) == len(assets) else f" (out of date: {', '.join(todo)})"
        print(f"{label} {part.key}{why}", flush=True)
        result = self.subsets.execute(job, part.key, todo, QUIET)
        if not result.success:
            report_failure(result, part.key, [(a, self.step_of[a]) for a in todo])
        return result.success

    def pass_assets(self, n: int) -> tuple[list[str], list[str], list[str]]:
        """``(early, shard, late)`` asset names of pass ``n`` (1-based); a switched-off late
        lane reads nothing and joins the early run (one run per revision fewer)."""
        ph = self.passes[n - 1]
        early, shard, late = ([s.asset for s in x] for x in (ph.early, ph.shard, ph.late))
        if late and all(s.enabled is not None and not getattr(self.manifest.settings, s.enabled) for s in ph.late):
            early, late = early + late, []
        return early, shard, late

    def _tag(self, i: int) -> str:
        return f"[{i}/{self.n_sources}]"

    def early(self, n: int, i: int) -> bool:
        """Pass ``n``, source ``i`` (1-based): its early per-revision assets (acquire …)."""
        early, _, _ = self.pass_assets(n)
        part = Partition(self.manifest.name, self.manifest.sources[i - 1].name)
        return not early or self._materialize(self.revision_job, part, early, f"{self._tag(i)} repo_revision")

    def shard_keys(self, i: int) -> list[str]:
        """The shard keys of source ``i``'s plan (registered as ``shard`` partitions)."""
        return register_shards(self.instance, self.root, self.manifest.name, self.manifest.sources[i - 1].name)

    def shard(self, n: int, i: int, k: str, count: int) -> str:
        """Pass ``n``: the out-of-date shard assets of shard ``k`` (of ``count``) of source ``i``;
        ``"ran"``, ``"current"`` (nothing to do; summarized per revision) or ``"failed"``."""
        _, shard, _ = self.pass_assets(n)
        spart = Partition(self.manifest.name, self.manifest.sources[i - 1].name, k)
        todo = self._out_of_date(spart, shard)
        self._drop_ahead(spart.key, keep=any(s.name == "chunk" and s.asset in todo for s in self.stages))
        if not todo:
            return "current"
        ok = self._materialize(self.shard_job, spart, shard, f"{self._tag(i)}   shard {k} of {count}", todo=todo)
        return "ran" if ok else "failed"

    def late(self, n: int, i: int) -> bool:
        """Pass ``n``, source ``i``: its late per-revision assets (those reading its shards)."""
        early, _, late = self.pass_assets(n)
        part = Partition(self.manifest.name, self.manifest.sources[i - 1].name)
        return not late or self._materialize(self.revision_job, part, late, f"{self._tag(i)} repo_revision",
                                             say_skip=not early)

    def pass_units(self, n: int) -> "PassUnits":
        """The units of pass ``n`` and their order constraints (:class:`PassUnits`)."""
        return PassUnits(self, n)

    # -- the snapshot steps of a pass (the calling process) ------------------------------

    def snapshot_plan(self, n: int) -> list[str]:
        """The snapshot assets of pass ``n`` that are out of date (the card after the last
        pass), printed; ``[]`` when every one is current."""
        ph = self.passes[n - 1]
        name = self.manifest.name
        assets = [s.asset for s in ph.snapshot]
        extra = {}
        if n == len(self.passes):
            assets.append(CARD)
            finals = [s.asset for s in sinks(self.stages)]
            extra = {CARD: (CARD_CODE_VERSION, finals, lambda: self.root.exists(layout.card_key(name)))}
        if not assets:
            return []
        plan = assets if self.rerun else [x.asset for x in freshness.plan(self.instance, self.stages, self.root,
                                                                          self.manifest, Partition(name), extra,
                                                                          latest=self.latest)
                                          if x.asset in assets]
        if not plan:
            print(f"[snapshot] {name}: {', '.join(assets)} current; skipped")
            return []
        print(f"[snapshot] {name}: " + " → ".join(plan), flush=True)
        return plan

    def snapshot_group(self, n: int, assets: tuple[str, ...]) -> bool:
        """One ``snapshot_job`` run of ``assets`` (of pass ``n``; a group of
        :class:`SnapshotUnits`, or the whole plan in one process). Whatever the pass's
        shards left of the files made ahead is dropped first (:meth:`parse_ahead`)."""
        self._drop_ahead(None, keep=False)
        name = self.manifest.name
        result = self.subsets.execute(self.snapshot_job, name, assets, QUIET)
        if not result.success:
            report_failure(result, name)
        return result.success

    def snapshot(self, n: int) -> bool:
        """The out-of-date snapshot assets of pass ``n`` in one run in this process."""
        plan = self.snapshot_plan(n)
        return not plan or self.snapshot_group(n, tuple(plan))


class SnapshotUnits:
    """The planned snapshot assets of pass ``n`` as units a worker runs, one
    ``snapshot_job`` run per group of :func:`megacpp_core.stages.snapshot_groups`: a group
    starts once the groups it reads from are done, so no snapshot step waits for one it
    does not depend on (``p3_repo_dataset`` no longer waits for ``p2_file_dataset``); the
    dataset card runs last, after every group: in the run of the last group when that
    group starts once every other has ended (one run fewer), else in a run of its own.
    Of the groups that may start, the largest starts first (:meth:`priority`, longest
    processing time first), so the pass does not end on a large group while the other
    workers wait."""

    def __init__(self, run: SnapshotRun, n: int, plan: list[str]):
        self.n = n
        groups = snapshot_groups([a for a in plan if a != CARD], run.stages)
        self.groups = [(g.assets, set(g.after)) for g in groups]
        self._card = None
        if CARD in plan:
            self._card = len(groups)
            self.groups.append(((CARD,), set(range(len(groups)))))
        self._index = {assets: i for i, (assets, _) in enumerate(self.groups)}
        self._bytes = _read_bytes(run, [assets for assets, _ in self.groups])
        self._started: set[int] = set()
        self._done: set[int] = set()
        self.runs = 0  # the runs released so far

    def priority(self, unit: tuple) -> tuple[int, int]:
        """The order key of a group's unit for :meth:`WorkerPool.run_units` (largest
        first): the bytes of the per-revision and per-shard files its stages read
        (:func:`_read_bytes`), ties in group order. On ``default`` the bytes order the
        groups as their times do, except ``packed_rows`` with ``megatron_dataset``, which
        both read the tokenized documents and so come first, though third by time."""
        i = self._index[unit[1][1]]
        return self._bytes[i], -i

    def _release(self) -> list[tuple]:
        out = [i for i, (_, after) in enumerate(self.groups) if i not in self._started and after <= self._done]
        self._started.update(out)
        card = self._card
        if card is not None and card not in self._started and len(out) == 1 and \
                all(i in self._done or i == out[0] for i in range(card)):
            # the last group but the card: the card runs in its run, after it (one run fewer)
            self._started.add(card)
            merged = self.groups[out[0]][0] + (CARD,)
            self._index[merged] = out[0]
            self.runs += 1
            return [("snapshot_group", (self.n, merged))]
        self.runs += len(out)
        return [("snapshot_group", (self.n, self.groups[i][0])) for i in out]

    def first(self) -> list[tuple]:
        """The groups that can start now."""
        return self._release()

    def done(self, method: str, args: tuple, result) -> tuple[bool, list[tuple]]:
        """``(ok, units released)`` after the run of group ``args[1]`` returned ``result``."""
        if not result:
            return False, []
        self._done.add(self._index[args[1]])
        if args[1][-1:] == (CARD,):
            self._done.add(self._card)
        return True, self._release()


class PassUnits:
    """The work of one pass as units a worker runs — ``early(i)``, ``shard(i, k)`` for every
    shard of revision ``i``, ``late(i)`` — released in dependency order: a revision's shards
    once its early assets are done (its plan then names them), its late assets once its last
    shard is done. Nothing waits on a revision it does not depend on, so the shards of the
    largest revision spread over every worker. Early units start largest cached archive
    first (:func:`_largest_archives_first`); shard units are released before further
    early units (depth first), and larger shards first (:func:`_shard_bytes`). A pass
    without early units knows every shard at its start: its shards start largest first
    across all revisions (longest processing time first), so the pass does not end on a
    large revision while the other workers wait."""

    def __init__(self, run: SnapshotRun, n: int):
        self.run, self.n = run, n
        self.early, self.shard, self.late = (bool(x) for x in run.pass_assets(n))
        self._left: dict[int, int] = {}
        self._current: dict[int, int] = {}
        self._count: dict[int, int] = {}

    def first(self) -> list[tuple]:
        """The units that can start now, in the order they should start."""
        if self.early:
            return [("early", (self.n, i)) for i in _largest_archives_first(self.run)]
        sized = [unit for i in range(1, self.run.n_sources + 1) for unit in self._sized_after_early(i)]
        return [unit for _, unit in sorted(sized, key=lambda x: (-x[0], x[1][1][1:3]))]  # stable: (i, k) on ties

    def _after_early(self, i: int) -> list[tuple]:
        return [unit for _, unit in self._sized_after_early(i)]

    def _sized_after_early(self, i: int) -> list[tuple[int, tuple]]:
        """``[(bytes, unit)]`` released once revision ``i``'s early assets are done: its
        shards, larger first, or its late unit (0 bytes) when it has none."""
        if not self.shard:
            return [(0, ("late", (self.n, i)))] if self.late else []
        keys = self.run.shard_keys(i)
        self._left[i], self._current[i], self._count[i] = len(keys), 0, len(keys)
        if not keys:
            return [(0, ("late", (self.n, i)))] if self.late else []
        sizes = _shard_bytes(self.run, i, self.n)
        keys = sorted(keys, key=lambda k: (-sizes.get(k, 0), k))
        return [(sizes.get(k, 0), ("shard", (self.n, i, k, len(keys)))) for k in keys]

    def done(self, method: str, args: tuple, result) -> tuple[bool, list[tuple]]:
        """``(ok, units released)`` after ``method(*args)`` returned ``result``."""
        i = args[1]
        if method == "early":
            return bool(result), (self._after_early(i) if result else [])
        if method == "late":
            return bool(result), []
        if result == "failed":
            return False, []
        self._current[i] += result == "current"
        self._left[i] -= 1
        if self._left[i]:
            return True, []
        if self._current[i]:
            name = f"{self.run.manifest.name}/{self.run.manifest.sources[i - 1].name}"
            print(f"{self.run._tag(i)}   {name}: shards {self._current[i]} of {self._count[i]} current; skipped")
        return True, [("late", (self.n, i))] if self.late else []


def _read_bytes(run: SnapshotRun, groups: list[tuple[str, ...]]) -> list[int]:
    """Per group of snapshot assets, the bytes of the per-revision and per-shard files (or
    directories) that its stages read, from one listing of the directory that holds them
    all (the catalog's paths); 0 for a group that reads snapshot files alone (``blends``,
    the card) or none written, and 0 for every group when the listing fails with an
    ``OSError`` (the order is only an order: the steps then report the storage's error)."""
    by_asset = {s.asset: s for s in run.stages}
    reads = [[d for a in g if a in by_asset for d in by_asset[a].inputs if d.scope is not Partitioning.SNAPSHOT]
             for g in groups]
    paths = sorted({d.path for ds in reads for d in ds})
    if not paths:
        return [0] * len(groups)
    base = layout.snapshot_prefix(run.manifest.name) + "/"
    fixed = posixpath.commonprefix([p.split("{", 1)[0] for p in paths])  # up to the first field
    try:
        listed = run.root.sizes(base + fixed[:fixed.rfind("/") + 1])
    except OSError:
        return [0] * len(groups)
    def pattern(path: str) -> str:
        out = re.escape(path)
        for field in ("{source}", "{shard}"):
            out = out.replace(re.escape(field), "[^/]+")
        return out

    # one pattern for every path (a named group each; none is a prefix of another), so the
    # listing is walked once whatever the number of paths
    alternatives = "|".join(f"(?P<p{j}>{pattern(p)})" for j, p in enumerate(paths))
    match = re.compile(f"(?:{alternatives})(?:/.+)?").fullmatch
    size = dict.fromkeys(paths, 0)
    for k, n in listed.items():
        if m := match(k[len(base):]):
            size[paths[int(m.lastgroup[1:])]] += n
    return [sum(size[d.path] for d in ds) for ds in reads]


class _Either:
    """A stop flag set when either of two events is: ``mine`` (a ``threading.Event``) or
    ``other`` (any object with ``is_set()``, or None)."""

    def __init__(self, mine, other=None):
        self.mine, self.other = mine, other

    def is_set(self) -> bool:
        return self.mine.is_set() or (self.other is not None and self.other.is_set())


def _pass_shards(run: SnapshotRun, n: int) -> list[tuple[str, str]]:
    """``[(source, shard key)]`` of pass ``n`` in the order :meth:`PassUnits.first` starts
    them in a pass without early units (larger first, by :func:`_shard_bytes`; ties by
    source and key), from the shard plans on the data root (no instance write: the
    worker's run registers the partitions). Raises what reading a plan raises."""
    from megacpp_core.runner import revision_shards

    sized = []
    for i, src in enumerate(run.manifest.sources, 1):
        keys = revision_shards(run.root, run.manifest.name, src.name)
        sizes = _shard_bytes(run, i, n) if keys else {}
        sized += [(sizes.get(k, 0), i, k, src.name) for k in keys]
    return [(name, k) for _, _, k, name in sorted(sized, key=lambda x: (-x[0], x[1], x[2]))]


def _largest_archives_first(run: SnapshotRun) -> list[int]:
    """Source numbers (1-based) by the bytes of their cached archives, largest first
    (their extraction and files come first, the small revisions fill the pass's end);
    sources not cached (a first run, git or local sources) after them, in manifest order."""
    from megacpp_core.acquire import cached_archive_bytes

    size = {i: cached_archive_bytes(run.root.cache_dir, s.sha256) or 0 for i, s in enumerate(run.manifest.sources, 1)}
    return sorted(size, key=lambda i: (-size[i], i))


def _shard_bytes(run: SnapshotRun, i: int, n: int = 1) -> dict[str, int]:
    """``{shard key: bytes}``: the expected work of each shard of source ``i`` in pass
    ``n``, as the bytes of the per-shard files the pass's shard stages read and other
    steps wrote (pass 1: the source files acquire wrote; pass 2: the scrubbed files,
    which quality, license and dedup have thinned), or, when none is written, the source
    bytes of the plan (``megacpp_core.sharding.plan``; it exists:
    :meth:`SnapshotRun.shard_keys` read it first)."""
    from megacpp_core import sharding

    source = run.manifest.sources[i - 1].name
    plan = run.root.read_json(layout.shard_plan_key(run.manifest.name, source))
    keys = sharding.shard_keys(plan)
    shard_stages = run.passes[n - 1].shard
    made_here = {d.name for st in shard_stages for d in st.outputs}
    read = {d.name: d for st in shard_stages for d in st.inputs
            if d.scope is Partitioning.REVISION_SHARD and d.name not in made_here}
    if read:
        files = {k: [d.key(Partition(run.manifest.name, source, k)) for d in read.values()] for k in keys}
        # one listing of the directory holding them all (the catalog's paths), not a request per file
        listed = run.root.sizes(posixpath.dirname(posixpath.commonprefix([f for fs in files.values() for f in fs])) + "/")
        sizes = {k: sum(listed.get(f, 0) for f in fs) for k, fs in files.items()}
        if any(sizes.values()):
            return sizes
    return dict(zip(keys, plan.get("bytes") or []))


def _run_in_process(run: SnapshotRun, units: PassUnits) -> bool:
    """The units of a pass one after another in this process, depth first (the order of
    the 1-worker run: a revision's early assets, its shards, its late assets, the next;
    in a pass without early units, the shards in :meth:`PassUnits.first`'s order, each
    revision's late assets as soon as its last shard is done)."""
    stack = units.first()[::-1]
    while stack:
        method, args = stack.pop()
        ok, more = units.done(method, args, getattr(run, method)(*args))
        if not ok:
            return False
        stack += more[::-1]
    return True


def run_passes(run: SnapshotRun, workers: int) -> bool:
    """Every pass of ``run``: its units (:class:`PassUnits`), then its snapshot steps. False
    at the first failure (printed).

    With one worker, all in this process, one after another (a pass's snapshot steps in
    one run); this process keeps files' facts across steps meanwhile
    (:func:`megacpp_core.memo.keep_across_steps`, as every worker does). With more, each
    pass's units run on a pool of ``workers`` fresh processes (:class:`WorkerPool`), so
    what a worker loaded for one pass (ScanCode's license index in pass 1) is never
    carried into the next. A pass followed by another ends its pool
    and starts the next one (:meth:`WorkerPool.start`) before its snapshot steps run here,
    in one run: the ended workers' shut-down and the new workers' start-up (forked from
    the fork server with their imports done: the definitions, the instance; then the
    libraries only later passes use, ``later_pass`` of :meth:`SnapshotRun.in_worker`)
    overlap those steps (the tokenizer's training) instead of preceding or following them;
    then, until their first unit, they parse and enrich the next pass's files ahead
    (:meth:`SnapshotRun.parse_ahead`: the training leaves a core idle). The last
    pass keeps its pool for its snapshot steps, which run there as :class:`SnapshotUnits`
    (groups that do not depend on each other at once, the card last); its workers carry
    nothing into a later pass. After a group fails no further group starts; which
    independent groups had started by then depends on timing (a single run in one
    process finishes them all)."""
    from .run_workers import WorkerPool, start_method

    if workers > 1 and run.instance.is_ephemeral:
        print("megacpp run: an ephemeral Dagster instance cannot be shared with workers; running with 1",
              file=sys.stderr)
        workers = 1
    if workers == 1:
        from megacpp_core import memo

        was = memo.across_steps()
        memo.keep_across_steps()  # this process runs every step (megacpp_core.memo: across steps)
        try:
            for n, ph in enumerate(run.passes, 1):
                _say_pass(run, n, ph)
                if not _run_in_process(run, run.pass_units(n)) or not run.snapshot(n):
                    return False
            return True
        finally:
            memo.keep_across_steps(was)
    args = (str(run.manifest.path), run.root.url, run.instance.get_ref(), run.rerun, run.stages_arg)
    pool = WorkerPool(workers, SnapshotRun.in_worker, args + (False,))
    try:
        pool.start()
        for n, ph in enumerate(run.passes, 1):
            _say_pass(run, n, ph)
            t = time.perf_counter()
            units = run.pass_units(n)
            if not pool.run_units(units.first(), units.done):
                return False
            print(f"pass {n}: revisions and shards on {workers} workers in {time.perf_counter() - t:.1f}s", flush=True)
            if n < len(run.passes):
                started = multiprocessing.get_context(start_method()).Event()  # the next pass has begun
                ended, pool = pool, WorkerPool(workers, SnapshotRun.in_worker, args + (True, n + 1, started))
                ended.release()  # its workers end in the background
                try:
                    pool.start()
                    if not run.snapshot(n):
                        return False
                finally:
                    started.set()
                    ended.__exit__(None, None, None)
                continue
            plan = run.snapshot_plan(n)
            if plan:
                t = time.perf_counter()
                steps = SnapshotUnits(run, n, plan)
                if not pool.run_units(steps.first(), steps.done, steps.priority):
                    return False
                print(f"pass {n}: snapshot steps in {steps.runs} runs on {workers} workers in "
                      f"{time.perf_counter() - t:.1f}s", flush=True)
        return True
    finally:
        pool.__exit__(None, None, None)


def _say_pass(run: SnapshotRun, n: int, ph) -> None:
    if len(run.passes) > 1:
        print(f"pass {n}/{len(run.passes)}: {', '.join(s.name for s in ph.stages)}", flush=True)


def failed_asset(result, step_key: str, requested: list[tuple[str, str]]) -> str | None:
    """The asset whose stage failed in ``step_key`` of a run: the first of ``requested``
    (the run's ``(asset, step)`` pairs, in registry order) computed by that step that the
    run did not materialize or materialized with a failed check; a step shared by several
    stages runs them in that order and stops at the first failure. ``None`` when there
    is none (the step failed outside a stage)."""
    done, failed = set(), set()
    for ev in result.all_events:
        if ev.step_key != step_key:
            continue
        if ev.event_type_value == "ASSET_MATERIALIZATION":
            done.add(ev.asset_key.to_user_string())
        elif ev.event_type_value == "ASSET_CHECK_EVALUATION" and not ev.event_specific_data.passed:
            failed.add(ev.event_specific_data.asset_key.to_user_string())
    return next((a for a, step in requested if step == step_key and (a not in done or a in failed)), None)


def report_failure(result, what: str, requested: list[tuple[str, str]] | None = None) -> None:
    """Print the failed steps (with the asset whose stage failed, for a step shared by
    several stages: ``requested`` lists the run's ``(asset, step)`` pairs) and the failed
    blocking checks of a Dagster run result to stderr."""
    print(f"megacpp run: FAILED at {what}", file=sys.stderr)
    for ev in result.all_events:
        if ev.is_step_failure:
            err = ev.step_failure_data.error
            cause = err.cause.message if err and err.cause else ""
            asset = failed_asset(result, ev.step_key, requested or [])
            at = f" (asset {asset})" if asset and asset != ev.step_key else ""
            print(f"  step {ev.step_key}{at}: {err.message.strip() if err else ''} {cause.strip()}", file=sys.stderr)
        elif ev.event_type_value == "ASSET_CHECK_EVALUATION":
            data = ev.event_specific_data
            if data is not None and not data.passed:
                print(f"  check {data.asset_check_key.name} failed on {data.asset_key.to_user_string()}", file=sys.stderr)
