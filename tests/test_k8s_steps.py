"""Heavy steps run the way the production profile runs them, against the object store.

The instance is configured from ``k8s/helm/values.yaml`` (``K8sRunLauncher`` with its
``envVars`` and ``envSecrets``); runs are launched as the daemon does and dagster-k8s
builds the run-worker and step Jobs itself. A stand-in cluster (:mod:`tests.fake_k8s`)
records every Job spec and runs each pod's container command as a fresh local process
with only the environment the spec gives it — the data root URL, the credentials from
the Secret, ``DAGSTER_HOME`` and the step arguments. The MinHash signatures of one
revision are written by their step pod; the LSH bands, dedup and chunk + enrich steps, each
in its own pod, read what earlier pods wrote, and every output is byte-identical to the
local run.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from megacpp_assets.profiles import HEAVY_STEP_TAGS
from megacpp_core.storage import DataRoot
from tests.conftest import PROJECT, environ
from tests.fake_k8s import FakeCluster

pytestmark = pytest.mark.integration

VALUES = PROJECT / "k8s" / "helm" / "values.yaml"
IMAGE_HOME = "/opt/dagster/dagster_home"  # the Helm chart's DAGSTER_HOME (the instance ConfigMap's mount)
IMAGE_WORKDIR = "/opt/megacpp"  # k8s/Dockerfile WORKDIR
SECRET = "megacpp-data-root"


def _values() -> dict:
    return yaml.safe_load(VALUES.read_text())


def test_values_give_every_pod_the_data_root_and_credentials():
    v = _values()
    dep = v["dagster-user-deployments"]["deployments"][0]
    env = {e["name"]: e.get("value") for e in dep["env"]}
    assert env["MEGACPP_DATA_ROOT"].startswith("s3://") and env["MEGACPP_PROFILE"] == "production"
    assert {"name": SECRET} in dep["envSecrets"]
    rl = v["runLauncher"]["config"]["k8sRunLauncher"]
    run_env = dict(x.split("=", 1) for x in rl["envVars"])
    assert run_env["MEGACPP_DATA_ROOT"] == env["MEGACPP_DATA_ROOT"] and run_env["MEGACPP_PROFILE"] == "production"
    assert {"name": SECRET} in rl["envSecrets"]
    secret = next(d for d in yaml.safe_load_all((PROJECT / "k8s" / "manifests" / "data-root-secret.yaml").read_text())
                  if d and d["kind"] == "Secret")
    assert secret["metadata"]["name"] == SECRET
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(secret["stringData"])


def _instance_yaml(kubeconfig: Path, data_root: str) -> dict:
    """The instance's run launcher as the chart renders it from the values (with the test
    cluster's kubeconfig, and the test bucket as the data root)."""
    v = _values()
    rl = v["runLauncher"]["config"]["k8sRunLauncher"]
    env_vars = [f"MEGACPP_DATA_ROOT={data_root}" if x.startswith("MEGACPP_DATA_ROOT=") else x for x in rl["envVars"]]
    return {"telemetry": {"enabled": False},
            "run_launcher": {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": {
                "service_account_name": v["global"]["serviceAccountName"],
                "job_image": "registry.example.internal/megacpp/code-location:test",
                "dagster_home": IMAGE_HOME, "instance_config_map": "dagster-instance",
                "load_incluster_config": False, "kubeconfig_file": str(kubeconfig),
                "job_namespace": rl["jobNamespace"], "env_vars": env_vars,
                "env_secrets": [s["name"] for s in rl["envSecrets"]]}}}


def _launch(home: Path, job: str, partition: str, *assets: str) -> str:
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    env.pop("MEGACPP_DATA_ROOT", None)
    r = subprocess.run([sys.executable, "-m", "tests.k8s_launch", job, partition, *assets], cwd=PROJECT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


def _wait_run(instance, run_id: str, cluster: FakeCluster, timeout_s: float = 900) -> None:
    from dagster import DagsterRunStatus

    deadline = time.monotonic() + timeout_s
    while True:
        run = instance.get_run_by_id(run_id)
        if run.status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED):
            break
        assert time.monotonic() < deadline, "run did not finish"
        time.sleep(2)
    for job in cluster.jobs.values():
        job["proc"].wait(timeout=120)
    logs = {n: j["log"].read_text()[-1500:] for n, j in cluster.jobs.items() if j["proc"].returncode}
    assert run.status == DagsterRunStatus.SUCCESS, (run.status, logs)


