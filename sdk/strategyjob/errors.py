"""Exceptions. Names mirror ``tf.errors`` where TensorFlow raises one; the rest derive
from :class:`StrategyJobError`. Torch-free so the launcher and operator can use it."""

from __future__ import annotations


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


class PermissionDeniedError(OpError):
    """A server refused a call: the job's token (``STRATEGYJOB_TOKEN``) is missing or wrong."""
