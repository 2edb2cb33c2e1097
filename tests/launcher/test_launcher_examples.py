"""`strategyjob run` on the shipped examples: real training with the SDK's strategies."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]
EPOCH_LINE = re.compile(
    r"epoch (\d+)/(\d+): loss ([\d.]+), accuracy ([\d.]+), test accuracy ([\d.]+)"
)


def prepared_example(name: str, tmp_path: Path, epochs: int) -> Path:
    """A copy of the example whose checkpoint goes to ``tmp_path`` and which trains
    for ``epochs`` epochs."""
    shutil.copy(EXAMPLES / name / "train.py", tmp_path / "train.py")
    manifest = yaml.safe_load((EXAMPLES / name / "job.yaml").read_text())
    for spec in manifest["spec"]["replicaSpecs"].values():
        for container in spec["template"]["spec"]["containers"]:
            for entry in container.get("env", []):
                if entry["name"] == "CHECKPOINT_DIR":
                    entry["value"] = str(tmp_path / "checkpoints")
                if entry["name"] == "EPOCHS":
                    entry["value"] = str(epochs)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def run(manifest: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "sdk"), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    env.pop("TF_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "strategyjob", "run", str(manifest), "--grace-period", "5"],
        capture_output=True,
        text=True,
        env=env,
        timeout=200,
    )


def epochs_of(output: str, prefix: str) -> list[tuple[float, ...]]:
    rows = []
    for line in output.splitlines():
        if line.startswith(prefix) and (match := EPOCH_LINE.search(line)):
            rows.append(tuple(float(g) for g in match.groups()))
    return rows


def test_examples_are_valid_manifests():
    from strategyjob.jobspec import load_manifest_file

    mwms = load_manifest_file(EXAMPLES / "digits_mwms" / "job.yaml")
    assert (mwms.strategy, mwms.num_replicas("worker")) == ("MultiWorkerMirroredStrategy", 2)
    central = load_manifest_file(EXAMPLES / "digits_central_storage" / "job.yaml")
    assert (central.strategy, central.num_replicas("worker")) == ("CentralStorageStrategy", 1)


def test_multi_worker_mirrored_example(tmp_path):
    torch = pytest.importorskip("torch")
    result = run(prepared_example("digits_mwms", tmp_path, epochs=4))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    worker0 = epochs_of(result.stdout, "[worker-0]")
    worker1 = epochs_of(result.stdout, "[worker-1]")
    assert [row[0] for row in worker0] == [1, 2, 3, 4]
    # Both workers see the same global metrics (reduced across workers).
    assert worker0 == worker1
    first_loss, last_loss = worker0[0][2], worker0[-1][2]
    assert last_loss < first_loss / 2
    assert worker0[-1][4] > 0.85  # test accuracy
    assert "[worker-0] worker-0: saved checkpoint" in result.stdout
    assert "[worker-1] worker-1: saved checkpoint" not in result.stdout
    checkpoint = torch.load(tmp_path / "checkpoints" / "model.pt", weights_only=True)
    assert checkpoint["epochs"] == 4 and "0.weight" in checkpoint["model"]
    *_, succeeded, progress = result.stdout.splitlines()
    assert "strategyjob: job digits-mwms succeeded in" in succeeded
    # strategyjob.report on the leader reaches the launcher (the status line, then this line)
    assert re.fullmatch(
        r"strategyjob:   last progress report: step 4/4 \(100%\) loss=[\d.]+ test_accuracy=0\.9\d+",
        progress,
    ), progress


def test_central_storage_example(tmp_path):
    torch = pytest.importorskip("torch")
    result = run(prepared_example("digits_central_storage", tmp_path, epochs=4))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = epochs_of(result.stdout, "[worker-0]")
    assert [row[0] for row in rows] == [1, 2, 3, 4]
    assert rows[-1][2] < rows[0][2] / 2
    assert rows[-1][4] > 0.85
    assert "[worker-0] 2 replicas on" in result.stdout
    checkpoint = torch.load(tmp_path / "checkpoints" / "model.pt", weights_only=True)
    assert checkpoint["epochs"] == 4
    assert "strategyjob: job digits-central-storage succeeded in" in result.stdout


def test_tpu_example_splits_a_layer_across_logical_devices(tmp_path):
    """Four device processes = 2 replicas x 2 logical devices, all reporting the same
    global metrics: the split layer trains like the unsplit one."""
    pytest.importorskip("torch")
    result = run(prepared_example("digits_tpu", tmp_path, epochs=3))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[worker-3] worker-3: 2 replicas x 2 logical devices" in result.stdout
    rows = {w: epochs_of(result.stdout, f"[worker-{w}]") for w in range(4)}
    assert [row[0] for row in rows[0]] == [1, 2, 3]
    assert rows[0] == rows[1] == rows[2] == rows[3]
    assert rows[0][-1][2] < rows[0][0][2] / 2
    assert rows[0][-1][4] > 0.85
    assert "strategyjob: job digits-tpu succeeded in" in result.stdout


def test_parameter_server_example(tmp_path):
    """The chief coordinates, workers and ps serve; the launcher stops the servers once
    the chief succeeded."""
    pytest.importorskip("torch")
    shutil.copy(EXAMPLES / "digits_ps" / "train.py", tmp_path / "train.py")
    manifest = yaml.safe_load((EXAMPLES / "digits_ps" / "job.yaml").read_text())
    chief = manifest["spec"]["replicaSpecs"]["chief"]["template"]["spec"]["containers"][0]
    chief["env"] = [e for e in chief["env"] if e["name"] != "STEPS"]
    chief["env"].append({"name": "STEPS", "value": "90"})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(manifest))
    result = run(tmp_path / "job.yaml")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = [
        (int(m.group(1)), float(m.group(2)))
        for m in re.finditer(r"\[chief-0\] chief-0: step (\d+)/90: loss ([\d.]+)", result.stdout)
    ]
    assert [s for s, _ in steps] == [30, 60, 90]
    assert steps[-1][1] < steps[0][1]
    assert "[chief-0] chief-0: test accuracy" in result.stdout
    assert "strategyjob: job digits-ps succeeded in" in result.stdout
    assert "strategyjob:   last progress report: step 90/90 (100%) loss=" in result.stdout


def test_keras_example(tmp_path):
    """Keras fit of a model built in the scope: the global figures on both workers, training
    that learns, the model saved once (by worker 0) and loadable."""
    if importlib.util.find_spec("keras") is None:
        pytest.skip("needs the keras extra (pip install 'strategyjob[keras]')")
    result = run(prepared_example("digits_keras", tmp_path, epochs=3))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    worker0 = epochs_of(result.stdout, "[worker-0]")
    assert [row[0] for row in worker0] == [1, 2, 3]
    assert worker0 == epochs_of(result.stdout, "[worker-1]")  # global, not local, figures
    assert worker0[-1][2] < worker0[0][2]  # the loss falls
    assert worker0[-1][4] > 0.85  # test accuracy
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["model.keras"]
    assert "strategyjob: job digits-keras succeeded in" in result.stdout


@pytest.mark.parametrize(
    "name", ["digits_mwms", "digits_ps", "digits_central_storage", "digits_keras"]
)
def test_cluster_manifests_run_the_same_job(name):
    """``k8s.yaml`` is ``job.yaml`` for a cluster: valid, same strategy, replicas and
    commands (run from the worker image's copy of the example)."""
    from strategyjob.jobspec import load_manifest_file, training_container

    local = load_manifest_file(EXAMPLES / name / "job.yaml")
    cluster = load_manifest_file(EXAMPLES / name / "k8s.yaml")
    assert (cluster.name, cluster.strategy) == (local.name, local.strategy)
    for replica_type, spec in local.replica_specs.items():
        theirs = cluster.replica_specs[replica_type]
        assert theirs.replicas == spec.replicas
        container = training_container(theirs.template)
        assert container["command"] == training_container(spec.template)["command"]
        if container["command"][-1] == "train.py":
            assert container["workingDir"] == f"/opt/strategyjob/examples/{name}"


def test_tfjob_manifest_runs_the_multi_worker_example():
    """``tfjob_digits/tfjob.yaml`` is a TFJob the operator reads (two workers under
    MultiWorkerMirroredStrategy, Kubeflow's ``tensorflow`` container) running
    ``digits_mwms/k8s.yaml``'s training from the worker image."""
    from strategyjob.jobspec import load_manifest_file, load_tfjob, training_container

    tfjob = load_tfjob(yaml.safe_load((EXAMPLES / "tfjob_digits" / "tfjob.yaml").read_text()))
    mwms = load_manifest_file(EXAMPLES / "digits_mwms" / "k8s.yaml")
    assert (tfjob.job.strategy, tfjob.job.replicas()) == (mwms.strategy, mwms.replicas())
    ours = training_container(tfjob.job.replica_specs["worker"].template)
    theirs = training_container(mwms.replica_specs["worker"].template)
    assert ours["name"] == "tensorflow"
    fields = ("image", "workingDir", "command")
    assert {f: ours[f] for f in fields} == {f: theirs[f] for f in fields}
