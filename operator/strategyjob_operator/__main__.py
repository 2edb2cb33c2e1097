"""``python -m strategyjob_operator``: run the operator with kopf."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import sys
import time
from typing import Any

import aiohttp
import kopf

import strategyjob_operator  # noqa: F401  (registers the handlers)
from strategyjob_operator import cluster_login, settings, state
from strategyjob_operator import constants as c
from strategyjob_operator.flavor import ENV_SERVE_TFJOBS, TFJOB
from strategyjob_operator.kube import Credentials
from strategyjob_operator.stopping import one_line

logger = logging.getLogger("strategyjob_operator")

#: Seconds to keep trying an API server that does not answer at startup (``STRATEGYJOB_
#: STARTUP_SECONDS``): a pod may start before the cluster's network reaches the API server.
#: Then the operator exits with one line, and the kubelet restarts it with a back-off; 30 s
#: says so before the chart's liveness probe (10 s delay, 3 failures 10 s apart) would kill it.
DEFAULT_STARTUP_SECONDS = 30.0
#: Seconds one startup request may take.
_ATTEMPT_SECONDS = 10.0


class StartupError(Exception):
    """Why the operator cannot start: one line, saying what to do."""


def startup_seconds(value: str) -> float:
    """``STRATEGYJOB_STARTUP_SECONDS``: how long to wait for the API server at startup."""
    try:
        return settings.positive_seconds(c.ENV_STARTUP_SECONDS, value, DEFAULT_STARTUP_SECONDS)
    except ValueError as e:
        raise StartupError(str(e)) from None


def cluster_credentials() -> Credentials:
    """The credentials kopf's login will use, loaded once before kopf starts: kopf waits
    forever for credentials when its login fails, so a bad kubeconfig would hang it."""
    source = (
        f"the kubeconfig {os.environ['KUBECONFIG']!r}"
        if os.environ.get("KUBECONFIG")
        else "the cluster credentials"
    )
    try:
        info = cluster_login.connection_info(settings=kopf.OperatorSettings(), logger=logger)
        if info is None:
            raise StartupError(
                "No cluster credentials: no ServiceAccount token (in a pod) and no kubeconfig "
                "(KUBECONFIG or ~/.kube/config); set KUBECONFIG to your cluster's kubeconfig."
            )
        creds = Credentials.from_kopf(info)
        for field, path in (
            ("certificate-authority", creds.ca_path),
            ("client-certificate", creds.certificate_path),
            ("client-key", creds.private_key_path),
        ):
            if path and not os.path.isfile(path):  # ssl's own error names no file
                raise StartupError(
                    f"The {field} file {path!r} named by {source} does not exist: fix the "
                    f"path, or give the certificate inline as {field}-data."
                )
        creds.ssl_context()  # a certificate or key that is bad fails here
    except StartupError:
        raise
    except Exception as e:
        raise StartupError(
            f"Cannot use {source}: {one_line(e)}; fix it (kubectl --kubeconfig=FILE "
            "get ns must work) or point KUBECONFIG at a working one."
        ) from None
    return creds


async def check_cluster(creds: Credentials, seconds: float, serve_tfjobs: bool = False) -> None:
    """Reach the API server with ``creds``: an unreachable server or one that answers 5xx is
    tried again for ``seconds``; credentials it refuses, a certificate it cannot prove, or
    no StrategyJob CRD after ``seconds`` raise :class:`StartupError` naming the fix; so does
    no TFJob CRD when the operator is to serve TFJobs (``serve_tfjobs``)."""
    url = f"{creds.server}/apis/{c.GROUP}/{c.VERSION}"
    deadline = time.monotonic() + seconds
    delay, last = 0.5, ""
    async with aiohttp.ClientSession(
        headers={"Accept": "application/json", **creds.headers()},
        connector=aiohttp.TCPConnector(ssl=creds.ssl_context()),
        trust_env=creds.trust_env,
    ) as session:
        while True:
            left = deadline - time.monotonic()
            try:
                async with session.get(
                    url,
                    proxy=creds.proxy_url,
                    timeout=aiohttp.ClientTimeout(total=max(1.0, min(_ATTEMPT_SECONDS, left))),
                ) as resp:
                    status = resp.status
                    await resp.read()
            except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError) as e:
                raise StartupError(
                    f"TLS with the API server {creds.server} failed ({one_line(e)}): "
                    "set the kubeconfig's certificate-authority(-data) to the cluster's CA."
                ) from None
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                status, last = 0, one_line(e) or type(e).__name__
            if status == 401:
                raise StartupError(
                    f"The API server {creds.server} refused the credentials (HTTP 401): the "
                    "kubeconfig user's token or client certificate is wrong or expired; "
                    "renew it (kubectl --kubeconfig=FILE get ns must work)."
                )
            if status == 403:
                raise StartupError(
                    f"The API server {creds.server} forbids these credentials to read "
                    f"{c.GROUP}/{c.VERSION} (HTTP 403): give the user the operator's RBAC "
                    "(the Helm chart's ClusterRole)."
                )
            if 200 <= status < 300:
                if serve_tfjobs:
                    await _require_tfjobs(session, creds)
                return
            if status == 404:
                last = f"{c.GROUP}/{c.VERSION} is not served"
            elif status:
                last = f"HTTP {status}"
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await asyncio.sleep(min(delay, left))  # and once more at the deadline
            delay = min(delay * 2, 5.0)
    if last.endswith("is not served"):
        raise StartupError(
            f"The API server {creds.server} does not serve StrategyJobs ({last}): install the "
            "CRD (kubectl apply -f crds/; the Helm chart installs it)."
        )
    raise StartupError(
        f"Cannot reach the API server {creds.server} within {seconds:g}s ({last}): check the "
        f"kubeconfig's server and the network, or wait longer with {c.ENV_STARTUP_SECONDS}."
    )


async def _require_tfjobs(session: aiohttp.ClientSession, creds: Credentials) -> None:
    """The TFJob CRD is served (``tfjobs`` in ``kubeflow.org/v1``'s resources)."""
    url = f"{creds.server}/apis/{TFJOB.api_version}"
    async with session.get(url, proxy=creds.proxy_url) as resp:
        body = await resp.json() if resp.status == 200 else {}
    if not any(r.get("name") == TFJOB.plural for r in body.get("resources") or []):
        raise StartupError(
            f"{ENV_SERVE_TFJOBS} is set but the API server {creds.server} does not serve "
            f"{TFJOB.api_version} {TFJOB.plural}: install the TFJob CRD (kubectl apply -f "
            f"crds/kubeflow.org_tfjobs.yaml; the Helm chart's tfjob.enabled does), or unset "
            f"{ENV_SERVE_TFJOBS}."
        )


def preflight() -> None:
    """Exit with one line when the operator cannot work with this cluster (see
    :func:`check_cluster`), rather than start kopf, which would hang."""
    try:
        seconds = startup_seconds(
            os.environ.get(c.ENV_STARTUP_SECONDS, f"{DEFAULT_STARTUP_SECONDS:g}")
        )
        try:
            serve_tfjobs = settings.serve_tfjobs_setting()
        except ValueError:  # the operator's startup names the bad setting
            serve_tfjobs = False
        asyncio.run(check_cluster(cluster_credentials(), seconds, serve_tfjobs))
    except StartupError as e:
        sys.exit(f"strategyjob-operator: {e}")


def peering_priority(priority: int | None, *, standalone: bool) -> int:
    """The given priority, else a random one when peering: kopf pauses every peer that shares
    the highest priority, so the replicas of a Deployment must not tie."""
    if priority is not None:
        return priority
    return 0 if standalone else random.randrange(1, 2**31)


async def operate(**kopf_args: Any) -> None:
    """``kopf.operator`` until SIGTERM, SIGINT or :func:`stopping.give_up` stops it. kopf
    waits for a ``concurrent.futures.Future`` stop flag in a thread of the loop's default
    executor, and that thread never ends when a signal stops kopf: ``asyncio.run`` then
    waits for it forever at exit, until the kubelet's SIGKILL. So kopf gets a flag of this
    loop, set from the operator state's ``stop_flag``, which ``give_up`` may set from any thread."""
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[None] = loop.create_future()

    def raise_stop() -> None:
        if not stop.done():
            stop.set_result(None)

    def relay(_: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to stop
            loop.call_soon_threadsafe(raise_stop)

    state.current().stop_flag.add_done_callback(relay)  # at once when it is set already
    await kopf.operator(stop_flag=stop, **kopf_args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m strategyjob_operator", description=__doc__)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (default)"
    )
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering",
        default="strategyjob-operator",
        help="kopf peering object shared by the replicas",
    )
    peering.add_argument(
        "--standalone", action="store_true", help="no peering: for a single replica"
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="peering priority; the highest acts (default: a random one, so that replicas of "
        "a Deployment never tie: kopf pauses every peer sharing the highest priority)",
    )
    parser.add_argument("--liveness", default=None, help="e.g. http://0.0.0.0:8081/healthz")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    preflight()
    try:
        asyncio.run(
            operate(
                standalone=args.standalone,
                peering_name=None if args.standalone else args.peering,
                priority=peering_priority(args.priority, standalone=args.standalone),
                clusterwide=not args.namespace,
                namespaces=args.namespace,
                liveness_endpoint=args.liveness,
            )
        )
    except asyncio.CancelledError:  # as kopf.run: a stop that cancelled the operator
        pass
    except Exception:
        if not state.current().fatal:
            raise
    fatal = state.current().fatal
    if fatal:  # stopping.give_up stopped kopf: say why once more, last
        sys.exit(f"strategyjob-operator: {fatal}")


if __name__ == "__main__":
    main()
