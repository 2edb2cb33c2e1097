"""StrategyJob manifests as a user writes them, and the jobs the loader makes of them."""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from strategyjob import jobspec

API_VERSION = "strategyjob.dev/v1alpha1"
MWMS = "MultiWorkerMirroredStrategy"
#: The smallest pod template the loader takes: one training container.
TEMPLATE: dict[str, Any] = {"spec": {"containers": [{"name": "strategyjob", "image": "x"}]}}


def manifest(
    replicas: Mapping[str, int] | None = None,
    *,
    name: str = "j",
    namespace: str | None = "ns",
    strategy: str = MWMS,
    policy: str | Mapping[str, str] | None = "OnFailure",
    containers: Sequence[Mapping[str, Any]] | None = None,
    success_policy: str = "",
    run_policy: Mapping[str, Any] | None = None,
    uid: str | None = None,
    generation: int | None = None,
) -> dict[str, Any]:
    """A StrategyJob object: ``replicas`` maps replica type to count (2 workers by default).
    ``policy``: every type's restartPolicy, or per type (a type not named gets ``Never``),
    None to leave it to the default. ``uid``/``generation``: as the API server returns it."""
    template = {"spec": {"containers": list(containers)}} if containers else TEMPLATE
    specs: dict[str, Any] = {}
    for t, n in (replicas or {"worker": 2}).items():
        specs[t] = {"replicas": n, "template": copy.deepcopy(template)}
        if isinstance(policy, str):
            specs[t]["restartPolicy"] = policy
        elif policy is not None:
            specs[t]["restartPolicy"] = policy.get(t, "Never")
    spec: dict[str, Any] = {"strategy": strategy, "replicaSpecs": specs}
    if run_policy is not None:
        spec["runPolicy"] = dict(run_policy)
    if success_policy:
        spec["successPolicy"] = success_policy
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if uid is not None:
        meta["uid"] = uid
    if generation is not None:
        meta["generation"] = generation
    return {"apiVersion": API_VERSION, "kind": "StrategyJob", "metadata": meta, "spec": spec}


def job(
    replicas: Mapping[str, int] | None = None,
    *,
    strategy: str = MWMS,
    policy: str | Mapping[str, str] | None = "OnFailure",
    containers: Sequence[Mapping[str, Any]] | None = None,
    success_policy: str = "",
    **run_policy: Any,
) -> jobspec.StrategyJob:
    """The loaded job of :func:`manifest` (``j`` in namespace ``ns``), with ``run_policy``'s
    camelCase fields as keywords."""
    obj = manifest(
        replicas,
        strategy=strategy,
        policy=policy,
        containers=containers,
        success_policy=success_policy,
        run_policy=run_policy,
    )
    return jobspec.load_manifest(obj)


def preemptible_workers(
    name: str, command: Sequence[str], restart_policy: str = "ExitCode"
) -> dict[str, Any]:
    """The 2-worker MultiWorkerMirroredStrategy job that preemption tests and benchmarks run
    under ``strategyjob run``: one restart allowed, 60 s between SIGTERM and SIGKILL."""
    container = {"name": "strategyjob", "command": [sys.executable, *command]}
    return {
        "apiVersion": API_VERSION,
        "kind": "StrategyJob",
        "metadata": {"name": name},
        "spec": {
            "strategy": MWMS,
            "runPolicy": {"backoffLimit": 1},
            "replicaSpecs": {
                "worker": {
                    "replicas": 2,
                    "restartPolicy": restart_policy,
                    "template": {
                        "spec": {"terminationGracePeriodSeconds": 60, "containers": [container]}
                    },
                }
            },
        },
    }
