"""A stand-in for the Kubeflow TFJob CustomResourceDefinition, for the integration tests of
the operator's TFJob support until ``crds/kubeflow.org_tfjobs.yaml`` is in the repository
(the session's ``kubectl apply -f crds/`` then installs the real one, and this one is not
used): ``kubeflow.org/v1`` ``tfjobs`` with the ``status`` subresource and a schema that
keeps every field. The lead switches the tests to ``crds/`` once it lands."""

from __future__ import annotations

import json

from tests.support.control_plane import ControlPlane

NAME = "tfjobs.kubeflow.org"

STAND_IN_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": NAME},
    "spec": {
        "group": "kubeflow.org",
        "scope": "Namespaced",
        "names": {
            "kind": "TFJob",
            "plural": "tfjobs",
            "singular": "tfjob",
            "listKind": "TFJobList",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def ensure_tfjob_crd(cp: ControlPlane) -> None:
    """Install the stand-in unless a TFJob CRD (the real one, from ``crds/``) is there."""
    present = cp.kubectl("get", "crd", NAME, check=False)
    if present.returncode != 0:
        cp.kubectl("apply", "-f", "-", input=json.dumps(STAND_IN_CRD))
    cp.wait_established(NAME)
