#!/usr/bin/env bash
# Builds scheduler-plugins' scheduler (kube-scheduler with the Coscheduling plugin,
# sigs.k8s.io/scheduler-plugins/cmd/scheduler) from its Go module (go.mod beside this script),
# and its PodGroup controller (cmd/controller), static (CGO_ENABLED=0), and copies the PodGroup CRD (manifests/coscheduling/crd.yaml) beside it.
#   chexflow/devcluster/build/coscheduling/build.sh [DEST]
# DEST defaults to $CHEXFLOW_K8S_CACHE/coscheduling-<key> (~/.cache/chexflow/k8s/...), where <key>
# is the scheduler-plugins release plus a hash of go.mod, go.sum and this script
# (chexflow.devcluster.coscheduling computes the same). Writes SHA256SUMS and VERSIONS beside them.
# Polite on a shared machine: nice, GOFLAGS=-p=2 (override with CHEXFLOW_GO_PARALLEL).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || { echo "coscheduling/build.sh: go not found (expected /usr/local/go/bin/go)" >&2; exit 2; }
cd "$here"

version="$(awk '$1 == "require" && $2 == "sigs.k8s.io/scheduler-plugins" {print $3; exit}' go.mod)"
[ -n "$version" ] || { echo "coscheduling/build.sh: go.mod: no 'require sigs.k8s.io/scheduler-plugins vX.Y.Z' line" >&2; exit 2; }
key="${version}-$(cat go.mod go.sum build.sh | sha256sum | cut -c1-10)"
dest="${1:-${CHEXFLOW_K8S_CACHE:-$HOME/.cache/chexflow/k8s}/coscheduling-$key}"

export CGO_ENABLED=0 GOFLAGS="-p=${CHEXFLOW_GO_PARALLEL:-2} -mod=readonly -buildvcs=false"
tmp="$dest.partial.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

start=$SECONDS
echo ">> go build sigs.k8s.io/scheduler-plugins/cmd/scheduler -> coscheduling-scheduler"
nice -n 10 go build -ldflags "-s -w" -o "$tmp/coscheduling-scheduler" \
  sigs.k8s.io/scheduler-plugins/cmd/scheduler
echo "   coscheduling-scheduler built in $((SECONDS - start)) s"
# its PodGroup controller: PodGroup status follows the pods, and that update is the event on
# which the scheduler retries a waiting gang (Coscheduling registers no other)
start=$SECONDS
echo ">> go build sigs.k8s.io/scheduler-plugins/cmd/controller -> podgroup-controller"
nice -n 10 go build -ldflags "-s -w" -o "$tmp/podgroup-controller" \
  sigs.k8s.io/scheduler-plugins/cmd/controller
echo "   podgroup-controller built in $((SECONDS - start)) s"

go mod download sigs.k8s.io/scheduler-plugins
src="$(go list -m -f '{{.Dir}}' sigs.k8s.io/scheduler-plugins)"
cp "$src/manifests/coscheduling/crd.yaml" "$tmp/podgroup-crd.yaml"
# the controller also reconciles ElasticQuotas (capacity scheduling): its informer needs the CRD
cp "$src/manifests/capacityscheduling/crd.yaml" "$tmp/elasticquota-crd.yaml"
(cd "$tmp" && sha256sum coscheduling-scheduler podgroup-controller podgroup-crd.yaml elasticquota-crd.yaml > SHA256SUMS)
{ go version; go list -m -f '{{.Path}} {{.Version}}' sigs.k8s.io/scheduler-plugins \
  k8s.io/kubernetes k8s.io/client-go; } > "$tmp/VERSIONS"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tmp" "$dest"
trap - EXIT
echo "coscheduling binaries in $dest"
