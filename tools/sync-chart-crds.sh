#!/usr/bin/env bash
# Copy the CRDs (one source: crds/) into the Helm chart; tests/helm/test_helm_chart.py fails while they differ.
set -euo pipefail; cd "$(dirname "$0")/.." && rm -f helm/strategyjob-operator/crds/*.yaml && cp crds/*.yaml helm/strategyjob-operator/crds/
