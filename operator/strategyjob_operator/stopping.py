"""How the operator stops when it cannot work: with one line saying why (:func:`give_up`),
never hanging. kopf waits forever for credentials when its login fails, and goes on without a
watch the API server forbids, so an operator whose kubeconfig broke or whose RBAC was taken
away would otherwise serve no job, silently."""

from __future__ import annotations

import logging
import re

from strategyjob_operator import state
from strategyjob_operator.kube import ApiError

logger = logging.getLogger("strategyjob_operator")

#: The authorizer's refusal (RBAC), not an admission webhook's 403 about one object.
_RBAC_REFUSAL = re.compile(r'is forbidden: User ".*" cannot \S+ resource')


def give_up(message: str) -> None:
    """Stop the operator with ``message`` (the first reason given is the one kept)."""
    logger.error(message)
    current = state.current()
    current.fatal = current.fatal or message
    if not current.stop_flag.done():
        current.stop_flag.set_result(None)


def one_line(error: BaseException) -> str:
    """An error as one line: its type when its text says nothing on its own."""
    text = " ".join(str(error).split())
    if isinstance(error, KeyError) or not text:
        return f"{type(error).__name__} {text}".strip()
    return text


def is_rbac_refusal(error: BaseException) -> bool:
    """A 403 from the API server's authorizer: the account may not make this call at all."""
    status = error.status if isinstance(error, ApiError) else getattr(error, "status", None)
    return status == 403 and _RBAC_REFUSAL.search(str(error)) is not None


def forbidden_message(error: BaseException) -> str:
    """Why the operator stops when the API server forbids what it needs after startup."""
    detail = error.detail if isinstance(error, ApiError) else one_line(error)
    return (
        f"The API server forbids a request the operator needs (HTTP 403: {detail}): "
        "its account lost RBAC since it started; give it the Helm chart's ClusterRole and Roles "
        "back, then restart the operator."
    )


class GiveUpOnForbidden(logging.Handler):
    """kopf logs a watch or its peering that the API server forbids (after its retries) and
    goes on without it, so the operator would serve no job, silently: stop it instead."""

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        if record.levelno >= logging.ERROR and error is not None and is_rbac_refusal(error):
            give_up(forbidden_message(error))


def give_up_on_kopfs_forbidden_requests() -> None:
    """Install :class:`GiveUpOnForbidden` on kopf's loggers (once)."""
    kopf_logger = logging.getLogger("kopf")
    if not any(isinstance(h, GiveUpOnForbidden) for h in kopf_logger.handlers):
        kopf_logger.addHandler(GiveUpOnForbidden())
