# shellcheck shell=bash
# Real worker nodes for the test control plane: sourced by cluster.sh when
# NODELEDGER_KUBE_NODES=N (N >= 1); nothing here runs on its own.
#
# Each node nI (I = 1..N) is a network namespace `nlk-nI` holding a kubelet, its own
# containerd (Debian's, with runc and the CNI bridge plugin) and a kube-proxy (iptables).
# The namespaces hang off one host bridge:
#
#   host bridge nlk0        10.231.0.1/24   kube-apiserver (advertised to pods as the
#                                           `kubernetes` Service), and whatever else pods
#                                           must reach on the host: Slurm, PostgreSQL
#   node nI (veth eth0)     10.231.0.(10+I) kubelet :10250, kube-proxy
#   pods on nI (cni0)       10.232.I.0/24   routed between the nodes over the bridge
#   Services                10.96.0.0/16    kube-proxy; cluster DNS (CoreDNS) at 10.96.0.10
#
# The daemons share the host's mount namespace (nsenter --net, not `ip netns exec`): the
# kubelet mounts a pod's volumes where containerd must see them. Every node has its own
# cgroup root (/nlk-nI), kubelet root, containerd root and socket, CNI state and pod logs
# under $RUN/nodes/nI, so two kubelets never touch each other's pods. Pod images are never
# pulled: cluster.sh imports locally built OCI archives into each node's containerd.
#
# NODELEDGER_KUBE_GPU_NODE=I makes node nI a GPU node: it runs containerd 2.x (built from Go
# modules, tools/containerd: Debian's 1.6 cannot inject CDI devices) and the DRA kubelet
# plugin of four fake GPUs (tools/gpu-plugin, driver gpu.nodeledger.test: devices gpu0..gpu3
# with the index and uuid attributes nodeledger reads). A pod with a claim for them starts,
# its container given exactly its devices by the plugin's CDI spec: NODELEDGER_GPU_<index>=
# <uuid> and /dev/nvidia<index> (c 195:index, as in the Slurm test cluster).

NET_BRIDGE=nlk0
NET_PREFIX=10.231.0
HOST_IP=$NET_PREFIX.1
POD_PREFIX=10.232
CLUSTER_DNS=10.96.0.10
SANDBOX_IMAGE=registry.nodeledger.test/pause:3.10
NODE_COUNT="${NODELEDGER_KUBE_NODES:-0}"
GPU_NODE="${NODELEDGER_KUBE_GPU_NODE:-0}"   # 0: none
GPU_DRIVER=gpu.nodeledger.test
CONTAINERD_VERSION=$(pinned github.com/containerd/containerd/v2 "$HERE/tools/containerd/go.mod")
CONTAINERD_RECIPE=1   # bump when the build recipe changes
CONTAINERD_BIN="$CACHE_ROOT/containerd-$CONTAINERD_VERSION-r$CONTAINERD_RECIPE"
# The plugin is this repository's code: keyed by its sources (and its pinned modules).
GPU_PLUGIN_KEY=$(cat "$HERE"/tools/gpu-plugin/{main.go,go.mod,go.sum} | sha256sum | cut -c1-12)
GPU_PLUGIN="$CACHE_ROOT/gpu-plugin-$GPU_PLUGIN_KEY/gpu-plugin"
# The bridge, the namespaces, the routes and the nodes' cgroups are the machine's, not one
# run directory's: this file names the run directory whose cluster owns them.
NET_OWNER=/run/nodeledger-nodes.owner

node_ip() { echo "$NET_PREFIX.$((10 + $1))"; }           # node_ip I
node_dir() { echo "$RUN/nodes/n$1"; }                     # node_dir I
node_ns() { echo "nlk-n$1"; }                             # node_ns I
in_node() { local i=$1; shift; nsenter --net="/var/run/netns/$(node_ns "$i")" -- "$@"; }
node_names() { local i; for ((i = 1; i <= NODE_COUNT; i++)); do echo "n$i"; done; }
is_gpu_node() { [ "$1" = "$GPU_NODE" ]; }                 # is_gpu_node I
node_ctr() {   # node_ctr I: the ctr of node I's containerd
  if is_gpu_node "$1"; then echo "$CONTAINERD_BIN/ctr"; else echo ctr; fi
}

