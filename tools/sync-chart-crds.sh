#!/usr/bin/env bash
# Copy the CRDs (one source: crds/) into the Helm chart; tests/helm/test_helm_chart.py fails while they differ.
# Helm installs everything in a chart's crds/ folder, always: the optional ones, installed on a value
# (kubeflow.org_tfjobs.yaml: tfjob.enabled), go to optional-crds/, which templates/tfjob-crd.yaml renders.
set -euo pipefail; cd "$(dirname "$0")/.."
chart=helm/strategyjob-operator
rm -f "$chart"/crds/*.yaml "$chart"/optional-crds/*.yaml
for crd in crds/*.yaml; do
  case "$(basename "$crd")" in
    kubeflow.org_*) cp "$crd" "$chart/optional-crds/" ;;
    *) cp "$crd" "$chart/crds/" ;;
  esac
done
