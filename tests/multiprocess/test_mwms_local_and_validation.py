"""MultiWorkerMirroredStrategy in one process: local mode without TF_CONFIG, CommunicationOptions,
and argument/cluster validation that fails before any rendezvous (so never hangs)."""

from __future__ import annotations

import json
import socket
import time

import pytest
import strategyjob as sj
import torch
import torch.nn.functional as F
from strategyjob.cluster_resolver import ClusterSpec, SimpleClusterResolver
from strategyjob.collective.options import CommunicationImplementation, CommunicationOptions
from torch import nn

from ._cluster import free_ports


@pytest.fixture(autouse=True)
def _no_cluster_env(monkeypatch):
    for key in ("TF_CONFIG", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)


def _tf_config(monkeypatch, cluster: dict, task_type: str | None, index: int | None) -> None:
    config: dict = {"cluster": cluster}
    if task_type is not None:
        config["task"] = {"type": task_type, "index": index}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))


# --- CommunicationOptions ---------------------------------------------------------------------
def test_communication_options_defaults_and_exports():
    options = sj.experimental.CommunicationOptions()
    assert (options.bytes_per_pack, options.timeout_seconds) == (0, None)
    assert options.implementation is CommunicationImplementation.AUTO
    assert sj.experimental.CommunicationImplementation is CommunicationImplementation
    assert [m.value for m in CommunicationImplementation] == ["AUTO", "RING", "NCCL"]


def test_communication_options_strings_are_case_insensitive():
    impl = CommunicationImplementation
    assert CommunicationOptions(implementation="ring").implementation is impl.RING
    assert CommunicationOptions(implementation="Nccl").implementation is impl.NCCL
    with pytest.raises(ValueError, match="'FOO' is not a valid CommunicationImplementation"):
        CommunicationOptions(implementation="foo")


def test_communication_options_validation_messages():
    with pytest.raises(ValueError) as e:
        CommunicationOptions(bytes_per_pack=-1)
    assert str(e.value) == "Argument `bytes_per_pack` must be >=0, Received -1."
    with pytest.raises(ValueError) as e:
        CommunicationOptions(implementation=1)
    assert str(e.value) == (
        "Argument `implementation` must be instance of "
        "`tf.distribute.experimental.CommunicationImplementation`."
    )


def test_communication_options_merge_takes_non_default_fields():
    base = CommunicationOptions(bytes_per_pack=10, timeout_seconds=5, implementation="RING")
    assert base.merge(None) == base and base.merge(None) is not base
    merged = base.merge(CommunicationOptions(timeout_seconds=7))
    assert (merged.bytes_per_pack, merged.timeout_seconds) == (10, 7)
    assert merged.implementation is CommunicationImplementation.RING
    merged = base.merge(CommunicationOptions(bytes_per_pack=3, implementation="nccl"))
    assert (merged.bytes_per_pack, merged.timeout_seconds) == (3, 5)
    assert merged.implementation is CommunicationImplementation.NCCL
    assert base.timeout_seconds == 5  # merge does not modify self


# --- local mode ---------------------------------------------------------------------------------
def test_local_mode_without_tf_config():
    strategy = sj.MultiWorkerMirroredStrategy()
    assert sj.experimental.MultiWorkerMirroredStrategy is sj.MultiWorkerMirroredStrategy
    assert isinstance(strategy.cluster_resolver, sj.cluster_resolver.TFConfigClusterResolver)
    assert strategy.extended._in_multi_worker_mode() is False
    assert strategy.extended.experimental_between_graph is True
    assert strategy.extended.should_checkpoint is True
    assert strategy.num_replicas_in_sync == 1
    assert strategy.reduce("SUM", torch.tensor(1.0), axis=None).item() == 1.0


def test_local_mode_trains_like_plain_torch():
    strategy = sj.MultiWorkerMirroredStrategy()
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 3, (8,), generator=torch.Generator().manual_seed(2))
    with strategy.scope():
        torch.manual_seed(0)
        model = nn.Linear(5, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
    torch.manual_seed(0)
    reference = nn.Linear(5, 3)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)

    def step_fn() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):
        strategy.run(step_fn)
        ref_opt.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


# --- validation before any rendezvous -------------------------------------------------------------
def _unreachable_cluster(n: int = 2) -> list[str]:
    return [f"127.0.0.1:{p}" for p in free_ports(n)]  # nobody listens: a rendezvous would hang


