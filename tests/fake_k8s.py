"""A Kubernetes API server on 127.0.0.1 that runs the Jobs it is given as local processes.

It stands in for a cluster in the tests of the production profile: dagster-k8s's
``k8s_job_executor`` (through the official ``kubernetes`` client, unmodified) creates one
Job per step, and this server records the Job spec exactly as sent, then starts the
container's command with exactly the environment the spec gives it — plain values,
``secretKeyRef`` / ``configMapKeyRef`` entries and ``envFrom`` Secrets and ConfigMaps it
holds — plus ``PATH`` and ``HOME``, like a kubelet. Paths of the image are translated to
local ones: the volume mounted at the spec's ``DAGSTER_HOME`` (the instance ConfigMap) is
the test's instance directory, and the image's working directory is the project. Job
status (active / succeeded / failed) follows the process; DELETE kills it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class FakeCluster:
    """``secrets`` / ``config_maps``: ``{name: {key: value}}``; ``path_map``: image path →
    local path; ``bin_dir``: where the image's executables (``dagster``) are found;
    ``logs``: a directory for each pod's output; ``workdir``: the image's working directory."""

    def __init__(self, secrets: dict[str, dict[str, str]], path_map: dict[str, str], bin_dir: str, logs: Path,
                 workdir: str, config_maps: dict[str, dict[str, str]] | None = None):
        self.workdir = workdir
        self.secrets = secrets
        self.config_maps = config_maps or {}
        self.path_map = path_map
        self.bin_dir = bin_dir
        self.logs = Path(logs)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.jobs: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeCluster":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        for job in self.jobs.values():
            if job["proc"].poll() is None:
                job["proc"].kill()
        self.server.shutdown()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "megacpp"}}],
            "users": [{"name": "fake", "user": {"token": "test"}}]}))
        return path

    # ------------------------------------------------------------------ the kubelet part

    def _map(self, value: str) -> str:
        for src, dst in self.path_map.items():
            if value == src or value.startswith(src + "/"):
                return dst + value[len(src):]
        return value

    def environment(self, container: dict) -> dict[str, str]:
        """The environment a pod of ``container`` gets (see the module docstring)."""
        env = {"PATH": f"{self.bin_dir}:/usr/bin:/bin", "HOME": str(self.logs)}
        for src in container.get("envFrom") or []:
            if "secretRef" in src:
                env.update(self.secrets[src["secretRef"]["name"]])
            if "configMapRef" in src:
                env.update(self.config_maps[src["configMapRef"]["name"]])
        for e in container.get("env") or []:
            if "value" in e and e["value"] is not None:
                env[e["name"]] = self._map(str(e["value"]))
            elif "valueFrom" in e:
                ref = e["valueFrom"].get("secretKeyRef") or e["valueFrom"].get("configMapKeyRef")
                store = self.secrets if "secretKeyRef" in e["valueFrom"] else self.config_maps
                env[e["name"]] = store[ref["name"]][ref["key"]]
        return env

    def _start(self, name: str, body: dict) -> None:
        container = body["spec"]["template"]["spec"]["containers"][0]
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        exe = shutil.which(argv[0], path=f"{self.bin_dir}:/usr/bin:/bin")
        env = self.environment(container)
        cwd = self._map(container.get("workingDir") or self.workdir)
        log = open(self.logs / f"{name}.log", "w")
        proc = subprocess.Popen([exe, *argv[1:]], env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        self.jobs[name] = {"body": body, "proc": proc, "env": env, "argv": argv, "log": self.logs / f"{name}.log"}

    def status(self, name: str) -> dict:
        rc = self.jobs[name]["proc"].poll()
        if rc is None:
            return {"active": 1}
        return {"succeeded": 1} if rc == 0 else {"failed": 1}

    # ------------------------------------------------------------------ the API part

    def _handler(self):
        cluster = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code: int, doc: dict) -> None:
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _job_doc(self, name: str) -> dict:
                body = cluster.jobs[name]["body"]
                return {**body, "status": cluster.status(name)}

            def do_POST(self):  # noqa: N802 (http.server API)
                parts = self.path.split("?")[0].strip("/").split("/")
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if parts[:3] == ["apis", "batch", "v1"] and parts[-1] == "jobs":
                    name = body["metadata"]["name"]
                    body["metadata"].setdefault("namespace", parts[4])
                    body["metadata"]["uid"] = str(uuid.uuid4())
                    with cluster.lock:
                        if name in cluster.jobs:
                            return self._send(409, {"kind": "Status", "status": "Failure", "reason": "AlreadyExists",
                                                    "code": 409})
                        try:
                            cluster._start(name, body)
                        except OSError as e:
                            return self._send(500, {"kind": "Status", "status": "Failure", "message": str(e), "code": 500})
                    return self._send(201, self._job_doc(name))
                self._send(404, {"kind": "Status", "status": "Failure", "code": 404})

            def do_GET(self):  # noqa: N802
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:3] == ["apis", "batch", "v1"] and len(parts) >= 7 and parts[5] == "jobs":
                    name = parts[6]
                    if name in cluster.jobs:
                        return self._send(200, self._job_doc(name))
                if parts[:2] == ["api", "v1"] and parts[-1] == "pods":
                    items = [{"metadata": {"name": n, "labels": j["body"]["spec"]["template"]["metadata"].get("labels", {})},
                              "status": {"phase": {"active": "Running", "succeeded": "Succeeded",
                                                   "failed": "Failed"}[next(iter(cluster.status(n)))]}}
                             for n, j in cluster.jobs.items()]
                    return self._send(200, {"kind": "PodList", "apiVersion": "v1", "items": items})
                self._send(404, {"kind": "Status", "status": "Failure", "code": 404})

            def do_DELETE(self):  # noqa: N802
                name = self.path.split("?")[0].strip("/").split("/")[-1]
                if name in cluster.jobs and cluster.jobs[name]["proc"].poll() is None:
                    cluster.jobs[name]["proc"].kill()
                self._send(200, {"kind": "Status", "status": "Success"})

            def log_message(self, *a):
                pass

        return Handler


def wait_all(cluster: FakeCluster, timeout_s: float = 600) -> None:
    """Wait until every pod process has exited."""
    import time

    deadline = time.monotonic() + timeout_s
    for job in cluster.jobs.values():
        job["proc"].wait(timeout=max(1.0, deadline - time.monotonic()))

