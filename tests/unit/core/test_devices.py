"""Device names: logical CPU devices and TF spellings."""

from __future__ import annotations

import pytest
import strategyjob as sj
import torch
from strategyjob._devices import LogicalDevice, canonicalize


@pytest.mark.parametrize(
    ("spec", "kind", "index"),
    [
        ("cpu", "cpu", 0),
        ("cpu:1", "cpu", 1),
        ("CPU:2", "cpu", 2),
        ("/cpu:0", "cpu", 0),
        ("/device:CPU:1", "cpu", 1),
        ("GPU:1", "cuda", 1),
        ("cuda:3", "cuda", 3),
        ("/gpu:0", "cuda", 0),
        (torch.device("cpu"), "cpu", 0),
        (torch.device("cuda", 1), "cuda", 1),
    ],
)
def test_canonicalize(spec: object, kind: str, index: int) -> None:
    device = canonicalize(spec)
    assert (device.device_type, device.index, device.job, device.task) == (
        kind,
        index,
        "localhost",
        0,
    )


def test_full_tf_name_keeps_the_host() -> None:
    device = canonicalize("/job:worker/replica:0/task:1/device:GPU:0")
    assert device.host == ("worker", 0, 1)
    assert device.name == "/job:worker/replica:0/task:1/device:GPU:0"
    assert device.host_cpu.name == "/job:worker/replica:0/task:1/device:CPU:0"


def test_logical_cpus_are_distinct_but_compute_on_the_cpu() -> None:
    cpu0, cpu1 = canonicalize("cpu:0"), canonicalize("cpu:1")
    assert cpu0 != cpu1 and cpu0.torch_device != cpu1.torch_device
    assert cpu1.name == "/job:localhost/replica:0/task:0/device:CPU:1"
    assert torch.zeros(1, device=cpu1.torch_device).device.type == "cpu"
    assert canonicalize(cpu1) is cpu1
    assert canonicalize(cpu1.torch_device) == cpu1
    assert str(LogicalDevice("cpu", 3)) == "/job:localhost/replica:0/task:0/device:CPU:3"


@pytest.mark.parametrize("bad", ["", "cpu:x", "tpu-ish:0", "/job:w/task:one/device:CPU:0", 3])
def test_bad_devices_get_one_clear_error(bad: object) -> None:
    with pytest.raises(ValueError, match=r"Cannot interpret .* as a device"):
        canonicalize(bad)


def test_to_device_does_not_copy_between_logical_cpus() -> None:
    from strategyjob._devices import to_device

    tensor = torch.zeros(3)
    assert tensor.to(torch.device("cpu", 1)) is not tensor  # why the helper exists
    assert to_device(tensor, torch.device("cpu", 1)) is tensor
    assert to_device(tensor, "cpu:0") is tensor
    assert to_device(tensor, canonicalize("/device:CPU:3")) is tensor


def _missing_gpu() -> tuple[str, str]:
    """A GPU this machine lacks (the first index past the ones it has) and what the error
    says the process sees, for a machine without GPUs and one with some."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    seen = "no GPU" if count == 0 else f"{count} GPU{'s' if count > 1 else ''}"
    if count:
        seen += f" (GPU:0 to GPU:{count - 1})"
    return f"/gpu:{count}", seen


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda gpu: sj.MirroredStrategy([gpu]), id="mirrored"),
        pytest.param(lambda gpu: sj.MirroredStrategy(["/cpu:0", gpu]), id="mirrored-cpu-and-gpu"),
        pytest.param(lambda gpu: sj.OneDeviceStrategy(gpu), id="one-device"),
        pytest.param(lambda gpu: sj.CentralStorageStrategy([gpu]), id="central-storage"),
        pytest.param(
            lambda gpu: sj.CentralStorageStrategy(["cpu:0"], parameter_device=gpu),
            id="central-storage-parameter-device",
        ),
    ],
)
def test_a_device_the_machine_lacks_is_refused_when_the_strategy_is_made(make) -> None:
    """TensorFlow's ``<name> unknown device.``, at construction rather than at the first batch
    deep in strategy.run, with what the process does see."""
    gpu, seen = _missing_gpu()
    with pytest.raises(RuntimeError) as info:
        make(gpu)
    index = gpu.rpartition(":")[2]
    assert str(info.value) == (
        f"/job:localhost/replica:0/task:0/device:GPU:{index} unknown device. This process sees "
        f"{seen}: name one it has, e.g. '/cpu:0', or pass no devices to use every local GPU "
        "(the CPU when there is none)."
    )


def test_logical_cpus_need_no_such_device() -> None:
    assert sj.MirroredStrategy(["cpu:0", "cpu:7"]).num_replicas_in_sync == 2
