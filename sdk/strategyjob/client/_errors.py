"""What went wrong talking to the API server, as one line a person can act on.

``describe_api_error`` is a pure function of the HTTP status and the ``Status`` body, so
the wording is tested without a cluster; ``to_cluster_error`` maps the kubernetes
client's and urllib3's exceptions onto it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from strategyjob._names import GROUP, PLURAL
from strategyjob.errors import ClusterError, JobNotFoundError
from strategyjob.jobspec import TFJOB_GROUP, TFJOB_KIND, TFJOB_PLURAL

#: The resource of each kind of job the client creates, and what to do when the API server
#: does not serve it.
_RESOURCES = {
    "StrategyJob": (f"{PLURAL}.{GROUP}", "Install the StrategyJob CRD: kubectl apply -f crds/"),
    TFJOB_KIND: (
        f"{TFJOB_PLURAL}.{TFJOB_GROUP}",
        "Install the StrategyJob chart with --set tfjob.enabled=true to run TFJobs as they "
        "are, or convert it to a StrategyJob: strategyjob convert FILE -o job.yaml",
    ),
}

#: What the API server puts before a CEL rule's message (``"object": `` before 1.3x).
_CEL_PREFIX = re.compile(r'^Invalid value: (?:"object": )?')
#: Our CEL messages start with the field they are about, e.g. ``spec.replicaSpecs.ps: ``.
_FIELD_PREFIX = re.compile(r"^[a-z][\w.\[\]-]*: ")
#: The server's note that it skipped rules after another error: noise next to that error.
_SKIPPED_RULES = "some validation rules were not checked"


def one_line(text: str) -> str:
    """Collapse whitespace (CEL messages are folded YAML, server texts may wrap)."""
    return " ".join(str(text).split())


def describe_api_error(
    status: int | None, body: Any, *, action: str, kind: str, name: str | None, namespace: str
) -> tuple[str, str]:
    """``(message, reason)`` for an API error answering ``action`` (e.g. ``create``) on
    ``kind`` ``name`` (``StrategyJob``, ``pod``) in ``namespace``."""
    parsed = _parse_status(body)
    reason = str(parsed.get("reason") or "")
    server_message = one_line(parsed.get("message") or "")
    what = f"{kind} {name}" if name else f"{kind}s"
    where = f"namespace {namespace}"
    resource, install = _RESOURCES.get(kind, _RESOURCES["StrategyJob"])

    if status == 422 or reason == "Invalid":
        causes = [
            c for c in (parsed.get("details") or {}).get("causes") or [] if isinstance(c, Mapping)
        ]
        useful = [c for c in causes if _SKIPPED_RULES not in str(c.get("message"))]
        problems = [_cause(c) for c in useful or causes] or [server_message]
        return f"the API server rejected {what}: {'; '.join(problems)}", reason or "Invalid"
    if status == 404:
        details = parsed.get("details") or {}
        if details.get("kind") == "namespaces":
            return f"namespace {details.get('name') or namespace} not found.", "NotFound"
        if details.get("name") or (reason == "NotFound" and name):
            return f"{what} not found in {where}.", "NotFound"
        return (
            f"the API server does not serve {kind}s ({server_message or 'not found'}). {install}",
            "NotFound",
        )
    if status == 409 or reason == "AlreadyExists":
        return (
            f"{what} already exists in {where}. Delete it first (strategyjob delete {name}) "
            "or choose another metadata.name.",
            reason or "AlreadyExists",
        )
    if status == 403:
        return (
            f"permission denied: {server_message or f'cannot {action} {what} in {where}'}. "
            f"Ask the cluster's admin for RBAC on {resource} (and pods).",
            reason or "Forbidden",
        )
    if status == 401:
        return (
            "unauthorized: the API server rejected the credentials of the kubeconfig. "
            "Log in again or pass --kubeconfig/--context.",
            reason or "Unauthorized",
        )
    if status == 400 and kind == "pod":
        # e.g. 'container "strategyjob" in pod "x" is waiting to start: ContainerCreating',
        # 'pod x does not have a host assigned', 'cannot exec into a container in a completed pod'
        return f"cannot {action} {what}: {server_message}", reason or "BadRequest"
    detail = server_message or "no message"
    return (
        f"cannot {action} {what} in {where}: the API server answered {status} "
        f"{reason or ''}: {detail}".replace("  ", " "),
        reason,
    )


def _cause(cause: Mapping[str, Any]) -> str:
    message = one_line(cause.get("message") or "")
    field = str(cause.get("field") or "")
    stripped = _CEL_PREFIX.sub("", message, count=1)
    if stripped != message and _FIELD_PREFIX.match(stripped):
        return stripped  # a StrategyJob CEL message: it names its own field
    if field and field != "<nil>" and not message.startswith(field):
        return f"{field}: {message}"
    return message


def _parse_status(body: Any) -> Mapping[str, Any]:
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return {"message": body}
    return body if isinstance(body, Mapping) else {}


def describe_connection_error(server: str, error: BaseException) -> str:
    """A request got no answer: refused, DNS, TLS or timeout, said plainly."""
    text = repr(error) + " " + str(error)
    if "Connection refused" in text or "ConnectionRefused" in text:
        why = "connection refused"
    elif "timed out" in text.lower() or "Timeout" in text:
        why = "timed out"
    elif "CERTIFICATE_VERIFY_FAILED" in text or "SSL" in text:
        why = f"TLS error ({_innermost(error)})"
    elif "Name or service not known" in text or "nodename nor servname" in text:
        why = "unknown host"
    else:
        why = _innermost(error)
    return (
        f"cannot reach the Kubernetes API server at {server}: {why}. "
        "Check that the cluster is running and --kubeconfig/--context point to it."
    )


def _innermost(error: BaseException) -> str:
    reason: object = getattr(error, "reason", None)
    while isinstance(reason, BaseException):
        deeper = getattr(reason, "reason", None)  # urllib3 and socket errors nest one
        if deeper is None:
            break
        reason = deeper
    return one_line(str(reason if isinstance(reason, BaseException) else error))


def to_cluster_error(
    error: BaseException,
    *,
    server: str,
    action: str,
    kind: str,
    name: str | None,
    namespace: str,
) -> ClusterError:
    """The :class:`ClusterError` for an exception raised by the kubernetes client."""
    status = getattr(error, "status", None)
    answered, body = hasattr(error, "body"), getattr(error, "body", None)
    if status == 0 and (refused := _refused_upgrade(str(getattr(error, "reason", "")))):
        (status, body), answered = refused, True  # an exec's websocket upgrade was refused
    if isinstance(status, int) and status > 0 and answered:
        message, reason = describe_api_error(
            status,
            body,
            action=action,
            kind=kind,
            name=name,
            namespace=namespace,
        )
        cls = JobNotFoundError if status == 404 else ClusterError
        return cls(message, status=status, reason=reason)
    return ClusterError(describe_connection_error(server, error), reason="Unreachable")


_UPGRADE_REFUSED = re.compile(r"^Handshake status (\d{3}) .*-\+-\+- (.*)$", re.S)


def _refused_upgrade(reason: str) -> tuple[int, str] | None:
    """The HTTP status and body of an API server's answer refusing a websocket upgrade (the
    kubernetes client reports it as status 0, with ``Handshake status 400 Bad Request -+-+-
    {headers} -+-+- {body}`` as its reason), or None for any other failure."""
    match = _UPGRADE_REFUSED.match(reason)
    return (int(match.group(1)), match.group(2)) if match else None
