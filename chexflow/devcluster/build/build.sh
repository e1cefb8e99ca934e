#!/usr/bin/env bash
# Builds the local Kubernetes control plane from Go modules (go.mod beside this script):
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and mpi-operator, and the
# kubectl of the same release, which `chexflow cluster up` puts on the cluster's PATH.
#   chexflow/devcluster/build/build.sh [DEST]
# DEST defaults to $CHEXFLOW_K8S_CACHE/<key> (~/.cache/chexflow/k8s/<key>), where <key> is the
# Kubernetes release plus a hash of go.mod, go.sum and this script (chexflow.devcluster.binaries computes the same).
# Polite on a shared machine: nice, GOFLAGS=-p=2 (override with CHEXFLOW_GO_PARALLEL).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || { echo "build.sh: go not found (expected /usr/local/go/bin/go)" >&2; exit 2; }

k8s_version="$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$here/go.mod")"
key="${k8s_version}-$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-10)"
dest="${1:-${CHEXFLOW_K8S_CACHE:-$HOME/.cache/chexflow/k8s}/$key}"
minor="${k8s_version#v1.}"; minor="${minor%%.*}"

export CGO_ENABLED=0 GOFLAGS="-p=${CHEXFLOW_GO_PARALLEL:-2}"
tmp="$dest.partial.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
cd "$here"

kver="-X k8s.io/component-base/version.gitVersion=$k8s_version \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean"
build() {  # build NAME PACKAGE [extra ldflags]
  local start=$SECONDS
  echo ">> go build $2 -> $1"
  nice -n 10 go build -ldflags "-s -w ${3:-}" -o "$tmp/$1" "$2"
  echo "   $1 built in $((SECONDS - start)) s"
}
build etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$kver"
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$kver"
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$kver"
build kubectl k8s.io/kubernetes/cmd/kubectl "$kver"
build kwok sigs.k8s.io/kwok/cmd/kwok
# mpi-operator serves its health check on a hard-coded :8080 (cmd/mpi-operator/app/server.go),
# so two local clusters on one machine would collide. It is built from a copy of its module
# where that address is read from MPI_OPERATOR_HEALTH_ADDR (default ":8080", as upstream),
# through a replace directive in a temporary copy of go.mod (-modfile); nothing else changes.
# `go mod download` first: on a fresh machine the module is not in the module cache yet, and
# `go list -m` would print no directory for it.
go mod download github.com/kubeflow/mpi-operator
src="$(go list -m -f '{{.Dir}}' github.com/kubeflow/mpi-operator)"
[ -d "$src" ] || { echo "build.sh: no source directory for github.com/kubeflow/mpi-operator" >&2; exit 1; }
patched="$tmp/src/mpi-operator"
mkdir -p "$tmp/src" && cp -r "$src" "$patched" && chmod -R u+w "$patched"
server_go="$patched/cmd/mpi-operator/app/server.go"
grep -q 'Addr:    fmt.Sprintf(":%d", healthCheckPort),' "$server_go" \
  || { echo "build.sh: $server_go changed upstream; update the patch" >&2; exit 1; }
sed -i 's|Addr:    fmt.Sprintf(":%d", healthCheckPort),|Addr:    chexflowHealthAddr(),|' "$server_go"
cat >> "$server_go" <<'GO'

// chexflowHealthAddr is the health check's listen address: MPI_OPERATOR_HEALTH_ADDR or ":8080".
func chexflowHealthAddr() string {
	if addr := os.Getenv("MPI_OPERATOR_HEALTH_ADDR"); addr != "" {
		return addr
	}
	return fmt.Sprintf(":%d", healthCheckPort)
}
GO
cp go.mod "$tmp/src/go.mod" && cp go.sum "$tmp/src/go.sum"
echo "replace github.com/kubeflow/mpi-operator => $patched" >> "$tmp/src/go.mod"
GOFLAGS="$GOFLAGS -modfile=$tmp/src/go.mod" build mpi-operator \
  github.com/kubeflow/mpi-operator/cmd/mpi-operator
rm -rf "$tmp/src"

go list -m -f '{{.Path}} {{.Version}}' k8s.io/kubernetes sigs.k8s.io/kwok \
  github.com/kubeflow/mpi-operator go.etcd.io/etcd/server/v3 > "$tmp/VERSIONS"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tmp" "$dest"
trap - EXIT
echo "binaries in $dest"
