#!/usr/bin/env bash
# Debian packages the local machine needs (the images install their own in their Dockerfiles).
# Installs only what is missing; needs root (or sudo) the first time.
#   images/install-system.sh
set -euo pipefail
packages=(
  build-essential cmake            # Horovod's build
  libopenmpi-dev openmpi-bin       # Horovod with MPI; mpirun as in an MPIJob launcher
  openssl                          # certificates for the local Kubernetes control plane
  slurm-wlm munge                  # single-node Slurm for the bare-metal path's tests
  chromium fonts-dejavu-core       # headless browser: the tests open the HTML reports
  strace                           # the tests inject faults (ENOSPC, SIGKILL) into one file's I/O
  # the local cluster's real node (chexflow cluster up): container runtime, CNI, image builds
  containerd runc containernetworking-plugins iproute2
  podman buildah debootstrap       # images/*/Dockerfile on a debootstrapped bookworm base
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { echo "system packages present"; exit 0; }
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
echo ">> apt-get install ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
