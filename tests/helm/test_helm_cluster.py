"""The chart against the real API server: server-side dry runs of its output, install /
upgrade / uninstall, and the operator run with nothing but the chart's ServiceAccount and
RBAC through a job's whole life, checked against the API server's audit log.

No kubelet runs here, so the chart's pods are never started by Kubernetes: the tests assert
on objects, and run the Deployment's container (command, args, env) as local processes.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_harness import (
    CHART,
    AuditedControlPlane,
    ChartOperator,
    Helm,
    Release,
    call_key,
    only,
    rule_keys,
    wait_until_authorized,
)
from integration_harness import Kube, manifest, wait_for
from operator_api_calls import calls_for, tfjob_calls

from tests.support import kubeflow_tfjobs
from tests.support.control_plane import free_port
from tests.support.operator_logs import refusals

pytestmark = pytest.mark.timeout(240)


def kubectl_get(cp: AuditedControlPlane, *args: str) -> dict[str, Any] | None:
    """``kubectl get -o yaml``; None when the object does not exist."""
    proc = cp.kubectl("get", *args, "-o", "yaml", "--ignore-not-found", check=False)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout) if proc.stdout.strip() else None


def create_namespaces(cp: AuditedControlPlane, *names: str) -> None:
    for name in names:
        cp.kubectl("create", "namespace", name)


def dry_run(cp: AuditedControlPlane, docs: list[dict[str, Any]]) -> str:
    """``kubectl apply --dry-run=server``: the API server validates and admits every object
    (schemas, CRD kinds, admission) without storing any."""
    proc = cp.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(docs), check=False
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == len(docs) and all(ln.endswith("(server dry run)") for ln in lines), lines
    return proc.stdout


# --- what the chart installs ---------------------------------------------------------------------


def test_install_creates_the_crds_and_every_object(
    cluster: AuditedControlPlane, release: Release
) -> None:
    crds = ("strategyjobs.strategyjob.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")
    assert not {f"customresourcedefinition.apiextensions.k8s.io/{c}" for c in crds} & (
        release.crds_before_install
    )
    for crd in crds:
        obj = kubectl_get(cluster, "crd", crd)
        assert obj is not None, crd
        conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
        assert conditions.get("Established") == "True", crd
    ns, name = release.namespace, release.fullname
    deploy = kubectl_get(cluster, "-n", ns, "deployment", name)
    assert deploy is not None and deploy["spec"]["replicas"] == 2
    for kind, obj_name in (
        ("serviceaccount", name),
        ("service", f"{name}-metrics"),
    ):
        assert kubectl_get(cluster, "-n", ns, kind, obj_name) is not None, kind
    for kind, obj_name in (
        ("clusterrole", name),
        ("clusterrolebinding", name),
        ("clusterkopfpeering", "strategyjob-operator"),
    ):
        assert kubectl_get(cluster, kind, obj_name) is not None, kind
    assert "kubectl get sjob -w" in release.install_output  # NOTES
    assert kubectl_get(cluster, "crd", "tfjobs.kubeflow.org") is None  # only with tfjob.enabled
    assert "No resources found" in cluster.kubectl("get", "sjob", "-A").stderr  # the short name


def test_templates_pass_server_side_dry_run(
    cluster: AuditedControlPlane, cluster_helm: Helm, release: Release
) -> None:
    """What `helm template` gives GitOps tools is valid for the real API server, in both
    modes (the CRDs, installed by the release, make the peering objects known)."""
    out = dry_run(cluster, cluster_helm.render(release="dryrun", namespace=release.namespace))
    for kind in ("deployment.apps", "clusterrole.rbac.authorization.k8s.io", "service"):
        assert re.search(rf"^{re.escape(kind)}/dryrun-strategyjob-operator\S* created", out, re.M)
    create_namespaces(cluster, "dry-a", "dry-b")
    out = dry_run(
        cluster,
        cluster_helm.render(
            "--set", "watchNamespaces={dry-a,dry-b}", release="dryrun", namespace=release.namespace
        ),
    )
    assert out.count("role.rbac.authorization.k8s.io/dryrun-strategyjob-operator created") == 2
    assert out.count("kopfpeering.kopf.dev/strategyjob-operator created") == 2


def test_service_monitor_needs_the_prometheus_operator_crd(
    cluster: AuditedControlPlane, cluster_helm: Helm, release: Release
) -> None:
    """The ServiceMonitor CRD is not installed here: helm install stops with the chart's own
    message and installs nothing; rendered for a cluster that has it, everything else is valid
    and the ServiceMonitor is refused only for its missing kind."""
    proc = cluster_helm.run(
        "install",
        "monitored",
        str(CHART),
        "-n",
        release.namespace,
        "--set",
        "metrics.serviceMonitor.enabled=true",
        check=False,
    )
    assert proc.returncode != 0
    assert "does not serve monitoring.coreos.com/v1 ServiceMonitor" in proc.stderr
    assert cluster_helm.run("status", "monitored", "-n", release.namespace, check=False).returncode
    docs = cluster_helm.render(
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--api-versions",
        "monitoring.coreos.com/v1/ServiceMonitor",
        release="monitored",
        namespace=release.namespace,
    )
    monitor = only(docs, "ServiceMonitor")
    dry_run(cluster, [d for d in docs if d is not monitor])
    proc = cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(monitor), check=False
    )
    assert proc.returncode != 0
    assert 'no matches for kind "ServiceMonitor" in version "monitoring.coreos.com/v1"' in (
        proc.stderr
    )


def test_install_upgrade_uninstall(
    cluster: AuditedControlPlane, cluster_helm: Helm, release: Release
) -> None:
    """A release moves from cluster-wide to two namespaces and back out: helm creates,
    changes and removes exactly the objects of each mode; the CRDs outlive the release."""
    ns, name = "lc-system", "lc-strategyjob-operator"
    peering = "lc-peering"
    cluster_helm.run(
        "install",
        "lc",
        str(CHART),
        "-n",
        ns,
        "--create-namespace",
        "--set",
        f"peering.name={peering}",
    )
    assert kubectl_get(cluster, "clusterrole", name) is not None
    assert kubectl_get(cluster, "clusterkopfpeering", peering) is not None

    create_namespaces(cluster, "lc-a", "lc-b")
    out = cluster_helm.run(
        "upgrade",
        "lc",
        str(CHART),
        "-n",
        ns,
        "--reuse-values",
        "--set",
        "replicaCount=3",
        "--set",
        "watchNamespaces={lc-a,lc-b}",
        "--set",
        "operator.maxInFlight=10",
    ).stdout
    assert "REVISION: 2" in out
    deploy = kubectl_get(cluster, "-n", ns, "deployment", name)
    assert deploy is not None and deploy["spec"]["replicas"] == 3
    c = deploy["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][:3] == ["--namespace=lc-a", "--namespace=lc-b", f"--peering={peering}"]
    assert {"name": "STRATEGYJOB_MAX_IN_FLIGHT", "value": "10"} in c["env"]
    for watched in ("lc-a", "lc-b"):
        assert kubectl_get(cluster, "-n", watched, "role", name) is not None
        assert kubectl_get(cluster, "-n", watched, "rolebinding", name) is not None
        assert kubectl_get(cluster, "-n", watched, "kopfpeering", peering) is not None
    assert kubectl_get(cluster, "clusterrole", f"{name}-discovery") is not None
    wait_for("cluster-wide role removed", lambda: kubectl_get(cluster, "clusterrole", name) is None)
    assert kubectl_get(cluster, "clusterkopfpeering", peering) is None

    # A bad value is refused before anything changes.
    proc = cluster_helm.run(
        "upgrade",
        "lc",
        str(CHART),
        "-n",
        ns,
        "--reuse-values",
        "--set",
        "replicaCount=0",
        check=False,
    )
    assert proc.returncode != 0 and "/replicaCount" in proc.stderr
    status = cluster_helm.run("status", "lc", "-n", ns, "-o", "json").stdout
    assert '"version":2' in status.replace(" ", "")

    cluster_helm.run("uninstall", "lc", "-n", ns)
    leftovers = [
        ("deployment", ns, name),
        ("serviceaccount", ns, name),
        ("service", ns, f"{name}-metrics"),
        ("role", "lc-a", name),
        ("rolebinding", "lc-b", name),
        ("kopfpeering", "lc-a", peering),
        ("clusterrole", None, f"{name}-discovery"),
        ("clusterrole", None, f"{name}-view"),
    ]

    def gone() -> list[tuple[str, str | None, str]]:
        left = []
        for kind, obj_ns, obj_name in leftovers:
            args = ("-n", obj_ns, kind, obj_name) if obj_ns else (kind, obj_name)
            if kubectl_get(cluster, *args) is not None:
                left.append((kind, obj_ns, obj_name))
        return left

    wait_for("the release's objects deleted", lambda: not gone(), timeout=60)
    assert kubectl_get(cluster, "crd", "strategyjobs.strategyjob.dev") is not None


# --- least privilege, proven by a run ------------------------------------------------------------


def service_account_token(cp: AuditedControlPlane, namespace: str, sa: str) -> str:
    return cp.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()


def _succeeded_count(op: ChartOperator, namespace: str) -> float:
    status, text = op.get("metrics", "/metrics")
    assert status == 200, text
    m = re.search(
        rf'^strategyjob_operator_jobs_succeeded_total{{job_namespace="{namespace}"}} (\S+)$',
        text,
        re.M,
    )
    return float(m.group(1)) if m else 0.0


def peering_state(log: str) -> str:
    """What kopf's log says of the peering: "acting" or "paused" (how it starts)."""
    resumed = log.rfind("Resuming operations after the pause")
    paused = log.rfind("Pausing operations in favour of")
    return "acting" if resumed > paused else "paused"


