#!/usr/bin/env bash
# The project's one test command (README "Run the tests"; .ci/run calls exactly this):
# installs the package with every extra, builds or reuses the local Kubernetes control plane
# (cached outside the repository), then runs the whole pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install -q --disable-pip-version-check -e ".[all]"

echo "== control plane (tools/k8s/build-control-plane.sh; cached after the first build)"
K8S_BIN_DIR="$(bash tools/k8s/build-control-plane.sh 2> >(tail -n 40 >&2))"
export K8S_BIN_DIR
echo "   binaries in $K8S_BIN_DIR"

# One compute thread per process: the suite starts several torch processes on 2 cores.
export OMP_NUM_THREADS=1
python3 -m pytest "$@"
