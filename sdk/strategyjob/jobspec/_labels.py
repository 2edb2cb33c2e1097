"""Whether a job's own label is one the API server admits: it validates the labels of a
custom object's metadata (not of the pod templates inside it, which the pod's creation
checks), so the loader refuses the same ones, in the API server's words.

``k8s.io/apimachinery`` ``validation.IsQualifiedName`` and ``IsValidLabelValue``.
"""

from __future__ import annotations

import re

_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$", re.ASCII)
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_TEXT = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
    "an alphanumeric character"
)
_MAX_NAME = 63
_MAX_PREFIX = 253


def is_dns_subdomain(text: str) -> bool:
    """Whether ``text`` is a lowercase DNS subdomain (RFC 1123) of at most 253 characters,
    as a label key's prefix or a cluster domain must be."""
    return len(text) <= _MAX_PREFIX and _DNS_SUBDOMAIN.fullmatch(text) is not None


def label_problem(key: str, value: str) -> str | None:
    """Why the API server refuses the label ``key: value``, or None when it admits it."""
    prefix, slash, name = key.rpartition("/")
    if slash and not is_dns_subdomain(prefix):
        return "the key's prefix must be a lowercase DNS subdomain of at most 253 characters"
    if not name or len(name) > _MAX_NAME or not _NAME.fullmatch(name):
        return f"the key's name {_NAME_TEXT}, at most {_MAX_NAME} characters"
    if value and (len(value) > _MAX_NAME or not _NAME.fullmatch(value)):
        return (
            f"a valid label must be an empty string or {_NAME_TEXT}, at most {_MAX_NAME} characters"
        )
    return None
