"""Topology and DeviceAssignment.build (pure, in-process): TensorFlow's placements and errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from strategyjob.cluster_resolver import TFConfigClusterResolver
from strategyjob.tpu.experimental import DeviceAssignment, Topology, initialize_tpu_system


@pytest.fixture
def mesh_2x2x1x2() -> Topology:
    """Mesh [2, 2, 1, 2]: four hosts (x, y) with two cores each, listed x-, then y-major."""
    coords = [[[x, y, 0, c] for c in range(2)] for y in range(2) for x in range(2)]
    return Topology(mesh_shape=[2, 2, 1, 2], device_coordinates=coords)


def _replicas(assignment: DeviceAssignment) -> list[list[tuple]]:
    return [
        [assignment.coordinates(r, k) for k in range(assignment.num_cores_per_replica)]
        for r in range(assignment.num_replicas)
    ]


def test_default_eight_replicas_visit_cores_of_a_chip_first(mesh_2x2x1x2):
    assignment = DeviceAssignment.build(mesh_2x2x1x2, num_replicas=8)
    assert assignment.num_replicas == 8 and assignment.num_cores_per_replica == 1
    assert [r[0] for r in _replicas(assignment)] == [
        (0, 0, 0, 0), (0, 0, 0, 1), (1, 0, 0, 0), (1, 0, 0, 1),
        (0, 1, 0, 0), (0, 1, 0, 1), (1, 1, 0, 0), (1, 1, 0, 1),
    ]  # fmt: skip


def test_two_cores_per_replica_form_a_ring(mesh_2x2x1x2):
    assignment = DeviceAssignment.build(
        mesh_2x2x1x2, computation_shape=[1, 1, 1, 2], num_replicas=4
    )
    assert assignment.num_cores_per_replica == 2
    assert _replicas(assignment) == [
        [(0, 0, 0, 0), (0, 0, 0, 1)],
        [(1, 0, 0, 0), (1, 0, 0, 1)],
        [(1, 1, 0, 0), (1, 1, 0, 1)],
        [(0, 1, 0, 0), (0, 1, 0, 1)],
    ]
    assert assignment.core_assignment.shape == (4, 2, 4)


def test_block_of_four_cores_row_major(mesh_2x2x1x2):
    assignment = DeviceAssignment.build(
        mesh_2x2x1x2, computation_shape=[1, 2, 1, 2], num_replicas=2
    )
    assert _replicas(assignment) == [
        [(0, 0, 0, 0), (0, 0, 0, 1), (0, 1, 0, 0), (0, 1, 0, 1)],
        [(1, 0, 0, 0), (1, 0, 0, 1), (1, 1, 0, 0), (1, 1, 0, 1)],
    ]


def test_two_single_core_replicas(mesh_2x2x1x2):
    assignment = DeviceAssignment.build(mesh_2x2x1x2, num_replicas=2)
    assert _replicas(assignment) == [[(0, 0, 0, 0)], [(0, 0, 0, 1)]]


def test_tasks_devices_and_lookup(mesh_2x2x1x2):
    assignment = DeviceAssignment.build(
        mesh_2x2x1x2, computation_shape=[1, 1, 1, 2], num_replicas=4
    )
    assert assignment.task(2, 1) == 3  # (1, 1, 0, 1) is on host 3
    assert assignment.tpu_ordinal(2, 1) == 1
    assert assignment.tpu_device(2, 1, job="worker") == "/job:worker/task:3/device:TPU:1"
    assert assignment.host_device(1, 0) == "/task:1/device:CPU:0"
    assert assignment.lookup_replicas(3, 0) == [2]
    with pytest.raises(ValueError, match="Can not find any replica in task: 9"):
        assignment.lookup_replicas(9, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"computation_shape": [1, 1, 1]}, "computation_shape must have shape [4]; got (3,)"),
        ({"computation_stride": [1, 1, 1]}, "computation_stride must have shape [4]; got (3,)"),
        (
            {"computation_shape": [0, 1, 1, 1]},
            "computation_shape must be positive; got computation_shape=[0 1 1 1]",
        ),
        (
            {"computation_stride": [0, 1, 1, 1]},
            "computation_stride must be positive; got computation_stride=[0 1 1 1]",
        ),
        (
            {"computation_shape": [4, 1, 1, 1]},
            "computation footprint [4 1 1 1] does not fit in TPU topology shape [2 2 1 2]",
        ),
        (
            {"computation_shape": [1, 1, 1, 2], "num_replicas": 5},
            "requested 5 replicas but only 4 replicas with shape [1 1 1 2] and computation_stride "
            "[1 1 1 1] fit in a TPU mesh of shape [2 2 1 2]",
        ),
    ],
)
def test_build_errors(mesh_2x2x1x2, kwargs, message):
    with pytest.raises(ValueError) as info:
        DeviceAssignment.build(mesh_2x2x1x2, **kwargs)
    assert str(info.value) == message


def test_topology_errors():
    with pytest.raises(ValueError) as info:
        Topology(mesh_shape=[2, 2, 1], device_coordinates=[[[0, 0, 0, 0]]])
    assert str(info.value) == (
        "`mesh_shape` must be a sequence of 4 positive entries; got `mesh_shape=[2 2 1]`"
    )
    with pytest.raises(ValueError, match="`device_coordinates` must be a rank 3 int32 array"):
        Topology(mesh_shape=[1, 1, 1, 2], device_coordinates=[[0, 0, 0, 0]])
    with pytest.raises(ValueError, match="must lie inside mesh_shape"):
        Topology(mesh_shape=[1, 1, 1, 2], device_coordinates=[[[0, 0, 0, 2]]])
    with pytest.raises(ValueError, match="`topology` is not a Topology object"):
        DeviceAssignment.build("not a topology")


def test_missing_devices_take_devices_in_task_order():
    topology = Topology(
        mesh_shape=[1, 1, 1, 4], device_coordinates=[[[0, 0, 0, 3]], [[0, 0, 0, 1]]]
    )
    assert topology.missing_devices.tolist() == [[0, 0, 0, 0], [0, 0, 0, 2]]
    assignment = DeviceAssignment.build(topology, num_replicas=2)
    assert _replicas(assignment) == [[(0, 0, 0, 3)], [(0, 0, 0, 1)]]


def test_cluster_topology_is_a_line_of_processes(monkeypatch):
    cluster = {"worker": [f"127.0.0.1:{2000 + i}" for i in range(4)]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}})
    )
    topology = initialize_tpu_system(TFConfigClusterResolver())
    assert topology.mesh_shape.tolist() == [1, 1, 1, 4]
    assert topology.num_tasks == 4 and topology.num_tpus_per_task == 1
    assert [topology.task_ordinal_at_coordinates((0, 0, 0, i)) for i in range(4)] == [0, 1, 2, 3]
    assignment = DeviceAssignment.build(topology, computation_shape=[1, 1, 1, 2], num_replicas=2)
    tasks = [[assignment.task(r, k) for k in range(2)] for r in range(2)]
    assert tasks == [[0, 1], [2, 3]]
    monkeypatch.delenv("TF_CONFIG")
    assert initialize_tpu_system().mesh_shape.tolist() == [1, 1, 1, 1]


def test_core_assignment_constructor_errors(mesh_2x2x1x2):
    with pytest.raises(ValueError, match="core_assignment must be a rank 3 numpy array"):
        DeviceAssignment(mesh_2x2x1x2, np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"core_assignment.shape\[-1\] must have size equal"):
        DeviceAssignment(mesh_2x2x1x2, np.zeros((1, 1, 3)))


def test_topology_api_does_not_import_torch():
    """Building topologies and assignments needs numpy only, never torch."""
    code = (
        "import sys, strategyjob.tpu.experimental as e; e.initialize_tpu_system(); "
        "print('torch' in sys.modules)"
    )
    sdk = Path(__file__).resolve().parents[2] / "sdk"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(sdk), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "False"
