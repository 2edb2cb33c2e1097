"""``status.progress`` from what the leader publishes: a pure function of the annotation
``strategyjob.dev/progress`` on the leader's pod and the previous ``status.progress``.

The annotation (written by ``strategyjob.report``) is JSON: ``step``, optional
``totalSteps``, ``metrics`` and ``time`` (RFC 3339, when the leader reported). The status
adds ``percentage`` and ``estimatedSecondsLeft``, the latter from the rate between the
previous report the operator saw and this one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from strategyjob import jobspec

from strategyjob_operator import constants as c


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return None


def parse_report(text: str | None) -> dict[str, Any] | None:
    """The leader's report from the annotation, or None when absent or unreadable.

    Only the known fields are kept, with their types checked; metrics keep numbers and
    strings (anything else becomes its string)."""
    if not text:
        return None
    try:
        raw = json.loads(text)
    except ValueError:
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
        report["metrics"] = {
            str(k): v
            if isinstance(v, str | int | float) and not isinstance(v, bool) and _finite(v)
            else str(v)
            for k, v in metrics.items()
        }
    if _time(raw.get("time")) is not None:
        report["time"] = raw["time"]
    return report


def _finite(v: Any) -> bool:
    return not isinstance(v, float) or math.isfinite(v)


def aggregate(
    report: Mapping[str, Any] | None, previous: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The new ``status.progress``: ``step``, ``totalSteps``, ``percentage`` (one
    decimal), ``metrics``, ``lastReportTime`` and ``estimatedSecondsLeft``.

    No report: the previous progress stays (a finished or restarted leader's pod may be
    gone). The same report again (same time and step): unchanged. The time left comes
    from the steps per second between the previous report and this one; when that rate is
    unknown (first report, no time, the step went back after a restart) the previous
    estimate is kept only if the step did not go back.
    """
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

    prev_step = _int(previous.get("step"))
    went_back = prev_step is not None and step < prev_step
    eta: int | None = None
    if total:
        t0, t1 = _time(previous.get("lastReportTime")), _time(when)
        if step >= total:
            eta = 0
        elif prev_step is not None and t0 and t1 and step > prev_step and t1 > t0:
            rate = (step - prev_step) / (t1 - t0).total_seconds()
            eta = math.ceil((total - step) / rate)
        elif not went_back and previous.get("estimatedSecondsLeft") is not None:
            eta = _int(previous.get("estimatedSecondsLeft"))
    if eta is not None:
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
    old = old or {}
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(old.get(k), Mapping):
            out[k] = {**{m: None for m in old[k] if m not in v}, **v}
        else:
            out[k] = v
    return out
