"""Builders for StrategyJob manifests used by the jobspec tests."""

from __future__ import annotations

from typing import Any

import pytest


def container(name: str = "strategyjob", **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "python:3.11", "command": ["python", "train.py"], **extra}


def replica(replicas: int = 1, **extra: Any) -> dict[str, Any]:
    return {"replicas": replicas, "template": {"spec": {"containers": [container()]}}, **extra}


def manifest(
    strategy: str = "MultiWorkerMirroredStrategy",
    name: str = "mnist",
    namespace: str | None = None,
    **counts: int,
) -> dict[str, Any]:
    """A valid-looking manifest with ``counts`` replicas per type (default 2 workers)."""
    counts = counts or {"worker": 2}
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": metadata,
        "spec": {
            "strategy": strategy,
            "replicaSpecs": {t: replica(n) for t, n in counts.items()},
        },
    }


@pytest.fixture
def make_manifest():
    return manifest


@pytest.fixture
def make_replica():
    return replica


@pytest.fixture
def make_container():
    return container
