"""Keras 3 ``fit`` / ``evaluate`` / ``predict`` of a model built in a 2-worker
MultiWorkerMirroredStrategy's scope (gloo), against plain Keras on the whole global batch in the
same process: same weights, history, metrics and predictions on every worker, the work split;
``keras.metrics`` in a custom loop read globally outside ``strategy.run``; a model built outside
every scope refused in one."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from _local_cluster import run_tasks

from ._cluster import cluster_of

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(
        importlib.util.find_spec("keras") is None,
        reason="needs the keras extra (pip install 'strategyjob[keras]')",
    ),
]

WORKER = Path(__file__).resolve().parent / "keras_worker.py"
BACKUP_WORKER = Path(__file__).resolve().parent / "keras_backup_worker.py"
ROWS = 9  # keras_worker.ROWS: global batches of 4, 4 and 1 rows
TIGHT = dict(rel=1e-5, abs=1e-6)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``shared/``: storage both workers write to; ``tmp/``: their TMPDIR."""
    root = tmp_path_factory.mktemp("keras")
    for name in ("shared", "tmp", "tensorboard"):
        (root / name).mkdir()
    return root


@pytest.fixture(scope="module")
def results(scratch: Path) -> list[dict]:
    env = {
        "KERAS_BACKEND": "torch",
        "KERAS_SAVE_DIR": str(scratch / "shared"),
        "TMPDIR": str(scratch / "tmp"),
        "KERAS_TENSORBOARD_DIR": str(scratch / "tensorboard"),
    }
    runs = run_tasks([sys.executable, str(WORKER)], cluster_of(2), timeout=120, extra_env=env)
    for run in runs:
        assert run.returncode == 0, f"{run.task} exited {run.returncode}:\n{run.output[-4000:]}"
    return sorted((run.result for run in runs), key=lambda r: r["worker"])


@pytest.mark.timeout(150)
def test_fit_matches_one_process_on_the_global_batch(results: list[dict]) -> None:
    chief, other = results
    assert chief["initial"] == other["initial"]  # the chief's draws, though the seeds differ
    for r in results:
        # Adam, sample weights, a last batch of one row (worker 1 has none): same update
        assert r["weights_diff"] < 1e-5
        assert r["history"].keys() == r["ref_history"].keys()
        for name, values in r["history"].items():
            # loss and metrics of the whole global batch, validation included, not local ones
            assert values == pytest.approx(r["ref_history"][name], **TIGHT), name
    assert chief["history"] == other["history"]


@pytest.mark.timeout(150)
def test_evaluate_and_predict_match_one_process(results: list[dict]) -> None:
    for r in results:
        assert r["evaluate"] == pytest.approx(r["ref_evaluate"], **TIGHT)
        # every row, in order, on every worker
        assert len(r["predict"]) == ROWS
        for row, ref_row in zip(r["predict"], r["ref_predict"]):
            assert row == pytest.approx(ref_row, **TIGHT)
    assert results[0]["evaluate"] == results[1]["evaluate"]
    assert results[0]["predict"] == results[1]["predict"]


@pytest.mark.timeout(150)
def test_class_weight_and_validation_split_match_one_process(results: list[dict]) -> None:
    for r in results:
        assert r["cls_weights_diff"] < 1e-5
        assert r["cls_history"].keys() == r["cls_ref_history"].keys()
        for name, values in r["cls_history"].items():
            assert values == pytest.approx(r["cls_ref_history"][name], **TIGHT), name


@pytest.mark.timeout(150)
def test_dict_inputs_and_two_outputs_match_one_process(results: list[dict]) -> None:
    for r in results:
        assert r["multi_weights_diff"] < 1e-5
        for name, values in r["multi_history"].items():
            assert values == pytest.approx(r["multi_ref_history"][name], **TIGHT), name
        for output, ref_output in zip(r["multi_predict"], r["multi_ref_predict"]):
            assert len(output) == ROWS
            for row, ref_row in zip(output, ref_output):
                assert row == pytest.approx(ref_row, **TIGHT)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("key", ["seen", "loader_seen"], ids=["arrays", "dataloader"])
def test_shuffled_fit_splits_every_global_batch(results: list[dict], key: str) -> None:
    """Each epoch (batches of 4, 4, 1), worker 0 trains on 2 + 2 + 1 rows and worker 1 on
    2 + 2 + 0: together every row once, though each worker holds all the data and shuffles
    (arrays, or a torch DataLoader of the global batch)."""
    seen = [r[key] for r in results]
    assert [len(s) for s in seen] == [10, 8]
    for epoch in range(2):
        rows = seen[0][epoch * 5 : epoch * 5 + 5] + seen[1][epoch * 4 : epoch * 4 + 4]
        assert sorted(rows) == list(range(ROWS)), f"epoch {epoch}: {rows}"


@pytest.mark.timeout(150)
def test_saves_are_written_once_by_the_chief(results: list[dict], scratch: Path) -> None:
    """model.save, save_weights and ModelCheckpoint on storage both workers share: one complete
    file each, loaded back on both workers; the other worker's temporary copies are gone."""
    expected = ["ckpt-1.weights.h5", "ckpt-2.weights.h5", "last.weights.h5", "model.keras"]
    for r in results:
        assert r["files"] == expected
        assert r["loaded_diff"] == 0.0
        assert r["checkpoint_diff"] == 0.0
    assert not [p.name for p in (scratch / "tmp").iterdir() if p.name.startswith("strategyjob")]


