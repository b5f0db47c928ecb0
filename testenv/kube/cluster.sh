#!/usr/bin/env bash
# A real Kubernetes cluster for tests: etcd, kube-apiserver, kube-scheduler and, with
# nodes, kube-controller-manager, kubelets, kube-proxy and CoreDNS, built from Go modules at
# pinned versions (tools/*/go.mod), cached outside the work tree, and started with TLS, RBAC
# and an admin kubeconfig. Two shapes:
# - the control plane alone (default), on loopback: tests create v1 Node objects through
#   the API and the real kube-scheduler binds pods to them; nothing runs them.
# - NODELEDGER_KUBE_NODES=N: also N real worker nodes n1..nN (kubelet + Debian's containerd,
#   runc and CNI plugins, each in a network namespace of its own; nodes.sh says what runs
#   where), a controller manager and cluster DNS. NODELEDGER_KUBE_GPU_NODE=I: node nI runs
#   containerd 2.x with CDI and a DRA kubelet plugin of four fake GPUs (nodes.sh). Pods really run, from images built here
#   (testenv/images) and imported into every node: nothing is pulled from a registry.
#
#   cluster.sh build     go build the binaries, CoreDNS, helm and promtool (cached, keyed by
#                        the pinned versions)
#   cluster.sh up        certificates, etcd, apiserver, scheduler (and the nodes); waits
#                        until ready
#   cluster.sh down      stop everything, remove runtime state
#   cluster.sh load-image ARCHIVE   import an OCI archive into every node's containerd
#   cluster.sh status    exit 0 when the API server is ready and the scheduler runs
#   cluster.sh env       export lines: KUBECONFIG, NODELEDGER_KUBE_BIN, NODELEDGER_KUBE_RUN,
#                        KUBECTL (built with the servers), HELM, PROMTOOL
#   cluster.sh scheduler NAME CONFIG_FILE PORT
#                        start one more kube-scheduler (e.g. a second scheduler with an
#                        extender) from a KubeSchedulerConfiguration; waits for its healthz
#   cluster.sh stop-scheduler NAME
#   cluster.sh kill-kubelet nI     kill -9 node nI's kubelet (a lost kubelet: its containers
#                        keep running, the Node turns NotReady)
#   cluster.sh start-kubelet nI    start it again; waits until the Node is Ready
#   cluster.sh restart-apiserver   stop kube-apiserver and start it again (etcd keeps the
#                        data): every client's watch breaks and must resume (the default
#                        kube-scheduler is started again too, fresh for the next test)
#
# Runtime state in $NODELEDGER_RUNDIR/kube (default /tmp/nodeledger/kube): pki/, etcd/,
# admin.kubeconfig (O=system:masters), scheduler.kubeconfig (system:kube-scheduler),
# log/*.log, *.pid. Ports on 127.0.0.1: etcd 12379 (peer 12380), API server 16443,
# scheduler 16459. A second control plane (another NODELEDGER_RUNDIR) runs beside the
# first with NODELEDGER_KUBE_PORT_BASE=P: etcd P, peer P+1, API server P+2, scheduler P+3,
# and with nodes the controller manager P+4; or with NODELEDGER_PORT_OFFSET=O on the
# default ports + O.
# NODELEDGER_KUBE_VERSION picks the Kubernetes minor: 1.37 (default), 1.36 or 1.35, each
# pinned by tools/kube-MINOR/go.mod, with etcd 3.7 (1.37) or 3.6 (tools/etcd-MINOR), cached
# apart. 1.36 runs in $NODELEDGER_RUNDIR/kube-1.36 on the default ports + 10, 1.35 in
# kube-1.35 on + 20 (and on NODELEDGER_KUBE_PORT_BASE + 10 or + 20), so the control planes
# of all three run side by side; set it for every command of that cluster, not only `up`.
# Real nodes (NODELEDGER_KUBE_NODES) run 1.37 only: 1.36 and 1.35 build no node binaries.
# NODELEDGER_KUBE_SCHEDULER=false starts no kube-scheduler (e.g. for pods created with
# spec.nodeName, which a scheduler would only cache). A CONFIG_FILE for `scheduler` must set clientConnection.kubeconfig to
# $NODELEDGER_KUBE_RUN/scheduler.kubeconfig (kube-scheduler ignores --kubeconfig when
# --config is given) and its own profiles[].schedulerName; leader election is turned off.
# Without nodes there is no controller manager: no namespace, garbage or node-lifecycle
# controllers, no default ServiceAccount (the ServiceAccount admission plugin is off).
# With nodes the API server listens on the nodes' bridge (10.231.0.1, nodes.sh) instead of
# loopback, and the controller manager's secure port is the scheduler's + 1.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_TAG=kube-cluster
# shellcheck source=scripts/lib.sh
source "$HERE/../../scripts/lib.sh"
# Builds are never changed once made, so every worker's control planes run the main cache's
# (NODELEDGER_MAIN_CACHE, tests/support/workers.py): one build and one lock, however many
# workers start them.
CACHE_ROOT="${NODELEDGER_MAIN_CACHE:-${NODELEDGER_CACHE:-$HOME/.cache/nodeledger}}"
pinned() { awk -v m="$1" '{sub(/^require[ \t]+/, "")} $1 == m {print $2; exit}' "$2"; }
# The Kubernetes minor, pinned by tools/kube-MINOR/go.mod, with the etcd minor that release
# is tested with upstream. The newest is the default and keeps the unversioned runtime
# directory and ports; the others run beside it on their own (PORT_SHIFT), so one test
# session can hold a control plane of each.
KUBE_NEWEST=1.37
KUBE_MINOR="${NODELEDGER_KUBE_VERSION:-$KUBE_NEWEST}"
case "$KUBE_MINOR" in
  1.37) PORT_SHIFT=0 ETCD_MINOR=3.7 ;;
  1.36) PORT_SHIFT=10 ETCD_MINOR=3.6 ;;
  1.35) PORT_SHIFT=20 ETCD_MINOR=3.6 ;;
  *) log "NODELEDGER_KUBE_VERSION=$KUBE_MINOR: expected 1.35, 1.36 or 1.37"; exit 2 ;;
