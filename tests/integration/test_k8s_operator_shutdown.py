"""The operator exits promptly on SIGTERM (the kubelet's stop) and SIGINT (Ctrl-C) while
its jobs' daemons run, with status 0, and a peered replica leaves the peering first: a
rolling upgrade then overlaps two replicas for about a second, not for the pod's grace
period (the chart leaves it at the 30 s default). It used to hang until killed: kopf
waited for a ``concurrent.futures.Future`` stop flag in an executor thread that no signal
ended, and ``asyncio.run`` waits for that thread at exit. A bad setting hung it the same way:
it now exits 1 with one last line naming the setting."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any

import pytest
from integration_harness import Kube, OperatorProcess, create_peering, manifest

from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(180), pytest.mark.signal_timing]

#: Seconds the operator may take to exit after the signal (about 1 s alone; the margin is
#: for a loaded machine, and stays well under the pod's 30 s grace period).
EXIT_WITHIN = 5.0
PEERING = "sjob-shutdown"


def _peers(kube: Kube) -> dict[str, Any]:
    """The replicas that the KopfPeering object lists as alive."""
    peering = kube.custom.get_namespaced_custom_object(
        "kopf.dev", "v1", kube.ns, "kopfpeerings", PEERING
    )
    return dict(peering.get("status") or {})


@pytest.mark.parametrize(
    ("sig", "peered"), [(signal.SIGTERM, True), (signal.SIGINT, False)], ids=["TERM", "INT"]
)
def test_the_operator_with_running_jobs_exits_within_seconds_of_a_signal(
    own_kube: Kube, control_plane, sig: signal.Signals, peered: bool
) -> None:
    kube = own_kube
    if peered:
        create_peering(control_plane, kube.ns, PEERING)
    scope = (f"--peering={PEERING}",) if peered else ("--standalone",)
    op = OperatorProcess(control_plane, *scope, "-n", kube.ns).start()
    try:
        for name in ("a", "b"):
            kube.create_job(manifest(name, "MultiWorkerMirroredStrategy", {"worker": 2}))
        for name in ("a", "b"):  # each job's daemon runs: it created the pods
            kube.wait_pods(name, 2, timeout=90)
        if peered:
            wait_for("the operator in the peering", lambda: _peers(kube), timeout=30)
        assert op.proc is not None
        start = time.monotonic()
        op.proc.send_signal(sig)
        try:
            rc = op.proc.wait(30)  # a bound for the test; the assertion is EXIT_WITHIN
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - start
        assert rc == 0 and took <= EXIT_WITHIN, (
            f"exit status {rc} after {took:.1f}s (want 0 within {EXIT_WITHIN:g}s):\n"
            + op.output()[-3000:]
        )
        if peered:  # kopf took itself off the peering on the way out
            assert _peers(kube) == {}, _peers(kube)
    finally:
        op.kill()


def test_a_bad_setting_ends_the_operator_with_one_last_line(own_kube: Kube, control_plane) -> None:
    op = OperatorProcess(
        control_plane,
        "--standalone",
        "-n",
        own_kube.ns,
        env={"STRATEGYJOB_LOST_POD_SECONDS": "soon"},
    ).start()
    try:
        assert op.proc is not None
        try:
            rc = op.proc.wait(60)  # about 2 s alone; it hung until killed before
        except subprocess.TimeoutExpired:
            rc = None
        lines = [line for line in op.output().splitlines() if line.strip()]
        assert rc == 1, lines[-20:]
        assert lines[-1] == (
            "strategyjob-operator: STRATEGYJOB_LOST_POD_SECONDS='soon' is not a positive "
            "number of seconds: set it to e.g. 60."
        ), lines[-20:]
    finally:
        op.kill()