def run_job_lifecycle(cp: AuditedControlPlane, namespace: str, timeout: float = 60.0) -> None:
    """Create -> pods and Service -> pods Succeeded (the test plays the kubelet) -> job
    Succeeded -> the operator deletes the pods (cleanPodPolicy All) and, after its TTL, the
    job (its finalizer removed on the way)."""
    kube = Kube(cp, namespace)
    try:
        kube.create_job(
            manifest(
                "train",
                "MultiWorkerMirroredStrategy",
                {"worker": 2},
                run_policy={"cleanPodPolicy": "All", "ttlSecondsAfterFinished": 1},
            )
        )
        pods = kube.wait_pods("train", 2, timeout=timeout)
        wait_for("service", lambda: kube.core.read_namespaced_service("train", namespace))
        # The leader (worker 0) last: its success ends the job, whose cleanPodPolicy then
        # deletes the other pods, maybe before the test could have written their phase.
        for pod in sorted(pods, reverse=True):
            kube.set_phase(pod, "Succeeded", exit_code=0)
        # Succeeded lasts only the 1 s TTL, too short to poll for; its Event outlives the job.
        kube.wait_events("train", "StrategyJobSucceeded", timeout=timeout)
        wait_for("pods cleaned up", lambda: not kube.pods("train"), timeout=timeout)
        wait_for("job deleted after its TTL", lambda: kube.job("train") is None, timeout=timeout)
        kube.wait_events("train", "StrategyJobCreated", "StrategyJobSucceeded", timeout=timeout)
    finally:
        kube.api_client.close()