# ---------------------------------------------------------------------------- GPU node build

gpu_node_built() { [ -x "$CONTAINERD_BIN/containerd" ] && [ -x "$GPU_PLUGIN" ]; }

# containerd 2.x (CGO off: no btrfs; no devmapper or zfs snapshotters) and the
# plugin, cached by version like the control plane. Only for a GPU node: the other nodes
# keep Debian's containerd, and CI's cold build pays for this only where a test needs it.
build_gpu_node() {
  [ "$GPU_NODE" -gt 0 ] || return 0
  gpu_node_built && return 0
  command -v go >/dev/null || die "go is not installed (scripts/install-system-deps.sh)"
  mkdir -p "$CACHE_ROOT"
  exec 5>"$CACHE_ROOT/gpu-node.lock"
  flock 5   # one build at a time; a second caller waits, then finds it done
  gpu_node_built && return 0
  local started=$SECONDS tmp="$CONTAINERD_BIN.building.$$"
  if [ ! -x "$CONTAINERD_BIN/containerd" ]; then
    log "building containerd $CONTAINERD_VERSION"
    rm -rf "$tmp"
    go_build "$HERE/tools/containerd" -tags 'no_btrfs no_devmapper no_zfs' \
      -ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
      -o "$tmp/" github.com/containerd/containerd/v2/cmd/{containerd,containerd-shim-runc-v2,ctr} \
      || die "building containerd $CONTAINERD_VERSION failed"
    rm -rf "$CONTAINERD_BIN" && mv -T "$tmp" "$CONTAINERD_BIN"
  fi
  if [ ! -x "$GPU_PLUGIN" ]; then
    log "building the fake GPUs' DRA kubelet plugin"
    mkdir -p "$(dirname "$GPU_PLUGIN")"
    go_build "$HERE/tools/gpu-plugin" -ldflags='-s -w' -o "$GPU_PLUGIN.tmp" . \
      || die "building the GPU plugin failed"
    mv "$GPU_PLUGIN.tmp" "$GPU_PLUGIN"
  fi
  log "GPU node built in $((SECONDS - started)) s: $CONTAINERD_BIN, $GPU_PLUGIN"
}

# ---------------------------------------------------------------------------- network

owns_network() { [ "$(cat "$NET_OWNER" 2>/dev/null)" = "$RUN" ]; }

network_up() {
  local owner
  owner=$(cat "$NET_OWNER" 2>/dev/null) || true
  if [ -n "$owner" ] && [ "$owner" != "$RUN" ] && [ -d "$owner/nodes" ]; then
    die "another cluster with nodes runs (NODELEDGER_RUNDIR=${owner%/kube}): one at a time," \
      "stop it first"
  fi
  network_down   # what a cluster that was not stopped left behind
  mkdir -p "$(dirname "$NET_OWNER")"
  echo "$RUN" >"$NET_OWNER"
  ip link add "$NET_BRIDGE" type bridge
  ip addr add "$HOST_IP/24" dev "$NET_BRIDGE"
  ip link set "$NET_BRIDGE" up
  local i j ns
  for ((i = 1; i <= NODE_COUNT; i++)); do
    ns=$(node_ns "$i")
    ip netns del "$ns" 2>/dev/null || true
    ip link del "$ns" 2>/dev/null || true
    ip netns add "$ns"
    ip link add "$ns" type veth peer name eth0 netns "$ns"
    ip link set "$ns" master "$NET_BRIDGE" up
    ip -n "$ns" addr add "$(node_ip "$i")/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route add default via "$HOST_IP"
    for ((j = 1; j <= NODE_COUNT; j++)); do
      [ "$j" = "$i" ] || ip -n "$ns" route add "$POD_PREFIX.$j.0/24" via "$(node_ip "$j")"
    done
    # The host reaches every pod directly (tests, the API server's webhooks and proxy).
    ip route replace "$POD_PREFIX.$i.0/24" via "$(node_ip "$i")"
    in_node "$i" sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 >/dev/null
  done
}

