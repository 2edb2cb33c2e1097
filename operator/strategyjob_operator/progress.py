"""``status.progress`` from what the leader publishes: a pure function of the annotation
``strategyjob.dev/progress`` on the leader's pod and the previous ``status.progress``.

The annotation (written by ``strategyjob.report``) is JSON: ``step``, optional
``totalSteps``, ``metrics`` and ``time`` (RFC 3339, when the leader reported). The status
adds ``percentage`` and ``estimatedSecondsLeft``, the latter from the rate between the
previous report the operator saw and this one.

Whatever the annotation holds, the status written from it is one the API server takes
(``step`` and ``totalSteps`` within int64, ``lastReportTime`` an RFC 3339 UTC time): anyone
who may annotate the leader's pod must not be able to stop the job's status updates.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import constants as c

#: Largest integer the status holds (``format: int64``).
MAX_INT64 = 2**63 - 1
MAX_LOGDIR = 4096  # the CRD's maxLength of status.progress.logdir
#: RFC 3339 date-time, as the API server's ``format: date-time`` takes it: a zone is required.
_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$", re.ASCII
)


def _time(value: Any) -> datetime | None:
    """An RFC 3339 time with its zone, in UTC; None for anything else."""
    if not isinstance(value, str) or not _RFC3339.match(value):
        return None
    text = re.sub(r"(\.\d{6})\d+", r"\1", value)  # Python keeps microseconds
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        return parsed.astimezone(UTC)
    except (ValueError, OverflowError):  # e.g. month 13, or year 1 moved before year 1
        return None


def _rfc3339(when: datetime) -> str:
    """``when`` (UTC) as the API server writes times: ``Z``, microseconds only when set,
    a four-digit year even before 1000."""
    fraction = f".{when.microsecond:06d}" if when.microsecond else ""
    return f"{when.year:04d}-{when:%m-%dT%H:%M:%S}{fraction}Z"


def _int(value: Any) -> int | None:
    """An int64 from an int or a finite float; None for anything else or out of range."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        value = int(value)
    if isinstance(value, int) and -MAX_INT64 - 1 <= value <= MAX_INT64:
        return value
    return None


def _metric(value: Any) -> str | int | float:
    """A metric as the status keeps it: numbers within range, everything else as text."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and _int(value) is not None:
        return value
    return str(value)


def parse_report(text: str | None) -> dict[str, Any] | None:
    """The leader's report from the annotation, or None when absent or unreadable.

    Only the known fields are kept, with their types checked; metrics keep numbers and
    strings (anything else becomes its string)."""
    if not text:
        return None
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, a number too long, nested too deep
        return None
    if not isinstance(raw, Mapping):
        return None
    step = _int(raw.get("step"))
    if step is None or step < 0:
        return None
    report: dict[str, Any] = {"step": step}
    total = _int(raw.get("totalSteps"))
    if total is not None and total > 0:
        report["totalSteps"] = total
    metrics = raw.get("metrics")
    if isinstance(metrics, Mapping) and metrics:
        report["metrics"] = {str(k): _metric(v) for k, v in metrics.items()}
    when = _time(raw.get("time"))
    if when is not None:
        report["time"] = _rfc3339(when)
    logdir = raw.get("logdir")
    if isinstance(logdir, str) and 0 < len(logdir) <= MAX_LOGDIR:
        report["logdir"] = logdir
    points = raw.get("points")
    if isinstance(points, list) and points:  # for the history (:mod:`.history`), not the status
        report["points"] = points
    return report


def aggregate(
    report: Mapping[str, Any] | None, previous: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The new ``status.progress``: ``step``, ``totalSteps``, ``percentage`` (one
    decimal), ``metrics``, ``lastReportTime``, ``estimatedSecondsLeft`` and ``logdir``
    (kept from the previous progress when a report lacks it).

    No report: the previous progress stays (a finished or restarted leader's pod may be
    gone). The same report again (same time and step): unchanged. The time left comes
    from the steps per second between the previous report and this one; when that rate is
    unknown (first report, no time, the step went back after a restart) the previous
    estimate is kept only if the step did not go back.
    """
    if not isinstance(previous, Mapping):
        previous = None
    if report is None:
        return dict(previous) if previous else None
    previous = previous or {}
    step = report["step"]
    when = report.get("time")
    if previous.get("step") == step and previous.get("lastReportTime") == when and when:
        return dict(previous)
    out: dict[str, Any] = {"step": step}
    total = report.get("totalSteps")
    if total:
        out["totalSteps"] = total
        out["percentage"] = round(min(100.0, 100.0 * step / total), 1)
    if report.get("metrics"):
        out["metrics"] = dict(report["metrics"])
    if when:
        out["lastReportTime"] = when
    logdir = report.get("logdir") or previous.get("logdir")  # a restarted leader's first reports
    if logdir:
        out["logdir"] = logdir

    prev_step = _int(previous.get("step"))
    went_back = prev_step is not None and step < prev_step
    eta: int | None = None
    if total:
        t0, t1 = _time(previous.get("lastReportTime")), _time(when)
        if step >= total:
            eta = 0
        elif prev_step is not None and t0 and t1 and step > prev_step and t1 > t0:
            rate = (step - prev_step) / (t1 - t0).total_seconds()
            left = (total - step) / rate
            eta = _int(math.ceil(left)) if math.isfinite(left) else None
        elif not went_back and previous.get("estimatedSecondsLeft") is not None:
            eta = _int(previous.get("estimatedSecondsLeft"))
    if eta is not None and eta >= 0:
        out["estimatedSecondsLeft"] = eta
    return out


def leader_report(
    job: jobspec.StrategyJob, pods: Iterable[Mapping[str, Any]], owner_uid: str | None
) -> dict[str, Any] | None:
    """The report on the leader's pod of this job (owned by ``owner_uid``), if any."""
    name = job.pod_name(*jobspec.leader(job))
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("name") != name:
            continue
        refs = meta.get("ownerReferences") or []
        if owner_uid is not None and not any(r.get("uid") == owner_uid for r in refs):
            continue
        return parse_report((meta.get("annotations") or {}).get(c.ANNOTATION_PROGRESS))
    return None


def with_progress(status: Mapping[str, Any], progress: Mapping[str, Any] | None) -> dict[str, Any]:
    """``status`` with ``progress`` set (or left out when there is none)."""
    out = dict(status)
    if progress:
        out["progress"] = dict(progress)
    return out


def merge_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch turning ``old`` into ``new``: keys (and metrics) that ``new``
    drops are set to null, or the API server would keep them."""
    old = old if isinstance(old, Mapping) else {}
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(old.get(k), Mapping):
            out[k] = {**{m: None for m in old[k] if m not in v}, **v}
        else:
            out[k] = v
    return out
