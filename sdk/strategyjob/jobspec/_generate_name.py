"""``metadata.generateName`` carried out as the API server does it, for where no API server
is: ``strategyjob run`` of a manifest written for ``kubectl create`` (Kubeflow's guide
names its TFJobs so, and ``strategyjob convert`` keeps it).

The API server appends five characters from ``k8s.io/apimachinery``'s ``utilrand``
alphabet to the prefix, cut to 58 characters so that the name fits in 63
(``names.SimpleNameGenerator``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

#: ``utilrand``'s alphabet: no vowels (no words), no 0/1/3 (no look-alikes).
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
SUFFIX_LENGTH = 5
_MAX_PREFIX = 63 - SUFFIX_LENGTH


def generate_name_of(obj: Any) -> str | None:
    """``metadata.generateName`` of a manifest that has no ``metadata.name``, else None."""
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(metadata, Mapping) or metadata.get("name"):
        return None
    value = metadata.get("generateName")
    return value if isinstance(value, str) and value else None


def with_generated_name(obj: Any, rng: random.Random | None = None) -> Any:
    """``obj`` named from its ``generateName`` as the API server would name it (a copy),
    or ``obj`` itself when it has a name or no ``generateName``."""
    prefix = generate_name_of(obj)
    if prefix is None:
        return obj
    draw = rng or random.SystemRandom()
    suffix = "".join(draw.choice(_ALPHABET) for _ in range(SUFFIX_LENGTH))
    return {**obj, "metadata": {**obj["metadata"], "name": prefix[:_MAX_PREFIX] + suffix}}