@pytest.mark.timeout(30)
def test_communication_options_type_is_checked():
    with pytest.raises(ValueError) as e:
        sj.MultiWorkerMirroredStrategy(communication_options="RING")
    assert str(e.value) == (
        "communication_options must be an instance of "
        "tf.distribute.experimental.CommunicationOptions"
    )


@pytest.mark.timeout(30)
def test_cluster_without_task_is_refused(monkeypatch):
    _tf_config(monkeypatch, {"worker": _unreachable_cluster()}, None, None)
    with pytest.raises(ValueError) as e:
        sj.MultiWorkerMirroredStrategy()
    assert str(e.value) == (
        "When `cluster_spec` is given, you must also specify `task_type` and `task_id`."
    )


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("cluster", "task_type", "index", "message"),
    [
        ({"worker": 2, "foo": 1}, "worker", 0, "Disallowed task type found in cluster spec."),
        ({"worker": 2}, "worker", 3, "The `task_id` 3 exceeds the maximum id of worker."),
        ({"chief": 2, "worker": 1}, "chief", 0, "There must be at most one 'chief' job."),
        ({"worker": 2}, "ps", 0, "`task_type` 'ps' not found in cluster_spec."),
        ({"worker": 2, "ps": 1}, "ps", 0, "Unexpected `task_type` 'ps'"),
        ({"worker": 2}, "foo", 0, "Unrecognized task_type: foo"),
    ],
)
def test_invalid_cluster_fails_fast(monkeypatch, cluster, task_type, index, message):
    addresses = iter(_unreachable_cluster(sum(cluster.values())))
    spec = {job: [next(addresses) for _ in range(n)] for job, n in cluster.items()}
    _tf_config(monkeypatch, spec, task_type, index)
    start = time.monotonic()
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        sj.MultiWorkerMirroredStrategy()
    assert time.monotonic() - start < 5  # no rendezvous was attempted


@pytest.mark.timeout(30)
def test_cluster_resolver_argument_is_used_and_checked():
    resolver = SimpleClusterResolver(ClusterSpec({}), task_type="worker", task_id=0)
    strategy = sj.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    assert strategy.cluster_resolver is resolver
    assert strategy.extended._in_multi_worker_mode() is False
    with pytest.raises(ValueError, match="cluster_resolver must be an instance of"):
        sj.MultiWorkerMirroredStrategy(cluster_resolver="worker:0")


def _waiting_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " waiting for " in line]


@pytest.mark.timeout(30)
def test_absent_peer_ends_rendezvous_with_its_name(monkeypatch, capfd):
    # The rendezvous says every STRATEGYJOB_WAITING_REPORT_SECONDS whom it waits for, and its
    # timeout is STRATEGYJOB_RENDEZVOUS_TIMEOUT, not the collectives' timeout_seconds.
    monkeypatch.setenv("STRATEGYJOB_RENDEZVOUS_TIMEOUT", "3")
    monkeypatch.setenv("STRATEGYJOB_WAITING_REPORT_SECONDS", "1")
    _tf_config(monkeypatch, {"worker": _unreachable_cluster(3)}, "worker", 0)
    options = CommunicationOptions(timeout_seconds=1)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        sj.MultiWorkerMirroredStrategy(communication_options=options)
    elapsed = time.monotonic() - start
    assert str(e.value) == (
        "Timeout waiting for the cluster, timeout is 3 seconds; not joined: "
        "/job:worker/replica:0/task:1, /job:worker/replica:0/task:2."
    )
    assert 3 <= elapsed < 10
    lines = _waiting_lines(capfd.readouterr().err)
    assert lines[0] == (
        "strategyjob: /job:worker/replica:0/task:0 waiting for /job:worker/replica:0/task:1, "
        "/job:worker/replica:0/task:2 (not joined for 1 s; the rendezvous times out after 3 s, "
        "STRATEGYJOB_RENDEZVOUS_TIMEOUT)"
    )
    assert 2 <= len(lines) <= 3, lines  # at 1 s and 2 s (3 s: the timeout may come first)


@pytest.mark.timeout(30)
def test_rendezvous_settings_are_checked(monkeypatch):
    _tf_config(monkeypatch, {"worker": _unreachable_cluster()}, "worker", 0)
    for name in ("STRATEGYJOB_RENDEZVOUS_TIMEOUT", "STRATEGYJOB_WAITING_REPORT_SECONDS"):
        monkeypatch.setenv(name, "ten")
        with pytest.raises(ValueError) as e:
            sj.MultiWorkerMirroredStrategy()
        assert str(e.value).startswith(f"{name}='ten' is not a positive number of seconds.")
        monkeypatch.delenv(name)


