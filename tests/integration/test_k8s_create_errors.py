"""What the API server refuses to create, against the real API server: the job's status
says so (the CreateFailed condition with the API server's message) with one Warning Event,
a creation that cannot succeed as it is (422 Invalid) is not retried until the job's spec
changes, one that may (a ResourceQuota's 403) backs off, and a setup error (no PodGroup API
for the configured gang scheduler) reaches the status too, not only the operator's log."""

from __future__ import annotations

import re
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from integration_harness import Kube, OperatorProcess, manifest, wait_for

from tests.support.control_plane import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tests" / "helm"))
from helm_harness import can, chart_account, helm_binary

#: How long the tests watch a refused job for retries and Events that should not come: the
#: operator retried every 5 s before, so this would have seen four attempts.
QUIET_SECONDS = 20.0


def create_failed(kube: Kube, job: str) -> dict | None:
    for condition in (kube.job(job) or {}).get("status", {}).get("conditions") or []:
        if condition["type"] == "CreateFailed":
            return condition
    return None


def events(kube: Kube, job: str, reason: str) -> list[str]:
    return [e.message for e in kube.events(job) if e.reason == reason]


def create_errors(op: OperatorProcess, namespace: str) -> float:
    """The operator's pod_create_errors counter for the namespace: one per refused pod."""
    pattern = (
        rf'^strategyjob_operator_pod_create_errors_total\{{job_namespace="{namespace}"\}} (\S+)$'
    )
    found = re.search(pattern, op.metrics(), re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def wait_create_failed(kube: Kube, job: str, *, cleared: bool = False, timeout: float = 60) -> dict:
    """Wait for ``job``'s CreateFailed condition to be True (``cleared``: False again);
    returns it."""
    want = "False" if cleared else "True"
    return wait_for(
        f"CreateFailed {'cleared' if cleared else 'set'} on {job}",
        lambda: (c := create_failed(kube, job)) and c["status"] == want and c,
        timeout=timeout,
    )


def stays(what: str, predicate, seconds: float = QUIET_SECONDS) -> None:
    """``predicate`` holds at every look for ``seconds`` (nothing that should not happen
    happens meanwhile)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), f"{what} stopped holding"
        time.sleep(0.5)


def invalid_job(name: str) -> dict:
    """A job the CRD and the operator accept, whose pods the API server rejects (422): the
    training container mounts a volume the pod does not have."""
    m = manifest(name, "MultiWorkerMirroredStrategy", {"worker": 2})
    container = m["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    return m


@pytest.mark.timeout(180)
def test_an_invalid_pod_is_reported_once_not_retried_and_recovers_when_the_spec_is_fixed(
    kube, operator
):
    kube.create_job(invalid_job("bad"))
    condition = wait_create_failed(kube, "bad")
    assert condition["reason"] == "FailedCreatePod"
    assert "HTTP 422" in condition["message"], condition
    assert 'volumeMounts[0].name: Not found: "data"' in condition["message"], condition
    assert "when the spec changes" in condition["message"], condition
    kube.wait_events("bad", "FailedCreatePod")
    refused = create_errors(operator, kube.ns)
    assert refused >= 1

    # Passes woken meanwhile (a label change, the periodic resync) do not try again.
    for i in range(3):
        kube.patch_job("bad", {"metadata": {"labels": {"poke": str(i)}}})
    stays(
        "one attempt and one Event",
        lambda: (
            create_errors(operator, kube.ns) == refused
            and len(events(kube, "bad", "FailedCreatePod")) == 1
            and kube.pods("bad") == {}
        ),
    )

    # The fix: a spec change is tried at once, and the job gets its pods.
    volumes = [{"name": "data", "emptyDir": {}}]
    fix = {"spec": {"replicaSpecs": {"worker": {"template": {"spec": {"volumes": volumes}}}}}}
    kube.patch_job("bad", fix)
    kube.wait_pods("bad", 2, timeout=30)
    cleared = wait_create_failed(kube, "bad", cleared=True, timeout=30)
    assert cleared["reason"] == "CreateSucceeded"
    assert len(events(kube, "bad", "FailedCreatePod")) == 1


@pytest.mark.timeout(60)
def test_a_template_value_the_api_server_cannot_decode_is_named_by_its_field(kube, operator):
    """A CPU limit of ``lots``: the CRD admits the job (its pod templates are open), the API
    server refuses each pod with HTTP 400 and only its parser's regular expression; the
    CreateFailed condition names the field in the job's spec and says what to write."""
    m = manifest("lots", "MultiWorkerMirroredStrategy", {"worker": 2})
    container = m["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    container["resources"] = {"limits": {"cpu": "lots", "memory": "1Gi"}}
    kube.create_job(m)
    started = time.monotonic()
    condition = wait_create_failed(kube, "lots", timeout=30)
    assert time.monotonic() - started < 20  # the second attempt, 5 s after the first
    message = condition["message"]
    assert condition["reason"] == "FailedCreatePod"
    field = "spec.replicaSpecs.worker.template.spec.containers[0].resources.limits.cpu"
    assert f'{field}: "lots" is not a quantity' in message, message
    assert "write a number with an optional suffix, e.g. 500m" in message, message
    assert "quantities must match the regular expression" in message, message  # the API's own
    assert "fix the job's spec" in message, message
    assert kube.pods("lots") == {}
    kube.wait_events("lots", "FailedCreatePod")
    assert events(kube, "lots", "FailedCreatePod") == [message]


@pytest.mark.timeout(180)
def test_a_quota_403_is_in_the_status_and_retried_with_backoff(kube, operator):
    from kubernetes import client

    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="no-pods"),
        spec=client.V1ResourceQuotaSpec(hard={"pods": "0"}),
    )
    kube.core.create_namespaced_resource_quota(kube.ns, quota)
    # Play the quota controller (not running here): the usage the admission plugin checks.
    usage = {"status": {"hard": {"pods": "0"}, "used": {"pods": "0"}}}
    kube.core.patch_namespaced_resource_quota_status("no-pods", kube.ns, usage)

    kube.create_job(manifest("quota", "MultiWorkerMirroredStrategy", {"worker": 2}))
    condition = wait_create_failed(kube, "quota")
    assert condition["reason"] == "FailedCreatePod"
    assert "HTTP 403" in condition["message"] and "exceeded quota: no-pods" in condition["message"]
    assert "exponential backoff" in condition["message"], condition
    kube.wait_events("quota", "FailedCreatePod")

    # The quota grows: a later attempt of the backoff creates the pods, with no more Events.
    grown = {"spec": {"hard": {"pods": "10"}}, "status": {"hard": {"pods": "10"}}}
    kube.core.patch_namespaced_resource_quota("no-pods", kube.ns, {"spec": grown["spec"]})
    kube.core.patch_namespaced_resource_quota_status(
        "no-pods", kube.ns, {"status": grown["status"]}
    )
    kube.wait_pods("quota", 2, timeout=90)
    wait_create_failed(kube, "quota", cleared=True, timeout=30)
    assert len(events(kube, "quota", "FailedCreatePod")) == 1


