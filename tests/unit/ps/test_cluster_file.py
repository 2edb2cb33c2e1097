"""The chief's STRATEGYJOB_CLUSTER_FILE: re-read when it changes, at most every poll period;
bad content said once, the last good workers kept."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from strategyjob.ps import _cluster, _transport
from strategyjob.ps._cluster_file import ClusterFile

A, B, C = "127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _write(path: Path, content: object) -> None:
    """As a resizer writes it: the whole file, renamed over the old one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(content if isinstance(content, str) else json.dumps(content))
    os.replace(tmp, path)


def test_the_file_is_followed_when_it_changes(tmp_path):
    path, clock = tmp_path / "cluster.json", Clock()
    _write(path, {"chief": [A], "worker": [B], "ps": [C]})
    source = ClusterFile(str(path), poll_seconds=1.0, clock=clock)
    assert source.poll() == {0: B}
    assert source.poll() is None  # within the poll period: not looked at
    clock.now = 1.0
    assert source.poll() is None  # unchanged
    _write(path, {"worker": {"0": B, "2": C}})
    assert source.poll() is None  # written, but the period has not passed
    clock.now = 2.0
    assert source.poll() == {0: B, 2: C}


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ('{"worker": [', "Expecting value"),  # half written
        ({"worker": []}, "it names no worker"),
        (None, "the file does not exist"),
    ],
    ids=["half-written", "no-worker", "removed"],
)
def test_bad_content_is_said_once_and_the_last_good_workers_kept(tmp_path, caplog, bad, said):
    path, clock = tmp_path / "cluster.json", Clock()
    _write(path, {"worker": [A, B]})
    source = ClusterFile(str(path), poll_seconds=1.0, clock=clock)
    assert source.poll() == {0: A, 1: B}
    if bad is None:
        path.unlink()
    else:
        _write(path, bad)
    with caplog.at_level(logging.WARNING, logger="strategyjob.ps._cluster_file"):
        for second in range(1, 4):
            clock.now = float(second)
            assert source.poll() is None
    (record,) = caplog.records
    assert said in record.getMessage()
    assert f"STRATEGYJOB_CLUSTER_FILE={path} cannot be used" in record.getMessage()
    assert "The chief keeps [0, 1]" in record.getMessage()
    _write(path, {"worker": [A, B, C]})
    clock.now = 5.0
    assert source.poll() == {0: A, 1: B, 2: C}


def test_the_chiefs_grpc_transport_follows_the_file_a_workers_does_not(tmp_path, monkeypatch):
    monkeypatch.setattr(_transport, "_cluster", {})  # this process's addresses, restored after
    path = tmp_path / "cluster.json"
    monkeypatch.setenv("STRATEGYJOB_CLUSTER_FILE", str(path))
    _write(path, {"chief": [A], "worker": [B, C], "ps": [A]})
    chief = _cluster.GrpcTransport({"chief": [A], "worker": [B], "ps": [A]})
    assert chief.workers() == {0: B, 1: C}
    assert chief.worker(1).address == C
    # A worker's transport (its Server configured the addresses) does not read the file.
    assert _cluster.GrpcTransport().workers() == {0: B}