network_down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^nlk-n[0-9]+$/ {print $1}'); do
    ip netns del "$ns" 2>/dev/null || true
  done
  ip route show 2>/dev/null | awk -v p="$POD_PREFIX." 'index($1, p) == 1 {print $1}' \
    | while read -r net; do ip route del "$net" 2>/dev/null || true; done
  ip link del "$NET_BRIDGE" 2>/dev/null || true
}

# ---------------------------------------------------------------------------- certificates

node_pki() {   # certificates of the node components, signed by the cluster's CA
  local leaf="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment" i
  issue ca controller-manager "/CN=system:kube-controller-manager" "$leaf
extendedKeyUsage=clientAuth"
  issue ca kube-proxy "/CN=system:kube-proxy" "$leaf
extendedKeyUsage=clientAuth"
  # kubectl logs/exec: the API server calls each kubelet with this identity.
  issue ca apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$leaf
extendedKeyUsage=clientAuth"
  for ((i = 1; i <= NODE_COUNT; i++)); do
    issue ca "kubelet-n$i" "/O=system:nodes/CN=system:node:n$i" "$leaf
extendedKeyUsage=clientAuth"
    issue ca "kubelet-n$i-serving" "/CN=n$i" "$leaf
extendedKeyUsage=serverAuth
subjectAltName=DNS:n$i,IP:$(node_ip "$i")"
  done
}

# ---------------------------------------------------------------------------- one node