esac
KUBE_TOOLS="$HERE/tools/kube-$KUBE_MINOR"
ETCD_TOOLS="$HERE/tools/etcd-$ETCD_MINOR"
KUBE_VERSION=$(pinned k8s.io/kubernetes "$KUBE_TOOLS/go.mod")
ETCD_VERSION=$(pinned go.etcd.io/etcd/server/v3 "$ETCD_TOOLS/go.mod")
RECIPE=4   # bump when the build recipe changes: cached binaries without it are rebuilt
# The recipe is part of the key: a checkout with another recipe builds beside this one.
BIN="$CACHE_ROOT/kube-$KUBE_VERSION-etcd-$ETCD_VERSION-r$RECIPE"
HELM_VERSION=$(pinned helm.sh/helm/v3 "$HERE/tools/helm/go.mod")
HELM="$CACHE_ROOT/helm-$HELM_VERSION/helm"
PROMTOOL_VERSION=$(pinned github.com/prometheus/prometheus "$HERE/tools/promtool/go.mod")
PROMTOOL="$CACHE_ROOT/promtool-$PROMTOOL_VERSION/promtool"
COREDNS_VERSION=$(pinned github.com/coredns/coredns "$HERE/tools/coredns/go.mod")
COREDNS="$CACHE_ROOT/coredns-$COREDNS_VERSION/coredns"
RUN="${NODELEDGER_RUNDIR:-/tmp/nodeledger}/kube"
[ "$KUBE_MINOR" = "$KUBE_NEWEST" ] || RUN="$RUN-$KUBE_MINOR"
PKI="$RUN/pki"
KUBECTL="${KUBECTL:-$BIN/kubectl}"   # built with the servers: no version skew

