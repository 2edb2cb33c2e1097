"""API errors become one line a person can act on; the CLI prints it without a traceback.

The Status bodies are what kube-apiserver 1.36 answered (captured from the local control
plane), so the wording follows the real server's shapes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from strategyjob.client import describe_api_error
from strategyjob.client._errors import describe_connection_error, to_cluster_error
from strategyjob.errors import ClusterError, JobNotFoundError

REPO = Path(__file__).resolve().parents[3]
NS = "team-a"


def status(code, reason, message, **details):
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message,
            "reason": reason,
            "details": details,
            "code": code,
        }
    )


CEL_PS = (
    "spec.replicaSpecs.ps: MultiWorkerMirroredStrategy takes no ps replicas. "
    "Remove spec.replicaSpecs.ps, or use ParameterServerStrategy."
)


def describe(code, body, action="create", kind="StrategyJob", name="a"):
    return describe_api_error(code, body, action=action, kind=kind, name=name, namespace=NS)


@pytest.mark.parametrize("prefix", ["Invalid value: ", 'Invalid value: "object": '])
def test_cel_rejection_shows_the_rules_message_once(prefix):
    body = status(
        422,
        "Invalid",
        f'StrategyJob.strategyjob.dev "a" is invalid: spec: {prefix}{CEL_PS}',
        name="a",
        kind="StrategyJob",
        causes=[{"reason": "FieldValueInvalid", "message": prefix + CEL_PS, "field": "spec"}],
    )
    message, reason = describe(422, body)
    assert message == f"the API server rejected StrategyJob a: {CEL_PS}"
    assert reason == "Invalid"


def test_several_causes_join_on_one_line_without_the_skipped_rules_note():
    body = status(
        422,
        "Invalid",
        "...",
        causes=[
            {
                "reason": "FieldValueNotSupported",
                "message": 'Unsupported value: "Foo": supported values: "MirroredStrategy"',
                "field": "spec.strategy",
            },
            {
                "reason": "FieldValueInvalid",
                "message": "Invalid value: null: some validation rules were not checked "
                "because the object was invalid; correct the existing errors",
                "field": "<nil>",
            },
            {
                "reason": "FieldValueInvalid",
                "message": "Invalid value: spec.replicaSpecs.chief: ParameterServerStrategy "
                "needs one chief,\n   the coordinator (got 0).",
                "field": "spec",
            },
        ],
    )
    message, _ = describe(422, body)
    assert message == (
        "the API server rejected StrategyJob a: spec.strategy: Unsupported value: "
        '"Foo": supported values: "MirroredStrategy"; spec.replicaSpecs.chief: '
        "ParameterServerStrategy needs one chief, the coordinator (got 0)."
    )
    assert "\n" not in message


@pytest.mark.parametrize(
    ("body", "kind", "name", "expected"),
    [
        (
            status(404, "NotFound", 'strategyjobs.strategyjob.dev "a" not found', name="a"),
            "StrategyJob",
            "a",
            f"StrategyJob a not found in namespace {NS}.",
        ),
        (
            status(404, "NotFound", 'pods "a-worker-3" not found', name="a-worker-3"),
            "pod",
            "a-worker-3",
            f"pod a-worker-3 not found in namespace {NS}.",
        ),
        (
            status(404, "NotFound", 'namespaces "nons" not found', name="nons", kind="namespaces"),
            "StrategyJob",
            "a",
            "namespace nons not found.",
        ),
    ],
)
def test_not_found_names_what_is_missing(body, kind, name, expected):
    assert describe(404, body, kind=kind, name=name) == (expected, "NotFound")


def test_missing_crd_says_how_to_install_it():
    message, _ = describe(404, "404 page not found\n", action="list", name=None)
    assert message.startswith("the API server does not serve StrategyJobs (404 page not found)")
    assert message.endswith("kubectl apply -f crds/")


def test_missing_tfjob_crd_says_to_enable_tfjobs_or_convert():
    # `strategyjob submit tfjob.yaml` on a cluster without the TFJob CRD.
    message, reason = describe(404, "404 page not found\n", kind="TFJob", name="mnist")
    assert (message, reason) == (
        "the API server does not serve TFJobs (404 page not found). Install the StrategyJob "
        "chart with --set tfjob.enabled=true to run TFJobs as they are, or convert it to a "
        "StrategyJob: strategyjob convert FILE -o job.yaml",
        "NotFound",
    )
    forbidden, _ = describe(403, status(403, "Forbidden", "no"), kind="TFJob", name="mnist")
    assert "RBAC on tfjobs.kubeflow.org (and pods)" in forbidden


def test_conflict_forbidden_and_unauthorized():
    exists = status(409, "AlreadyExists", 'strategyjobs.strategyjob.dev "a" already exists')
    assert describe(409, exists)[0].startswith(
        f"StrategyJob a already exists in namespace {NS}. Delete it first (strategyjob delete a)"
    )
    forbidden = status(
        403,
        "Forbidden",
        'strategyjobs.strategyjob.dev is forbidden: User "bob" cannot list resource '
        f'"strategyjobs" in API group "strategyjob.dev" in the namespace "{NS}"',
    )
    message, reason = describe(403, forbidden, action="list", name=None)
    assert message.startswith("permission denied: strategyjobs.strategyjob.dev is forbidden: User")
    assert reason == "Forbidden"
    assert describe(401, status(401, "Unauthorized", "Unauthorized"))[0].startswith(
        "unauthorized: the API server rejected the credentials"
    )


def test_unknown_status_keeps_the_servers_words():
    body = status(500, "InternalError", "etcd is\nunhappy")
    message, reason = describe(500, body, action="delete")
    assert message == (
        f"cannot delete StrategyJob a in namespace {NS}: the API server answered 500 "
        "InternalError: etcd is unhappy"
    )
    assert reason == "InternalError"


class FakeApiException(Exception):
    def __init__(self, status, body):
        super().__init__(f"({status})")
        self.status = status
        self.body = body


def test_to_cluster_error_picks_the_class_from_the_status():
    not_found = to_cluster_error(
        FakeApiException(404, status(404, "NotFound", "x", name="a")),
        server="https://h:1",
        action="get",
        kind="StrategyJob",
        name="a",
        namespace=NS,
    )
    assert isinstance(not_found, JobNotFoundError) and not_found.status == 404
    refused = to_cluster_error(
        ConnectionRefusedError(111, "Connection refused"),
        server="https://h:1",
        action="get",
        kind="StrategyJob",
        name="a",
        namespace=NS,
    )
    assert type(refused) is ClusterError and refused.reason == "Unreachable"
    assert str(refused).startswith("cannot reach the Kubernetes API server at https://h:1: ")


def test_connection_errors_are_named_plainly():
    assert "connection refused" in describe_connection_error(
        "https://h:1", ConnectionRefusedError(111, "Connection refused")
    )
    assert "timed out" in describe_connection_error("https://h:1", TimeoutError("timed out"))


# --- the CLI, against no cluster at all ------------------------------------------------------


def run_cli(*args, env=None, input=None):
    return subprocess.run(
        [sys.executable, "-m", "strategyjob", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        input=input,
        cwd=REPO,
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_cli_unreachable_cluster_is_one_line_and_exit_1(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: c\n  cluster: {{server: 'https://127.0.0.1:{closed_port()}', "
        "insecure-skip-tls-verify: true}\n"
        "users:\n- name: u\n  user: {token: t}\n"
        "contexts:\n- name: x\n  context: {cluster: c, user: u, namespace: ml}\n"
        "current-context: x\n"
    )
    proc = run_cli("list", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("strategyjob list: error: cannot reach the Kubernetes API server")
    assert "connection refused" in lines[0]


def test_cli_missing_kubeconfig_is_one_line_and_exit_1(tmp_path):
    proc = run_cli("status", "mnist", "--kubeconfig", str(tmp_path / "nope"))
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"strategyjob status: error: kubeconfig {tmp_path / 'nope'}: no such file. "
        "Pass the path of a kubeconfig."
    )


def _env_without_kubeconfig(home) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "HOME")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return {**env, "HOME": str(home)}


def test_cli_without_any_kubeconfig_says_it_is_missing(tmp_path):
    """Neither --kubeconfig, KUBECONFIG nor ~/.kube/config: the Kubernetes client's own words
    were "Invalid kube-config file. No configuration found.", for a file that is not there."""
    proc = run_cli("list", env=_env_without_kubeconfig(tmp_path))
    assert proc.returncode == 1
    assert proc.stderr == (
        "strategyjob list: error: no kubeconfig: ~/.kube/config does not exist and KUBECONFIG "
        "is not set. Pass --kubeconfig, set KUBECONFIG, or write the cluster's kubeconfig to "
        "~/.kube/config (kind create cluster does).\n"
    )


def test_cli_with_a_kubeconfig_variable_naming_no_file_says_so(tmp_path):
    missing = f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}"
    proc = run_cli("list", env={**_env_without_kubeconfig(tmp_path), "KUBECONFIG": missing})
    assert proc.returncode == 1
    assert proc.stderr == (
        f"strategyjob list: error: kubeconfig {missing} (from $KUBECONFIG): no such file. Set "
        "KUBECONFIG to the path of a kubeconfig, or pass --kubeconfig.\n"
    )


def test_cli_usage_errors_exit_2(tmp_path):
    assert run_cli("status").returncode == 2  # NAME missing: argparse
    proc = run_cli("submit", str(tmp_path / "missing.yaml"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"strategyjob submit: error: {tmp_path / 'missing.yaml'}: no such file. "
        "Check the path of the StrategyJob manifest."
    )
    bad = run_cli("submit", "-", input="a: [\n")
    assert bad.returncode == 2
    assert bad.stderr.startswith("strategyjob submit: error: stdin: invalid YAML at line 2")


# --- finding the cluster ----------------------------------------------------------------------


@pytest.fixture
def in_a_pod(monkeypatch, tmp_path):
    """No kubeconfig anywhere, and the service environment variables of a pod."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    return tmp_path


