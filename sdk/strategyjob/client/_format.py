"""Text the ``strategyjob`` CLI prints for jobs: the ``list`` table, the ``status`` report
and the progress bar. Pure functions of the typed views and a clock, so tests need no
cluster and the progress work only has to fill ``status.progress``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from strategyjob.client._view import ReplicaInfo, SubmittedJob

_BAR_WIDTH = 24


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns two spaces apart, as ``kubectl get`` prints them."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def parse_time(stamp: str) -> datetime | None:
    """An RFC 3339 timestamp of the API (``2026-11-22T10:00:00Z``) as an aware datetime."""
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def format_duration(seconds: float) -> str:
    """``45s``, ``3m20s``, ``2h5m``, ``3d4h``: coarse like kubectl's ages."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 10:
        return f"{minutes}m{secs}s" if secs else f"{minutes}m"
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"


def format_age(stamp: str, now: datetime) -> str:
    when = parse_time(stamp)
    return format_duration((now - when).total_seconds()) if when else "-"


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(str(value).rstrip("%"))
    except (TypeError, ValueError):
        return None


def _short(value: Any) -> str:
    number = _number(value)
    if number is None:
        return str(value)
    if number == int(number) and abs(number) < 1e15:
        return str(int(number))
    return f"{number:.4g}"


def progress_percent(progress: Mapping[str, Any] | None) -> float | None:
    """The percentage of ``status.progress``: given, or from step and total."""
    if not progress:
        return None
    percent = _number(progress.get("percentage", progress.get("percent")))
    if percent is None:
        step = _number(progress.get("step"))
        total = _number(progress.get("totalSteps", progress.get("total")))
        if step is not None and total:
            percent = 100.0 * step / total
    return None if percent is None else min(max(percent, 0.0), 100.0)


def format_progress(progress: Mapping[str, Any] | None, now: datetime | None = None) -> str:
    """One line for ``status.progress``: a bar, the step, the metrics, time left and the
    age of the last report; ``-`` when the job reports none (yet)."""
    if not progress:
        return "-"
    parts = []
    percent = progress_percent(progress)
    if percent is not None:
        filled = round(_BAR_WIDTH * percent / 100)
        parts.append(f"[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {percent:5.1f}%")
    step = progress.get("step")
    total = progress.get("totalSteps", progress.get("total"))
    if step is not None:
        parts.append(f"step {_short(step)}" + (f"/{_short(total)}" if total else ""))
    metrics = progress.get("metrics")
    if isinstance(metrics, Mapping):
        parts.extend(f"{k}={_short(v)}" for k, v in metrics.items())
    eta = next(
        (
            progress[k]
            for k in ("estimatedSecondsLeft", "etaSeconds", "estimatedTimeLeft", "eta")
            if progress.get(k) is not None
        ),
        None,
    )
    if eta is not None:
        seconds = _number(eta)
        parts.append(f"eta {format_duration(seconds) if seconds is not None else eta}")
    reported = progress.get("lastReportTime", progress.get("lastUpdateTime"))
    if reported and now is not None and parse_time(str(reported)):
        parts.append(f"(reported {format_age(str(reported), now)} ago)")
    return "  ".join(parts) or "-"


def progress_cell(progress: Mapping[str, Any] | None) -> str:
    """The short form for the ``list`` table: ``42%`` (or ``step 420``, or ``-``)."""
    percent = progress_percent(progress)
    if percent is not None:
        return f"{percent:.0f}%"
    if progress and progress.get("step") is not None:
        return f"step {_short(progress['step'])}"
    return "-"


def jobs_table(jobs: Sequence[SubmittedJob], now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    rows = [
        (
            j.name,
            j.strategy,
            j.state or "-",
            j.ready or "-",
            j.restart_count,
            progress_cell(j.progress),
            format_age(j.creation_timestamp, now),
        )
        for j in jobs
    ]
    headers = ("NAME", "STRATEGY", "STATE", "READY", "RESTARTS", "PROGRESS", "AGE")
    return table(headers, rows)


def _phase(replica: ReplicaInfo) -> str:
    if replica.exit_code not in (None, 0):
        why = f", {replica.reason}" if replica.reason and replica.reason != "Error" else ""
        return f"{replica.phase} (exit {replica.exit_code}{why})"
    return replica.phase


def status_report(
    job: SubmittedJob,
    replicas: Sequence[ReplicaInfo],
    now: datetime | None = None,
    curves: str = "",
) -> str:
    """What ``strategyjob status`` prints: the job's state line, its progress (then
    ``curves``, the metrics drawn, when given), a row per replica and its conditions."""
    now = now or datetime.now(UTC)
    header = (
        f"StrategyJob {job.name}  namespace {job.namespace}  {job.strategy}\n"
        f"state: {job.state or 'Pending (not yet seen by the operator)'}   "
        f"ready: {job.ready or '-'}   restarts: {job.restart_count}   "
        f"age: {format_age(job.creation_timestamp, now)}\n"
        f"progress: {format_progress(job.progress, now)}"
    )
    replica_rows = [(r.name, r.replica_type, r.index, _phase(r), r.restarts) for r in replicas]
    parts = [header, *([curves] if curves else [])]
    parts.append(table(("NAME", "TYPE", "INDEX", "PHASE", "RESTARTS"), replica_rows))
    if job.conditions:
        condition_rows = [
            (c.type, c.status, c.reason or "-", format_age(c.last_transition_time, now), c.message)
            for c in job.conditions
        ]
        parts.append(table(("CONDITION", "STATUS", "REASON", "AGE", "MESSAGE"), condition_rows))
    return "\n\n".join(parts)


def metrics_rows(
    series: Mapping[str, Sequence[tuple[int, float]]],
) -> tuple[list[str], list[list[Any]]]:
    """A metric history as a table: ``STEP`` then one column per metric, a row per step any
    metric has (a metric without that step: an empty cell)."""
    names = sorted(series)
    by_step: dict[int, dict[str, float]] = {}
    for name in names:
        for step, value in series[name]:
            by_step.setdefault(step, {})[name] = value
    rows = [[step, *(by_step[step].get(n, "") for n in names)] for step in sorted(by_step)]
    return ["STEP", *names], rows


def metrics_table(series: Mapping[str, Sequence[tuple[int, float]]]) -> str:
    """What ``strategyjob metrics`` prints: :func:`metrics_rows` aligned, values in ``%g``."""
    headers, rows = metrics_rows(series)
    shown = [[row[0], *(v if v == "" else f"{v:.6g}" for v in row[1:])] for row in rows]
    return table(headers, shown)
