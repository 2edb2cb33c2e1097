"""The operator's settings, read from its environment (the Helm chart's values become these
variables): each parsed in one place, and a wrong value refused in one line that names the
variable and shows a valid one, before the operator watches anything."""

from __future__ import annotations

import os

from strategyjob import jobspec

from strategyjob_operator import constants as c
from strategyjob_operator import gang
from strategyjob_operator.decide import DEFAULT_LOST_POD_SECONDS
from strategyjob_operator.flavor import ENV_SERVE_TFJOBS
from strategyjob_operator.reconcile import (
    DEFAULT_RESYNC_SECONDS,
    DEFAULT_TERMINATION_GRACE_SECONDS,
    OperatorSettings,
)


def resync_seconds(value: str) -> float | None:
    """``STRATEGYJOB_RESYNC_SECONDS``: seconds between passes of an active job that no event
    woke; 0 turns the resync off."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(
            f"{c.ENV_RESYNC_SECONDS}={value!r} is not a number of seconds: set it to "
            "e.g. 60, or 0 to turn the periodic resync off."
        )
    return seconds or None


def grace_seconds(value: str) -> int:
    """``STRATEGYJOB_TERMINATION_GRACE_SECONDS``: the pods' grace period when their template
    sets none."""
    if not value.strip().isdigit():
        raise ValueError(
            f"{c.ENV_TERMINATION_GRACE_SECONDS}={value!r} is not a whole number of "
            "seconds: set it to e.g. 60 (a pod template's terminationGracePeriodSeconds wins)."
        )
    return int(value)


def positive_seconds(variable: str, value: str, example: float) -> float:
    """``value`` of the environment ``variable`` as a positive, finite number of seconds;
    ValueError in one line, with ``example``, otherwise."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ValueError(
            f"{variable}={value!r} is not a positive number of seconds: set it to e.g. {example:g}."
        )
    return seconds


def lost_pod_seconds(value: str) -> float:
    """``STRATEGYJOB_LOST_POD_SECONDS``: how long a pod may be in phase Unknown, or stay
    terminating past its grace period on a node that is gone or NotReady, before the
    operator fails its replica or force-deletes it."""
    return positive_seconds(c.ENV_LOST_POD_SECONDS, value, DEFAULT_LOST_POD_SECONDS)


def flag(variable: str, value: str) -> bool:
    """A true/false setting of the operator's environment; ValueError in one line otherwise."""
    if value.strip().lower() in ("true", "1", "yes"):
        return True
    if value.strip().lower() in ("false", "0", "no", ""):
        return False
    raise ValueError(f"{variable}={value!r} is not true or false: set it to true or false.")


def cluster_domain_setting(value: str) -> str:
    """``CUSTOM_CLUSTER_DOMAIN``: what a served TFJob's ``TF_CONFIG`` addresses end with."""
    if value and not jobspec.is_dns_subdomain(value):
        raise ValueError(
            f"{c.ENV_CUSTOM_CLUSTER_DOMAIN}={value!r} is not a lowercase DNS domain: set it "
            "to the cluster's domain without dots around it, e.g. cluster.local, or unset it."
        )
    return value


def serve_tfjobs_setting() -> bool:
    """``STRATEGYJOB_SERVE_TFJOBS``: whether the operator serves Kubeflow TFJobs too."""
    return flag(ENV_SERVE_TFJOBS, os.environ.get(ENV_SERVE_TFJOBS, ""))


def settings_from_env() -> OperatorSettings:
    """The operator's settings from its environment (the chart sets it); ValueError in one
    line naming the variable when one is wrong."""
    port = os.environ.get(c.ENV_METRICS_PORT, "8080")
    return OperatorSettings(
        serve_tfjobs=serve_tfjobs_setting(),
        cluster_domain=cluster_domain_setting(os.environ.get(c.ENV_CUSTOM_CLUSTER_DOMAIN, "")),
        max_in_flight=int(os.environ.get(c.ENV_MAX_IN_FLIGHT, "50")),
        metrics_port=int(port) if port and port != "0" else None,
        gang_scheduler=gang.gang_scheduler(os.environ.get(c.ENV_GANG_SCHEDULER)),
        resync_seconds=resync_seconds(
            os.environ.get(c.ENV_RESYNC_SECONDS, f"{DEFAULT_RESYNC_SECONDS:g}")
        ),
        termination_grace_seconds=grace_seconds(
            os.environ.get(c.ENV_TERMINATION_GRACE_SECONDS, str(DEFAULT_TERMINATION_GRACE_SECONDS))
        ),
        lost_pod_seconds=lost_pod_seconds(
            os.environ.get(c.ENV_LOST_POD_SECONDS, f"{DEFAULT_LOST_POD_SECONDS:g}")
        ),
    )
