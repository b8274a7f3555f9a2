#!/usr/bin/env bash
# Builds rkubelet's container images with buildah from the project's Dockerfile, on bases
# made here: nothing is pulled from a registry (none on the internet is reachable).
#
#   image.sh build             the base (once; cached) and the image $RKUBELET_IMAGE
#   image.sh build-kind-node   the kind node base (once; cached) and the kind-style node
#                              image $RKUBELET_KIND_IMAGE: the Dockerfile's `node` stage on it
#   image.sh build-vm-node     the VM node's disk, kernel and initramfs (once; cached under
#                              $VM_IMAGE_DIR; scripts/vm-image.sh)
#   image.sh clean             removes the images from buildah's storage and the cached bases
#
# Two bases, two recipes, each Debian bookworm minbase made by debootstrap from the Debian
# mirror, its root file system cached as a tarball (the mirror is used once; the image is
# made again from the tarball if buildah's storage lost it), both carrying the hash of
# their recipe and remade when it changes:
#   rkubelet-base       systemd, iptables and the CNI plugins (a kind node's userland,
#                       without its container runtime): the agent image stays lean.
#   rkubelet-kind-base  a kind-style node: systemd as PID 1, dbus, containerd + runc, the
#                       CNI plugins, iptables, iproute2, conntrack, and the files of
#                       packaging/kind-node/ (containerd configured as kind configures it).
# A third root file system, made the same way, is no container image but a VM's disk
# (scripts/vm-image.sh): rkubelet-vm-base, the kind node's packages plus a kernel, an
# initramfs and an SSH server.
#
# The image's rkubelet: target/release/rkubelet, built first by cargo (a no-op when it is
# up to date), or RKUBELET_BINARY (e.g. a test's binary), stripped. Only the files the
# Dockerfile copies go into the build context, which mirrors the repository's layout.
#
# Environment: RKUBELET_IMAGE (default localhost/rkubelet:<version>), RKUBELET_BINARY,
# RKUBELET_TARGET (the Dockerfile stage: `agent`, the default, or `node`),
# RKUBELET_KIND_IMAGE (default localhost/rkubelet-kind-node:<version>).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DEBIAN_SUITE="bookworm"
DEBIAN_MIRROR="${RKUBELET_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
RECIPE_LABEL="org.rkubelet.base-recipe"
TARGET="${RKUBELET_TARGET:-agent}"
KIND_FILES="$RKUBELET_REPO/packaging/kind-node"

# use_base agent|kind: the base the next steps make or use (BASE_NAME, BASE_PACKAGES,
# BASE_IMAGE, BASE_TARBALL, BASE_FILES: a tree copied over the root file system, if any).
use_base() {
  case $1 in
    agent)
      BASE_NAME="rkubelet-base"
      BASE_PACKAGES="systemd,iptables,containernetworking-plugins"
      BASE_FILES=""
      ;;
    kind)
      BASE_NAME="rkubelet-kind-base"
      BASE_PACKAGES="systemd,systemd-sysv,dbus,containerd,runc,containernetworking-plugins,iptables,iproute2,conntrack,procps,kmod"
      BASE_FILES="$KIND_FILES"
      ;;
    vm)
      BASE_NAME="rkubelet-vm-base"
      BASE_PACKAGES="systemd,systemd-sysv,udev,dbus,containerd,runc,containernetworking-plugins,iptables,iproute2,conntrack,procps,kmod,linux-image-cloud-amd64,initramfs-tools,openssh-server,curl"
      BASE_FILES="$KIND_FILES"
      ;;
  esac
  BASE_IMAGE="localhost/$BASE_NAME:$DEBIAN_SUITE"
  BASE_TARBALL="$IMAGES_CACHE/rootfs/$BASE_NAME.tar.gz"
}
use_base agent
# Every build step runs in a plain chroot: we are root, no user namespaces are needed.
export BUILDAH_ISOLATION=chroot
# buildah sets up its network library (CNI) for `from`, `run` and `build` even when no
# step uses a network, and would make /etc/cni/net.d (a lock file in it) on a machine
# without one: it gets a directory of its own.
BUILDAH_CNI=(--cni-config-dir "$IMAGES_CACHE/buildah-cni")
# `buildah inspect` does too and takes no such flag: buildah's containers.conf (ours, for
# every buildah command of the project) names the same directory.
mkdir -p "$IMAGES_CACHE"
printf '[network]\nnetwork_config_dir = "%s"\n' "$IMAGES_CACHE/buildah-cni" >"$IMAGES_CACHE/containers.conf"
export CONTAINERS_CONF="$IMAGES_CACHE/containers.conf"

