# shellcheck shell=bash disable=SC2034  # sourced: the variables are used by the scripts
# Shared settings for rkubelet's scripts. Source it; do not run it.
# Every path the scripts write lives under $RKUBELET_STATE (cluster state, removed by
# `cluster.sh down`) or $RKUBELET_CACHE (slow-to-make artefacts kept across runs:
# the Kubernetes build and the images).

RKUBELET_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RKUBELET_CACHE="${RKUBELET_CACHE:-/var/cache/rkubelet}"
RKUBELET_STATE="${RKUBELET_STATE:-/var/lib/rkubelet-cluster}"

K8S_VERSION="v1.20.2"
K8S_BIN="$RKUBELET_CACHE/kubernetes-$K8S_VERSION/bin"
IMAGES_CACHE="$RKUBELET_CACHE/images"
# The VM node's disk, kernel, initramfs and SSH key (scripts/vm-image.sh).
VM_IMAGE_DIR="$RKUBELET_CACHE/vm-node"
# The name under which the VM image's SSH host key is known (every VM node has it).
VM_HOST_KEY_ALIAS="rkubelet-vm-node"

# Local image registry (Distribution v2, plain HTTP on loopback).
REGISTRY="127.0.0.1:5000"
# A second registry that needs a user name and password (htpasswd, bcrypt): image pull
# secrets are tested against it. Test-only credentials, on loopback only.
PRIVATE_REGISTRY="127.0.0.1:5001"
PRIVATE_REGISTRY_USER="rkubelet-pull"
PRIVATE_REGISTRY_PASSWORD="pull-secret-test"
# The project's own pause image: containerd's sandbox_image.
PAUSE_IMAGE="$REGISTRY/rkubelet/pause:1.0"

# Cluster addressing. Node addresses come from the benchmark range 198.18.0.0/15,
# which exists only on this machine; pods get 10.244.0.0/16, one /24 per node.
CLUSTER_CIDR="10.244.0.0/16"
NODE_CIDR_MASK=24
SERVICE_CIDR="10.96.0.0/16"
NODE_NAME="${RKUBELET_NODE:-rk-node1}"
NODE_IP="198.18.0.1"

CONTAINERD_SOCK="/run/containerd/containerd.sock"
KUBECONFIG_ADMIN="$RKUBELET_STATE/pki/admin.kubeconfig"
# The main job's agents run with kind's node settings (as the kind-style node does): no disk
# eviction and no image garbage collection. A shared developer machine's disk is often more
# than 85-90% full; with the kubelet's defaults (nodefs.available<10%, imagefs.available<15%,
# image GC at 85%) the node would be tainted with DiskPressure and the seed's Deployment
# never scheduled.
# shellcheck disable=SC2034  # used by the scripts that source this file
KIND_AGENT_FLAGS=(--eviction-hard="nodefs.available<0%,nodefs.inodesFree<0%,imagefs.available<0%" --image-gc-high-threshold=100)

log() { printf '[%s %(%H:%M:%S)T] %s\n' "$(basename "$0" .sh)" -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }
# stop_agent: ends the agent this script started in the background (its PID in
# AGENT_PID): SIGTERM, up to 10 s to exit, then SIGKILL.
stop_agent() {
  [[ -n ${AGENT_PID:-} ]] || return 0
  kill -TERM "$AGENT_PID" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$AGENT_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$AGENT_PID" 2>/dev/null || true
  wait "$AGENT_PID" 2>/dev/null || true
  AGENT_PID=""
}

# wait_node_ready NODE SECONDS [HINT]: waits until the Node NODE exists (registered by the
# agent, or left Ready by an earlier one) and is Ready (`kubectl wait` fails at once on a
# Node that does not exist yet); HINT is added to the error.
wait_node_ready() {
  local node=$1 deadline=$((SECONDS + $2))
  until kubectl get "node/$node" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "node $node did not register within $2 s${3:+ ($3)}"
    sleep 0.2
  done
  kubectl wait --for=condition=Ready "node/$node" --timeout="$(( deadline > SECONDS ? deadline - SECONDS : 1 ))s" >/dev/null
}

# Debian's podman drops its default network, 87-podman-bridge.conflist, into
# /etc/cni/net.d when it is installed. cni_dirs: what of /etc/cni and /etc/cni/net.d is
# there now; restore_cni_dir BEFORE: removes podman's conflist (a deleted conffile stays
# deleted on upgrades; the scripts run podman with a network config dir of their own) and
# the two dirs if they were not there BEFORE and are empty.
cni_dirs() { find /etc/cni /etc/cni/net.d -maxdepth 0 2>/dev/null || true; }
restore_cni_dir() {
  local before=$1 d
  if [[ -f /etc/cni/net.d/87-podman-bridge.conflist ]]; then
    log "removing podman's /etc/cni/net.d/87-podman-bridge.conflist"
    rm -f /etc/cni/net.d/87-podman-bridge.conflist
  fi
  for d in /etc/cni/net.d /etc/cni; do
    if ! grep -qxF "$d" <<<"$before" && [[ -d $d && -z $(ls -A "$d") ]]; then rmdir "$d"; fi
  done
}
