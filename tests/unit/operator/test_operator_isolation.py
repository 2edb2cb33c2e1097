"""Isolation between jobs in one namespace, in the pure code: a template may not name another
job's token Secret or the ServiceAccount the operator made for another job (refused by the
loader, so the operator fails the job instead of creating its pods); pods get a restricted
securityContext wherever the template leaves a field unset; the NetworkPolicy admits only
pods that carry the job's uid too."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from strategyjob import jobspec
from strategyjob_operator import children
from strategyjob_operator import constants as c
from strategyjob_operator.kube import KubeApi
from strategyjob_operator.metrics import Registry
from strategyjob_operator.reconcile import Reconciler

OWNER = children.owner_reference({"metadata": {"name": "mine", "uid": "uid-of-mine"}})
TOKEN_OF_OTHER = "other-strategyjob-token"


def manifest(pod_spec: dict[str, Any], name: str = "mine", annotations=None) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": pod_spec}
    if annotations:
        template["metadata"] = {"annotations": annotations}
    return {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": name, "namespace": "ns", "uid": "uid-of-mine", "generation": 1},
        "spec": {
            "strategy": "MultiWorkerMirroredStrategy",
            "replicaSpecs": {"worker": {"replicas": 2, "template": template}},
        },
    }


def container(**fields: Any) -> dict[str, Any]:
    return {"name": "strategyjob", "image": "x", **fields}


def key_ref(secret: str) -> dict[str, Any]:
    return {"name": "T", "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}}}


SPEC = "spec.replicaSpecs.worker.template.spec"
REFERENCES = [
    (
        {"containers": [container(env=[key_ref(TOKEN_OF_OTHER)])]},
        "containers[0].env[0].valueFrom.secretKeyRef.name",
    ),
    (
        {"containers": [container(envFrom=[{"secretRef": {"name": TOKEN_OF_OTHER}}])]},
        "containers[0].envFrom[0].secretRef.name",
    ),
    (
        {
            "containers": [container()],
            "initContainers": [container(name="init", env=[key_ref(TOKEN_OF_OTHER)])],
        },
        "initContainers[0].env[0].valueFrom.secretKeyRef.name",
    ),
    (
        {
            "containers": [container()],
            "volumes": [{"name": "t", "secret": {"secretName": TOKEN_OF_OTHER}}],
        },
        "volumes[0].secret.secretName",
    ),
    (
        {
            "containers": [container()],
            "volumes": [
                {"name": "t", "projected": {"sources": [{"secret": {"name": TOKEN_OF_OTHER}}]}}
            ],
        },
        "volumes[0].projected.sources[0].secret.name",
    ),
]


@pytest.mark.parametrize(("pod_spec", "field"), REFERENCES, ids=[f for _, f in REFERENCES])
def test_the_loader_refuses_another_jobs_token_with_one_line_naming_the_field(pod_spec, field):
    with pytest.raises(jobspec.ManifestError) as caught:
        jobspec.load_manifest(manifest(pod_spec))
    assert caught.value.problems == [
        f'{SPEC}.{field}: names "{TOKEN_OF_OTHER}", the token Secret of another StrategyJob; '
        "a job's pods get only their own token (the operator injects it as STRATEGYJOB_TOKEN). "
        "Remove the reference, or use a Secret whose name does not end in -strategyjob-token."
    ]


def test_the_jobs_own_token_and_users_secrets_are_accepted():
    env = [
        key_ref(jobspec.token_secret_name("mine", "uid-of-mine")),
        key_ref("hf-token"),  # a user's Secret: not a job's token
        key_ref("other-token"),  # the name an older operator gave job "other"'s token
    ]
    volumes = [{"name": "creds", "secret": {"secretName": "wandb-token"}}]
    job = jobspec.load_manifest(manifest({"containers": [container(env=env)], "volumes": volumes}))
    assert job.name == "mine"


def test_every_reference_is_reported_once():
    pod_spec = {
        "containers": [container(env=[key_ref("a-strategyjob-token")])],
        "volumes": [{"name": "t", "secret": {"secretName": "b-strategyjob-token"}}],
    }
    with pytest.raises(jobspec.ManifestError) as caught:
        jobspec.load_manifest(manifest(pod_spec))
    assert len(caught.value.problems) == 2
    assert all(p.count("\n") == 0 for p in caught.value.problems)


# --- ServiceAccounts ------------------------------------------------------------------------

SA_OF_OTHER = "other-strategyjob-sa"


@pytest.mark.parametrize("field", ["serviceAccountName", "serviceAccount"])
def test_the_loader_refuses_another_jobs_service_account_with_one_line(field):
    """The operator's ServiceAccount of job "other" is bound to that job's Role: pods running
    as it could patch that job's leader pod."""
    with pytest.raises(jobspec.ManifestError) as caught:
        jobspec.load_manifest(manifest({field: SA_OF_OTHER, "containers": [container()]}))
    assert caught.value.problems == [
        f'{SPEC}.{field}: names "{SA_OF_OTHER}", the ServiceAccount the operator made for '
        "another StrategyJob (bound to that job's Role); a job's pods run as their own. "
        "Remove serviceAccountName, or name a ServiceAccount of your own whose name does not "
        "end in -strategyjob-sa."
    ]


