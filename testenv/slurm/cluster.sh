#!/usr/bin/env bash
# A real Slurm 24.11 cluster for tests: Debian trixie in a chroot, built from nothing and
# cached; slurmctld, three emulated slurmd nodes and slurmrestd (JWT) on loopback.
#
#   cluster.sh build            debootstrap + packages + configured Slurm source (cached)
#   cluster.sh up               (re)write the config and start everything; waits until ready
#   cluster.sh down             stop everything, remove runtime state
#   cluster.sh status           exit 0 when slurmctld, every node and slurmrestd answer
#   cluster.sh env              export lines: SLURMRESTD_URL, SLURM_JWT_TOKEN_FILE, ...
#   cluster.sh exec CMD...      run a Slurm client command inside the cluster
#   cluster.sh restart-ctld | reconfigure | restart-slurmd NODE | stop-slurmd NODE
#   cluster.sh stop-restd | start-restd
#
# Daemons run in a private mount namespace (only /proc is mounted, the host sees nothing);
# client commands enter that namespace. Set NODELEDGER_SLURM_PLUGINS=off to run without
# the C plugins from slurm-plugins/ (default: build, install and load them).
set -euo pipefail

RECIPE=3   # bump when the build recipe changes: the cache key changes with it
SLURM_SERIES=24.11
CACHE_ROOT="${NODELEDGER_CACHE:-$HOME/.cache/nodeledger}"
ROOT="$CACHE_ROOT/slurm-$SLURM_SERIES-trixie-r$RECIPE"
RUNLINK="${NODELEDGER_RUNDIR:-/tmp/nodeledger}/slurm"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MIRROR="${NODELEDGER_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PLUGINS="${NODELEDGER_SLURM_PLUGINS:-on}"

# Non-default ports; a second cluster (own NODELEDGER_CACHE and NODELEDGER_RUNDIR) can run
# beside the first with another NODELEDGER_SLURM_PORT_BASE.
PORT_BASE="${NODELEDGER_SLURM_PORT_BASE:-16800}"
CTLD_PORT=$((PORT_BASE + 17))
RESTD_PORT=$((PORT_BASE + 20))
NODES=(n1 n2 n3)
NODE_PORTS=($((PORT_BASE + 101)) $((PORT_BASE + 102)) $((PORT_BASE + 103)))
RUN=/srv/run            # runtime state, inside the chroot
TOKEN_FILE="$RUN/slurm.jwt"
PLUGIN_DIR=/usr/lib/x86_64-linux-gnu/slurm-wlm

log() { echo "slurm-cluster: $*" >&2; }
die() { log "$*"; exit 1; }

in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }

# ---------------------------------------------------------------------------- build

build() {
  [ -f "$ROOT/.complete" ] && return 0
  command -v debootstrap >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  mkdir -p "$CACHE_ROOT"
  exec 9>"$ROOT.lock"
  flock 9   # one build at a time; a second caller waits, then finds it done
  [ -f "$ROOT/.complete" ] && return 0
  local tmp="$ROOT.building.$$" started=$SECONDS
  rm -rf "$ROOT".building.*
  log "building $ROOT (debootstrap trixie from $MIRROR)"
  debootstrap --variant=minbase trixie "$tmp" "$MIRROR" >"$CACHE_ROOT/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE_ROOT/debootstrap.log"; die "debootstrap failed"; }
  printf '127.0.0.1 localhost\n::1 localhost\n' >"$tmp/etc/hosts"
  cp /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null || true
  printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"   # installs start nothing
  chmod +x "$tmp/usr/sbin/policy-rc.d"
  printf 'deb %s trixie main\ndeb-src %s trixie main\n' "$MIRROR" "$MIRROR" \
    >"$tmp/etc/apt/sources.list"
  rm -f "$tmp/etc/apt/sources.list.d/"*.sources
  ROOT="$tmp" in_root apt-get update -qq
  ROOT="$tmp" in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends slurmctld slurmd slurmrestd slurm-client munge \
    slurm-wlm-jwt-plugin libslurm-dev libmunge-dev gcc make libc6-dev patch xz-utils \
    valgrind curl ca-certificates procps >/dev/null
  # The configured source of the exact installed version, for the C plugins.
  local version
  version=$(ROOT="$tmp" in_root dpkg-query -W -f='${Version}' slurmctld)
  ROOT="$tmp" in_root bash -ec "
    cd /usr/src
    apt-get source --tar-only -qq slurm-wlm=$version >/dev/null 2>&1
    tar xf slurm-wlm_*.orig.tar.*
    src=\$(ls -d slurm-*/ | head -n 1); mv \"\$src\" slurm
    cd slurm
    # Debian's patches, when the mirror serves them (it may only serve the orig tarball).
    for t in ../slurm-wlm_*.debian.tar.*; do [ -f \"\$t\" ] && tar xf \"\$t\"; done
    if [ -f debian/patches/series ]; then
      while read -r p; do
        case \"\$p\" in ''|'#'*) continue ;; esac
        patch -p1 -s <debian/patches/\$p
      done <debian/patches/series
    fi
    ./configure --prefix=/usr --sysconfdir=/etc/slurm --libdir=/usr/lib/x86_64-linux-gnu \
      >/usr/src/configure.log 2>&1
    rm -f /usr/src/slurm-wlm_*
  " || die "configuring the Slurm source failed (see $tmp/usr/src/configure.log)"
  ROOT="$tmp" in_root apt-get clean
  # Dummy GPU device files: slurmd drops GPUs without a device file.
  for i in 0 1 2 3; do : >"$tmp/dev/nvidia$i"; done
  ROOT="$tmp" in_root useradd --system --no-create-home restd
  echo "$version" >"$tmp/.slurm-version"
  touch "$tmp/.complete"
  mv "$tmp" "$ROOT"
  log "built Slurm $version in $((SECONDS - started)) s"
}

