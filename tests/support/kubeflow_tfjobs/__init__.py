"""Kubeflow's own TFJob manifests, reproduced unchanged as test data: training-operator
v1.9.4's ``examples/tensorflow/`` (``example-*.yaml``) and the TFJob manifests of its v1 user
guide (``docs-*.yaml``); each file's first lines say where it comes from. :func:`load` gives one
with only its namespace replaced, as the tests apply them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent

#: Every manifest by file name, without ``.yaml``.
NAMES = sorted(p.stem for p in HERE.glob("*.yaml"))


def load(name: str, namespace: str) -> dict[str, Any]:
    """The manifest ``name`` (a member of :data:`NAMES`) in ``namespace``."""
    manifest: dict[str, Any] = yaml.safe_load((HERE / f"{name}.yaml").read_text())
    manifest["metadata"]["namespace"] = namespace
    return manifest
