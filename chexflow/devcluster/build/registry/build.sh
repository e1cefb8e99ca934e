#!/usr/bin/env bash
# Builds the local cluster's OCI registry from github.com/distribution/distribution/v3 (go.mod
# beside this script; main.go: distribution's registry command with htpasswd auth and the
# filesystem driver only), static (CGO_ENABLED=0):
#   chexflow/devcluster/build/registry/build.sh [DEST]
# DEST defaults to $CHEXFLOW_K8S_CACHE/registry-<key> (~/.cache/chexflow/k8s/registry-<key>),
# where <key> is the distribution release plus a hash of go.mod, go.sum, main.go and this script
# (chexflow.devcluster.registry computes the same). Writes SHA256SUMS and VERSIONS beside it.
# go.mod is complete (`go mod tidy`), so builds never rewrite it.
# Polite on a shared machine: nice, GOFLAGS=-p=2 (override with CHEXFLOW_GO_PARALLEL).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || { echo "registry/build.sh: go not found (expected /usr/local/go/bin/go)" >&2; exit 2; }
cd "$here"

module=github.com/distribution/distribution/v3
version="$(awk -v m="$module" '$1 == "require" && $2 == m {print $3; exit}' go.mod)"
[ -n "$version" ] || { echo "registry/build.sh: go.mod: no 'require $module vX.Y.Z' line" >&2; exit 2; }
key="${version}-$(cat go.mod go.sum main.go build.sh | sha256sum | cut -c1-10)"
dest="${1:-${CHEXFLOW_K8S_CACHE:-$HOME/.cache/chexflow/k8s}/registry-$key}"

export CGO_ENABLED=0 GOFLAGS="-p=${CHEXFLOW_GO_PARALLEL:-2} -mod=readonly -buildvcs=false"
tmp="$dest.partial.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

start=$SECONDS
echo ">> go build $module (cmd/registry, htpasswd + filesystem) -> registry"
nice -n 10 go build -ldflags "-s -w -X $module/version.version=$version" -o "$tmp/registry" .
echo "   registry built in $((SECONDS - start)) s"

(cd "$tmp" && sha256sum registry > SHA256SUMS)
{ go version; go list -m -f '{{.Path}} {{.Version}}' "$module" golang.org/x/crypto; } > "$tmp/VERSIONS"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tmp" "$dest"
trap - EXIT
echo "registry binary in $dest"
