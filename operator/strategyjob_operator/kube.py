"""A small asyncio client for the few Kubernetes calls the reconciler makes, over
aiohttp (a kopf dependency). Creating 1000 pods quickly needs many requests in flight;
the synchronous ``kubernetes`` client and its 20-QPS habits (TFJob's default) would
take minutes. Credentials come from kopf's login (kubeconfig or service account)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from strategyjob_operator import constants as c

T = TypeVar("T")


class ApiError(Exception):
    """A Kubernetes API call failed; ``status`` is the HTTP status."""

    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        try:
            detail = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            detail = body
        super().__init__(f"{method} {path} failed with HTTP {status}: {detail}")
        self.status = status
        self.method = method
        self.path = path
        #: The API server's message (its Status' ``message``), without the request.
        self.detail = str(detail)


def _pem(value: str | bytes | None, field: str) -> str | None:
    """PEM text from a kubeconfig ``*-data`` field: kopf's login passes these on as written,
    base64-encoded PEM (kind, k3d, kubeadm, GKE, EKS), while some tools put PEM itself."""
    if value is None or value == "" or value == b"":
        return None
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    if text.lstrip().startswith("-----BEGIN "):
        return text
    try:
        decoded = base64.b64decode("".join(text.split()), validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError):
        decoded = ""
    if not decoded.lstrip().startswith("-----BEGIN "):
        raise ValueError(
            f"The kubeconfig's {field} is neither PEM nor base64-encoded PEM; "
            "write it as `base64 -w0 < file.pem`, or name the file with the field without -data."
        )
    return decoded


@dataclass(frozen=True)
class Credentials:
    """How to reach and authenticate to the API server: every form kopf's login yields
    (CA, client certificate and key as files or as kubeconfig data; bearer token, other
    schemes, basic auth; proxy)."""

    server: str
    token: str | None = None
    scheme: str | None = None
    username: str | None = None
    password: str | None = None
    ca_path: str | None = None
    ca_data: str | None = None  # PEM
    insecure: bool = False
    certificate_path: str | None = None
    certificate_data: str | None = None  # PEM
    private_key_path: str | None = None
    private_key_data: str | None = None  # PEM
    proxy_url: str | None = None
    trust_env: bool = False

    @classmethod
    def from_kopf(cls, info: Any) -> Credentials:
        """From the ``kopf.ConnectionInfo`` that kopf's login produced; base64 ``*-data``
        fields are decoded here, so a bad one fails the login with one line, not every pass."""

        def path(name: str) -> str | None:
            value = getattr(info, name, None)
            return os.fsdecode(value) if value else None

        creds = cls(
            server=str(info.server).rstrip("/"),
            token=getattr(info, "token", None) or None,
            scheme=getattr(info, "scheme", None) or None,
            username=getattr(info, "username", None) or None,
            password=getattr(info, "password", None) or None,
            ca_path=path("ca_path"),
            ca_data=_pem(getattr(info, "ca_data", None), "certificate-authority-data"),
            insecure=bool(getattr(info, "insecure", False)),
            certificate_path=path("certificate_path"),
            certificate_data=_pem(
                getattr(info, "certificate_data", None), "client-certificate-data"
            ),
            private_key_path=path("private_key_path"),
            private_key_data=_pem(getattr(info, "private_key_data", None), "client-key-data"),
            proxy_url=getattr(info, "proxy_url", None) or None,
            trust_env=bool(getattr(info, "trust_env", False)),
        )
        has_cert = bool(creds.certificate_path or creds.certificate_data)
        has_key = bool(creds.private_key_path or creds.private_key_data)
        if has_cert != has_key:
            missing = "client-key" if has_cert else "client-certificate"
            raise ValueError(
                f"The kubeconfig's user has a client {'certificate' if has_cert else 'key'} "
                f"but no {missing}(-data); give both, or neither."
            )
        return creds

    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header, as kopf sends it."""
        if self.username and self.password:
            pair = f"{self.username}:{self.password}".encode()
            return {"Authorization": "Basic " + base64.b64encode(pair).decode("ascii")}
        if self.token:
            return {"Authorization": f"{self.scheme or 'Bearer'} {self.token}"}
        if self.scheme:
            return {"Authorization": self.scheme}
        return {}

    def ssl_context(self) -> ssl.SSLContext | bool:
        """TLS settings: the cluster's CA, the client certificate. Python's ssl loads a
        certificate chain only from files, so inline ones live in a private temporary
        directory for the moment it takes to load them."""
        if not self.server.startswith("https"):
            return False
        ctx = ssl.create_default_context(cafile=self.ca_path, cadata=self.ca_data)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.certificate_path or self.certificate_data:
            with tempfile.TemporaryDirectory(prefix="strategyjob-tls-") as tmp:
                cert, key = self.certificate_path, self.private_key_path
                if self.certificate_data:
                    cert = os.path.join(tmp, "client.crt")
                    _write_private(cert, self.certificate_data)
                if self.private_key_data:
                    key = os.path.join(tmp, "client.key")
                    _write_private(key, self.private_key_data)
                assert cert is not None  # a certificate path or data, tested above
                ctx.load_cert_chain(cert, key)
        return ctx


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


