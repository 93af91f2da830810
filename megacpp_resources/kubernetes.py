"""Kubernetes client and alert sink resources for the running-pod sensor (SPEC §5)."""

import json
import urllib.request
from typing import Any

from dagster import ConfigurableResource

from megacpp_core.pod_health import DEFAULT_GRACE_SECONDS, RUN_ID_LABEL


class KubernetesResource(ConfigurableResource):
    """The official ``kubernetes`` client, configured in-cluster, from a kubeconfig, or
    against an explicit API ``host`` (tests point it at a local server).

    ``namespace``: where dagster-k8s launches run and step pods.
    """

    namespace: str = "dagster"
    host: str = ""
    kubeconfig: str = ""
    in_cluster: bool = False
    verify_ssl: bool = True

    def core_api(self):
        from kubernetes import client, config

        if self.host:
            cfg = client.Configuration()
            cfg.host = self.host
            cfg.verify_ssl = self.verify_ssl
            return client.CoreV1Api(client.ApiClient(cfg))
        if self.in_cluster:
            config.load_incluster_config()
        else:
            config.load_kube_config(config_file=self.kubeconfig or None)
        return client.CoreV1Api()

    def list_worker_pods(self) -> list[Any]:
        """Pods carrying dagster-k8s's ``dagster/run-id`` label in ``namespace``."""
        return list(self.core_api().list_namespaced_pod(self.namespace, label_selector=RUN_ID_LABEL).items)


class AlertSinkResource(ConfigurableResource):
    """Where alerts go: a JSON POST to ``webhook_url`` (skipped when empty); the alert
    fires after ``grace_seconds`` (default 300 s) of zero running pods."""

    webhook_url: str = ""
    timeout_seconds: float = 10.0
    grace_seconds: float = DEFAULT_GRACE_SECONDS

    def send(self, payload: dict) -> bool:
        """POST ``payload`` as JSON; returns True when a webhook accepted it (2xx)."""
        if not self.webhook_url:
            return False
        req = urllib.request.Request(self.webhook_url, data=json.dumps(payload, sort_keys=True).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_seconds) as resp:
            return 200 <= resp.status < 300
