#!/usr/bin/env bash
# The project's one test command (README "Run the tests"; .ci/run calls exactly this):
# installs the package with every extra, lints (ruff, import contracts), builds or reuses the
# local Kubernetes control plane (cached outside the repository), the operator and worker images
# (Docker, started if needed and stopped after) and the offline kind node image, then runs the
# whole pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install -q --disable-pip-version-check -e ".[all]"

echo "== lint: ruff check, ruff format --check, import contracts, types (pyproject.toml)"
python3 -m ruff check --quiet .
python3 -m ruff format --check --quiet .
lint-imports --no-cache >/dev/null || lint-imports --no-cache
python3 -m mypy >/dev/null || python3 -m mypy  # the torch-free packages, strictly ([tool.mypy])

echo "== control plane (tools/k8s/build-control-plane.sh; cached after the first build)"
K8S_BIN_DIR="$(bash tools/k8s/build-control-plane.sh 2> >(tail -n 40 >&2))"
export K8S_BIN_DIR
echo "   binaries in $K8S_BIN_DIR"

echo "== images (tools/images/build.sh; cached by Docker after the first build)"
if ! docker info >/dev/null 2>&1; then   # no engine answers: the one build.sh starts stops with us
  trap 'bash tools/images/dockerd.sh stop' EXIT
fi
STRATEGYJOB_IMAGES="$(bash tools/images/build.sh | paste -sd, -)"
export STRATEGYJOB_IMAGES
echo "   built $STRATEGYJOB_IMAGES"

echo "== kind node image (tools/kind/build.sh; cached after the first build)"
KIND_NODE_IMAGE="$(bash tools/kind/build.sh)"
echo "   $KIND_NODE_IMAGE"

# One compute thread per process: the suite starts several torch processes on 2 cores.
export OMP_NUM_THREADS=1
python3 -m pytest "$@"
