"""One run of a selection of a job's assets at one partition, with the selection's job
built once per process.

``megacpp run`` launches about 70 runs on ``default`` (:mod:`megacpp_assets.snapshot_run`),
each through ``JobDefinition.execute_in_process(asset_selection=…, partition_key=…)``.
That call builds, for every run, a new in-process copy of the job subset to the selection
(``as_ephemeral_job``: a new ``JobDefinition`` and its ``get_subset``), and Dagster then
builds that new definition's job snapshot and hashes it (``get_job_snapshot_id``) to
store the run. The copy and its snapshot depend only on the job and the selection, and a
run uses a handful of selections (a revision's early assets, a shard's assets, …): about
7 ms a run here, 0.5 s of a ``default`` run's orchestration across its runs.

:class:`JobSubsets` keeps the in-process copy of each ``(job, selection)`` it has run
(its snapshot is cached on the definition by Dagster itself) and runs it with the same
calls ``execute_in_process`` makes: the partition key is validated against the
instance's partitions and turned into the run's tags (``merge_run_tags``), and the run is
executed with ``core_execute_in_process`` with the selection recorded on the run. The
runs it stores are the runs ``execute_in_process`` stores: same job name, selection,
tags, job and execution-plan snapshots, steps and events (``tests/test_job_subsets.py``
compares them). The two entry points used, ``core_execute_in_process`` and
``merge_run_tags``, are the ones ``execute_in_process`` itself calls in the Dagster
release ``pyproject.toml`` pins.

Dagster's ``create_run_for_job`` subsets the job it is given to the run's selection once
more (``job_def.get_subset(asset_selection=…)``: a new definition, whose snapshot it builds,
about 5 ms a run). The kept copy is therefore a :class:`_SelectionJob`, a
``JobDefinition`` whose ``get_subset`` returns the subset it built for the same arguments
the first time; a job definition does not change once built, so the subset is the one
Dagster would build again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dagster import AssetKey, DagsterInstance, JobDefinition


class _SelectionJob(JobDefinition):
    """A kept in-process job subset (:class:`JobSubsets`): ``get_subset`` with the same
    arguments returns the same subset, built the first time by ``JobDefinition.get_subset``."""

    def get_subset(self, *, op_selection=None, asset_selection=None, asset_check_selection=None) -> JobDefinition:
        """``JobDefinition.get_subset``, kept per ``(op_selection, asset_selection,
        asset_check_selection)``."""
        key = (None if op_selection is None else tuple(op_selection),
               None if asset_selection is None else frozenset(asset_selection),
               None if asset_check_selection is None else frozenset(asset_check_selection))
        kept = self.__dict__.setdefault("_megacpp_subsets", {})
        got = kept.get(key)
        if got is None:
            got = kept[key] = super().get_subset(op_selection=op_selection, asset_selection=asset_selection,
                                                 asset_check_selection=asset_check_selection)
        return got


class JobSubsets:
    """The in-process subsets of jobs to asset selections, kept per process, and runs of them.

    ``instance``: the Dagster instance every run is stored on. Not shared between threads
    (each ``megacpp run`` worker runs one unit at a time)."""

    def __init__(self, instance: DagsterInstance):
        self.instance = instance
        # (id of the job definition, selection) -> (that definition, its kept subset); the
        # definition is held so that its id is not reused while the entry lives
        self._jobs: dict[tuple[int, frozenset[AssetKey]], tuple[JobDefinition, JobDefinition]] = {}

    def subset(self, job: JobDefinition, selection: frozenset[AssetKey]) -> JobDefinition:
        """``job``'s in-process copy subset to ``selection``, as ``execute_in_process``
        builds it (``as_ephemeral_job`` without extra resources or inputs), built on first
        use. Kept per job definition (two definitions with the same job name, such as a
        variant of the registry's, are two jobs)."""
        key = (id(job), selection)
        got = self._jobs.get(key)
        if got is None:
            sub = job.as_ephemeral_job(resource_defs={}, input_values={}, asset_selection=sorted(selection))
            sub.__class__ = _SelectionJob  # the same object; its re-subsets kept (module docstring)
            got = self._jobs[key] = (job, sub)
        return got[1]

    def prepare(self, job: JobDefinition, selection: frozenset[AssetKey]) -> None:
        """Build ahead what a run of ``selection`` builds on its way to its first step: the
        kept subset, Dagster's re-subset of it (``create_run_for_job``) and its snapshot."""
        self.subset(job, selection).get_subset(asset_selection=selection).get_job_snapshot_id()

    def kept(self) -> list[tuple[str, frozenset[AssetKey]]]:
        """``(job name, selection)`` of every subset kept, in the order they were built."""
        return [(job.name, selection) for (_, selection), (job, _) in self._jobs.items()]

    def execute(self, job: JobDefinition, partition_key: str, assets: Iterable[str],
                run_config: Mapping[str, Any]):
        """Run ``assets`` (asset names) of ``job`` at ``partition_key`` on the instance, as
        ``job.execute_in_process(instance=…, partition_key=…, run_config=…,
        raise_on_error=False, asset_selection=…)`` does; returns its
        ``ExecuteInProcessResult``. Raises what that call raises before the run starts
        (``DagsterInvalidDefinitionError`` for an unknown asset, ``DagsterUnknownPartitionError``
        for a partition key the instance does not have)."""
        from dagster._core.definitions.job_base import InMemoryJob
        from dagster._core.execution.execute_in_process import core_execute_in_process, merge_run_tags

        selection = frozenset(AssetKey(a) for a in assets)
        sub = self.subset(job, selection)
        if not run_config and sub.partitioned_config and partition_key:
            run_config = sub.partitioned_config.get_run_config_for_partition_key(partition_key)
        tags = merge_run_tags(job_def=job, partition_key=partition_key, tags=None, asset_selection=sorted(selection),
                              instance=self.instance, run_config=run_config)
        return core_execute_in_process(job=InMemoryJob(job_def=sub), run_config=run_config, instance=self.instance,
                                       output_capturing_enabled=True, raise_on_error=False, run_tags=tags,
                                       asset_selection=selection)
