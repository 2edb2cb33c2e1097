"""TensorFlow's Keras ``fit`` under its MultiWorkerMirroredStrategy, the workload of
``bench_keras.py`` (one TF_CONFIG task).

Run by ``bench_keras.py --tensorflow VENV`` with ``VENV/bin/python``, once per worker. The
Keras is ``tf_keras`` (TensorFlow's Keras 2): TensorFlow 2.21's bundled Keras 3 crashes under
MultiWorkerMirroredStrategy (keras-team/keras#20585, tensorflow/tensorflow#72388). RING
collectives, the model of ``keras_workload.keras_mlp`` built in ``strategy.scope()``, then
``model.fit(x, y, batch_size=GLOBAL, epochs=EPOCHS, verbose=0)`` on the same in-memory
arrays on every worker, once per window. Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from keras_workload import arrays, clock_callback, keras_mlp, rate_and_cpu

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=1)
p.add_argument("--global-batch", type=int, default=256)
p.add_argument("--examples", type=int, default=256 * 15)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--rounds", type=int, default=6, help="timed fit calls")
p.add_argument("--warmup", type=int, default=1, help="untimed fit calls first")
args = p.parse_args()

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

if args.threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
communication = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.RING
)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication)
with strategy.scope():
    model = keras_mlp(tf_keras)
x, y = arrays(args.examples)


def window() -> tuple[float, float, float]:
    clock = clock_callback(tf_keras)
    history = model.fit(
        x, y, batch_size=args.global_batch, epochs=args.epochs, verbose=0, callbacks=[clock]
    )
    rate, cpu = rate_and_cpu(clock.wall, clock.cpu)
    return rate, cpu, float(history.history["loss"][-1])


for _ in range(args.warmup):
    window()
timed = [window() for _ in range(args.rounds)]
print(
    "RESULT "
    + json.dumps(
        {
            "task": strategy.cluster_resolver.task_id,
            "tf_version": tf.__version__,
            "tf_keras_version": tf_keras.__version__,
            "windows": [rate for rate, _, _ in timed],
            "cpu_us": 1e6 * sum(cpu for _, cpu, _ in timed) / len(timed),
            "loss": round(timed[-1][2], 4),
        }
    ),
    flush=True,
)
time.sleep(2)  # let the peer finish its last RecvBuf before this task's server goes away
os._exit(0)