@pytest.fixture
def operators() -> Iterator[list[ChartOperator]]:
    """Operator processes a test starts; all stopped at the end, whatever happened."""
    started: list[ChartOperator] = []
    yield started
    for op in started:
        op.stop()


def start_chart_operators(
    cp: AuditedControlPlane,
    helm: Helm,
    release: str,
    namespace: str,
    values: tuple[str, ...],
    count: int,
    tmp_path: Path,
    started: list[ChartOperator],
    watched: str = "default",
) -> list[ChartOperator]:
    """``count`` pods of the release's Deployment as local processes, each with its own ports
    and the release ServiceAccount's token (nothing of the admin's), started once that
    account's RBAC is in effect in (one of) the ``watched`` namespace(s)."""
    account = f"{release}-strategyjob-operator"
    token = service_account_token(cp, namespace, account)
    kubeconfig = cp.write_kubeconfig(tmp_path / "sa-kubeconfig", {"token": token})
    wait_until_authorized(cp, f"system:serviceaccount:{namespace}:{account}", watched)
    for i in range(count):
        ports = (
            "--set",
            f"metrics.port={free_port()}",
            "--set",
            f"operator.livenessPort={free_port()}",
        )
        docs = helm.render(*values, *ports, release=release, namespace=namespace)
        pod_name = f"{release}-operator-{i}"
        op = ChartOperator(
            only(docs, "Deployment"), kubeconfig, tmp_path / f"{pod_name}.log", pod_name
        )
        started.append(op.start())
    for op in started:
        wait_for(
            f"{op.pod_name} liveness endpoint (or its exit)",
            lambda op=op: op.get("healthz", "/healthz")[0] == 200 or not op.running(),
            timeout=60,
        )
        assert op.running(), f"{op.pod_name} exited:\n{op.output()[-3000:]}"
    return started