@pytest.mark.timeout(120)
def test_a_setup_error_reaches_the_status_and_one_event(own_kube, control_plane):
    """A gang scheduler configured whose PodGroup API is not installed: the job's objects
    cannot all be created, so no pod is; the status, one Event and the operator's log name
    the missing API."""
    kube = own_kube
    op = OperatorProcess(
        control_plane,
        "--standalone",
        "-n",
        kube.ns,
        env={"STRATEGYJOB_GANG_SCHEDULER": "scheduler-plugins"},
    ).start()
    try:
        kube.create_job(manifest("nogang", "MultiWorkerMirroredStrategy", {"worker": 2}))
        condition = wait_create_failed(kube, "nogang")
        assert condition["reason"] == "FailedCreate", condition
        missing = "no PodGroup API scheduling.x-k8s.io/v1alpha1 in this cluster"
        assert missing in condition["message"], condition
        kube.wait_events("nogang", "FailedCreate")
        (event,) = [e for e in kube.events("nogang") if e.reason == "FailedCreate"]
        assert event.type == "Warning" and event.message == condition["message"]
        assert kube.pods("nogang") == {}  # no pod starts outside the gang
        logged = f"{missing}: install scheduler-plugins"
        wait_for("the missing API named in the operator's log", lambda: logged in op.output())
    finally:
        op.stop()


@pytest.mark.timeout(180)
def test_an_rbac_403_on_setup_is_in_the_status_and_a_spec_change_retries(
    own_kube, control_plane, tmp_path: Path
):
    """The operator holds the chart's RBAC minus the NetworkPolicy rule: the job's setup is
    refused (403), which the status and one Event say, and no pod is created; once the
    rule is granted, a change of the job's spec is tried at once and the job starts."""
    binary, why = helm_binary()
    if binary is None:
        pytest.skip(f"no helm binary: {why}")
    kube, cp = own_kube, control_plane
    system = f"{kube.ns}-system"
    cp.kubectl("create", "namespace", system)
    granted: list[dict] = []

    def withhold_network_policies(rbac: list[dict]) -> None:
        (role,) = [d for d in rbac if d["kind"] == "Role"]
        granted.extend(role["rules"])
        role["rules"] = [r for r in granted if "networkpolicies" not in r.get("resources", [])]

    release = f"refused{uuid.uuid4().hex[:6]}"
    try:
        with chart_account(
            cp,
            binary,
            tmp_path,
            watched=kube.ns,
            system=system,
            release=release,
            edit=withhold_network_policies,
        ) as account:
            env = {"KUBECONFIG": str(account.kubeconfig)}
            op = OperatorProcess(cp, "--standalone", "-n", kube.ns, env=env).start()
            try:
                kube.create_job(manifest("rbac", "MultiWorkerMirroredStrategy", {"worker": 2}))
                condition = wait_create_failed(kube, "rbac")
                assert condition["reason"] == "FailedCreate", condition
                assert "HTTP 403" in condition["message"], condition
                assert "networkpolicies" in condition["message"], condition
                kube.wait_events("rbac", "FailedCreate")
                assert len(events(kube, "rbac", "FailedCreate")) == 1
                assert kube.pods("rbac") == {}

                role = account.only("Role")
                role["rules"] = granted
                cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(role))
                wait_for(
                    "the NetworkPolicy rule in effect",
                    lambda: can(cp, account.user, "create", "networkpolicies", kube.ns),
                )
                note = {"metadata": {"annotations": {"rbac": "granted"}}}
                kube.patch_job("rbac", {"spec": {"replicaSpecs": {"worker": {"template": note}}}})
                kube.wait_pods("rbac", 2, timeout=60)
                wait_create_failed(kube, "rbac", cleared=True)
                assert len(events(kube, "rbac", "FailedCreate")) == 1
            finally:
                op.stop()
    finally:
        cp.kubectl("delete", "namespace", system, "--wait=false", check=False)
