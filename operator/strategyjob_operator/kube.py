"""A small asyncio client for the few Kubernetes calls the reconciler makes, over
aiohttp (a kopf dependency). Creating 1000 pods quickly needs many requests in flight;
the synchronous ``kubernetes`` client and its 20-QPS habits (TFJob's default) would
take minutes. Credentials come from kopf's login (kubeconfig or service account)."""

from __future__ import annotations

import asyncio
import json
import ssl
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


@dataclass(frozen=True)
class Credentials:
    server: str
    token: str | None = None
    ca_path: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    certificate_path: str | None = None
    private_key_path: str | None = None

    @classmethod
    def from_kopf(cls, info: Any) -> Credentials:
        """From the ``kopf.ConnectionInfo`` that kopf's login produced."""
        if info.certificate_data or info.private_key_data:
            raise ValueError(
                "Client certificates given inline are not supported by the StrategyJob "
                "operator's client; use a token or certificate files."
            )
        return cls(
            server=info.server.rstrip("/"),
            token=info.token,
            ca_path=info.ca_path,
            ca_data=info.ca_data,
            insecure=bool(info.insecure),
            certificate_path=info.certificate_path,
            private_key_path=info.private_key_path,
        )


#: Accept header for an object's metadata alone.
PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


class KubeApi:
    """JSON-in, JSON-out calls; one session, at most ``max_in_flight`` connections."""

    def __init__(self, creds: Credentials, max_in_flight: int = 50) -> None:
        self.creds = creds
        self.max_in_flight = max_in_flight
        self._session: aiohttp.ClientSession | None = None

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.creds.server.startswith("https"):
            return False
        ctx = ssl.create_default_context(
            cafile=self.creds.ca_path,
            cadata=self.creds.ca_data.decode() if self.creds.ca_data else None,
        )
        if self.creds.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.creds.certificate_path:
            ctx.load_cert_chain(self.creds.certificate_path, self.creds.private_key_path)
        return ctx

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json"}
            if self.creds.token:
                headers["Authorization"] = f"Bearer {self.creds.token}"
            self._session = aiohttp.ClientSession(
                headers=headers,
                connector=aiohttp.TCPConnector(limit=self.max_in_flight, ssl=self._ssl()),
                timeout=aiohttp.ClientTimeout(total=60),
                json_serialize=json.dumps,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

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
        async with self._get_session().request(
            method,
            self.creds.server + path,
            data=data,
            params=params,
            headers=headers or None,
        ) as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise ApiError(resp.status, method, path, text)
            return json.loads(text) if text else {}

    # --- paths ---------------------------------------------------------------------------------
    @staticmethod
    def job_path(namespace: str, name: str = "", subresource: str = "") -> str:
        path = f"/apis/{c.GROUP}/{c.VERSION}/namespaces/{namespace}/{c.PLURAL}"
        if name:
            path += f"/{name}"
        if subresource:
            path += f"/{subresource}"
        return path

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

    async def list(self, path: str, label_selector: str) -> list[dict[str, Any]]:
        result = await self.request("GET", path, params={"labelSelector": label_selector})
        return result.get("items") or []

    async def create(self, path: str, obj: Mapping[str, Any]) -> bool:
        """Create ``obj``; False when it already exists (creation is idempotent by name)."""
        try:
            await self.request("POST", path, body=obj)
            return True
        except ApiError as e:
            if e.status == 409:
                return False
            raise

    async def delete(self, path: str, *, grace_seconds: int | None = None) -> bool:
        """Delete; False when already gone. Children go in the background."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        try:
            await self.request("DELETE", path, body=body)
            return True
        except ApiError as e:
            if e.status == 404:
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
            "reportingComponent": "strategyjob.dev/operator",
        }
        await self.request("POST", self.core_path(ns, "events"), body=event)


async def bounded_gather(
    calls: Iterable[Callable[[], Awaitable[T]]], limit: int
) -> list[T | BaseException]:
    """Run the calls concurrently, at most ``limit`` at a time; results and errors in order."""
    semaphore = asyncio.Semaphore(limit)

    async def run(call: Callable[[], Awaitable[T]]) -> T:
        async with semaphore:
            return await call()

    return await asyncio.gather(*(run(call) for call in calls), return_exceptions=True)
