"""StrategyJob.build renders the manifest a user would write, validated by jobspec with
the same messages as a YAML file; to_manifest renders any job back."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from strategyjob import jobspec
from strategyjob.client import ManifestError, StrategyJob
from strategyjob.jobspec import messages as msg

REPO = Path(__file__).resolve().parents[3]
CMD = ["python", "train.py"]
SERVER = ["python", "-m", "strategyjob.server"]


def containers(manifest, replica_type):
    return manifest["spec"]["replicaSpecs"][replica_type]["template"]["spec"]["containers"]


def test_mwms_default_renders_the_manifest_a_user_writes():
    job = StrategyJob.build(
        "mnist", strategy="MultiWorkerMirroredStrategy", image="reg/mnist:1", command=CMD
    )
    assert job.to_manifest() == {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": "mnist"},
        "spec": {
            "strategy": "MultiWorkerMirroredStrategy",
            "replicaSpecs": {
                "worker": {
                    "replicas": 2,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "strategyjob", "image": "reg/mnist:1", "command": CMD}
                            ]
                        }
                    },
                }
            },
        },
    }
    assert isinstance(job, jobspec.StrategyJob)  # the one model, not a second definition
    assert job.replicas() == [("worker", 0), ("worker", 1)]
    assert job.namespace == "default"


def test_parameter_server_gets_a_chief_running_the_command_and_servers_elsewhere():
    job = StrategyJob.build(
        "ctr",
        strategy="ParameterServerStrategy",
        image="img",
        command=CMD,
        workers=3,
        gpus_per_worker=2,
        env={"EPOCHS": 8, "DEBUG": True, "NAME": "x"},
    )
    m = job.to_manifest()
    assert list(m["spec"]["replicaSpecs"]) == ["chief", "worker", "ps"]
    assert job.num_replicas("chief") == 1
    assert job.num_replicas("worker") == 3
    assert job.num_replicas("ps") == 1  # auto: one ps under ParameterServerStrategy
    (chief,) = containers(m, "chief")
    (worker,) = containers(m, "worker")
    (ps,) = containers(m, "ps")
    assert chief["command"] == CMD
    assert worker["command"] == SERVER and ps["command"] == SERVER
    # the workers compute; the coordinator and the ps do not get GPUs
    assert worker["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    assert "resources" not in chief and "resources" not in ps
    expected_env = [
        {"name": "EPOCHS", "value": "8"},
        {"name": "DEBUG", "value": "true"},
        {"name": "NAME", "value": "x"},
    ]
    assert chief["env"] == worker["env"] == ps["env"] == expected_env
    assert {c["name"] for r in ("chief", "worker", "ps") for c in containers(m, r)} == {
        "strategyjob"
    }


def test_mwms_with_a_chief_gives_it_the_command_and_gpus():
    job = StrategyJob.build(
        "m",
        strategy="MultiWorkerMirroredStrategy",
        image="img",
        command=CMD,
        chief=True,
        gpus_per_worker=1,
        resources={"requests": {"cpu": "2"}, "limits": {"memory": "4Gi"}},
    )
    m = job.to_manifest()
    for replica_type in ("chief", "worker"):
        (c,) = containers(m, replica_type)
        assert c["command"] == CMD
        assert c["resources"] == {
            "requests": {"cpu": "2"},
            "limits": {"memory": "4Gi", "nvidia.com/gpu": 1},
        }
    assert "ps" not in m["spec"]["replicaSpecs"]


@pytest.mark.parametrize("strategy", ["MirroredStrategy", "OneDeviceStrategy"])
def test_single_process_strategies_default_to_one_worker(strategy):
    job = StrategyJob.build("one", strategy=strategy, image="img", command=CMD)
    assert job.replicas() == [("worker", 0)]


def test_run_policy_and_spec_fields_render_only_when_not_default():
    job = StrategyJob.build(
        "p",
        strategy="MultiWorkerMirroredStrategy",
        image="img",
        command=CMD,
        namespace="team-a",
        restart_policy="OnFailure",
        backoff_limit=2,
        active_deadline_seconds=3600,
        ttl_seconds_after_finished=60,
        clean_pod_policy="All",
        success_policy="AllWorkers",
        port=3333,
        labels={"team": "a"},
        evaluator=True,
    )
    m = job.to_manifest()
    assert m["metadata"] == {"name": "p", "namespace": "team-a", "labels": {"team": "a"}}
    assert m["spec"]["runPolicy"] == {
        "backoffLimit": 2,
        "activeDeadlineSeconds": 3600,
        "ttlSecondsAfterFinished": 60,
        "cleanPodPolicy": "All",
    }
    assert m["spec"]["successPolicy"] == "AllWorkers" and m["spec"]["port"] == 3333
    specs = m["spec"]["replicaSpecs"]
    assert {t: s["restartPolicy"] for t, s in specs.items()} == {
        "worker": "OnFailure",
        "evaluator": "OnFailure",
    }
    assert job.run_policy.backoff_limit == 2 and job.port == 3333

    plain = StrategyJob.build(
        "p", strategy="MultiWorkerMirroredStrategy", image="i", command=CMD, backoff_limit=6
    ).to_manifest()
    assert "runPolicy" not in plain["spec"]  # 6 is the default: not written
    assert "restartPolicy" not in plain["spec"]["replicaSpecs"]["worker"]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"strategy": "MultiWorkerMirroredStrategy", "ps": 1},
            msg.TAKES_NO_PS.format(value="1", strategy="MultiWorkerMirroredStrategy"),
        ),
        ({"strategy": "ParameterServerStrategy", "chief": False}, msg.PS_NEEDS_CHIEF),
        ({"strategy": "ParameterServerStrategy", "ps": 0}, msg.PS_NEEDS_PS),
        ({"strategy": "TPUStrategy", "chief": True}, msg.TPU_WORKERS_ONLY),
        ({"strategy": "NoSuchStrategy"}, msg.UNKNOWN_STRATEGY),
    ],
)
def test_bad_builds_fail_locally_with_the_manifest_messages(kwargs, expected):
    with pytest.raises(ManifestError) as info:
        StrategyJob.build("bad", image="img", command=CMD, **kwargs)
    head = expected.split("(got")[0]
    assert any(p.startswith(head) for p in info.value.problems), info.value.problems


def test_bad_build_message_is_exactly_the_yaml_files_message(tmp_path):
    with pytest.raises(ManifestError) as built:
        StrategyJob.build("Bad_Name", strategy="MirroredStrategy", image="i", command=CMD)
    manifest = {
        "apiVersion": "strategyjob.dev/v1alpha1",
        "kind": "StrategyJob",
        "metadata": {"name": "Bad_Name"},
        "spec": {
            "strategy": "MirroredStrategy",
            "replicaSpecs": {
                "worker": {
                    "replicas": 1,
                    "template": {"spec": {"containers": [{"name": "strategyjob"}]}},
                }
            },
        },
    }
    with pytest.raises(ManifestError) as loaded:
        jobspec.load_manifest(manifest)
    assert built.value.problems == loaded.value.problems
    assert built.value.problems == [msg.BAD_NAME.format(value='"Bad_Name"')]


def test_arguments_no_manifest_can_express_are_reported_together():
    with pytest.raises(ManifestError) as info:
        StrategyJob.build(
            "x",
            strategy="MultiWorkerMirroredStrategy",
            image="",
            command="python train.py",
            gpus_per_worker=-1,
        )
    problems = info.value.problems
    assert [p.split(":")[0] for p in problems] == ["image", "command", "gpus_per_worker"]
    assert "command=['python', 'train.py']" in problems[1]


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*/job.yaml")), ids=str)
def test_examples_render_back_to_what_their_authors_wrote(path):
    written = yaml.safe_load(path.read_text())
    job = jobspec.load_manifest(written)
    assert job.to_manifest() == written
    assert jobspec.load_manifest(job.to_manifest()) == job


def test_to_manifest_round_trips_every_field():
    job = StrategyJob.build(
        "rt",
        strategy="ParameterServerStrategy",
        image="img",
        command=CMD,
        namespace="ml",
        workers=4,
        ps=2,
        evaluator=True,
        gpus_per_worker=1,
        restart_policy="ExitCode",
        backoff_limit=0,
        active_deadline_seconds=10,
        annotations={"a": "b"},
    )
    assert jobspec.load_manifest(job.to_manifest()) == job
