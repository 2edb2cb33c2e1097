"""The StrategyJob manifest as frozen dataclasses.

One definition of the fields, their defaults and their allowed values, read by
``strategyjob run`` and by the operator alike (the CRD in ``crds/`` mirrors it).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypedDict, TypeVar, Unpack, get_type_hints

from strategyjob import _names
from strategyjob.errors import StrategyJobError


class ManifestError(StrategyJobError):
    """A manifest is invalid. ``problems`` lists every problem, one sentence each."""

    def __init__(self, problems: Sequence[str], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__("\n".join(self.problems))


API_VERSION = _names.API_VERSION
KIND = _names.KIND

STRATEGIES: tuple[str, ...] = (
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "ParameterServerStrategy",
    "CentralStorageStrategy",
    "TPUStrategy",
    "OneDeviceStrategy",
)
#: Strategies that run as one process (exactly one chief or worker).
SINGLE_PROCESS_STRATEGIES: tuple[str, ...] = (
    "MirroredStrategy",
    "CentralStorageStrategy",
    "OneDeviceStrategy",
)
#: Strategies whose replicas synchronise with collectives: losing one replica stops
#: every other, so a retryable failure restarts the whole job.
COLLECTIVE_STRATEGIES: tuple[str, ...] = tuple(
    s for s in STRATEGIES if s != "ParameterServerStrategy"
)
#: Resizing a running job (issue 30). Its workers join and leave while it trains:
RESIZABLE_STRATEGIES: tuple[str, ...] = ("ParameterServerStrategy",)
#: Re-formed at the new size: every process stops (saving its checkpoint at the next step
#: boundary) and the group starts again at the new world size, resuming from it.
REFORMED_STRATEGIES: tuple[str, ...] = ("MultiWorkerMirroredStrategy", "TPUStrategy")

#: Replica types in the order they are listed, created and reported.
REPLICA_TYPES: tuple[str, ...] = ("chief", "worker", "ps", "evaluator")
#: Replica types whose failure never fails the job nor uses its ``backoffLimit``: the
#: evaluator, outside training (restarted alone, then given up), for the operator and for
#: ``strategyjob run`` alike (a TFJob adds its workers: ``TFJob.optional_types``).
OPTIONAL_REPLICA_TYPES: tuple[str, ...] = ("evaluator",)
RESTART_POLICIES: tuple[str, ...] = ("Never", "OnFailure", "Always", "ExitCode")
CLEAN_POD_POLICIES: tuple[str, ...] = ("None", "Running", "All")
#: "" means: the job succeeds when the chief succeeds (worker 0 when there is no chief).
SUCCESS_POLICIES: tuple[str, ...] = ("", "AllWorkers")

DEFAULT_NAMESPACE = "default"
DEFAULT_PORT = 2222
DEFAULT_REPLICAS = 1
DEFAULT_RESTART_POLICY = "Never"
DEFAULT_BACKOFF_LIMIT = 6
DEFAULT_CLEAN_POD_POLICY = "Running"
#: Longest Kubernetes pod name / DNS label.
MAX_NAME_LENGTH = 63
#: Most replicas of a job, all types together (a CEL rule of the CRD). Every replica's
#: ``TF_CONFIG`` lists the whole cluster, so its size grows with the job; the kernel refuses
#: to start a program with an environment string over :data:`MAX_ENV_STRING_BYTES`. 1000
#: keeps ``TF_CONFIG`` under it for names of up to :func:`max_name_length` characters (20 at
#: 1000 replicas; every name the pod-name rule admits, 54 characters, up to 664). The limit
#: is on the string inside the container: a pod spec holds only the task part of TF_CONFIG
#: and refers to the cluster, stored once per job in a ConfigMap
#: (:func:`strategyjob.jobspec.replica_env_by_reference`), so a job's objects in etcd grow
#: with its size, not its square: at 1000 replicas, 4 MiB in etcd (4 KiB per pod and a
#: ConfigMap under 128 KiB) instead of 127 MiB (tests/integration/test_k8s_job_size.py,
#: bench/bench_job_size.py).
MAX_TOTAL_REPLICAS = 1000
#: Most replicas of one type (the CRD's ``replicas.maximum``): the job's limit.
MAX_REPLICAS = MAX_TOTAL_REPLICAS
#: The kernel's limit on one environment string ``NAME=value`` with its terminating NUL
#: (``MAX_ARG_STRLEN``, 32 pages): ``execve`` fails with E2BIG above it, so a container whose
#: ``TF_CONFIG`` is longer cannot start.
MAX_ENV_STRING_BYTES = 131_072
#: Longest namespace (a DNS label): the CRD's rules cannot see the namespace, so the bound
#: on ``TF_CONFIG`` assumes the longest, and a job admitted in one namespace fits in any.
MAX_NAMESPACE_LENGTH = 63
#: Upper bounds for :func:`tf_config_bound`: ``TF_CONFIG=``, the NUL, and the JSON around the
#: addresses (``{"cluster":{"chief":[...],"ps":[...],"worker":[...]},"task":{...}}``, 81
#: bytes at most); and per address, besides the job's name twice: its quotes and comma (3),
#: ``-worker-999`` (11), the dots, the namespace and ``.svc`` (69), ``:65535`` (6).
TF_CONFIG_FIXED_BYTES = 128
TF_CONFIG_BYTES_PER_REPLICA = 89
#: Largest count or number of seconds in ``runPolicy`` (the CRD's int32 maximum): about 68
#: years, so a deadline or TTL added to any date stays a date.
MAX_INT32 = 2**31 - 1
#: The CRD's bounds on what its CEL rules read in a pod template (CEL's cost budget holds
#: the token-Secret rules only with them; no pod comes near): most ``volumes``, most
#: ``projected.sources`` of one volume, and the longest name of a Secret, ServiceAccount,
#: queue or PriorityClass (a DNS subdomain).
MAX_VOLUMES = 512
MAX_PROJECTED_SOURCES = 128
#: Most ``containers`` (and ``initContainers``) of a pod, ``env`` and ``envFrom`` entries of
#: a container: the same budget, with the token rules on init containers too.
MAX_CONTAINERS = 256
MAX_ENV = 1024
MAX_ENV_FROM = 256
MAX_REFERENCE_LENGTH = 253
#: Container port protocols Kubernetes accepts.
PORT_PROTOCOLS: tuple[str, ...] = ("TCP", "UDP", "SCTP")
#: Container that receives the injected environment; the first container otherwise.
TRAINING_CONTAINER_NAME = "strategyjob"


def tf_config_bound(total_replicas: int, name_length: int) -> int:
    """An upper bound on the bytes of every environment string a replica's process gets
    (``TF_CONFIG`` as expanded in the container, the longest; the pod spec itself holds far
    less) for a job of ``total_replicas`` named with ``name_length`` characters, in any
    namespace, on any port, with at most :data:`MAX_TOTAL_REPLICAS` replicas: the rule the
    CRD and the loader both apply."""
    per_replica = 2 * name_length + TF_CONFIG_BYTES_PER_REPLICA
    return TF_CONFIG_FIXED_BYTES + total_replicas * per_replica


def max_name_length(total_replicas: int) -> int:
    """The longest job name whose ``TF_CONFIG`` stays within :data:`MAX_ENV_STRING_BYTES` for
    ``total_replicas`` replicas (the CRD computes the same with CEL's integer division)."""
    budget = (MAX_ENV_STRING_BYTES - TF_CONFIG_FIXED_BYTES) // max(total_replicas, 1)
    return (budget - TF_CONFIG_BYTES_PER_REPLICA) // 2


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica type: how many pods, their pod template, and how failures restart."""

    replicas: int = DEFAULT_REPLICAS
    template: Mapping[str, Any] = field(default_factory=dict)
    restart_policy: str = DEFAULT_RESTART_POLICY
    #: The bounds of a resize (``kubectl scale``); workers only. None: unbounded.
    min_replicas: int | None = None
    max_replicas: int | None = None


@dataclass(frozen=True)
class SchedulingPolicy:
    """Gang-scheduling hints passed to the batch scheduler (Volcano, Kueue)."""

    min_available: int | None = None
    queue: str | None = None
    priority_class: str | None = None


@dataclass(frozen=True)
class RunPolicy:
    """Job-level lifecycle: restart budget, deadline, cleanup and suspension."""

    backoff_limit: int = DEFAULT_BACKOFF_LIMIT
    active_deadline_seconds: int | None = None
    ttl_seconds_after_finished: int | None = None
    clean_pod_policy: str = DEFAULT_CLEAN_POD_POLICY
    suspend: bool = False
    scheduling_policy: SchedulingPolicy = field(default_factory=SchedulingPolicy)
    #: Seconds a pod may stay Pending (unscheduled, or its image not pulled) before the
    #: job fails with PendingTimeoutExceeded; None waits forever.
    pending_timeout_seconds: int | None = None
    #: Seconds a chief or worker waits in the rendezvous for all of them to start (the
    #: replicas' STRATEGYJOB_RENDEZVOUS_TIMEOUT); None keeps the SDK's default.
    rendezvous_timeout_seconds: int | None = None


class _RequiredBuildOptions(TypedDict):
    strategy: str
    image: str
    command: Sequence[str]


class BuildOptions(_RequiredBuildOptions, total=False):
    """The keywords of :meth:`StrategyJob.build` and ``build_manifest``, defined once for
    both: their signatures (``help()``) and their static types (``**options:
    Unpack[BuildOptions]``) come from here. ``strategy``, ``image`` and ``command`` are
    required; every other keyword defaults to None (the manifest's default) unless
    :data:`BUILD_DEFAULTS` says otherwise."""

    workers: int | None
    ps: int | None
    chief: bool | None
    evaluator: bool
    gpus_per_worker: int
    env: Mapping[str, Any] | None
    namespace: str | None
    restart_policy: str | None
    resources: Mapping[str, Any] | None
    backoff_limit: int | None
    active_deadline_seconds: int | None
    ttl_seconds_after_finished: int | None
    clean_pod_policy: str | None
    success_policy: str | None
    port: int | None
    labels: Mapping[str, str] | None
    annotations: Mapping[str, str] | None


#: The optional keywords of :class:`BuildOptions` whose default is not None.
BUILD_DEFAULTS: Mapping[str, Any] = {"evaluator": False, "gpus_per_worker": 0}

_F = TypeVar("_F", bound=Callable[..., Any])


@functools.cache
def build_signature(
    first: str | None = None, returns: Any = inspect.Signature.empty
) -> inspect.Signature:
    """``(name: str, *, <the keywords of BuildOptions>)``, with ``first`` (``cls``) before
    ``name`` when given."""
    hints = get_type_hints(BuildOptions)
    required = BuildOptions.__required_keys__
    parameters = (
        [] if first is None else [inspect.Parameter(first, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    )
    parameters.append(
        inspect.Parameter("name", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)
    )
    for key, hint in hints.items():
        parameters.append(
            inspect.Parameter(
                key,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=hint,
                default=inspect.Parameter.empty if key in required else BUILD_DEFAULTS.get(key),
            )
        )
    return inspect.Signature(parameters, return_annotation=returns)


def takes_build_options(
    first: str | None = None, returns: Any = inspect.Signature.empty
) -> Callable[[_F], _F]:
    """Give a ``(name, **options: Unpack[BuildOptions])`` function the signature it takes,
    for ``help()`` and ``inspect`` (``first``: ``cls`` of a classmethod)."""

    def apply(target: _F) -> _F:
        target.__signature__ = build_signature(first, returns)  # type: ignore[attr-defined]
        return target

    return apply


def bind_build_options(function: str, name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Every keyword of :class:`BuildOptions`, defaults filled in; a missing or unknown
    keyword raises TypeError as Python does for a function that spells them out."""
    try:
        bound = build_signature().bind(name, **options)
    except TypeError as e:
        raise TypeError(f"{function}() {e}; see help({function})") from None
    bound.apply_defaults()
    return dict(bound.arguments)


@dataclass(frozen=True)
class StrategyJob:
    """A validated StrategyJob. Build it with :func:`load_manifest`.

    ``replica_specs`` holds only the replica types the manifest names, in
    :data:`REPLICA_TYPES` order.
    """

    name: str
    strategy: str
    replica_specs: Mapping[str, ReplicaSpec]
    namespace: str = DEFAULT_NAMESPACE
    run_policy: RunPolicy = field(default_factory=RunPolicy)
    success_policy: str = ""
    port: int = DEFAULT_PORT
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: How a replica type is written in pod names where it differs from the type (a TFJob's
    #: ``Master`` runs as the chief and names its pods ``<job>-master-<i>``); a manifest of
    #: StrategyJob's own has none.
    pod_types: Mapping[str, str] = field(default_factory=dict)

    def num_replicas(self, replica_type: str) -> int:
        """Replicas of ``replica_type``; 0 when the manifest does not name it."""
        spec = self.replica_specs.get(replica_type)
        return spec.replicas if spec is not None else 0

    @property
    def total_replicas(self) -> int:
        return sum(spec.replicas for spec in self.replica_specs.values())

    def replicas(self) -> list[tuple[str, int]]:
        """Every ``(replica_type, index)`` of the job, chief first."""
        return [
            (replica_type, index)
            for replica_type in REPLICA_TYPES
            for index in range(self.num_replicas(replica_type))
        ]

    def pod_name(self, replica_type: str, index: int) -> str:
        """``<job>-<type>-<index>``: the pod's name and hostname."""
        return f"{self.name}-{self.pod_types.get(replica_type, replica_type)}-{index}"

    def to_manifest(self) -> dict[str, Any]:
        """The manifest a user would write for this job (fields at their defaults left
        out); ``load_manifest(job.to_manifest()) == job``."""
        return _codec().to_manifest(self)

    @classmethod
    @takes_build_options(first="cls", returns="StrategyJob")
    def build(cls, name: str, **options: Unpack[BuildOptions]) -> StrategyJob:
        """A job for the common case, without writing YAML: one image, one ``command``.

        Every replica gets a container named ``strategyjob`` with ``image``, ``env`` and
        ``resources``. ``workers`` defaults to 2 (1 for the single-process strategies);
        ``chief`` (None: only under ParameterServerStrategy) runs ``command`` too. Under
        ParameterServerStrategy the chief is the coordinator running ``command``, the
        workers and ``ps`` (default 1) replicas run ``python -m strategyjob.server``.
        ``gpus_per_worker`` sets the ``nvidia.com/gpu`` limit of the replicas that
        compute: the workers, and the chief except under ParameterServerStrategy. The
        other keywords are the manifest's ``runPolicy``/``spec`` fields; None keeps the
        default. Raises :class:`ManifestError` with the messages a manifest with the
        same mistake gets. The keywords are :class:`BuildOptions` (shared with
        ``build_manifest``).
        """
        bind_build_options("StrategyJob.build", name, options)  # TypeError names build
        codec = _codec()
        return codec.load_manifest(codec.build_manifest(name, **options))


class Codec(NamedTuple):
    """The reader and writer of manifests, which sit above the model (they build and read
    ``StrategyJob``s) and back its ``build`` and ``to_manifest``."""

    load_manifest: Callable[[Any], StrategyJob]
    build_manifest: Callable[..., dict[str, Any]]
    to_manifest: Callable[[StrategyJob], dict[str, Any]]


_bound: Codec | None = None


def bind_codec(codec: Codec) -> None:
    """Called by the package (``strategyjob.jobspec``), which Python loads before any of its
    modules: the model reaches the reader and writer without importing them."""
    global _bound
    _bound = codec


def _codec() -> Codec:
    if _bound is None:  # not reachable through any import: the package binds it first
        raise RuntimeError("strategyjob.jobspec did not bind its manifest reader and writer")
    return _bound
