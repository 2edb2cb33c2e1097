"""ClusterSpec behaves like tf.train.ClusterSpec."""

from __future__ import annotations

import pytest
from strategyjob.cluster_resolver import ClusterSpec

DENSE = {"worker": ["w0:2222", "w1:2222", "w2:2222"], "ps": ["ps0:2222", "ps1:2222"]}


def test_dense_jobs():
    spec = ClusterSpec(DENSE)
    assert spec.jobs == ["worker", "ps"]
    assert spec.num_tasks("worker") == 3
    assert spec.task_indices("ps") == [0, 1]
    assert spec.task_address("worker", 2) == "w2:2222"
    assert spec.job_tasks("worker") == DENSE["worker"]
    assert spec.as_dict() == DENSE


def test_sparse_jobs():
    spec = ClusterSpec({"worker": {1: "w1:2222", 3: "w3:2222"}, "ps": ["ps0:2222"]})
    assert spec.num_tasks("worker") == 2
    assert spec.task_indices("worker") == [1, 3]
    assert spec.task_address("worker", 3) == "w3:2222"
    assert spec.job_tasks("worker") == [None, "w1:2222", None, "w3:2222"]
    assert spec.as_dict() == {"worker": {1: "w1:2222", 3: "w3:2222"}, "ps": ["ps0:2222"]}


def test_sparse_job_with_string_keys_from_json():
    spec = ClusterSpec({"worker": {"1": "w1:2222"}})
    assert spec.task_address("worker", 1) == "w1:2222"


def test_sparse_job_that_happens_to_be_dense_becomes_a_list():
    assert ClusterSpec({"worker": {1: "b", 0: "a"}}).as_dict() == {"worker": ["a", "b"]}


def test_empty_job_and_empty_cluster():
    assert ClusterSpec({"worker": {}}).as_dict() == {"worker": {}}
    assert not ClusterSpec({})
    assert ClusterSpec(DENSE)


def test_from_another_cluster_spec_is_an_equal_copy():
    original = ClusterSpec(DENSE)
    copy = ClusterSpec(original)
    assert copy == original
    assert copy is not original
    assert copy.as_dict() == DENSE


def test_equality():
    assert ClusterSpec(DENSE) == ClusterSpec(dict(DENSE))
    assert ClusterSpec(DENSE) != ClusterSpec({"worker": DENSE["worker"]})
    assert ClusterSpec(DENSE) == DENSE
    assert ClusterSpec({"worker": ["a"]}) == {"worker": {0: "a"}}
    assert ClusterSpec(DENSE) != "worker"


def test_repr_sorts_jobs():
    assert repr(ClusterSpec({"worker": ["w0:1"], "ps": {2: "p2:1"}})) == (
        "ClusterSpec({'ps': {2: 'p2:1'}, 'worker': ['w0:1']})"
    )


def test_unknown_job_and_task():
    spec = ClusterSpec(DENSE)
    with pytest.raises(ValueError, match=r"^No such job in cluster: 'chief'$"):
        spec.num_tasks("chief")
    with pytest.raises(ValueError, match=r"^No such job in cluster: 'chief'$"):
        spec.task_indices("chief")
    with pytest.raises(ValueError, match=r"^No such job in cluster: None$"):
        spec.task_address(None, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^No task with index 5 in job 'worker'$"):
        spec.task_address("worker", 5)


def test_type_errors():
    with pytest.raises(TypeError, match=r"^`cluster` must be a dictionary mapping one or more"):
        ClusterSpec(["w0:2222"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^The tasks for job 'worker' must be a list or a dict"):
        ClusterSpec({"worker": "w0:2222"})
    with pytest.raises(TypeError, match=r"^Task address 5 must be bytes or unicode$"):
        ClusterSpec({"worker": [5]})
    with pytest.raises(TypeError, match=r"^Job name 1 must be bytes or unicode$"):
        ClusterSpec({1: ["w0:2222"]})  # type: ignore[dict-item]


def test_unhashable_like_tf():
    with pytest.raises(TypeError):
        hash(ClusterSpec(DENSE))