#: Seconds a request may take (whole), so also how long a replaced session may be in use.
REQUEST_TIMEOUT = 60.0

#: Accept header for an object's metadata alone.
PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
#: Accept header for a list of objects' metadata alone.
PARTIAL_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


class KubeApi:
    """JSON-in, JSON-out calls; one session, at most ``max_in_flight`` connections."""

    def __init__(
        self,
        creds: Credentials,
        max_in_flight: int = 50,
        *,
        refresh: Callable[[], Awaitable[Credentials | None]] | None = None,
    ) -> None:
        self.max_in_flight = max_in_flight
        #: Logs in again when the API server answers 401 (see :meth:`_refresh`).
        self.refresh = refresh
        self._refresh_lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None
        #: Sessions of earlier credentials, with when they were replaced: closed once no
        #: request can still be using them (:data:`REQUEST_TIMEOUT` later).
        self._retired: list[tuple[float, aiohttp.ClientSession]] = []
        self._closing: set[asyncio.Task[None]] = set()
        self.creds = creds
        self._ssl = creds.ssl_context()  # a bad certificate or key fails here, once

    def use(self, creds: Credentials) -> None:
        """New credentials (kopf logged in again, e.g. a rotated token or an expired exec
        plugin's): the next request opens a session with them; requests in flight finish
        on the old one, which :meth:`close` closes."""
        ssl_ctx = creds.ssl_context()
        self.creds, self._ssl = creds, ssl_ctx
        if self._session is not None:
            self._retired.append((time.monotonic(), self._session))
            self._session = None

    def _close_retired(self) -> None:
        done = time.monotonic() - REQUEST_TIMEOUT - 1
        old = [s for t, s in self._retired if t < done]
        if not old:
            return
        self._retired = [(t, s) for t, s in self._retired if t >= done]
        for session in old:
            task = asyncio.ensure_future(session.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _get_session(self) -> aiohttp.ClientSession:
        if self._retired:
            self._close_retired()
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json", **self.creds.headers()}
            self._session = aiohttp.ClientSession(
                headers=headers,
                connector=aiohttp.TCPConnector(limit=self.max_in_flight, ssl=self._ssl),
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
                json_serialize=json.dumps,
                trust_env=self.creds.trust_env,
            )
        return self._session

    async def close(self) -> None:
        sessions = [s for _, s in self._retired] + ([self._session] if self._session else [])
        self._retired, self._session = [], None
        for session in sessions:
            await session.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        accept: str | None = None,
    ) -> dict[str, Any]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        if accept:
            headers["Accept"] = accept
        for attempt in range(2):
            creds = self.creds
            async with self._get_session().request(
                method,
                creds.server + path,
                data=data,
                params=params,
                headers=headers or None,
                proxy=creds.proxy_url,
            ) as resp:
                text = await resp.text()
                status = resp.status
            if status == 401 and attempt == 0 and await self._refresh(creds):
                continue  # an expired token: once more with the new credentials
            if status >= 400:
                raise ApiError(status, method, path, text)
            return json.loads(text) if text else {}
        raise AssertionError("unreachable")

    async def _refresh(self, rejected: Credentials) -> bool:
        """Log in again after a 401 (an exec plugin's token or a ServiceAccount token that
        expired); concurrent requests refused with the same credentials share one login."""
        if self.refresh is None:
            return False
        async with self._refresh_lock:
            if self.creds is rejected:
                fresh = await self.refresh()
                if fresh is None or fresh == rejected:
                    return False
                self.use(fresh)
        return True

    # --- paths ---------------------------------------------------------------------------------
    @staticmethod
    def core_path(namespace: str, plural: str, name: str = "") -> str:
        path = f"/api/v1/namespaces/{namespace}/{plural}"
        return f"{path}/{name}" if name else path

    @staticmethod
    def group_path(group_version: str, namespace: str, plural: str, name: str = "") -> str:
        """Namespaced objects of a named API group, e.g. ``rbac.authorization.k8s.io/v1``."""
        path = f"/apis/{group_version}/namespaces/{namespace}/{plural}"
        return f"{path}/{name}" if name else path

    # --- verbs -----------------------------------------------------------------------------------
    async def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return await self.request("GET", path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def get_metadata(self, path: str) -> dict[str, Any] | None:
        """The object's metadata only (``PartialObjectMetadata``: a Secret's data is never
        read), or None when it does not exist."""
        try:
            return await self.request("GET", path, accept=PARTIAL_METADATA)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def list_resource_quotas(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's ResourceQuotas (a gang's pods are created only if all fit)."""
        page = await self.request("GET", self.core_path(namespace, "resourcequotas"))
        return [item for item in page.get("items") or [] if isinstance(item, dict)]

    async def list_metadata(self, path: str, label_selector: str) -> list[dict[str, Any]]:
        """The metadata alone of the objects matching ``label_selector``
        (``PartialObjectMetadata``, without ``managedFields``): names, uids and
        resourceVersions, to tell which objects changed since they were last read."""
        return await self._list(path, label_selector, PARTIAL_METADATA_LIST)

    async def _list(
        self, path: str, label_selector: str, accept: str | None
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector, "limit": str(LIST_PAGE_SIZE)}
        items: list[dict[str, Any]] = []
        while True:
            page = await self.request("GET", path, params=params, accept=accept)
            items.extend(observed_part(item) for item in page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            params["continue"] = token
            del page

    async def list(self, path: str, label_selector: str) -> list[dict[str, Any]]:
        """The objects matching ``label_selector``, read :data:`LIST_PAGE_SIZE` at a time,
        pods without what the operator never reads (:func:`observed_part`), so that listing
        a large job holds one page of full pods, never all of them."""
        return await self._list(path, label_selector, None)

    async def create(self, path: str, obj: Mapping[str, Any]) -> bool:
        """Create ``obj``; False when it already exists (creation is idempotent by name)."""
        try:
            await self.request("POST", path, body=obj)
            return True
        except ApiError as e:
            if e.status == 409:
                return False
            raise

    async def delete(
        self, path: str, *, grace_seconds: int | None = None, uid: str | None = None
    ) -> bool:
        """Delete; False when already gone (or, with ``uid``, replaced by a namesake: the
        API server's precondition refuses it with 409). Children go in the background."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", path, body=body)
            return True
        except ApiError as e:
            if e.status == 404 or (e.status == 409 and uid is not None):
                return False
            raise

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request(
            "PATCH", path, body=patch, content_type="application/merge-patch+json"
        )

    async def post_event(
        self, involved: Mapping[str, Any], type_: str, reason: str, message: str, now: str
    ) -> None:
        meta = involved["metadata"]
        ns = meta.get("namespace", "default")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": ns},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta["name"],
                "namespace": ns,
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": "strategyjob-operator"},
            "reportingComponent": f"{c.GROUP}/operator",
        }
        await self.request("POST", self.core_path(ns, "events"), body=event)


#: Objects per page of :meth:`KubeApi.list`.
LIST_PAGE_SIZE = 100


def observed_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` without what the operator never reads back: its ``managedFields`` and, for
    a pod, its (init) containers' ``env`` (a template's own env may be large; the cluster
    part of TF_CONFIG is in the job's ConfigMap). ``obj`` itself is left as it was (a
    watch event's body is kopf's); the parts kept are shared with it, not copied."""
    out = dict(obj)
    meta = out.get("metadata")
    if isinstance(meta, Mapping) and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    spec = out.get("spec")
    if isinstance(spec, Mapping):
        spec = out["spec"] = dict(spec)
        for key in ("initContainers", "containers"):
            containers = spec.get(key)
            if isinstance(containers, list):
                spec[key] = [
                    {k: v for k, v in x.items() if k != "env"} if isinstance(x, Mapping) else x
                    for x in containers
                ]
    return out


async def bounded_gather(
    calls: Iterable[Callable[[], Awaitable[T]]], limit: int
) -> list[T | BaseException]:
    """Run the calls concurrently, at most ``limit`` at a time; results and errors in order."""
    semaphore = asyncio.Semaphore(limit)

    async def run(call: Callable[[], Awaitable[T]]) -> T:
        async with semaphore:
            return await call()

    return await asyncio.gather(*(run(call) for call in calls), return_exceptions=True)
