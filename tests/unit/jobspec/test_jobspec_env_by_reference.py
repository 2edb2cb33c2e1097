"""replica_env_by_reference: the env entries the operator puts in a pod spec, the cluster
read from the job's ConfigMap. Expanded the way the kubelet expands them, they give exactly
what ``replica_env`` gives (what ``strategyjob run`` sets), TF_CONFIG byte for byte, and their
size does not grow with the job."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from strategyjob import jobspec
from strategyjob.jobspec import load_manifest

from tests.support.kubelet_env import container_env
from tests.support.kubelet_env import expand as kubelet_expand


def kubelet_env(entries: list[dict[str, Any]], config_maps: Mapping[str, Mapping[str, str]]):
    """The container's environment from ``entries``, in order, as the kubelet makes it:
    ``configMapKeyRef`` read from ``config_maps``, each ``value`` expanded against the
    variables defined before it."""
    pod = {"metadata": {"namespace": "ns"}, "spec": {}}
    return container_env(pod, {"env": entries}, lambda kind, ns, name: config_maps.get(name))


def test_the_expansion_is_kubernetes():
    defined = {"A": "x", "B": "$(A)"}
    assert kubelet_expand("$(A)-$(B)-$(C)-$$(A)-$$-$x-$(A-$", defined) == (
        "x-$(A)-$(C)-$(A)-$-$x-$(A-$"
    )


JOBS = [
    ("ParameterServerStrategy", {"chief": 1, "worker": 3, "ps": 2, "evaluator": 1}),
    ("MultiWorkerMirroredStrategy", {"chief": 1, "worker": 4, "evaluator": 1}),
    ("MultiWorkerMirroredStrategy", {"worker": 3}),
    ("MirroredStrategy", {"worker": 1}),
    ("ParameterServerStrategy", {"chief": 1, "worker": 1, "ps": 1}),
]


@pytest.mark.parametrize(("strategy", "counts"), JOBS)
def test_expanded_by_the_kubelet_the_env_is_replica_env_and_tf_config_is_exact(
    make_manifest, strategy, counts
):
    job = load_manifest(make_manifest(strategy, name="train", namespace="ml", **counts))
    cluster = jobspec.cluster_for_kubernetes(job)
    name = jobspec.cluster_config_map_name(job.name)
    assert name == "train-strategyjob-cluster"
    config_maps = {name: {jobspec.CLUSTER_SPEC_KEY: jobspec.cluster_spec(cluster)}}
    for replica_type, index in job.replicas():
        entries = jobspec.replica_env_by_reference(
            job, replica_type, index, cluster, 3, config_map=name
        )
        seen = kubelet_env(entries, config_maps)
        plain = jobspec.replica_env(job, replica_type, index, cluster, 3)
        assert seen == {jobspec.ENV_CLUSTER_SPEC: jobspec.cluster_spec(cluster), **plain}
        tf_config = jobspec.tf_config(cluster, replica_type, index)
        assert seen["TF_CONFIG"] == tf_config
        # today's format, written independently: compact JSON, sorted keys, no evaluator
        training = {t: a for t, a in cluster.items() if t != "evaluator"}
        config = {"cluster": training, "task": {"type": replica_type, "index": index}}
        assert tf_config == json.dumps(config, sort_keys=True, separators=(",", ":"))
        # the reference comes first, the rest in replica_env's order
        assert [e["name"] for e in entries] == [jobspec.ENV_CLUSTER_SPEC, *plain]


def test_tf_config_refers_to_the_cluster_and_holds_only_the_task(make_manifest):
    job = load_manifest(make_manifest("ParameterServerStrategy", chief=1, worker=2, ps=1))
    cluster = jobspec.cluster_for_kubernetes(job)
    entries = jobspec.replica_env_by_reference(job, "ps", 0, cluster, config_map="cm")
    assert entries[0] == {
        "name": "STRATEGYJOB_CLUSTER_SPEC",
        "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "cluster"}},
    }
    (tf_config,) = [e["value"] for e in entries if e["name"] == "TF_CONFIG"]
    assert tf_config == '{"cluster":$(STRATEGYJOB_CLUSTER_SPEC),"task":{"index":0,"type":"ps"}}'
    assert jobspec.cluster_spec(cluster) == json.dumps(
        {t: cluster[t] for t in ("chief", "ps", "worker")}, separators=(",", ":")
    )


def test_a_literal_dollar_reaches_the_container_unchanged():
    """No injected value has a ``$`` (names are DNS labels, the rest digits and fixed
    words), and one that did would still arrive as written."""
    for value in ["$(TF_CONFIG)", "$$", "a$b", "$", "$(", "x$$(Y)z"]:
        assert kubelet_expand(jobspec.kubernetes_literal(value), {"TF_CONFIG": "no"}) == value


def _entry_bytes(entries: list[dict[str, Any]]) -> int:
    return len(json.dumps(entries, separators=(",", ":")))


def test_the_pod_specs_env_does_not_grow_with_the_job(make_manifest):
    """Each pod's env entries stay the same size whatever the job's size (the digits of the
    largest index aside); the cluster, which grows, is in the ConfigMap once."""
    sizes = {}
    for workers in (2, 100, 999):
        job = load_manifest(make_manifest(chief=1, worker=workers))
        cluster = jobspec.cluster_for_kubernetes(job)
        entries = jobspec.replica_env_by_reference(job, "worker", 1, cluster, config_map="c")
        sizes[workers] = _entry_bytes(entries)
        plain = jobspec.replica_env(job, "worker", 1, cluster)
        assert len(plain["TF_CONFIG"]) > workers * len("mnist-worker-0.mnist.default.svc:2222")
    assert max(sizes.values()) - min(sizes.values()) <= 4, sizes
    assert max(sizes.values()) < 1024, sizes