if [ -n "${NODELEDGER_KUBE_PORT_BASE:-}" ]; then
  [[ $NODELEDGER_KUBE_PORT_BASE =~ ^[0-9]+$ ]] || { log "bad NODELEDGER_KUBE_PORT_BASE"; exit 2; }
  ETCD_PORT=$((NODELEDGER_KUBE_PORT_BASE + PORT_SHIFT))
  ETCD_PEER_PORT=$((ETCD_PORT + 1))
  API_PORT=$((ETCD_PORT + 2))
  SCHED_PORT=$((ETCD_PORT + 3))
  CM_PORT=$((ETCD_PORT + 4))   # only with nodes
else   # the defaults, moved by NODELEDGER_PORT_OFFSET (the suite's workers)
  OFFSET="${NODELEDGER_PORT_OFFSET:-0}"
  [[ $OFFSET =~ ^[0-9]+$ ]] || { log "bad NODELEDGER_PORT_OFFSET"; exit 2; }
  ETCD_PORT=$((12379 + OFFSET + PORT_SHIFT))
  ETCD_PEER_PORT=$((ETCD_PORT + 1))
  API_PORT=$((16443 + OFFSET + PORT_SHIFT))
  SCHED_PORT=$((16459 + OFFSET + PORT_SHIFT))
  CM_PORT=$((SCHED_PORT + 1))
fi
WITH_SCHEDULER="${NODELEDGER_KUBE_SCHEDULER:-true}"
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1   # the `kubernetes` Service: the first address of SERVICE_CIDR

# shellcheck source=testenv/kube/nodes.sh
. "$HERE/nodes.sh"
[[ $NODE_COUNT =~ ^[0-9]$ ]] || die "NODELEDGER_KUBE_NODES=$NODE_COUNT: expected 0 to 9"
if ! [[ $GPU_NODE =~ ^[0-9]$ ]] || [ "$GPU_NODE" -gt "$NODE_COUNT" ]; then
  die "NODELEDGER_KUBE_GPU_NODE=$GPU_NODE: expected a node's number, 1 to $NODE_COUNT"
fi
if [ "$NODE_COUNT" -gt 0 ]; then API_HOST=$HOST_IP; else API_HOST=127.0.0.1; fi

# ---------------------------------------------------------------------------- build

BINARIES=(kube-apiserver kube-scheduler kubectl)
# The nodes' binaries only for the newest minor: the older ones run the API-facing tests,
# on a control plane without nodes, and their builds count in CI's cold 90 minutes.
if [ "$KUBE_MINOR" = "$KUBE_NEWEST" ]; then
  BINARIES+=(kube-controller-manager kubelet kube-proxy)
else
  [ "$NODE_COUNT" -eq 0 ] || die "NODELEDGER_KUBE_NODES: real nodes run Kubernetes $KUBE_NEWEST only"
fi

built() {
  local b
  for b in "${BINARIES[@]}" etcd; do [ -x "$BIN/$b" ] || return 1; done
  true \
    && [ "$(cat "$BIN/.recipe" 2>/dev/null)" = "$RECIPE" ]
}

# go build in DIR (a module under tools/) with the cached modules and build cache, static.
# Without debug information: nothing reads it, and leaving it out of every package saves
# compile and link time on a new machine.
go_build() {
  local dir=$1
  shift
  (cd "$dir" && GOMODCACHE="$CACHE_ROOT/go/mod" GOCACHE="$CACHE_ROOT/go/build" \
    GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 \
    go build -trimpath -gcflags=all=-dwarf=false "$@")
}

build_helm() {
  [ -x "$HELM" ] && return 0
  mkdir -p "$(dirname "$HELM")"
  exec 8>"$HELM.lock"
  flock 8   # one build at a time
  [ -x "$HELM" ] && return 0
  log "building helm $HELM_VERSION"
  go_build "$HERE/tools/helm" -ldflags='-s -w' -o "$HELM.tmp" helm.sh/helm/v3/cmd/helm
  mv "$HELM.tmp" "$HELM"
}