def test_the_jobs_own_and_users_service_accounts_are_accepted():
    for account in ("mine-strategyjob-sa", "trainer", "other", "strategyjob-sa"):
        job = jobspec.load_manifest(
            manifest({"serviceAccountName": account, "containers": [container()]})
        )
        pod = children.build_pod(job, "worker", 0, OWNER, jobspec.cluster_for_kubernetes(job))
        assert pod["spec"]["serviceAccountName"] == account


def test_the_operators_service_account_has_the_suffix_the_loader_refuses_in_other_jobs():
    job = jobspec.load_manifest(manifest({"containers": [container()]}))
    sa = children.build_service_account(job, OWNER)["metadata"]["name"]
    assert sa == "mine-strategyjob-sa" == jobspec.service_account_name("mine")
    assert sa.endswith(jobspec.SERVICE_ACCOUNT_SUFFIX)
    pod = children.build_pod(job, "worker", 0, OWNER, jobspec.cluster_for_kubernetes(job))
    assert pod["spec"]["serviceAccountName"] == sa
    binding = children.build_role_binding(job, OWNER)
    assert binding["subjects"][0]["name"] == sa
    assert binding["roleRef"]["name"] == children.build_role(job, OWNER)["metadata"]["name"]
    # as another job's template, it is refused
    other = manifest({"serviceAccountName": sa, "containers": [container()]}, name="thief")
    with pytest.raises(jobspec.ManifestError):
        jobspec.load_manifest(other)


class RecordingApi:
    """The API client's surface the reconciler uses, recording calls."""

    core_path = staticmethod(KubeApi.core_path)
    group_path = staticmethod(KubeApi.group_path)

    def __init__(self, job: dict[str, Any]) -> None:
        self.job, self.calls, self.events = job, [], []

    async def get(self, path):
        return self.job

    async def list(self, path, selector):
        return []

    async def create(self, path, obj):
        self.calls.append(("create", obj["kind"], obj["metadata"]["name"]))
        return True

    async def delete(self, path, grace_seconds=None):
        self.calls.append(("delete", path))
        return True

    async def merge_patch(self, path, patch):
        self.calls.append(("patch", path))
        self.job = {**self.job, "status": patch["status"]}
        return {}

    async def post_event(self, involved, type_, reason, message, now):
        self.events.append((type_, reason, message))


def test_the_operator_fails_such_a_job_with_a_condition_and_an_event_and_creates_nothing():
    api = RecordingApi(manifest({"containers": [container(env=[key_ref(TOKEN_OF_OTHER)])]}))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    reconciler = Reconciler(api, clock=lambda: now, registry=Registry())
    asyncio.run(reconciler.reconcile("ns", "mine"))
    assert not [call for call in api.calls if call[0] == "create"]
    failed = [x for x in api.job["status"]["conditions"] if x["type"] == c.FAILED]
    assert failed and failed[0]["status"] == "True"
    assert failed[0]["reason"] == c.REASON_INVALID_SPEC
    assert TOKEN_OF_OTHER in failed[0]["message"] and "secretKeyRef.name" in failed[0]["message"]
    assert [(t, r) for t, r, _ in api.events] == [("Warning", c.REASON_INVALID_SPEC)]


