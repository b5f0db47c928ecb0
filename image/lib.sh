# shellcheck shell=bash
# Shared functions for the OCI image builds (image/build.sh, testenv/images/build.sh):
# sourced, never run. No Docker engine and no registry: root filesystems come from
# debootstrap (cached), images are written with Debian's umoci and handed out as an OCI
# archive (a tar of the OCI layout) that `ctr -n k8s.io images import --all-platforms FILE`
# loads and `skopeo copy oci-archive:FILE docker://REF` pushes.
#
# Cache: ${NODELEDGER_CACHE:-$HOME/.cache/nodeledger}/image/
#   base-<suite>-r<recipe>/   debootstrap --variant=minbase root, with the build's packages
#   out/*.oci.tar             finished archives, named by their inputs' hash (reused)
#   work/                     scratch, removed after each build
# Environment: NODELEDGER_DEBIAN_MIRROR (default http://deb.debian.org/debian),
# SOURCE_DATE_EPOCH (default: the last commit's time) for file mtimes and the image's
# creation time.

IMAGE_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$IMAGE_LIB_DIR/.." && pwd)"
LOG_TAG=image
# shellcheck source=scripts/lib.sh
source "$REPO_ROOT/scripts/lib.sh"
IMAGE_CACHE="${NODELEDGER_CACHE:-$HOME/.cache/nodeledger}/image"
MIRROR="${NODELEDGER_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
IMAGE_OUT="$IMAGE_CACHE/out"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$REPO_ROOT" log -1 --format=%ct 2>/dev/null || echo 0)}"

