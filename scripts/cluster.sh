#!/usr/bin/env bash
# A real local Kubernetes v1.20.2 control plane for rkubelet, on loopback:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, a local image
# registry (and a private one, with htpasswd authentication) and containerd (CRI), plus a node address on a veth pair and an
# iptables chain that keeps pod traffic on this machine.
#
#   cluster.sh up [--nodes N]      start everything (idempotent-ish); N > 1: add-nodes N too
#   cluster.sh add-nodes N         N nodes rk-host1..N, each its own netns "host" on the
#                                  underlay bridge, with its own containerd and kube-proxy
#   cluster.sh start-agents [--agent rkubelet|kubelet] [--pod-network-routes none|host-gw|vxlan] [--binary PATH]
#                                  an rkubelet (or the real kubelet) on every added node
#                                  (by recorded PID)
#   cluster.sh pod-routes [--between-nodes]  routes here to the nodes' pod CIDRs and the
#                                  Service range (the control plane reaches webhooks);
#                                  --between-nodes: host-gw routes for agents without them
#   cluster.sh stop-agent NODE     stop one added node's agent
#   cluster.sh remove-nodes        remove the added nodes and all they hold
#   cluster.sh add-kind-node NAME [--cgroup-driver cgroupfs|systemd] [--binary PATH] [--image IMAGE]
#                                  a kind-style node: a podman container booting systemd,
#                                  containerd and rkubelet (the kind node image), in its own
#                                  netns on the underlay, joined by bootstrap token (Ready)
#   cluster.sh kind-exec NAME CMD...  a command inside a kind-style node (podman exec, as the
#                                  scripts run podman); kind-pid NAME: its PID 1 on the host
#   cluster.sh remove-kind-node NAME   remove it, its container, cgroups, netns and link
#   cluster.sh add-vm-node NAME [--cgroup-driver cgroupfs|systemd] [--binary PATH]
#                                  a VM node: a Debian 12 virtual machine (qemu, cgroup v2)
#                                  booting systemd, containerd and rkubelet, on a tap of the
#                                  underlay, joined by bootstrap token (Ready)
#   cluster.sh vm-exec NAME CMD...  a command inside a VM node (as root, over SSH)
#   cluster.sh remove-vm-node NAME  remove it: its qemu, SSH connection, tap and disk
#   cluster.sh down                stop and remove everything `up` made
#   cluster.sh status              show components; non-zero if any is dead
#   cluster.sh node-credentials N  mint a node identity (cert + kubeconfig) for N
#   cluster.sh bootstrap-token     (re)apply kubeadm's bootstrap token and RBAC bindings and
#                                  write $RKUBELET_STATE/pki/bootstrap-kubelet.kubeconfig
#   cluster.sh leak-check          after `down`: list what of the cluster survived; non-zero if any
#   cluster.sh check-ranges        what `up` checks first: no route, address or iptables rule
#                                  of someone else captures the pod, Service or node ranges
#   cluster.sh kill|stop|start C   fault drills: SIGKILL / SIGTERM / start again (and wait until it
#                                  serves) containerd or kube-apiserver, by recorded PID
#
# Each job is one file under scripts/cluster/, which this file sources and dispatches to:
#   lib.sh (state layout, processes by recorded PID, chains, netns, mounts, cgroups),
#   pki.sh (certificates, kubeconfigs, bootstrap token), containerd.sh (a containerd's
#   config, start and removal), control-plane.sh (up, down, status, drills), nodes.sh
#   (network-namespace nodes), kubeadm.sh (the files `kubeadm join` writes), kind-node.sh
#   (kind-style nodes), vm-node.sh (VM nodes), leaks.sh (leak check).
#
# Everything lives under $RKUBELET_STATE; `down` removes exactly what `up`
# created (processes by recorded PID, links, netns, iptables rules, sysctls).
set -euo pipefail

# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# shellcheck source=scripts/cluster/lib.sh
source "$RKUBELET_REPO/scripts/cluster/lib.sh"
# shellcheck source=scripts/cluster/pki.sh
source "$RKUBELET_REPO/scripts/cluster/pki.sh"
# shellcheck source=scripts/cluster/containerd.sh
source "$RKUBELET_REPO/scripts/cluster/containerd.sh"
# shellcheck source=scripts/cluster/control-plane.sh
source "$RKUBELET_REPO/scripts/cluster/control-plane.sh"
# shellcheck source=scripts/cluster/nodes.sh
source "$RKUBELET_REPO/scripts/cluster/nodes.sh"
# shellcheck source=scripts/cluster/kubeadm.sh
source "$RKUBELET_REPO/scripts/cluster/kubeadm.sh"
# shellcheck source=scripts/cluster/kind-node.sh
source "$RKUBELET_REPO/scripts/cluster/kind-node.sh"
# shellcheck source=scripts/cluster/vm-node.sh
source "$RKUBELET_REPO/scripts/cluster/vm-node.sh"
# shellcheck source=scripts/cluster/leaks.sh
source "$RKUBELET_REPO/scripts/cluster/leaks.sh"

# ---------------------------------------------------------------- main

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  add-nodes) cmd_add_nodes "${2:-}" ;;
  remove-nodes) need_root; remove_hosts ;;
  add-kind-node) shift; cmd_add_kind_node "$@" ;;
  remove-kind-node) cmd_remove_kind_node "${2:-}" ;;
  add-vm-node) shift; cmd_add_vm_node "$@" ;;
  remove-vm-node) cmd_remove_vm_node "${2:-}" ;;
  vm-exec) shift; cmd_vm_exec "$@" ;;
  kind-pid)
    need_root
    [[ -n ${2:-} ]] || die "usage: $0 kind-pid NAME"
    podman_ inspect --format '{{.State.Pid}}' "$2"
    ;;
  kind-exec)
    need_root
    [[ -n ${2:-} && -n ${3:-} ]] || die "usage: $0 kind-exec NAME COMMAND [ARG...]"
    shift
    podman_ exec "$@"
    ;;
  start-agents) shift; cmd_start_agents "$@" ;;
  stop-agent) cmd_stop_agent "${2:-}" ;;
  pod-routes) cmd_pod_routes "${2:-}" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  leak-check) cmd_leak_check ;;
  check-ranges) need_root; check_ranges_free; log "pod, Service and node ranges are free" ;;
  kill) cmd_kill "${2:-}" ;;
  stop) cmd_stop "${2:-}" ;;
  start) cmd_start "${2:-}" ;;
  bootstrap-token) need_root; bootstrap_token ;;
  node-credentials)
    need_root
    [[ -n ${2:-} ]] || die "usage: $0 node-credentials NAME [IP]"
    node_credentials "$2" "${3:-}"
    ;;
  start-agent)
    # start-agent BINARY ARGS...: run an agent on this cluster, recorded like a component
    # so that `down` stops it (first). Its log is logs/rkubelet.log.
    need_root
    [[ -x ${2:-} ]] || die "usage: $0 start-agent BINARY [ARGS...]"
    comp_pid rkubelet >/dev/null && die "an agent already runs (pid $(comp_pid rkubelet))"
    shift
    start_proc rkubelet "$@"
    ;;
  *)
    echo "usage: $0 {up [--nodes N]|down|status|leak-check|node-credentials NAME [IP]|bootstrap-token|start-agent BINARY [ARGS...]|kill|stop|start COMPONENT|add-nodes N|remove-nodes|add-kind-node NAME [...]|remove-kind-node NAME|add-vm-node NAME [...]|vm-exec NAME CMD...|remove-vm-node NAME|start-agents [--agent rkubelet|kubelet] [--pod-network-routes MODE] [--binary PATH]|pod-routes [--between-nodes]|stop-agent NODE}" >&2
    exit 2
    ;;
esac
