"""Job-size benchmark on the local control plane (not a timed test).

Every replica's TF_CONFIG lists the whole cluster: in the pod specs that would grow with the
square of a job's size, so the cluster is stored once, in the job's ConfigMap, and each pod's
TF_CONFIG refers to it (Kubernetes expands it in the container). For each size N (default
100, 250, 500 and the largest the CRD admits, ``jobspec.MAX_TOTAL_REPLICAS``), with the
longest names the CRD admits at that size (the job's name, a 63-character namespace, port
65535) so that TF_CONFIG is as large as it can be, it measures with the operator running as
in a cluster (its own process, a fresh one per size):

  - TF_CONFIG bytes per pod (``TF_CONFIG=<value>`` and its NUL, as ``execve`` counts it) against
    the kernel's 128 KiB limit per environment string, and all the pods' together;
  - the bytes etcd holds for the job's pods and its ConfigMap (values as the API server stores
    them), against those TF_CONFIG strings: what the pods alone held when each carried one;
  - seconds from creating the job until all its pods exist;
  - the operator's peak resident memory (VmHWM) through creating the pods and one more pass
    that reads them all back, against the chart's memory limit; for the largest size, also
    that of an operator started afresh with the job and its pods in place (kopf lists and
    watches the pods, a pass reads them all).

The last lines are, for the largest job, the ratio of its TF_CONFIG strings to its etcd bytes
and of the operator's peak RSS to the chart's limit.

    K8S_BIN_DIR=... PYTHONPATH=sdk:operator python bench/bench_job_size.py [--sizes 100,1000]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "sdk"), str(ROOT / "operator"), str(ROOT / "bench")]

import bench_operator  # noqa: E402

cp_mod = bench_operator.cp_mod

from strategyjob import jobspec  # noqa: E402

SELECTOR = "strategyjob.dev/job-name"
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def chart_memory_limit() -> int:
    """The operator's memory limit in the chart's default values, in bytes."""
    values = yaml.safe_load((ROOT / "helm" / "strategyjob-operator" / "values.yaml").read_text())
    number, unit = re.fullmatch(r"(\d+)([KMG]i)", values["resources"]["limits"]["memory"]).groups()
    return int(number) * _UNITS[unit]


def worst_case_job(total: int, namespace: str) -> dict:
    """A MultiWorkerMirroredStrategy job of ``total`` replicas (a chief and workers) with the
    longest name the CRD admits for it, on port 65535."""
    name_length = min(
        jobspec.max_name_length(total), jobspec.MAX_NAME_LENGTH - len(f"-worker-{total - 2}")
    )
    template = {"spec": {"containers": [{"name": "strategyjob", "image": "train"}]}}
    return {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": "j" * name_length, "namespace": namespace},
        "spec": {
            "strategy": "MultiWorkerMirroredStrategy",
            "port": 65535,
            "replicaSpecs": {
                "chief": {"replicas": 1, "template": template},
                "worker": {"replicas": total - 1, "template": template},
            },
        },
    }


def tf_config_sizes(job: jobspec.StrategyJob) -> tuple[int, int]:
    """The largest TF_CONFIG string of the job's pods and all of them together, in bytes."""
    cluster = jobspec.cluster_for_kubernetes(job)
    sizes = [
        len(jobspec.ENV_TF_CONFIG) + 1 + len(jobspec.tf_config(cluster, t, i)) + 1
        for t, i in job.replicas()
    ]
    return max(sizes), sum(sizes)


