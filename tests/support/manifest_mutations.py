"""Hypothesis strategies for fuzzing StrategyJob manifests: mutations of valid manifests
(a wrong type, a huge number, a string where a list belongs, an odd key, a list grown to
around the CRD's ``maxItems``, a reference to another job's token Secret or
ServiceAccount), shared by the loader's unit fuzz tests and the integration test that asks
the real API server.

Plain module (no pytest fixtures), imported as ``tests.support.manifest_mutations``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: Examples per property; raise it locally to fuzz longer: STRATEGYJOB_FUZZ_EXAMPLES=2000.
EXAMPLES = int(os.environ.get("STRATEGYJOB_FUZZ_EXAMPLES", "0")) or None


def fuzz_settings(max_examples: int) -> settings:
    """Bounded, reproducible runs (the same examples in CI every time), no deadline per
    example (a loaded machine is slow, not wrong)."""
    return settings(
        max_examples=EXAMPLES or max_examples,
        deadline=None,
        derandomize=EXAMPLES is None,
        database=None,
        # function_scoped_fixture: the integration fuzz reuses one namespace for every
        # example on purpose (its creates are dry runs, nothing is left between examples)
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )


def _container(name: str, command: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": "python:3.11",
        "command": command,
        "args": ["--epochs", "3"],
        "env": [
            {"name": "LR", "value": "0.1"},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "k"}}},
        ],
        "envFrom": [{"secretRef": {"name": "creds"}}, {"configMapRef": {"name": "cfg"}}],
        "ports": [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
    }


def _replica(replicas: int, command: list[str]) -> dict[str, Any]:
    return {
        "replicas": replicas,
        "restartPolicy": "OnFailure",
        "template": {
            "metadata": {"labels": {"team": "vision"}, "annotations": {"note": "fuzz"}},
            "spec": {
                "containers": [_container("strategyjob", command)],
                "serviceAccountName": "trainer",
                "volumes": [
                    {"name": "data", "emptyDir": {}},
                    {"name": "creds", "secret": {"secretName": "creds"}},
                    {
                        "name": "all",
                        "projected": {
                            "sources": [
                                {"secret": {"name": "creds"}},
                                {"configMap": {"name": "cfg"}},
                            ]
                        },
                    },
                ],
            },
        },
    }


def base_manifests() -> list[dict[str, Any]]:
    """Valid manifests using every field the loader reads."""
    train = ["python", "train.py"]
    server = ["python", "-m", "strategyjob.server"]
    run_policy = {
        "backoffLimit": 3,
        "activeDeadlineSeconds": 3600,
        "ttlSecondsAfterFinished": 600,
        "cleanPodPolicy": "All",
        "suspend": True,
        "schedulingPolicy": {"minAvailable": 2, "queue": "gpu", "priorityClass": "high"},
    }
    mwms = {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": "fuzz", "labels": {"app": "mnist"}, "annotations": {"a": "b"}},
        "spec": {
            "strategy": "MultiWorkerMirroredStrategy",
            "replicaSpecs": {"worker": _replica(2, train), "evaluator": _replica(1, train)},
            "runPolicy": run_policy,
            "successPolicy": "AllWorkers",
            "port": 2345,
        },
    }
    pss = copy.deepcopy(mwms)
    pss["spec"]["strategy"] = "ParameterServerStrategy"
    pss["spec"]["replicaSpecs"] = {
        "chief": _replica(1, train),
        "worker": _replica(2, server),
        "ps": _replica(1, server),
    }
    return [mwms, pss]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a value inside ``node`` (keys and list indexes), parents first."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield (*prefix, index)
            yield from _paths(value, (*prefix, index))


_EDGE_INTS = [0, -1, 1, 1000, 1001, 65535, 65536, 100_000, 2**31 - 1, 2**31, 2**63 - 1, 2**63]
_EDGE_TEXT = [
    *("", " ", "0", "true", "a\nb", "python train.py", "Worker", "🙂"),
    *("x" * 253, "x" * 254, "🙂" * 254, "x" * 300),  # around the CRD's maxLength of names
]
#: Lists the CRD bounds (``maxItems``), and lengths around their bounds.
_BOUNDED_LISTS = ("volumes", "sources")
_EDGE_LENGTHS = [127, 128, 129, 511, 512, 513]
#: Names of another job's token Secret and ServiceAccount (both refused by the loader and
#: the CRD wherever the CRD reads them), and of the job's own ServiceAccount (allowed).
_REFERENCED = ["other-strategyjob-token", "other-strategyjob-sa", "fuzz-strategyjob-sa"]


def values(json_only: bool = True) -> st.SearchStrategy[Any]:
    """Values to put where another value was: every JSON type, edge numbers, odd text,
    and small lists and mappings of those. ``json_only``: no NaN or infinity (JSON, as a
    client sends it to the API server, has none)."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from(_EDGE_INTS),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=not json_only, allow_infinity=not json_only),
        st.sampled_from([1.0, 2.0, 3600.0, 1e20]),  # whole numbers written as floats
        st.sampled_from(_EDGE_TEXT),
        st.text(max_size=12),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(st.sampled_from(["name", "value", "containerPort", "k", "a b"]), inner),
        ),
        max_leaves=6,
    )


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value