# --- rendezvous derived from TF_CONFIG (pure logic) ----------------------------------------------
def test_membership_follows_tensorflow_roles():
    from strategyjob.collective.process_group import membership_from_cluster

    cluster = {"chief": ["c:1000"], "worker": ["w0:2000", "w1:3000"], "ps": ["p:4000"]}
    m = membership_from_cluster(cluster, "worker", 1, environ={})
    assert (m.rank, m.world_size) == (2, 3)  # id_in_cluster, worker_count
    assert (m.master_addr, m.master_port, m.host) == ("c", 1000, "w1")  # leader = chief
    assert m.task_names == (
        "/job:chief/replica:0/task:0",
        "/job:worker/replica:0/task:0",
        "/job:worker/replica:0/task:1",
    )
    no_chief = membership_from_cluster({"worker": ["w0:2000", "w1:3000"]}, "worker", 1, {})
    assert (no_chief.rank, no_chief.master_addr, no_chief.master_port) == (1, "w0", 2000)


def test_membership_environment_takes_precedence():
    from strategyjob.collective.process_group import membership_from_cluster

    env = {"MASTER_ADDR": "leader.svc", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "2"}
    m = membership_from_cluster({"worker": ["a:1", "b:2"]}, "worker", 0, environ=env)
    assert (m.master_addr, m.master_port, m.rank, m.world_size) == ("leader.svc", 29500, 1, 2)
    with pytest.raises(ValueError, match="RANK=5 is outside WORLD_SIZE=2"):
        membership_from_cluster({"worker": ["a:1", "b:2"]}, "worker", 0, environ={"RANK": "5"})
    with pytest.raises(ValueError, match="does not take part in collectives"):
        membership_from_cluster({"worker": ["a:1"], "ps": ["p:1"]}, "ps", 0, environ={})


@pytest.mark.timeout(30)
def test_absent_leader_ends_rendezvous_with_its_name(monkeypatch, capfd):
    monkeypatch.setenv("STRATEGYJOB_RENDEZVOUS_TIMEOUT", "3")
    monkeypatch.setenv("STRATEGYJOB_WAITING_REPORT_SECONDS", "1")
    _tf_config(monkeypatch, {"worker": _unreachable_cluster()}, "worker", 1)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        sj.MultiWorkerMirroredStrategy()
    assert str(e.value).startswith("Timeout waiting for the cluster, timeout is 3 seconds")
    assert "could not reach the collective leader /job:worker/replica:0/task:0" in str(e.value)
    assert time.monotonic() - start < 10
    lines = _waiting_lines(capfd.readouterr().err)
    assert lines[0] == (
        "strategyjob: /job:worker/replica:0/task:1 waiting for /job:worker/replica:0/task:0 "
        "(not joined for 1 s; the rendezvous times out after 3 s, STRATEGYJOB_RENDEZVOUS_TIMEOUT)"
    )


@pytest.mark.timeout(30)
def test_leader_whose_port_is_taken_says_so_at_once(monkeypatch):
    # Another process listens on the leader's TF_CONFIG port: not a timeout, nor "could not
    # reach" itself, but the port that is taken and what to do.
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        cluster = {"worker": [f"127.0.0.1:{port}", _unreachable_cluster()[1]]}
        _tf_config(monkeypatch, cluster, "worker", 0)
        start = time.monotonic()
        with pytest.raises(RuntimeError) as e:
            sj.MultiWorkerMirroredStrategy()
    assert str(e.value) == (
        f"/job:worker/replica:0/task:0 leads the collective rendezvous at its TF_CONFIG address "
        f"127.0.0.1:{port}, but another process already listens on that port. Stop that "
        "process, or give this task a free port in TF_CONFIG's cluster."
    )
    assert time.monotonic() - start < 10


@pytest.mark.timeout(30)
def test_evaluator_outside_the_training_cluster_runs_alone(monkeypatch):
    # strategyjob's TF_CONFIG leaves the evaluator out of the cluster (see jobspec)
    _tf_config(monkeypatch, {"worker": _unreachable_cluster()}, "evaluator", 0)
    strategy = sj.MultiWorkerMirroredStrategy()
    assert strategy.extended._in_multi_worker_mode() is False
    assert strategy.extended.should_checkpoint is True
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0  # one replica per GPU
    prefix = "/job:evaluator/replica:0/task:0/device:"
    expected = tuple(f"{prefix}GPU:{i}" for i in range(gpus)) or (f"{prefix}CPU:0",)
    assert strategy.extended.worker_devices == expected
