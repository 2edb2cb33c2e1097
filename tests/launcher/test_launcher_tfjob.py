"""`strategyjob run` of a Kubeflow TFJob manifest: its ``tensorflow`` containers run as any
replica's, with ``TF_CONFIG`` as training-operator writes it (on 127.0.0.1) and the SDK's
variables beside it, so a two-worker job all-reduces through the SDK to success."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.launcher.test_launcher_run import cli_env, run_cli

pytestmark = pytest.mark.timeout(150)

SCRIPT = """
import json, os, torch
import strategyjob as sj

print("TF_CONFIG", os.environ["TF_CONFIG"])
strategy = sj.MultiWorkerMirroredStrategy()
rank = int(os.environ["RANK"])
total = strategy.reduce(
    "SUM", strategy.run(lambda: torch.tensor(float(rank + 1))), axis=None
)
print("sum", float(total), "replicas", strategy.num_replicas_in_sync)
"""


def write_tfjob(directory: Path, **spec_extra) -> Path:
    (directory / "train.py").write_text(textwrap.dedent(SCRIPT))
    sidecar = {"name": "sidecar", "image": "busybox", "command": ["false"]}
    tensorflow = {"name": "tensorflow", "image": "tf:2", "command": ["python", "train.py"]}
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "tfdemo"},
        "spec": {
            "tfReplicaSpecs": {
                "worker": {  # any case, as training-operator accepts it
                    "replicas": 2,
                    "template": {"spec": {"containers": [sidecar, tensorflow]}},
                }
            },
            **spec_extra,
        },
    }
    path = directory / "tfjob.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return path


def test_two_worker_tfjob_runs_its_tensorflow_containers_to_success(tmp_path):
    result = run_cli(write_tfjob(tmp_path), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    configs = {
        line.split("]", 1)[0][1:]: line.split(" TF_CONFIG ", 1)[1]
        for line in lines
        if " TF_CONFIG " in line
    }
    assert set(configs) == {"worker-0", "worker-1"}
    addresses = json.loads(configs["worker-0"])["cluster"]["worker"]
    assert [a.split(":")[0] for a in addresses] == ["127.0.0.1", "127.0.0.1"]
    for index in (0, 1):
        # Byte for byte training-operator's form: cluster, task (lowercased type), environment.
        assert configs[f"worker-{index}"] == (
            f'{{"cluster":{{"worker":{json.dumps(addresses, separators=(",", ":"))}}},'
            f'"task":{{"type":"worker","index":{index}}},"environment":"cloud"}}'
        )
        assert f"[worker-{index}] sum 3.0 replicas 2" in lines
    assert lines[0] == (  # the sidecar runs only on a cluster
        "strategyjob: warning: strategyjob run ignores what only a cluster applies in the pod "
        "templates of worker: other containers (sidecar); every replica runs in "
        f"{tmp_path.resolve()}, with this machine's files, user and resources"
    )
    assert lines[1].startswith("strategyjob: job tfdemo [MultiWorkerMirroredStrategy] starting")
    assert lines[-1].startswith("strategyjob: job tfdemo succeeded in ")


def test_invalid_tfjob_starts_nothing_and_names_the_tfjob_field(tmp_path):
    path = write_tfjob(tmp_path, runPolicy={"managedBy": "someone-else"})
    result = run_cli(path, timeout=30)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"strategyjob run: error: {path}: spec.runPolicy.managedBy: unknown controller "
        '(got "someone-else"). Use kubeflow.org/training-operator, '
        "kueue.x-k8s.io/multikueue, or leave it unset."
    ]


def write_one_replica_tfjob(directory: Path, source: str, metadata: dict) -> Path:
    """A TFJob of one Worker running ``python one.py`` with ``source``."""
    (directory / "one.py").write_text(source)
    container = {"name": "tensorflow", "image": "tf:2", "command": ["python", "one.py"]}
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": metadata,
        "spec": {"tfReplicaSpecs": {"Worker": {"template": {"spec": {"containers": [container]}}}}},
    }
    path = directory / "tfjob.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def test_one_replica_tfjob_gets_no_tf_config_even_from_the_launcher(tmp_path):
    source = 'import os\nprint("TF_CONFIG", os.environ.get("TF_CONFIG"))\n'
    path = write_one_replica_tfjob(tmp_path, source, {"name": "single"})
    env = {**cli_env(), "TF_CONFIG": '{"cluster": {"worker": ["elsewhere:1"]}}'}
    result = run_cli(path, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[worker-0] TF_CONFIG None" in result.stdout.splitlines()


def test_a_tfjob_named_by_generate_name_runs_under_a_generated_name(tmp_path):
    """Kubeflow's guide writes ``generateName`` (for ``kubectl create``): run names the job as
    the API server would, the prefix and five characters, instead of asking for a name."""
    path = write_one_replica_tfjob(tmp_path, "print('ran')\n", {"generateName": "mnist-"})
    result = run_cli(path, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.splitlines()[-1]
    generated = r"mnist-[bcdfghjklmnpqrstvwxz2456789]{5}"
    assert re.fullmatch(rf"strategyjob: job {generated} succeeded in .*", last), last


def test_under_enable_dynamic_worker_a_failing_worker_restarts_alone_and_never_fails_the_job(
    tmp_path,
):
    """As the operator serves it (training-operator ignores a dynamic worker's failures): the
    worker is restarted alone while its policy allows, then given up; the chief is never
    restarted and its success is the job's."""
    (tmp_path / "chief.py").write_text(
        textwrap.dedent(
            """
            import pathlib, time
            pathlib.Path("chief-starts").open("a").write("x")
            starts = pathlib.Path("worker-starts")
            deadline = time.monotonic() + 60
            while not (starts.exists() and starts.read_text() == "xx"):
                assert time.monotonic() < deadline, "worker-1 was not restarted"
                time.sleep(0.05)
            """
        )
    )
    (tmp_path / "worker.py").write_text(
        textwrap.dedent(
            """
            import os, pathlib
            if os.environ["STRATEGYJOB_REPLICA_INDEX"] == "1":
                pathlib.Path("worker-starts").open("a").write("x")
                raise RuntimeError("worker-1 lost its node")
            """
        )
    )

    def replica(script: str, count: int) -> dict:
        container = {"name": "tensorflow", "image": "tf:2", "command": ["python", script]}
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [container]}},
        }

    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "dyn"},
        "spec": {
            "enableDynamicWorker": True,
            "runPolicy": {"backoffLimit": 1},
            "tfReplicaSpecs": {"Chief": replica("chief.py", 1), "Worker": replica("worker.py", 2)},
        },
    }
    path = tmp_path / "tfjob.yaml"
    path.write_text(yaml.safe_dump(manifest))
    result = run_cli(path, "--grace-period", "5", timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    failed = "strategyjob: worker-1 exited with code 1: RuntimeError: worker-1 lost its node"
    assert (
        f"{failed}; restarting worker-1 alone (under enableDynamicWorker a worker never fails "
        "the TFJob: restart 1 of 1, not counted against the job's backoffLimit)" in lines
    ), result.stdout
    assert any(
        line.startswith(f"{failed}; it was restarted 1 times")
        and "The job goes on without it" in line
        for line in lines
    ), result.stdout
    assert (tmp_path / "chief-starts").read_text() == "x"
    assert (tmp_path / "worker-starts").read_text() == "xx"
    assert lines[-1].startswith("strategyjob: job dyn succeeded in ")
