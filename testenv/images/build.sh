#!/usr/bin/env bash
# Small OCI images for the test Kubernetes nodes (testenv/kube), built without a Docker
# engine or a registry: umoci writes them, `ctr -n k8s.io images import --all-platforms
# FILE` loads them under their reference (pods use imagePullPolicy: Never/IfNotPresent).
#
#   build.sh pause [REF]          containerd's sandbox_image: our own pause.c, gcc -static,
#                                 as /pause (REF default registry.nodeledger.test/pause:3.10)
#   build.sh busybox [REF]        Debian's busybox-static (the host's suite) as /bin/busybox
#                                 with a link per applet (/bin/sh, sleep, echo, cat, ...)
#                                 (REF default registry.nodeledger.test/busybox:1.35)
#   build.sh static BINARY REF    one static binary (e.g. kube-scheduler, coredns, CGO off)
#                                 at /usr/local/bin/<name>, its entrypoint, as 65532
#
# Each prints the OCI archive's path as the last line of stdout:
# ${NODELEDGER_CACHE:-$HOME/.cache/nodeledger}/image/out/<name>-<tag>-<key>.oci.tar, where
# <key> hashes the inputs (source, package version or binary, REF, recipe); a second call
# with the same inputs reuses it. All carry /etc/passwd and /etc/group (root, nonroot
# 65532); static images also the Mozilla CA bundle (Debian's ca-certificates, never the
# host's local CAs) at /etc/ssl/certs/ca-certificates.crt.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=image/lib.sh
source "$HERE/../../image/lib.sh"

RECIPE=3   # bump when an image's assembly changes: every archive is rebuilt
REGISTRY=registry.nodeledger.test

name_of() { local r=${1%:*}; echo "${r##*/}"; }   # registry/path/name:tag -> name

out_path() { echo "$IMAGE_OUT/$1-$2.oci.tar"; }

finish() {   # finish ROOTFS REF OUT CONFIG...
  local rootfs=$1 ref=$2 out=$3; shift 3
  oci_archive "$rootfs" "$ref" "$out" "$@"
  rm -rf "$rootfs"
  local base=${out##*/}
  prune "${base%-*.oci.tar}"
  log "built $ref: $out"
  echo "$out"
}

new_root() {   # sets WORK (removed on exit) and rootfs=$WORK/rootfs
  mkdir -p "$IMAGE_CACHE/work"
  WORK=$(mktemp -d "$IMAGE_CACHE/work/testimage.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  rootfs="$WORK/rootfs"
  mkdir -p "$rootfs"
}

ca_bundle() {   # ca_bundle ROOTFS: the Mozilla roots Debian's ca-certificates ships
  need_tools update-ca-certificates:ca-certificates
  mkdir -p "$1/etc/ssl/certs"
  cat /usr/share/ca-certificates/mozilla/*.crt >"$1/etc/ssl/certs/ca-certificates.crt"
}

build_pause() {
  local ref=${1:-$REGISTRY/pause:3.10} key out rootfs
  need_tools gcc:gcc
  key=$( { echo "recipe $RECIPE $ref"; gcc -dumpfullversion; cat "$HERE/pause.c"; } | sha256sum | cut -c1-16)
  out=$(out_path "pause-${ref##*:}" "$key")
  [ -f "$out" ] && { echo "$out"; return 0; }
  lock "$out"
  new_root
  gcc -static -Os -s -Wall -Wextra -Werror -o "$rootfs/pause" "$HERE/pause.c"
  add_users "$rootfs" nonroot
  finish "$rootfs" "$ref" "$out" --config.entrypoint /pause --config.user 65535:65535
}

build_busybox() {
  local ref=${1:-$REGISTRY/busybox:1.35} key out rootfs version
  need_tools apt-get:apt
  version=$(apt-cache policy busybox-static | sed -n 's/^ *Candidate: *//p')
  [[ -n $version && $version != "(none)" ]] || die "no busybox-static package in apt's lists"
  key=$(echo "recipe $RECIPE $ref busybox-static $version" | sha256sum | cut -c1-16)
  out=$(out_path "busybox-${ref##*:}" "$key")
  [ -f "$out" ] && { echo "$out"; return 0; }
  lock "$out"
  new_root
  (cd "$WORK" && apt-get download -q "busybox-static=$version" >/dev/null 2>&1) \
    || die "apt-get download busybox-static=$version failed"
  dpkg-deb -x "$WORK"/busybox-static_*.deb "$WORK/deb"
  mkdir -p "$rootfs/bin" "$rootfs/usr/bin" "$rootfs/sbin" "$rootfs/usr/sbin"
  cp "$WORK/deb/bin/busybox" "$rootfs/bin/busybox"
  local applet
  for applet in $("$rootfs/bin/busybox" --list-full); do   # e.g. bin/sh, usr/bin/env
    [ -e "$rootfs/$applet" ] || ln -s /bin/busybox "$rootfs/$applet"
  done
  [[ -L $rootfs/bin/sh && -L $rootfs/bin/sleep ]] || die "busybox lacks sh or sleep"
  add_users "$rootfs" nonroot
  finish "$rootfs" "$ref" "$out" --config.cmd /bin/sh \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.label "org.opencontainers.image.version=busybox-static $version"
}

build_static() {
  local binary=${1:-} ref=${2:-} key out rootfs name
  [[ -n $binary && -n $ref ]] || die "usage: build.sh static BINARY REF"
  [ -f "$binary" ] || die "no such file: $binary"
  ! readelf -l "$binary" 2>/dev/null | grep 'Requesting program interpreter' >/dev/null \
    || die "$binary is dynamically linked (build it with CGO_ENABLED=0)"
  name=$(basename "$binary")
  key=$( { echo "recipe $RECIPE $ref $name"; sha256sum <"$binary";
    cat /usr/share/ca-certificates/mozilla/*.crt 2>/dev/null | sha256sum; } | sha256sum | cut -c1-16)
  out=$(out_path "$(name_of "$ref")-${ref##*:}" "$key")
  [ -f "$out" ] && { echo "$out"; return 0; }
  lock "$out"
  new_root
  install -D -m 0755 "$binary" "$rootfs/usr/local/bin/$name"
  ca_bundle "$rootfs"
  add_users "$rootfs" nonroot
  finish "$rootfs" "$ref" "$out" --config.entrypoint "/usr/local/bin/$name" \
    --config.user 65532:65532 --config.env PATH=/usr/local/bin:/usr/bin:/bin \
    --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
}

mkdir -p "$IMAGE_OUT"
case "${1:-}" in
  pause) build_pause "${2:-}" ;;
  busybox) build_busybox "${2:-}" ;;
  static) build_static "${2:-}" "${3:-}" ;;
  *) sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//;$d' >&2; exit 2 ;;
esac
