"""Whether a container ``image`` is a reference the kubelet can parse: a pod whose image it
cannot parse waits in ``InvalidImageName`` for good, so the loader refuses it up front, for
``strategyjob run`` (which never pulls it) as for the operator.

The grammar and checks of the ``github.com/distribution/reference`` module (v0.6.0,
``ParseNormalizedNamed``) that the kubelet applies, with its error texts; the digest checks
of ``github.com/opencontainers/go-digest``.
"""

from __future__ import annotations

import re

_ALPHANUMERIC = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[(?:[a-fA-F0-9:]+)\])(?::[0-9]+)?"
_PATH_COMPONENT = rf"{_ALPHANUMERIC}(?:{_SEPARATOR}{_ALPHANUMERIC})*"
_REMOTE_NAME = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][0-9a-fA-F]{32,}"
_REFERENCE = re.compile(
    rf"^((?:{_DOMAIN}/)?{_REMOTE_NAME})(?::({_TAG}))?(?:@({_DIGEST}))?$", re.ASCII
)
_NAME = re.compile(rf"^(?:({_DOMAIN})/)?({_REMOTE_NAME})$", re.ASCII)
_IDENTIFIER = re.compile(r"^[a-f0-9]{64}$")
#: Hex digits of each digest algorithm the kubelet knows (lowercase only).
_DIGEST_HEX_LENGTH = {"sha256": 64, "sha384": 96, "sha512": 128}
#: The longest repository path (``RepositoryNameTotalLengthMax``).
MAX_REPOSITORY_LENGTH = 255


def image_problem(image: str) -> str | None:
    """Why the kubelet refuses ``image`` (its words), or None when it parses."""
    if image != image.strip():
        # The API server's own check, before any kubelet sees it.
        return "must not have leading or trailing whitespace"
    if _IDENTIFIER.fullmatch(image):
        return f"invalid repository name ({image}), cannot specify 64-byte hexadecimal strings"
    domain, remainder = _split_domain(image)
    remote = remainder.partition(":")[0]
    if remote.lower() != remote:
        return f"invalid reference format: repository name ({remote}) must be lowercase"
    return _parse(f"{domain}/{remainder}")


def _split_domain(name: str) -> tuple[str, str]:
    """``splitDockerDomain``: Docker Hub's ``docker.io`` (and ``library/`` for a one-part
    name) unless the first part looks like a host."""
    first, slash, rest = name.partition("/")
    if not slash:
        return "docker.io", f"library/{name}"
    if first == "localhost" or any(c in first for c in ".:") or first.lower() != first:
        return ("docker.io" if first == "index.docker.io" else first), rest
    return "docker.io", name


def _parse(reference: str) -> str | None:
    match = _REFERENCE.fullmatch(reference)
    if match is None:
        if _REFERENCE.fullmatch(reference.lower()):
            return "repository name must be lowercase"
        return "invalid reference format"
    name = _NAME.fullmatch(match.group(1))
    path = name.group(2) if name else match.group(1)
    if len(path) > MAX_REPOSITORY_LENGTH:
        return f"repository name must not be more than {MAX_REPOSITORY_LENGTH} characters"
    digest = match.group(3)
    if digest:
        algorithm, _, encoded = digest.partition(":")
        length = _DIGEST_HEX_LENGTH.get(algorithm)
        if length is None:
            return "unsupported digest algorithm"
        if not re.fullmatch(f"[a-f0-9]{{{length}}}", encoded):
            return "invalid checksum digest format"
    return None
