"""``ClusterResolver`` (the interface strategies read their cluster from),
``SimpleClusterResolver`` and ``TFConfigClusterResolver``, as in ``tf.distribute``."""

from __future__ import annotations

import abc
import importlib.util
import json
import os
from typing import Any

from strategyjob import _names
from strategyjob.cluster_resolver._cluster_spec import ClusterSpec
from strategyjob.errors import StrategyJobError

_TF_CONFIG = _names.ENV_TF_CONFIG
_SESSION_MASTER_KEY = "session_master"
_RPC_LAYER_KEY = "rpc_layer"
_TASK_KEY = "task"
_CLUSTER_KEY = "cluster"


class TFConfigError(StrategyJobError, ValueError):
    """``TF_CONFIG`` is set but is not a JSON object."""


def format_master_url(master: str, rpc_layer: str | None = None) -> str:
    """``"<rpc_layer>://<master>"``, or ``master`` alone when there is no rpc layer."""
    return f"{rpc_layer}://{master}" if rpc_layer else master


def local_accelerators() -> dict[str, int]:
    """Accelerators of this process, e.g. ``{"GPU": 2}``; ``{}`` without CUDA.

    torch is imported only here, at call time and only if it is installed, so the
    cluster resolvers stay importable by the torch-free launcher and operator.
    """
    if importlib.util.find_spec("torch") is None:
        return {}
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"GPU": count} if count else {}


def load_tf_config() -> dict[str, Any]:
    """``TF_CONFIG`` parsed (``{}`` when unset or empty); re-read on every call."""
    raw = os.environ.get(_TF_CONFIG, "")
    if not raw.strip():
        return {}
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise TFConfigError(
            f"TF_CONFIG is not valid JSON: {e}. Set TF_CONFIG to a JSON object such as "
            '{"cluster": {"worker": ["host0:2222", "host1:2222"]}, '
            '"task": {"type": "worker", "index": 0}}, or unset it to run locally.'
        ) from None
    if not isinstance(config, dict):
        raise TFConfigError(
            f"TF_CONFIG must be a JSON object with 'cluster' and 'task' keys "
            f"(got a JSON {type(config).__name__}: {raw.strip()[:80]}). "
            "Unset it to run locally."
        )
    return config


def task_index(value: Any) -> int:
    """``TF_CONFIG``'s ``task.index`` as an integer. TensorFlow takes ``int(index)``, so
    ``"1"`` is task 1 here too; but where ``int`` would raise its bare message (``"abc"``)
    or quietly pick another task (``1.5`` is 1, ``true`` is 1, ``-1`` the last one's address),
    this says what is wrong."""
    index = value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(value, str):
        try:
            index = int(value)
        except ValueError:
            pass
    if index is not None and index >= 0:
        return index
    raise TFConfigError(
        f"TF_CONFIG task index must be a whole number, 0 or more "
        f"(got {json.dumps(value, default=repr)}). "
        'Write it as a JSON number, e.g. "task": {"type": "worker", "index": 1}.'
    )


class ClusterResolver(abc.ABC):
    """Tells a strategy which cluster it runs in and which task this process is.

    Subclasses implement :meth:`cluster_spec` and :meth:`master`; the task
    identity (``task_type``, ``task_id``) and ``rpc_layer`` are settable properties.
    """

    _task_type: str | None = None
    _task_id: int | None = None
    _rpc_layer: str | None = None
    _environment: str | None = ""

    @abc.abstractmethod
    def cluster_spec(self) -> ClusterSpec:
        """The current cluster. May change between calls (it is re-read)."""

    @abc.abstractmethod
    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """The address of the session master of ``(task_type, task_id)``."""

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: Any = None
    ) -> dict[str, int]:
        """Accelerator counts by type (``{"GPU": 2}``) of this process's task."""
        del task_type, task_id, config_proto
        return local_accelerators()

    @property
    def environment(self) -> str | None:
        """The environment the cluster runs in (e.g. ``"google"``); ``""`` when unknown."""
        return self._environment

    @property
    def task_type(self) -> str | None:
        return self._task_type

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        return self._task_id

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        return self._rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer


