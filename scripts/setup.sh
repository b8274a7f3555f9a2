#!/usr/bin/env bash
# Prepare a fresh Debian 12 machine (as root) for rkubelet's local cluster and tests:
#   - installs every Debian package the cluster, images and tests need;
#   - builds kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy
#     and kubectl v1.20.2 from Debian's `kubernetes` source package, cached under
#     $RKUBELET_CACHE so a second run skips the build (and a cache missing some of them
#     builds only those). The cached kubectl is what a 1.20 cluster's user runs (the tests
#     use it for `kubectl alpha debug`, which the machine's newer kubectl cannot do against
#     a 1.20 server); it is not put on PATH: the scripts keep the machine's kubectl.
# Idempotent: safe to run again; it only does what is missing.
set -euo pipefail

CACHE="${RKUBELET_CACHE:-/var/cache/rkubelet}"
K8S_VERSION="v1.20.2"
K8S_BIN="$CACHE/kubernetes-$K8S_VERSION/bin"
K8S_TOOLS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)

PACKAGES=(
  containerd runc containernetworking-plugins etcd-server
  golang-go rsync dpkg-dev
  # reflect2 1.0.2 replaces the tree's vendored 1.0.1 for Go 1.19 (kubernetes-build.sh)
  golang-github-modern-go-reflect2-dev
  docker-registry busybox-static skopeo debootstrap buildah systemd
  protobuf-compiler libprotobuf-dev iptables iproute2 openssl jq curl ca-certificates
  apache2-utils nftables shellcheck conntrack podman gcc libc6-dev qemu-system-x86 openssh-client
  # The monitoring stack's client (tests/prometheus.rs): Debian's Prometheus 2.42, run on
  # loopback by the test only (--no-install-recommends: no node exporter, no service).
  prometheus
)

# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# shellcheck source=scripts/kubernetes-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/kubernetes-build.sh"
log() { printf '[setup %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

[[ $(id -u) -eq 0 ]] || { echo "setup.sh must run as root" >&2; exit 1; }

ensure_deb_src() {
  local f=/etc/apt/sources.list.d/rkubelet-deb-src.sources
  [[ -f $f ]] && return 0
  log "adding a deb-src entry for bookworm main"
  cat >"$f" <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  APT_UPDATED=0
}

APT_UPDATED=0
apt_update_once() {
  if [[ $APT_UPDATED -eq 0 ]]; then
    log "apt-get update"
    apt-get update -qq
    APT_UPDATED=1
  fi
}

install_packages() {
  local missing=() cni_dirs_before
  # Installing podman drops its default network into /etc/cni/net.d: what that dir (and
  # /etc/cni) held before is what it holds after (common.sh).
  cni_dirs_before=$(cni_dirs)
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    apt_update_once
    log "installing: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if [[ " ${missing[*]} " == *" podman "* ]]; then restore_cni_dir "$cni_dirs_before"; fi
  fi
  # The Debian packages start services we do not want: the project runs its own
  # containerd and registry with their own configs and state. Stop and disable them.
  for unit in containerd docker-registry etcd; do
    if systemctl is-active --quiet "$unit" 2>/dev/null; then
      systemctl stop "$unit" || true
    fi
    systemctl disable "$unit" >/dev/null 2>&1 || true
  done
}

build_kubernetes() {
  local missing=() t
  for t in "${K8S_TOOLS[@]}"; do [[ -x $K8S_BIN/$t ]] || missing+=("$t"); done
  if [[ ${#missing[@]} -eq 0 ]]; then
    log "Kubernetes $K8S_VERSION binaries cached in $K8S_BIN: skipping the build"
    return 0
  fi
  # The source package is kept in $K8S_SOURCE_DIR (conformance.sh builds more from it).
  if ! compgen -G "$K8S_SOURCE_DIR/kubernetes_*.dsc" >/dev/null; then
    ensure_deb_src
    apt_update_once
  fi
  k8s_build "$K8S_BIN" "${missing[@]/#/cmd/}"
  # kubectl has no --version flag: it reports its version with `version --client`.
  if [[ ${missing[0]} == kubectl ]]; then
    "$K8S_BIN/kubectl" version --client --short >&2
  else
    "$K8S_BIN/${missing[0]}" --version >&2
  fi
}

install_packages
build_kubernetes
log "done"
