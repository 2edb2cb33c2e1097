"""TensorFlow's MultiWorkerMirroredStrategy on the workload of bench_mwms.py (one TF_CONFIG task).

Run by ``bench_mwms.py --tensorflow VENV`` with ``VENV/bin/python``, once per worker, TF_CONFIG
set. MLP 784-512-512-10 (Glorot init), global batch 256, ``tf.function`` around
``strategy.run(step_fn)`` + ``strategy.reduce(SUM, loss)``; inside ``step_fn``: GradientTape,
``compute_average_loss``, ``ReplicaContext.all_reduce(SUM, grads)``, ``assign_sub``. RING
collectives (TF's CPU implementation). Then a 25 MB float32 all-reduce through
``ReplicaContext.all_reduce``. Prints one ``RESULT {json}`` line. Needs only tensorflow-cpu.

``--input dataset`` (``bench_loop.py``) feeds the steps the way TF users write it instead of one
fixed batch: ``strategy.experimental_distribute_dataset`` over a shuffled, batched
``tf.data.Dataset.from_tensor_slices`` of ``--examples`` synthetic examples (repeated), its
iterator passed to the ``tf.function``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=1)
p.add_argument("--global-batch", type=int, default=256)
p.add_argument("--warmup", type=int, default=10)
p.add_argument("--steps", type=int, default=350)
p.add_argument("--ar-floats", type=int, default=6_250_000)
p.add_argument("--ar-iters", type=int, default=20, help="0: no all-reduce timing")
p.add_argument("--input", choices=["fixed", "dataset"], default="fixed")
p.add_argument("--examples", type=int, default=256 * 40 + 100)
args = p.parse_args()

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

if args.threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
communication = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.RING
)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication)
task = strategy.cluster_resolver.task_id
n = strategy.num_replicas_in_sync

with strategy.scope():
    init = tf.keras.initializers.GlorotUniform(seed=0)
    sizes = [784, 512, 512, 10]
    weights = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        weights += [tf.Variable(init([fan_in, fan_out])), tf.Variable(tf.zeros([fan_out]))]


def forward(x: tf.Tensor) -> tf.Tensor:
    for k in range(0, len(weights), 2):
        x = tf.matmul(x, weights[k]) + weights[k + 1]
        if k + 2 < len(weights):
            x = tf.nn.relu(x)
    return x


tf.random.set_seed(task)
x = tf.random.normal([args.global_batch // n, 784])
y = tf.random.uniform([args.global_batch // n], maxval=10, dtype=tf.int32)


@tf.function
def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    def step_fn(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(y, forward(x))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.global_batch)
        grads = tape.gradient(loss, weights)
        grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
        for var, grad in zip(weights, grads):
            var.assign_sub(0.01 * grad)
        return loss

    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=(x, y)), None)


if args.input == "dataset":
    features = tf.random.stateless_normal([args.examples, 784], seed=[1234, 0])
    labels = tf.random.stateless_uniform([args.examples], [1234, 1], maxval=10, dtype=tf.int32)
    dataset = (
        tf.data.Dataset.from_tensor_slices((features, labels))
        .shuffle(args.examples, seed=0)
        .batch(args.global_batch)
        .repeat()
    )
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    @tf.function
    def dataset_step(iterator) -> tf.Tensor:
        return train_step(*next(iterator))

    def one_step() -> tf.Tensor:
        return dataset_step(iterator)
else:

    def one_step() -> tf.Tensor:
        return train_step(x, y)


for _ in range(args.warmup):
    loss_first = float(one_step())
start = time.perf_counter()
for _ in range(args.steps):
    loss = one_step()
loss_last = float(loss)
steps_per_s = args.steps / (time.perf_counter() - start)

big = tf.fill([args.ar_floats], float(task + 1))
device = strategy.extended.worker_devices[0]


def all_reduce_fn(t: tf.Tensor) -> tf.Tensor:
    with tf.device(device):  # a bare tf.function input has no device: TF needs one here
        t = tf.identity(t)
    return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, t)


@tf.function
def all_reduce(t: tf.Tensor) -> tf.Tensor:
    return strategy.run(all_reduce_fn, args=(t,))


times = [float("nan")]
for i in range(args.ar_iters + 3 if args.ar_iters else 0):
    begin = time.perf_counter()
    result = all_reduce(big)
    float(strategy.experimental_local_results(result)[0][0])
    if i == 3:
        times = []
    if i >= 3:
        times.append(time.perf_counter() - begin)
float(one_step())  # a last collective as a barrier before leaving
print(
    "RESULT "
    + json.dumps(
        {
            "task": task,
            "tf_version": tf.__version__,
            "steps_per_s": steps_per_s,
            "loss_first": loss_first,
            "loss_last": loss_last,
            "ar_med_s": statistics.median(times),
        }
    ),
    flush=True,
)
sys.stdout.flush()
time.sleep(2)  # let the peer finish its last RecvBuf before this task's server goes away
os._exit(0)
