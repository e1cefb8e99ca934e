#!/usr/bin/env bash
# Builds Kueue's manager (sigs.k8s.io/kueue/cmd/kueue) from its Go module (go.mod beside this
# script), static (CGO_ENABLED=0), and copies its CRDs (config/components/crd/bases) beside it.
#   chexflow/devcluster/build/kueue/build.sh [DEST]
# DEST defaults to $CHEXFLOW_K8S_CACHE/kueue-<key> (~/.cache/chexflow/k8s/kueue-<key>), where <key>
# is the Kueue release plus a hash of go.mod, go.sum and this script
# (chexflow.devcluster.kueue computes the same). Writes SHA256SUMS and VERSIONS beside them.
# go.mod is complete (`go mod tidy` over tools.go), so builds never rewrite it.
# Polite on a shared machine: nice, GOFLAGS=-p=2 (override with CHEXFLOW_GO_PARALLEL).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || { echo "kueue/build.sh: go not found (expected /usr/local/go/bin/go)" >&2; exit 2; }
cd "$here"

kueue_version="$(awk '$1 == "require" && $2 == "sigs.k8s.io/kueue" {print $3; exit}' go.mod)"
[ -n "$kueue_version" ] || { echo "kueue/build.sh: go.mod: no 'require sigs.k8s.io/kueue vX.Y.Z' line" >&2; exit 2; }
key="${kueue_version}-$(cat go.mod go.sum build.sh | sha256sum | cut -c1-10)"
dest="${1:-${CHEXFLOW_K8S_CACHE:-$HOME/.cache/chexflow/k8s}/kueue-$key}"

export CGO_ENABLED=0 GOFLAGS="-p=${CHEXFLOW_GO_PARALLEL:-2} -mod=readonly -buildvcs=false"
tmp="$dest.partial.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

# Kueue's manager reads its metrics serving certificate from a hard-coded /etc/kueue/metrics/certs
# when its internal certificate management is off (cmd/kueue/main.go), as it is here: the local
# cluster gives it certificates of its own (chexflow.devcluster.certs) and calls its webhooks on
# 127.0.0.1. It is built from a copy of its module where that folder is read from
# KUEUE_METRICS_CERT_DIR (default as upstream), through a replace directive in a temporary copy
# of go.mod (-modfile); nothing else changes.
go mod download sigs.k8s.io/kueue
src="$(go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
[ -d "$src/config/components/crd/bases" ] || { echo "kueue/build.sh: no CRDs in $src/config/components/crd/bases" >&2; exit 1; }
patched="$tmp/src/kueue"
mkdir -p "$tmp/src" && cp -r "$src" "$patched" && chmod -R u+w "$patched"
main_go="$patched/cmd/kueue/main.go"
grep -q 'metricsCertPath := "/etc/kueue/metrics/certs"' "$main_go" \
  || { echo "kueue/build.sh: $main_go changed upstream; update the patch" >&2; exit 1; }
sed -i 's|metricsCertPath := "/etc/kueue/metrics/certs"|metricsCertPath := chexflowMetricsCertDir()|' "$main_go"
cat >> "$main_go" <<'GO'

// chexflowMetricsCertDir is the metrics certificate's folder: KUEUE_METRICS_CERT_DIR or upstream's.
func chexflowMetricsCertDir() string {
	if dir := os.Getenv("KUEUE_METRICS_CERT_DIR"); dir != "" {
		return dir
	}
	return "/etc/kueue/metrics/certs"
}
GO
cp go.mod "$tmp/src/go.mod" && cp go.sum "$tmp/src/go.sum"
echo "replace sigs.k8s.io/kueue => $patched" >> "$tmp/src/go.mod"

start=$SECONDS
echo ">> go build sigs.k8s.io/kueue/cmd/kueue -> kueue"
GOFLAGS="$GOFLAGS -modfile=$tmp/src/go.mod" nice -n 10 go build \
  -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_version" \
  -o "$tmp/kueue" sigs.k8s.io/kueue/cmd/kueue
echo "   kueue built in $((SECONDS - start)) s"

# CRDs and the webhook manifests, as the module ships them (chexflow.devcluster.kueue
# points them at 127.0.0.1 when it installs them)
mkdir -p "$tmp/crds"
cp "$src"/config/components/crd/bases/*.yaml "$tmp/crds/"
cp "$src/config/components/webhook/manifests.yaml" "$tmp/webhooks.yaml"
rm -rf "$tmp/src"

(cd "$tmp" && sha256sum kueue webhooks.yaml crds/*.yaml > SHA256SUMS)
{ go version; go list -m -f '{{.Path}} {{.Version}}' sigs.k8s.io/kueue \
  sigs.k8s.io/controller-runtime k8s.io/client-go github.com/kubeflow/mpi-operator; } > "$tmp/VERSIONS"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tmp" "$dest"
trap - EXIT
echo "Kueue binaries in $dest"
