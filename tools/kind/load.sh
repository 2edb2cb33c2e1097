#!/usr/bin/env bash
# Load local Docker images into every node of a kind cluster made by tools/kind/cluster.sh
# (no registry is reachable here: pods then run them with imagePullPolicy Never/IfNotPresent).
#
#   tools/kind/load.sh NAME IMAGE...
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/versions.sh"
name="${1:-}"
[[ -n "$name" && $# -ge 2 ]] || { echo "usage: $0 NAME IMAGE..." >&2; exit 2; }
shift
kind="$KIND_CACHE/bin/kind-$KIND_VERSION/kind"
[[ -x "$kind" ]] || { echo "no kind binary at $kind: run tools/kind/build.sh first" >&2; exit 1; }
for image in "$@"; do
  docker image inspect "$image" >/dev/null 2>&1 ||
    { echo "image $image is not in this Docker engine: build it first (tools/images/build.sh)" >&2; exit 1; }
done
started=$SECONDS
"$kind" load docker-image --name "$name" "$@" >&2
echo "== kind: loaded $* into cluster $name in $((SECONDS - started)) s" >&2
