"""The operator against what real clusters have and the shared control plane lacks: kubeconfigs
that authenticate with client certificates given inline (kind, k3d, kubeadm), as files, or from
an exec plugin (GKE, EKS, AKS); the OwnerReferencesPermissionEnforcement admission plugin
(OpenShift) with only the chart's RBAC; names of the job's children taken by objects the job
does not control. One control plane for the module, with a client CA and that plugin."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from integration_harness import Kube, OperatorProcess, manifest, wait_for

from tests.support.certs import client_certificate, self_signed_ca
from tests.support.control_plane import REPO_ROOT, ControlPlane, find_binaries
from tests.support.operator_logs import refusals

sys.path.insert(0, str(REPO_ROOT / "tests" / "helm"))
from helm_harness import chart_account, helm_binary

pytestmark = pytest.mark.timeout(180)

CLIENT_USER = "kind-admin"
ADMISSION = "--enable-admission-plugins=OwnerReferencesPermissionEnforcement"
#: What kube-apiserver's OwnerReferencesPermissionEnforcement answers without the grant.
REFUSED = "cannot set blockOwnerDeletion"
REPLICA_FAILURE = "ReplicaFailure"
NOT_CONTROLLED = "ObjectNotControlled"


@dataclass(frozen=True)
class Pki:
    """A client CA the API server trusts, and a certificate it signed for ``kind-admin`` in
    the group ``system:masters`` (what kind writes into its kubeconfig)."""

    ca: Path
    cert: Path
    key: Path


def _make_pki(directory: Path) -> Pki:
    # RSA keys, the client key written "BEGIN RSA PRIVATE KEY", as kind and kubeadm do.
    ca = self_signed_ca("strategyjob-test-client-ca", key_type="rsa", hours=2)
    cert, key = client_certificate(
        ca, CLIENT_USER, organizations=["system:masters"], key_type="rsa", hours=2
    )
    pki = Pki(directory / "client-ca.crt", directory / "client.crt", directory / "client.key")
    pki.ca.write_text(ca[0])
    pki.cert.write_text(cert)
    pki.key.write_text(key)
    pki.key.chmod(0o600)
    return pki


@dataclass
class Cluster:
    cp: ControlPlane
    pki: Pki
    dir: Path

    def kubeconfig(self, form: str, token_file: Path | None = None) -> Path:
        """A kubeconfig of the given ``form``: ``inline`` (kind's: base64 data for the CA,
        the client certificate and key), ``files`` (kubeadm's with paths), or ``exec`` (a
        credential plugin printing the token in ``token_file``, as GKE's and EKS's do)."""
        cluster: dict[str, Any] = {"server": self.cp.server}
        if form == "files":
            cluster["certificate-authority"] = str(self.cp.ca_path)
            user: dict[str, Any] = {
                "client-certificate": str(self.pki.cert),
                "client-key": str(self.pki.key),
            }
        else:
            cluster["certificate-authority-data"] = _b64(self.cp.ca_path)
            user = {
                "client-certificate-data": _b64(self.pki.cert),
                "client-key-data": _b64(self.pki.key),
            }
        if form == "exec":
            assert token_file is not None
            script = (
                "import json, sys; print(json.dumps({'apiVersion': "
                "'client.authentication.k8s.io/v1beta1', 'kind': 'ExecCredential', "
                "'status': {'token': open(sys.argv[1]).read().strip()}}))"
            )
            user = {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1beta1",
                    "command": sys.executable,
                    "args": ["-c", script, str(token_file)],
                    "interactiveMode": "Never",
                }
            }
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kind-test", "cluster": cluster}],
            "users": [{"name": "kind-test", "user": user}],
            "contexts": [
                {"name": "kind-test", "context": {"cluster": "kind-test", "user": "kind-test"}}
            ],
            "current-context": "kind-test",
        }
        path = self.dir / f"kubeconfig-{form}-{uuid.uuid4().hex[:6]}"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    bin_dir, why = find_binaries()
    if bin_dir is None:
        pytest.skip(f"no Kubernetes control plane binaries: {why}")
    directory = tmp_path_factory.mktemp("real-clusters")
    pki = _make_pki(directory)
    cp = ControlPlane(bin_dir, apiserver_args=(f"--client-ca-file={pki.ca}", ADMISSION)).start()
    try:
        cp.kubectl("apply", "-f", str(REPO_ROOT / "crds"))
        cp.wait_established("strategyjobs.strategyjob.dev", "clusterkopfpeerings.kopf.dev")
        yield Cluster(cp, pki, directory)
    finally:
        cp.stop()


def _namespace(cluster: Cluster, prefix: str) -> Iterator[Kube]:
    from kubernetes import client

    k = Kube(cluster.cp, f"{prefix}{uuid.uuid4().hex[:8]}")
    k.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=k.ns)))
    try:
        yield k
    finally:
        k.core.delete_namespace(k.ns)
        k.api_client.close()


@pytest.fixture(scope="module")
def kind_namespace(cluster: Cluster) -> Iterator[Kube]:
    """The namespace the kind-kubeconfig operator watches, made before it starts: kopf 1.45
    misses a namespace created between its first namespace listing and the watch that follows
    (that watch's own listing is ignored), so one created at its startup would never be
    watched. The tests' jobs have distinct names and share it."""
    yield from _namespace(cluster, "kind-")


@pytest.fixture(scope="module")
def kind_operator(cluster: Cluster, kind_namespace: Kube) -> Iterator[OperatorProcess]:
    """The operator as ``python -m strategyjob_operator`` runs on a laptop against kind: its
    kubeconfig has the CA, client certificate and key inline, base64-encoded."""
    kubeconfig = cluster.kubeconfig("inline")
    op = OperatorProcess(
        cluster.cp, "--standalone", "-n", "kind-*", env={"KUBECONFIG": str(kubeconfig)}
    ).start()
    try:
        wait_for("the operator's metrics endpoint (its startup done)", lambda: _serving(op), 90)
        yield op
    finally:
        op.stop()


def _serving(op: OperatorProcess) -> bool:
    assert op.proc is not None and op.proc.poll() is None, op.output()[-3000:]
    try:
        return "strategyjob" in op.metrics()
    except OSError:
        return False


@pytest.fixture
def kube(kind_namespace: Kube, kind_operator: OperatorProcess) -> Kube:
    """The namespace the kind-kubeconfig operator watches, with the operator running."""
    return kind_namespace


def _api_calls(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, Any]:
    """Log in as the operator does (cluster_login.connection_info, Credentials.from_kopf) and make
    two calls with its client: who am I, and a read."""
    import kopf
    import kubernetes.config.kube_config
    from strategyjob_operator import cluster_login
    from strategyjob_operator.kube import Credentials, KubeApi

    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    # the client library reads $KUBECONFIG once, when first imported
    monkeypatch.setattr(
        kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig)
    )
    kwargs = {"settings": kopf.OperatorSettings(), "logger": logging.getLogger("test")}
    info = cluster_login.connection_info(**kwargs)
    assert info is not None
    creds = Credentials.from_kopf(info)

    async def calls() -> tuple[dict[str, Any], dict[str, Any] | None, KubeApi]:
        api = KubeApi(creds)
        try:
            review = await api.request(
                "POST",
                "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            )
            namespace = await api.get("/api/v1/namespaces/default")
            return review, namespace, api
        finally:
            await api.close()

    review, namespace, api = asyncio.run(calls())
    return review["status"]["userInfo"], namespace, api


@pytest.mark.parametrize("form", ["inline", "files"])
def test_the_operators_client_authenticates_with_a_client_certificate(
    cluster: Cluster, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kind's kubeconfig (everything inline, base64) and kubeadm's (files): the API server
    knows the operator's client as the certificate's user."""
    user, namespace, api = _api_calls(cluster.kubeconfig(form), monkeypatch)
    assert user["username"] == CLIENT_USER
    assert "system:masters" in user["groups"]
    assert namespace is not None and namespace["metadata"]["name"] == "default"
    if form == "inline":
        assert api.creds.certificate_data and api.creds.certificate_data.startswith("-----BEGIN")
        assert api.creds.ca_data and api.creds.ca_data.startswith("-----BEGIN")


def test_an_exec_plugins_token_is_used_and_fetched_again_when_refused(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exec credential plugin (GKE's, EKS's): its token authenticates; once the API server
    refuses the token the client had (it expired), the client runs the plugin again."""
    token_file = cluster.dir / f"token-{uuid.uuid4().hex[:6]}"
    token_file.write_text(cluster.cp.token)
    kubeconfig = cluster.kubeconfig("exec", token_file)
    user, namespace, _ = _api_calls(kubeconfig, monkeypatch)
    assert user["username"] == "admin"  # the token's user (control_plane.TOKEN), no certificate
    assert namespace is not None

    import kopf
    from strategyjob_operator import cluster_login
    from strategyjob_operator.kube import KubeApi

    kwargs = {"settings": kopf.OperatorSettings(), "logger": logging.getLogger("test")}
    token_file.write_text("expired-token")
    stale = cluster_login.credentials(kwargs)
    token_file.write_text(cluster.cp.token)
    assert stale is not None and stale.token == "expired-token"

    async def call() -> dict[str, Any] | None:
        api = KubeApi(stale, refresh=lambda: asyncio.to_thread(cluster_login.credentials, kwargs))
        try:
            return await api.get("/api/v1/namespaces/default")
        finally:
            await api.close()

    assert asyncio.run(call()) is not None


@pytest.mark.timeout(120)
def test_the_operator_runs_a_job_with_a_kind_kubeconfig(
    kube: Kube, kind_operator: OperatorProcess
) -> None:
    """``python -m strategyjob_operator`` with kind's kubeconfig reconciles: pods, Service."""
    kube.create_job(manifest("kind", "MultiWorkerMirroredStrategy", {"worker": 2}))
    try:
        kube.wait_pods("kind", 2, timeout=60)
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- operator:\n{kind_operator.output()[-3000:]}") from e
    assert kube.core.read_namespaced_service("kind", kube.ns).spec.cluster_ip == "None"
    log = kind_operator.output()
    assert "cadata" not in log and "not supported" not in log, log[-3000:]


def _condition(kube: Kube, name: str, type_: str) -> dict[str, Any] | None:
    job = kube.job(name) or {}
    return next(
        (c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == type_),
        None,
    )


@pytest.mark.timeout(150)
def test_an_orphaned_pod_holding_a_replicas_name_is_reported_until_it_goes(
    kube: Kube, cluster: Cluster
) -> None:
    """A job deleted with ``--cascade=orphan`` leaves its pods, uncontrolled, under the same
    names; a new job of that name says which pod blocks it (condition and one Event), and
    creates its own once that pod is deleted."""
    kube.create_job(manifest("orphan", "MultiWorkerMirroredStrategy", {"worker": 2}))
    kube.wait_pods("orphan", 2)
    cluster.cp.kubectl(
        "delete", "strategyjob", "orphan", "-n", kube.ns, "--cascade=orphan", "--timeout=60s"
    )
    wait_for(
        "the orphaned pods without an owner",
        lambda: (
            all(not p.metadata.owner_references for p in kube.pods("orphan").values())
            and kube.job("orphan") is None
        ),
        timeout=60,
    )
    job = kube.create_job(manifest("orphan", "MultiWorkerMirroredStrategy", {"worker": 2}))
    ns, label = kube.ns, "strategyjob.dev/job-name=orphan"
    # First the job's own objects (the orphaned Service, ServiceAccount, ...) are in the way.
    first = wait_for(
        "the ReplicaFailure condition", lambda: _condition(kube, "orphan", REPLICA_FAILURE)
    )
    assert first["status"] == "True" and first["reason"] == NOT_CONTROLLED
    # Service, ServiceAccount, Role, RoleBinding, NetworkPolicy, the cluster ConfigMap: the
    # token Secret's name holds the job's uid, so the new job's never meets the old one's.
    assert first["message"].startswith("6 objects have names StrategyJob orphan needs"), first
    assert f"Service {ns}/orphan (no controller)" in first["message"]
    assert "--cascade=orphan" in first["message"] and label in first["message"]
    kube.wait_events("orphan", NOT_CONTROLLED)
    assert set(kube.pods("orphan")) == {"orphan-worker-0", "orphan-worker-1"}  # the old ones
    objects = "services,serviceaccounts,roles,rolebindings,secrets,networkpolicies,configmaps"
    cluster.cp.kubectl("delete", objects, "-n", ns, "-l", label, "--wait=true")

    # Then the orphaned pods: the job creates its own objects, and names the pods.
    def pods_named() -> dict[str, Any] | None:
        cond = _condition(kube, "orphan", REPLICA_FAILURE)
        return cond if cond and "Pod " in cond["message"] else None

    second = wait_for("the condition naming the pods", pods_named, timeout=60)
    assert second["message"].startswith(
        f"2 objects have names StrategyJob orphan needs and are not controlled by it: "
        f"Pod {ns}/orphan-worker-0 (no controller), Pod {ns}/orphan-worker-1 (no controller)."
    ), second
    uid = job["metadata"]["uid"]
    service = kube.core.read_namespaced_service("orphan", ns)
    assert service.metadata.owner_references[0].uid == uid

    # A pass patches the status before it posts the pass's Events: wait for the Event too.
    def both_events() -> list[Any] | None:
        events = [e for e in kube.events("orphan") if e.reason == NOT_CONTROLLED]
        said = {e.message for e in events}
        return events if {first["message"], second["message"]} <= said else None

    # and one for any pass between the two, while kubectl deleted the objects kind by kind
    events = wait_for("the Events of both conditions", both_events, timeout=30)
    assert all(e.type == "Warning" for e in events)

    for pod in kube.pods("orphan"):
        kube.core.delete_namespaced_pod(pod, ns, grace_period_seconds=0)

    def own_pods() -> bool:
        pods = kube.pods("orphan").values()
        refs = [p.metadata.owner_references or [] for p in pods]
        return len(refs) == 2 and all(r and r[0].uid == uid for r in refs)

    wait_for("the new job's own pods", own_pods, timeout=60)
    wait_for("the condition gone", lambda: _condition(kube, "orphan", REPLICA_FAILURE) is None)
    # One Event per change of what blocks the job (a pod deleted before the other is one),
    # never the same one again on every pass.
    messages = [e.message for e in kube.events("orphan") if e.reason == NOT_CONTROLLED]
    assert len(messages) == len(set(messages)) <= 3, messages


@pytest.mark.timeout(150)
def test_a_service_with_the_jobs_name_blocks_its_pods_and_is_named(kube: Kube) -> None:
    """Someone else's Service under the job's name: the job's pods would get no DNS names, so
    none is created; the condition and an Event name the Service; once it is deleted the job
    gets its own and its pods."""
    from kubernetes import client

    kube.core.create_namespaced_service(
        kube.ns,
        client.V1Service(
            metadata=client.V1ObjectMeta(name="svc"),
            spec=client.V1ServiceSpec(
                selector={"app": "other"}, ports=[client.V1ServicePort(port=80)]
            ),
        ),
    )
    job = kube.create_job(manifest("svc", "MultiWorkerMirroredStrategy", {"worker": 1}))
    blocked = wait_for(
        "the ReplicaFailure condition", lambda: _condition(kube, "svc", REPLICA_FAILURE)
    )
    assert blocked["message"] == (
        f"Service {kube.ns}/svc (no controller) has a name StrategyJob svc needs and is not "
        "controlled by it: delete it, or give the job another name."
    ), blocked
    kube.wait_events("svc", NOT_CONTROLLED)
    assert kube.pods("svc") == {}

    kube.core.delete_namespaced_service("svc", kube.ns)
    kube.wait_pods("svc", 1, timeout=60)
    service = kube.core.read_namespaced_service("svc", kube.ns)
    assert service.metadata.owner_references[0].uid == job["metadata"]["uid"]
    assert service.spec.cluster_ip == "None"
    wait_for("the condition gone", lambda: _condition(kube, "svc", REPLICA_FAILURE) is None)


@pytest.mark.timeout(180)
def test_the_charts_rbac_creates_children_under_owner_reference_enforcement(
    cluster: Cluster, tmp_path: Path
) -> None:
    """With OwnerReferencesPermissionEnforcement (OpenShift), a child whose owner reference
    sets blockOwnerDeletion needs ``update`` on ``strategyjobs/finalizers``: the operator,
    holding only the chart's RBAC, creates a job's Service, objects and pods."""
    binary, why = helm_binary()
    if binary is None:
        pytest.skip(f"no helm binary: {why}")
    cp = cluster.cp
    suffix = uuid.uuid4().hex[:6]
    watched, system = f"owner-{suffix}", f"owner-system-{suffix}"
    cp.kubectl("create", "namespace", watched)
    cp.kubectl("create", "namespace", system)
    try:
        with chart_account(
            cp, binary, tmp_path, watched=watched, system=system, release=f"own{suffix}"
        ) as account:
            _owner_references_enforced(cp, watched, account.kubeconfig)
    finally:
        cp.kubectl("delete", "namespace", watched, system, "--wait=false", check=False)


def _owner_references_enforced(cp: ControlPlane, watched: str, kubeconfig: Path) -> None:
    """The operator with ``kubeconfig`` creates a job's children with blockOwnerDeletion, and
    an account without ``strategyjobs/finalizers`` cannot."""
    op = OperatorProcess(cp, "--standalone", "-n", watched, env={"KUBECONFIG": str(kubeconfig)})
    kube = Kube(cp, watched)
    try:
        op.start()
        job = kube.create_job(manifest("owned", "MultiWorkerMirroredStrategy", {"worker": 2}))
        try:
            kube.wait_pods("owned", 2, timeout=90)
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- operator:\n{op.output()[-3000:]}") from e
        service = kube.core.read_namespaced_service("owned", watched)
        for obj in (service, *kube.pods("owned").values()):
            (ref,) = obj.metadata.owner_references
            assert ref.uid == job["metadata"]["uid"] and ref.block_owner_deletion
        assert not refusals(op.output()), op.output()[-3000:]

        # The plugin is on: without the grant, the same owner reference is refused.
        cp.kubectl("create", "serviceaccount", "no-finalizers", "-n", watched)
        cp.kubectl("create", "role", "pods-only", "--verb=create", "--resource=pods", "-n", watched)
        cp.kubectl(
            "create",
            "rolebinding",
            "pods-only",
            "--role=pods-only",
            f"--serviceaccount={watched}:no-finalizers",
            "-n",
            watched,
        )
        (ref,) = job_owner_refs(kube, "owned")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "control", "namespace": watched, "ownerReferences": [ref]},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
        refused = cp.kubectl(
            "create",
            f"--as=system:serviceaccount:{watched}:no-finalizers",
            "-f",
            "-",
            input=json.dumps(pod),
            check=False,
        )
        assert refused.returncode != 0 and REFUSED in refused.stderr, refused.stderr
    finally:
        op.stop()
        kube.api_client.close()


def job_owner_refs(kube: Kube, name: str) -> list[dict[str, Any]]:
    """The owner reference the operator puts on the job's children, as a manifest's dict."""
    job = kube.job(name)
    assert job is not None
    meta = job["metadata"]
    return [
        {
            "apiVersion": "strategyjob.dev/v1alpha1",
            "kind": "StrategyJob",
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
