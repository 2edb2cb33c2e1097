"""Operator benchmark on the local control plane (not a timed test).

Measures, with the operator running as it does in a cluster (its own process):
  1. one StrategyJob with 1000 workers: seconds from creating it until all 1000 pods and
     the Service exist;
  2. 100 StrategyJobs with 8 workers each: seconds until all 800 pods and 100 Services exist;
  3. the operator's peak resident memory while it holds 1000 StrategyJobs.
The last line compares (1) with TFJob's client-rate bound: its default 20 requests/s
needs at least 1000 / 20 = 50 s for 1000 pods (100 s counting its Service per pod).
Kubeflow's training-operator is not built here (a Go operator with its own module graph,
out of scope), so the comparison is with that bound, not a measured TFJob run.

    K8S_BIN_DIR=... PYTHONPATH=sdk:operator python bench/bench_operator.py [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "control_plane", ROOT / "tests" / "integration" / "control_plane.py"
)
cp_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cp_mod)

TFJOB_QPS = 20


class Api:
    """Minimal synchronous client for the benchmark's own calls."""

    def __init__(self, cp) -> None:
        self.server, self.token = cp.server, cp.token
        self.ctx = ssl.create_default_context(cafile=str(cp.ca_path))

    def call(self, method: str, path: str, body=None, accept="application/json"):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.server + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
                "Accept": accept,
            },
        )
        with urllib.request.urlopen(req, context=self.ctx, timeout=60) as r:
            return json.loads(r.read())

    def count(self, namespace: str, plural: str, selector: str) -> int:
        """Objects matching ``selector``, fetching metadata only (cheap while polling)."""
        accept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
        path = f"/api/v1/namespaces/{namespace}/{plural}?labelSelector={selector}"
        return len(self.call("GET", path, accept=accept).get("items") or [])


def job(name: str, workers: int) -> dict:
    return {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": name},
        "spec": {
            "strategy": "MultiWorkerMirroredStrategy",
            "replicaSpecs": {
                "worker": {
                    "replicas": workers,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "strategyjob", "image": "train", "command": ["train"]}
                            ]
                        }
                    },
                }
            },
        },
    }


def create_namespace(api: Api, ns: str) -> None:
    api.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})


def create_jobs(api: Api, ns: str, jobs: list[dict]) -> None:
    for j in jobs:
        api.call("POST", f"/apis/strategyjob.dev/v1alpha1/namespaces/{ns}/strategyjobs", j)


def wait_children(api: Api, ns: str, pods: int, services: int, timeout: float) -> None:
    sel = "strategyjob.dev/job-name"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if api.count(ns, "pods", sel) >= pods and api.count(ns, "services", sel) >= services:
            return
        time.sleep(0.1)
    raise TimeoutError(f"{pods} pods / {services} services not created in {timeout:.0f}s")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="skip the 1000-job memory run")
    args = parser.parse_args()
    bin_dir, why = cp_mod.find_binaries()
    if bin_dir is None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    cp = cp_mod.ControlPlane(bin_dir).start()
    op = None
    try:
        cp.kubectl("apply", "-f", str(ROOT / "crds"))
        cp.kubectl("wait", "--for=condition=Established", "crd/strategyjobs.strategyjob.dev")
        api = Api(cp)
        env = {
            **os.environ,
            "KUBECONFIG": str(cp.kubeconfig),
            "PYTHONPATH": f"{ROOT / 'sdk'}{os.pathsep}{ROOT / 'operator'}",
            "STRATEGYJOB_METRICS_PORT": "0",
        }
        log = open(cp.dir / "operator.log", "wb")
        op = subprocess.Popen(
            [sys.executable, "-m", "strategyjob_operator", "-A", "--standalone"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        time.sleep(2)  # let kopf list and start watching before the clock starts

        create_namespace(api, "one")
        t0 = time.perf_counter()
        create_jobs(api, "one", [job("big", 1000)])
        wait_children(api, "one", 1000, 1, timeout=600)
        one_job = time.perf_counter() - t0
        print(f"1 job x 1000 workers: all pods and the service exist after {one_job:.2f} s")

        create_namespace(api, "many")
        t0 = time.perf_counter()
        create_jobs(api, "many", [job(f"j{i}", 8) for i in range(100)])
        wait_children(api, "many", 800, 100, timeout=600)
        many = time.perf_counter() - t0
        print(f"100 jobs x 8 workers: all 800 pods and 100 services exist after {many:.2f} s")

        if not args.quick:
            create_namespace(api, "hold")
            create_jobs(api, "hold", [job(f"h{i}", 1) for i in range(900)])
            wait_children(api, "hold", 900, 900, timeout=900)
            time.sleep(5)  # let the passes triggered by the last pods settle
            held = 1 + 100 + 900
            print(f"operator peak RSS while holding {held} jobs: {peak_rss_mib(op.pid):.0f} MiB")
        else:
            print(f"operator peak RSS while holding 101 jobs: {peak_rss_mib(op.pid):.0f} MiB")

        bound = 1000 / TFJOB_QPS
        print(
            f"TFJob client-rate bound for 1000 pods at {TFJOB_QPS} QPS: >= {bound:.0f} s "
            f"(>= {2 * bound:.0f} s with its Service per pod); StrategyJob is "
            f"{bound / one_job:.1f}x faster than that bound (training-operator not built here)"
        )
        return 0
    finally:
        if op is not None:
            op.terminate()
            op.wait(20)
        cp.stop()


if __name__ == "__main__":
    sys.exit(main())
