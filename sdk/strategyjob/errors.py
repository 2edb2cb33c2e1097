"""Exceptions. Names mirror ``tf.errors`` where TensorFlow raises one; the rest derive
from :class:`StrategyJobError`. Torch-free so the launcher and operator can use it, as they
do :func:`last_error_line` to quote a failed replica's error from its last output lines."""

from __future__ import annotations

import re
from collections.abc import Iterable

#: A line that says something went wrong, when there is no traceback to read.
_ERROR_WORDS = re.compile(r"error|exception|fatal|fail|abort|denied|not found|errno", re.I)
_TRACEBACK = "Traceback (most recent call last):"
#: How much of the error line a summary line or a condition message quotes.
ERROR_LINE_MAX = 200


def last_error_line(lines: Iterable[str]) -> str | None:
    """The error a process ended with, from its last output ``lines``: the exception line
    of its last Python traceback (``ValueError: bad batch``), else the last line that says
    error, failed, fatal, ...; None when nothing says so. At most :data:`ERROR_LINE_MAX`
    characters, so that it fits in the launcher's summary line and a job's condition."""
    text = [line.rstrip() for line in lines]
    found: str | None = None
    start = max((i for i, line in enumerate(text) if line.strip() == _TRACEBACK), default=-1)
    if start >= 0:
        # The first unindented line after the frames: the exception and its message.
        found = next((line for line in text[start + 1 :] if line and not line[0].isspace()), None)
    if found is None:
        found = next((line for line in reversed(text) if _ERROR_WORDS.search(line)), None)
    if found is None:
        return None
    found = found.strip()
    return found if len(found) <= ERROR_LINE_MAX else found[: ERROR_LINE_MAX - 3] + "..."


def exit_error_line(exit_code: int | None, lines: Iterable[str]) -> str | None:
    """:func:`last_error_line` of a process that ended by an error of its own (exit code
    1-127); None for one that succeeded or was killed by a signal (128 and above: OOM,
    SIGKILL, a shell's child killed), whose last lines do not say why it ended."""
    if exit_code is None or not 0 < exit_code < 128:
        return None
    return last_error_line(lines)


class StrategyJobError(Exception):
    """Base class of the errors StrategyJob adds beyond TensorFlow's."""


class OpError(Exception):
    """Mirrors ``tf.errors.OpError``: a runtime failure of a distributed operation."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message


class OutOfRangeError(OpError):
    """End of input, raised by ``get_next()`` (``next()`` raises StopIteration instead)."""


class DeadlineExceededError(OpError):
    """A collective did not complete within ``CommunicationOptions.timeout_seconds``."""


class UnavailableError(OpError):
    """A peer of the cluster is unreachable or died."""


class InvalidArgumentError(OpError):
    """An argument is invalid at run time (e.g. fewer input files than workers)."""


class CancelledError(OpError):
    """An operation was cancelled."""


class NotFoundError(OpError, FileNotFoundError):
    """Mirrors ``tf.errors.NotFoundError``: e.g. a checkpoint path that does not exist. Also
    a ``FileNotFoundError``, so code written for plain files catches it."""


class DataLossError(OpError, ValueError):
    """Mirrors ``tf.errors.DataLossError``: a file that is not a complete checkpoint
    (truncated, corrupt, or some other format). Also a ``ValueError``."""


class PermissionDeniedError(OpError):
    """A server refused a call: the job's token (``STRATEGYJOB_TOKEN``) is missing or wrong."""


class ClusterError(StrategyJobError):
    """The Kubernetes API server refused a request of :mod:`strategyjob.client`, or could
    not be reached. The message is one line fit for a terminal; ``status`` is the HTTP
    status (None when no answer came) and ``reason`` Kubernetes' reason (``NotFound``,
    ``Forbidden``, ``Invalid``, ``AlreadyExists``, ..., or ``Unreachable``)."""

    def __init__(self, message: str, *, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class JobNotFoundError(ClusterError):
    """The StrategyJob (or the replica's pod) does not exist (HTTP 404)."""


class JobFailedError(StrategyJobError):
    """A StrategyJob being waited for failed; ``reason`` and ``message`` come from its
    ``Failed`` condition (e.g. ``BackoffLimitExceeded`` and which replica exited how)."""

    def __init__(self, name: str, namespace: str, reason: str, message: str) -> None:
        detail = message or "no message in its Failed condition"
        super().__init__(f"StrategyJob {name} in namespace {namespace} failed ({reason}): {detail}")
        self.name = name
        self.namespace = namespace
        self.reason = reason
        self.message = message