# Set while a step holds something that must not outlive the script.
OLD_BASE=""
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

# The recipe of the base image: the tarball's, and the files and steps laid over it.
image_recipe() {
  local recipe=$1
  [[ -n $BASE_FILES ]] || { echo "$recipe"; return 0; }
  { echo "$recipe"; declare -f kind_base_steps
    tar --create --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
      --directory="$BASE_FILES" . | sha256sum; } | sha256sum | cut -d' ' -f1
}

# What makes a Debian root file system a kind-style node, run in the base's working
# container CONTAINER (BASE_FILES are copied in first):
# - the CNI plugins also at /opt/cni/bin, where a kind node (and containerd's default)
#   has them;
# - containerd started by systemd at boot (Debian's package enables it; once more here);
# - no units that have nothing to do in a container: getty on a console nobody reads,
#   udev, and the units that would change the host's kernel settings or clock;
# - systemd's own default target is multi-user (no graphical target in a node);
# - no machine ID: systemd makes one at each node's first boot (nodes must differ).
kind_base_steps() {
  local c=$1
  buildah run "${BUILDAH_CNI[@]}" --network none "$c" -- sh -ec '
    mkdir -p /opt/cni
    ln -sfn /usr/lib/cni /opt/cni/bin
    systemctl enable containerd.service
    systemctl mask getty.target console-getty.service systemd-udevd.service \
      systemd-udev-trigger.service systemd-modules-load.service systemd-sysctl.service \
      systemd-timesyncd.service systemd-firstboot.service kmod-static-nodes.service
    systemctl mask e2scrub_reap.service
    systemctl set-default multi-user.target
    : >/etc/machine-id
  ' >/dev/null 2>&1
}

