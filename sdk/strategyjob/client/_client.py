"""``StrategyJobClient``: submit, read, wait for, read the logs of, and delete StrategyJobs
from Python, the way kubeflow's ``TrainingClient`` does for TFJobs.

Every API failure surfaces as a one-line :class:`strategyjob.errors.ClusterError` (so the
CLI prints it as is); a failed job waited for raises :class:`JobFailedError` carrying the
reason and message of its ``Failed`` condition. ``kubernetes`` is imported lazily: the
package stays importable (and the builder usable) without it.
"""

from __future__ import annotations

import builtins
import copy
import math
import os
import queue
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from strategyjob import jobspec
from strategyjob._history import MetricHistory
from strategyjob._names import GROUP, LABEL_JOB_NAME, PLURAL, VERSION
from strategyjob.client._errors import to_cluster_error
from strategyjob.client._logs import LogLine, merge_by_time, split_lines
from strategyjob.client._summaries import SummaryCopy, leader_replica, reported_logdir, unpack
from strategyjob.client._view import (
    STATES,
    ReplicaInfo,
    SubmittedJob,
    replica_infos,
)
from strategyjob.errors import ClusterError, JobFailedError, StrategyJobError

_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: Longest single watch request inside ``wait``; the watch is renewed until the deadline.
_WATCH_SLICE_SECONDS = 60.0
#: How long a followed log may stay silent (a training step can take hours); the client
#: rejects "no read timeout" in some versions, so it is merely very long.
_FOLLOW_READ_TIMEOUT = 7 * 24 * 3600.0
#: The longest a command run in a pod (``copy_summaries``' tar) may take.
_EXEC_TIMEOUT = 600.0


def _kubernetes() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise StrategyJobError(
            "the Kubernetes client is not installed. Install it with: "
            "pip install 'strategyjob[client]'"
        ) from None
    return kubernetes