@pytest.mark.timeout(150)
def test_moving_statistics_stay_the_same_on_every_worker(results: list[dict]) -> None:
    """BatchNormalization's moving mean and variance, updated from each worker's own rows,
    take the workers' mean after each step (TF's MEAN-aggregated mirrored variables)."""
    chief, other = results
    assert chief["bn_weights"] == other["bn_weights"]
    moving_mean = chief["bn_weights"][2]
    assert any(value != 0.0 for value in moving_mean)  # they were updated


@pytest.mark.timeout(150)
def test_keras_tensorboard_is_written_by_the_chief_alone_with_the_global_loss(
    results: list[dict], scratch: Path
) -> None:
    """Both workers ran ``fit`` with a ``TensorBoard`` callback into one directory: one event
    file, the chief's, whose epoch curve is the history both workers report."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    chief, other = results
    assert chief["bn_loss"] == other["bn_loss"]
    (event_file,) = (scratch / "tensorboard" / "train").iterdir()
    assert event_file.name.startswith("events.out.tfevents.")
    events = EventAccumulator(str(event_file.parent), size_guidance={"tensors": 0})
    events.Reload()
    curve = [float(tensor_util.make_ndarray(e.tensor_proto)) for e in events.Tensors("epoch_loss")]
    assert curve == pytest.approx(chief["bn_loss"], rel=1e-6)


@pytest.mark.timeout(200)
def test_backup_and_restore_resumes_an_interrupted_job(tmp_path: Path) -> None:
    """BackupAndRestore on storage both workers share: a job that fails as epoch 3 begins
    leaves the chief's backup of epoch 2; run again, every worker resumes at epoch 3 with the
    same model, and the backup directory is removed at the end (once: no worker's cleanup
    fails on the other's), as are the other worker's temporary backups."""
    shared, scratch = tmp_path / "backup", tmp_path / "tmp"
    scratch.mkdir()
    env = {"KERAS_BACKEND": "torch", "KERAS_SAVE_DIR": str(shared), "TMPDIR": str(scratch)}
    phases = []
    for interrupt in ("1", ""):
        runs = run_tasks(
            [sys.executable, str(BACKUP_WORKER)],
            cluster_of(2),
            timeout=90,
            extra_env={**env, "INTERRUPT": interrupt},
        )
        for run in runs:
            assert run.returncode == 0, f"{run.task} exited {run.returncode}:\n{run.output[-4000:]}"
        phases.append([run.result for run in runs])
        if interrupt:
            assert sorted(p.name for p in shared.iterdir()) == [
                "latest.weights.h5",
                "training_metadata.json",
            ]
    interrupted, resumed = phases
    for r in interrupted:
        assert (r["interrupted"], r["epochs"]) == (True, [0, 1])
    for r in resumed:
        assert (r["interrupted"], r["epochs"]) == (False, [2, 3])
    assert resumed[0]["weights"] == resumed[1]["weights"]
    assert not shared.exists()
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("strategyjob")]


# --- keras.metrics in a custom loop (sync-on-read); a model built outside every scope ---
METRICS_WORKER = Path(__file__).resolve().parent / "keras_metrics_worker.py"


@pytest.fixture(scope="module")
def metrics_results() -> list[dict]:
    """``keras_metrics_worker``: metrics in a custom loop, a model built outside scope."""
    env = {"KERAS_BACKEND": "torch"}
    runs = run_tasks(
        [sys.executable, str(METRICS_WORKER)], cluster_of(2), timeout=90, extra_env=env
    )
    for run in runs:
        assert run.returncode == 0, f"{run.task} exited {run.returncode}:\n{run.output[-4000:]}"
    return sorted((run.result for run in runs), key=lambda r: r["worker"])


@pytest.mark.timeout(120)
def test_metric_result_is_global_outside_run(metrics_results: list[dict]) -> None:
    for r in metrics_results:
        for epoch in range(2):  # reset_state between epochs: each epoch's own global value
            assert r["in_scope"][epoch] == pytest.approx(r["reference"][epoch], abs=1e-6)
            assert r["outside"][epoch] == pytest.approx(r["reference"][epoch], abs=1e-6)
            assert r["mean"][epoch] == pytest.approx([r["ref_mean"][epoch]], abs=1e-6)
        assert r["local_kept"]  # a read leaves each worker's own counts in the variables
    # inside run each worker reads its own rows: 5 and 4 rows give different accuracies here
    assert metrics_results[0]["in_run"] != metrics_results[1]["in_run"]
    assert metrics_results[0]["in_run"][0] != metrics_results[0]["reference"][0]


@pytest.mark.timeout(120)
def test_model_built_outside_scope_is_refused_in_scope(metrics_results: list[dict]) -> None:
    for r in metrics_results:
        assert r["outside_error"] is not None
        assert "built outside every strategy's scope" in r["outside_error"]
        assert "inside `with strategy.scope():`" in r["outside_error"]
        assert len(r["inside_loss"]) == 1  # a model built in scope fits as before
