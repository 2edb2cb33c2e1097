"""decide(): the launcher's pure rules for success, failure, restart and deadline."""

from __future__ import annotations

import pytest
from strategyjob.jobspec import load_manifest
from strategyjob.launcher import Phase, ReplicaExit, decide, is_retryable


def make_job(strategy="MultiWorkerMirroredStrategy", restart_policy="Never", **spec_extra):
    counts = spec_extra.pop("counts", {"worker": 2})
    container = {"name": "strategyjob", "command": ["python", "train.py"]}
    replica_specs = {
        t: {
            "replicas": n,
            "restartPolicy": restart_policy,
            "template": {"spec": {"containers": [container]}},
        }
        for t, n in counts.items()
    }
    return load_manifest(
        {
            "apiVersion": "strategyjob.dev/v1alpha1",
            "kind": "StrategyJob",
            "metadata": {"name": "job"},
            "spec": {"strategy": strategy, "replicaSpecs": replica_specs, **spec_extra},
        }
    )


def exits(*items):
    """exits(("worker", 1, 3), ...) in the order the replicas exited."""
    return {(t, i): ReplicaExit(rc, seq) for seq, (t, i, rc) in enumerate(items)}


def test_nothing_exited_is_running():
    assert decide(make_job(), {}).phase is Phase.RUNNING


def test_worker_0_success_without_chief_succeeds():
    decision = decide(make_job(), exits(("worker", 0, 0)))
    assert decision.phase is Phase.SUCCEEDED
    assert decision.reason == "worker-0 succeeded"


def test_other_worker_success_alone_is_still_running():
    assert decide(make_job(), exits(("worker", 1, 0))).phase is Phase.RUNNING


def test_chief_success_succeeds_even_with_workers_running():
    job = make_job(counts={"chief": 1, "worker": 2})
    assert decide(job, exits(("worker", 0, 0))).phase is Phase.RUNNING
    assert decide(job, exits(("chief", 0, 0))).phase is Phase.SUCCEEDED


def test_all_workers_policy_needs_every_chief_and_worker():
    job = make_job(counts={"chief": 1, "worker": 2, "evaluator": 1}, successPolicy="AllWorkers")
    assert decide(job, exits(("chief", 0, 0), ("worker", 0, 0))).phase is Phase.RUNNING
    done = decide(job, exits(("chief", 0, 0), ("worker", 0, 0), ("worker", 1, 0)))
    assert done.phase is Phase.SUCCEEDED
    assert done.reason == "chief-0, worker-0, worker-1 succeeded"


def test_first_failure_is_reported_first():
    decision = decide(make_job(), exits(("worker", 1, 3), ("worker", 0, -15)))
    assert decision.phase is Phase.FAILED
    assert decision.reason == "worker-1 exited with code 3"
    assert [f.describe() for f in decision.failures] == [
        "worker-1 exited with code 3",
        "worker-0 was killed by SIGTERM (exit code 143)",
    ]


def test_failure_wins_over_a_later_success():
    decision = decide(make_job(), exits(("worker", 1, 1), ("worker", 0, 0)))
    assert decision.phase is Phase.FAILED


def test_ps_failure_fails_the_job():
    job = make_job("ParameterServerStrategy", counts={"chief": 1, "worker": 1, "ps": 1})
    assert decide(job, exits(("ps", 0, 1))).phase is Phase.FAILED


@pytest.mark.parametrize(
    ("policy", "returncode", "retryable"),
    [
        pytest.param("Never", 1, False, id="never"),
        pytest.param("Never", -9, False, id="never-killed"),
        pytest.param("OnFailure", 1, True, id="onfailure"),
        pytest.param("Always", 2, True, id="always"),
        pytest.param("ExitCode", 1, False, id="exitcode-1-permanent"),
        pytest.param("ExitCode", 127, False, id="exitcode-127-permanent"),
        pytest.param("ExitCode", 128, True, id="exitcode-128-retryable"),
        pytest.param("ExitCode", 137, True, id="exitcode-137-retryable"),
        pytest.param("ExitCode", -9, True, id="exitcode-sigkill-retryable"),
        pytest.param("OnFailure", 0, False, id="success-is-not-retried"),
    ],
)
def test_is_retryable(policy, returncode, retryable):
    assert is_retryable(policy, ReplicaExit(returncode)) is retryable


def test_collective_strategy_restarts_the_whole_job():
    job = make_job(restart_policy="OnFailure")
    decision = decide(job, exits(("worker", 1, 1)), restarts=0)
    assert decision.phase is Phase.RESTART_JOB
    assert decision.reason == "worker-1 exited with code 1"


def test_backoff_limit_ends_restarts():
    job = make_job(restart_policy="OnFailure", runPolicy={"backoffLimit": 2})
    assert decide(job, exits(("worker", 1, 1)), restarts=1).phase is Phase.RESTART_JOB
    decision = decide(job, exits(("worker", 1, 1)), restarts=2)
    assert decision.phase is Phase.FAILED
    assert decision.reason == "worker-1 exited with code 1; backoff limit of 2 restarts reached"


def test_backoff_limit_zero_never_restarts():
    job = make_job(restart_policy="OnFailure", runPolicy={"backoffLimit": 0})
    assert decide(job, exits(("worker", 0, 1))).phase is Phase.FAILED


def test_parameter_server_restarts_failed_workers_alone():
    job = make_job(
        "ParameterServerStrategy",
        restart_policy="ExitCode",
        counts={"chief": 1, "worker": 3, "ps": 1},
    )
    decision = decide(job, exits(("worker", 2, -9)))
    assert decision.phase is Phase.RESTART_REPLICAS
    assert decision.restart == (("worker", 2),)
    # A failed ps or chief restarts the whole job.
    assert decide(job, exits(("ps", 0, 137))).phase is Phase.RESTART_JOB
    # A permanent exit code fails the job.
    assert decide(job, exits(("worker", 2, 1))).phase is Phase.FAILED


