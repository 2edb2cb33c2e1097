#!/usr/bin/env bash
# Create or delete a kind cluster made entirely on this machine.
#
#   tools/kind/cluster.sh create NAME [WORKERS]   # prints the cluster's kubeconfig path
#   tools/kind/cluster.sh delete NAME             # removes its containers and Docker network
#
# `create` builds what it needs first (tools/kind/build.sh: seconds once cached), then makes a
# control-plane node and WORKERS worker nodes (default 1), and returns once every node is Ready.
# Each cluster gets its own Docker network, named after it, so `delete` leaves nothing behind.
# Every node mounts the cluster's shared directory at $KIND_SHARED_PATH (/var/strategyjob-shared).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/versions.sh"
usage="usage: $0 create NAME [WORKERS] | delete NAME"
action="${1:-}" name="${2:-}"
[[ -n "$name" && ("$action" == create || "$action" == delete) ]] || { echo "$usage" >&2; exit 2; }
[[ "$name" =~ ^[a-z0-9][a-z0-9-]*$ ]] ||
  { echo "cluster name '$name' is not valid: use lower-case letters, digits and '-'" >&2; exit 2; }
kind="$KIND_CACHE/bin/kind-$KIND_VERSION/kind"
dir="$KIND_CACHE/clusters/$name"
KIND_SHARED_PATH=/var/strategyjob-shared
export KIND_EXPERIMENTAL_DOCKER_NETWORK="kind-$name"

delete() {
  # Until nothing of the cluster is left: node containers Docker is still creating (a create
  # interrupted right after kind started them) survive a first `kind delete`.
  local deadline=$((SECONDS + 120))
  while :; do
    if [[ -x "$kind" ]]; then "$kind" delete cluster --name "$name" >&2; fi
    # kind leaves its network behind; this cluster's is its own (nothing else is attached).
    if docker network inspect "$KIND_EXPERIMENTAL_DOCKER_NETWORK" >/dev/null 2>&1; then
      docker network rm "$KIND_EXPERIMENTAL_DOCKER_NETWORK" >/dev/null 2>&1 || true
    fi
    [[ -n "$(docker ps -aq --filter "label=io.x-k8s.kind.cluster=$name")" ]] ||
      docker network inspect "$KIND_EXPERIMENTAL_DOCKER_NETWORK" >/dev/null 2>&1 || break
    ((SECONDS < deadline)) || { echo "cluster $name: nodes or network left after 120 s" >&2; return 1; }
    sleep 2 # Docker finishes creating the containers; then they can be removed
  done
  rm -rf "$dir"
}

if [[ "$action" == delete ]]; then
  delete
  exit 0
fi

workers="${3:-1}"
[[ "$workers" =~ ^[0-9]+$ ]] || { echo "WORKERS must be a number, not '$workers'" >&2; exit 2; }
node_image="$(bash "$HERE/build.sh")"

# This machine may lack CAP_SYS_RESOURCE (bit 24 of the bounding set): kind's privileged nodes
# then start only through tools/images/strategyjob-runc, which tools/images/dockerd.sh sets up.
capbnd="$(awk '/^CapBnd:/ {print $2}' /proc/self/status)"
runtime="$(docker info --format '{{.DefaultRuntime}}')"
if (((16#$capbnd >> 24 & 1) == 0)) && [[ "$runtime" != strategyjob-runc ]]; then
  echo "dockerd runs containers with '$runtime', but this machine lacks CAP_SYS_RESOURCE, so kind's" \
    "privileged nodes cannot start: stop that dockerd and start one with" \
    "'bash tools/images/dockerd.sh start' (it adds tools/images/strategyjob-runc)" >&2
  exit 1
fi

# One directory of this machine that every node mounts at $KIND_SHARED_PATH: a hostPath under it
# is the same storage for pods on any node (what a ReadWriteMany volume is on a real cluster),
# so a job whose pods land on different nodes shares its checkpoints. Removed with the cluster.
mkdir -p "$dir/shared"
chmod 1777 "$dir/shared"
node() {
  printf '  - role: %s\n    extraMounts:\n      - hostPath: %s\n        containerPath: %s\n' \
    "$1" "$dir/shared" "$KIND_SHARED_PATH"
}
{
  cat <<YAML
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
YAML
  node control-plane
  for _ in $(seq "$workers"); do node worker; done
  cat <<'YAML'
# Without CAP_SYS_RESOURCE no pod sandbox may lower its oom_score_adj (runc fails with "can't
# get final child's PID from pipe: EOF"): containerd keeps it at the node's own value instead.
containerdConfigPatches:
  - |-
    [plugins."io.containerd.grpc.v1.cri"]
      restrict_oom_score_adj = true
# Kubernetes 1.36's kubelet refuses a cgroup v1 host unless told otherwise; these hosts are.
kubeadmConfigPatches:
  - |
    kind: KubeletConfiguration
    failCgroupV1: false
YAML
} >"$dir/config.yaml"

started=$SECONDS
trap 'delete; exit 1' ERR INT TERM
"$kind" create cluster --name "$name" --image "$node_image" --config "$dir/config.yaml" \
  --kubeconfig "$dir/kubeconfig" >&2
kubectl="$(bash "$HERE/../k8s/build-control-plane.sh")/kubectl"
"$kubectl" --kubeconfig "$dir/kubeconfig" wait --for=condition=Ready nodes --all --timeout=180s >&2
trap - ERR INT TERM
echo "== kind: cluster $name ($((workers + 1)) nodes) Ready in $((SECONDS - started)) s" >&2
echo "$dir/kubeconfig"