def refused_calls(cp: AuditedControlPlane, user: str) -> list[tuple[Any, str | None]]:
    return [
        (call_key(e), e["objectRef"].get("namespace"))
        for e in cp.audit_events(user)
        if (e.get("responseStatus") or {}).get("code") == 403
    ]


@contextmanager
def explained(cp: AuditedControlPlane, user: str, ops: list[ChartOperator]) -> Iterator[None]:
    """A failed wait says which calls the API server refused and what the operators logged."""
    try:
        yield
    except AssertionError as e:
        tails = "".join(f"\n--- {op.pod_name}:\n{op.output()[-2000:]}" for op in ops)
        raise AssertionError(f"{e}\nrefused: {refused_calls(cp, user)}{tails}") from e


def assert_no_forbidden(cp: AuditedControlPlane, user: str, ops: list[ChartOperator]) -> set[Any]:
    """No request of ``user`` was refused, nor did an operator log one; returns the calls made."""
    events = cp.audit_events(user)
    assert events, f"no audit events for {user}"
    assert not refused_calls(cp, user), f"the API server refused {refused_calls(cp, user)}"
    for op in ops:
        log = op.output()
        assert not refusals(log), f"{op.pod_name} logged {refusals(log)}:\n{log[-3000:]}"
    return {call_key(e) for e in events}


def assert_made_as_listed(made: set[Any], calls: list[Any]) -> None:
    """Every call made is listed, and every listed call that the run stages was made (not
    the delegated ones, nor those of situations it does not stage, ``Call.only_when``)."""
    listed = {c.key for c in calls if not c.delegated}
    required = {c.key for c in calls if not (c.delegated or c.only_when)}
    assert made <= listed, {"made, not listed": made - listed}
    assert required <= made, {"listed, never made": required - made}


def _rules(cluster: AuditedControlPlane, role: str) -> set[Any]:
    return rule_keys((kubectl_get(cluster, "clusterrole", role) or {})["rules"])


def test_tfjob_enabled_installs_the_crd_and_rights_and_keeps_the_crd_when_turned_off(
    cluster: AuditedControlPlane, cluster_helm: Helm, release: Release
) -> None:
    """tfjob.enabled on the real API server: the TFJob CRD is established and takes Kubeflow's
    example (and refuses a TFJob without a tensorflow container), the operator's ClusterRole and
    env serve TFJobs; turned off by an upgrade, they go and the CRD stays with its TFJobs
    (helm.sh/resource-policy keep), as after the uninstall."""
    ns, name, crd = "tf-system", "tf-strategyjob-operator", "tfjobs.kubeflow.org"
    values = ("--set", "peering.name=tf-peering", "--set", "tfjob.enabled=true")
    cluster_helm.run("install", "tf", str(CHART), "-n", ns, "--create-namespace", *values)
    try:
        cluster.wait_established(crd)
        served = {(x.group, x.resource, x.verb, ()) for x in tfjob_calls()}
        assert served <= _rules(cluster, name)
        deploy = kubectl_get(cluster, "-n", ns, "deployment", name) or {}
        env = deploy["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "STRATEGYJOB_SERVE_TFJOBS", "value": "true"} in env
        jobs = f"tfjobs-{uuid.uuid4().hex[:6]}"
        create_namespaces(cluster, jobs)
        simple = kubeflow_tfjobs.load("example-simple", jobs)
        done = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(simple))
        assert "tfjob.kubeflow.org/tfjob-simple created" in done.stdout
        simple["metadata"]["name"] = "no-tensorflow"
        simple["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = (
            "main"
        )
        refused = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(simple), check=False)
        assert "must have at least one container with name tensorflow" in refused.stderr

        cluster_helm.run(
            "upgrade", "tf", str(CHART), "-n", ns, "--reuse-values", "--set", "tfjob.enabled=false"
        )
        deploy = kubectl_get(cluster, "-n", ns, "deployment", name) or {}
        env = deploy["spec"]["template"]["spec"]["containers"][0]["env"]
        assert "STRATEGYJOB_SERVE_TFJOBS" not in {e["name"] for e in env}
        wait_for("TFJob rules revoked", lambda: not served & _rules(cluster, name))
        assert kubectl_get(cluster, "crd", crd) is not None
        cluster_helm.run("uninstall", "tf", "-n", ns)
        assert kubectl_get(cluster, "crd", crd) is not None
        assert kubectl_get(cluster, "-n", jobs, "tfjob", "tfjob-simple") is not None
    finally:
        cluster_helm.run("uninstall", "tf", "-n", ns, check=False)
        cluster.kubectl("delete", "crd", crd, "--ignore-not-found", "--wait=true")


