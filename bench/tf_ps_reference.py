"""TensorFlow's ParameterServerStrategy on the workload of bench_ps.py (benchmark c1 of
shared/reference/tf-baseline.md): 1 chief (coordinator) + W workers + P ps, local processes.

Run by ``bench_ps.py --tensorflow VENV`` with ``VENV/bin/python`` (needs only tensorflow-cpu).
Without ``--role`` it launches the ps and worker servers (``tf.distribute.Server``) and the
chief, prints the chief's ``RESULT {json}`` line and kills what it started. Model: a
100k x 64 embedding (``MinSizePartitioner``, at most ``--max-shards`` shards) -> mean over 8 ids
-> 64-256 ReLU -> 10, GradientTape, ``scatter_sub`` / ``assign_sub`` with lr 0.05, batch 256.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

p = argparse.ArgumentParser()
p.add_argument("--role", choices=["chief", "worker", "ps"], default=None)
p.add_argument("--index", type=int, default=0)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--ps", type=int, default=1)
p.add_argument("--vocab", type=int, default=100_000)
p.add_argument("--dim", type=int, default=64)
p.add_argument("--ids-per-example", type=int, default=8)
p.add_argument("--batch", type=int, default=256)
p.add_argument("--min-shard-bytes", type=int, default=256 << 10)
p.add_argument("--max-shards", type=int, default=2)
p.add_argument("--warmup", type=int, default=20)
p.add_argument("--steps", type=int, default=200)
p.add_argument("--timeout", type=int, default=300)
args = p.parse_args()


def launch() -> None:
    socks = [socket.socket() for _ in range(1 + args.workers + args.ps)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    addr = [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
    for s in socks:
        s.close()
    cluster = {
        "chief": addr[:1],
        "worker": addr[1 : 1 + args.workers],
        "ps": addr[1 + args.workers :],
    }
    logdir = tempfile.mkdtemp(prefix="tf_ps_")
    procs = []

    def spawn(kind: str, i: int) -> subprocess.Popen:
        env = dict(
            os.environ,
            TF_CPP_MIN_LOG_LEVEL="2",
            GRPC_FAIL_FAST="use_caller",
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": kind, "index": i}}),
        )
        cmd = [sys.executable, os.path.abspath(__file__), "--role", kind, "--index", str(i)]
        with open(os.path.join(logdir, f"{kind}{i}.log"), "w") as log:  # the child keeps it
            return subprocess.Popen(
                cmd + sys.argv[1:],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    try:
        for kind, n in (("ps", args.ps), ("worker", args.workers)):
            procs += [spawn(kind, i) for i in range(n)]
        chief = spawn("chief", 0)
        procs.append(chief)
        chief.wait(timeout=args.timeout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with open(os.path.join(logdir, "chief0.log")) as f:
        text = f.read()
    shutil.rmtree(logdir)
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    if not lines:
        print(text[-4000:])
        sys.exit(1)
    print(lines[-1], flush=True)


def server() -> None:
    import tensorflow as tf

    r = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    s = tf.distribute.Server(
        r.cluster_spec(), job_name=r.task_type, task_index=r.task_id, protocol="grpc", start=True
    )
    s.join()


def chief() -> None:
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=args.min_shard_bytes, max_shards=args.max_shards
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    V, D, lr = args.vocab, args.dim, 0.05
    with strategy.scope():
        emb = tf.Variable(lambda: tf.random.uniform([V, D], -0.05, 0.05, seed=1), name="emb")
        init = tf.keras.initializers.GlorotUniform(seed=0)
        w1 = tf.Variable(init([D, 256]), name="w1")
        b1 = tf.Variable(tf.zeros([256]), name="b1")
        w2 = tf.Variable(init([256, 10]), name="w2")
        b2 = tf.Variable(tf.zeros([10]), name="b2")
    emb_shards = list(emb.variables) if hasattr(emb, "variables") else [emb]
    dense = [w1, b1, w2, b2]

    def dataset_fn():
        ids = tf.random.uniform([args.batch, args.ids_per_example], 0, V, dtype=tf.int64, seed=2)
        labels = tf.random.uniform([args.batch], 0, 10, dtype=tf.int32, seed=3)
        return tf.data.Dataset.from_tensors((ids, labels)).repeat()

    per_worker_it = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def train_step(iterator):
        def step_fn(batch):
            ids, labels = batch
            with tf.GradientTape() as tape:
                e = tf.nn.embedding_lookup(emb, ids)
                h = tf.nn.relu(tf.matmul(tf.reduce_mean(e, 1), w1) + b1)
                logits = tf.matmul(h, w2) + b2
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
                )
            grads = tape.gradient(loss, emb_shards + dense)
            for v, g in zip(emb_shards + dense, grads):
                if isinstance(g, tf.IndexedSlices):
                    v.scatter_sub(tf.IndexedSlices(lr * g.values, g.indices, g.dense_shape))
                else:
                    v.assign_sub(lr * g)
            return loss

        return strategy.run(step_fn, args=(next(iterator),))

    for _ in range(args.warmup):
        rv = coordinator.schedule(train_step, args=(per_worker_it,))
    coordinator.join()
    loss0 = float(rv.fetch())
    t = time.perf_counter()
    for _ in range(args.steps):
        rv = coordinator.schedule(train_step, args=(per_worker_it,))
    coordinator.join()
    sps = args.steps / (time.perf_counter() - t)
    result = dict(
        bench="tf_ps",
        workers=args.workers,
        ps=args.ps,
        emb_shards=[(str(v.shape), v.device) for v in emb_shards],
        steps=args.steps,
        steps_per_s=round(sps, 2),
        loss_first=round(loss0, 4),
        loss_last=round(float(rv.fetch()), 4),
    )
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)


if args.role is None:
    launch()
elif args.role == "chief":
    chief()
else:
    server()
