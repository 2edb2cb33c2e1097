"""One MultiWorkerMirroredStrategy task (TF_CONFIG set by the test): ``keras.metrics`` in a
custom loop with ``strategy.run``, and a Keras model built outside every scope fit inside one.

``python keras_metrics_worker.py`` prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import json

import keras  # KERAS_BACKEND=torch: set by the test, as a job's env sets it
import numpy as np
import strategyjob as sj
import torch

torch.set_num_threads(1)

ROWS, CLASSES = 9, 3  # worker 0 updates on 5 rows, worker 1 on 4: local accuracies differ


def _floats(value: object) -> list[float]:
    return np.asarray(keras.ops.convert_to_numpy(value), dtype="float64").reshape(-1).tolist()


def custom_loop_metrics(strategy: sj.MultiWorkerMirroredStrategy) -> dict:
    rng = np.random.default_rng(3)  # the same data on every worker
    logits = rng.normal(size=(2, ROWS, CLASSES)).astype("float32")
    labels = rng.integers(0, CLASSES, size=(2, ROWS))
    with strategy.scope():
        accuracy = keras.metrics.SparseCategoricalAccuracy()
        mean = keras.metrics.Mean()
    plain = keras.metrics.SparseCategoricalAccuracy()  # outside every scope: plain Keras
    result: dict = {"in_run": [], "in_scope": [], "outside": [], "reference": []}

    def step(epoch: int) -> None:
        worker = sj.get_replica_context().replica_id_in_sync_group
        mine = slice(worker, ROWS, 2)
        accuracy.update_state(labels[epoch, mine], logits[epoch, mine])
        mean.update_state(logits[epoch, mine, 0])
        result["in_run"].append(_floats(accuracy.result()))  # local, inside run

    for epoch in range(2):  # reset between epochs, as a custom loop does
        accuracy.reset_state()
        mean.reset_state()
        plain.reset_state()
        strategy.run(step, args=(epoch,))
        plain.update_state(labels[epoch], logits[epoch])
        local_variables = [_floats(v) for v in accuracy.variables]
        with strategy.scope():
            result["in_scope"].append(_floats(accuracy.result()))
        result["outside"].append(_floats(accuracy.result()))
        result["reference"].append(_floats(plain.result()))
        result["local_kept"] = local_variables == [_floats(v) for v in accuracy.variables]
        result.setdefault("mean", []).append(_floats(mean.result()))
        result.setdefault("ref_mean", []).append(float(np.mean(logits[epoch, :, 0])))
    return result


def built_outside_scope(strategy: sj.MultiWorkerMirroredStrategy) -> dict:
    x = np.ones((4, 3), "float32")
    y = np.zeros((4, 1), "float32")
    outside = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    outside.compile(optimizer="sgd", loss="mse")
    try:
        with strategy.scope():
            outside.fit(x, y, batch_size=2, epochs=1, verbose=0)
        error = None
    except RuntimeError as exc:
        error = str(exc)
    with strategy.scope():
        inside = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        inside.compile(optimizer="sgd", loss="mse")
        history = inside.fit(x, y, batch_size=2, epochs=1, verbose=0)
    return {"outside_error": error, "inside_loss": history.history["loss"]}


def main() -> None:
    strategy = sj.MultiWorkerMirroredStrategy()
    result = {"worker": strategy.cluster_resolver.task_id}
    result.update(custom_loop_metrics(strategy))
    result.update(built_outside_scope(strategy))
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