# Makes $BASE_TARBALL unless it was made by this recipe.
ensure_base_tarball() {
  local recipe=$1
  if [[ -f $BASE_TARBALL && $(cat "$BASE_TARBALL.recipe" 2>/dev/null) == "$recipe" ]]; then
    return 0
  fi
  command -v debootstrap >/dev/null || die "debootstrap is needed (apt-get install debootstrap)"
  log "base $BASE_NAME: debootstrap $DEBIAN_SUITE minbase + $BASE_PACKAGES from $DEBIAN_MIRROR (minutes)"
  mkdir -p "$(dirname "$BASE_TARBALL")"
  WORK_DIR=$(mktemp -d "$IMAGES_CACHE/rootfs/$BASE_NAME.XXXXXX")
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
  local recipe have tarball_recipe
  tarball_recipe=$(base_recipe)
  recipe=$(image_recipe "$tarball_recipe")
  have=$(buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$RECIPE_LABEL\"}}" \
    "$BASE_IMAGE" 2>/dev/null || true)
  if [[ $have == "$recipe" ]]; then
    log "base: $BASE_IMAGE is up to date"
    return 0
  fi
  ensure_base_tarball "$tarball_recipe"
  OLD_BASE=$(image_id "$BASE_IMAGE")
  CONTAINER=$(buildah from "${BUILDAH_CNI[@]}" --pull=never scratch)
  buildah add --quiet "$CONTAINER" "$BASE_TARBALL" / >/dev/null
  if [[ -n $BASE_FILES ]]; then
    buildah copy --quiet "$CONTAINER" "$BASE_FILES" / >/dev/null
    kind_base_steps "$CONTAINER" || die "the kind node base's set-up steps failed"
  fi
  # A kind-style node boots systemd (SIGRTMIN+3 is its clean halt); the agent's base is a
  # shell.
  local config=(--cmd /bin/bash)
  [[ -z $BASE_FILES ]] || config=(--cmd /sbin/init --stop-signal SIGRTMIN+3)
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    "${config[@]}" --label "$RECIPE_LABEL=$recipe" \
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

# cmd_build [kind]: the agent image (TARGET of the Dockerfile on the agent's base), or with
# `kind` the kind-style node image (its `node` stage on the kind node base).
cmd_build() {
  local start=$SECONDS bin version image ctx old lock=.image.lock
  [[ $(id -u) -eq 0 ]] || die "build must run as root (debootstrap, buildah's storage)"
  command -v buildah >/dev/null || die "buildah is needed (apt-get install buildah)"
  umask 022
  if [[ ${1:-} == kind ]]; then
    use_base kind
    TARGET=node
    lock=.kind-image.lock
  fi
  # One build of a base at a time: the base is made once, not by two builds at once.
  mkdir -p "$IMAGES_CACHE/buildah-cni"
  exec 9>"$IMAGES_CACHE/$lock"
  flock 9
  ensure_base
  bin=$(binary)
  [[ -x $bin ]] || die "no rkubelet binary at $bin"
  version=$("$bin" --version)
  if [[ ${1:-} == kind ]]; then
    image="${RKUBELET_KIND_IMAGE:-localhost/rkubelet-kind-node:${version##*rkubelet-}}"
  else
    image="${RKUBELET_IMAGE:-localhost/rkubelet:${version##*rkubelet-}}"
  fi
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
  buildah build "${BUILDAH_CNI[@]}" --network none --quiet --pull=never --target "$TARGET" --build-arg "BASE=$BASE_IMAGE" \
    --tag "$image" --file "$ctx/Dockerfile" "$ctx" >/dev/null
  # The kind-style node also holds the kubelet v1.20.2 that setup.sh builds, not started:
  # /usr/bin/kubelet, where a kind node has it, so that the node can be handed from one
  # agent to the other (docs/packaging.md, tests/kind_node.rs).
  if [[ ${1:-} == kind && -x $K8S_BIN/kubelet ]]; then
    local without
    without=$(image_id "$image")
    CONTAINER=$(buildah from "${BUILDAH_CNI[@]}" --pull=never "$image")
    buildah copy --quiet "$CONTAINER" "$K8S_BIN/kubelet" /usr/bin/kubelet >/dev/null
    buildah commit --quiet --rm "$CONTAINER" "$image" >/dev/null
    CONTAINER=""
    buildah rmi "$without" >/dev/null 2>&1 || true
  fi
  rm -rf --one-file-system "$WORK_DIR"
  WORK_DIR=""
  # The image the name held before, unless it is the same or still named otherwise.
  if [[ -n $old && $old != "$(image_id "$image")" ]]; then buildah rmi "$old" >/dev/null 2>&1 || true; fi
  # The base this build replaced, once no image of it is left.
  if [[ -n $OLD_BASE ]]; then buildah rmi "$OLD_BASE" >/dev/null 2>&1 || true; fi
  log "image: $image, $(buildah images --format '{{.Size}}' "$image"), in $((SECONDS - start)) s"
}

# Removes every tag of the images' and the bases' repositories, the cached bases and the
# VM node image.
cmd_clean() {
  local repo=${RKUBELET_IMAGE:-localhost/rkubelet} kind=${RKUBELET_KIND_IMAGE:-localhost/rkubelet-kind-node} b
  for b in agent kind; do
    use_base "$b"
    buildah images --format '{{.Name}} {{.Tag}}' |
      awk -v a="${repo%:*}" -v k="${kind%:*}" -v b="${BASE_IMAGE%:*}" \
        '$1 == a || $1 == k || $1 == b { print $1 ":" $2 }' |
      xargs -r buildah rmi >/dev/null
    rm -f "$BASE_TARBALL" "$BASE_TARBALL.recipe"
    log "removed the images and $BASE_TARBALL"
  done
  # shellcheck source=scripts/vm-image.sh
  source "$RKUBELET_REPO/scripts/vm-image.sh"
  cmd_clean_vm
}

case ${1:-} in
  build) cmd_build ;;
  build-kind-node) cmd_build kind ;;
  build-vm-node)
    # shellcheck source=scripts/vm-image.sh
    source "$RKUBELET_REPO/scripts/vm-image.sh"
    cmd_build_vm
    ;;
  clean) cmd_clean ;;
  *)
    echo "usage: $(basename "$0") build|build-kind-node|build-vm-node|clean" >&2
    exit 2
    ;;
esac