def test_in_a_pod_the_service_account_and_its_namespace_are_used(in_a_pod, monkeypatch):
    import kubernetes
    from strategyjob.client import StrategyJobClient, _client

    def load_incluster_config(client_configuration):
        client_configuration.host = "https://10.0.0.1:443"

    monkeypatch.setattr(kubernetes.config, "load_incluster_config", load_incluster_config)
    namespace_file = in_a_pod / "namespace"
    namespace_file.write_text("team-x\n")
    monkeypatch.setattr(_client, "_SERVICE_ACCOUNT_NAMESPACE", namespace_file)
    with StrategyJobClient() as client:
        assert (client.server, client.namespace) == ("https://10.0.0.1:443", "team-x")
    with StrategyJobClient(namespace="other") as client:
        assert client.namespace == "other"


def test_in_a_pod_without_a_token_the_error_says_so(in_a_pod):
    from strategyjob.client import StrategyJobClient

    with pytest.raises(ClusterError, match=r"^cannot use the pod's service account: "):
        StrategyJobClient()


def test_the_kubeconfig_context_namespace_is_the_default(tmp_path):
    from strategyjob.client import StrategyJobClient

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:6443'}\n"
        "users:\n- name: u\n  user: {token: t}\n"
        "contexts:\n- name: a\n  context: {cluster: c, user: u, namespace: ns-a}\n"
        "- name: b\n  context: {cluster: c, user: u}\n"
        "current-context: a\n"
    )
    with StrategyJobClient(kubeconfig=kubeconfig) as client:
        assert (client.server, client.namespace) == ("https://127.0.0.1:6443", "ns-a")
    with StrategyJobClient(kubeconfig=kubeconfig, context="b") as client:
        assert client.namespace == "default"


def test_a_refused_exec_upgrade_is_the_api_servers_answer_not_an_unreachable_server():
    """An exec (``strategyjob tensorboard NAME``) goes over a websocket: the kubernetes client
    reports the API server's refusal as status 0 with the answer folded into its reason."""
    from kubernetes.client.exceptions import ApiException

    body = (
        '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":'
        '"pod j-worker-0 does not have a host assigned","reason":"BadRequest","code":400}'
    )
    error = ApiException(
        status=0, reason=f"Handshake status 400 Bad Request -+-+- {{'audit-id': 'x'}} -+-+- {body}"
    )
    got = to_cluster_error(
        error, server="https://k", action="run tar in", kind="pod", name="j-worker-0", namespace="n"
    )
    assert str(got) == (
        "cannot run tar in pod j-worker-0: pod j-worker-0 does not have a host assigned"
    )
    assert (got.status, got.reason) == (400, "BadRequest")
    lost = to_cluster_error(
        ApiException(status=0, reason="Connection refused"),
        server="https://k", action="run tar in", kind="pod", name="j-worker-0", namespace="n",
    )  # fmt: skip
    assert lost.reason == "Unreachable"
