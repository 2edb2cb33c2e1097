#!/usr/bin/env bash
# Build the operator and worker images from the repository's Dockerfiles on this machine.
#
# No image registry is reachable here, so the Python base image is made locally (debootstrap of
# Debian bookworm, whose python3 is 3.11, imported into Docker) and torch comes from PyPI, the
# registry that is. The Dockerfiles keep their public defaults for users; build arguments point
# them at the local base. Everything is cached: the base image once per machine, the images'
# layers by Docker (a rebuild without changes takes seconds).
#
# Needs root and Debian's apt (it installs docker.io and debootstrap when missing). Starts dockerd
# when none answers; `tools/images/dockerd.sh stop` stops the one it started.
# Prints the built image names, one per line.
set -euo pipefail
cd "$(dirname "$0")/../.."

BASE_IMAGE="${STRATEGYJOB_BASE_IMAGE:-strategyjob-local/python:3.11-bookworm}"
OPERATOR_IMAGE="${STRATEGYJOB_OPERATOR_IMAGE:-strategyjob-operator:0.1.0}"
WORKER_IMAGE="${STRATEGYJOB_WORKER_IMAGE:-strategyjob-worker:0.1.0}"
TORCH_INDEX_URL="${STRATEGYJOB_TORCH_INDEX_URL:-https://pypi.org/simple}"
MIRROR="${STRATEGYJOB_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

log() { echo "== images: $*" >&2; }

need_packages=()
command -v dockerd >/dev/null || need_packages+=(docker.io)
command -v debootstrap >/dev/null || need_packages+=(debootstrap)
command -v jq >/dev/null || need_packages+=(jq) # dockerd.sh's runtime wrapper uses it
if ((${#need_packages[@]})); then
  log "installing ${need_packages[*]} from Debian"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_packages[@]}" >&2 ||
    { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_packages[@]}" >&2; }
fi
bash tools/images/dockerd.sh start >&2

# --- the local base: Debian bookworm's Python 3.11, trusting this machine's CAs -------------------
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  log "making $BASE_IMAGE with debootstrap (about a minute and a half)"
  rootfs="$(mktemp -d)"
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
    bookworm "$rootfs" "$MIRROR" >&2
  # Like the python:3.11-slim the Dockerfiles default to: pip usable as it is (no PEP 668
  # marker), and pip trusting what this machine trusts (an intercepting proxy's CA, for one).
  rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$rootfs/etc/pip.conf"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
    - "$BASE_IMAGE" >&2
  rm -rf "$rootfs"
  trap - EXIT
fi

# --- the project's images ---------------------------------------------------------------------
# The classic builder: BuildKit would fetch its Dockerfile frontend from a registry. It builds
# every stage, so the worker's CUDA stage gets the local base too (and is not used).
build() {
  local started=$SECONDS
  DOCKER_BUILDKIT=0 docker build -q --force-rm "$@" >&2
  log "built ${*: -2:1} in $((SECONDS - started)) s"
}
build -f operator/Dockerfile --build-arg "PYTHON_IMAGE=$BASE_IMAGE" -t "$OPERATOR_IMAGE" .
# The worker with every example's dependencies: scikit-learn, and Keras for digits_keras.
build -f worker_image/Dockerfile --build-arg "PYTHON_IMAGE=$BASE_IMAGE" \
  --build-arg "CUDA_IMAGE=$BASE_IMAGE" --build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL" \
  --build-arg EXTRAS=sdk,examples,keras -t "$WORKER_IMAGE" .
echo "$OPERATOR_IMAGE"
echo "$WORKER_IMAGE"
