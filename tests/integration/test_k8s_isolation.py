"""Isolation between jobs in one namespace, against a real API server and the operator:

- a job whose template names another job's token Secret is failed with a condition and an
  Event naming the field, and none of its pods is created (its pods would hold the other
  job's token and pass as that job's replicas to its servers); so is one whose pods would
  run as the ServiceAccount the operator made for another job (and so get its rights);
- pods get the restricted securityContext by default: the API server's own Pod Security
  admission, enforcing the ``restricted`` profile on the namespace, admits them; what a
  template sets wins, field by field;
- pods carry the job's uid, which the job's NetworkPolicy requires of its peers.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from integration_harness import manifest, wait_for
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.timeout(120)


def _containers(obj: dict[str, Any], replica_type: str = "worker") -> list[dict[str, Any]]:
    return obj["spec"]["replicaSpecs"][replica_type]["template"]["spec"]["containers"]


def exists(read, name: str, namespace: str) -> bool:
    """Whether ``read(name, namespace)`` (a core API read) finds the object."""
    try:
        read(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


@pytest.mark.parametrize("containers", ["containers", "initContainers"])
def test_a_job_naming_another_jobs_token_is_refused(kube, operator, containers):
    """In a container's or an init container's env (the CRD types both alike) the CRD
    refuses it at once, in the loader's words."""
    victim = kube.create_job(manifest("victim", "MultiWorkerMirroredStrategy", {"worker": 1}))
    token_secret = f"victim-{victim['metadata']['uid']}-strategyjob-token"
    wait_for(
        "the victim's token Secret",
        lambda: exists(kube.core.read_namespaced_secret, token_secret, kube.ns),
    )
    # the Secret comes before the pods in a pass: wait for the pod too, so that the check
    # below, after the thief is refused, compares like with like
    wait_for("the victim's pod", lambda: list(kube.pods("victim")) == ["victim-worker-0"])

    thief = manifest("thief", "MultiWorkerMirroredStrategy", {"worker": 2})
    stolen = [
        {"name": "STOLEN", "valueFrom": {"secretKeyRef": {"name": token_secret, "key": "token"}}}
    ]
    pod_spec = thief["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    if containers == "containers":
        _containers(thief)[0]["env"] = stolen
    else:
        pod_spec["initContainers"] = [{"name": "init", "image": "busybox", "env": stolen}]
    field = (
        f"spec.replicaSpecs.worker.template.spec.{containers}[0].env[0].valueFrom.secretKeyRef.name"
    )
    with pytest.raises(ApiException) as err:  # the CRD's rule, in the loader's words
        kube.create_job(thief)
    assert err.value.status == 422, err.value.body
    message = json.loads(err.value.body)["message"]
    assert f'{field}: Invalid value: names "{token_secret}", the token Secret' in message
    assert kube.job("thief") is None
    # the victim is untouched and keeps running
    assert list(kube.pods("victim")) == ["victim-worker-0"]


@pytest.mark.parametrize("field", ["serviceAccountName", "serviceAccount"])
def test_a_job_running_as_another_jobs_service_account_is_failed_and_gets_no_pods(
    kube, operator, field
):
    """The ServiceAccount the operator made for job "victim" is bound to that job's Role: a
    job whose pods ran as it could patch the victim's leader pod. ``serviceAccount`` (the
    deprecated alias) is left to the loader; ``serviceAccountName`` the CRD refuses first."""
    kube.create_job(manifest("victim", "MultiWorkerMirroredStrategy", {"worker": 1}))
    account = "victim-strategyjob-sa"
    wait_for(
        "the victim's ServiceAccount",
        lambda: exists(kube.core.read_namespaced_service_account, account, kube.ns),
    )
    wait_for("the victim's pod", lambda: list(kube.pods("victim")) == ["victim-worker-0"])

    thief = manifest("thief", "MultiWorkerMirroredStrategy", {"worker": 2})
    thief["spec"]["replicaSpecs"]["worker"]["template"]["spec"][field] = account
    path = f"spec.replicaSpecs.worker.template.spec.{field}"
    words = f'names "{account}", the ServiceAccount the operator made for another StrategyJob'
    try:
        kube.create_job(thief)
    except ApiException as e:  # the CRD's rule, in the loader's words
        assert field == "serviceAccountName" and e.status == 422, e.body
        message = json.loads(e.body)["message"]
        assert f"{path}: Invalid value: {words}" in message, message
        assert kube.job("thief") is None
        return
    failed = kube.wait_condition("thief", "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert failed["message"].startswith(f"{path}: {words}"), failed["message"]
    kube.wait_events("thief", "InvalidSpec")
    assert kube.pods("thief") == {}
    assert list(kube.pods("victim")) == ["victim-worker-0"]
    pod = kube.core.read_namespaced_pod("victim-worker-0", kube.ns)
    assert pod.spec.service_account_name == account


TOKEN_WORDS = (
    "the token Secret of another StrategyJob; a job's pods get only their own token (the "
    "operator injects it as STRATEGYJOB_TOKEN). Remove the reference, or use a Secret whose "
    "name does not end in -strategyjob-token."
)
SA_WORDS = (
    "the ServiceAccount the operator made for another StrategyJob (bound to that job's Role); "
    "a job's pods run as their own. Remove serviceAccountName, or name a ServiceAccount of "
    "your own whose name does not end in -strategyjob-sa."
)
TOKEN = "victim-0000-strategyjob-token"
CEL_REFUSES = [
    (
        {
            "containers": [
                {
                    "name": "c",
                    "env": [
                        {
                            "name": "T",
                            "valueFrom": {"secretKeyRef": {"name": TOKEN, "key": "token"}},
                        }
                    ],
                }
            ]
        },
        "containers[0].env[0].valueFrom.secretKeyRef.name",
        TOKEN,
        TOKEN_WORDS,
    ),
    (
        {"containers": [{"name": "c", "envFrom": [{"secretRef": {"name": TOKEN}}]}]},
        "containers[0].envFrom[0].secretRef.name",
        TOKEN,
        TOKEN_WORDS,
    ),
    (
        {
            "containers": [{"name": "c"}],
            "volumes": [{"name": "v", "secret": {"secretName": TOKEN}}],
        },
        "volumes[0].secret.secretName",
        TOKEN,
        TOKEN_WORDS,
    ),
    (
        {
            "containers": [{"name": "c"}],
            "volumes": [
                {
                    "name": "v",
                    "projected": {
                        "sources": [{"configMap": {"name": "cm"}}, {"secret": {"name": TOKEN}}]
                    },
                }
            ],
        },
        "volumes[0].projected.sources[1].secret.name",
        TOKEN,
        TOKEN_WORDS,
    ),
    (
        {"serviceAccountName": "victim-strategyjob-sa", "containers": [{"name": "c"}]},
        "serviceAccountName",
        "victim-strategyjob-sa",
        SA_WORDS,
    ),
]


def _dry_run(kube, name: str, pod_spec: dict[str, Any], replica_type: str = "worker"):
    job = manifest(name, "MultiWorkerMirroredStrategy", {replica_type: 1})
    job["spec"]["replicaSpecs"][replica_type]["template"]["spec"] = pod_spec
    return kube.custom.create_namespaced_custom_object(
        "strategyjob.dev", "v1alpha1", kube.ns, "strategyjobs", job, dry_run="All"
    )


@pytest.mark.parametrize(
    ("pod_spec", "field", "value", "words"), CEL_REFUSES, ids=[c[1] for c in CEL_REFUSES]
)
def test_the_crd_refuses_another_jobs_token_or_service_account_at_apply(
    kube, pod_spec, field, value, words
):
    """``kubectl apply`` (a server-side dry run here) is refused at once, naming the field,
    in the loader's words; the loader refuses the same manifest alike."""
    from strategyjob import jobspec

    replica_type = "chief" if field == "serviceAccountName" else "worker"
    with pytest.raises(ApiException) as refused:
        _dry_run(kube, "thief", pod_spec, replica_type)
    body = json.loads(refused.value.body)
    assert refused.value.status == 422, body
    path = f"spec.replicaSpecs.{replica_type}.template.spec.{field}"
    causes = {c["field"]: c["message"] for c in body["details"]["causes"]}
    assert path in causes, causes
    assert causes[path].endswith(f'names "{value}", {words}'), causes[path]
    job = manifest("thief", "MultiWorkerMirroredStrategy", {replica_type: 1})
    job["spec"]["replicaSpecs"][replica_type]["template"]["spec"] = pod_spec
    with pytest.raises(jobspec.ManifestError) as caught:
        jobspec.load_manifest(job)
    assert caught.value.problems == [f'{path}: names "{value}", {words}']


def test_the_crd_admits_a_jobs_own_service_account_and_users_own_secrets(kube):
    pod_spec = {
        "serviceAccountName": "mine-strategyjob-sa",
        "containers": [
            {
                "name": "c",
                "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "hf-token"}}}],
                "envFrom": [{"secretRef": {"name": "wandb"}}, {"configMapRef": {"name": "x"}}],
            }
        ],
        "volumes": [
            {"name": "s", "secret": {"secretName": "creds"}},
            {"name": "p", "projected": {"sources": [{"secret": {"name": "strategyjob-token"}}]}},
        ],
    }
    stored = _dry_run(kube, "mine", pod_spec)
    assert stored["spec"]["replicaSpecs"]["worker"]["template"]["spec"] == pod_spec
    mine = {"serviceAccountName": "trainer", "containers": [{"name": "c"}]}
    assert _dry_run(kube, "other", mine)


RESTRICTED = "pod-security.kubernetes.io/enforce"


def test_pods_pass_the_restricted_pod_security_standard_by_default(kube, operator):
    kube.core.patch_namespace(kube.ns, {"metadata": {"labels": {RESTRICTED: "restricted"}}})
    plain = {
        "metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    with pytest.raises(ApiException) as refused:  # the admission is on: a plain pod fails
        kube.core.create_namespaced_pod(kube.ns, plain)
    assert refused.value.status == 403 and "PodSecurity" in refused.value.body
    job = manifest("safe", "ParameterServerStrategy", {"chief": 1, "worker": 1, "ps": 1})
    uid = kube.create_job(job)["metadata"]["uid"]
    pods = kube.wait_pods("safe", 3)  # Pod Security admission refused none of them
    for pod in pods.values():
        sc = pod.spec.security_context
        assert sc.run_as_non_root is True and sc.seccomp_profile.type == "RuntimeDefault"
        for container in pod.spec.containers:
            csc = container.security_context
            assert csc.allow_privilege_escalation is False
            assert csc.capabilities.drop == ["ALL"]
        assert pod.metadata.labels["strategyjob.dev/job-uid"] == uid
    policy = kube.cp.kubectl("get", "networkpolicy", "safe", "-n", kube.ns, "-o", "json")
    assert f'"strategyjob.dev/job-uid": "{uid}"' in policy.stdout


def test_the_templates_own_security_settings_win(kube, operator):
    job = manifest("rooted", "MultiWorkerMirroredStrategy", {"worker": 1})
    template = job["spec"]["replicaSpecs"]["worker"]["template"]
    template["spec"]["securityContext"] = {"runAsNonRoot": False, "runAsUser": 0}
    tweaks = {
        "allowPrivilegeEscalation": True,
        "capabilities": {"add": ["IPC_LOCK"]},
    }
    _containers(job)[0]["securityContext"] = copy.deepcopy(tweaks)
    privileged = {"name": "debug", "image": "busybox", "securityContext": {"privileged": True}}
    _containers(job).append(privileged)
    kube.create_job(job)
    pod = kube.wait_pods("rooted", 1)["rooted-worker-0"]
    sc = pod.spec.security_context
    assert (sc.run_as_non_root, sc.run_as_user) == (False, 0)
    assert sc.seccomp_profile.type == "RuntimeDefault"  # not set by the template: defaulted
    main, debug = pod.spec.containers
    assert main.security_context.allow_privilege_escalation is True
    assert main.security_context.capabilities.add == ["IPC_LOCK"]
    assert main.security_context.capabilities.drop == ["ALL"]
    # privileged: no default the API server would refuse beside it
    assert debug.security_context.privileged is True
    assert debug.security_context.allow_privilege_escalation is None
