"""Minimal ``tf.nest``: lists, tuples, namedtuples and mappings are structure, all else is a leaf.

Distributed values are leaves (they are never traversed). Mapping keys are visited in sorted
order when they sort, so two replicas building the same dict in different orders still pair up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def is_nested(value: Any) -> bool:
    return isinstance(value, (list, tuple, Mapping))


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def _keys(mapping: Mapping) -> list:
    keys = list(mapping.keys())
    try:
        return sorted(keys)
    except TypeError:
        return keys


def _children(value: Any) -> list:
    if isinstance(value, Mapping):
        return [value[k] for k in _keys(value)]
    return list(value)


def _rebuild(template: Any, children: list) -> Any:
    if isinstance(template, Mapping):
        rebuilt = dict(zip(_keys(template), children))
        ordered = {k: rebuilt[k] for k in template.keys()}
        try:
            return type(template)(ordered)
        except TypeError:
            return ordered
    if _is_namedtuple(template):
        return type(template)(*children)
    if isinstance(template, tuple):
        return tuple(children)
    return list(children)


def flatten(structure: Any) -> list:
    """The leaves of ``structure`` in a deterministic order."""
    if not is_nested(structure):
        return [structure]
    leaves: list = []
    for child in _children(structure):
        leaves.extend(flatten(child))
    return leaves


def pack_sequence_as(structure: Any, flat: list) -> Any:
    """Inverse of :func:`flatten`: put ``flat`` leaves back into ``structure``'s shape."""
    remaining = iter(flat)

    def build(template: Any) -> Any:
        if not is_nested(template):
            return next(remaining)
        return _rebuild(template, [build(c) for c in _children(template)])

    result = build(structure)
    if next(remaining, _END) is not _END:
        raise ValueError("pack_sequence_as: more leaves than the structure holds")
    return result


_END = object()


def assert_same_structure(a: Any, b: Any) -> None:
    """Raise ValueError if ``a`` and ``b`` do not nest the same way."""
    if is_nested(a) != is_nested(b):
        raise ValueError(f"The two structures don't have the same nested structure: {a!r} vs {b!r}")
    if not is_nested(a):
        return
    if isinstance(a, Mapping) != isinstance(b, Mapping) or len(a) != len(b):
        raise ValueError(f"The two structures don't have the same nested structure: {a!r} vs {b!r}")
    if isinstance(a, Mapping) and set(a.keys()) != set(b.keys()):
        raise ValueError(f"The two structures don't have the same keys: {a!r} vs {b!r}")
    for x, y in zip(_children(a), _children(b)):
        assert_same_structure(x, y)


def map_structure(fn: Callable[..., Any], *structures: Any) -> Any:
    """Apply ``fn`` leaf-wise over one or more structures of the same shape."""
    first = structures[0]
    for other in structures[1:]:
        assert_same_structure(first, other)
    flats = [flatten(s) for s in structures]
    return pack_sequence_as(first, [fn(*leaves) for leaves in zip(*flats)])
