#!/usr/bin/env bash
# Builds Katib's Go programs from github.com/kubeflow/katib (go.mod beside this script), static
# (CGO_ENABLED=0): katib-controller, katib-db-manager, file-metricscollector, goptuna-suggestion.
#   chexflow/devcluster/build/katib/build.sh [DEST]
# DEST defaults to $CHEXFLOW_K8S_CACHE/katib-<key> (~/.cache/chexflow/k8s/katib-<key>), where <key>
# is the Katib release plus a hash of go.mod, go.sum and this script
# (chexflow.devcluster.katib_images computes the same). Writes SHA256SUMS and VERSIONS beside them.
# The checksum database lacks the Katib module, hence GONOSUMDB (go.sum holds its hashes). go.mod
# is complete (`go mod tidy` over tools.go), so builds never rewrite it.
# Polite on a shared machine: nice, GOFLAGS=-p=2 (override with CHEXFLOW_GO_PARALLEL).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || { echo "katib/build.sh: go not found (expected /usr/local/go/bin/go)" >&2; exit 2; }
cd "$here"

katib_version="$(awk '$1 == "require" && $2 == "github.com/kubeflow/katib" {print $3; exit}' go.mod)"
[ -n "$katib_version" ] || { echo "katib/build.sh: go.mod: no 'require github.com/kubeflow/katib vX.Y.Z' line" >&2; exit 2; }
key="${katib_version}-$(cat go.mod go.sum build.sh | sha256sum | cut -c1-10)"
dest="${1:-${CHEXFLOW_K8S_CACHE:-$HOME/.cache/chexflow/k8s}/katib-$key}"

export CGO_ENABLED=0 GOFLAGS="-p=${CHEXFLOW_GO_PARALLEL:-2} -mod=readonly -buildvcs=false"
export GONOSUMDB="github.com/kubeflow,github.com/google/go-containerregistry"
tmp="$dest.partial.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

build() {  # build NAME PACKAGE
  local start=$SECONDS
  echo ">> go build $2 -> $1"
  nice -n 10 go build -ldflags "-s -w" -o "$tmp/$1" "$2"
  echo "   $1 built in $((SECONDS - start)) s"
}
cmd=github.com/kubeflow/katib/cmd
build katib-controller "$cmd/katib-controller/v1beta1"
build katib-db-manager "$cmd/db-manager/v1beta1"
build file-metricscollector "$cmd/metricscollector/v1beta1/file-metricscollector"
build goptuna-suggestion "$cmd/suggestion/goptuna/v1beta1"

(cd "$tmp" && sha256sum katib-controller katib-db-manager file-metricscollector goptuna-suggestion > SHA256SUMS)
{ go version; go list -m -f '{{.Path}} {{.Version}}' github.com/kubeflow/katib \
  google.golang.org/grpc sigs.k8s.io/controller-runtime k8s.io/client-go github.com/c-bata/goptuna; } > "$tmp/VERSIONS"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tmp" "$dest"
trap - EXIT
echo "Katib binaries in $dest"
