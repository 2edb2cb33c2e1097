"""The images ``tools/images/build.sh`` builds start and do their work: the operator image runs
the operator against the local control plane, the worker image trains an example.

``tools/test.sh`` builds the images and names them in ``STRATEGYJOB_IMAGES`` (operator, worker);
without it these tests are skipped with the command that builds them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from integration_harness import manifest, wait_for

from tests.support.control_plane import REPO_ROOT, free_port

pytestmark = pytest.mark.images
EXAMPLES = REPO_ROOT / "examples"


@pytest.fixture(scope="module")
def images() -> tuple[str, str]:
    names = os.environ.get("STRATEGYJOB_IMAGES", "").split(",")
    if len(names) != 2 or not all(names):
        pytest.skip(
            "images not built: `bash tools/images/build.sh` builds them (tools/test.sh does)"
        )
    return names[0], names[1]


def _docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def container_name() -> Iterator[str]:
    """A unique container name; the container is removed whatever the test did."""
    name = f"sj-test-{uuid.uuid4().hex[:10]}"
    try:
        yield name
    finally:
        _docker("rm", "--force", name)


def _readable_dir(path: Path) -> Path:
    """``path`` created readable by the images' non-root user (uid 65532)."""
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    return path


@pytest.mark.timeout(360)
def test_worker_image_trains_the_mwms_example_with_strategyjob_run(
    images: tuple[str, str], container_name: str, tmp_path: Path
) -> None:
    job_dir = _readable_dir(tmp_path / "job")
    job = yaml.safe_load((EXAMPLES / "digits_mwms" / "job.yaml").read_text())
    container = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    for entry in container["env"]:
        if entry["name"] == "EPOCHS":
            entry["value"] = "2"
    (job_dir / "job.yaml").write_text(yaml.safe_dump(job))
    shutil.copy(EXAMPLES / "digits_mwms" / "train.py", job_dir / "train.py")
    for file in job_dir.iterdir():
        file.chmod(0o644)

    # No network but loopback: the two workers' gloo traffic stays inside the container.
    run = _docker(
        "run", "--name", container_name, "--network", "none", "-v", f"{job_dir}:/job:ro",
        images[1], "strategyjob", "run", "/job/job.yaml",
        timeout=300,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "job digits-mwms succeeded" in output, output[-4000:]
    assert "worker-1: epoch 2/2" in output, output[-4000:]


@pytest.mark.timeout(180)
def test_operator_image_runs_the_operator_against_the_control_plane(
    images: tuple[str, str], container_name: str, control_plane, own_kube, tmp_path: Path
) -> None:
    creds = _readable_dir(tmp_path / "kube")
    shutil.copy(control_plane.ca_path, creds / "ca.crt")
    kubeconfig = yaml.safe_load(control_plane.kubeconfig.read_text())
    kubeconfig["clusters"][0]["cluster"]["certificate-authority"] = "/kube/ca.crt"
    (creds / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    for file in creds.iterdir():
        file.chmod(0o644)

    started = _docker(
        "run", "--detach", "--name", container_name, "--network", "host",
        "-v", f"{creds}:/kube:ro", "-e", "KUBECONFIG=/kube/kubeconfig",
        "-e", f"STRATEGYJOB_METRICS_PORT={free_port()}",
        images[0], "--standalone", "--namespace", own_kube.ns,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr

    job = own_kube.create_job(manifest("image", "MultiWorkerMirroredStrategy", {"worker": 2}))

    def logs() -> str:
        out = _docker("logs", container_name)
        return out.stdout + out.stderr

    try:
        pods = own_kube.wait_pods("image", 2, timeout=90)
    except Exception:
        pytest.fail(f"the operator container created no pods; its log:\n{logs()[-4000:]}")
    for pod in pods.values():
        owner = pod.metadata.owner_references[0]
        assert (owner.kind, owner.uid) == ("StrategyJob", job["metadata"]["uid"])
    wait_for(
        "the job's Service",
        lambda: own_kube.core.read_namespaced_service("image", own_kube.ns),
        timeout=30,
    )
    state = _docker("inspect", "--format", "{{.State.Running}} {{.Config.User}}", container_name)
    assert state.stdout.split() == ["true", "65532:65532"], logs()[-4000:]
    assert "Traceback" not in logs()
