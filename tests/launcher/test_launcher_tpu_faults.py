"""The fault matrix of TPUStrategy under `strategyjob run`: two device processes (one replica
of two logical devices: DTensor transfers between them; or two replicas of one: gradient
all-reduces), worker 1 frozen, killed or never joining. TPUStrategy joins the cluster through
MultiWorkerMirroredStrategy's collective group; these tests show that its faults end as MWMS's
do, naming task 1 (docs/guide/faults.md)."""

from __future__ import annotations

import pytest

from tests.launcher.test_launcher_run import cli_env, write_job
from tests.support.launch import Launch

pytestmark = pytest.mark.timeout(150)

TASK1 = "/job:worker/replica:0/task:1"

# Worker 1 does FAULT after step 3 (stuck: step 25, once the job has some history; or,
# never-join, never builds the strategy).
WORKER = """
import os, signal, time
import strategyjob, torch
from strategyjob.cluster_resolver import TFConfigClusterResolver
from strategyjob.tpu.experimental import DeviceAssignment, initialize_tpu_system

L = int(os.environ["LOGICAL_DEVICES"])
fault = os.environ["FAULT"] if os.environ["STRATEGYJOB_REPLICA_INDEX"] == "1" else None
if fault == "never-join":
    time.sleep(300)
resolver = TFConfigClusterResolver()
topology = initialize_tpu_system(resolver)
assignment = DeviceAssignment.build(
    topology, computation_shape=[1, 1, 1, L], num_replicas=topology.num_tasks // L
)
strategy = strategyjob.TPUStrategy(resolver, experimental_device_assignment=assignment)
with strategy.scope():
    layer = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)


def step(x):
    optimizer.zero_grad()
    x_part = strategy.experimental_split_to_logical_devices(x, [1, L])
    w_part = strategy.experimental_split_to_logical_devices(layer.weight, [1, L])
    h = strategy.experimental_replicate_to_logical_devices(x_part @ w_part.t())
    loss = (h.full_tensor() + layer.bias).pow(2).mean()
    loss.backward()
    optimizer.step()
    return loss.detach()


for n in range(1, 100000):
    strategy.run(step, args=(torch.ones(2, 8),))
    print("STEP", n, flush=True)
    if n == 3 and fault == "freeze":
        os.kill(os.getpid(), signal.SIGSTOP)
    if n == 3 and fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if n == 25 and fault == "stuck":  # alive, answering, never in the next collective
        time.sleep(300)
    time.sleep(0.05)
"""

LAYOUTS = {"1x2": "2", "2x1": "1"}  # replicas x logical devices: LOGICAL_DEVICES


def run_tpu_job(tmp_path, layout: str, fault: str, **env: str) -> tuple[Launch, float]:
    """Run the job with worker 1's ``fault`` (restartPolicy Never); the launcher and how long
    after worker 1's third step the job failed."""
    manifest = write_job(
        tmp_path, {"worker": (2, WORKER)}, strategy="TPUStrategy", restart_policy="Never"
    )
    environment = cli_env() | {"LOGICAL_DEVICES": LAYOUTS[layout], "FAULT": fault, **env}
    launch = Launch(manifest, environment, "--grace-period", "5")
    try:
        assert launch.finish(120) == 1, launch.transcript
    finally:
        launch.stop()
    failed = launch.wait_line("strategyjob: job demo failed after ", 1)
    if fault == "never-join":
        return launch, failed - launch.lines[0][0]
    last = "[worker-1] STEP 25" if fault == "stuck" else "[worker-1] STEP 3"
    return launch, failed - launch.wait_line(last, 1)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_frozen_tpu_worker_fails_its_peer_naming_it(tmp_path, layout):
    """Frozen after step 3: its peer's next collective fails after the unresponsive grace (2 s
    here, STRATEGYJOB_UNRESPONSIVE_PEER_SECONDS; 30 s by default) with MWMS's error; in a
    logical-device transfer (DTensor's blocking wait) the watchdog ends the process with it
    (before: the peer waited for gloo's 30-minute timeout)."""
    launch, took = run_tpu_job(
        tmp_path, layout, "freeze", STRATEGYJOB_UNRESPONSIVE_PEER_SECONDS="2"
    )
    summary = launch.text[-2]
    during = "a logical-device collective" if layout == "1x2" else "gradient all-reduce"
    assert summary.endswith(
        f": worker-0 exited with code 1: {'[rank0]: ' if layout == '2x1' else ''}"
        f"strategyjob.errors.UnavailableError: cluster check alive failed, {TASK1} is down "
        f"(during {during})."
    ), launch.text
    assert launch.text[-1] == "strategyjob:   stopped: worker-1"
    print(f"{layout} frozen: job failed {took:.1f} s after the freeze")
    assert took < 20


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_killed_tpu_worker_is_named_at_once(tmp_path, layout):
    launch, took = run_tpu_job(tmp_path, layout, "kill")
    assert launch.text[-2].endswith(": worker-1 was killed by SIGKILL (exit code 137)")
    assert launch.text[-1] == "strategyjob:   stopped: worker-0"
    print(f"{layout} killed: job failed {took:.2f} s after the kill")
    assert took < 5


def test_a_tpu_worker_that_never_joins_is_named_at_the_rendezvous_timeout(tmp_path):
    launch, took = run_tpu_job(tmp_path, "1x2", "never-join", STRATEGYJOB_RENDEZVOUS_TIMEOUT="4")
    assert launch.text[-2].endswith(
        ": worker-0 exited with code 1: RuntimeError: Timeout waiting for the cluster, timeout "
        f"is 4 seconds; not joined: {TASK1}."
    ), launch.text
    print(f"never joins: job failed {took:.1f} s after the start")
    assert took < 40


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_stuck_tpu_worker_is_named_within_the_jobs_stuck_peer_bound(tmp_path, layout):
    """Alive but never reaching the next collective after step 25: its peer fails with MWMS's
    DeadlineExceededError naming it within the job's adaptive bound (4 s here,
    STRATEGYJOB_STUCK_PEER_SECONDS; 10 minutes by default), in a logical-device transfer (the
    watchdog, as for a lost peer) as in a gradient all-reduce; before, the transfer waited for
    gloo's 30-minute timeout."""
    launch, took = run_tpu_job(
        tmp_path,
        layout,
        "stuck",
        STRATEGYJOB_STUCK_PEER_SECONDS="4",
        STRATEGYJOB_STUCK_PEER_FACTOR="4",
    )
    summary = launch.text[-2]
    during = "a logical-device collective" if layout == "1x2" else "gradient all-reduce"
    assert (
        f": worker-0 exited with code 1: {'[rank0]: ' if layout == '2x1' else ''}"
        f"strategyjob.errors.DeadlineExceededError: Collective {during} did not complete: "
        f"Not arrived: {TASK1} (not in a collective for "
    ) in summary, launch.text
    print(f"{layout} stuck: job failed {took:.1f} s after the stall")
    assert 4 <= took < 20