class StrategyJobClient:
    """A connection to one cluster and a default namespace.

    ``kubeconfig``/``context`` pick the cluster as ``kubectl`` does (``$KUBECONFIG`` or
    ``~/.kube/config``, current context); inside a pod without a kubeconfig the pod's
    service account is used. ``namespace`` defaults to the context's namespace (the
    pod's own in a cluster), else ``default``. ``request_timeout`` bounds every request
    except streams (``wait`` has its own deadline, followed logs end with the container).
    """

    def __init__(
        self,
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        namespace: str | None = None,
        *,
        request_timeout: float = 30.0,
    ) -> None:
        k8s = _kubernetes()
        self._k8s = k8s
        self._api_client, context_namespace = _connect(k8s, kubeconfig, context)
        self.server: str = self._api_client.configuration.host
        self.namespace: str = namespace or context_namespace or jobspec.DEFAULT_NAMESPACE
        self.request_timeout = request_timeout
        self._custom = k8s.client.CustomObjectsApi(self._api_client)
        self._core = k8s.client.CoreV1Api(self._api_client)

    # --- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        """Release the connection pool (and the client's worker threads)."""
        self._api_client.close()

    def __enter__(self) -> StrategyJobClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- jobs ---------------------------------------------------------------------------------
    def create(
        self,
        job: jobspec.StrategyJob | Mapping[str, Any] | str | os.PathLike[str],
        namespace: str | None = None,
    ) -> SubmittedJob:
        """Submit a job: a typed :class:`StrategyJob` (e.g. from ``StrategyJob.build``), a
        manifest dict, a YAML string, or the path of a YAML file.

        The job goes to ``namespace``, else the manifest's ``metadata.namespace``, else
        the client's namespace (a typed job in ``default`` counts as having none). Dicts,
        YAML and files are sent as written and judged by the API server (its CEL rules);
        typed jobs were validated when they were built. A Kubeflow TFJob manifest is
        created as a TFJob (``kubeflow.org/v1``), for a cluster that serves TFJobs.
        """
        manifest, own_namespace = _as_manifest(job)
        group, version, plural, kind = _resource_of(manifest)
        if namespace and own_namespace and namespace != own_namespace:
            raise StrategyJobError(
                f"the manifest's metadata.namespace is {own_namespace} but namespace "
                f"{namespace} was asked for. Remove one of them."
            )
        ns = namespace or own_namespace or self.namespace
        metadata = manifest.setdefault("metadata", {})
        name = None
        if isinstance(metadata, dict):  # anything else is the API server's to reject
            metadata["namespace"] = ns
            name = metadata.get("name")
        created = self._call(
            self._custom.create_namespaced_custom_object,
            group,
            version,
            ns,
            plural,
            manifest,
            action="create",
            name=name if isinstance(name, str) else None,
            namespace=ns,
            kind=kind,
        )
        return SubmittedJob(created)

    def get(self, name: str, namespace: str | None = None) -> SubmittedJob:
        """The job as the API server holds it now (raises JobNotFoundError)."""
        ns = namespace or self.namespace
        obj = self._call(
            self._custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            ns,
            PLURAL,
            name,
            action="get",
            name=name,
            namespace=ns,
        )
        return SubmittedJob(obj)

    def list(
        self, namespace: str | None = None, label_selector: str | None = None
    ) -> list[SubmittedJob]:
        """The namespace's jobs, by name."""
        ns = namespace or self.namespace
        kwargs = {"label_selector": label_selector} if label_selector else {}
        result = self._call(
            self._custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            ns,
            PLURAL,
            action="list",
            name=None,
            namespace=ns,
            **kwargs,
        )
        jobs = [SubmittedJob(item) for item in result.get("items") or []]
        return sorted(jobs, key=lambda j: j.name)

    def delete(self, name: str, namespace: str | None = None) -> None:
        """Delete the job; the garbage collector removes its pods and Service after it."""
        ns = namespace or self.namespace
        self._call(
            self._custom.delete_namespaced_custom_object,
            GROUP,
            VERSION,
            ns,
            PLURAL,
            name,
            propagation_policy="Background",
            action="delete",
            name=name,
            namespace=ns,
        )

    def scale(self, name: str, replicas: int, namespace: str | None = None) -> SubmittedJob:
        """Ask for ``replicas`` workers, as ``kubectl scale sjob/NAME --replicas=N`` does (the
        CRD's scale subresource): a ParameterServerStrategy job's workers join and leave while
        it runs; the API server refuses, in one line (ClusterError), what the job cannot take."""
        ns = namespace or self.namespace
        self._call(
            self._custom.patch_namespaced_custom_object_scale,
            GROUP,
            VERSION,
            ns,
            PLURAL,
            name,
            {"spec": {"replicas": replicas}},
            action="scale",
            name=name,
            namespace=ns,
        )
        return self.get(name, ns)

    def metrics(
        self, name: str, namespace: str | None = None
    ) -> dict[str, builtins.list[tuple[int, float]]]:
        """The job's metric history: per metric its ``(step, value)`` points, ascending
        steps, as the operator keeps it (bounded: the newest steps one by one, older ones
        thinned). Empty before the job's first report; raises JobNotFoundError without the
        job."""
        from kubernetes.client.exceptions import ApiException

        ns = namespace or self.namespace
        try:
            config_map = self._core.read_namespaced_config_map(
                jobspec.metrics_config_map_name(name), ns, _request_timeout=self.request_timeout
            )
        except ApiException as e:
            if e.status != 404:
                raise self._error(
                    e, "read the metric history of", "StrategyJob", name, ns
                ) from None
            self.get(name, ns)  # no history yet, or no such job (JobNotFoundError)
            return {}
        except Exception as e:
            if not _is_transport_error(e):
                raise
            raise self._error(e, "read the metric history of", "StrategyJob", name, ns) from None
        text = (config_map.data or {}).get(jobspec.METRICS_HISTORY_KEY)
        if not text:
            return {}
        try:
            return MetricHistory.from_json(text).series()
        except ValueError as e:
            raise ClusterError(f"StrategyJob {ns}/{name}: its metric history {e}.") from None

    def replicas(self, name: str, namespace: str | None = None) -> builtins.list[ReplicaInfo]:
        """Every replica the job asks for with its pod's phase (``-`` without a pod)."""
        ns = namespace or self.namespace
        return replica_infos(self.get(name, ns), self._pods(name, ns))

    def _pods(self, name: str, namespace: str) -> dict[str, Mapping[str, Any]]:
        result = self._call(
            self._core.list_namespaced_pod,
            namespace,
            label_selector=f"{LABEL_JOB_NAME}={name}",
            action="list the pods of",
            kind="StrategyJob",
            name=name,
            namespace=namespace,
        )
        pods = self._api_client.sanitize_for_serialization(result).get("items") or []
        return {p["metadata"]["name"]: p for p in pods}

    # --- waiting ------------------------------------------------------------------------------
    def wait(
        self,
        name: str,
        timeout: float = 600.0,
        until: str | Iterable[str] = "Succeeded",
        namespace: str | None = None,
        callback: Callable[[SubmittedJob], None] | None = None,
    ) -> SubmittedJob:
        """Block until the job's state is one of ``until`` (or such a condition is true),
        watching the job rather than polling; return the job.

        A failed job raises :class:`JobFailedError` with its Failed condition's reason
        and message (unless ``"Failed"`` is in ``until``); a job that succeeds ends a wait
        for ``Created``/``Running`` and makes waiting for anything else raise. After
        ``timeout`` seconds, :class:`TimeoutError` names the job and its state.
        ``callback`` sees the job each time its state changes.
        """
        targets = (until,) if isinstance(until, str) else tuple(until)
        unknown = [s for s in targets if s not in STATES]
        if unknown or not targets:
            raise ValueError(f"until must be among {', '.join(STATES)} (got {until!r})")
        ns = namespace or self.namespace
        deadline = time.monotonic() + timeout
        last_state: list[str | None] = []  # the state the callback saw last

        def done(job: SubmittedJob) -> bool:
            if callback is not None and last_state != [job.state]:
                callback(job)
                last_state[:] = [job.state]
            return _reached(job, targets)

        job = self.get(name, ns)
        while not done(job):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"timed out after {timeout:g}s waiting for StrategyJob {name} in namespace "
                    f"{ns} to be {' or '.join(targets)}; it is "
                    f"{job.state or 'not yet seen by the operator'}."
                )
            for obj in self._watch_job(job, min(remaining, _WATCH_SLICE_SECONDS)):
                job = SubmittedJob(obj)
                if done(job):
                    return job
            job = self.get(name, ns)  # the watch ended: read afresh, then watch again
        return job

    def _watch_job(self, job: SubmittedJob, seconds: float) -> Iterator[Mapping[str, Any]]:
        """The job's new versions for up to ``seconds``, from its resourceVersion on."""
        watch = self._k8s.watch.Watch()
        timeout_seconds = max(1, math.ceil(seconds))
        try:
            for event in watch.stream(
                self._custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                job.namespace,
                PLURAL,
                field_selector=f"metadata.name={job.name}",
                resource_version=job.raw["metadata"].get("resourceVersion"),
                timeout_seconds=timeout_seconds,
                _request_timeout=timeout_seconds + self.request_timeout,
            ):
                if event["type"] in ("ADDED", "MODIFIED"):
                    yield event["object"]
                elif event["type"] == "DELETED":
                    return  # the caller's next get raises JobNotFoundError
        except self._k8s.client.exceptions.ApiException as e:
            if e.status != 410:  # 410: the version is too old; the caller reads afresh
                raise self._error(e, "watch", "StrategyJob", job.name, job.namespace) from None
        except Exception as e:
            if not _is_transport_error(e):
                raise
            raise self._error(e, "watch", "StrategyJob", job.name, job.namespace) from None
        finally:
            watch.stop()

    # --- summaries ----------------------------------------------------------------------------
    def copy_summaries(
        self,
        name: str,
        into: str | os.PathLike[str],
        namespace: str | None = None,
        logdir: str | None = None,
    ) -> SummaryCopy:
        """Copy the leader's summaries (event files) out of its pod into the local directory
        ``into``, files already there replaced by their newer copies. ``logdir``: the
        directory inside the pod, by default the one the leader reported
        (``status.progress.logdir``). Needs ``tar`` in the training container and a running
        pod (the API cannot exec into a finished one)."""
        ns = namespace or self.namespace
        job = self.get(name, ns)
        directory = logdir or reported_logdir(job)
        pod, container = self._log_target(name, leader_replica(job), ns)
        with tempfile.TemporaryFile() as archive:
            self._exec_into(pod, ns, container, ["tar", "cf", "-", "-C", directory, "."], archive)
            archive.seek(0)
            try:
                files = unpack(archive, Path(into))
            except (tarfile.TarError, OSError) as e:
                raise StrategyJobError(
                    f"Could not unpack the summaries copied from {directory} in pod {pod} into "
                    f"{into}: {e}"
                ) from None
        return SummaryCopy(pod=pod, logdir=directory, into=Path(into), files=files)

    def _exec_into(
        self, pod: str, ns: str, container: str, command: builtins.list[str], out: IO[bytes]
    ) -> None:
        """Run ``command`` in the container, its stdout written to ``out``; a failure (or an
        exit code other than 0) raises one StrategyJobError quoting its stderr."""
        from kubernetes.stream import stream

        what = f"run {command[0]} in pod {pod}"
        try:
            client = stream(
                self._core.connect_get_namespaced_pod_exec,
                pod,
                ns,
                container=container,
                command=command,
                stdin=False,
                stdout=True,
                stderr=True,
                tty=False,
                binary=True,
                _preload_content=False,
                _request_timeout=self.request_timeout,
            )
        except Exception as e:
            if not _is_transport_error(e):
                raise
            raise self._error(e, f"run {command[0]} in", "pod", pod, ns) from None
        errors: builtins.list[bytes] = []
        deadline = time.monotonic() + _EXEC_TIMEOUT
        try:
            while client.is_open():
                if time.monotonic() > deadline:
                    raise StrategyJobError(
                        f"Could not {what}: it did not finish within {_EXEC_TIMEOUT:.0f} s."
                    )
                client.update(timeout=1)
                out.write(client.read_stdout() or b"")
                errors.append(client.read_stderr() or b"")
            out.write(client.read_stdout() or b"")
            errors.append(client.read_stderr() or b"")
            code = client.returncode
        finally:
            client.close()
        if code:
            said = b"".join(errors).decode("utf-8", "replace").strip()
            raise StrategyJobError(f"Could not {what}: it exited with code {code}: {said}")

    # --- logs ---------------------------------------------------------------------------------
    def logs(
        self,
        name: str,
        replica: str = "worker-0",
        follow: bool = False,
        namespace: str | None = None,
        tail_lines: int | None = None,
    ) -> str | Iterator[str]:
        """The log of one replica (``worker-0``, ``chief-0``, ``ps-1``...) through the
        pods/log API: its text, or with ``follow`` an iterator of lines that ends when
        the container does (close it to stop early)."""
        ns = namespace or self.namespace
        pod, container = self._log_target(name, replica, ns)
        extra = {"tail_lines": tail_lines} if tail_lines is not None else {}
        if not follow:
            return self._read_log(pod, ns, container, **extra)
        return self._follow(pod, ns, container, **extra)

    def iter_logs(
        self,
        name: str,
        replicas: Iterable[str] | None = None,
        follow: bool = False,
        namespace: str | None = None,
    ) -> Iterator[LogLine]:
        """Lines of several replicas (all of the job's when None), each tagged with its
        replica. Without ``follow`` they are interleaved by the kubelet's timestamps;
        with it, in arrival order until every replica's stream ends. A replica whose log
        cannot be read (pod Pending, deleted) gives one ``error`` line instead."""
        ns = namespace or self.namespace
        if replicas is None:
            job = self.get(name, ns)
            wanted = [f"{t}-{i}" for t, i in job.replicas()]
        else:
            wanted = list(replicas)
        if not follow:
            texts: list[tuple[str, str]] = []
            errors: list[LogLine] = []
            for replica in wanted:
                try:
                    pod, container = self._log_target(name, replica, ns)
                    text = self._read_log(pod, ns, container, timestamps=True)
                except ClusterError as e:
                    errors.append(LogLine(replica, str(e), error=True))
                    continue
                texts.append((replica, text))
            yield from errors
            yield from merge_by_time(texts)
            return
        yield from self._follow_many(name, wanted, ns)

    def _follow_many(self, name: str, replicas: builtins.list[str], ns: str) -> Iterator[LogLine]:
        lines: queue.Queue[LogLine | None] = queue.Queue(maxsize=10_000)
        streams: list[Iterator[str]] = []
        lock = threading.Lock()

        def pump(replica: str) -> None:
            try:
                pod, container = self._log_target(name, replica, ns)
                stream = self._follow(pod, ns, container)
                with lock:
                    streams.append(stream)
                for line in stream:
                    lines.put(LogLine(replica, line))
            except ClusterError as e:
                lines.put(LogLine(replica, str(e), error=True))
            except Exception as e:  # a stream closed under the reader when the consumer left
                lines.put(LogLine(replica, f"log stream ended: {e}", error=True))
            finally:
                lines.put(None)

        threads = [
            threading.Thread(target=pump, args=(r,), name=f"logs-{r}", daemon=True)
            for r in replicas
        ]
        for thread in threads:
            thread.start()
        try:
            running = len(threads)
            while running:
                item = lines.get()
                if item is None:
                    running -= 1
                else:
                    yield item
        finally:
            with lock:
                for stream in streams:
                    close = getattr(stream, "close", None)
                    if close is not None:
                        try:
                            close()
                        except Exception:  # a generator running in its thread; it ends anyway
                            pass

    def _log_target(self, name: str, replica: str, ns: str) -> tuple[str, str]:
        """The pod of ``replica`` and its training container."""
        replica_type, _, index = replica.rpartition("-")
        if replica_type not in jobspec.REPLICA_TYPES or not index.isdigit():
            raise StrategyJobError(
                f"replica must be <type>-<index> with type one of "
                f"{', '.join(jobspec.REPLICA_TYPES)}, e.g. worker-0 (got {replica!r})."
            )
        pod_name = f"{name}-{replica}"
        pod = self._call(
            self._core.read_namespaced_pod,
            pod_name,
            ns,
            action="read",
            kind="pod",
            name=pod_name,
            namespace=ns,
        )
        containers = [c.name for c in pod.spec.containers]
        container = (
            jobspec.TRAINING_CONTAINER_NAME
            if jobspec.TRAINING_CONTAINER_NAME in containers
            else containers[0]
        )
        return pod_name, container

    def _read_log(self, pod: str, ns: str, container: str, **extra: Any) -> str:
        # Raw bytes: the client's own decoding json-parses the text, mangling JSON logs.
        response = self._call(
            self._core.read_namespaced_pod_log,
            pod,
            ns,
            container=container,
            _preload_content=False,
            action="read the logs of",
            kind="pod",
            name=pod,
            namespace=ns,
            **extra,
        )
        try:
            data: bytes = response.data
            return data.decode("utf-8", "replace")
        finally:
            response.release_conn()

    def _follow(self, pod: str, ns: str, container: str, **extra: Any) -> Iterator[str]:
        response = self._call(
            self._core.read_namespaced_pod_log,
            pod,
            ns,
            container=container,
            follow=True,
            _preload_content=False,
            # connect within the usual timeout; then wait for lines as long as they come
            request_timeout=(self.request_timeout, _FOLLOW_READ_TIMEOUT),
            action="follow the logs of",
            kind="pod",
            name=pod,
            namespace=ns,
            **extra,
        )
        return self._lines(response, pod, ns)

    def _lines(self, response: Any, pod: str, ns: str) -> Iterator[str]:
        try:
            yield from split_lines(response.stream(None, decode_content=True))
        except Exception as e:
            if not _is_transport_error(e):
                raise
            raise self._error(e, "follow the logs of", "pod", pod, ns) from None
        finally:
            response.close()
            response.release_conn()

    # --- plumbing -----------------------------------------------------------------------------
    def _call(
        self,
        fn: Callable[..., Any],
        *args: Any,
        action: str,
        name: str | None,
        namespace: str,
        kind: str = "StrategyJob",
        request_timeout: Any = None,
        **kwargs: Any,
    ) -> Any:
        """One API request, its failure turned into a one-line ClusterError."""
        timeout = self.request_timeout if request_timeout is None else request_timeout
        try:
            return fn(*args, _request_timeout=timeout, **kwargs)
        except Exception as e:
            if not _is_transport_error(e):
                raise
            raise self._error(e, action, kind, name, namespace) from None

    def _error(
        self, error: BaseException, action: str, kind: str, name: str | None, namespace: str
    ) -> ClusterError:
        return to_cluster_error(
            error, server=self.server, action=action, kind=kind, name=name, namespace=namespace
        )


