"""decide(): a replica that serves until the job ends (a ps, a ParameterServerStrategy worker)
exiting with 0 while the job runs is that replica's failure, restarted or failed per its
policy at once; an evaluator's or collective worker's exit 0 is not. A failure's condition
quotes the error line of the container's termination message (FallbackToLogsOnError). Pure."""

from __future__ import annotations

import pytest
from strategyjob_operator import constants as c
from strategyjob_operator.decide import Action, decide
from strategyjob_operator.observe import observe

from tests.support import manifests
from tests.support.pods import NOW, launched, pod, terminated

PSS = {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1}
EARLY = "ps-0 exited with code 0 while the job ran (a ps serves until the job ends)"
TRACEBACK = """\
Traceback (most recent call last):
  File "/app/train.py", line 9, in <module>
    raise ValueError("bad batch")
ValueError: bad batch
"""


def pss_job(policy: str = "OnFailure", **extra):
    return manifests.job(PSS, strategy="ParameterServerStrategy", policy=policy, **extra)


def pods_with(j, **states):
    """Every replica's pod Running, but those in ``states`` (``ps_0=terminated(0)``)."""
    out = []
    for t, i in j.replicas():
        state = states.get(f"{t}_{i}")
        if state is None:
            out.append(pod(t, i, "Running", {"strategyjob": {"running": {}}}))
        else:
            code = state["terminated"]["exitCode"]
            out.append(pod(t, i, "Succeeded" if code == 0 else "Failed", {"strategyjob": state}))
    return observe(j, out)


def test_a_ps_exiting_0_restarts_the_job_at_once_naming_it():
    j = pss_job()
    plan = decide(j, 1, launched(), pods_with(j, ps_0=terminated(0)), NOW)
    assert plan.action is Action.RESTART_JOB
    restarting = next(x for x in plan.status["conditions"] if x["type"] == c.RESTARTING)
    assert restarting["reason"] == c.REASON_JOB_RESTARTING
    assert f"{EARLY} (restart 1 of" in restarting["message"]
    assert "ps" not in plan.status["replicaStatuses"] or not plan.status["replicaStatuses"][
        "ps"
    ].get("completedIndexes")


@pytest.mark.parametrize("policy", ["ExitCode", "Never"])
def test_a_ps_exiting_0_fails_the_job_when_its_policy_does_not_retry(policy):
    j = pss_job(policy)
    plan = decide(j, 1, launched(), pods_with(j, ps_0=terminated(0)), NOW)
    assert plan.action is Action.FAIL
    failed = next(x for x in plan.status["conditions"] if x["type"] == c.FAILED)
    assert failed["reason"] == c.REASON_REPLICA_FAILED
    assert failed["message"] == (
        f"StrategyJob {j.name} failed: {EARLY}; restartPolicy {policy} does not retry it."
    )


def test_a_parameter_server_strategy_worker_exiting_0_is_recreated_alone():
    j = pss_job()
    plan = decide(j, 1, launched(), pods_with(j, worker_1=terminated(0)), NOW)
    assert plan.action is Action.RECREATE_REPLICAS
    assert plan.delete_pods == (j.pod_name("worker", 1),)


def test_an_evaluator_or_a_collective_worker_exiting_0_is_no_failure():
    j = pss_job()
    plan = decide(j, 1, launched(), pods_with(j, evaluator_0=terminated(0)), NOW)
    assert plan.action is Action.NONE and not any(
        x["type"] in (c.RESTARTING, c.FAILED) and x["status"] == "True"
        for x in plan.status["conditions"]
    )
    mwms = manifests.job({"worker": 2}, policy="OnFailure")
    plan = decide(mwms, 1, launched(), pods_with(mwms, worker_1=terminated(0)), NOW)
    assert plan.action is Action.NONE


def test_the_ps_stopping_after_the_chief_succeeded_is_no_failure():
    j = pss_job("Never")
    plan = decide(j, 1, launched(), pods_with(j, chief_0=terminated(0), ps_0=terminated(0)), NOW)
    assert plan.action is not Action.FAIL
    assert next(x for x in plan.status["conditions"] if x["type"] == c.SUCCEEDED)["status"] == (
        "True"
    )


def test_the_failed_condition_quotes_the_error_line_of_the_termination_message():
    j = manifests.job({"worker": 2}, policy="ExitCode")
    state = terminated(1)
    state["terminated"]["message"] = "step 3 loss=0.2\n" + TRACEBACK
    plan = decide(j, 1, launched(), pods_with(j, worker_1=state), NOW)
    failed = next(x for x in plan.status["conditions"] if x["type"] == c.FAILED)
    assert (
        "worker-1 exited with code 1 (Error): ValueError: bad batch; restartPolicy"
        in (failed["message"])
    )
    assert any("ValueError: bad batch" in e.message for e in plan.events)