# ---------------------------------------------------------------------------- runtime

daemon_pids() {   # every process whose root is the chroot
  local p root
  for p in /proc/[0-9]*; do
    root=$(readlink "$p/root" 2>/dev/null) || continue
    [ "$root" = "$ROOT" ] && echo "${p#/proc/}"
  done
  return 0
}

cluster_pids() {  # cluster_pids REGEX: this cluster's processes whose command line matches
  local p
  for p in $(daemon_pids); do
    tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | sed 's/ $//' | grep -qE -- "$1" && echo "$p"
  done
  return 0
}

no_cluster_pids() { [ -z "$(cluster_pids "$1")" ]; }

anchor_pid() {    # a process inside the cluster's mount namespace
  local pid
  pid=$(pgrep -f "^/usr/sbin/munged" | while read -r p; do
    [ "$(readlink "/proc/$p/root" 2>/dev/null)" = "$ROOT" ] && echo "$p"; done | head -n 1)
  [ -n "$pid" ] || die "the cluster is not running (cluster.sh up)"
  echo "$pid"
}

in_cluster() {    # run in the daemons' mount namespace, inside the chroot
  nsenter -t "$(anchor_pid)" -m chroot "$ROOT" /usr/bin/env -i \
    PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root SLURM_CONF=/etc/slurm/slurm.conf "$@"
}

write_config() {
  local etc="$ROOT/etc/slurm" plugin_lines="" gres_k8s
  mkdir -p "$etc"
  if [ "$PLUGINS" = on ]; then
    plugin_lines="JobSubmitPlugins=k8s_resource_completion
NodeFeaturesPlugins=node_features/k8s_resources"
  fi
  cat >"$etc/slurm.conf" <<EOF
# Written by testenv/slurm/cluster.sh: a test cluster, not a template for production.
ClusterName=nodeledger
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=slurm
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=/etc/slurm/jwt.key
StateSaveLocation=$RUN/state
SlurmdSpoolDir=$RUN/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$RUN/log/slurmctld.log
SlurmdLogFile=$RUN/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
SchedulerParameters=batch_sched_delay=0,bf_interval=5,sched_min_interval=100000
GresTypes=k8scpu,k8smemory,k8sgpu,gpu
DefMemPerCPU=1000
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=10
InactiveLimit=0
KillWait=2
MinJobAge=30
$plugin_lines
EOF
  local i node gres
  for i in "${!NODES[@]}"; do
    node=${NODES[$i]}
    # With node_features/k8s_resources the k8s totals come from the plugin, not slurm.conf.
    gres=""
    [ "$PLUGINS" = on ] || gres="k8scpu:16,k8smemory:32000"
    if [ "$node" = n3 ]; then
      [ "$PLUGINS" = on ] || gres="$gres,k8sgpu:4"
      gres="${gres:+$gres,}gpu:4"
    fi
    echo "NodeName=$node NodeHostname=localhost NodeAddr=127.0.0.1 Port=${NODE_PORTS[$i]} CPUs=16 Sockets=2 CoresPerSocket=4 ThreadsPerCore=2 RealMemory=32000${gres:+ Gres=$gres} State=UNKNOWN" >>"$etc/slurm.conf"
  done
  echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP" >>"$etc/slurm.conf"
  gres_k8s="Name=k8scpu Flags=CountOnly
Name=k8smemory Flags=CountOnly
Name=k8sgpu Flags=CountOnly"
  printf '%s\nNodeName=n3 Name=gpu File=/dev/nvidia[0-3]\n' "$gres_k8s" >"$etc/gres.conf"
  echo "CgroupPlugin=disabled" >"$etc/cgroup.conf"
  if [ ! -s "$etc/jwt.key" ]; then
    head -c 64 /dev/urandom >"$etc/jwt.key"
  fi
  in_root chown slurm:slurm /etc/slurm/jwt.key
  chmod 600 "$etc/jwt.key"
  if [ ! -s "$ROOT/etc/munge/munge.key" ]; then
    head -c 1024 /dev/urandom >"$ROOT/etc/munge/munge.key"
  fi
  in_root chown munge:munge /etc/munge/munge.key
  chmod 400 "$ROOT/etc/munge/munge.key"
}

