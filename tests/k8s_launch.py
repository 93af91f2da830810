"""Launch one run the way the production deployment does (a stand-in for the Dagster
daemon): load the code location with ``MEGACPP_PROFILE=production`` (jobs on
``k8s_job_executor``), create the run of ``JOB`` for ``PARTITION`` and ``ASSET``s, and hand
it to the instance's ``K8sRunLauncher``, which creates the run-worker Job.

Usage: ``python -m tests.k8s_launch JOB PARTITION ASSET [ASSET ...]``; prints the run id.
``PARTITION`` is ``SNAPSHOT``, ``SNAPSHOT/SOURCE`` or ``SNAPSHOT/SOURCE|SHARD``.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    os.environ["MEGACPP_PROFILE"] = "production"
    from dagster import AssetKey, DagsterInstance
    from dagster._core.definitions.reconstruct import ReconstructableRepository
    from dagster._core.launcher import LaunchRunContext

    job_name, partition, *assets = argv
    repo = ReconstructableRepository.for_module("megacpp_assets.definitions", "defs", working_directory=os.getcwd())
    recon = repo.get_reconstructable_job(job_name)
    instance = DagsterInstance.get()
    job_def = recon.get_definition()
    tags = {"dagster/partition": partition}
    if "|" in partition:  # a revision × shard key: the multi-partition's per-dimension tags too
        revision, shard = partition.split("|")
        tags |= {"dagster/partition/revision": revision, "dagster/partition/shard": shard}
    run = instance.create_run_for_job(job_def=job_def, run_config={}, tags=tags,
                                      job_code_origin=recon.get_python_origin(),
                                      asset_selection=frozenset(AssetKey(a) for a in assets))
    instance.run_launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    print(run.run_id)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
