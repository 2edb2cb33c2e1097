"""Pods that cannot start (an image that does not pull, a missing Secret, no node that fits):
named in the Stalled condition, with one Warning Event per cause that says what to fix."""

from __future__ import annotations

from collections.abc import Sequence

from strategyjob_operator import constants as c
from strategyjob_operator.draft import Draft
from strategyjob_operator.observe import Replica

#: How many stuck pods the Stalled condition names.
STUCK_NAMED = 3
#: Longest kubelet or scheduler message quoted.
_DETAIL_CHARS = 300
#: Reasons that are one cause (the kubelet alternates between them while it retries).
_SAME_CAUSE = {"ErrImagePull": "ImagePullBackOff"}
#: What to do, per cause.
_HINTS = {
    "ImagePullBackOff": "check the image name and tag, and the pod's imagePullSecrets",
    "ErrImageNeverPull": "the image is not on the node and imagePullPolicy is Never",
    "InvalidImageName": "fix the image name in the replica's template",
    "CreateContainerConfigError": "create the Secret or ConfigMap it uses, or fix its name",
    "CreateContainerError": "fix the container's spec (command, mounts, security context)",
    "Unschedulable": "check its resource requests, nodeSelector, affinity and tolerations, "
    "or the cluster's free capacity",
}


#: The kubelet's message when the default ``runAsNonRoot`` meets an image that runs as root.
_ROOT_IMAGE = "runAsNonRoot and image will run as root"
_ROOT_IMAGE_HINT = (
    "the image runs as root, and job pods run as non-root by default: set "
    "securityContext.runAsNonRoot: false (or a runAsUser) in the replica's template, or give "
    "the image a non-root USER"
)


def _hint(cause: str, detail: str) -> str:
    if _ROOT_IMAGE in detail:
        return _ROOT_IMAGE_HINT
    return _HINTS.get(cause, "see kubectl describe pod")


def _cause(reason: str) -> str:
    return _SAME_CAUSE.get(reason, reason)


def _detail(r: Replica) -> str:
    """The kubelet's or scheduler's message about a stuck pod, on one bounded line."""
    detail = " ".join((r.stuck_message or "").split())
    if len(detail) > _DETAIL_CHARS:
        detail = detail[: _DETAIL_CHARS - 3] + "..."
    return detail


def stuck_cause(r: Replica) -> str:
    """``Reason: detail`` of a stuck pod."""
    detail = _detail(r)
    return f"{r.stuck_reason}: {detail}" if detail else str(r.stuck_reason)


def first_names(names: Sequence[str], shown: int = 3) -> str:
    """``a, b, c and 2 more``: the names a message quotes, the first ``shown`` of them."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def cannot_start(stuck: Sequence[Replica], workers: int) -> str:
    """What a resize's ``ResizeStalled`` message adds: the first new pod that cannot start and
    why, and that the job runs on at its old size, ``workers``."""
    more = f" ({len(stuck) - 1} more cannot start either)" if len(stuck) > 1 else ""
    return (
        f" Pod {stuck[0].name} cannot start: {stuck_cause(stuck[0]).rstrip('.')}{more}; the job "
        f"runs on with {workers} workers meanwhile."
    )


def _stuck_line(r: Replica) -> str:
    return f"pod {r.name}: {stuck_cause(r)}"


def report_stalled(draft: Draft, stuck: list[Replica]) -> None:
    """The Stalled condition naming pods that cannot start, and one Warning Event per
    cause when it appears (``status.stalledReasons`` remembers which were reported, so a
    pass, a pod recreated with the same problem or the kubelet's retries add none)."""
    job, st = draft.job, draft.status
    old = st.get("stalledReasons")
    reported = {x for x in old if isinstance(x, str)} if isinstance(old, list) else set()
    if not stuck:
        st.pop("stalledReasons", None)
        msg = f"No pod of StrategyJob {job.name} is stuck."
        draft.set(c.STALLED, False, c.REASON_NOT_STALLED, msg)
        return
    groups: dict[str, list[Replica]] = {}
    for r in stuck:
        groups.setdefault(_cause(r.stuck_reason or ""), []).append(r)
    for cause, rs in groups.items():
        if cause in reported:
            continue
        first = rs[0]
        more = f" ({len(rs) - 1} more pods of the job too)" if len(rs) > 1 else ""
        hint = _hint(cause, _detail(first))
        msg = (
            f"Pod {job.namespace}/{first.name} cannot start: {stuck_cause(first)}{more}. "
            f"To fix: {hint}."
        )
        draft.event("Warning", first.stuck_reason or cause, msg)
    st["stalledReasons"] = sorted(groups)
    named = "; ".join(_stuck_line(r) for r in stuck[:STUCK_NAMED])
    if len(stuck) > STUCK_NAMED:
        named += f"; and {len(stuck) - STUCK_NAMED} more"
    total = job.total_replicas
    msg = f"{len(stuck)} of {total} pods of StrategyJob {job.name} cannot start: {named}."
    draft.set(c.STALLED, True, _cause(stuck[0].stuck_reason or ""), msg)
