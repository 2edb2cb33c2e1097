"""What a long job's metric history costs the cluster (issue 31): a 100k-step job reporting
``loss`` and ``accuracy`` at every step, its leader's annotation written every 100 steps (the
reporter's ``points_per_write``), each folded by the operator's own pure fold
(``strategyjob_operator.history.updated``, what a reconcile pass runs) into the JSON its
ConfigMap ``<job>-strategyjob-metrics`` holds.

Measured: the ConfigMap's size at the end (what etcd stores for it, less its metadata), the
points kept per metric, the fold's CPU time per annotation (median and worst over the run) and
the peak memory one fold allocates (tracemalloc: the operator keeps nothing between passes).
The reference is what TensorFlow users keep for the same curves: the TensorBoard event file of
every step of both metrics (written here with ``strategyjob.summary``, TF 2's format). The last
line is ``history: configmap_kb=… fold_ms=… peak_kb=… event_file_kb=… ratio=…`` (ratio: the
ConfigMap over the event file).

    python bench/bench_history.py          # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

from strategyjob_operator import history


def annotations(steps: int, every: int) -> list[dict]:
    """The leader's annotations: each the reports since the previous one."""
    out = []
    for end in range(every, steps + 1, every):
        points = [
            [s, {"loss": 2.5 * math.exp(-s / 20_000) + 0.05, "accuracy": 1 - math.exp(-s / 9_000)}]
            for s in range(end - every + 1, end + 1)
        ]
        out.append({"step": end, "metrics": points[-1][1], "points": points})
    return out


def event_file_bytes(steps: int) -> int:
    """The reference: every step of both metrics as TensorBoard scalars."""
    from strategyjob import summary

    with tempfile.TemporaryDirectory() as logdir:
        writer = summary.create_file_writer(logdir, max_queue=1000)
        with writer.as_default():
            for s in range(1, steps + 1):
                summary.scalar("loss", 2.5 * math.exp(-s / 20_000) + 0.05, step=s)
                summary.scalar("accuracy", 1 - math.exp(-s / 9_000), step=s)
        writer.close()
        return sum(p.stat().st_size for p in Path(logdir).iterdir())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=100, help="steps per annotation")
    args = parser.parse_args()

    text: str | None = None
    seconds: list[float] = []
    peak = 0
    for i, report in enumerate(annotations(args.steps, args.every)):
        measure_memory = i % 50 == 49  # tracemalloc slows the fold: only now and then
        if measure_memory:
            tracemalloc.start()
        started = time.process_time()
        new, warning = history.updated(text, report)
        elapsed = time.process_time() - started
        if measure_memory:
            peak = max(peak, tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        else:
            seconds.append(elapsed)
        assert warning is None, warning
        text = new if new is not None else text
    assert text is not None
    kept = {name: len(points) for name, points in json.loads(text)["series"].items()}
    configmap = len(text.encode())
    reference = event_file_bytes(args.steps)
    fold_ms = statistics.median(seconds) * 1000
    print(
        f"{args.steps} steps, an annotation every {args.every}: the ConfigMap holds "
        f"{configmap / 1000:.1f} KB ({', '.join(f'{n} {k} points' for n, k in kept.items())}); "
        f"a fold takes {fold_ms:.2f} ms of CPU (median; worst {max(seconds) * 1000:.2f} ms) "
        f"and allocates at most {peak / 1000:.0f} KB; TensorBoard's event file of every step: "
        f"{reference / 1000:.0f} KB"
    )
    print(
        f"history: configmap_kb={configmap / 1000:.1f} fold_ms={fold_ms:.2f} "
        f"peak_kb={peak / 1000:.0f} event_file_kb={reference / 1000:.0f} "
        f"ratio={configmap / reference:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
