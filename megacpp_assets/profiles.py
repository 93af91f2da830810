"""Execution profiles (SPEC §5), selected by one environment variable.

``MEGACPP_PROFILE=local`` (default): the multiprocess executor; ``megacpp run`` executes
in process. ``MEGACPP_PROFILE=production``: dagster-k8s's ``k8s_job_executor``, one pod
per step; heavy steps carry ``dagster-k8s/config`` op tags (:data:`HEAVY_STEP_TAGS`) with
their own CPU and memory and run in concurrency pools (:data:`POOLS`), and the
running-pod sensor starts enabled.
"""

import os

from dagster import DefaultSensorStatus, multiprocess_executor

PROFILE_ENV = "MEGACPP_PROFILE"
PROFILES = ("local", "production")

#: Concurrency pools for heavy steps; limits are set in the instance (``dagster.yaml``
#: ``concurrency.pools``) — see k8s/values.yaml.
POOLS = {"minhash": "megacpp-minhash", "libclang": "megacpp-libclang"}

#: ``dagster-k8s/config`` op tags giving heavy steps their own pod resources.
HEAVY_STEP_TAGS = {
    # one revision's signatures (numpy, single-threaded) or one band range's pair index
    "minhash": {"dagster-k8s/config": {"container_config": {"resources": {
        "requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}}}}},
    "libclang": {"dagster-k8s/config": {"container_config": {"resources": {
        "requests": {"cpu": "8", "memory": "16Gi"}, "limits": {"cpu": "16", "memory": "32Gi"}}}}},
}


def profile() -> str:
    """The active profile name; ``ValueError`` for an unknown value."""
    name = os.environ.get(PROFILE_ENV, "local")
    if name not in PROFILES:
        raise ValueError(f"{PROFILE_ENV}={name!r}: expected one of {', '.join(PROFILES)}")
    return name


def executor():
    """The executor of the active profile."""
    if profile() == "production":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor
    return multiprocess_executor


def sensor_status() -> DefaultSensorStatus:
    """Cluster sensors run by default only in production."""
    return DefaultSensorStatus.RUNNING if profile() == "production" else DefaultSensorStatus.STOPPED