def _env_of(body: dict) -> dict:
    c = body["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in c.get("env") or []}


@pytest.fixture(scope="module")
def cluster(tiny_s3, s3_env, tmp_path_factory):
    from dagster import DagsterInstance

    url, _ = tiny_s3
    home = tmp_path_factory.mktemp("k8s-home")
    logs = tmp_path_factory.mktemp("k8s-pods")
    with FakeCluster(secrets={SECRET: dict(s3_env)}, bin_dir=str(Path(sys.executable).parent), logs=logs,
                     workdir=IMAGE_WORKDIR, path_map={IMAGE_HOME: str(home), IMAGE_WORKDIR: str(PROJECT)}) as c:
        kcfg = c.kubeconfig(home / "kubeconfig.json")
        (home / "dagster.yaml").write_text(yaml.safe_dump(_instance_yaml(kcfg, url)))
        with environ(DAGSTER_HOME=str(home)), DagsterInstance.get() as instance:
            instance.add_dynamic_partitions("snapshot", ["tiny"])
            instance.add_dynamic_partitions("repo_revision", ["tiny/pybind11-3.1.0", "tiny/lz4-4.4.5",
                                                              "tiny/xxhash-4.1.0"])
            instance.add_dynamic_partitions("shard", ["000"])
            yield c, instance, home, url


def _local_hash(tiny_run, rel: str) -> str:
    return hashlib.sha256((tiny_run[0] / "snapshots" / "tiny" / rel).read_bytes()).hexdigest()


def test_minhash_step_runs_in_its_own_pod(cluster, tiny_run):
    c, instance, home, url = cluster
    root = DataRoot(url)
    key = "snapshots/tiny/revisions/lz4-4.4.5/shards/000/minhash.parquet"
    root.delete(key)  # the step pod must write it again
    run_id = _launch(home, "shard_job", "tiny/lz4-4.4.5|000", "minhash_signatures")
    _wait_run(instance, run_id, c)
    kinds = {n: j["body"]["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
             for n, j in c.jobs.items()}
    assert sorted(kinds.values()) == ["run_worker", "step_worker"]
    step = next(j for n, j in c.jobs.items() if kinds[n] == "step_worker")
    run = next(j for n, j in c.jobs.items() if kinds[n] == "run_worker")
    spec = step["body"]["spec"]["template"]
    container = spec["spec"]["containers"][0]
    assert spec["metadata"]["labels"]["dagster/op"] == "minhash_signatures"
    assert step["argv"][:3] == ["dagster", "api", "execute_step"]
    assert container["resources"] == HEAVY_STEP_TAGS["minhash"]["dagster-k8s/config"]["container_config"]["resources"]
    for pod in (run, step):  # both pods get the data root and the credentials, from the values
        env = _env_of(pod["body"])
        assert env["MEGACPP_DATA_ROOT"] == url and env["MEGACPP_PROFILE"] == "production" and env["DAGSTER_HOME"] == IMAGE_HOME
        assert {"secretRef": {"name": SECRET}} in pod["body"]["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        assert pod["env"]["AWS_SECRET_ACCESS_KEY"] == "megacpp-test-secret"
    # what the step process saw: the spec's variables, the Secret's keys, PATH and HOME — nothing else
    spec_names = {e["name"] for e in container["env"]}
    assert set(step["env"]) == spec_names | set(c.secrets[SECRET]) | {"PATH", "HOME"}
    assert "DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS" in spec_names and "MEGACPP_CACHE_DIR" not in step["env"]
    assert root.sha256(key) == _local_hash(tiny_run, "revisions/lz4-4.4.5/shards/000/minhash.parquet")
    from dagster import AssetKey, AssetRecordsFilter

    rec = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey("minhash_signatures"),
                                                             asset_partitions=["tiny/lz4-4.4.5|000"]), limit=1).records
    assert rec and rec[0].run_id == run_id and rec[0].asset_materialization.tags["dagster/data_version"]


def test_later_steps_read_what_the_pods_wrote(cluster, tiny_run):
    c, instance, home, url = cluster
    root = DataRoot(url)
    rels = ["dedup/lsh_bands_00_07.parquet", "dedup/lsh_bands_07_14.parquet",
            "dedup/decisions.parquet", "documents/chunk_drops.parquet"]
    for rel in rels:
        root.delete(f"snapshots/tiny/{rel}")
    before = set(c.jobs)
    steps = ["lsh_bands_00_07", "lsh_bands_07_14", "dedup_decisions", "chunk_dedup"]
    run_id = _launch(home, "snapshot_job", "tiny", *steps)
    _wait_run(instance, run_id, c)
    new = {n: c.jobs[n] for n in set(c.jobs) - before}
    ops = sorted(j["body"]["spec"]["template"]["metadata"]["labels"].get("dagster/op", "") for j in new.values()
                 if j["body"]["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "step_worker")
    assert ops == sorted(steps)  # one pod per step
    for rel in rels:
        assert root.sha256(f"snapshots/tiny/{rel}") == _local_hash(tiny_run, rel), rel
    figures = json.loads(root.read_text("snapshots/tiny/figures/chunk_dedup.json"))
    assert figures["chunks_in"] > 0 and figures["shards_in"] == 3  # the chunk shards, read from the object store
