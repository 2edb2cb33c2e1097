#!/usr/bin/env bash
# metrics-server for an e2e kind cluster, built here like the cluster's other pieces (no
# registry is reachable): the program from the Go module proxy (cached by version, a few minutes
# the first time), an image holding it alone (it is static), and its manifests with that image.
# A HorizontalPodAutoscaler reads pods' CPU from it (tests/e2e/test_elastic.py).
#
#   tools/kind/metrics-server.sh     # prints the image, then the manifests' path
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/common.sh"
# Its version and manifests are kept apart from versions.sh and manifests/, which key the node
# images (metrics-server is not in them: loaded into a cluster that needs it).
METRICS_SERVER_VERSION="${METRICS_SERVER_VERSION:-v0.9.0}"
METRICS_SERVER_IMAGE="strategyjob-local/metrics-server:$METRICS_SERVER_VERSION"
export GOTOOLCHAIN=local CGO_ENABLED=0
out="$KIND_CACHE/bin/metrics-server-$METRICS_SERVER_VERSION"
if [[ ! -f "$out/.done" ]]; then
  echo "== metrics-server: building $METRICS_SERVER_VERSION (a few minutes the first time)" >&2
  rm -rf "$out" && mkdir -p "$out"
  GOBIN="$out" go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/metrics-server/cmd/metrics-server@$METRICS_SERVER_VERSION" >&2
  touch "$out/.done"
fi
image="$METRICS_SERVER_IMAGE"
if ! docker image inspect "$image" >/dev/null 2>&1; then
  context="$(mktemp -d)"
  trap 'rm -rf "$context"' EXIT
  cp "$out/metrics-server" "$context/"
  printf '%s\n' "FROM scratch" "COPY metrics-server /metrics-server" \
    'ENTRYPOINT ["/metrics-server"]' >"$context/Dockerfile"
  classic_build -t "$image" "$context"
fi
echo "$image"
echo "$HERE/addons/metrics-server.yaml"
