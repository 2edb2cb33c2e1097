"""multi_worker_util: TF's cluster validation messages and role rules (semantics §5.3)."""

from __future__ import annotations

import pytest
from strategyjob.cluster_resolver import ClusterSpec
from strategyjob.cluster_resolver import multi_worker_util as mwu

WITH_CHIEF = {"chief": ["c0:1"], "worker": ["w0:1", "w1:1"], "ps": ["p0:1"], "evaluator": ["e0:1"]}
NO_CHIEF = {"worker": ["w0:1", "w1:1", "w2:1"]}
ALLOWED = "('chief', 'worker', 'evaluator', 'ps', None)"


def message_of(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_disallowed_job_in_cluster():
    cluster = {"master": ["m0:1"], "worker": ["w0:1"]}
    assert message_of(mwu.validate_cluster_spec, cluster, "worker", 0) == (
        "Disallowed task type found in cluster spec. Allowed types are "
        f"{ALLOWED} and the cluster spec is "
        "ClusterSpec({'master': ['m0:1'], 'worker': ['w0:1']})."
    )


def test_unrecognized_task_type():
    assert message_of(mwu.validate_cluster_spec, NO_CHIEF, "foo", 0) == (
        f"Unrecognized task_type: foo, valid task types are: {ALLOWED}"
    )


def test_task_type_not_in_cluster():
    assert message_of(mwu.validate_cluster_spec, NO_CHIEF, "ps", 0) == (
        "`task_type` 'ps' not found in cluster_spec."
    )


def test_evaluator_may_be_absent_from_cluster():
    mwu.validate_cluster_spec(NO_CHIEF, "evaluator", 0)
    assert mwu.is_chief(NO_CHIEF, "evaluator", 0)


def test_at_most_one_chief_and_evaluator():
    two_chiefs = {"chief": ["c0:1", "c1:1"], "worker": ["w0:1"]}
    assert message_of(mwu.validate_cluster_spec, two_chiefs, "worker", 0) == (
        "There must be at most one 'chief' job."
    )
    two_evaluators = {"worker": ["w0:1"], "evaluator": ["e0:1", "e1:1"]}
    assert message_of(mwu.validate_cluster_spec, two_evaluators, "worker", 0) == (
        "There must be at most one 'evaluator' job."
    )


def test_task_id_exceeds_maximum():
    assert message_of(mwu.validate_cluster_spec, NO_CHIEF, "worker", 3) == (
        "The `task_id` 3 exceeds the maximum id of worker."
    )


def test_validate_accepts_cluster_spec_and_none_task_type():
    mwu.validate_cluster_spec(ClusterSpec(WITH_CHIEF), "ps", 0)
    mwu.validate_cluster_spec(WITH_CHIEF, None, 0)
    assert mwu._validate_cluster_spec is mwu.validate_cluster_spec


def test_normalize_rejects_other_types():
    assert message_of(mwu.normalize_cluster_spec, ["w0:1"]) == (
        "`cluster_spec' should be dict or a `tf.train.ClusterSpec` or a "
        "`tf.train.ClusterDef` object"
    )


@pytest.mark.parametrize(
    ("cluster", "task_type", "task_id", "expected"),
    [
        (WITH_CHIEF, "chief", 0, True),
        (WITH_CHIEF, "worker", 0, False),
        (WITH_CHIEF, "ps", 0, False),
        (WITH_CHIEF, "evaluator", 0, True),
        (NO_CHIEF, "worker", 0, True),
        (NO_CHIEF, "worker", 1, False),
    ],
)
def test_is_chief(cluster, task_type, task_id, expected):
    assert mwu.is_chief(cluster, task_type, task_id) is expected


@pytest.mark.parametrize(
    ("cluster", "task_type", "task_id", "expected"),
    [
        (WITH_CHIEF, "chief", 0, 0),
        (WITH_CHIEF, "worker", 0, 1),
        (WITH_CHIEF, "worker", 1, 2),
        (WITH_CHIEF, "evaluator", 0, 0),
        (NO_CHIEF, "worker", 2, 2),
    ],
)
def test_id_in_cluster(cluster, task_type, task_id, expected):
    assert mwu.id_in_cluster(cluster, task_type, task_id) == expected


def test_id_in_cluster_has_no_id_for_ps():
    assert message_of(mwu.id_in_cluster, WITH_CHIEF, "ps", 0) == "There is no id for task_type 'ps'"


def test_worker_count():
    assert mwu.worker_count(WITH_CHIEF, "chief") == 3
    assert mwu.worker_count(WITH_CHIEF, "worker") == 3
    assert mwu.worker_count(WITH_CHIEF, "evaluator") == 1
    assert mwu.worker_count(NO_CHIEF, "worker") == 3
    assert message_of(mwu.worker_count, WITH_CHIEF, "ps") == "Unexpected `task_type` 'ps'"


def test_collective_leader():
    assert mwu.collective_leader({}, None, None) == ""
    assert mwu.collective_leader(WITH_CHIEF, "evaluator", 0) == ""
    assert mwu.collective_leader(WITH_CHIEF, "worker", 1) == "/job:chief/replica:0/task:0"
    assert mwu.collective_leader(NO_CHIEF, "worker", 2) == "/job:worker/replica:0/task:0"


def test_coordination_leader():
    assert mwu.coordination_leader({}) == ""
    assert mwu.coordination_leader(WITH_CHIEF) == "/job:ps/replica:0/task:0"
    assert mwu.coordination_leader({"chief": ["c0:1"], "worker": ["w0:1"]}) == (
        "/job:chief/replica:0/task:0"
    )
    assert mwu.coordination_leader(NO_CHIEF) == "/job:worker/replica:0/task:0"


def test_task_count():
    assert mwu.task_count(WITH_CHIEF, "worker") == 2
    assert mwu.task_count(NO_CHIEF, "ps") == 0
