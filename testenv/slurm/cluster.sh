#!/usr/bin/env bash
# A real Slurm cluster for tests: Debian trixie in a chroot, built from nothing and cached;
# slurmctld, emulated slurmd nodes (three unless NODELEDGER_SLURM_NODES says otherwise) and
# slurmrestd (JWT) on loopback.
#
#   cluster.sh build            chroot + Slurm + its configured source tree (cached)
#   cluster.sh source           print the configured source tree (for slurm-plugins/),
#                               building only what it needs
#   cluster.sh fetch-source     print the release tarball (25.11, 26.05): found in the
#                               source dir or the cache, else fetched; checked either way
#   cluster.sh plugins-check    build slurm-plugins/ against that tree (-Werror), compare its
#                               node_features ops with the version's, run the C unit tests
#                               plain and under valgrind (no cluster needed)
#   cluster.sh up               (re)write the config and start everything; waits until ready
#   cluster.sh down             stop everything, remove runtime state
#   cluster.sh status           exit 0 when slurmctld, every node and slurmrestd answer
#   cluster.sh env              export lines: SLURMRESTD_URL, SLURM_JWT_TOKEN_FILE, ...
#   cluster.sh exec CMD...      run a Slurm client command inside the cluster
#   cluster.sh restart-ctld | reconfigure | restart-slurmd NODE | stop-slurmd NODE
#   cluster.sh stop-restd | start-restd
#   cluster.sh pause-restd | resume-restd   SIGSTOP/SIGCONT slurmrestd: it accepts
#                               connections (the kernel does) but never answers: a hung server
#
# NODELEDGER_SLURM_VERSION picks Slurm: 24.11 (default: Debian trixie's packages), 25.11 or
# 26.05 (compiled from release tarballs pinned by hash in testenv/slurm/sources.lock, taken
# from NODELEDGER_SLURM_SRC_DIR, default ../shared/slurm-src beside the repository, or
# $NODELEDGER_CACHE/slurm-src; when in neither, fetched with git from
# NODELEDGER_SLURM_GIT_URL, default SchedMD's GitHub repository, into the latter). Every
# version has its own cache, ports and runtime link, so clusters of different versions run
# side by side.
# NODELEDGER_SLURM_RESTD_ADDRESS=IP: slurmrestd also listens on IP (pods reach it there).
# NODELEDGER_SLURM_NODES=N (3 to 99, default 3) runs N slurmd nodes n1..nN, each 16 CPUs
# and 32000 MB, n3 with its four GPUs: registered (IDLE) nodes a bench can spread pods over
# (bench/headroom). Set it for every command of that cluster, not only `up`.
# NODELEDGER_SLURM_SCALE_NODES=N adds N nodes s1..sN (partition "scale") that have no slurmd
# and never register, and room for 50,000 jobs: the scale bench's cluster (bench/scale).
# Daemons run in a private mount namespace (only /proc is mounted, the host sees nothing);
# client commands enter that namespace. Set NODELEDGER_SLURM_PLUGINS=off to run without
# the C plugins from slurm-plugins/ (default: build, install and load them).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LOG_TAG=slurm-cluster
# shellcheck source=scripts/lib.sh
source "$REPO/scripts/lib.sh"
VERSION="${NODELEDGER_SLURM_VERSION:-24.11}"
SRC_DIR="${NODELEDGER_SLURM_SRC_DIR:-$REPO/../shared/slurm-src}"
LIBDIR=/usr/lib/x86_64-linux-gnu

# Everything that differs between the Slurm versions. KIND names the recipe that puts Slurm
# into the chroot (prepare_KIND, install_KIND below); RECIPE is that recipe's revision: bump
# it when the recipe changes, the cache key changes with it. Debian renamed the plugin
# directory slurm-wlm. Each version has its own default ports.
case "$VERSION" in
  24.11) KIND=debian   RECIPE=3 PORTS=16800 PLUGIN_DIR=$LIBDIR/slurm-wlm RELEASE= ;;
  25.11) KIND=upstream RECIPE=1 PORTS=17000 PLUGIN_DIR=$LIBDIR/slurm RELEASE=25.11.7 ;;
  26.05) KIND=upstream RECIPE=1 PORTS=17200 PLUGIN_DIR=$LIBDIR/slurm RELEASE=26.05.3 ;;
  *) die "NODELEDGER_SLURM_VERSION=$VERSION: expected 24.11, 25.11 or 26.05" ;;
esac
TARBALL=${RELEASE:+slurm-$RELEASE.tar.gz}