install_plugins() {
  [ "$PLUGINS" = on ] || return 0
  [ -f "$REPO/slurm-plugins/Makefile" ] || die "NODELEDGER_SLURM_PLUGINS=on but slurm-plugins/ is missing"
  rm -rf "$ROOT/usr/src/nodeledger-plugins"
  cp -r "$REPO/slurm-plugins" "$ROOT/usr/src/nodeledger-plugins"
  in_root make -s -C /usr/src/nodeledger-plugins clean >/dev/null
  in_root make -s -C /usr/src/nodeledger-plugins SLURM_SRC=/usr/src/slurm \
    || die "building slurm-plugins failed"
  in_root make -s -C /usr/src/nodeledger-plugins install PLUGINDIR=$PLUGIN_DIR
}

start_daemons() {
  local script="$ROOT/srv/start.sh" i
  cat >"$script" <<EOF
#!/bin/sh
set -e
export SLURM_CONF=/etc/slurm/slurm.conf
mkdir -p /run/munge && chown munge:munge /run/munge
runuser -u munge -- /usr/sbin/munged
/usr/sbin/slurmctld -i
EOF
  for i in "${!NODES[@]}"; do
    echo "/usr/sbin/slurmd -N ${NODES[$i]}" >>"$script"
  done
  chmod +x "$script"
  unshare -m --propagation private sh -c \
    "mount -t proc proc '$ROOT/proc' && exec chroot '$ROOT' /srv/start.sh" \
    || die "starting the daemons failed: $(tail -5 "$ROOT$RUN/log/slurmctld.log" 2>/dev/null)"
  start_restd
}

start_restd() {
  # slurmrestd refuses root and SlurmUser; it needs SLURM_JWT=daemon to accept tokens.
  nsenter -t "$(anchor_pid)" -m chroot "$ROOT" /usr/bin/env -i \
    PATH=/usr/sbin:/usr/bin SLURM_CONF=/etc/slurm/slurm.conf SLURM_JWT=daemon \
    setsid runuser -u restd -- /usr/sbin/slurmrestd -s openapi/slurmctld -a rest_auth/jwt \
    "127.0.0.1:$RESTD_PORT" >>"$ROOT$RUN/log/slurmrestd.log" 2>&1 </dev/null &
  disown
}

stop_slurmd() {
  local pids
  pids=$(cluster_pids "^/usr/sbin/slurmd -N $1\$")
  [ -n "$pids" ] && kill $pids 2>/dev/null || true
  wait_for 20 "slurmd stop" no_cluster_pids "^/usr/sbin/slurmd -N $1\$"
}

stop_restd() {
  local pids
  pids=$(cluster_pids "^/usr/sbin/slurmrestd .*:$RESTD_PORT")
  [ -n "$pids" ] && kill $pids 2>/dev/null || true
  wait_for 5 "slurmrestd stop" no_cluster_pids "^/usr/sbin/slurmrestd .*:$RESTD_PORT" || true
}

restd_ok() {
  local token
  token=$(cat "$ROOT$TOKEN_FILE" 2>/dev/null) || return 1
  curl -fsS -o /dev/null -m 2 -H "X-SLURM-USER-NAME: slurm" -H "X-SLURM-USER-TOKEN: $token" \
    "http://127.0.0.1:$RESTD_PORT/slurm/v0.0.41/nodes/"
}