build_promtool() {   # checks and unit-tests the chart's alerting rules
  [ -x "$PROMTOOL" ] && return 0
  mkdir -p "$(dirname "$PROMTOOL")"
  exec 7>"$PROMTOOL.lock"
  flock 7   # one build at a time
  [ -x "$PROMTOOL" ] && return 0
  # Prometheus 3.x.y is module version v0.3xx.y; stamp it so `promtool --version` says so.
  local started=$SECONDS release=${PROMTOOL_VERSION#v0.} v=github.com/prometheus/common/version
  release="${release:0:1}.${release:1}"
  log "building promtool $release ($PROMTOOL_VERSION)"
  # remove_all_sd: without the service-discovery plugins (cloud SDKs), which checking and
  # testing rules never uses.
  go_build "$HERE/tools/promtool" -tags remove_all_sd -ldflags="-s -w -X $v.Version=$release" \
    -o "$PROMTOOL.tmp" github.com/prometheus/prometheus/cmd/promtool
  mv "$PROMTOOL.tmp" "$PROMTOOL"
  log "built promtool in $((SECONDS - started)) s: $PROMTOOL"
}

build_coredns() {   # the test cluster's DNS, only the plugins it uses (tools/coredns)
  [ -x "$COREDNS" ] && return 0
  mkdir -p "$(dirname "$COREDNS")"
  exec 6>"$COREDNS.lock"
  flock 6
  [ -x "$COREDNS" ] && return 0
  local started=$SECONDS
  log "building coredns $COREDNS_VERSION"
  go_build "$HERE/tools/coredns" -ldflags='-s -w' -o "$COREDNS.tmp" .
  mv "$COREDNS.tmp" "$COREDNS"
  log "built coredns in $((SECONDS - started)) s: $COREDNS"
}

build() {
  build_kube   # first: helm's build reuses its compiled packages (tools/helm pins their versions)
  build_helm
  build_promtool
  build_coredns
  build_gpu_node
}

build_kube() {
  built && return 0
  command -v go >/dev/null || die "go is not installed (scripts/install-system-deps.sh)"
  mkdir -p "$CACHE_ROOT"
  exec 9>"$BIN.lock"
  flock 9   # one build at a time; a second caller waits, then finds it done
  built && return 0
  local tmp="$BIN.building.$$" started=$SECONDS v=k8s.io/component-base/version
  rm -rf "$BIN".building.* "$BIN".old.*
  mkdir -p "$tmp"
  # The version stamp hack/lib/version.sh would set: without it the servers report
  # v0.0.0-master, which clients (kubectl's version dispatcher, Helm) misread.
  local minor=${KUBE_VERSION#v*.}; minor=${minor%%.*}
  local stamp="-X $v.gitVersion=$KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor"
  stamp="$stamp -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
  log "building ${BINARIES[*]} $KUBE_VERSION and etcd $ETCD_VERSION"
  go_build "$KUBE_TOOLS" -ldflags="-s -w $stamp" -o "$tmp/" \
    "${BINARIES[@]/#/k8s.io/kubernetes/cmd/}"
  go_build "$ETCD_TOOLS" -ldflags='-s -w' -o "$tmp/etcd" go.etcd.io/etcd/server/v3
  echo "$RECIPE" >"$tmp/.recipe"
  # An incomplete build of this recipe may be running: move it aside, running processes keep
  # their binaries.
  [ -e "$BIN" ] && mv -T "$BIN" "$BIN.old.$$"
  mv -T "$tmp" "$BIN"
  rm -rf "$BIN.old.$$"
  log "built in $((SECONDS - started)) s: $BIN"
}

# ---------------------------------------------------------------------------- pki

ca() {   # ca NAME CN: a self-signed P-256 CA
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=$2" -keyout "$PKI/$1.key" -out "$PKI/$1.crt" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

issue() {   # issue CA NAME SUBJECT EXTENSIONS: a P-256 key and a certificate signed by CA
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$3" \
    -keyout "$PKI/$2.key" -out "$PKI/$2.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$2.csr" -CA "$PKI/$1.crt" -CAkey "$PKI/$1.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 3650 -out "$PKI/$2.crt" \
    -extfile <(printf '%s\n' "$4") 2>/dev/null
  rm -f "$PKI/$2.csr"
}

make_pki() {
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  ca ca nodeledger-test-ca
  # The request-header (front proxy) CA: without it delegated authentication in
  # kube-scheduler logs an error for every lookup of extension-apiserver-authentication.
  ca front-proxy-ca nodeledger-test-front-proxy-ca
  local leaf="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment"
  local dns="DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  dns="$dns,DNS:kubernetes.default.svc.cluster.local"
  issue ca apiserver "/CN=kube-apiserver" "$leaf
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:$HOST_IP,IP:$SERVICE_IP,$dns"
  issue ca admin "/O=system:masters/CN=nodeledger-admin" "$leaf
extendedKeyUsage=clientAuth"
  issue ca scheduler "/CN=system:kube-scheduler" "$leaf
extendedKeyUsage=clientAuth"
  issue front-proxy-ca front-proxy-client "/CN=front-proxy-client" "$leaf
extendedKeyUsage=clientAuth"
  [ "$NODE_COUNT" -eq 0 ] || node_pki
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key"
  openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
}

b64() { base64 -w0 <"$1"; }

write_kubeconfig() {   # write_kubeconfig FILE CERT_NAME
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: nodeledger
  cluster:
    server: https://$API_HOST:$API_PORT
    certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(b64 "$PKI/$2.crt")
    client-key-data: $(b64 "$PKI/$2.key")
contexts:
- name: nodeledger
  context:
    cluster: nodeledger
    user: $2
current-context: nodeledger
EOF
  chmod 600 "$1"
}

# ---------------------------------------------------------------------------- processes

ours() {   # ours PID: a control-plane binary from the cache, running with this runtime dir
  local cmd
  cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") || return 1
  case "$cmd" in
    "$CACHE_ROOT"/kube-*/*"$RUN/"* | /usr/bin/containerd\ *"$RUN/"*) return 0 ;;
    /usr/bin/containerd-shim-runc-v2\ *"$RUN/"*) return 0 ;;
    # The GPU node's containerd 2.x, its shims and the DRA kubelet plugin (nodes.sh).
    "$CONTAINERD_BIN"/*"$RUN/"* | "$CACHE_ROOT"/gpu-plugin-*/*"$RUN/"*) return 0 ;;
  esac
  return 1
}

daemon_pids() {
  local p
  for p in /proc/[0-9]*; do
    ours "${p#/proc/}" && echo "${p#/proc/}"
  done
  return 0
}

pid_of() {   # pid_of NAME: the live process of $RUN/NAME.pid, if it is ours
  local pid
  pid=$(cat "$RUN/$1.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && ours "$pid" && echo "$pid"
}

spawn() {   # spawn NAME BINARY ARGS...: detached, in its own session, logging to log/NAME.log
  local name=$1; shift
  # Not a process-group leader here, so setsid execs in place and $! is the daemon.
  setsid "$@" >>"$RUN/log/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
}

stop() {   # stop PID...: TERM, wait up to 10 s, then KILL
  [ $# -gt 0 ] || return 0
  kill "$@" 2>/dev/null || true
  local n=0 p alive
  while [ $n -lt 100 ]; do
    alive=()
    for p in "$@"; do ours "$p" && alive+=("$p"); done
    [ "${#alive[@]}" -eq 0 ] && return 0
    sleep 0.1; n=$((n + 1))
  done
  kill -9 "${alive[@]}" 2>/dev/null || true
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

foreign_running() {   # a live process started from another cache owns this runtime dir
  local f pid
  for f in "$RUN"/*.pid; do
    pid=$(cat "$f" 2>/dev/null) || continue
    [ -n "$pid" ] && [ -d "/proc/$pid" ] && ! ours "$pid" \
      && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$RUN/" && return 0
  done
  return 1
}

alive() { pid_of "$1" >/dev/null; }   # alive NAME

same_build() {   # the running API server is this version's (not another checkout's)
  local pid
  pid=$(pid_of kube-apiserver) || return 1
  [[ $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) == "$BIN/kube-apiserver "* ]]
}

etcd_ok() {
  [[ $(curl -fsS -m 2 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null) == *'"health":"true"'* ]]
}

api_ok() {
  [ -f "$RUN/admin.kubeconfig" ] || return 1
  [ "$("$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" --request-timeout=2s \
    get --raw /readyz 2>/dev/null)" = ok ]
}

healthz_ok() { [ "$(curl -ksS -m 2 "https://127.0.0.1:$1/healthz" 2>/dev/null)" = ok ]; }

logs_tail() {   # logs_tail NAME...
  local name
  for name in "$@"; do
    [ -f "$RUN/log/$name.log" ] && { echo "== $RUN/log/$name.log"; tail -15 "$RUN/log/$name.log"; }
  done >&2
  return 0
}

start_scheduler() {   # start_scheduler NAME PORT [ARGS...]
  local name=$1 port=$2; shift 2
  spawn "$name" "$BIN/kube-scheduler" "$@" \
    --authentication-kubeconfig="$RUN/scheduler.kubeconfig" \
    --authorization-kubeconfig="$RUN/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$port" --leader-elect=false
  wait_for 60 "$name healthz" scheduler_ok "$name" "$port" \
    || { logs_tail "$name"; die "$name did not answer on https://127.0.0.1:$port/healthz"; }
}

scheduler_ok() { alive "$1" || return 1; healthz_ok "$2"; }   # scheduler_ok NAME PORT

start_default_scheduler() {
  start_scheduler kube-scheduler "$SCHED_PORT" --kubeconfig="$RUN/scheduler.kubeconfig"
}

start_apiserver() {
  local shape=()
  if [ "$NODE_COUNT" -gt 0 ]; then
    # Pods reach the API server through the `kubernetes` Service, whose endpoint is the
    # advertised bridge address; logs and exec go to the kubelets as system:masters.
    shape=(--endpoint-reconciler-type=lease
      --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt"
      --kubelet-client-key="$PKI/apiserver-kubelet-client.key"
      --kubelet-preferred-address-types=InternalIP)
  else
    # No kube-controller-manager and no kubelets: no endpoint reconciler (a loopback
    # address is not a valid endpoint), no ServiceAccount admission (nobody creates the
    # accounts).
    shape=(--endpoint-reconciler-type=none --disable-admission-plugins=ServiceAccount)
  fi
  spawn kube-apiserver "$BIN/kube-apiserver" "${shape[@]}" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address="$API_HOST" --advertise-address="$API_HOST" --secure-port="$API_PORT" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User \
    --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" \
    --proxy-client-key-file="$PKI/front-proxy-client.key" \
    --authorization-mode=Node,RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --enable-priority-and-fairness=false \
    --profiling=false
  wait_for 120 "kube-apiserver readiness" api_ok \
    || { logs_tail etcd kube-apiserver; die "kube-apiserver did not become ready"; }
}

start_controller_manager() {
  spawn kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$RUN/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$RUN/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$RUN/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$CM_PORT" --leader-elect=false \
    --use-service-account-credentials=true --controllers='*' \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --cluster-cidr="$POD_PREFIX.0.0/16" \
    --allocate-node-cidrs=false --profiling=false \
    --node-monitor-grace-period=20s   # a lost kubelet is NotReady in 20 s, not 50: tests wait for it
  wait_for 60 "kube-controller-manager healthz" healthz_ok "$CM_PORT" \
    || { logs_tail kube-controller-manager; die "kube-controller-manager did not start"; }
}

test_images() {   # build (cached) the images the nodes run, list their archives in $RUN/images
  local images="$HERE/../images/build.sh"
  {
    bash "$images" pause | tail -1
    bash "$images" busybox | tail -1
    bash "$images" static "$COREDNS" "registry.nodeledger.test/coredns:${COREDNS_VERSION#v}" \
      | tail -1
    bash "$images" static "$BIN/kube-scheduler" "registry.nodeledger.test/kube-scheduler:$KUBE_VERSION" \
      | tail -1
  } >"$RUN/images.tmp"
  mv "$RUN/images.tmp" "$RUN/images"
}

start_dns() {   # CoreDNS as a Deployment behind the kube-dns Service (addons/coredns.yaml)
  sed -e "s|@CLUSTER_DNS@|$CLUSTER_DNS|" -e "s|@VERSION@|${COREDNS_VERSION#v}|" \
    "$HERE/addons/coredns.yaml" \
    | "$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" apply -f - >/dev/null
  "$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" -n kube-system rollout status \
    deployment/coredns --timeout=180s >/dev/null \
    || { logs_tail kubelet-n1; die "CoreDNS did not become ready"; }
}

load_image() {   # load_image ARCHIVE: import an OCI archive into every node
  local archive=${1:?OCI archive} i
  [ -f "$archive" ] || die "no such file: $archive"
  [ "$NODE_COUNT" -gt 0 ] || die "no nodes: set NODELEDGER_KUBE_NODES"
  for ((i = 1; i <= NODE_COUNT; i++)); do import_image "$i" "$archive"; done
}

# ---------------------------------------------------------------------------- commands

up() {
  build
  exec 5>&- 6>&- 7>&- 8>&- 9>&-   # the build locks: the daemons started next must not hold them
  command -v "$KUBECTL" >/dev/null || die "kubectl is not installed"
  command -v openssl >/dev/null || die "openssl is not installed"
  if status >/dev/null 2>&1; then
    same_build && { log "already up"; return 0; }
    log "the control plane in $RUN runs another build: starting $KUBE_VERSION instead"
  fi
  foreign_running && die "another control plane (binaries not from $CACHE_ROOT) runs in $RUN;" \
    "leave it alone or use another NODELEDGER_RUNDIR"
  down
  local started=$SECONDS port
  for port in $ETCD_PORT $ETCD_PEER_PORT $API_PORT $SCHED_PORT \
    $([ "$NODE_COUNT" -eq 0 ] || echo "$CM_PORT"); do
    ! port_busy "$port" || die "port $port on 127.0.0.1 is in use by another process"
  done
  mkdir -p "$RUN/log"
  [ "$NODE_COUNT" -eq 0 ] || network_up
  make_pki
  write_kubeconfig "$RUN/admin.kubeconfig" admin
  write_kubeconfig "$RUN/scheduler.kubeconfig" scheduler
  [ "$NODE_COUNT" -eq 0 ] || write_kubeconfig "$RUN/controller-manager.kubeconfig" controller-manager

  local unsafe=()   # etcd >= 3.5: no fsync, the data is thrown away anyway
  case "$("$BIN/etcd" --help 2>&1)" in *--unsafe-no-fsync*) unsafe=(--unsafe-no-fsync) ;; esac
  spawn etcd "$BIN/etcd" --name=nodeledger --data-dir="$RUN/etcd" "${unsafe[@]}" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="nodeledger=http://127.0.0.1:$ETCD_PEER_PORT" \
    --log-level=warn
  wait_for 30 "etcd health" etcd_ok || { logs_tail etcd; die "etcd did not become healthy"; }

  start_apiserver

  if [ "$WITH_SCHEDULER" = true ]; then
    start_default_scheduler
  fi
  if [ "$NODE_COUNT" -gt 0 ]; then
    start_controller_manager
    test_images
    nodes_up
    start_dns
  fi
  log "up in $((SECONDS - started)) s: https://$API_HOST:$API_PORT," \
    "KUBECONFIG=$RUN/admin.kubeconfig"
}

down() {
  local f pid pids
  nodes_down
  # Extra schedulers, the controller manager, the scheduler, the API server, etcd; then
  # strays without a pid file.
  for f in "$RUN"/scheduler-*.pid kube-controller-manager kube-scheduler kube-apiserver etcd; do
    f=${f##*/}
    pid=$(pid_of "${f%.pid}") && stop "$pid"
  done
  mapfile -t pids < <(daemon_pids)
  stop "${pids[@]}"
  rm -rf "${RUN:?}"
  return 0
}

status() {
  api_ok || { echo "kube-apiserver not ready"; return 1; }
  [ "$WITH_SCHEDULER" != true ] || scheduler_ok kube-scheduler "$SCHED_PORT" \
    || { echo "kube-scheduler not running"; return 1; }
  if [ "$NODE_COUNT" -gt 0 ]; then
    healthz_ok "$CM_PORT" || { echo "kube-controller-manager not running"; return 1; }
    local node
    for node in $(node_names); do
      node_ready "$node" || { echo "node $node not Ready"; return 1; }
    done
  fi
  echo "kube-apiserver https://$API_HOST:$API_PORT ready, kube-scheduler running" \
    "$([ "$NODE_COUNT" -eq 0 ] || echo ", nodes $(node_names | tr '\n' ' ')")"
}

extra_scheduler() {   # extra_scheduler NAME CONFIG_FILE PORT
  local name=${1:?name} config=${2:?KubeSchedulerConfiguration file} port=${3:?port}
  [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || die "bad scheduler name: $name"
  [[ $port =~ ^[0-9]+$ ]] || die "bad port: $port"
  [ -f "$config" ] || die "no such file: $config"
  api_ok || die "the control plane is not running (cluster.sh up)"
  stop_scheduler "$name"
  ! port_busy "$port" || die "port $port on 127.0.0.1 is in use by another process"
  start_scheduler "scheduler-$name" "$port" --config="$(realpath "$config")"
  log "scheduler $name answering on https://127.0.0.1:$port"
}

stop_scheduler() {   # stop_scheduler NAME
  local name=${1:?name} pid
  pid=$(pid_of "scheduler-$name") && stop "$pid"
  rm -f "$RUN/scheduler-$name.pid"
  return 0
}

case "${1:-}" in
  build) build; echo "$BIN" ;;
  up) up ;;
  down) down ;;
  status) status ;;
  env)
    echo "export KUBECONFIG=$RUN/admin.kubeconfig"
    echo "export NODELEDGER_KUBE_BIN=$BIN"
    echo "export NODELEDGER_KUBE_RUN=$RUN"
    echo "export KUBECTL=$KUBECTL"
    echo "export HELM=$HELM"
    echo "export PROMTOOL=$PROMTOOL" ;;
  scheduler) shift; extra_scheduler "$@" ;;
  load-image) shift; load_image "$@" ;;
  stop-scheduler) shift; stop_scheduler "$@" ;;
  kill-kubelet) [[ ${2:-} =~ ^n([0-9])$ ]] || die "usage: kill-kubelet nI"; kill_kubelet "${2#n}" ;;
  start-kubelet) [[ ${2:-} =~ ^n([0-9])$ ]] || die "usage: start-kubelet nI"; restart_kubelet "${2#n}" ;;
  restart-apiserver)
    pid=$(pid_of kube-apiserver) && stop "$pid"
    start_apiserver
    # The default scheduler's informers back off while the API server is away (client-go:
    # up to 30 s, up to twice that with jitter), so the next test's pod could go unseen
    # for a minute; started again, it lists everything before it schedules.
    if pid=$(pid_of kube-scheduler); then
      stop "$pid"
      start_default_scheduler
    fi ;;
  *) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;   # the comment at the top
esac