def _is_transport_error(error: BaseException) -> bool:
    """An answer (ApiException) or a failure to get one (urllib3, socket, TLS)."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    return isinstance(error, ApiException | urllib3.exceptions.HTTPError | OSError)


def _reached(job: SubmittedJob, targets: tuple[str, ...]) -> bool:
    if job.state in targets or any(c.true and c.type in targets for c in job.conditions):
        return True
    if job.state == "Failed":
        failure = job.failure
        raise JobFailedError(
            job.name,
            job.namespace,
            failure.reason if failure else "",
            failure.message if failure else "",
        )
    if job.state == "Succeeded":
        if set(targets) & {"Created", "Running"}:
            return True  # it went through them
        raise StrategyJobError(
            f"StrategyJob {job.name} in namespace {job.namespace} succeeded; it will not "
            f"be {' or '.join(targets)}."
        )
    return False


def _resource_of(manifest: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """``(group, version, plural, kind)`` to create ``manifest`` as: a TFJob's own, else a
    StrategyJob's (whatever else it says is the API server's to refuse)."""
    if jobspec.is_tfjob(manifest):
        return jobspec.TFJOB_GROUP, jobspec.TFJOB_VERSION, jobspec.TFJOB_PLURAL, jobspec.TFJOB_KIND
    return GROUP, VERSION, PLURAL, "StrategyJob"


def _as_manifest(
    job: jobspec.StrategyJob | Mapping[str, Any] | str | os.PathLike[str],
) -> tuple[Any, str | None]:
    """``(manifest to send, the namespace it names or None)``."""
    if isinstance(job, jobspec.StrategyJob):
        manifest: Any = job.to_manifest()
    elif isinstance(job, Mapping):
        manifest = copy.deepcopy(dict(job))
    elif isinstance(job, os.PathLike):
        manifest = jobspec.read_manifest_file(job)
    elif isinstance(job, str):
        text = job.lstrip()
        if "\n" in text or text.startswith(("{", "apiVersion:", "kind:")):
            manifest = jobspec.read_manifest_text(job)
        else:
            manifest = jobspec.read_manifest_file(job)
    else:
        raise TypeError(
            "create() takes a StrategyJob, a manifest dict, a YAML string or a path "
            f"(got {type(job).__name__})"
        )
    if not isinstance(manifest, Mapping):
        raise jobspec.ManifestError(
            [jobspec.messages.NOT_A_MANIFEST.format(value=jobspec.format_value(manifest))]
        )
    manifest = dict(manifest)
    metadata = manifest.get("metadata")
    own = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    if isinstance(metadata, Mapping):
        manifest["metadata"] = dict(metadata)
    return manifest, own if isinstance(own, str) and own else None


#: Where kubectl and the Kubernetes client look when neither --kubeconfig nor KUBECONFIG says.
DEFAULT_KUBECONFIG = "~/.kube/config"


def _missing_kubeconfig(path: str | None, env: str | None) -> str | None:
    """What to say when no kubeconfig file exists where the client will look (``path``, else
    each of ``$KUBECONFIG``'s paths, else ``~/.kube/config``), instead of the Kubernetes
    client's "Invalid kube-config file. No configuration found."; None when one exists."""
    if path is not None:
        if Path(path).is_file():
            return None
        return f"kubeconfig {path}: no such file. Pass the path of a kubeconfig."
    if env:
        if any(Path(p).expanduser().is_file() for p in env.split(os.pathsep) if p):
            return None
        return (
            f"kubeconfig {env} (from $KUBECONFIG): no such file. Set KUBECONFIG to the path "
            "of a kubeconfig, or pass --kubeconfig."
        )
    if Path(DEFAULT_KUBECONFIG).expanduser().is_file():
        return None
    return (
        f"no kubeconfig: {DEFAULT_KUBECONFIG} does not exist and KUBECONFIG is not set. Pass "
        "--kubeconfig, set KUBECONFIG, or write the cluster's kubeconfig to "
        f"{DEFAULT_KUBECONFIG} (kind create cluster does)."
    )


def _connect(
    k8s: Any, kubeconfig: str | os.PathLike[str] | None, context: str | None
) -> tuple[Any, str | None]:
    """``(ApiClient, the context's namespace)`` from a kubeconfig, or in-cluster."""
    config = k8s.config
    path = os.fspath(kubeconfig) if kubeconfig is not None else None
    use_incluster = (
        path is None
        and not os.environ.get("KUBECONFIG")
        and not Path(config.KUBE_CONFIG_DEFAULT_LOCATION).expanduser().exists()
        and os.environ.get("KUBERNETES_SERVICE_HOST")
    )
    if use_incluster:
        configuration = k8s.client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as e:
            raise ClusterError(f"cannot use the pod's service account: {e}") from None
        try:
            namespace = _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
        except OSError:
            namespace = None
        return k8s.client.ApiClient(configuration), namespace

    shown = path or os.environ.get("KUBECONFIG") or config.KUBE_CONFIG_DEFAULT_LOCATION
    missing = _missing_kubeconfig(path, os.environ.get("KUBECONFIG"))
    if missing is not None:
        raise ClusterError(missing)
    try:
        api_client = config.new_client_from_config(config_file=path, context=context)
        contexts, active = config.list_kube_config_contexts(config_file=path)
    except Exception as e:  # ConfigException, YAML errors, unreadable files
        detail = " ".join(str(e).split())
        raise ClusterError(
            f"cannot load kubeconfig {shown}: {detail}. Check --kubeconfig and --context."
        ) from None
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
    namespace = ((chosen or {}).get("context") or {}).get("namespace")
    return api_client, namespace
