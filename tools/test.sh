#!/usr/bin/env bash
# The project's one test command (README "Run the tests"; .ci/run calls exactly this):
# installs the package with every extra, lints (ruff, import contracts), builds or reuses the
# local Kubernetes control plane (cached outside the repository), the operator and worker images
# (Docker, started if needed and stopped after) and the offline kind node image, creates the kind
# cluster and loads the images into it in the background, then runs the whole pytest suite (the
# kind and e2e tests last) and deletes the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install -q --disable-pip-version-check -e ".[all]"
# tests/docs opens the documentation site in a real headless browser: Chromium from Debian
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  echo "== Chromium and its chromedriver from Debian (tests/docs)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null; }
fi

echo "== lint: ruff check, ruff format --check, import contracts, types (pyproject.toml)"
python3 -m ruff check --quiet .
python3 -m ruff format --check --quiet .
lint-imports --no-cache >/dev/null || lint-imports --no-cache
python3 -m mypy >/dev/null || python3 -m mypy  # the torch-free packages, strictly ([tool.mypy])
# the torch side: every function body checked (tools/mypy_torch.ini)
python3 -m mypy --config-file tools/mypy_torch.ini >/dev/null ||
  python3 -m mypy --config-file tools/mypy_torch.ini

echo "== control plane (tools/k8s/build-control-plane.sh; cached after the first build)"
K8S_BIN_DIR="$(bash tools/k8s/build-control-plane.sh 2> >(tail -n 40 >&2))"
export K8S_BIN_DIR
echo "   binaries in $K8S_BIN_DIR"

echo "== images (tools/images/build.sh; cached by Docker after the first build)"
started_dockerd=
docker info >/dev/null 2>&1 || started_dockerd=1 # the one build.sh starts stops with us
kind_cluster= loading=
cleanup() {
  if [[ -n "$loading" ]]; then kill -- "-$loading" 2>/dev/null || true; fi
  if [[ -n "$kind_cluster" ]]; then bash tools/kind/cluster.sh delete "$kind_cluster" >/dev/null 2>&1 || true; fi
  if [[ -n "$started_dockerd" ]]; then bash tools/images/dockerd.sh stop; fi
}
trap cleanup EXIT
STRATEGYJOB_IMAGES="$(bash tools/images/build.sh | paste -sd, -)"
export STRATEGYJOB_IMAGES
echo "   built $STRATEGYJOB_IMAGES"

echo "== kind node image (tools/kind/build.sh; cached after the first build)"
KIND_NODE_IMAGE="$(bash tools/kind/build.sh)"
echo "   $KIND_NODE_IMAGE"

echo "== kind cluster (tools/kind/cluster.sh) for the kind and e2e tests, which run last: the images"
echo "   load into its nodes (minutes: the worker image is 7.8 GB) while the other tests run"
kind_cluster="sj-test-$$"
bash tools/kind/cluster.sh create "$kind_cluster" 1 >/dev/null
load_log="$(mktemp -t strategyjob-kind-load.XXXXXX)"
setsid bash tools/kind/load.sh "$kind_cluster" "${STRATEGYJOB_IMAGES%,*}" "${STRATEGYJOB_IMAGES#*,}" \
  >"$load_log" 2>&1 &
loading=$! # its own process group: stopped whole (docker save, the imports) if the run ends first
echo "   cluster $kind_cluster; loading in the background (log: $load_log)"
export STRATEGYJOB_KIND_CLUSTER="$kind_cluster" # tests.support.kind uses it (load.sh waits its turn)

# One compute thread per process: the suite starts several torch processes on 2 cores.
export OMP_NUM_THREADS=1
python3 -m pytest "$@"
