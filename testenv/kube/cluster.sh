#!/usr/bin/env bash
# A real Kubernetes control plane for tests: etcd, kube-apiserver and kube-scheduler built
# from Go modules at pinned versions (tools/*/go.mod), cached outside the work tree, and
# started on loopback with TLS, RBAC and an admin kubeconfig. No kubelet: tests create
# v1 Node objects through the API and the real kube-scheduler binds pods to them.
#
#   cluster.sh build     go build the three binaries (cached, keyed by the pinned versions)
#   cluster.sh up        certificates, etcd, apiserver, scheduler; waits until ready
#   cluster.sh down      stop everything, remove runtime state
#   cluster.sh status    exit 0 when the API server answers
#   cluster.sh env       export lines: KUBECONFIG, NODELEDGER_KUBE_BIN
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${NODELEDGER_CACHE:-$HOME/.cache/nodeledger}"
pinned() { awk -v m="$1" '{sub(/^require[ \t]+/, "")} $1 == m {print $2; exit}' "$2"; }
KUBE_VERSION=$(pinned k8s.io/kubernetes "$HERE/tools/kube/go.mod")
ETCD_VERSION=$(pinned go.etcd.io/etcd/server/v3 "$HERE/tools/etcd/go.mod")
BIN="$CACHE_ROOT/kube-$KUBE_VERSION-etcd-$ETCD_VERSION"
RUN="${NODELEDGER_RUNDIR:-/tmp/nodeledger}/kube"

ETCD_PORT=12379
ETCD_PEER_PORT=12380
API_PORT=16443
SCHED_PORT=16459

log() { echo "kube-cluster: $*" >&2; }
die() { log "$*"; exit 1; }

# ---------------------------------------------------------------------------- build

build() {
  [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-scheduler" ] && [ -x "$BIN/etcd" ] && return 0
  command -v go >/dev/null || die "go is not installed (scripts/install-system-deps.sh)"
  mkdir -p "$CACHE_ROOT"
  exec 9>"$BIN.lock"
  flock 9   # one build at a time; a second caller waits, then finds it done
  [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-scheduler" ] && [ -x "$BIN/etcd" ] && return 0
  local tmp="$BIN.building.$$" started=$SECONDS
  rm -rf "$BIN".building.*
  mkdir -p "$tmp"
  export GOMODCACHE="$CACHE_ROOT/go/mod" GOCACHE="$CACHE_ROOT/go/build" GOTOOLCHAIN=local
  export GOFLAGS=-mod=mod CGO_ENABLED=0
  log "building kube-apiserver, kube-scheduler $KUBE_VERSION and etcd $ETCD_VERSION"
  (cd "$HERE/tools/kube" && go build -trimpath -ldflags='-s -w' -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler)
  (cd "$HERE/tools/etcd" && go build -trimpath -ldflags='-s -w' -o "$tmp/etcd" \
    go.etcd.io/etcd/server/v3)
  mv -T "$tmp" "$BIN"
  log "built in $((SECONDS - started)) s: $BIN"
}

case "${1:-}" in
  build) build; echo "$BIN" ;;
  *) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
