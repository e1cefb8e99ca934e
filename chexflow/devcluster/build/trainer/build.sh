#!/usr/bin/env bash
# Builds Kubeflow Trainer v2's controller manager (github.com/kubeflow/trainer/v2/cmd/
# trainer-controller-manager) and JobSet's controller (sigs.k8s.io/jobset, its module root) from
# their Go modules (go.mod beside this script for Trainer, jobset/go.mod for JobSet, each with the
# versions its own go.mod selects), static (CGO_ENABLED=0), and copies the CRDs, webhook
# manifests and the Role of Trainer's public ConfigMap the modules ship beside them:
#   chexflow/devcluster/build/trainer/build.sh [DEST]
# DEST defaults to $CHEXFLOW_K8S_CACHE/trainer-<key> (~/.cache/chexflow/k8s/trainer-<key>), where
# <key> is the Trainer release plus a hash of both go.mod and go.sum files and this script
# (chexflow.devcluster.trainer computes the same). Writes SHA256SUMS and VERSIONS beside them.
# Each go.mod is complete (`go mod tidy` over its tools.go), so builds never rewrite it.
# Polite on a shared machine: nice, GOFLAGS=-p=2 (override with CHEXFLOW_GO_PARALLEL).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || { echo "trainer/build.sh: go not found (expected /usr/local/go/bin/go)" >&2; exit 2; }
cd "$here"

version_of() { awk -v m="$1" '$1 == "require" && $2 == m {print $3; exit}' "$2"; }
trainer_version="$(version_of github.com/kubeflow/trainer/v2 go.mod)"
jobset_version="$(version_of sigs.k8s.io/jobset jobset/go.mod)"
[ -n "$trainer_version" ] && [ -n "$jobset_version" ] \
  || { echo "trainer/build.sh: no 'require github.com/kubeflow/trainer/v2 V' in go.mod or 'require sigs.k8s.io/jobset V' in jobset/go.mod" >&2; exit 2; }
key="${trainer_version}-$(cat go.mod go.sum jobset/go.mod jobset/go.sum build.sh | sha256sum | cut -c1-10)"
dest="${1:-${CHEXFLOW_K8S_CACHE:-$HOME/.cache/chexflow/k8s}/trainer-$key}"

export CGO_ENABLED=0 GOFLAGS="-p=${CHEXFLOW_GO_PARALLEL:-2} -mod=readonly -buildvcs=false"
tmp="$dest.partial.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

go mod download github.com/kubeflow/trainer/v2
trainer_src="$(go list -m -f '{{.Dir}}' github.com/kubeflow/trainer/v2)"
(cd jobset && go mod download sigs.k8s.io/jobset)
jobset_src="$(cd jobset && go list -m -f '{{.Dir}}' sigs.k8s.io/jobset)"

start=$SECONDS
echo ">> go build sigs.k8s.io/jobset -> jobset-controller"
(cd jobset && nice -n 10 go build \
  -ldflags "-s -w -X sigs.k8s.io/jobset/pkg/version.GitVersion=$jobset_version" \
  -o "$tmp/jobset-controller" sigs.k8s.io/jobset)
echo "   jobset-controller built in $((SECONDS - start)) s"
start=$SECONDS
echo ">> go build github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager -> trainer-controller-manager"
nice -n 10 go build -ldflags "-s -w" -o "$tmp/trainer-controller-manager" \
  github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager
echo "   trainer-controller-manager built in $((SECONDS - start)) s"

# CRDs and webhook manifests as the modules ship them (chexflow.devcluster.trainer points the
# webhooks at 127.0.0.1 when it installs them)
mkdir -p "$tmp/crds/trainer" "$tmp/crds/jobset"
cp "$trainer_src"/manifests/base/crds/trainer.kubeflow.org_*.yaml "$tmp/crds/trainer/"
cp "$jobset_src"/config/components/crd/bases/*.yaml "$tmp/crds/jobset/"
# with the JSON-patch files their kustomizations apply to them (JobSet's give its pod webhooks
# an objectSelector on jobset.sigs.k8s.io/jobset-name)
mkdir -p "$tmp/webhooks/trainer" "$tmp/webhooks/jobset"
cp "$trainer_src"/manifests/base/webhook/{manifests,patch_mutating,patch_validating}.yaml \
  "$tmp/webhooks/trainer/"
cp "$jobset_src"/config/components/webhook/manifests.yaml "$tmp/webhooks/jobset/"
cp "$jobset_src"/config/components/webhook/patches/mutating-patch.yaml \
  "$tmp/webhooks/jobset/patch_mutating.yaml"
cp "$jobset_src"/config/components/webhook/patches/validating-patch.yaml \
  "$tmp/webhooks/jobset/patch_validating.yaml"

# the Role and RoleBinding that let every user read Trainer's public ConfigMap (its version, which
# the Kubeflow SDK reads), as Trainer's manager overlay installs them
mkdir -p "$tmp/rbac"
cp "$trainer_src"/manifests/base/rbac/public_configmap_role{,_binding}.yaml "$tmp/rbac/"

(cd "$tmp" && sha256sum jobset-controller trainer-controller-manager webhooks/*/*.yaml \
  crds/*/*.yaml rbac/*.yaml > SHA256SUMS)
{ go version; go list -m -f '{{.Path}} {{.Version}}' github.com/kubeflow/trainer/v2 \
  sigs.k8s.io/controller-runtime k8s.io/client-go
  cd jobset && go list -m -f 'jobset: {{.Path}} {{.Version}}' sigs.k8s.io/jobset \
  sigs.k8s.io/controller-runtime k8s.io/client-go; } > "$tmp/VERSIONS"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tmp" "$dest"
trap - EXIT
echo "Trainer and JobSet binaries in $dest"
