"""What each replica is started with: command, $(VAR) expansion, environment, ports."""

from __future__ import annotations

import json
import sys

import pytest
from strategyjob.jobspec import load_manifest
from strategyjob.launcher import LaunchError, build_launches, expand, free_ports, local_cluster
from strategyjob.launcher._plan import ignored_template_fields


def make_job(containers_by_type, strategy="MultiWorkerMirroredStrategy"):
    replica_specs = {
        t: {"replicas": n, "template": {"spec": {"containers": containers}}}
        for t, (n, containers) in containers_by_type.items()
    }
    return load_manifest(
        {
            "apiVersion": "strategyjob.dev/v1alpha1",
            "kind": "StrategyJob",
            "metadata": {"name": "job"},
            "spec": {"strategy": strategy, "replicaSpecs": replica_specs},
        }
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)", "1"),
        ("x-$(A)-$(B)", "x-1-two"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$", "$"),
        ("cost $5", "cost $5"),
        ("$(A", "$(A"),
    ],
)
def test_expand_follows_kubernetes(text, expected):
    assert expand(text, {"A": "1", "B": "two"}) == expected


def test_free_ports_are_distinct():
    ports = free_ports(8)
    assert len(set(ports)) == 8
    assert all(1024 <= p < 65536 for p in ports)


def test_local_cluster_puts_every_replica_on_localhost():
    job = make_job(
        {
            "chief": (1, [{"name": "c", "command": ["x"]}]),
            "worker": (2, [{"name": "w", "command": ["x"]}]),
        }
    )
    cluster = local_cluster(job, ports=[5000, 5001, 5002])
    assert cluster == {
        "chief": ["127.0.0.1:5000"],
        "worker": ["127.0.0.1:5001", "127.0.0.1:5002"],
    }


def test_launch_of_each_replica(tmp_path):
    container = {
        "name": "strategyjob",
        "command": ["python", "train.py"],
        "args": ["--rank=$(RANK)", "--name=$(NAME)"],
        "env": [
            {"name": "NAME", "value": "$(STRATEGYJOB_JOB_NAME)-x"},
            {"name": "PLAIN", "value": "3"},
        ],
    }
    job = make_job({"worker": (2, [{"name": "sidecar", "command": ["no"]}, container])})
    cluster = local_cluster(job, ports=[6000, 6001])
    base = {"PATH": "/bin", "RANK": "99", "MASTER_PORT": "1", "HOME": "/root"}
    launches = build_launches(job, tmp_path, cluster, base_env=base)

    assert [launch.name for launch in launches] == ["worker-0", "worker-1"]
    second = launches[1]
    assert second.argv == (sys.executable, "train.py", "--rank=1", "--name=job-x")
    assert second.cwd == str(tmp_path.resolve())
    env = second.env
    assert env["PATH"] == "/bin" and env["HOME"] == "/root"
    assert env["PLAIN"] == "3"
    assert (env["RANK"], env["WORLD_SIZE"]) == ("1", "2")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "6000")
    assert env["PYTHONUNBUFFERED"] == "1"
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": ["127.0.0.1:6000", "127.0.0.1:6001"]},
        "task": {"type": "worker", "index": 1},
    }


def test_ps_and_evaluator_do_not_inherit_a_rank(tmp_path):
    c = [{"name": "strategyjob", "command": ["python", "x.py"]}]
    job = make_job(
        {"chief": (1, c), "worker": (1, c), "ps": (1, c), "evaluator": (1, c)},
        strategy="ParameterServerStrategy",
    )
    base = {"RANK": "5", "WORLD_SIZE": "9", "LOCAL_RANK": "0"}
    launches = build_launches(job, tmp_path, local_cluster(job), base_env=base)
    by_name = {launch.name: launch.env for launch in launches}
    for name in ("ps-0", "evaluator-0"):
        assert "RANK" not in by_name[name] and "WORLD_SIZE" not in by_name[name]
        assert "LOCAL_RANK" not in by_name[name]
    assert by_name["worker-0"]["RANK"] == "1"


def test_value_from_is_left_unset_and_named_once_for_the_job(tmp_path):
    """Not once per replica and restart: the launcher's one warning names it."""
    container = {
        "name": "strategyjob",
        "command": ["python", "x.py"],
        "env": [
            {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "PLAIN", "value": "1"},
        ],
    }
    job = make_job({"worker": (2, [container])})
    launches = build_launches(job, tmp_path, local_cluster(job), base_env={})
    assert [("SECRET" in launch.env, launch.env["PLAIN"]) for launch in launches] == [
        (False, "1"),
        (False, "1"),
    ]
    assert ignored_template_fields(job) == (["env SECRET's valueFrom (left unset)"], ["worker"])


def test_container_without_command_cannot_run_locally(tmp_path):
    job = make_job(
        {
            "chief": (1, [{"name": "strategyjob", "image": "trainer:1"}]),
            "worker": (1, [{"name": "strategyjob", "args": ["--x"]}]),
        }
    )
    with pytest.raises(LaunchError) as info:
        build_launches(job, tmp_path, local_cluster(job))
    assert str(info.value).splitlines() == [
        "spec.replicaSpecs.chief.template.spec.containers[0].command: strategyjob run needs a "
        'command to start the replica (got None). Add command: ["python", "train.py"].',
        "spec.replicaSpecs.worker.template.spec.containers[0].command: strategyjob run needs a "
        'command to start the replica (got None). Add command: ["python", "train.py"].',
    ]