write_node_config() {   # write_node_config I
  local i=$1 d
  d=$(node_dir "$i")
  mkdir -p "$d"/{containerd,kubelet,cni/net.d,cni/ipam,pod-logs,proxy}
  write_kubeconfig "$d/kubelet.kubeconfig" "kubelet-n$i"
  write_kubeconfig "$d/proxy/kubeconfig" kube-proxy

  if is_gpu_node "$i"; then write_containerd2_config "$i"; else
  cat >"$d/containerd/config.toml" <<EOF
version = 2
root = "$d/containerd/root"
state = "$d/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$d/containerd/containerd.sock"
[ttrpc]
  address = "$d/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$d/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$SANDBOX_IMAGE"
  # Root here lacks CAP_SYS_RESOURCE: no process may lower its oom_score_adj below 0.
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$d/cni/net.d"
EOF
  fi

  cat >"$d/cni/net.d/10-nlk.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "nlk",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$d/cni/ipam",
              "ranges": [[{"subnet": "$POD_PREFIX.$i.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

  cat >"$d/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $(node_ip "$i")
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
tlsCertFile: $PKI/kubelet-n$i-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-n$i-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$d/containerd/containerd.sock
# cgroup v1 and no systemd as PID 1 on these machines; 1.35 refuses v1 unless told.
cgroupDriver: cgroupfs
cgroupRoot: /nlk-n$i
failCgroupV1: false
failSwapOn: false
clusterDNS: [$CLUSTER_DNS]
clusterDomain: cluster.local
resolvConf: ""
podLogsDir: $d/pod-logs
# Two kubelets share one machine's disk and memory: evict only when it is truly short.
evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}
imageGCHighThresholdPercent: 100
EOF

  cat >"$d/proxy/config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $d/proxy/kubeconfig}
hostnameOverride: n$i
bindAddress: $(node_ip "$i")
mode: iptables
clusterCIDR: $POD_PREFIX.0.0/16
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# The namespace's conntrack table as it is: no sysctl writes.
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
}

write_containerd2_config() {   # write_containerd2_config I: containerd 2.x, with CDI
  local i=$1 d
  d=$(node_dir "$i")
  mkdir -p "$d/cdi"
  # Format 3: 2.4 migrates it to its own 4 (one warning at start), where [grpc] and [ttrpc]
  # are plugins' settings.
  cat >"$d/containerd/config.toml" <<EOF
version = 3
root = "$d/containerd/root"
state = "$d/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs"]
[grpc]
  address = "$d/containerd/containerd.sock"
[ttrpc]
  address = "$d/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$SANDBOX_IMAGE"
[plugins."io.containerd.cri.v1.runtime"]
  # CDI is on by default in 2.x; the GPU plugin writes its specs here.
  cdi_spec_dirs = ["$d/cdi"]
  # Root here lacks CAP_SYS_RESOURCE: no process may lower its oom_score_adj below 0.
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$d/cni/net.d"
EOF
}

cgroup_roots() {   # cgroup_roots I: the node's cgroup directory in every v1 hierarchy
  local c
  for c in /sys/fs/cgroup/*/; do
    [ -d "$c" ] && [ "${c%/}" != /sys/fs/cgroup/unified ] && echo "${c}nlk-n$1"
  done
}

start_node() {   # start_node I
  local i=$1 d c
  d=$(node_dir "$i")
  write_node_config "$i"
  for c in $(cgroup_roots "$i"); do mkdir -p "$c"; done
  if is_gpu_node "$i"; then
    # Its own shim first on the PATH: Debian's (1.6) is in /usr/bin.
    spawn "containerd-n$i" nsenter --net="/var/run/netns/$(node_ns "$i")" -- \
      env PATH="$CONTAINERD_BIN:$PATH" "$CONTAINERD_BIN/containerd" \
      --config "$d/containerd/config.toml"
  else
    spawn "containerd-n$i" nsenter --net="/var/run/netns/$(node_ns "$i")" -- \
      /usr/bin/containerd --config "$d/containerd/config.toml"
  fi
  wait_for 30 "containerd socket of n$i" test -S "$d/containerd/containerd.sock" \
    || { logs_tail "containerd-n$i"; die "containerd of n$i did not start"; }
  import_images "$i"
  start_kubelet "$i"
  if is_gpu_node "$i"; then start_gpu_plugin "$i"; fi
  spawn "kube-proxy-n$i" nsenter --net="/var/run/netns/$(node_ns "$i")" -- \
    "$BIN/kube-proxy" --config="$d/proxy/config.yaml"
}

start_kubelet() {   # start_kubelet I: node I's kubelet (its containerd runs)
  local i=$1 d
  d=$(node_dir "$i")
  spawn "kubelet-n$i" nsenter --net="/var/run/netns/$(node_ns "$i")" -- \
    "$BIN/kubelet" --config="$d/kubelet/config.yaml" --kubeconfig="$d/kubelet.kubeconfig" \
    --hostname-override="n$i" --node-ip="$(node_ip "$i")" --root-dir="$d/kubelet/root" \
    --cert-dir="$d/kubelet/pki" --node-labels="nodeledger.io/managed=true,nodeledger.io/slurm-node=n$i"
}

start_gpu_plugin() {   # start_gpu_plugin I: the fake GPUs' DRA kubelet plugin of node I
  local i=$1 d
  d=$(node_dir "$i")
  # Publishing ResourceSlices and reading claims: the admin's identity (a test cluster).
  spawn "gpu-plugin-n$i" nsenter --net="/var/run/netns/$(node_ns "$i")" -- \
    "$GPU_PLUGIN" -driver="$GPU_DRIVER" -node="n$i" -kubeconfig="$RUN/admin.kubeconfig" \
    -kubelet-dir="$d/kubelet/root" -cdi-dir="$d/cdi"
}

gpu_published() {   # gpu_published NAME: the plugin's ResourceSlice of node NAME exists
  [ -n "$("$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" --request-timeout=5s \
    get resourceslices --field-selector "spec.nodeName=$1,spec.driver=$GPU_DRIVER" \
    -o name 2>/dev/null)" ]
}

# A lost kubelet, as when its process dies: containerd and the containers keep running, the
# Node's lease is not renewed, and the node lifecycle controller marks it NotReady.
kill_kubelet() {   # kill_kubelet I
  local pid
  pid=$(pid_of "kubelet-n$1") || die "no kubelet of n$1 runs"
  kill -9 "$pid"
}

restart_kubelet() {   # restart_kubelet I: start it again and wait until the Node is Ready
  pid_of "kubelet-n$1" >/dev/null && die "the kubelet of n$1 runs"
  start_kubelet "$1"
  wait_for 120 "node n$1 Ready" node_ready "n$1" || { logs_tail "kubelet-n$1"; die "n$1 not Ready"; }
}

import_images() {   # import_images I: every archive named in $RUN/images into node I
  local i=$1 archive
  [ -f "$RUN/images" ] || return 0
  while read -r archive; do
    [ -z "$archive" ] || import_image "$i" "$archive"
  done <"$RUN/images"
}

import_image() {   # import_image I ARCHIVE
  "$(node_ctr "$1")" --address "$(node_dir "$1")/containerd/containerd.sock" -n k8s.io \
    images import --all-platforms "$2" >/dev/null || die "importing $2 into n$1 failed"
}

node_ready() {   # node_ready NAME: the Node's Ready condition is True
  [ "$("$KUBECTL" --kubeconfig "$RUN/admin.kubeconfig" --request-timeout=5s get node "$1" \
    -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

nodes_up() {
  local i
  for ((i = 1; i <= NODE_COUNT; i++)); do start_node "$i"; done
  for ((i = 1; i <= NODE_COUNT; i++)); do
    wait_for 120 "node n$i Ready" node_ready "n$i" \
      || { logs_tail "containerd-n$i" "kubelet-n$i"; die "node n$i did not become Ready"; }
  done
  [ "$GPU_NODE" -gt 0 ] || return 0
  wait_for 60 "the GPUs of n$GPU_NODE published" gpu_published "n$GPU_NODE" \
    || { logs_tail "gpu-plugin-n$GPU_NODE"; die "the GPU plugin of n$GPU_NODE published nothing"; }
}

# ---------------------------------------------------------------------------- teardown

kill_cgroup_tree() {   # kill every process left in node I's cgroups, then remove them
  local i=$1 c n=0 pids
  while [ $n -lt 50 ]; do
    pids=()
    for c in $(cgroup_roots "$i"); do
      [ -d "$c" ] && mapfile -t -O "${#pids[@]}" pids \
        < <(find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null)
    done
    [ "${#pids[@]}" -eq 0 ] && break
    kill -9 "${pids[@]}" 2>/dev/null || true
    sleep 0.1; n=$((n + 1))
  done
  for c in $(cgroup_roots "$i"); do
    [ -d "$c" ] && { find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true; }
  done
  return 0
}

nodes_down() {
  local f pid i mnt cmd
  # Another run directory's cluster (or none) owns the nodes: leave them alone.
  owns_network || return 0
  for f in "$RUN"/gpu-plugin-n*.pid "$RUN"/kubelet-n*.pid "$RUN"/kube-proxy-n*.pid \
    "$RUN"/containerd-n*.pid; do
    [ -e "$f" ] || continue
    f=${f##*/}
    pid=$(pid_of "${f%.pid}") && stop "$pid"
  done
  # The shims and the containers outlive containerd: end them by socket and by cgroup.
  for pid in $(daemon_pids); do
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || continue
    [[ $cmd == *"$RUN/nodes/"* ]] && { kill -9 "$pid" 2>/dev/null || true; }
  done
  for ((i = 1; i <= 9; i++)); do
    kill_cgroup_tree "$i"
  done
  # Pod volumes, container root filesystems and sandbox /dev/shm: innermost first.
  findmnt -rn -o TARGET 2>/dev/null | awk -v r="$RUN/nodes/" 'index($0, r) == 1' | sort -r \
    | while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
  # Pod network namespaces left by containerd (named cni-UUID), now without processes.
  for f in $(ip netns list 2>/dev/null | awk '$1 ~ /^cni-/ {print $1}'); do
    [ -z "$(ip netns pids "$f" 2>/dev/null)" ] && { ip netns del "$f" 2>/dev/null || true; }
  done
  network_down
  rm -f "$NET_OWNER"
  return 0
}