nodes_ok() {
  local states
  states=$(in_cluster sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
  [ "$(echo "$states" | grep -cE ' (idle|mixed|allocated)$')" -ge "${#NODES[@]}" ]
}

wait_for() {   # wait_for SECONDS WHAT CHECK...
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
}

write_token() {
  in_cluster scontrol token username=slurm lifespan=31536000 | sed -n 's/^SLURM_JWT=//p' \
    >"$ROOT$TOKEN_FILE.new"
  [ -s "$ROOT$TOKEN_FILE.new" ] || die "scontrol token failed"
  chmod 644 "$ROOT$TOKEN_FILE.new"
  mv "$ROOT$TOKEN_FILE.new" "$ROOT$TOKEN_FILE"
}

logs_tail() {
  local f
  for f in "$ROOT$RUN"/log/*.log; do
    [ -f "$f" ] && { echo "== $f"; tail -15 "$f"; }
  done >&2
}

up() {
  build
  if status >/dev/null 2>&1; then return 0; fi
  down >/dev/null 2>&1 || true
  local started=$SECONDS
  rm -rf "${ROOT:?}$RUN"
  mkdir -p "$ROOT$RUN"/{state,log} "$ROOT$RUN/spool"/{n1,n2,n3}
  in_root chown -R slurm:slurm "$RUN/state"
  chmod 777 "$ROOT$RUN/log"
  write_config
  install_plugins
  start_daemons
  wait_for 60 "nodes" nodes_ok || { logs_tail; die "nodes did not become idle"; }
  write_token
  wait_for 30 "slurmrestd" restd_ok || { logs_tail; die "slurmrestd did not answer"; }
  mkdir -p "$(dirname "$RUNLINK")"
  ln -sfn "$ROOT$RUN" "$RUNLINK"
  log "up in $((SECONDS - started)) s: slurmrestd http://127.0.0.1:$RESTD_PORT, nodes ${NODES[*]}"
}

down() {
  local pids n=0
  pids=$(daemon_pids)
  [ -n "$pids" ] && kill $pids 2>/dev/null || true
  while [ -n "$(daemon_pids)" ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
  pids=$(daemon_pids)
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
  rm -rf "${ROOT:?}$RUN" "$RUNLINK"
  return 0
}

status() {
  [ -n "$(daemon_pids)" ] || { echo "down"; return 1; }
  nodes_ok || { echo "nodes not ready"; return 1; }
  restd_ok || { echo "slurmrestd not answering"; return 1; }
  in_cluster sinfo -N -o '%N %T %c %m %G'
}

case "${1:-}" in
  build) build; echo "$ROOT" ;;
  up) up ;;
  down) down ;;
  status) status ;;
  env)
    echo "export SLURMRESTD_URL=http://127.0.0.1:$RESTD_PORT"
    echo "export SLURM_JWT_TOKEN_FILE=$ROOT$TOKEN_FILE"
    echo "export SLURM_USER=slurm"
    echo "export SLURM_CHROOT=$ROOT"
    echo "export SLURM_RUNDIR=$ROOT$RUN"
    echo "export SLURM_SRC=$ROOT/usr/src/slurm" ;;
  exec) shift; cd / && in_cluster "$@" ;;
  restart-ctld)
    in_cluster scontrol shutdown slurmctld >/dev/null 2>&1 || true
    # Only this cluster's processes: another cluster may run beside it on the same host.
    wait_for 20 "slurmctld stop" no_cluster_pids '^/usr/sbin/slurmctld' \
      || kill -9 $(cluster_pids '^/usr/sbin/slurmctld') 2>/dev/null || true
    in_cluster /usr/sbin/slurmctld
    wait_for 60 "nodes" nodes_ok || { logs_tail; die "nodes did not come back"; } ;;
  reconfigure) in_cluster scontrol reconfigure ;;
  stop-slurmd) stop_slurmd "${2:?node name}" ;;
  restart-slurmd)
    node=${2:?node name}
    stop_slurmd "$node"
    in_cluster /usr/sbin/slurmd -N "$node" ;;
  stop-restd) stop_restd ;;
  start-restd) stop_restd; start_restd; wait_for 30 "slurmrestd" restd_ok || die "slurmrestd did not answer" ;;
  *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
