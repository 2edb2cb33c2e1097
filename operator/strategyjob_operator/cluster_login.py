"""The cluster credentials, found as kopf's login finds them: for kopf itself and for the
reconciler's client, which logs in the same way again when the API server refuses them (an
expired token)."""

from __future__ import annotations

from typing import Any

import kopf

from strategyjob_operator.kube import Credentials


def _authenticates(info: kopf.ConnectionInfo) -> bool:
    return bool(
        info.token
        or info.certificate_path
        or info.certificate_data
        or (info.username and info.password)
    )


def connection_info(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's logins, most direct first: the pod's ServiceAccount; the kubeconfig as written
    (token, CA and client certificate and key as files or as base64 data, basic auth); and
    for a kubeconfig user whose credentials come from a program (an exec plugin, as GKE, EKS
    and AKS write them, an auth provider, a tokenFile), the kubernetes client library, which
    runs it."""
    info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    if info is not None and not _authenticates(info):
        info = kopf.login_via_client(**kwargs) or info
        if not _authenticates(info):  # the client library logs a failed exec plugin, no more
            raise kopf.LoginError(
                f"the kubeconfig's user for {info.server} has no credentials, or its exec "
                "plugin or auth provider gave none (it failed: see the lines above)"
            )
    return info


def credentials(kwargs: dict[str, Any]) -> Credentials | None:
    """The reconciler's credentials, logged in again (kopf's login ``kwargs``)."""
    info = connection_info(**kwargs)
    return None if info is None else Credentials.from_kopf(info)
