"""MultiWorkerMirroredStrategy, 2 workers over gloo: Python numbers, numpy values and nests
through ``all_reduce`` / ``all_gather`` / ``reduce`` / ``gather``, and training with
``strategyjob.nn`` losses equal to one process doing TensorFlow's math on the global batch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _local_cluster import run_tasks

from ._cluster import cluster_of

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).resolve().parent / "values_losses_worker.py"


@pytest.fixture(scope="module")
def results() -> list[dict]:
    runs = run_tasks([sys.executable, str(WORKER)], cluster_of(2), timeout=150)
    for run in runs:
        assert run.returncode == 0, f"{run.task} exited {run.returncode}:\n{run.output[-4000:]}"
    return [run.result for run in runs]


def _t(value: list | float, dtype: str) -> dict:
    return {"value": value, "dtype": dtype}


@pytest.mark.timeout(180)
def test_all_reduce_and_all_gather_of_python_values(results: list[dict]) -> None:
    for rep in (r["replica"] for r in results):
        assert rep["float"] == _t(2.0, "float32")  # TF: all_reduce("SUM", 1.0) is 2.0
        assert rep["int"] == _t(4, "int64")
        assert rep["np_scalar"] == _t(3.0, "float32")
        assert rep["np_array"] == _t([2.0, 4.0], "float64")
        assert rep["nest"] == {"a": _t(2.0, "float32"), "b": [_t(4, "int64"), _t(1, "int64")]}
        assert rep["int_mean"] == _t(1.5, "float64")  # a true division, never floored
        assert rep["gather"] == _t([0, 1], "int64")
        assert rep["gather_nest"] == {"x": [_t([[0.5, 0.5], [1.5, 1.5]], "float64")]}


@pytest.mark.timeout(180)
def test_reduce_and_gather_in_cross_replica_context(results: list[dict]) -> None:
    for r in results:
        assert r["reduce_sum_float"] == _t(2.0, "float32")  # TF testReduceHostTensor
        assert r["reduce_mean_int"] == _t(3.0, "float64")
        assert r["reduce_sum_axis"] == _t(6.0, "float32")  # each worker sums [1, 2] first
        assert r["reduce_mean_axis_ints"] == _t(1.5, "float64")
        assert r["reduce_mean_per_replica_ints"] == _t([1.5], "float64")
        # a nest from experimental_distribute_values_from_function: every leaf, every worker
        assert r["gather_nest"] == {
            "a": _t([0.0, 1.0], "float32"),
            "b": [_t([[1.0, 1.0]] * 3, "float32")],
        }
        assert r["reduce_nest_sum"] == {"a": _t([2.0], "float32"), "n": [_t(3, "int64")]}
        assert r["reduce_nest_mean_axis"] == {
            "a": _t(0.5, "float32"),
            "b": [_t([1.0, 1.0], "float32")],
        }
        assert r["local_results_nest"] == 1


@pytest.mark.timeout(180)
def test_training_with_nn_losses_matches_tf_math(results: list[dict]) -> None:
    for r in results:
        assert set(r["train"]) == {"11_gb", "11_default", "9_gb", "9_default"}
        for case, max_abs_diff in r["train"].items():
            assert max_abs_diff < 1e-12, (case, max_abs_diff)
