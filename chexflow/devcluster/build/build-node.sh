#!/usr/bin/env bash
# Builds the local cluster's real node from Go modules: the kubelet and kube-proxy
# (k8s.io/kubernetes, from go.mod beside this script, the same release as the control plane), CoreDNS (node/go.mod, a
# short plugin list in node/coredns/main.go) and the pod sandbox's `pause` program (C, from the
# k8s.io/kubernetes module's build/pause/linux/pause.c). containerd, runc and the CNI plugins
# come from Debian (images/install-system.sh).
#   chexflow/devcluster/build/build-node.sh [DEST]
# DEST defaults to $CHEXFLOW_K8S_CACHE/node-<key> (~/.cache/chexflow/k8s/node-<key>), where <key>
# is the Kubernetes release plus a hash of the files listed in NODE_INPUTS below
# (chexflow.devcluster.binaries computes the same).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || { echo "build-node.sh: go not found (expected /usr/local/go/bin/go)" >&2; exit 2; }
cd "$here"
NODE_INPUTS=(go.mod go.sum node/go.mod node/go.sum node/coredns/main.go build-node.sh)
k8s_version="$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' go.mod)"
key="${k8s_version}-$(cat "${NODE_INPUTS[@]}" | sha256sum | cut -c1-10)"
dest="${1:-${CHEXFLOW_K8S_CACHE:-$HOME/.cache/chexflow/k8s}/node-$key}"
minor="${k8s_version#v1.}"; minor="${minor%%.*}"

export CGO_ENABLED=0 GOFLAGS="-p=${CHEXFLOW_GO_PARALLEL:-2}"
tmp="$dest.partial.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

kver="-X k8s.io/component-base/version.gitVersion=$k8s_version \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean"
start=$SECONDS
echo ">> go build k8s.io/kubernetes/cmd/kubelet -> kubelet"
nice -n 10 go build -ldflags "-s -w $kver" -o "$tmp/kubelet" k8s.io/kubernetes/cmd/kubelet
echo "   kubelet built in $((SECONDS - start)) s"

start=$SECONDS
echo ">> go build k8s.io/kubernetes/cmd/kube-proxy -> kube-proxy"
nice -n 10 go build -ldflags "-s -w $kver" -o "$tmp/kube-proxy" k8s.io/kubernetes/cmd/kube-proxy
echo "   kube-proxy built in $((SECONDS - start)) s"

start=$SECONDS
echo ">> go build node/coredns -> coredns"
(cd node && nice -n 10 go build -ldflags "-s -w" -o "$tmp/coredns" ./coredns)
echo "   coredns built in $((SECONDS - start)) s"

go mod download k8s.io/kubernetes
pause_c="$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
[ -f "$pause_c" ] || { echo "build-node.sh: $pause_c not found" >&2; exit 1; }
echo ">> cc -static $pause_c -> pause"
cc -Os -Wall -static -DVERSION="$k8s_version" -o "$tmp/pause" "$pause_c"
strip "$tmp/pause"

{ go list -m -f '{{.Path}} {{.Version}}' k8s.io/kubernetes
  (cd node && go list -m -f '{{.Path}} {{.Version}}' github.com/coredns/coredns); } > "$tmp/VERSIONS"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tmp" "$dest"
trap - EXIT
echo "node binaries in $dest"
