"""The examples, applied with kubectl, train to the end: each job reaches Succeeded, its
logs show the loss going down, and ``kubectl get sjob`` shows it in the CRD's columns."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from e2e.e2e_support import (
    STEP_LINE,
    Namespace,
    assert_loss_goes_down,
    example,
    losses,
    wait_for,
)

pytestmark = pytest.mark.timeout(240)


def get_sjob(ns: Namespace, name: str) -> dict[str, str]:
    """``kubectl get sjob NAME`` (the short name) as ``{column: cell}``; the header must be
    NAME then the installed CRD's printer columns, Strategy, State, Ready and Age among
    them."""
    crd = json.loads(ns.cluster.kubectl("get", "crd", "strategyjobs.strategyjob.dev", "-o=json"))
    version = next(v for v in crd["spec"]["versions"] if v["storage"])
    columns = [
        c["name"].upper() for c in version["additionalPrinterColumns"] if not c.get("priority")
    ]
    assert {"STRATEGY", "STATE", "READY", "AGE"} <= set(columns), columns
    header, row = ns.cluster.kubectl("get", "sjob", name, "-n", ns.name).splitlines()
    assert header.split() == ["NAME", *columns], header
    starts = [header.index(column) for column in ["NAME", *columns]]
    cells = [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
    return dict(zip(["NAME", *columns], cells))


def assert_listed_as_succeeded(ns: Namespace, name: str, strategy: str, total: int) -> None:
    row = get_sjob(ns, name)
    assert (row["NAME"], row["STRATEGY"], row["STATE"]) == (name, strategy, "Succeeded"), row
    assert row["READY"] == f"0/{total}", row  # nothing runs once the job is over
    assert float(row["PROGRESS"]) == 100, row  # the leader's last report


def assert_progress_reached_the_status(ns: Namespace, name: str, steps: int) -> dict[str, Any]:
    """The leader's ``strategyjob.report`` went, with the pod's own ServiceAccount token,
    through the API server into the job's ``status.progress``."""

    def final() -> dict[str, Any] | None:
        progress = ns.job(name)["status"].get("progress") or {}
        return progress if progress.get("step") == steps else None

    progress = wait_for(f"status.progress of {name} at step {steps}", final, timeout=30)
    assert progress["totalSteps"] == steps and progress["percentage"] == 100.0, progress
    assert progress["metrics"]["loss"] > 0 and progress["lastReportTime"], progress
    return progress


def test_multi_worker_mirrored_example_succeeds(ns: Namespace, shared_dir: str):
    env = {"worker": {"EPOCHS": "4"}}
    spread = ns.cluster.kind is not None  # the workers on kind's two nodes
    ns.apply(example("digits_mwms", env=env, checkpoints=shared_dir, keep_pods=True, spread=spread))
    job = ns.wait_job("digits-mwms", "Succeeded", timeout=180)
    assert job["status"]["restartCount"] == 0
    if spread:
        nodes = {p.spec.node_name for p in ns.pods("digits-mwms")}
        assert len(nodes) == 2, nodes
    worker0, worker1 = ns.logs("digits-mwms-worker-0"), ns.logs("digits-mwms-worker-1")
    assert "2 replicas in sync, chief=True" in worker0
    assert "2 replicas in sync, chief=False" in worker1
    points = losses(worker0)
    assert [epoch for epoch, _ in points] == [1, 2, 3, 4]
    assert_loss_goes_down(points, "worker-0")
    # Gradients are averaged across the pods: both report the same global metrics.
    assert losses(worker1) == points
    assert "saved checkpoint" in worker0
    progress = assert_progress_reached_the_status(ns, "digits-mwms", 4)
    assert progress["metrics"]["loss"] == round(points[-1][1], 4), (progress, points)
    assert_listed_as_succeeded(ns, "digits-mwms", "MultiWorkerMirroredStrategy", 2)


def test_keras_example_succeeds(ns: Namespace, shared_dir: str):
    """Keras fit on two pods: the history's global figures, the same on both workers, and
    the model saved once, by worker 0, on the shared storage."""
    # One node: on kind, a job's NetworkPolicy (kube-router) refuses its worker-1 on the
    # control-plane node the connection to worker-0 on the other (test_tfjob.py).
    manifest = example(
        "digits_keras", env={"worker": {"EPOCHS": "4"}}, checkpoints=shared_dir, keep_pods=True
    )
    ns.apply(manifest)
    job = ns.wait_job("digits-keras", "Succeeded", timeout=180)
    assert job["status"]["restartCount"] == 0
    logs = [ns.logs(f"digits-keras-worker-{i}") for i in (0, 1)]
    for i, log in enumerate(logs):
        assert f"worker-{i}: 2 replicas in sync, Keras 3." in log, log
    points = losses(logs[0])
    assert [epoch for epoch, _ in points] == [1, 2, 3, 4]
    assert_loss_goes_down(points, "worker-0")
    # The whole epoch lines (loss, accuracy, test accuracy) are global: the same on both.
    epochs = [re.findall(r"^worker-\d: (epoch .*)$", log, re.MULTILINE) for log in logs]
    assert len(epochs[0]) == 4 and epochs[0] == epochs[1], epochs
    saved = f"{shared_dir}/{ns.name}/digits-keras/model.keras"
    assert f"worker-0: saved {saved}" in logs[0], logs[0]
    if ns.cluster.kind is not None:  # the chief's copy, the only one on the shared storage
        written = ns.cluster.kind.shared_dir / ns.name / ns.name / "digits-keras"
        assert sorted(p.name for p in written.iterdir()) == ["model.keras"]
    progress = assert_progress_reached_the_status(ns, "digits-keras", 4)
    assert progress["metrics"]["loss"] == round(points[-1][1], 4), (progress, points)
    assert_listed_as_succeeded(ns, "digits-keras", "MultiWorkerMirroredStrategy", 2)


def test_central_storage_example_succeeds(ns: Namespace):
    ns.apply(example("digits_central_storage", env={"worker": {"EPOCHS": "4"}}))
    ns.wait_job("digits-central-storage", "Succeeded", timeout=180)
    log = ns.logs("digits-central-storage-worker-0")
    assert "2 replicas on" in log
    points = losses(log)
    assert [epoch for epoch, _ in points] == [1, 2, 3, 4]
    assert_loss_goes_down(points, "worker-0")
    assert_listed_as_succeeded(ns, "digits-central-storage", "CentralStorageStrategy", 1)


def test_parameter_server_example_succeeds(ns: Namespace):
    ns.apply(example("digits_ps", env={"chief": {"STEPS": "150", "LOG_EVERY": "30"}}))
    ns.wait_job("digits-ps", "Succeeded", timeout=180)
    chief = ns.logs("digits-ps-chief-0")
    assert "coordinating 2 workers and 1 ps" in chief
    points = losses(chief, STEP_LINE)
    assert [step for step, _ in points] == [30, 60, 90, 120, 150]
    assert_loss_goes_down(points, "chief-0")
    assert "test accuracy" in chief
    assert_progress_reached_the_status(ns, "digits-ps", 150)
    assert_listed_as_succeeded(ns, "digits-ps", "ParameterServerStrategy", 4)
