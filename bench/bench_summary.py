"""What a training curve costs a training step: ``strategyjob.summary.scalar`` and
``strategyjob.report`` against the same step with neither, and ``tf.summary.scalar`` under
TensorFlow as the reference.

One process, one compute thread, alternating windows of 200 calls: an MLP training step
(784-256-10, batch 64, SGD), ``summary.scalar("loss", loss, step=step)`` of a step's 0-d loss
into a file writer (``as_default``), and ``report(step, loss=...)`` into a progress file (what
``strategyjob run`` gives a replica); the medians, and what one call adds to a step. With
``--tensorflow VENV`` the same is timed for TensorFlow's ``tf.summary.scalar`` (eager, a file
writer) in that virtual environment (which needs ``tensorboard``). The last line is
``microseconds: scalar=… report=… tf_scalar=… ratio=…`` (ratio: ours over TensorFlow's).

    python bench/bench_summary.py --tensorflow /tmp/venv-tf    # ~30 s
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WINDOW = 200
ROUNDS = 7

TF_SCRIPT = """
import json, statistics, tempfile, time
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
writer = tf.summary.create_file_writer(tempfile.mkdtemp())
loss = tf.constant(0.5)
def window():
    start = time.perf_counter()
    with writer.as_default():
        for step in range(%(window)d):
            tf.summary.scalar("loss", loss, step=step)
    return (time.perf_counter() - start) / %(window)d
window()
print(json.dumps(statistics.median(window() for _ in range(%(rounds)d))))
"""


def ours(logdir: str) -> tuple[float, float, float]:
    """Median seconds: a training step, one ``summary.scalar`` of its loss, one ``report``."""
    import strategyjob as sj
    import torch
    from strategyjob import summary

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    writer = summary.create_file_writer(logdir)
    loss = torch.tensor(0.5)
    step = 0

    def train_step() -> torch.Tensor:
        optimizer.zero_grad()
        out = torch.nn.functional.cross_entropy(model(x), y)
        out.backward()
        optimizer.step()
        return out.detach()

    def window(mode: str) -> float:
        """Seconds per call of ``mode``, over a window of calls."""
        nonlocal step, loss
        start = time.perf_counter()
        with writer.as_default():
            for _ in range(WINDOW):
                if mode == "step":
                    loss = train_step()
                elif mode == "scalar":
                    summary.scalar("loss", loss, step=step)
                elif mode == "report":
                    sj.report(step, loss=float(loss))
                step += 1
        return (time.perf_counter() - start) / WINDOW

    modes = ("step", "scalar", "report")
    for mode in modes:
        window(mode)  # warm up
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(ROUNDS):
        for mode in modes:
            times[mode].append(window(mode))
    step_s, scalar_s, report_s = (statistics.median(times[m]) for m in modes)
    return step_s, scalar_s, report_s


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tensorflow", metavar="VENV", help="also time tf.summary.scalar there")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["STRATEGYJOB_PROGRESS_FILE"] = str(Path(tmp) / "progress.jsonl")
        step_s, scalar_s, report_s = ours(str(Path(tmp) / "logs"))
    scalar_us, report_us = scalar_s * 1e6, report_s * 1e6
    print(
        f"a training step: {step_s * 1e3:.2f} ms; one scalar adds {scalar_us / (step_s * 1e6):.2%}"
        f" to it, one report {report_us / (step_s * 1e6):.2%}"
    )
    tf_us = None
    if args.tensorflow:
        python = Path(args.tensorflow) / "bin" / "python"
        code = TF_SCRIPT % {"window": WINDOW, "rounds": ROUNDS}
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
        out = subprocess.run(
            [str(python), "-c", code],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=True,
        )
        tf_us = json.loads(out.stdout.strip().splitlines()[-1]) * 1e6
    tail = f" tf_scalar={tf_us:.1f} ratio={scalar_us / tf_us:.2f}" if tf_us else ""
    print(f"microseconds: scalar={scalar_us:.1f} report={report_us:.1f}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
