"""Kubernetes deployment files and step pod specs, proven without a cluster."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from megacpp_assets.profiles import HEAVY_STEP_TAGS, POOLS

K8S = Path(__file__).resolve().parent.parent / "k8s"


@pytest.mark.parametrize("path", sorted((K8S / "manifests").glob("*.yaml")), ids=lambda p: p.name)
def test_manifests_validate_against_the_kubernetes_schema(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_rbac_lets_the_sensor_list_pods():
    docs = list(yaml.safe_load_all((K8S / "manifests" / "rbac.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "Role")
    pods = next(r for r in role["rules"] if "pods" in r["resources"])
    assert {"list", "watch"} <= set(pods["verbs"])
    values = yaml.safe_load((K8S / "helm" / "values.yaml").read_text())
    assert values["runLauncher"]["type"] == "K8sRunLauncher" and values["postgresql"]["enabled"]
    assert values["global"]["serviceAccountName"] == next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
    env = {e["name"]: e.get("value") for e in values["dagster-user-deployments"]["deployments"][0]["env"]}
    assert env["MEGACPP_PROFILE"] == "production"


#: The heavy assets and the profile entry their tags come from.
HEAVY_ASSETS = {"minhash_signatures": "minhash", "lsh_bands_00_07": "minhash", "semantic_graph": "libclang"}


@pytest.mark.parametrize("asset_name", sorted(HEAVY_ASSETS))
def test_step_pod_spec_from_our_tags(asset_name):
    from dagster import AssetKey
    from dagster_k8s.job import DagsterK8sJobConfig, construct_dagster_k8s_job, get_user_defined_k8s_config

    from megacpp_assets.definitions import defs

    step = HEAVY_ASSETS[asset_name]
    tags = dict(defs.resolve_assets_def(AssetKey(asset_name)).node_def.tags)  # the asset's real op tags
    job = construct_dagster_k8s_job(
        job_config=DagsterK8sJobConfig(job_image="registry.example.internal/megacpp/code-location:0.1.0",
                                       dagster_home="/opt/dagster/dagster_home"),
        args=["dagster", "api", "execute_step"], job_name=f"dagster-step-{step}",
        user_defined_k8s_config=get_user_defined_k8s_config(tags), component="step_worker",
        labels={"dagster/run-id": "r1", "dagster/op": step})
    pod = job.spec.template
    container = pod.spec.containers[0]
    want = HEAVY_STEP_TAGS[step]["dagster-k8s/config"]["container_config"]["resources"]
    assert container.resources.requests == want["requests"] and container.resources.limits == want["limits"]
    assert container.image.endswith("code-location:0.1.0")
    assert pod.metadata.labels["dagster/run-id"] == "r1" and pod.metadata.labels["app.kubernetes.io/component"] == "step_worker"
    assert POOLS[step].startswith("megacpp-")


def test_heavy_steps_carry_tags_and_pool():
    from dagster import AssetKey

    from megacpp_assets.definitions import defs

    for key, step in {**HEAVY_ASSETS, "lsh_bands_07_14": "minhash"}.items():
        node = defs.resolve_assets_def(AssetKey(key)).node_def
        assert json.loads(node.tags["dagster-k8s/config"]) == HEAVY_STEP_TAGS[step]["dagster-k8s/config"], key
        assert node.pool == POOLS[step], key