class SimpleClusterResolver(ClusterResolver):
    """A resolver over a fixed :class:`ClusterSpec` and master address."""

    def __init__(
        self,
        cluster_spec: ClusterSpec,
        master: str = "",
        task_type: str | None = None,
        task_id: int | None = None,
        environment: str = "",
        num_accelerators: dict[str, int] | None = None,
        rpc_layer: str | None = None,
    ) -> None:
        if not isinstance(cluster_spec, ClusterSpec):
            raise TypeError("cluster_spec must be a `tf.train.ClusterSpec`.")
        if not isinstance(master, str):
            raise TypeError("master must be a string.")
        self._cluster_spec = cluster_spec
        self._master = master
        self._task_type = task_type
        self._task_id = task_id
        self._environment = environment
        self._num_accelerators = num_accelerators
        self._rpc_layer = rpc_layer

    def cluster_spec(self) -> ClusterSpec:
        return self._cluster_spec

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """Address of ``(task_type, task_id)`` when both are given, else the stored
        master; prefixed with ``rpc_layer or self.rpc_layer``."""
        if task_type is not None and task_id is not None:
            master = self._cluster_spec.task_address(task_type, task_id)
        else:
            master = self._master
        return format_master_url(master, rpc_layer=rpc_layer or self._rpc_layer)

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: Any = None
    ) -> dict[str, int]:
        """The ``num_accelerators`` given to the constructor, ``{}`` if none."""
        del task_type, task_id, config_proto
        return {} if self._num_accelerators is None else self._num_accelerators


class TFConfigClusterResolver(ClusterResolver):
    """Reads the cluster and this task from the ``TF_CONFIG`` environment variable,
    which ``strategyjob run`` and the operator set for every replica.

    ``TF_CONFIG`` is re-read on every call. Constructor arguments override its values.
    """

    def __init__(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
        environment: str | None = None,
    ) -> None:
        self._task_type = task_type
        self._task_id = task_id
        self._rpc_layer = rpc_layer
        self._environment = environment

    @property
    def task_type(self) -> str | None:
        if self._task_type is not None:
            return str(self._task_type)
        task = load_tf_config().get(_TASK_KEY) or {}
        return str(task["type"]) if "type" in task else None

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        if self._task_id is not None:
            return int(self._task_id)
        task = load_tf_config().get(_TASK_KEY) or {}
        return task_index(task["index"]) if "index" in task else None

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        return self._rpc_layer or load_tf_config().get(_RPC_LAYER_KEY)

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    @property
    def environment(self) -> str | None:
        return self._environment

    @environment.setter
    def environment(self, environment: str | None) -> None:
        self._environment = environment

    def cluster_spec(self) -> ClusterSpec:
        """``ClusterSpec`` of ``TF_CONFIG["cluster"]``; empty when there is none."""
        config = load_tf_config()
        if _CLUSTER_KEY not in config:
            return ClusterSpec({})
        return ClusterSpec(config[_CLUSTER_KEY])

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """``session_master`` if set; ``""`` for a cluster of at most one task;
        else the address of ``(task_type, task_id)`` (default: this task)."""
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        rpc_layer = rpc_layer if rpc_layer is not None else self.rpc_layer

        config = load_tf_config()
        if _SESSION_MASTER_KEY in config:
            return str(config[_SESSION_MASTER_KEY])
        cluster_spec = self.cluster_spec()
        jobs = cluster_spec.jobs
        if not jobs or (len(jobs) == 1 and cluster_spec.num_tasks(jobs[0]) == 1):
            return ""
        # No task (TF_CONFIG has none, none given): TF's messages for an unknown job or index.
        if task_type is None:
            raise ValueError(f"No such job in cluster: {task_type!r}")
        if task_id is None:
            raise ValueError(f"No task with index {task_id!r} in job {task_type!r}")
        address = cluster_spec.task_address(task_type, task_id)
        return format_master_url(address, rpc_layer)

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: Any = None
    ) -> dict[str, int]:
        """This process's accelerators when asked about its own task (the default);
        ``{}`` for another task, whose devices this process cannot see."""
        del config_proto
        own = (self.task_type, self.task_id)
        asked = (
            task_type if task_type is not None else own[0],
            task_id if task_id is not None else own[1],
        )
        if asked != own:
            return {}
        return local_accelerators()
