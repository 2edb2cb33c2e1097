"""``minReplicas``/``maxReplicas`` on the workers (issue 30): the loader reads them, refuses
what the CRD refuses in the same words (tests/integration/test_k8s_resize_rules.py), and
writes them back."""

from __future__ import annotations

import pytest
from strategyjob.jobspec import ManifestError, load_manifest, to_manifest
from strategyjob.jobspec import messages as msg

from tests.unit.jobspec.conftest import manifest


def ps(workers: int = 3, **bounds: int) -> dict:
    obj = manifest("ParameterServerStrategy", chief=1, ps=1, worker=workers)
    obj["spec"]["replicaSpecs"]["worker"].update(bounds)
    return obj


def problems(obj: dict) -> list[str]:
    with pytest.raises(ManifestError) as info:
        load_manifest(obj)
    return info.value.problems


def test_the_bounds_load_and_render_back():
    job = load_manifest(ps(3, minReplicas=1, maxReplicas=5))
    worker = job.replica_specs["worker"]
    assert (worker.min_replicas, worker.max_replicas) == (1, 5)
    assert job.replica_specs["chief"].min_replicas is None
    rendered = to_manifest(job)["spec"]["replicaSpecs"]["worker"]
    assert (rendered["minReplicas"], rendered["maxReplicas"]) == (1, 5)
    assert "minReplicas" not in to_manifest(load_manifest(ps()))["spec"]["replicaSpecs"]["worker"]


@pytest.mark.parametrize(
    ("workers", "bounds", "expected"),
    [
        (1, {"minReplicas": 2}, msg.BELOW_MIN_REPLICAS.format(value=1, minimum=2)),
        (6, {"maxReplicas": 5}, msg.ABOVE_MAX_REPLICAS.format(value=6, maximum=5)),
        (
            3,
            {"minReplicas": 4, "maxReplicas": 2},
            msg.BOUNDS_CROSSED.format(value='{"maxReplicas": 2, "minReplicas": 4}'),
        ),
    ],
)
def test_a_count_outside_the_bounds_is_one_line(workers, bounds, expected):
    assert problems(ps(workers, **bounds)) == [expected]


def test_the_words_are_the_crds():
    assert msg.BELOW_MIN_REPLICAS.format(value=1, minimum=2) == (
        "spec.replicaSpecs.worker.replicas: below minReplicas 2 (got 1). Ask for 2 workers or "
        "more, or change minReplicas."
    )


def test_bounds_on_another_replica_type_are_refused():
    obj = ps()
    obj["spec"]["replicaSpecs"]["ps"]["maxReplicas"] = 2
    assert problems(obj) == [
        msg.BOUNDS_NOT_WORKER.format(replica_type="ps", value='{"maxReplicas": 2}')
    ]


def test_a_bound_that_is_not_a_count_is_refused():
    (problem,) = problems(ps(3, minReplicas=-1))
    assert problem.startswith("spec.replicaSpecs.worker.minReplicas: ")
