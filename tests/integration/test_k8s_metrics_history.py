"""A cluster job's metric history (issue 31) against a real API server and the operator: the
leader's progress annotations (each carrying the reports since the previous one, as the SDK's
reporter writes them) are folded into the ConfigMap ``<job>-strategyjob-metrics``, read back
through ``StrategyJobClient.metrics`` and ``strategyjob metrics NAME``; an operator restarted
in between continues the history; a restart's earlier steps replace its tail. The directory
the leader writes summaries to reaches ``status.progress.logdir`` for ``strategyjob
tensorboard NAME``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from integration_harness import OperatorProcess, manifest, wait_for
from strategyjob.client import StrategyJobClient
from strategyjob.errors import JobNotFoundError
from test_k8s_client import cli

pytestmark = pytest.mark.timeout(150)


def annotate(
    kube, step: int, points: list[tuple[int, float]], when: str, logdir: str | None = None
) -> None:
    report: dict[str, Any] = {
        "step": step,
        "totalSteps": 100,
        "time": when,
        "metrics": {"loss": points[-1][1], "phase": "train"},
        "points": [[s, {"loss": v, "phase": "train"}] for s, v in points],
    }
    if logdir is not None:
        report["logdir"] = logdir
    body = {"metadata": {"annotations": {"strategyjob.dev/progress": json.dumps(report)}}}
    kube.core.patch_namespaced_pod("hist-worker-0", kube.ns, body)


def history(client: StrategyJobClient, last_step: int) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        series = client.metrics("hist")
        loss = series.get("loss") or []
        return series if loss and loss[-1][0] == last_step else None

    return wait_for(f"the history up to step {last_step}", reached)


def test_reports_become_a_history_read_by_the_client_and_the_cli(control_plane, own_kube, tmp_path):
    kube = own_kube
    operator = OperatorProcess(control_plane, "--standalone", "-n", kube.ns).start()
    try:
        kube.create_job(manifest("hist", "MultiWorkerMirroredStrategy", {"worker": 1}))
        kube.wait_pods("hist", 1)
        kube.set_phase("hist-worker-0", "Running")
        with StrategyJobClient(kubeconfig=control_plane.kubeconfig, namespace=kube.ns) as client:
            assert client.metrics("hist") == {}  # no report yet
            with pytest.raises(JobNotFoundError):
                client.metrics("nope")
            annotate(kube, 3, [(1, 0.9), (2, 0.8), (3, 0.7)], "2026-11-29T10:00:00Z")
            assert history(client, 3) == {"loss": [(1, 0.9), (2, 0.8), (3, 0.7)]}
            # an operator restarted between two reports continues the history
            operator.stop()
            annotate(kube, 5, [(4, 0.6), (5, 0.5)], "2026-11-29T10:00:10Z")
            operator = OperatorProcess(control_plane, "--standalone", "-n", kube.ns).start()
            assert history(client, 5)["loss"] == [(1, 0.9), (2, 0.8), (3, 0.7), (4, 0.6), (5, 0.5)]
            # the job restarted from its checkpoint at step 2: the tail from step 3 is replaced
            annotate(kube, 3, [(3, 0.65)], "2026-11-29T10:01:00Z")
            assert history(client, 3)["loss"] == [(1, 0.9), (2, 0.8), (3, 0.65)]
            cm = kube.core.read_namespaced_config_map("hist-strategyjob-metrics", kube.ns)
            assert cm.metadata.owner_references[0].name == "hist"  # goes with the job

        done = cli(control_plane, kube, "metrics", "hist", "--csv")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["step,loss", "1,0.9", "2,0.8", "3,0.65"]
        table = cli(control_plane, kube, "metrics", "hist")
        assert table.returncode == 0 and "0.65" in table.stdout, table.stderr
        # strategyjob tensorboard: no logdir reported yet, then one the API cannot exec into
        # (this control plane has no kubelet)
        copy = ["tensorboard", "hist", "--copy-only", "--copy-to", str(tmp_path / "copy")]
        unsaid = cli(control_plane, kube, *copy)
        assert unsaid.returncode == 2, unsaid.stderr
        assert "StrategyJob hist has not said where it writes summaries" in unsaid.stderr
        annotate(kube, 4, [(4, 0.6)], "2026-11-29T10:02:00Z", logdir="/workspace/logs")
        wait_for(
            "status.progress.logdir",
            lambda: kube.job("hist")["status"]["progress"].get("logdir") == "/workspace/logs",
        )
        unreachable = cli(control_plane, kube, *copy)
        assert unreachable.returncode == 1, unreachable.stderr
        assert unreachable.stderr.strip() == (
            "strategyjob tensorboard: error: cannot run tar in pod hist-worker-0: pod "
            "hist-worker-0 does not have a host assigned"
        )
        missing = cli(control_plane, kube, "metrics", "nope")
        assert missing.returncode != 0 and "nope" in missing.stderr
        neither = cli(control_plane, kube, "metrics")
        assert neither.returncode == 2
        assert "name a job on the cluster (strategyjob metrics NAME)" in neither.stderr
    finally:
        operator.stop()
