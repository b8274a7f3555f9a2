#!/usr/bin/env bash
# Builds rkubelet's container image with buildah from the project's Dockerfile, on a base
# made here: nothing is pulled from a registry (none on the internet is reachable).
#
#   image.sh build   the base (once; cached) and the image $RKUBELET_IMAGE
#   image.sh clean   removes both images from buildah's storage and the cached base
#
# The base, $BASE_IMAGE: Debian bookworm minbase made by debootstrap from the Debian
# mirror, with systemd, iptables and the CNI plugins (a kind node's userland, without its
# container runtime). Its root file system is cached as $BASE_TARBALL, so the mirror is
# used once; the base image is made again from the tarball if buildah's storage lost it.
# Both carry the hash of the recipe below and are remade when it changes.
#
# The image's rkubelet: target/release/rkubelet, built first by cargo (a no-op when it is
# up to date), or RKUBELET_BINARY (e.g. a test's binary), stripped. Only the files the
# Dockerfile copies go into the build context, which mirrors the repository's layout.
#
# Environment: RKUBELET_IMAGE (default localhost/rkubelet:<version>), RKUBELET_BINARY,
# RKUBELET_TARGET (the Dockerfile stage: `agent`, the default, or `node`).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DEBIAN_SUITE="bookworm"
DEBIAN_MIRROR="${RKUBELET_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE_PACKAGES="systemd,iptables,containernetworking-plugins"
BASE_IMAGE="localhost/rkubelet-base:$DEBIAN_SUITE"
BASE_TARBALL="$IMAGES_CACHE/rootfs/rkubelet-base.tar.gz"
RECIPE_LABEL="org.rkubelet.base-recipe"
TARGET="${RKUBELET_TARGET:-agent}"
# Every build step runs in a plain chroot: we are root, no user namespaces are needed.
export BUILDAH_ISOLATION=chroot

# Set while a step holds something that must not outlive the script.
WORK_DIR=""
CONTAINER=""
cleanup() {
  if [[ -n $CONTAINER ]]; then buildah rm "$CONTAINER" >/dev/null || true; fi
  if [[ -n $WORK_DIR ]]; then rm -rf --one-file-system "$WORK_DIR"; fi
}
trap cleanup EXIT