CACHE_ROOT="${NODELEDGER_CACHE:-$HOME/.cache/nodeledger}"
ROOT="$CACHE_ROOT/slurm-$VERSION-trixie-r$RECIPE"
RUNLINK="${NODELEDGER_RUNDIR:-/tmp/nodeledger}/slurm-$VERSION"
MIRROR="${NODELEDGER_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PLUGINS="${NODELEDGER_SLURM_PLUGINS:-on}"
# One more address slurmrestd listens on (same port), e.g. the test Kubernetes nodes'
# bridge, so that pods reach it: a loopback listener is not reachable from a pod.
RESTD_ADDRESS="${NODELEDGER_SLURM_RESTD_ADDRESS:-}"
SCALE_NODES="${NODELEDGER_SLURM_SCALE_NODES:-0}"
NODE_COUNT="${NODELEDGER_SLURM_NODES:-3}"
# At least n1-n3 (the tests name them); at most what fits below PORT_BASE + 200.
if ! [[ $NODE_COUNT =~ ^[0-9]+$ ]] || [ "$NODE_COUNT" -lt 3 ] || [ "$NODE_COUNT" -gt 99 ]; then
  die "NODELEDGER_SLURM_NODES=$NODE_COUNT: expected a number of nodes from 3 to 99"
fi

# Non-default ports. A second cluster of the same version (own NODELEDGER_CACHE and
# NODELEDGER_RUNDIR) can run beside the first with another NODELEDGER_SLURM_PORT_BASE, or
# with NODELEDGER_PORT_OFFSET added to every version's default (the suite's workers).
PORT_OFFSET="${NODELEDGER_PORT_OFFSET:-0}"
[[ $PORT_OFFSET =~ ^[0-9]+$ ]] || die "NODELEDGER_PORT_OFFSET=$PORT_OFFSET: expected a number"
PORT_BASE="${NODELEDGER_SLURM_PORT_BASE:-$((PORTS + PORT_OFFSET))}"
CTLD_PORT=$((PORT_BASE + 17))
RESTD_PORT=$((PORT_BASE + 20))
# Ports: slurmctld +17, slurmrestd +20, the scale nodes' closed port +99, node nI +100+I.
NODES=() NODE_PORTS=()
for ((i = 1; i <= NODE_COUNT; i++)); do
  NODES+=("n$i") NODE_PORTS+=($((PORT_BASE + 100 + i)))
done
RUN=/srv/run            # runtime state, inside the chroot
TOKEN_FILE="$RUN/slurm.jwt"
REST_API=v0.0.42        # the one slurmrestd API version that 24.11, 25.11 and 26.05 all serve
# slurm-plugins/hooks/nodeledger-job-hint, installed at every `up`: PrologSlurmctld and
# EpilogSlurmctld. It does nothing until a test writes its configuration (HINT_CONFIG).
HINT_HOOK=/usr/local/sbin/nodeledger-job-hint
HINT_CONFIG=/etc/slurm/nodeledger-hint.conf

in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }

in_root_with_proc() {   # in_root, with /proc mounted in a private mount namespace (valgrind)
  # shellcheck disable=SC2016  # expanded by that sh: the root and the command are its arguments
  unshare -m --propagation private sh -c 'mount -t proc proc "$0/proc" && exec chroot "$0" \
    /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"' "$ROOT" "$@"
}

# ---------------------------------------------------------------------------- sources
# The upstream releases' tarballs, pinned by hash in sources.lock so that a clone needs
# nothing beside it. Looked up in SRC_DIR (an offline copy, e.g. ../shared/slurm-src), then
# in SRC_CACHE; when in neither, a shallow clone of the pinned tag is checked against the
# pinned commit and archived into SRC_CACHE, the same tarball layout. Whatever the tarball's
# origin, it is checked against the pinned sha256 before anything is built from it.
SOURCES_LOCK="${NODELEDGER_SLURM_SOURCES_LOCK:-$REPO/testenv/slurm/sources.lock}"
GIT_URL="${NODELEDGER_SLURM_GIT_URL:-https://github.com/SchedMD/slurm.git}"
SRC_CACHE="$CACHE_ROOT/slurm-src"
SOURCE_TARBALL=   # set by source_tarball: the checked tarball the build extracts
FETCH_WORK=       # a fetch's scratch directory, removed however the script exits

