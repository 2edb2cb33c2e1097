#!/usr/bin/env bash
# Load local Docker images into every node of a kind cluster made by tools/kind/cluster.sh
# (no registry is reachable here: pods then run them with imagePullPolicy Never/IfNotPresent).
#
#   tools/kind/load.sh NAME IMAGE...
#
# What `kind load docker-image` does, made to fit the 7.8 GB worker image on a machine's disk:
# one `docker save` is streamed into every node's containerd at once (no tarball on disk), and
# once a node has unpacked an image, the image's layer blobs are dropped from its content store,
# as containerd's discard_unpacked_layers does for pulled images (a container needs only the
# unpacked snapshots): a node then holds the worker image once (7.8 GB), not twice. Nodes that
# already have an image (same ID) are skipped.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/versions.sh"
name="${1:-}"
[[ -n "$name" && $# -ge 2 ]] || { echo "usage: $0 NAME IMAGE..." >&2; exit 2; }
shift
kind="$KIND_CACHE/bin/kind-$KIND_VERSION/kind"
[[ -x "$kind" ]] || { echo "no kind binary at $kind: run tools/kind/build.sh first" >&2; exit 1; }
# One load at a time per cluster: a second waits for the first, then finds the images there.
if [[ -d "$KIND_CACHE/clusters/$name" ]]; then
  exec 9>"$KIND_CACHE/clusters/$name/load.lock"
  flock 9
fi
declare -A ids
for image in "$@"; do
  ids[$image]="$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null)" ||
    { echo "image $image is not in this Docker engine: build it first (tools/images/build.sh)" >&2; exit 1; }
done

# The name containerd gives a Docker image reference (docker.io/library/... for short names).
containerd_ref() {
  local ref="$1"
  [[ "$ref" == */* ]] || ref="library/$ref"
  [[ "${ref%%/*}" == *[.:]* || "${ref%%/*}" == localhost ]] || ref="docker.io/$ref"
  echo "$ref"
}

# The images a node lacks (by image ID), one per line.
missing_on() {
  local node="$1" image have
  for image in "${!ids[@]}"; do
    have="$(docker exec "$node" crictl inspecti --output go-template --template '{{.status.id}}' \
      "$image" 2>/dev/null || true)"
    [[ "$have" == "${ids[$image]}" ]] || echo "$image"
  done
}

started=$SECONDS
fifos="$(mktemp -d)"
trap 'rm -rf "$fifos"' EXIT
nodes=() pids=() wanted=()
for node in $("$kind" get nodes --name "$name"); do
  mapfile -t lacking < <(missing_on "$node")
  ((${#lacking[@]})) || continue
  nodes+=("$node")
  wanted+=("${lacking[@]}")
done
if ((${#nodes[@]})); then
  mapfile -t wanted < <(printf '%s\n' "${wanted[@]}" | sort -u)
  for node in "${nodes[@]}"; do
    mkfifo "$fifos/$node"
    docker exec -i "$node" ctr -n k8s.io images import --all-platforms --snapshotter=overlayfs - \
      <"$fifos/$node" >/dev/null &
    pids+=($!)
  done
  docker save "${wanted[@]}" | tee "${nodes[@]/#/$fifos/}" >/dev/null
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { echo "importing ${wanted[*]} into ${nodes[$i]} failed" >&2; exit 1; }
  done
  for node in "${nodes[@]}"; do
    [[ -z "$(missing_on "$node")" ]] || { echo "node $node lacks $(missing_on "$node") after loading" >&2; exit 1; }
    for image in "${wanted[@]}"; do
      ref="$(containerd_ref "$image")"
      manifest="$(docker exec "$node" ctr -n k8s.io images ls | awk -v ref="$ref" '$1 == ref {print $3}')"
      layers="$(docker exec "$node" ctr -n k8s.io content get "$manifest" |
        python3 -c 'import json, sys; print(" ".join(l["digest"] for l in json.load(sys.stdin)["layers"]))')"
      # shellcheck disable=SC2086 # one argument per digest
      docker exec "$node" ctr -n k8s.io content rm $layers >/dev/null
    done
  done
fi
echo "== kind: loaded $* into cluster $name (nodes that lacked them: ${nodes[*]:-none}) in $((SECONDS - started)) s" >&2