def test_mixed_retryable_and_permanent_failures_fail():
    job = make_job(restart_policy="ExitCode")
    assert decide(job, exits(("worker", 0, 137), ("worker", 1, 2))).phase is Phase.FAILED


def test_active_deadline():
    job = make_job(runPolicy={"activeDeadlineSeconds": 5})
    assert decide(job, {}, elapsed=4.9).phase is Phase.RUNNING
    decision = decide(job, {}, elapsed=5.0)
    assert decision.phase is Phase.FAILED
    assert decision.reason == "the job ran longer than activeDeadlineSeconds (5s)"
    # Success is seen before the deadline is applied.
    assert decide(job, exits(("worker", 0, 0)), elapsed=6).phase is Phase.SUCCEEDED


def test_unknown_signal_number_is_still_described():
    assert ReplicaExit(-200).describe() == "was killed by signal 200 (exit code 328)"


def ps_job(restart_policy="OnFailure", **spec_extra):
    counts = spec_extra.pop("counts", {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1})
    return make_job("ParameterServerStrategy", restart_policy, counts=counts, **spec_extra)


def test_a_ps_exiting_0_while_the_job_runs_is_its_failure():
    """A ps only serves (TF's server.join() never returns): its exit with 0 is a failure at
    once, restarted per the policy, not found out by the chief's timeout."""
    decision = decide(ps_job(), exits(("ps", 0, 0)))
    assert decision.phase is Phase.RESTART_JOB
    assert decision.reason == (
        "ps-0 exited with code 0 while the job ran (a ps serves until the job ends)"
    )
    assert decide(ps_job("Never"), exits(("ps", 0, 0))).phase is Phase.FAILED
    # ExitCode retries what was killed from outside, not a program that ended by itself.
    assert decide(ps_job("ExitCode"), exits(("ps", 0, 0))).phase is Phase.FAILED
    assert decide(ps_job("Always"), exits(("ps", 0, 0))).phase is Phase.RESTART_JOB


def test_a_parameter_server_strategy_worker_exiting_0_is_restarted_alone():
    decision = decide(ps_job(), exits(("worker", 1, 0)))
    assert decision.phase is Phase.RESTART_REPLICAS and decision.restart == (("worker", 1),)
    assert decision.reason.startswith("worker-1 exited with code 0 while the job ran")
    # Under AllWorkers the workers' exits are the job's success: no server then.
    job = ps_job(counts={"chief": 1, "worker": 2, "ps": 1}, successPolicy="AllWorkers")
    assert decide(job, exits(("worker", 1, 0))).phase is Phase.RUNNING


def test_an_evaluator_or_collective_worker_exiting_0_is_no_failure():
    """TF's SidecarEvaluator returns after its last evaluation, and a collective worker
    ends with the others: neither is a failure."""
    assert decide(ps_job(), exits(("evaluator", 0, 0))).phase is Phase.RUNNING
    job = make_job(counts={"chief": 1, "worker": 2, "evaluator": 1})
    assert decide(job, exits(("worker", 1, 0), ("evaluator", 0, 0))).phase is Phase.RUNNING


def test_servers_stopping_after_the_success_are_no_failure():
    job = ps_job("Never")
    assert decide(job, exits(("chief", 0, 0), ("ps", 0, 0))).phase is Phase.SUCCEEDED
    assert decide(job, exits(("ps", 0, 0), ("chief", 0, 0))).phase is Phase.FAILED


def test_the_failure_quotes_the_error_line_of_the_culprit():
    decision = decide(
        make_job(),
        {
            ("worker", 1): ReplicaExit(1, 1, "ValueError: bad batch"),
            ("worker", 0): ReplicaExit(1, 2, "strategyjob.errors.UnavailableError: worker 1"),
        },
    )
    assert decision.reason == "worker-1 exited with code 1: ValueError: bad batch"
    assert decision.failures[1].describe().startswith("worker-0 exited with code 1: strategy")


def test_an_evaluator_failure_restarts_it_alone_then_gives_it_up():
    """As the operator: an evaluator never fails the job nor uses its backoffLimit; it is
    restarted alone up to backoffLimit times of its own, then the job goes on without it."""
    job = ps_job(runPolicy={"backoffLimit": 2})
    failed = {("evaluator", 0): ReplicaExit(1, 1, "ValueError: no checkpoint")}
    decision = decide(job, failed, optional_restarts=1)
    assert decision.phase is Phase.RESTART_OPTIONAL and decision.restart == (("evaluator", 0),)
    assert decision.reason == "evaluator-0 exited with code 1: ValueError: no checkpoint"
    decision = decide(job, failed, restarts=2, optional_restarts=2)
    assert decision.phase is Phase.GIVE_UP
    assert decision.reason.endswith("; it was restarted 2 times (backoffLimit=2)")
    never = decide(ps_job("Never"), failed)
    assert never.phase is Phase.GIVE_UP
    assert never.reason.endswith("; restartPolicy Never does not retry it")
    assert decide(job, failed, given_up={("evaluator", 0)}).phase is Phase.RUNNING


def test_a_training_failure_comes_before_an_evaluators():
    job = ps_job("Never")
    decision = decide(job, exits(("evaluator", 0, 1), ("chief", 0, 3)))
    assert decision.phase is Phase.FAILED and decision.reason == "chief-0 exited with code 3"