read_pin() {      # PIN_TAG, PIN_COMMIT, PIN_SHA256, PIN_TAR_SHA256 of $RELEASE
  local release tag commit sha tar_sha
  [ -f "$SOURCES_LOCK" ] || die "$SOURCES_LOCK not found (NODELEDGER_SLURM_SOURCES_LOCK)"
  while read -r release tag commit sha tar_sha; do
    [ "$release" = "$RELEASE" ] || continue
    # A malformed line would otherwise surface as a confusing hash mismatch.
    [[ $commit =~ ^[0-9a-f]{40}$ && $sha =~ ^[0-9a-f]{64}$ && $tar_sha =~ ^[0-9a-f]{64}$ ]] \
      || die "$SOURCES_LOCK: the line of $RELEASE is malformed"
    PIN_TAG=$tag PIN_COMMIT=$commit PIN_SHA256=$sha PIN_TAR_SHA256=$tar_sha
    return 0
  done < <(grep -v '^[[:space:]]*\(#\|$\)' "$SOURCES_LOCK")
  die "Slurm $RELEASE is not pinned in $SOURCES_LOCK"
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# Accepted when the file is the pinned tarball, or (another gzip compresses other bytes)
# decompresses to the pinned tar. Anything else is refused, whatever its origin.
check_tarball() { # check_tarball FILE
  local found
  found=$(sha256_of "$1")
  [ "$found" = "$PIN_SHA256" ] && return 0
  [ "$(gzip -dc "$1" 2>/dev/null | sha256sum | cut -d' ' -f1)" = "$PIN_TAR_SHA256" ] && return 0
  die "Slurm $RELEASE: refused $1, nothing is built from it:
  expected sha256 $PIN_SHA256 (pinned in $SOURCES_LOCK)
  found    sha256 $found
Remove or replace that file; a missing tarball is fetched again."
}

source_tarball() {  # sets SOURCE_TARBALL: the offline copy, else the cache, else fetched
  local f
  read_pin
  for f in "$SRC_DIR/$TARBALL" "$SRC_CACHE/$TARBALL"; do
    if [ -f "$f" ]; then
      check_tarball "$f"
      SOURCE_TARBALL=$f
      return 0
    fi
  done
  fetch_tarball
  SOURCE_TARBALL=$SRC_CACHE/$TARBALL
}

fetch_tarball() { # the pinned tag, checked, archived into $SRC_CACHE/$TARBALL
  local repo found
  mkdir -p "$SRC_CACHE"
  # Two builds of one release at once (two worktrees, say): one fetches, the other waits.
  exec 8>"$SRC_CACHE/.$TARBALL.lock"
  flock 8
  if [ -f "$SRC_CACHE/$TARBALL" ]; then
    check_tarball "$SRC_CACHE/$TARBALL"
    return 0
  fi
  rm -rf "$SRC_CACHE/.fetch-$RELEASE".*   # left by a fetch that was killed
  FETCH_WORK=$(mktemp -d "$SRC_CACHE/.fetch-$RELEASE.XXXXXX")
  trap 'rm -rf "$FETCH_WORK"' EXIT
  repo=$FETCH_WORK/repo
  log "Slurm $RELEASE: not in $SRC_DIR nor $SRC_CACHE; fetching tag $PIN_TAG from $GIT_URL"
  # --no-checkout: git archive reads the objects, a work tree would only cost 40 MB more.
  # No prompt for credentials: a wrong URL has to fail, not wait for a user.
  GIT_TERMINAL_PROMPT=0 git -c advice.detachedHead=false clone --quiet --depth 1 \
    --no-checkout --branch "$PIN_TAG" "$GIT_URL" "$repo" 2>"$FETCH_WORK/clone.log" \
    || fetch_failed "$(tail -5 "$FETCH_WORK/clone.log")"
  found=$(git -C "$repo" rev-parse 'HEAD^{commit}')
  [ "$found" = "$PIN_COMMIT" ] || die "Slurm $RELEASE: refused tag $PIN_TAG of $GIT_URL, nothing is built from it:
  expected commit $PIN_COMMIT (pinned in $SOURCES_LOCK)
  found    commit $found"
  # gzip -9n: the bytes of the offline tarballs (no name, no time stamp in the header).
  git -C "$repo" archive --format=tar --prefix="slurm-$RELEASE/" HEAD | gzip -9n \
    >"$FETCH_WORK/$TARBALL" || die "Slurm $RELEASE: git archive of $PIN_TAG failed"
  check_tarball "$FETCH_WORK/$TARBALL"
  mv "$FETCH_WORK/$TARBALL" "$SRC_CACHE/$TARBALL"   # whole or not at all
  rm -rf "$FETCH_WORK"
  trap - EXIT
  log "Slurm $RELEASE: fetched $SRC_CACHE/$TARBALL ($(du -h "$SRC_CACHE/$TARBALL" | cut -f1))"
}

fetch_failed() { # fetch_failed GIT_ERROR: what was tried, and how to do without a network
  local all
  all=$(grep -v '^[[:space:]]*\(#\|$\)' "$SOURCES_LOCK" | awk '{printf " slurm-%s.tar.gz", $1}')
  # shellcheck disable=SC2001  # indents every line of git's error; an expansion cannot say so
  die "Slurm $RELEASE: no sources, and fetching them failed.
  looked for $TARBALL in NODELEDGER_SLURM_SRC_DIR ($SRC_DIR) and in $SRC_CACHE
  tried      git clone --depth 1 --branch $PIN_TAG $GIT_URL
$(sed 's/^/             /' <<<"$1")
To run offline, put $TARBALL into the directory NODELEDGER_SLURM_SRC_DIR names (or into
$SRC_CACHE), with sha256 $PIN_SHA256.
A machine with network makes it with
  NODELEDGER_SLURM_VERSION=$VERSION bash testenv/slurm/cluster.sh fetch-source   (prints its path)
or, in a clone of SchedMD's repository (tag $PIN_TAG is commit $PIN_COMMIT), with
  git archive --format=tar --prefix=slurm-$RELEASE/ $PIN_TAG | gzip -9n >$TARBALL
make test uses every release pinned in $SOURCES_LOCK:$all.
Or set NODELEDGER_SLURM_GIT_URL to a copy of the repository this machine reaches."
}

# ---------------------------------------------------------------------------- build
# Two stages, each cached in $ROOT and marked there by a file (.complete: every stage done):
#   .configured  the chroot with its packages and Slurm's configured source in /usr/src/slurm,
#                all that slurm-plugins/ needs; built elsewhere, then moved into place
#   .complete    Slurm installed, a cluster can run. Upstream compiles in place: make picks
#                up where an interrupted run stopped.

lock_cache() {    # one build per cache at a time; a second caller waits, then finds it done
  [ -n "${CACHE_LOCKED:-}" ] && return 0
  mkdir -p "$CACHE_ROOT"
  exec 9>"$ROOT.lock"
  flock 9
  CACHE_LOCKED=1
}

prepare() {       # stage one
  configured && return 0
  command -v debootstrap >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  [ -z "$TARBALL" ] || source_tarball  # before minutes of work, not after
  lock_cache
  configured && return 0
  local tmp="$ROOT.building.$$" started=$SECONDS
  rm -rf "$ROOT".building.*
  log "building $ROOT (debootstrap trixie from $MIRROR)"
  debootstrap --variant=minbase trixie "$tmp" "$MIRROR" >"$ROOT.debootstrap.log" 2>&1 \
    || { tail -20 "$ROOT.debootstrap.log"; die "debootstrap failed"; }
  printf '127.0.0.1 localhost\n::1 localhost\n' >"$tmp/etc/hosts"
  cp /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null || true
  printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"   # installs start nothing
  chmod +x "$tmp/usr/sbin/policy-rc.d"
  printf 'deb %s trixie main\ndeb-src %s trixie main\n' "$MIRROR" "$MIRROR" \
    >"$tmp/etc/apt/sources.list"
  rm -f "$tmp/etc/apt/sources.list.d/"*.sources
  ROOT="$tmp" in_root apt-get update -qq
  ROOT="$tmp" "prepare_$KIND"   # Slurm (or what builds it) and /usr/src/slurm, configured
  ROOT="$tmp" in_root apt-get clean
  gpu_devices "$tmp"   # also at every `up`: trees cached before it made devices
  ROOT="$tmp" in_root useradd --system --no-create-home restd
  touch "$tmp/.configured"
  mv "$tmp" "$ROOT"
  log "prepared $ROOT with the configured source of Slurm $(slurm_version) in $((SECONDS - started)) s"
}

build() {         # both stages
  [ -f "$ROOT/.complete" ] && return 0
  local started=$SECONDS
  prepare
  lock_cache
  [ -f "$ROOT/.complete" ] && return 0
  "install_$KIND"
  touch "$ROOT/.complete"
  log "built Slurm $(slurm_version) in $((SECONDS - started)) s"
}

configured() { [ -f "$ROOT/.configured" ] || [ -f "$ROOT/.complete" ]; }

# Emulated GPUs: slurmd drops GPUs without a device file, and a job's devices are named by
# their index. Character devices of NVIDIA's major (195), minor = index, as real ones are, so
# a test can tell which physical device each holder got (issue 23). Nothing backs them.
gpu_devices() {   # gpu_devices ROOT
  local i
  for i in 0 1 2 3; do
    [ -c "$1/dev/nvidia$i" ] && continue
    rm -f "$1/dev/nvidia$i"
    mknod -m 666 "$1/dev/nvidia$i" c 195 "$i"
  done
}

slurm_version() { # the version plugins are built for (and must match to load); empty if none
  sed -n 's/^#define SLURM_VERSION_STRING "\(.*\)"$/\1/p' "$ROOT/usr/src/slurm/config.h" \
    2>/dev/null || true
}

# Debian: trixie's packages and their source, configured the way the plugins need it.
prepare_debian() {
  in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends slurmctld slurmd slurmrestd slurm-client munge \
    slurm-wlm-jwt-plugin libslurm-dev libmunge-dev gcc make libc6-dev patch xz-utils \
    valgrind curl ca-certificates procps >/dev/null
  # The configured source of the exact installed version, for the C plugins.
  local version
  # shellcheck disable=SC2016  # ${Version} is dpkg-query's field, not a shell variable
  version=$(in_root dpkg-query -W -f='${Version}' slurmctld)
  in_root bash -ec "
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
    ./configure --prefix=/usr --sysconfdir=/etc/slurm --libdir=$LIBDIR \
      >/usr/src/configure.log 2>&1
    rm -f /usr/src/slurm-wlm_*
  " || die "configuring the Slurm source failed (see $ROOT/usr/src/configure.log)"
  echo "$version" >"$ROOT/.slurm-version"
}

install_debian() { :; }   # the packages came with stage one

# Upstream: a release tarball, configured here with what the test cluster uses and little
# else, then compiled and installed into /usr like Debian's packages.
prepare_upstream() {
  # munge creates its user; python3 renders 25.11's HTML docs during make.
  in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends munge libmunge-dev libjwt-dev libjson-c-dev libhttp-parser-dev \
    libyaml-dev pkgconf python3 gcc make libc6-dev \
    valgrind curl ca-certificates procps >/dev/null
  # The user Debian's packages create, with Debian's uid.
  in_root useradd --system --user-group --uid 64030 --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin slurm
  mkdir -p "$ROOT/usr/src/slurm"
  tar xzf "$SOURCE_TARBALL" -C "$ROOT/usr/src/slurm" --strip-components=1 --no-same-owner
  # --enable-slurmrestd and --with-* make configure fail, instead of silently leaving out
  # slurmrestd or auth/jwt, when a library is missing. --enable-multiple-slurmd: three
  # slurmd on one host (Debian builds so too). The rest is for a quick compile: the debug
  # default (-ggdb3 -O1) compiles a third slower than -O1 -g1, which still gives backtraces
  # with line numbers; with static libraries libtool compiles every object twice.
  in_root bash -ec "
    cd /usr/src/slurm
    ./configure --prefix=/usr --sysconfdir=/etc/slurm --libdir=$LIBDIR \
      --enable-multiple-slurmd --enable-slurmrestd --with-libhttp-parser --with-json \
      --with-jwt --with-yaml --with-munge \
      --disable-debug CFLAGS='-O1 -g1' --disable-static --disable-dependency-tracking \
      --disable-x11 --disable-sview --without-readline >/usr/src/configure.log 2>&1
  " || die "configuring the Slurm source failed (see $ROOT/usr/src/configure.log)"
  slurm_version >"$ROOT/.slurm-version"
}

install_upstream() {
  local started=$SECONDS plugin
  log "compiling Slurm $(slurm_version) in $ROOT/usr/src/slurm (make -j$(nproc), minutes)"
  in_root bash -ec "
    cd /usr/src/slurm
    make -j$(nproc) >/usr/src/make.log 2>&1
    make install >>/usr/src/make.log 2>&1
    ldconfig
  " || { tail -20 "$ROOT/usr/src/make.log"; die "compiling Slurm failed (see $ROOT/usr/src/make.log)"; }
  # What the cluster loads: a missing one would otherwise show up as a daemon that dies.
  for plugin in auth_munge auth_jwt cred_munge select_cons_tres proctrack_linuxproc gres_gpu \
    serializer_json rest_auth_jwt openapi_slurmctld; do   # task/none is built in
    [ -f "$ROOT$PLUGIN_DIR/$plugin.so" ] || die "Slurm was built without $plugin"
  done
  log "compiled and installed Slurm in $((SECONDS - started)) s"
}

# ---------------------------------------------------------------------------- runtime

# The scans below run in every wait loop: one find, and bash builtins per process (a
# readlink per process in /proc forked a thousand times per scan).
daemon_pids() {   # every process whose root is the chroot
  local p
  while read -r p; do
    echo "${p#/proc/}"
  done < <(find /proc/[0-9]* -maxdepth 1 -name root -lname "$ROOT" -printf '%h\n' 2>/dev/null)
  return 0
}

cluster_pids() {  # cluster_pids REGEX: this cluster's processes whose command line matches
  local p argv
  for p in $(daemon_pids); do
    mapfile -d '' -t argv 2>/dev/null <"/proc/$p/cmdline" || continue
    [[ "${argv[*]}" =~ $1 ]] && echo "$p"
  done
  return 0
}

no_cluster_pids() { [ -z "$(cluster_pids "$1")" ]; }

kill_cluster() {  # kill_cluster SIGNAL [REGEX]: signal this cluster's processes (matching REGEX)
  local pids
  pids=$(if [ $# -gt 1 ]; then cluster_pids "$2"; else daemon_pids; fi)
  # shellcheck disable=SC2086  # a list of PIDs, split on purpose
  [ -z "$pids" ] || kill "-$1" $pids 2>/dev/null || true
}

anchor_pid() {    # a process inside the cluster's mount namespace (tests/support/slurm_cluster.py too)
  local pids
  pids=$(cluster_pids '^/usr/sbin/munged( |$)')
  [ -n "$pids" ] || die "the cluster is not running (cluster.sh up)"
  echo "${pids%%$'\n'*}"
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
NodeFeaturesPlugins=node_features/k8s_resources
PrEpPlugins=prep/script,prep/k8s_gpu_fence"
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
SchedulerParameters=batch_sched_delay=0,bf_interval=5,sched_min_interval=100000,extra_constraints
GresTypes=k8scpu,k8smemory,k8sgpu,gpu
DefMemPerCPU=1000
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmctldTimeout=30
# Every SlurmdTimeout/3 s slurmctld pings the nodes silent for as long, and a ping fails
# after MessageTimeout: a stopped slurmd is NOT_RESPONDING within ~2/3 SlurmdTimeout +
# MessageTimeout (tests wait for it), DOWN after SlurmdTimeout.
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=2
MinJobAge=30
# Partition preemption, for tests that create partitions of a higher PriorityTier at runtime
# (tests/gpu/test_hold_fence.py); the configured partitions preempt nothing (PreemptMode=OFF).
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PrologSlurmctld=$HINT_HOOK
EpilogSlurmctld=$HINT_HOOK
$plugin_lines
EOF
  if [ "$SCALE_NODES" -gt 0 ]; then
    # Nodes nobody answers for (their port is closed): slurmctld keeps them DOWN.
    {
      echo "MaxJobCount=50000"
      echo "NodeName=s[1-$SCALE_NODES] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((PORT_BASE + 99)) CPUs=16 Sockets=2 CoresPerSocket=4 ThreadsPerCore=2 RealMemory=32000 State=UNKNOWN"
      echo "PartitionName=scale Nodes=s[1-$SCALE_NODES] MaxTime=INFINITE State=UP PreemptMode=OFF"
    } >>"$etc/slurm.conf"
  fi
  # n3's GPUs: one GRES type per device (gN is /dev/nvidiaN), so that a hold job can ask
  # for exactly the device a pod has (docs/gpu-identity.md); plain --gres=gpu:N still works.
  local i node gres gpu_gres=gpu:g0:1,gpu:g1:1,gpu:g2:1,gpu:g3:1
  for i in "${!NODES[@]}"; do
    node=${NODES[$i]}
    # With node_features/k8s_resources the k8s totals come from the plugin, not slurm.conf.
    gres=""
    [ "$PLUGINS" = on ] || gres="k8scpu:16,k8smemory:32000"
    if [ "$node" = n3 ]; then
      [ "$PLUGINS" = on ] || gres="$gres,k8sgpu:4"
      gres="${gres:+$gres,}$gpu_gres"
    fi
    echo "NodeName=$node NodeHostname=localhost NodeAddr=127.0.0.1 Port=${NODE_PORTS[$i]} CPUs=16 Sockets=2 CoresPerSocket=4 ThreadsPerCore=2 RealMemory=32000${gres:+ Gres=$gres} State=UNKNOWN" >>"$etc/slurm.conf"
  done
  echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP PreemptMode=OFF" >>"$etc/slurm.conf"
  gres_k8s="Name=k8scpu Flags=CountOnly
Name=k8smemory Flags=CountOnly
Name=k8sgpu Flags=CountOnly"
  {
    echo "$gres_k8s"
    for i in 0 1 2 3; do echo "NodeName=n3 Name=gpu Type=g$i File=/dev/nvidia$i"; done
  } >"$etc/gres.conf"
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

copy_plugins() {  # copy_plugins DIR: a clean copy of slurm-plugins/ at DIR inside the chroot
  [ -f "$REPO/slurm-plugins/Makefile" ] || die "slurm-plugins/ is missing"
  rm -rf "${ROOT:?}$1"
  cp -r "$REPO/slurm-plugins" "$ROOT$1"
  in_root make -s -C "$1" clean >/dev/null
}

install_plugins() {
  [ "$PLUGINS" = on ] || return 0
  copy_plugins /usr/src/nodeledger-plugins
  in_root make -s -C /usr/src/nodeledger-plugins SLURM_SRC=/usr/src/slurm \
    || die "building slurm-plugins failed"
  in_root make -s -C /usr/src/nodeledger-plugins install PLUGINDIR="$PLUGIN_DIR"
}

# Both plugins built (-Werror) against this version's configured tree, their exported
# node_features ops compared with the ones this version's interface lists (Slurm refuses a
# plugin that lacks one, and never calls one it does not list), then the C unit tests plain
# and under valgrind. Needs only stage one: no cluster.
plugins_check() {
  local dir=/usr/src/nodeledger-plugins-check want have
  prepare
  copy_plugins "$dir"
  in_root make -s -C "$dir" SLURM_SRC=/usr/src/slurm || die "building slurm-plugins failed"
  want=$(sed -n '/syms\[\] = {/,/};/s/.*"\(node_features_p_[a-z_0-9]*\)".*/\1/p' \
    "$ROOT/usr/src/slurm/src/interfaces/node_features.c" | sort)
  have=$(in_root nm -D --defined-only "$dir/node_features_k8s_resources.so" \
    | awk '$3 ~ /^node_features_p_/ {print $3}' | sort)
  [ "$want" = "$have" ] || die "node_features ops differ from Slurm $(slurm_version)'s:
$(diff <(echo "$want") <(echo "$have"))"
  echo "node_features ops: $(echo "$have" | wc -l), as Slurm $(slurm_version) lists them"
  in_root make -s -C "$dir" check SLURM_SRC=/usr/src/slurm
  in_root_with_proc make -s -C "$dir" check VALGRIND=1 SLURM_SRC=/usr/src/slurm
  echo "plugins built and tested against Slurm $(slurm_version)"
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
    "127.0.0.1:$RESTD_PORT" ${RESTD_ADDRESS:+"$RESTD_ADDRESS:$RESTD_PORT"} \
    >>"$ROOT$RUN/log/slurmrestd.log" 2>&1 </dev/null &
  disown
}

stop_slurmd() {
  kill_cluster TERM "^/usr/sbin/slurmd -N $1\$"
  wait_for 20 "slurmd stop" no_cluster_pids "^/usr/sbin/slurmd -N $1\$"
}

stop_restd() {
  kill_cluster TERM "^/usr/sbin/slurmrestd .*:$RESTD_PORT"
  wait_for 5 "slurmrestd stop" no_cluster_pids "^/usr/sbin/slurmrestd .*:$RESTD_PORT" || true
}

restd_ok() {
  local token
  token=$(cat "$ROOT$TOKEN_FILE" 2>/dev/null) || return 1
  curl -fsS -o /dev/null -m 2 -H "X-SLURM-USER-NAME: slurm" -H "X-SLURM-USER-TOKEN: $token" \
    "http://127.0.0.1:$RESTD_PORT/slurm/$REST_API/ping/"
}

nodes_ok() {
  local states
  states=$(in_cluster sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
  [ "$(echo "$states" | grep -cE ' (idle|mixed|allocated)$')" -ge "${#NODES[@]}" ]
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

# What a running cluster was brought up with: one brought up by another version of this
# script (its slurm.conf), the hint hook or the C plugins is restarted, never reused as it
# is. The node count too: a cluster of another size is restarted as well.
recipe() {
  { cat "$REPO/testenv/slurm/cluster.sh" "$REPO/slurm-plugins/hooks/nodeledger-job-hint" \
      "$REPO"/slurm-plugins/*/*.[ch] "$REPO"/slurm-plugins/*/*/*.c
    echo "nodes=$NODE_COUNT plugins=$PLUGINS"; } | sha256sum | cut -c1-16
}

up() {
  build
  exec 8>&- 9>&-   # the build locks: the daemons started next must not hold them
  if status >/dev/null 2>&1 && [ "$(cat "$ROOT$RUN/recipe" 2>/dev/null)" = "$(recipe)" ]; then
    return 0
  fi
  down >/dev/null 2>&1 || true
  local started=$SECONDS
  rm -rf "${ROOT:?}$RUN"
  mkdir -p "$ROOT$RUN"/{state,log} "${NODES[@]/#/$ROOT$RUN/spool/}"
  in_root chown -R slurm:slurm "$RUN/state"
  chmod 777 "$ROOT$RUN/log"
  write_config
  gpu_devices "$ROOT"
  install -m 755 "$REPO/slurm-plugins/hooks/nodeledger-job-hint" "$ROOT$HINT_HOOK"
  rm -f "$ROOT$HINT_CONFIG"
  install_plugins
  start_daemons
  wait_for 60 "nodes" nodes_ok || { logs_tail; die "nodes did not become idle"; }
  write_token
  wait_for 30 "slurmrestd" restd_ok || { logs_tail; die "slurmrestd did not answer"; }
  mkdir -p "$(dirname "$RUNLINK")"
  ln -sfn "$ROOT$RUN" "$RUNLINK"
  recipe >"$ROOT$RUN/recipe"
  log "up in $((SECONDS - started)) s: slurmrestd http://127.0.0.1:$RESTD_PORT, nodes ${NODES[*]}"
}

down() {
  local n=0
  kill_cluster TERM
  while [ -n "$(daemon_pids)" ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
  kill_cluster KILL
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
  source) prepare; echo "$ROOT/usr/src/slurm" ;;
  fetch-source)
    [ -n "$TARBALL" ] || { log "Slurm $VERSION comes from Debian's packages: no sources to fetch"; exit 0; }
    source_tarball; echo "$SOURCE_TARBALL" ;;
  plugins-check) plugins_check ;;
  up) up ;;
  down) down ;;
  status) status ;;
  env)
    version=$(slurm_version)
    [ -n "$version" ] || die "Slurm $VERSION is not built yet (cluster.sh build)"
    echo "export SLURMRESTD_URL=http://127.0.0.1:$RESTD_PORT"
    echo "export SLURM_JWT_TOKEN_FILE=$ROOT$TOKEN_FILE"
    echo "export SLURM_USER=slurm"
    echo "export SLURM_CHROOT=$ROOT"
    echo "export SLURM_RUNDIR=$ROOT$RUN"
    echo "export SLURM_SRC=$ROOT/usr/src/slurm"
    echo "export SLURM_VERSION=$version"
    echo "export SLURM_PLUGIN_DIR=$PLUGIN_DIR"
    echo "export SLURM_HINT_CONFIG=$ROOT$HINT_CONFIG"
    echo "export SLURM_NODES=$(IFS=,; echo "${NODES[*]}")" ;;
  exec) shift; cd / && in_cluster "$@" ;;
  restart-ctld)
    in_cluster scontrol shutdown slurmctld >/dev/null 2>&1 || true
    # Only this cluster's processes: another cluster may run beside it on the same host.
    wait_for 20 "slurmctld stop" no_cluster_pids '^/usr/sbin/slurmctld' \
      || kill_cluster KILL '^/usr/sbin/slurmctld'
    in_cluster /usr/sbin/slurmctld
    wait_for 60 "nodes" nodes_ok || { logs_tail; die "nodes did not come back"; } ;;
  reconfigure)
    # slurmctld and every slurmd re-exec as new processes (24.11 too). slurmctld answers
    # once its successor runs, the slurmd follow: return when the nodes are usable again.
    in_cluster scontrol reconfigure
    wait_for 60 "nodes" nodes_ok || { logs_tail; die "nodes did not come back"; } ;;
  stop-slurmd) stop_slurmd "${2:?node name}" ;;
  restart-slurmd)
    node=${2:?node name}
    stop_slurmd "$node"
    in_cluster /usr/sbin/slurmd -N "$node" ;;
  stop-restd) stop_restd ;;
  pause-restd | resume-restd)
    signal=STOP; [ "$1" = resume-restd ] && signal=CONT
    mapfile -t pids < <(cluster_pids "^/usr/sbin/slurmrestd .*:$RESTD_PORT")
    [ "${#pids[@]}" -gt 0 ] || die "slurmrestd is not running"
    kill -s "$signal" "${pids[@]}" ;;
  start-restd) stop_restd; start_restd; wait_for 30 "slurmrestd" restd_ok || die "slurmrestd did not answer" ;;
  *) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;   # the comment at the top
esac