# Debian packages for the tools, installed when missing (root on Debian).
need_tools() {   # need_tools CMD:PACKAGE ...
  local missing=() spec
  for spec in "$@"; do
    command -v "${spec%%:*}" >/dev/null || [ -x "/usr/sbin/${spec%%:*}" ] || missing+=("${spec#*:}")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Serialise builds of one cache entry: a second caller waits, then finds it done.
lock() {   # lock PATH  (fd 9, held until the process exits)
  mkdir -p "$(dirname "$1")"
  exec 9>"$1.lock"
  flock 9
}

# A cached debootstrap root: base_root SUITE RECIPE PACKAGES (comma-separated --include).
# Prints its path. Bump RECIPE when the package list changes.
base_root() {
  local suite=$1 recipe=$2 include=$3
  local root="$IMAGE_CACHE/base-$suite-r$recipe"
  if [ ! -f "$root/.done" ]; then
    need_tools debootstrap:debootstrap
    lock "$root"
    if [ ! -f "$root/.done" ]; then
      local tmp="$root.building.$$" started=$SECONDS
      rm -rf "$root".building.* "$root"
      log "debootstrap $suite (minbase + $include) from $MIRROR"
      debootstrap --variant=minbase --include="$include" "$suite" "$tmp" "$MIRROR" \
        >"$root.debootstrap.log" 2>&1 || { tail -20 "$root.debootstrap.log" >&2; die "debootstrap failed"; }
      printf '127.0.0.1 localhost\n::1 localhost\n' >"$tmp/etc/hosts"
      rm -rf "$tmp/var/cache/apt/archives/"*.deb
      touch "$tmp/.done"
      mv "$tmp" "$root"
      log "base $suite ready in $((SECONDS - started)) s"
    fi
    exec 9>&-
  fi
  echo "$root"
}

# Run a command inside a root, /proc and /dev bound. With IN_ROOT_NET=1 (default) it can
# reach the network as the host does: the host's resolv.conf, proxy and pip index settings,
# and the host's CA bundle as PIP_CERT (at /tmp/host-ca.pem, never in the root's own CA
# store: an intercepting proxy's CA must not end up in an image).
in_root() {   # in_root ROOT CMD...
  local root=$1; shift
  local envs=(PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME=/root LANG=C.UTF-8
    SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH")
  if [ "${IN_ROOT_NET:-1}" = 1 ]; then
    cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    local ca="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}" v
    if [ -f "$ca" ]; then mkdir -p "$root/tmp"; cp "$ca" "$root/tmp/host-ca.pem"; envs+=(PIP_CERT=/tmp/host-ca.pem); fi
    for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY PIP_INDEX_URL \
      PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_DEFAULT_TIMEOUT; do
      [ -z "${!v:-}" ] || envs+=("$v=${!v}")
    done
  fi
  mkdir -p "$root/proc" "$root/dev"
  mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
  mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"
  local rc=0
  env -i "${envs[@]}" chroot "$root" "$@" || rc=$?
  umount_root "$root"
  return $rc
}

umount_root() {
  local root=$1
  local m
  for m in "$root/proc" "$root/dev"; do   # lazily when a last child still holds it
    if mountpoint -q "$m"; then umount "$m" 2>/dev/null || umount -l "$m"; fi
  done
}

# /etc/passwd, /etc/group (root and nonroot 65532 NAME), /tmp (sticky) in a root.
add_users() {   # add_users ROOT NAME
  local root=$1 name=$2
  mkdir -p "$root/etc" "$root/tmp"
  chmod 1777 "$root/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\n%s:x:65532:65532:%s:/tmp:/sbin/nologin\n' \
    "$name" "$name" >"$root/etc/passwd"
  printf 'root:x:0:\n%s:x:65532:\n' "$name" >"$root/etc/group"
}

# A short hash of files' contents and names: hash_files PATH... (files or directories).
hash_files() {
  find "$@" -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}

# Write ROOTFS as a one-layer image and pack it as an OCI archive.
#   oci_archive ROOTFS REF OUTPUT [umoci config flags...]
# REF is the full reference (registry/repo:tag): index.json carries it as containerd's
# io.containerd.image.name annotation (what `ctr import` names the image) beside the OCI
# ref.name (the tag).
oci_archive() {
  local rootfs=$1 ref=$2 output=$3; shift 3
  need_tools umoci:umoci
  local tag=${ref##*:} work
  [[ $tag != "$ref" && $tag != */* ]] || die "reference needs a tag: $ref"
  work=$(mktemp -d "$IMAGE_CACHE/work/oci.XXXXXX")
  local layout="$work/layout" created
  created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
  # Fixed mtimes: the same files give the same layer.
  find "$rootfs" -newermt "@$SOURCE_DATE_EPOCH" -print0 | xargs -0r touch -h -d "@$SOURCE_DATE_EPOCH"
  umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  # unpack (empty), move the root in, repack: one layer of plain relative entries.
  umoci unpack --image "$layout:$tag" "$work/bundle" >/dev/null
  rmdir "$work/bundle/rootfs"
  mv "$rootfs" "$work/bundle/rootfs"
  touch -h -d "@$SOURCE_DATE_EPOCH" "$work/bundle/rootfs"
  umoci repack --image "$layout:$tag" --history.created "$created" \
    --history.created_by "$(basename "$0") (umoci repack)" "$work/bundle"
  mv "$work/bundle/rootfs" "$rootfs"
  umoci config --no-history --image "$layout:$tag" --created "$created" \
    --config.workingdir / --os linux --architecture amd64 "$@"
  umoci gc --layout "$layout"
  python3 - "$layout/index.json" "$ref" <<'EOF'
import json, sys
path, ref = sys.argv[1], sys.argv[2]
index = json.load(open(path))
for m in index["manifests"]:
    m.setdefault("annotations", {})["io.containerd.image.name"] = ref
json.dump(index, open(path, "w"), separators=(",", ":"))
EOF
  mkdir -p "$(dirname "$output")"
  tar -C "$layout" --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
    -cf "$output.tmp" .
  mv "$output.tmp" "$output"
  rm -rf "$work"
}

# Keep the newest KEEP (default 3) archives named NAME-*.oci.tar, with their rootfs/json.
prune() {   # prune NAME [KEEP]
  local f
  find "$IMAGE_OUT" -maxdepth 1 -name "$1-*.oci.tar" -printf '%T@ %p\n' | sort -rn \
    | tail -n +"$((${2:-3} + 1))" | cut -d' ' -f2- | while read -r f; do
    rm -rf "$f" "$f.rootfs" "$f.json" "$f.lock"
  done
}