def test_cluster_wide_operator_runs_a_job_with_only_the_charts_rbac(
    cluster: AuditedControlPlane,
    cluster_helm: Helm,
    release: Release,
    operators: list[ChartOperator],
    tmp_path: Path,
) -> None:
    """Both default replicas, as the chart runs them: they draw distinct priorities, one
    stands by, the other takes a job through its whole life; the ServiceAccount made exactly
    the calls listed in operator_api_calls.py, none refused."""
    ops = start_chart_operators(
        cluster, cluster_helm, release.name, release.namespace, (), 2, tmp_path, operators
    )

    def peers() -> dict[str, Any] | None:
        peering = kubectl_get(cluster, "clusterkopfpeering", "strategyjob-operator") or {}
        status = peering.get("status") or {}
        return status if {op.pod_name for op in ops} <= status.keys() else None

    status = wait_for("both operators in the peering", peers, timeout=60)
    priorities = {op.pod_name: status[op.pod_name]["priority"] for op in ops}
    assert len(set(priorities.values())) == 2, priorities
    leader, standby = sorted(ops, key=lambda op: priorities[op.pod_name], reverse=True)
    # kopf starts paused and resumes once the peering shows no higher priority.
    wait_for(f"{leader.pod_name} acting", lambda: peering_state(leader.output()) == "acting")
    wait_for(f"{standby.pod_name} standing by", lambda: peering_state(standby.output()) == "paused")

    namespace = f"rbac-{uuid.uuid4().hex[:6]}"
    create_namespaces(cluster, namespace)
    with explained(cluster, release.service_account, ops):
        run_job_lifecycle(cluster, namespace)
    assert _succeeded_count(leader, namespace) == 1
    assert _succeeded_count(standby, namespace) == 0

    for op in ops:
        op.stop()
    made = assert_no_forbidden(cluster, release.service_account, ops)
    assert_made_as_listed(made, calls_for("cluster-wide"))


def test_namespaced_operator_runs_a_job_with_only_the_charts_rbac(
    cluster: AuditedControlPlane,
    cluster_helm: Helm,
    release: Release,
    operators: list[ChartOperator],
    tmp_path: Path,
) -> None:
    """Watching two namespaces, the operator needs only their Roles plus the read-only
    discovery rules; everything it writes is inside the watched namespaces."""
    name, ns = "scoped", "scoped-system"
    watched = ("scoped-a", "scoped-b")
    values = ("--set", f"watchNamespaces={{{','.join(watched)}}}", "--set", "replicaCount=1")
    create_namespaces(cluster, *watched)
    cluster_helm.run("install", name, str(CHART), "-n", ns, "--create-namespace", *values)
    try:
        ops = start_chart_operators(
            cluster, cluster_helm, name, ns, values, 1, tmp_path, operators, watched[0]
        )
        user = Release(name, ns, "", frozenset()).service_account
        with explained(cluster, user, ops):
            run_job_lifecycle(cluster, watched[0])
        for op in ops:
            op.stop()
        made = assert_no_forbidden(cluster, user, ops)
        assert_made_as_listed(made, calls_for("namespaced"))
        outside = {
            (call_key(e), e["objectRef"]["namespace"])
            for e in cluster.audit_events(user)
            if e["verb"] not in ("get", "list", "watch")
            and e["objectRef"].get("namespace") not in watched
        }
        assert not outside, f"writes outside the watched namespaces: {outside}"
    finally:
        cluster_helm.run("uninstall", name, "-n", ns, check=False)


def test_release_objects_listed_by_helm_match_the_render(
    cluster_helm: Helm, release: Release
) -> None:
    """helm's record of the release is the chart's render: nothing added or dropped."""
    manifest_out = cluster_helm.run("get", "manifest", release.name, "-n", release.namespace).stdout
    installed = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(manifest_out) if d}
    rendered = {
        (d["kind"], d["metadata"]["name"])
        for d in cluster_helm.render(release=release.name, namespace=release.namespace)
    }
    assert installed == rendered
    assert ("ClusterKopfPeering", "strategyjob-operator") in installed
