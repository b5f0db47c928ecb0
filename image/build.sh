#!/usr/bin/env bash
# The service's OCI image, from the repository alone (no Docker engine, no registry):
# a distroless-style root filesystem holding only the files of the Debian trixie packages
# python3 needs at run time (no shell, apt, dpkg or perl), a venv at /opt/nodeledger with
# the pinned, hashed dependencies (image/requirements.txt) and the project's wheel built
# from the work tree, bytecode compiled (the root filesystem is read-only at run time).
#
#   image/build.sh [build]     build (or reuse) the image; prints the OCI archive's path
#                              as the last line of stdout
#   image/build.sh key         the archive path a build would produce (no build)
#   image/build.sh rootfs      build, then print the unpacked root filesystem's path
#                              (kept next to the archive, for tests and bench/image.py)
#   image/build.sh requirements
#                              regenerate image/requirements.txt and
#                              image/build-requirements.txt with uv (after changing
#                              pyproject.toml's dependencies)
#
# IMAGE: the reference (default registry.nodeledger.test/nodeledger:<pyproject version>).
# The `.test` registry is never pulled from: `ctr -n k8s.io images import --all-platforms
# FILE` names the image IMAGE. To publish: skopeo copy oci-archive:FILE docker://$IMAGE.
#
# Output: ${NODELEDGER_CACHE:-$HOME/.cache/nodeledger}/image/out/
# nodeledger-<version>-<key>.oci.tar, where <key> hashes the inputs (the files git
# knows under app/ migrations/ image/, pyproject.toml, README.md, as they are in the work
# tree, and IMAGE): a second run with the same inputs reuses it. "build_seconds" in
# <archive>.json records how long the build took; the unpacked root is <archive>.rootfs.
# The cached Debian base (debootstrap) is image/base-trixie-r<BASE_RECIPE>.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=image/lib.sh
source "$HERE/lib.sh"

BASE_RECIPE=1   # bump when BASE_PACKAGES change
BASE_PACKAGES=python3,python3-venv,ca-certificates,tzdata,netbase,media-types
RECIPE=3        # bump when the assembly below changes: every archive is rebuilt
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p;T;q' "$REPO_ROOT/pyproject.toml")
IMAGE="${IMAGE:-registry.nodeledger.test/nodeledger:$VERSION}"
PREFIX=/opt/nodeledger
# The Debian packages whose files the image carries: these and their Depends/Pre-Depends,
# minus the packaging and shell tools below (only maintainer scripts use them).
# libstdc++6: frozenlist's extension (aiohttp, kubernetes.aio) links it.
RUNTIME_PACKAGES=(python3 python3.13 ca-certificates tzdata netbase media-types base-files
  libstdc++6)
NOT_AT_RUNTIME=(debconf dpkg perl-base openssl coreutils sensible-utils debianutils bash dash
  readline-common)
# Paths in those packages that no running service reads.
DROP_PATHS='^/usr/share/(doc|doc-base|man|info|locale|lintian|bug|bash-completion|pixmaps|applications|menu|binfmts)(/|$)|^/etc/(cron|logrotate|init\.d|default|systemd)'

INPUTS=(app migrations image pyproject.toml README.md .gitignore)

input_files() {   # the inputs' files as in the work tree: tracked or new, not ignored
  git -C "$REPO_ROOT" ls-files -co --exclude-standard -- "${INPUTS[@]}" \
    | while read -r f; do [ -f "$REPO_ROOT/$f" ] && printf '%s\n' "$f"; done | LC_ALL=C sort -u
}

key() {
  { echo "recipe $RECIPE base $BASE_RECIPE image $IMAGE"
    (cd "$REPO_ROOT" && input_files | tr '\n' '\0' | xargs -0 sha256sum)
  } | sha256sum | cut -c1-16
}

archive_path() { echo "$IMAGE_OUT/nodeledger-$VERSION-$(key).oci.tar"; }

