#!/usr/bin/env bash
# Builds KServe's controller manager (github.com/kserve/kserve/cmd/manager) from its Go module
# (go.mod beside this script), static (CGO_ENABLED=0), and copies the manifests it needs beside
# it: the serving.kserve.io CRDs (config/crd/full), its webhook configurations
# (config/webhook/manifests.yaml) and the inferenceservice-config ConfigMap
# (config/configmap/inferenceservice.yaml) it reads as it starts.
#   chexflow/devcluster/build/kserve/build.sh [DEST]
# DEST defaults to $CHEXFLOW_K8S_CACHE/kserve-<key> (~/.cache/chexflow/k8s/kserve-<key>), where
# <key> is the KServe release plus a hash of go.mod, go.sum and this script
# (chexflow.devcluster.kserve computes the same). Writes SHA256SUMS and VERSIONS beside them.
# go.mod is complete (`go mod tidy` over tools.go), so builds never rewrite it.
# Polite on a shared machine: nice, GOFLAGS=-p=2 (override with CHEXFLOW_GO_PARALLEL).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || { echo "kserve/build.sh: go not found (expected /usr/local/go/bin/go)" >&2; exit 2; }
cd "$here"

kserve_version="$(awk '$1 == "require" && $2 == "github.com/kserve/kserve" {print $3; exit}' go.mod)"
[ -n "$kserve_version" ] || { echo "kserve/build.sh: go.mod: no 'require github.com/kserve/kserve vX.Y.Z' line" >&2; exit 2; }
key="${kserve_version}-$(cat go.mod go.sum build.sh | sha256sum | cut -c1-10)"
dest="${1:-${CHEXFLOW_K8S_CACHE:-$HOME/.cache/chexflow/k8s}/kserve-$key}"

export CGO_ENABLED=0 GOFLAGS="-p=${CHEXFLOW_GO_PARALLEL:-2} -mod=readonly -buildvcs=false"
tmp="$dest.partial.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

go mod download github.com/kserve/kserve
src="$(go list -m -f '{{.Dir}}' github.com/kserve/kserve)"
[ -d "$src/config/crd/full" ] || { echo "kserve/build.sh: no CRDs in $src/config/crd/full" >&2; exit 1; }

start=$SECONDS
echo ">> go build github.com/kserve/kserve/cmd/manager -> kserve-manager"
nice -n 10 go build -ldflags "-s -w" -o "$tmp/kserve-manager" github.com/kserve/kserve/cmd/manager
echo "   kserve-manager built in $((SECONDS - start)) s"

# the manifests as the module ships them (chexflow.devcluster.kserve points the webhooks at
# 127.0.0.1 and sets the ConfigMap's deployment mode when it installs them); the
# LLMInferenceService CRDs (config/crd/full/llmisvc) belong to another controller
mkdir -p "$tmp/crds"
cp "$src"/config/crd/full/serving.kserve.io_*.yaml "$tmp/crds/"
cp "$src/config/webhook/manifests.yaml" "$tmp/webhooks.yaml"
cp "$src/config/configmap/inferenceservice.yaml" "$tmp/inferenceservice-config.yaml"

(cd "$tmp" && sha256sum kserve-manager webhooks.yaml inferenceservice-config.yaml crds/*.yaml > SHA256SUMS)
{ go version; go list -m -f '{{.Path}} {{.Version}}' github.com/kserve/kserve \
  sigs.k8s.io/controller-runtime k8s.io/client-go; } > "$tmp/VERSIONS"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tmp" "$dest"
trap - EXIT
echo "KServe's controller manager in $dest"
