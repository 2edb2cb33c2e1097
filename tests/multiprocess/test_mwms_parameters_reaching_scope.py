"""MultiWorkerMirroredStrategy (2 processes over gloo): modules that reach ``scope()`` without
being built there — a deep copy, ``torch.load`` of a whole module, an optimizer created in scope
over a module built outside, parameters attached later — start from the chief's values and
train like one process on the global batch, although every worker drew different initial
weights; an optimizer over parameters of no strategy is refused on every worker."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _local_cluster import run_tasks

from ._cluster import cluster_of

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).resolve().parent / "mwms_scope_worker.py"


@pytest.mark.timeout(150)
def test_modules_reaching_scope_train_identically_on_every_worker():
    runs = run_tasks([sys.executable, str(WORKER)], cluster_of(2), timeout=120)
    for run in runs:
        assert run.returncode == 0, f"{run.task} exited {run.returncode}:\n{run.output[-4000:]}"
    results = [run.result for run in runs]
    assert [r["worker_index"] for r in results] == [0, 1]
    chief, worker = (r["routes"] for r in results)
    assert set(chief) == {
        "deepcopy_in_scope",
        "deepcopy_in_scope_optimizer_outside",
        "built_outside_optimizer_in_scope",
        "torch_load_in_scope",
        "parameters_added_later",
    }
    for name in chief:
        for r in (chief[name], worker[name]):
            assert r["max_abs_diff"] < 1e-5, (name, r)  # the one-process reference
        assert chief[name]["digest"] == worker[name]["digest"], name  # identical bytes
    assert chief["parameters_added_later"]["count"] == 7  # body 4 + head 2 + a free parameter
    for r in results:
        error = r["outside_error"]
        assert error is not None and "was not created in the distribution strategy scope" in error
        assert "MultiWorkerMirroredStrategy" in error