def etcd_bytes(cp, prefix: str) -> tuple[int, int]:
    """How many objects etcd holds under key ``prefix`` (the API server's, e.g.
    ``/registry/pods/<namespace>/``) and their bytes as stored, read 100 at a time through
    etcd's JSON gateway."""
    start = prefix.encode()
    end = start[:-1] + bytes([start[-1] + 1])
    count = total = 0
    while True:
        body = {"key": _b64(start), "range_end": _b64(end), "limit": 100}
        request = urllib.request.Request(
            f"{cp.etcd_url}/v3/kv/range", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            page = json.loads(response.read())
        kvs = page.get("kvs") or []
        count += len(kvs)
        total += sum(len(base64.b64decode(kv["value"])) for kv in kvs)
        if not page.get("more") or not kvs:
            return count, total
        start = base64.b64decode(kvs[-1]["key"]) + b"\0"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def container_tf_config(api, ns: str, env: list[dict]) -> str:
    """TF_CONFIG as the container gets it from a pod's ``env``: the cluster read from the
    job's ConfigMap into STRATEGYJOB_CLUSTER_SPEC and ``$(STRATEGYJOB_CLUSTER_SPEC)`` expanded,
    as the kubelet does (no other ``$`` is in it)."""
    values = {}
    for entry in env:
        ref = (entry.get("valueFrom") or {}).get("configMapKeyRef")
        if ref:
            config_map = api.call("GET", f"/api/v1/namespaces/{ns}/configmaps/{ref['name']}")
            values[entry["name"]] = config_map["data"][ref["key"]]
        elif "value" in entry:
            values[entry["name"]] = entry["value"]
    reference = f"$({jobspec.ENV_CLUSTER_SPEC})"
    return values["TF_CONFIG"].replace(reference, values.get(jobspec.ENV_CLUSTER_SPEC, reference))


def reconcile_passes(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    match = re.search(r"^strategyjob_operator_reconcile_duration_seconds_count (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def poll(what: str, predicate, timeout: float, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (urllib.error.URLError, ConnectionError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def start_operator(cp, ns: str, port: int, log_name: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "KUBECONFIG": str(cp.kubeconfig),
        "PYTHONPATH": f"{ROOT / 'sdk'}{os.pathsep}{ROOT / 'operator'}",
        "STRATEGYJOB_METRICS_PORT": str(port),
        "OMP_NUM_THREADS": "1",
    }
    with open(cp.dir / log_name, "wb") as log:
        op = subprocess.Popen(
            [sys.executable, "-m", "strategyjob_operator", "--standalone", "-n", ns],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    poll("the operator's metrics endpoint", lambda: reconcile_passes(port) >= 0, 120)
    return op


def one_more_pass(api, jobs: str, name: str, port: int, mark: str) -> None:
    """Wake the operator with an annotation and wait until a pass has run (it reads every
    pod of the job back)."""
    before = reconcile_passes(port)
    api.call(
        "PATCH",
        f"{jobs}/{name}",
        {"metadata": {"annotations": {"bench": mark}}},
        content_type="application/merge-patch+json",
    )
    poll("one more pass", lambda: reconcile_passes(port) > before, 300)


def measure(api, cp, total: int, index: int, restart: bool) -> dict:
    """One size: a fresh operator watching a fresh 63-character namespace; with
    ``restart``, then another fresh one that finds the job and its pods in place."""
    prefix = f"size{index}-"
    ns = prefix + "n" * (jobspec.MAX_NAMESPACE_LENGTH - len(prefix))
    bench_operator.create_namespace(api, ns)
    obj = worst_case_job(total, ns)
    job = jobspec.load_manifest(obj)
    largest, all_bytes = tf_config_sizes(job)
    name = obj["metadata"]["name"]
    jobs = f"/apis/strategyjob.dev/v1alpha1/namespaces/{ns}/strategyjobs"
    pods = f"/api/v1/namespaces/{ns}/pods?labelSelector={SELECTOR}"
    result = {"total": total, "name": len(name), "tf_config": largest, "all_bytes": all_bytes}

    port = cp_mod.free_port()
    op = start_operator(cp, ns, port, f"operator-{total}.log")
    try:
        started = time.perf_counter()
        api.call("POST", jobs, obj)
        poll(
            f"{total} pods",
            lambda: len(api.call("GET", pods, accept=METADATA_LIST).get("items") or []) >= total,
            900,
        )
        result["created"] = time.perf_counter() - started
        poll(
            "status.launched",
            lambda: (api.call("GET", f"{jobs}/{name}").get("status") or {}).get("launched"),
            300,
        )
        one_more_pass(api, jobs, name, port, "touch")
        pod = api.call("GET", f"/api/v1/namespaces/{ns}/pods/{name}-worker-{total - 2}")
        tf_config = container_tf_config(api, ns, pod["spec"]["containers"][0]["env"])
        assert len("TF_CONFIG=") + len(tf_config) + 1 == largest, "TF_CONFIG differs"
        result["etcd_pods"] = etcd_bytes(cp, f"/registry/pods/{ns}/")
        result["etcd_config_map"] = etcd_bytes(cp, f"/registry/configmaps/{ns}/{name}-")
        assert result["etcd_pods"][0] == total, result["etcd_pods"]
        result["peak_mib"] = bench_operator.peak_rss_mib(op.pid)
        result["alive"] = op.poll() is None
    finally:
        bench_operator.stop_process(op)
    if restart:
        op = start_operator(cp, ns, port, f"operator-{total}-restarted.log")
        try:
            poll("a pass of the restarted operator", lambda: reconcile_passes(port) >= 1, 300)
            one_more_pass(api, jobs, name, port, "restarted")
            result["restart_peak_mib"] = bench_operator.peak_rss_mib(op.pid)
            result["alive"] = result["alive"] and op.poll() is None
        finally:
            bench_operator.stop_process(op)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default=f"100,250,500,{jobspec.MAX_TOTAL_REPLICAS}",
        help="comma-separated total replicas per job (default: %(default)s)",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if any(not 2 <= n <= jobspec.MAX_TOTAL_REPLICAS for n in sizes):
        parser.error(f"sizes must be between 2 and {jobspec.MAX_TOTAL_REPLICAS}")
    bin_dir, why = cp_mod.find_binaries()
    if bin_dir is None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    limit = chart_memory_limit()
    cp = cp_mod.ControlPlane(bin_dir).start()
    try:
        cp.kubectl("apply", "-f", str(ROOT / "crds"))
        bench_operator.wait_established(cp, "strategyjobs.strategyjob.dev")
        api = bench_operator.Api(cp)
        results = []
        for i, total in enumerate(sizes):
            r = measure(api, cp, total, i, restart=total == max(sizes))
            results.append(r)
            (_, pod_bytes), (maps, map_bytes) = r["etcd_pods"], r["etcd_config_map"]
            r["etcd"] = pod_bytes + map_bytes
            print(
                f"N={r['total']:>5}: etcd holds {pod_bytes / 2**20:.2f} MiB of pods "
                f"({pod_bytes / total:,.0f} B each) + {map_bytes:,} B in {maps} ConfigMap = "
                f"{r['etcd'] / 2**20:.2f} MiB; its TF_CONFIG strings: "
                f"{r['all_bytes'] / 2**20:.1f} MiB",
                flush=True,
            )
            print(
                f"N={r['total']:>5} (name {r['name']} chars, namespace 63, port 65535): "
                f"TF_CONFIG {r['tf_config']:,} B/pod = {r['tf_config'] / 131072:.3f} of the "
                f"kernel's 131,072; {r['all_bytes'] / 2**20:.1f} MiB in all; all pods created "
                f"in {r['created']:.1f} s; operator peak RSS {r['peak_mib']:.0f} MiB"
                + (
                    f"; restarted with the job in place: {r['restart_peak_mib']:.0f} MiB"
                    if "restart_peak_mib" in r
                    else ""
                )
                + ("" if r["alive"] else " (operator DIED)"),
                flush=True,
            )
        largest = max(results, key=lambda r: r["total"])
        print(
            f"TF_CONFIG strings / etcd bytes of the job at N={largest['total']}: "
            f"{largest['all_bytes'] / 2**20:.1f} MiB / {largest['etcd'] / 2**20:.2f} MiB = "
            f"{largest['all_bytes'] / largest['etcd']:.1f}"
        )
        peak = max(largest["peak_mib"], largest.get("restart_peak_mib", 0.0))
        print(
            f"peak RSS / chart limit at N={largest['total']}: {peak:.0f} MiB / "
            f"{limit / 2**20:.0f} MiB = {peak * 2**20 / limit:.2f}"
        )
        return 0
    finally:
        cp.stop()


if __name__ == "__main__":
    sys.exit(main())
