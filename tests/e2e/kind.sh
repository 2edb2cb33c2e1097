#!/usr/bin/env bash
# The end-to-end suite on a kind cluster: create the cluster, build the worker and operator
# images and load them into it, install the chart, run `pytest tests/e2e` against it, and
# delete the cluster (KEEP_CLUSTER=1 keeps it). Extra arguments go to pytest.
#
# Needs a Docker engine, kind, kubectl, helm and this repository's test extras
# (pip install -e ".[all]"). The project's CI machines have no Docker engine, so this does not
# run there; there the same suite runs on the local control plane and tests/node_agent.
#
#   bash tests/e2e/kind.sh                # whole suite
#   bash tests/e2e/kind.sh -k mirrored    # some tests
set -euo pipefail
cd "$(dirname "$0")/../.."

cluster="${KIND_CLUSTER:-strategyjob-e2e}"
tag="${IMAGE_TAG:-0.1.0}"
release_namespace=strategyjob-system
release=strategyjob-operator
for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "kind.sh needs $tool on PATH" >&2; exit 2; }
done

kubeconfig="$(mktemp)"
cleanup() {
  if [ -z "${KEEP_CLUSTER:-}" ]; then kind delete cluster --name "$cluster" || true; fi
  rm -f "$kubeconfig"
}
trap cleanup EXIT

kind create cluster --name "$cluster" --kubeconfig "$kubeconfig" --wait 180s
docker build -f worker_image/Dockerfile --build-arg EXTRAS=sdk,examples \
  -t "strategyjob-worker:$tag" .
docker build -f operator/Dockerfile -t "strategyjob-operator:$tag" .
kind load docker-image --name "$cluster" "strategyjob-worker:$tag" "strategyjob-operator:$tag"

helm install "$release" helm/strategyjob-operator --kubeconfig "$kubeconfig" \
  --namespace "$release_namespace" --create-namespace \
  --set image.tag="$tag" --set image.pullPolicy=Never --wait --timeout 5m

STRATEGYJOB_E2E_KUBECONFIG="$kubeconfig" \
STRATEGYJOB_E2E_RELEASE="$release_namespace/$release" \
STRATEGYJOB_E2E_WORKER_IMAGE="strategyjob-worker:$tag" \
  python3 -m pytest tests/e2e "$@"
