#!/usr/bin/env bash
# Debian packages the test suite needs on a fresh machine of this kind (idempotent).
# The Slurm chroot and the Kubernetes binaries come from testenv/ scripts, cached.
set -euo pipefail

LOG_TAG=install-system-deps
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PACKAGES=(postgresql debootstrap openssl ca-certificates make gcc valgrind iproute2 util-linux)
# tests/web: the page in a real headless browser (Playwright drives this Chromium; it never
# downloads one), with a font that has the page's metrics.
PACKAGES+=(chromium fonts-liberation)
# OCI images without a Docker engine (image/build.sh, testenv/images/build.sh): umoci
# writes them, skopeo pushes them, runc runs one by hand; busybox-static and binutils (strip)
# go into them.
PACKAGES+=(umoci skopeo runc busybox-static binutils)
# The test cluster's real nodes (testenv/kube/nodes.sh): containerd 1.6 and runc run the
# pods, the CNI bridge plugin wires them, kube-proxy programs iptables (nft backend) and
# cleans conntrack entries.
PACKAGES+=(containerd containernetworking-plugins iptables conntrack)
# make lint checks every shell script with it.
PACKAGES+=(shellcheck)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v go >/dev/null || die "the Go toolchain is required"