# The Debian root file system of the base, in DIR: debootstrap in private mount and PID
# namespaces (what it mounts in DIR, and what its packages start, cannot outlive it),
# then without what an image needs not: documentation (but copyright files), manuals,
# translations, apt's indexes and caches, logs, device nodes (the runtime makes /dev),
# and the host's resolv.conf and hostname. dpkg is told to leave those out of later
# installs too, as in Debian's slim images.
base_rootfs() {
  local dir=$1
  unshare --mount --pid --fork --mount-proc \
    debootstrap --variant=minbase --include="$BASE_PACKAGES" \
    "$DEBIAN_SUITE" "$dir" "$DEBIAN_MIRROR" >"$dir.log" 2>&1 ||
    { tail -n 20 "$dir.log" >&2; die "debootstrap failed, log: $dir.log"; }
  rm -f "$dir.log"
  cat >"$dir/etc/dpkg/dpkg.cfg.d/rkubelet-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
  find "$dir/usr/share/doc" ! -type d ! -name copyright -delete
  rm -rf "${dir:?}"/usr/share/{man,info,locale}/* "$dir"/var/lib/apt/lists/* \
    "$dir"/var/cache/apt/* "$dir"/var/cache/debconf/*-old "$dir"/var/lib/dpkg/*-old \
    "${dir:?}"/dev/* "$dir"/tmp/* "$dir"/etc/resolv.conf "$dir"/etc/hostname
  find "$dir/var/log" -type f -delete
}

base_recipe() {
  { declare -f base_rootfs; echo "$DEBIAN_SUITE $DEBIAN_MIRROR $BASE_PACKAGES"; } |
    sha256sum | cut -d' ' -f1
}

# Makes $BASE_TARBALL unless it was made by this recipe.
ensure_base_tarball() {
  local recipe=$1
  if [[ -f $BASE_TARBALL && $(cat "$BASE_TARBALL.recipe" 2>/dev/null) == "$recipe" ]]; then
    return 0
  fi
  command -v debootstrap >/dev/null || die "debootstrap is needed (apt-get install debootstrap)"
  log "base: debootstrap $DEBIAN_SUITE minbase + $BASE_PACKAGES from $DEBIAN_MIRROR (minutes)"
  mkdir -p "$(dirname "$BASE_TARBALL")"
  WORK_DIR=$(mktemp -d "$IMAGES_CACHE/rootfs/rkubelet-base.XXXXXX")
  base_rootfs "$WORK_DIR/rootfs"
  tar --create --gzip --file="$BASE_TARBALL.new" --directory="$WORK_DIR/rootfs" \
    --numeric-owner --xattrs --sort=name .
  mv "$BASE_TARBALL.new" "$BASE_TARBALL"
  echo "$recipe" >"$BASE_TARBALL.recipe"
  rm -rf --one-file-system "$WORK_DIR"
  WORK_DIR=""
  log "base: $BASE_TARBALL ($(du -h "$BASE_TARBALL" | cut -f1))"
}

# Makes $BASE_IMAGE in buildah's storage unless it holds one of this recipe.
ensure_base() {
  local recipe have
  recipe=$(base_recipe)
  have=$(buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$RECIPE_LABEL\"}}" \
    "$BASE_IMAGE" 2>/dev/null || true)
  if [[ $have == "$recipe" ]]; then
    log "base: $BASE_IMAGE is up to date"
    return 0
  fi
  ensure_base_tarball "$recipe"
  CONTAINER=$(buildah from --pull=never scratch)
  buildah add --quiet "$CONTAINER" "$BASE_TARBALL" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash --label "$RECIPE_LABEL=$recipe" \
    --created-by "rkubelet scripts/image.sh: Debian $DEBIAN_SUITE minbase + $BASE_PACKAGES" \
    "$CONTAINER"
  buildah commit --quiet --rm "$CONTAINER" "$BASE_IMAGE" >/dev/null
  CONTAINER=""
  log "base: made $BASE_IMAGE from $BASE_TARBALL"
}

# The ID of image NAME in buildah's storage, or nothing.
image_id() { buildah images --quiet --no-trunc "$1" 2>/dev/null || true; }

# The rkubelet binary for the image: RKUBELET_BINARY, or the release build.
binary() {
  if [[ -n ${RKUBELET_BINARY:-} ]]; then
    echo "$RKUBELET_BINARY"
    return 0
  fi
  command -v cargo >/dev/null || die "cargo is needed to build rkubelet (or set RKUBELET_BINARY)"
  log "cargo build --release --bin rkubelet"
  (cd "$RKUBELET_REPO" && nice cargo build --quiet --locked --release --bin rkubelet) >&2
  echo "$RKUBELET_REPO/target/release/rkubelet"
}

cmd_build() {
  local start=$SECONDS bin version image ctx old
  [[ $(id -u) -eq 0 ]] || die "build must run as root (debootstrap, buildah's storage)"
  command -v buildah >/dev/null || die "buildah is needed (apt-get install buildah)"
  umask 022
  # One build at a time: the base is made once, not by two builds at once.
  mkdir -p "$IMAGES_CACHE"
  exec 9>"$IMAGES_CACHE/.image.lock"
  flock 9
  ensure_base
  bin=$(binary)
  [[ -x $bin ]] || die "no rkubelet binary at $bin"
  version=$("$bin" --version)
  image="${RKUBELET_IMAGE:-localhost/rkubelet:${version##*rkubelet-}}"
  # The Dockerfile's context, laid out as the repository.
  WORK_DIR=$(mktemp -d)
  ctx="$WORK_DIR/context"
  install -d "$ctx/target/release" "$ctx/packaging" "$ctx/cni-config"
  strip --strip-all -o "$ctx/target/release/rkubelet" "$bin"
  cp -r "$RKUBELET_REPO/packaging/systemd" "$ctx/packaging/"
  cp "$RKUBELET_REPO/cni-config/10-rkubelet.conflist" "$ctx/cni-config/"
  cp "$RKUBELET_REPO/Dockerfile" "$ctx/"
  old=$(image_id "$image")
  log "image: buildah build --target $TARGET -t $image ($version)"
  buildah build --quiet --pull=never --target "$TARGET" --build-arg "BASE=$BASE_IMAGE" \
    --tag "$image" --file "$ctx/Dockerfile" "$ctx" >/dev/null
  rm -rf --one-file-system "$WORK_DIR"
  WORK_DIR=""
  # The image the name held before, unless it is the same or still named otherwise.
  if [[ -n $old && $old != "$(image_id "$image")" ]]; then buildah rmi "$old" >/dev/null 2>&1 || true; fi
  log "image: $image, $(buildah images --format '{{.Size}}' "$image"), in $((SECONDS - start)) s"
}

# Removes every tag of the image's and the base's repositories.
cmd_clean() {
  local repo=${RKUBELET_IMAGE:-localhost/rkubelet}
  buildah images --format '{{.Name}} {{.Tag}}' |
    awk -v a="${repo%:*}" -v b="${BASE_IMAGE%:*}" '$1 == a || $1 == b { print $1 ":" $2 }' |
    xargs -r buildah rmi >/dev/null
  rm -f "$BASE_TARBALL" "$BASE_TARBALL.recipe"
  log "removed the images and $BASE_TARBALL"
}

case ${1:-} in
  build) cmd_build ;;
  clean) cmd_clean ;;
  *)
    echo "usage: $(basename "$0") build|clean" >&2
    exit 2
    ;;
esac
