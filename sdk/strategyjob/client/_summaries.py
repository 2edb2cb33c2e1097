"""A cluster job's summaries (issue 31), for ``strategyjob tensorboard NAME``.

The leader writes its event files inside its pod, where a workstation's TensorBoard cannot
read them. The client copies them out through the exec API (``tar`` in the training
container, as ``kubectl cp`` does) into a local directory that TensorBoard serves, again at
each refresh while it runs; the copy stays after the pod has gone. The leader's reports say
where the files are (``status.progress.logdir``, see :func:`strategyjob._progress.announce_logdir`).
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from strategyjob.client._view import SubmittedJob
from strategyjob.errors import StrategyJobError
from strategyjob.jobspec import leader_among


@dataclass(frozen=True)
class SummaryCopy:
    """What one copy brought: from ``logdir`` in ``pod`` into ``into``, these ``files``
    (paths relative to ``into``)."""

    pod: str
    logdir: str
    into: Path
    files: tuple[str, ...]


def leader_replica(job: SubmittedJob) -> str:
    """The job's leader (``chief-0``, else ``worker-0``): the replica whose reports, and
    summaries, count."""
    found = leader_among(job.replicas())
    if found is None:
        raise StrategyJobError(f"StrategyJob {job.name} has neither a chief nor a worker.")
    return f"{found[0]}-{found[1]}"


def reported_logdir(job: SubmittedJob) -> str:
    """Where the leader said it writes summaries, or one error saying how to go on."""
    logdir = (job.progress or {}).get("logdir")
    if isinstance(logdir, str) and logdir:
        return logdir
    raise StrategyJobError(
        f"StrategyJob {job.name} has not said where it writes summaries: its leader names the "
        "directory in its reports once it has called strategyjob.summary.create_file_writer "
        "and then strategyjob.report. Give the directory inside the pod: "
        f"strategyjob tensorboard {job.name} --logdir PATH"
    )


def unpack(archive: IO[bytes], into: Path) -> tuple[str, ...]:
    """Unpack a tar stream of a logdir into ``into``: the regular files it holds, relative
    to ``into``. Members that would land outside ``into`` (absolute paths, ``..``, links
    out of it) or are not plain files and directories are refused (tarfile's ``data``
    filter): the archive comes from a pod the job's image controls."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=archive, mode="r|*") as tar:
        files: list[str] = []
        for member in tar:
            safe = tarfile.data_filter(member, str(into))  # raises for what would escape
            tar.extract(safe, into, filter="fully_trusted")  # filtered just above
            if safe.isfile():
                files.append(str(Path(safe.name)))
    return tuple(sorted(files))