def _delete(doc: Any, path: tuple[Any, ...]) -> None:
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    del parent[path[-1]]


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


#: Where the CRD's CEL rules read a Secret's or a ServiceAccount's name ("[]": a list index).
_REFERENCE_TAILS = (
    ("template", "spec", "serviceAccountName"),
    ("secretKeyRef", "name"),
    ("secretRef", "name"),
    ("volumes", "[]", "secret", "secretName"),
    ("sources", "[]", "secret", "name"),
)


def _is_reference(path: tuple[Any, ...]) -> bool:
    """A Secret's name where the CRD reads it (``secretKeyRef``, ``secretRef``, a ``secret``
    volume or projected source), or the pod's ``serviceAccountName``."""
    tail = tuple(step if isinstance(step, str) else "[]" for step in path[-4:])
    return any(tail[-len(t) :] == t for t in _REFERENCE_TAILS)


@st.composite
def mutated_manifests(draw: st.DrawFn, json_only: bool = True) -> dict[str, Any]:
    """A valid manifest with one to three mutations: a value replaced, a key removed, a key
    added (an unknown one, or one with an odd name), a list the CRD bounds grown to around
    its bound, or a Secret's or ServiceAccount's name set to another job's."""
    doc = copy.deepcopy(draw(st.sampled_from(base_manifests())))
    grown = False  # one list grown at most: 513 volumes of 513 sources are a 10 MB request
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = list(_paths(doc))
        if not paths:
            break
        kind = draw(
            st.sampled_from(["replace", "replace", "replace", "delete", "add", "grow", "refer"])
        )
        if kind == "grow":
            lists = [p for p in paths if p[-1] in _BOUNDED_LISTS and isinstance(_get(doc, p), list)]
            if lists and not grown:
                grown = True
                items = _get(doc, draw(st.sampled_from(lists)))
                length = draw(st.sampled_from(_EDGE_LENGTHS))
                pattern = items[-1] if items else {"name": "v"}
                items.extend(copy.deepcopy(pattern) for _ in range(length - len(items)))
            continue
        if kind == "refer":
            references = [p for p in paths if _is_reference(p)]
            if references:
                _set(doc, draw(st.sampled_from(references)), draw(st.sampled_from(_REFERENCED)))
            continue
        path = draw(st.sampled_from(paths))
        if kind == "replace":
            _set(doc, path, draw(values(json_only)))
        elif kind == "delete":
            _delete(doc, path)
        else:
            parent = doc
            for step in path[:-1]:
                parent = parent[step]
            if isinstance(parent, dict):
                key = draw(st.sampled_from(["extra", "a\nb", "Worker", "replicas", "1"]))
                parent[key] = draw(values(json_only))
            else:
                parent.append(draw(values(json_only)))
    return doc


def assert_one_line_problems(error: Exception) -> None:
    """A ManifestError lists problems of one line each, saying where and what: never a
    traceback, never an empty or multi-line problem."""
    problems = getattr(error, "problems", None)
    assert problems, f"{type(error).__name__} without problems: {error!r}"
    for problem in problems:
        assert isinstance(problem, str) and problem.strip(), problems
        assert "\n" not in problem and "\r" not in problem, problem
        assert "Traceback" not in problem, problem
        assert ": " in problem, problem  # "<path>: <what is wrong> ..."
    assert str(error) == "\n".join(problems)
