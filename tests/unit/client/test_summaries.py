"""The pure parts of ``strategyjob tensorboard NAME``: which pod leads, where it said its
summaries are, and unpacking the archive copied out of it (refusing what would land outside
the local directory)."""

from __future__ import annotations

import io
import tarfile

import pytest
from strategyjob.client._summaries import leader_replica, reported_logdir, unpack
from strategyjob.client._view import SubmittedJob
from strategyjob.errors import StrategyJobError


def job(replicas: dict[str, int], progress: dict | None = None) -> SubmittedJob:
    specs = {t: {"replicas": n} for t, n in replicas.items()}
    status = {"progress": progress} if progress else {}
    raw = {"metadata": {"name": "j"}, "spec": {"replicaSpecs": specs}, "status": status}
    return SubmittedJob(raw)


def archive(members: dict[str, bytes], links: dict[str, str] | None = None) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    out.seek(0)
    return out


def test_the_leader_is_chief_0_else_worker_0():
    assert leader_replica(job({"worker": 2, "chief": 1, "ps": 1})) == "chief-0"
    assert leader_replica(job({"worker": 2, "ps": 1})) == "worker-0"
    with pytest.raises(StrategyJobError, match="neither a chief nor a worker"):
        leader_replica(job({"ps": 1}))


def test_the_logdir_is_the_reported_one_or_an_error_saying_how_to_name_it():
    assert reported_logdir(job({"worker": 1}, {"step": 3, "logdir": "/out/logs"})) == "/out/logs"
    with pytest.raises(StrategyJobError) as e:
        reported_logdir(job({"worker": 1}, {"step": 3}))
    assert "strategyjob tensorboard j --logdir PATH" in str(e.value)


def test_unpack_writes_the_files_and_replaces_older_copies(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "events.1").write_bytes(b"old")
    files = unpack(archive({"./train/events.1": b"newer", "./validation/events.2": b"v"}), tmp_path)
    assert files == ("train/events.1", "validation/events.2")
    assert (tmp_path / "train" / "events.1").read_bytes() == b"newer"


@pytest.mark.parametrize(
    ("members", "links"),
    [({"../escaped": b"x"}, None), ({}, {"out": "/etc/passwd"}), ({}, {"out": "../../x"})],
    ids=["dotdot", "link-to-absolute", "link-out"],
)
def test_unpack_refuses_what_would_land_outside_the_directory(tmp_path, members, links):
    into = tmp_path / "copy"
    with pytest.raises(tarfile.TarError):
        unpack(archive(members, links), into)
    assert not (tmp_path / "escaped").exists()
    assert not (into / "out").exists()


def test_unpack_puts_an_absolute_member_inside_the_directory(tmp_path):
    assert unpack(archive({"/etc/escaped": b"x"}), tmp_path / "copy") == ("etc/escaped",)
    assert (tmp_path / "copy" / "etc" / "escaped").read_bytes() == b"x"