revision() {
  local rev
  rev=$(git -C "$REPO_ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
  [ -z "$(git -C "$REPO_ROOT" status --porcelain -- "${INPUTS[@]}" 2>/dev/null)" ] || rev="$rev-dirty"
  echo "$rev"
}

# The build root: a copy of the cached base with the venv, the wheel and the deps.
prepare_build_root() {   # prepare_build_root BASE ROOT
  local base=$1 root=$2
  cp -a "$base" "$root"
  mkdir -p "$root/src"
  (cd "$REPO_ROOT" && input_files | tar -cf - -T -) | tar -C "$root/src" -xf -
  log "installing the dependencies (image/requirements.txt) into $PREFIX"
  in_root "$root" sh -euc "
    python3 -m venv /tmp/buildenv
    /tmp/buildenv/bin/pip install -q --disable-pip-version-check --require-hashes --no-deps \
      --only-binary=:all: -r /src/image/build-requirements.txt
    cd /src && /tmp/buildenv/bin/python -m hatchling build -t wheel -d /tmp/wheels >/dev/null 2>&1
    python3 -m venv --without-pip $PREFIX
    pip() { /tmp/buildenv/bin/pip --disable-pip-version-check --python $PREFIX/bin/python \"\$@\"; }
    pip install -q --no-compile --require-hashes --no-deps --only-binary=:all: \
      -r /src/image/requirements.txt
    pip install -q --no-compile --no-deps /tmp/wheels/nodeledger-*.whl
    pip check >&2
  "
}

# The packages' file lists, with /bin, /lib... written as /usr/... (merged /usr).
runtime_paths() {   # runtime_paths ROOT
  local root=$1
  # shellcheck disable=SC2016  # ${Package}... are dpkg-query's fields, not shell variables
  chroot "$root" dpkg-query -W -f='${Package}\t${Pre-Depends}\t${Depends}\n' \
    | python3 "$HERE/closure.py" "${RUNTIME_PACKAGES[*]}" "${NOT_AT_RUNTIME[*]}" \
    | while read -r pkg; do cat "$root/var/lib/dpkg/info/$pkg.list" \
        "$root/var/lib/dpkg/info/$pkg:amd64.list" 2>/dev/null || true; done \
    | sed -E 's#^/(bin|sbin|lib|lib64)(/|$)#/usr/\1\2#' | grep -Ev "$DROP_PATHS" \
    | grep -v '^/\.$' | LC_ALL=C sort -u
}

# The distroless root: the runtime packages' files, generated files their maintainer
# scripts wrote (CA bundle, ld.so.cache, localtime), the venv, users.
assemble_rootfs() {   # assemble_rootfs BUILD_ROOT ROOTFS
  local root=$1 rootfs=$2
  mkdir -p "$rootfs"
  {
    runtime_paths "$root" | sed 's#^/##' | while read -r p; do
      [ -e "$root/$p" ] || [ -L "$root/$p" ] && printf '%s\n' "$p"
    done
    for p in bin sbin lib lib64 etc/ssl/certs etc/ld.so.cache etc/localtime etc/timezone; do
      [ -e "$root/$p" ] || [ -L "$root/$p" ] && printf '%s\n' "$p"
    done
    (cd "$root" && find etc/ssl/certs "${PREFIX#/}" \
      \( -path "${PREFIX#/}/lib/python3*/site-packages/pip" -o -name '__pycache__' \
         -o -path "${PREFIX#/}/lib/python3*/site-packages/pip-*" \
         -o -path "${PREFIX#/}/lib/python3*/site-packages/setuptools*" \
         -o -path "${PREFIX#/}/lib/python3*/site-packages/*/tests" \
         -o -path "${PREFIX#/}/lib/python3*/site-packages/*/test" \) -prune -o -print)
  } | tar -C "$root" --no-recursion -cf - -T - | tar -C "$rootfs" -xf -
  rm -f "$rootfs$PREFIX/bin/activate"*
  strip_extensions "$rootfs$PREFIX"
  add_users "$rootfs" nodeledger
  mkdir -p "$rootfs/data"
  chown 65532:65532 "$rootfs/data"
  # Bytecode for the stdlib and the venv, checked by nothing at import (unchecked-hash):
  # valid whatever the files' mtimes (oci_archive fixes them), never rewritten.
  # Not for kubernetes.aio (the asyncio twin of the client, 21 MB of bytecode): the
  # service uses the synchronous client only (tests/image checks app/ never imports it);
  # its source stays, importable.
  log "compiling bytecode"
  IN_ROOT_NET=0 in_root "$rootfs" /usr/bin/python3 -m compileall -q -j0 -x '/kubernetes/aio/' \
    --invalidation-mode unchecked-hash /usr/lib/python3.13 "$PREFIX" >/dev/null
}

# Some wheels ship their extension modules with symbol tables and debug info (uvloop's
# alone is 16 MB, 2 MB stripped). The libraries auditwheel vendored (*.libs/) are left
# alone: strip can break the ones patchelf rewrote.
strip_extensions() {   # strip_extensions DIR
  local f
  find "$1" -name '*.so*' -type f -not -path '*.libs/*' | while read -r f; do
    # grep reads it all (no -q): readelf killed by SIGPIPE would fail the pipeline
    # (pipefail) and skip the file, at random.
    readelf -S "$f" 2>/dev/null | grep ' \.symtab' >/dev/null || continue
    strip --strip-unneeded "$f"
  done
}

# Links and imports in the finished root, before it becomes an image: every shared object
# finds its libraries (the root's own loader lists them), the service imports as 65532.
check_rootfs() {   # check_rootfs ROOTFS
  local rootfs=$1 missing
  missing=$(cd "$rootfs" && find usr/lib "${PREFIX#/}" -name '*.so*' -type f | while read -r f; do
    chroot "$rootfs" /usr/lib64/ld-linux-x86-64.so.2 --list "/$f" 2>&1 \
      | sed -En "s#^[[:space:]]*(.*) => not found#$f: \1#p; s#.*: ([^:]*): cannot open shared object file.*#$f: \1#p"
  done)
  [ -z "$missing" ] || die "libraries missing from the image: $missing"
  env -i HOME=/tmp /usr/sbin/chroot --userspec=65532:65532 "$rootfs" "$PREFIX/bin/python3" -c \
    "$IMPORT_CHECK" || die "the image's Python cannot import the service or an extension module"
}

# Run inside the image as 65532: the service's modules, then every extension module.
IMPORT_CHECK='
import importlib, pathlib, sys, sysconfig
import app.main, app.cli, kubernetes, psycopg, uvicorn, sqlite3, ssl, zlib, lzma, bz2, ctypes
site = pathlib.Path(sysconfig.get_paths()["purelib"])
for so in sorted(site.rglob("*.so")):
    parts = so.relative_to(site).parts
    if any(p.endswith((".libs", ".dist-info")) for p in parts):
        continue
    name = ".".join((*parts[:-1], parts[-1].split(".")[0]))
    try:
        importlib.import_module(name)
    except ImportError as e:
        sys.exit(f"{name}: {e}")
'

build() {
  local out started=$SECONDS
  out=$(archive_path)
  if [ -f "$out" ] && [ -d "$out.rootfs" ]; then
    log "up to date: $out"
    echo "$out"
    return 0
  fi
  need_tools umoci:umoci python3:python3 strip:binutils
  local base
  base=$(base_root trixie "$BASE_RECIPE" "$BASE_PACKAGES")
  lock "$out"
  if [ -f "$out" ] && [ -d "$out.rootfs" ]; then echo "$out"; return 0; fi
  mkdir -p "$IMAGE_CACHE/work" "$IMAGE_OUT"
  WORK=$(mktemp -d "$IMAGE_CACHE/work/nodeledger.XXXXXX")
  trap cleanup EXIT
  log "building $IMAGE in $WORK"
  prepare_build_root "$base" "$WORK/build"
  assemble_rootfs "$WORK/build" "$WORK/rootfs"
  check_rootfs "$WORK/rootfs"
  oci_archive "$WORK/rootfs" "$IMAGE" "$out" \
    --config.user 65532:65532 \
    --config.entrypoint "$PREFIX/bin/nodeledger" --config.cmd serve \
    --config.workingdir /data \
    --config.env "PATH=$PREFIX/bin:/usr/local/bin:/usr/bin:/bin" \
    --config.env PYTHONDONTWRITEBYTECODE=1 --config.env PYTHONUNBUFFERED=1 \
    --config.env HOME=/tmp --config.env LANG=C.UTF-8 --config.env VIRTUAL_ENV="$PREFIX" \
    --config.env NODELEDGER_HOST=0.0.0.0 \
    --config.exposedports 8080/tcp \
    --config.label org.opencontainers.image.title=nodeledger \
    --config.label org.opencontainers.image.version="$VERSION" \
    --config.label org.opencontainers.image.revision="$(revision)" \
    --config.label org.opencontainers.image.source="${NODELEDGER_SOURCE_URL:-https://github.com/nodeledger/nodeledger}" \
    --config.label org.opencontainers.image.licenses=Apache-2.0 \
    --config.label org.opencontainers.image.base.name=debian:trixie
  rm -rf "$out.rootfs"
  mv "$WORK/rootfs" "$out.rootfs"
  printf '{"build_seconds": %d, "image": "%s"}\n' "$((SECONDS - started))" "$IMAGE" >"$out.json"
  prune nodeledger
  log "built $IMAGE in $((SECONDS - started)) s: $out"
  echo "$out"
}

cleanup() {
  [ -n "${WORK:-}" ] || return 0
  umount_root "$WORK/build" 2>/dev/null || true
  umount_root "$WORK/rootfs" 2>/dev/null || true
  rm -rf "$WORK"
}

requirements() {   # needs uv (pip install uv)
  local uv=(uv pip compile --generate-hashes --python-version 3.13
    --python-platform x86_64-manylinux_2_28 --no-header -q)
  cd "$REPO_ROOT"
  "${uv[@]}" pyproject.toml -o image/requirements.txt.tmp
  echo 'hatchling>=1.21' | "${uv[@]}" - -o image/build-requirements.txt.tmp
  for f in requirements build-requirements; do
    { echo "# Pinned, hashed: regenerate with \`bash image/build.sh requirements\` (uv pip compile"
      echo "# --generate-hashes --python-version 3.13 --python-platform x86_64-manylinux_2_28)."
      cat "image/$f.txt.tmp"; } >"image/$f.txt"
    rm "image/$f.txt.tmp"
  done
}

case "${1:-build}" in
  build) build ;;
  key) archive_path ;;
  rootfs) out=$(build) && echo "$out.rootfs" ;;
  requirements) requirements ;;
  *) sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//;$d' >&2; exit 2 ;;
esac
