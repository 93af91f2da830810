"""The running-pod alert against the real kubernetes client and a local API server.

A server on 127.0.0.1 serves pod lists for three scenarios — healthy; every pod Pending
in ImagePullBackOff; all done — and a second server on 127.0.0.1 receives the webhook.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from dagster import DagsterInstance, DagsterRunStatus, SensorResult, SkipReason, build_sensor_context
from dagster._core.test_utils import create_run_for_test

from megacpp_assets.pod_sensor import running_pods_sensor
from megacpp_core.pod_health import count_pods, evaluate
from megacpp_resources.kubernetes import AlertSinkResource, KubernetesResource


def _pod(name, phase, component="step_worker", waiting=None):
    status = {"phase": phase}
    if waiting:
        status["containerStatuses"] = [{"name": "c", "image": "img", "imageID": "", "ready": False, "restartCount": 0,
                                        "state": {"waiting": {"reason": waiting}}}]
    return {"metadata": {"name": name, "namespace": "dagster",
                         "labels": {"dagster/run-id": "run-1", "app.kubernetes.io/component": component}},
            "status": status}


SCENARIOS = {
    "healthy": [_pod("run", "Running", "run_worker"), _pod("step-a", "Running"), _pod("step-b", "Pending")],
    "imagepull": [_pod("run", "Pending", "run_worker", "ImagePullBackOff"),
                  _pod("step-a", "Pending", waiting="ImagePullBackOff"), _pod("step-b", "Pending", waiting="ErrImagePull")],
    "done": [_pod("run", "Succeeded", "run_worker"), _pod("step-a", "Succeeded")],
}


class _Api(BaseHTTPRequestHandler):
    scenario = "healthy"
    seen_selectors: list = []

    def do_GET(self):  # noqa: N802 (http.server API)
        from urllib.parse import parse_qs, urlparse

        u = urlparse(self.path)
        assert u.path == "/api/v1/namespaces/dagster/pods", u.path
        _Api.seen_selectors.append(parse_qs(u.query).get("labelSelector"))
        body = json.dumps({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": SCENARIOS[_Api.scenario]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


class _Hook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802
        _Hook.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture()
def servers():
    api, hook = HTTPServer(("127.0.0.1", 0), _Api), HTTPServer(("127.0.0.1", 0), _Hook)
    for s in (api, hook):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    _Hook.received.clear()
    yield f"http://127.0.0.1:{api.server_port}", f"http://127.0.0.1:{hook.server_port}/alert"
    for s in (api, hook):
        s.shutdown()


def _tick(instance, api, hook, cursor, grace):
    ctx = build_sensor_context(instance=instance, cursor=cursor, resources={
        "kubernetes": KubernetesResource(host=api, namespace="dagster", verify_ssl=False),
        "alerts": AlertSinkResource(webhook_url=hook, grace_seconds=grace)})
    result = running_pods_sensor(ctx)
    new_cursor = result.cursor if isinstance(result, SensorResult) else ctx.cursor
    return result, new_cursor


def test_scenarios_with_real_client(servers):
    api, hook = servers
    with DagsterInstance.ephemeral() as instance:
        create_run_for_test(instance, job_name="revision_job", status=DagsterRunStatus.STARTED)

        _Api.scenario = "healthy"
        result, cursor = _tick(instance, api, hook, None, grace=0)
        assert isinstance(result, SkipReason) and "2 running / 3 scheduled" in result.skip_message
        assert _Api.seen_selectors[-1] == ["dagster/run-id"]

        _Api.scenario = "imagepull"  # scheduled count looks healthy (3), running is 0
        result, cursor = _tick(instance, api, hook, cursor, grace=0)
        assert isinstance(result, SensorResult)
        ev = result.asset_events[0]
        assert ev.check_name == "running_pods_nonzero" and ev.passed is False
        assert ev.metadata["running_pods"].value == 0 and ev.metadata["scheduled_pods"].value == 3
        assert len(_Hook.received) == 1 and _Hook.received[0]["waiting_reasons"] == {"ErrImagePull": 1, "ImagePullBackOff": 2}

        result, cursor = _tick(instance, api, hook, cursor, grace=0)  # still stalled: no second webhook
        assert isinstance(result, SkipReason) and len(_Hook.received) == 1

        _Api.scenario = "done"
        result, cursor = _tick(instance, api, hook, cursor, grace=0)
        # runs still in progress in the instance and nothing running: stays alerted, no repeat
        assert len(_Hook.received) == 1


def test_grace_period_and_recovery(servers):
    api, hook = servers
    with DagsterInstance.ephemeral() as instance:
        run = create_run_for_test(instance, job_name="revision_job", status=DagsterRunStatus.STARTED)
        _Api.scenario = "imagepull"
        result, cursor = _tick(instance, api, hook, None, grace=3600)
        assert isinstance(result, SkipReason) and not _Hook.received  # inside the grace period
        assert json.loads(cursor)["stalled_since"] is not None
        result, cursor = _tick(instance, api, hook, json.dumps({"stalled_since": 1.0, "alerted": False}), grace=3600)
        assert isinstance(result, SensorResult) and len(_Hook.received) == 1  # stalled since long ago
        _Api.scenario = "healthy"
        result, cursor = _tick(instance, api, hook, cursor, grace=3600)
        assert isinstance(result, SensorResult) and result.asset_events[0].passed is True
        instance.delete_run(run.run_id)
        _Api.scenario = "done"
        result, cursor = _tick(instance, api, hook, cursor, grace=0)
        assert isinstance(result, SkipReason) and "0 runs in progress" in result.skip_message


def test_counting_ignores_unlabelled_and_non_worker_pods():
    pods = SCENARIOS["healthy"] + [{"metadata": {"labels": {}}, "status": {"phase": "Running"}},
                                   {"metadata": {"labels": {"dagster/run-id": "x", "app.kubernetes.io/component": "webserver"}},
                                    "status": {"phase": "Running"}}]
    c = count_pods(pods)
    assert (c.running, c.pending, c.scheduled) == (2, 1, 3)
    assert not evaluate(c, 1, 100.0, None, 0).alert
    assert evaluate(count_pods(SCENARIOS["imagepull"]), 1, 100.0, 0.0, 60).alert