def test_the_operator_fails_a_job_running_as_another_jobs_service_account_and_creates_nothing():
    pod_spec = {"serviceAccountName": SA_OF_OTHER, "containers": [container()]}
    api = RecordingApi(manifest(pod_spec))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    asyncio.run(Reconciler(api, clock=lambda: now, registry=Registry()).reconcile("ns", "mine"))
    assert not [call for call in api.calls if call[0] == "create"]
    failed = [x for x in api.job["status"]["conditions"] if x["type"] == c.FAILED]
    assert failed[0]["reason"] == c.REASON_INVALID_SPEC
    assert failed[0]["message"].startswith(f'{SPEC}.serviceAccountName: names "{SA_OF_OTHER}"')


# --- securityContext defaults ------------------------------------------------------------------


def build(pod_spec: dict[str, Any], annotations=None) -> dict[str, Any]:
    job = jobspec.load_manifest(manifest(pod_spec, annotations=annotations))
    return children.build_pod(job, "worker", 0, OWNER, jobspec.cluster_for_kubernetes(job))


def test_a_plain_template_gets_the_restricted_profile():
    spec = build({"containers": [container(), container(name="sidecar")]})["spec"]
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    for x in spec["containers"]:
        assert x["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }


def test_the_templates_own_values_win_field_by_field():
    pod_spec = {
        "securityContext": {
            "runAsNonRoot": False,
            "fsGroup": 1000,
            "seccompProfile": {"type": "Unconfined"},
        },
        "containers": [
            container(
                securityContext={
                    "allowPrivilegeEscalation": True,
                    "capabilities": {"add": ["IPC_LOCK"]},
                }
            ),
            container(name="sidecar", securityContext={"capabilities": {"drop": []}}),
        ],
        "initContainers": [container(name="init")],
    }
    before = copy.deepcopy(pod_spec)
    job = jobspec.load_manifest(manifest(pod_spec))
    spec = children.build_pod(job, "worker", 0, OWNER, jobspec.cluster_for_kubernetes(job))["spec"]
    assert spec["securityContext"] == before["securityContext"]
    main, sidecar = spec["containers"]
    assert main["securityContext"] == {
        "allowPrivilegeEscalation": True,
        "capabilities": {"add": ["IPC_LOCK"], "drop": ["ALL"]},
    }
    assert sidecar["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": []},
    }
    assert spec["initContainers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert job.replica_specs["worker"].template["spec"] == before  # the template is untouched


@pytest.mark.parametrize("where", ["pod", "container"])
def test_run_as_root_asked_for_gets_no_run_as_non_root(where):
    root = {"runAsUser": 0}
    pod_spec: dict[str, Any] = {"containers": [container()]}
    if where == "pod":
        pod_spec["securityContext"] = root
    else:
        pod_spec["containers"][0]["securityContext"] = root
    pod_spec["containers"].append(container(name="sidecar"))
    pod_spec["containers"].append(container(name="own-user", securityContext={"runAsUser": 7}))
    spec = build(pod_spec)["spec"]
    assert "runAsNonRoot" not in spec["securityContext"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    root, sidecar, own_user = (x["securityContext"] for x in spec["containers"])
    assert "runAsNonRoot" not in root
    # a container that inherits the pod's uid 0 is root too; one with its own uid is not
    assert sidecar.get("runAsNonRoot") is (None if where == "pod" else True)
    assert own_user["runAsNonRoot"] is True


def test_a_non_root_user_keeps_run_as_non_root():
    spec = build({"securityContext": {"runAsUser": 1000}, "containers": [container()]})["spec"]
    assert spec["securityContext"] == {
        "runAsUser": 1000,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


@pytest.mark.parametrize(
    "security_context",
    [{"privileged": True}, {"capabilities": {"add": ["SYS_ADMIN"]}}],
    ids=["privileged", "sys-admin"],
)
def test_no_default_that_the_api_server_would_refuse_beside_the_templates(security_context):
    """allowPrivilegeEscalation: false is invalid with privileged or an added SYS_ADMIN."""
    spec = build({"containers": [container(securityContext=security_context)]})["spec"]
    sc = spec["containers"][0]["securityContext"]
    assert "allowPrivilegeEscalation" not in sc
    if security_context.get("privileged"):
        assert "drop" not in (sc.get("capabilities") or {})


def test_windows_pods_and_legacy_seccomp_annotations_get_no_linux_defaults():
    windows = build({"os": {"name": "windows"}, "containers": [container()]})["spec"]
    assert "securityContext" not in windows
    assert "securityContext" not in windows["containers"][0]
    legacy = {"seccomp.security.alpha.kubernetes.io/pod": "runtime/default"}
    spec = build({"containers": [container()]}, annotations=legacy)["spec"]
    assert "seccompProfile" not in spec["securityContext"]


# --- NetworkPolicy ---------------------------------------------------------------------------


def test_the_network_policy_admits_only_pods_with_the_jobs_uid_and_the_pods_carry_it():
    job = jobspec.load_manifest(manifest({"containers": [container()]}))
    policy = children.build_network_policy(job, OWNER)
    peers = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert peers == {c.LABEL_JOB_NAME: "mine", children.LABEL_JOB_UID: "uid-of-mine"}
    # every pod labelled with the job's name is protected, whoever labelled it
    assert policy["spec"]["podSelector"] == {"matchLabels": {c.LABEL_JOB_NAME: "mine"}}
    for t, i in job.replicas():
        pod = children.build_pod(job, t, i, OWNER, jobspec.cluster_for_kubernetes(job))
        assert peers.items() <= pod["metadata"]["labels"].items()


def test_security_fields_of_the_wrong_shape_are_left_for_the_api_server_to_name():
    """Building the pod never raises on them (a pass that raised would repeat forever)."""
    spec = build(
        {
            "securityContext": "root",
            "containers": [container(securityContext={"capabilities": ["ALL"]})],
        }
    )["spec"]
    assert spec["securityContext"] == "root"
    assert spec["containers"][0]["securityContext"] == {"capabilities": ["ALL"]}
    spec = build({"os": "linux", "containers": [container(securityContext=[1])]})["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["containers"][0]["securityContext"] == [1]


def test_the_examples_root_init_container_still_runs_as_root():
    """examples/digits_mwms/k8s.yaml makes its hostPath writable from a root init container
    (runAsUser: 0): no runAsNonRoot is added beside it (the kubelet would refuse it), and
    root keeps what chmod of a directory it owns needs, with every capability dropped."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "examples" / "digits_mwms" / "k8s.yaml"
    job = jobspec.load_manifest(jobspec.read_manifest_file(path))
    spec = children.build_pod(job, "worker", 0, OWNER, jobspec.cluster_for_kubernetes(job))["spec"]
    assert "runAsNonRoot" not in spec["securityContext"]
    init = spec["initContainers"][0]["securityContext"]
    assert init["runAsUser"] == 0 and init["capabilities"] == {"drop": ["ALL"]}
    assert "runAsNonRoot" not in init
    assert spec["containers"][0]["securityContext"]["runAsNonRoot"] is True  # the others


# --- the CRD's rules ---------------------------------------------------------------------------


def test_the_crds_rules_say_what_the_loader_says():
    """``kubectl apply`` refuses another job's token or ServiceAccount in the loader's words
    (the API server names the field; the rules sit where CEL's cost budget allows them)."""
    from pathlib import Path

    import yaml
    from strategyjob.jobspec import _load

    crd = Path(__file__).resolve().parents[3] / "crds" / "strategyjob.dev_strategyjobs.yaml"
    text = " ".join(crd.read_text().split())
    for template, suffix in (
        (_load.OTHER_JOBS_TOKEN, jobspec.TOKEN_SECRET_SUFFIX),
        (_load.OTHER_JOBS_SERVICE_ACCOUNT, jobspec.SERVICE_ACCOUNT_SUFFIX),
    ):
        words = template.partition("{value}, ")[2].replace("{suffix}", suffix)
        assert words in text, words
        assert f"endsWith('{suffix}')" in text
    schema = yaml.safe_load(crd.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    paths = [r.get("fieldPath") for r in schema["x-kubernetes-validations"]]
    for replica_type in jobspec.REPLICA_TYPES:
        assert f".spec.replicaSpecs.{replica_type}.template.spec.serviceAccountName" in paths
