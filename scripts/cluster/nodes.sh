# shellcheck shell=bash disable=SC2034  # sourced: use_host sets what containerd.sh reads
# Nodes as hosts (`add-nodes`, `start-agents`, `stop-agent`, `remove-nodes`): each node a
# network namespace on the underlay bridge with its own containerd, kube-proxy and
# rkubelet (or the real kubelet), and routes to them (`pod-routes`). Sourced by
# scripts/cluster.sh.

# `add-nodes N`: N nodes rk-host1..N, each its own "host": a network namespace whose eth0
# is a port of the underlay bridge $NODE_LINK (198.18.0.11, .12, ... /24), with its own
# containerd (root, state, socket under hosts/<node>), its own kube-proxy (iptables mode)
# and, from `start-agents`, its own rkubelet with its own node identity, pod bridge, pod
# CIDR and cgroup root. The control plane stays here and answers the nodes at $NODE_IP:
# the API server and the registries, DNATed to loopback ($HOSTS_CHAIN).
HOSTS_DIR="$RKUBELET_STATE/hosts"
HOST_PREFIX="rk-host"
HOSTS_CHAIN="RKUBELET-HOSTS"
HOST_SERVER="https://$NODE_IP:6443"
HOST_PORTS="6443,${REGISTRY##*:},${PRIVATE_REGISTRY##*:}"

host_ip() { echo "198.18.0.$((10 + ${1#"$HOST_PREFIX"}))"; }
host_names() { [[ -f $REC/hosts ]] && cat "$REC/hosts"; return 0; }

# use_host NODE: point the containerd and CNI variables at NODE's own (a subshell's globals).
use_host() {
  HOST_DIR="$HOSTS_DIR/$1"
  CTRD_COMP="containerd@$1"
  CTRD="$HOST_DIR/containerd"
  CONTAINERD_SOCK="$HOST_DIR/containerd.sock"
  CNI_BIN="$HOST_DIR/cni/bin"
  CNI_CONF="$HOST_DIR/cni/net.d"
  CNI_TEMPLATE="$HOST_DIR/cni/containerd-bridge.conflist.template"
  REGISTRY_VIA="$NODE_IP:${REGISTRY##*:}"
  PRIVATE_REGISTRY_VIA="$NODE_IP:${PRIVATE_REGISTRY##*:}"
}

# The API server and the registries, for the nodes' namespaces: their traffic to
# $NODE_IP:{6443,5000,5001} arriving on the underlay bridge goes to loopback (which needs
# route_localnet on that bridge; the bridge and its setting go with `down`).
setup_host_dnat() {
  iptables -w 5 -t nat -S "$HOSTS_CHAIN" >/dev/null 2>&1 && return 0
  sysctl -qw "net.ipv4.conf.$NODE_LINK.route_localnet=1"
  ipt_restore <<EOF
*nat
:$HOSTS_CHAIN - [0:0]
-A $HOSTS_CHAIN -d $NODE_IP/32 -p tcp -m multiport --dports $HOST_PORTS -j DNAT --to-destination 127.0.0.1
-I PREROUTING 1 -i $NODE_LINK -j $HOSTS_CHAIN
COMMIT
EOF
}

# add_host NODE: its namespace, link, sysctls, credentials, containerd and kube-proxy.
add_host() {
  local h=$1 ip
  ip=$(host_ip "$h")
  use_host "$h"
  log "node $h: netns $h, $ip/24 on $NODE_LINK"
  mkdir -p "$HOST_DIR/cni/networks" "$HOST_DIR/agent-cni"
  echo "$h" >>"$REC/hosts"
  ip netns add "$h"
  ip link add "$h" type veth peer name eth0 netns "$h"
  ip link set "$h" master "$NODE_LINK" up
  ip -n "$h" addr add "$ip/24" dev eth0
  ip -n "$h" link set lo up
  ip -n "$h" link set eth0 up
  # Service addresses are on-link here, so that the node's own connections to them reach
  # kube-proxy's DNAT (a node has a default route; this one has none: nothing leaves).
  ip -n "$h" route add "$SERVICE_CIDR" dev eth0
  ip netns exec "$h" sysctl -qw net.ipv4.ip_forward=1
  # Pods reach the control plane (the `kubernetes` Service, DNATed to loopback there) from
  # the node's address: the control plane has no route to this node's pods.
  ip netns exec "$h" iptables -w 5 -t nat -A POSTROUTING -s "$CLUSTER_CIDR" -d "$NODE_IP/32" -j MASQUERADE
  # The node's CNI configs keep their IP reservations under its own dir.
  mkdir -p "$(dirname "$CNI_TEMPLATE")"
  jq --arg d "$HOST_DIR/cni/networks" '.plugins[0].ipam.dataDir = $d' \
    "$RKUBELET_REPO/cni-config/10-rkubelet.conflist" >"$HOST_DIR/agent-cni/10-rkubelet.conflist"
  sed "s|\"type\": \"host-local\",|\"type\": \"host-local\", \"dataDir\": \"$HOST_DIR/cni/networks\",|" \
    "$RKUBELET_REPO/cni-config/containerd-bridge.conflist.template" >"$CNI_TEMPLATE"
  node_credentials "$h" "$ip"
  kubeconfig "$HOST_DIR/kubelet.kubeconfig" "system:node:$h" "node-$h" "$HOST_SERVER"
  kubeconfig "$HOST_DIR/kube-proxy.kubeconfig" system:kube-proxy kube-proxy "$HOST_SERVER"
  write_containerd_config
  IN_NETNS=$h start_proc "containerd@$h" /usr/bin/containerd --config "$CTRD/config.toml"
  IN_NETNS=$h start_proc "kube-proxy@$h" "$K8S_BIN/kube-proxy" \
    --kubeconfig="$HOST_DIR/kube-proxy.kubeconfig" --hostname-override="$h" \
    --proxy-mode=iptables --cluster-cidr="$CLUSTER_CIDR" --bind-address="$ip" \
    --metrics-bind-address=127.0.0.1:10249 --healthz-bind-address=127.0.0.1:10256 \
    --oom-score-adj=0 --conntrack-max-per-core=0 \
    --conntrack-tcp-timeout-established=0 --conntrack-tcp-timeout-close-wait=0
}

cmd_add_nodes() {
  need_root
  local n=${1:-} i h
  if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > 20)); then die "usage: $0 add-nodes N (1..20)"; fi
  [[ -x $K8S_BIN/kube-proxy ]] || die "missing $K8S_BIN/kube-proxy: run scripts/setup.sh"
  comp_pid kube-apiserver >/dev/null || die "the cluster is not up: run 'cluster.sh up'"
  [[ -z $(host_names) ]] || die "nodes already added ($(host_names | tr '\n' ' ')): run 'cluster.sh remove-nodes' first"
  [[ -f $PKI/kube-proxy.crt ]] || issue kube-proxy "/CN=system:kube-proxy" client
  setup_host_dnat
  for ((i = 1; i <= n; i++)); do (add_host "$HOST_PREFIX$i"); done
  for h in $(host_names); do
    (use_host "$h"; wait_for "containerd of $h" 60 "containerd@$h" ctr_ version)
  done
  log "$n nodes added: $(host_names | tr '\n' ' ')(start their agents with 'cluster.sh start-agents')"
}

# start-agents [--agent rkubelet|kubelet] [--pod-network-routes MODE] [--network-owner OWNER]
# [--binary PATH] [-- ARGS]: an agent on every added node that has none running: rkubelet
# (pod networking agent-owned unless said otherwise), or the real kubelet (start_kubelet).
cmd_start_agents() {
  need_root
  local agent=rkubelet routes=() owner=agent bin="$RKUBELET_REPO/target/debug/rkubelet" extra=() h
  while [[ $# -gt 0 ]]; do
    case $1 in
      --agent) agent=$2; shift 2 ;;
      --pod-network-routes) routes=(--pod-network-routes "$2"); shift 2 ;;
      --network-owner) owner=$2; shift 2 ;;
      --binary) bin=$2; shift 2 ;;
      --) shift; extra=("$@"); break ;;
      *) die "usage: $0 start-agents [--agent rkubelet|kubelet] [--pod-network-routes none|host-gw|vxlan] [--network-owner agent|runtime] [--binary PATH] [-- ARGS]" ;;
    esac
  done
  [[ -n $(host_names) ]] || die "no nodes: run 'cluster.sh add-nodes N' first"
  case $agent in
    rkubelet) [[ -x $bin ]] || die "no agent binary $bin (cargo build)" ;;
    kubelet)
      [[ -x $K8S_BIN/kubelet ]] || die "missing $K8S_BIN/kubelet: run scripts/setup.sh"
      [[ ${#routes[@]} -eq 0 ]] || die "the kubelet programs no routes between nodes: run 'cluster.sh pod-routes --between-nodes' once its Nodes have pod CIDRs"
      ;;
    *) die "unknown agent $agent (rkubelet or kubelet)" ;;
  esac
  for h in $(host_names); do
    if comp_pid "rkubelet@$h" >/dev/null || comp_pid "kubelet@$h" >/dev/null; then continue; fi
    if [[ $agent == kubelet ]]; then
      (start_kubelet "$h" "${extra[@]}")
      continue
    fi
    (
      use_host "$h"
      IN_NETNS=$h start_proc "rkubelet@$h" "$bin" run \
        --kubeconfig "$HOST_DIR/kubelet.kubeconfig" --hostname-override "$h" --node-ip "$(host_ip "$h")" \
        --node-labels "rkubelet.io/host=true" \
        --container-runtime-endpoint "unix://$CONTAINERD_SOCK" \
        --root-dir "$HOST_DIR/rkubelet" --pod-logs-dir "$HOST_DIR/rkubelet/logs" \
        --cgroup-root "/$h" --network-owner "$owner" \
        --cni-conf-dir "$HOST_DIR/agent-cni" --cni-bin-dir /usr/lib/cni \
        --runtime-cni-conf-dir "$CNI_CONF" --runtime-cni-bin-dir "$CNI_BIN" \
        --resolv-conf "" "${routes[@]}" \
        --address "$(host_ip "$h")" --client-ca-file "$PKI/ca.crt" \
        --tls-cert-file "$PKI/node-$h-serving.crt" --tls-private-key-file "$PKI/node-$h-serving.key" \
        "${extra[@]}"
    )
  done
}

# What the real kubelet changes on the machine whatever its flags: the kernel's panic and
# overcommit sysctls (not per network namespace), and the pod log dirs /var/log/pods and
# /var/log/containers (and /var/lib/kubelet, for its device plugins), which no flag moves.
KUBELET_SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops)
KUBELET_DIRS=(/var/log/pods /var/log/containers /var/lib/kubelet)

# start_kubelet NODE [ARGS]: the real kubelet v1.20.2 in NODE's namespace, as the benchmark
# runs it (cgroupfs, no QoS cgroups, no eviction), against the node's containerd, which
# renders its CNI config from the Node's pod CIDR (runtime-owned pod networking); the
# kubelet's API on the node's address with the cluster's serving certificate. What it will
# change on the machine is noted first (restore_kubelet_changes puts it back).
start_kubelet() {
  local h=$1 s d
  shift
  use_host "$h"
  if [[ ! -f $REC/kubelet-changes ]]; then
    {
      for s in "${KUBELET_SYSCTLS[@]}"; do echo "sysctl $s=$(sysctl -n "$s")"; done
      for d in "${KUBELET_DIRS[@]}"; do [[ -e $d ]] || echo "dir $d"; done
    } >"$REC/kubelet-changes"
  fi
  IN_NETNS=$h start_proc "kubelet@$h" "$K8S_BIN/kubelet" --kubeconfig "$HOST_DIR/kubelet.kubeconfig" \
    --hostname-override "$h" --node-ip "$(host_ip "$h")" --root-dir "$HOST_DIR/kubelet" \
    --node-labels=rkubelet.io/host=true \
    --container-runtime=remote --container-runtime-endpoint="unix://$CONTAINERD_SOCK" \
    --cgroup-driver=cgroupfs --cgroups-per-qos=false --enforce-node-allocatable= --fail-swap-on=false \
    --eviction-hard= --image-gc-high-threshold=100 --resolv-conf= --read-only-port=0 \
    --address="$(host_ip "$h")" --anonymous-auth=false --client-ca-file="$PKI/ca.crt" \
    --tls-cert-file="$PKI/node-$h-serving.crt" --tls-private-key-file="$PKI/node-$h-serving.key" "$@"
}

# restore_kubelet_changes: the sysctls as they were, the dirs the kubelets made removed.
restore_kubelet_changes() {
  [[ -f $REC/kubelet-changes ]] || return 0
  local kind what
  while read -r kind what; do
    case $kind in
      sysctl) sysctl -qw "$what" || true ;;
      dir) rm -rf --one-file-system "$what" ;;
    esac
  done <"$REC/kubelet-changes"
  rm -f "$REC/kubelet-changes"
}

# pod-routes [--between-nodes]: routes (proto $POD_ROUTES_PROTO) to each added node's pod
# CIDR via its address, here, and to the Service range via the first node, whose kube-proxy
# takes it on: the control plane then reaches pods and Services (admission webhooks,
# aggregated API servers, the proxy subresources), as on a control-plane node that runs
# kube-proxy. --between-nodes: also each node's routes to the others' pod CIDRs (host-gw),
# for agents that program none (the kubelet; flannel's job on a real cluster). Run once the
# Nodes have their pod CIDRs; remove-nodes removes them.
POD_ROUTES_PROTO=212
cmd_pod_routes() {
  need_root
  local between=0 h o cidr first=""
  case ${1:-} in
    "") ;;
    --between-nodes) between=1 ;;
    *) die "usage: $0 pod-routes [--between-nodes]" ;;
  esac
  [[ -n $(host_names) ]] || die "no nodes: run 'cluster.sh add-nodes N' first"
  for h in $(host_names); do
    cidr=$(kubectl --kubeconfig "$KUBECONFIG_ADMIN" get node "$h" -o jsonpath='{.spec.podCIDR}' 2>/dev/null) ||
      die "no Node $h: start the agents and wait until the Nodes are registered"
    [[ -n $cidr ]] || die "Node $h has no pod CIDR yet"
    ip route replace "$cidr" via "$(host_ip "$h")" dev "$NODE_LINK" proto "$POD_ROUTES_PROTO"
    if ((between)); then
      for o in $(host_names); do
        [[ $o == "$h" ]] || ip -n "$o" route replace "$cidr" via "$(host_ip "$h")" dev eth0 proto "$POD_ROUTES_PROTO"
      done
    fi
    first=${first:-$h}
  done
  ip route replace "$SERVICE_CIDR" via "$(host_ip "$first")" dev "$NODE_LINK" proto "$POD_ROUTES_PROTO"
  log "routes to the nodes' pod CIDRs$( ((between)) && echo ' (also between nodes)') and to $SERVICE_CIDR via $first"
}

# remove_pod_routes: what pod-routes made here; the Service range is dropped again.
remove_pod_routes() {
  ip route flush proto "$POD_ROUTES_PROTO" 2>/dev/null || true
  if ip link show "$NODE_LINK" >/dev/null 2>&1 && [[ -z $(ip route show "$SERVICE_CIDR") ]]; then
    ip route replace blackhole "$SERVICE_CIDR"
  fi
}

# stop-agent NODE: SIGTERM (SIGKILL after 15 s) its rkubelet or kubelet, by recorded PID.
cmd_stop_agent() {
  need_root
  local pid c
  if [[ -z ${1:-} ]] || ! host_names | grep -qxF "$1"; then
    die "usage: $0 stop-agent NODE (one of: $(host_names | tr '\n' ' '))"
  fi
  for c in "rkubelet@$1" "kubelet@$1"; do
    if pid=$(comp_pid "$c"); then
      stop_pid "$c" "$pid"
      return 0
    fi
  done
  die "no agent runs on $1"
}

# remove_hosts: every added node's processes (agent, kube-proxy, containers, containerd and
# its shims), then its namespace (with it the links, routes, FDB entries, VXLAN devices
# and iptables rules inside), its link, its cgroups and its state.
remove_hosts() {
  local h pid c
  for h in $(host_names); do
    for c in "rkubelet@$h" "kubelet@$h" "kube-proxy@$h"; do
      if pid=$(comp_pid "$c"); then stop_pid "$c" "$pid"; fi
    done
    # Each step whatever the one before did: a node that failed half-way is removed too.
    (
      set +e
      use_host "$h"
      remove_containers
      if pid=$(comp_pid "containerd@$h"); then stop_pid "containerd@$h" "$pid"; fi
      kill_leftover_shims
      kill_recorded_shims
      remove_cgroup_tree "/$h"
      unmount_under "$HOST_DIR"
    ) || log "warning: removing node $h's processes and mounts failed part-way"
    log "removing node $h (netns, link)"
    ip link delete "$h" 2>/dev/null || true
    delete_netns "$h"
    rm -rf "${HOSTS_DIR:?}/$h" "$PKI/node-$h"{,-serving}.{crt,key} "$PKI/node-$h.kubeconfig"
    rm -f "$PIDS/"{rkubelet,kubelet,kube-proxy,containerd}@"$h".{pid,exe}
  done
  rm -f "$REC/hosts"
  restore_kubelet_changes
  remove_pod_routes
  remove_host_dnat_unless_used
}

# remove_host_dnat_unless_used: the DNAT, once no node reaches the control plane through
# it (these nodes, kind-style nodes, VM nodes).
remove_host_dnat_unless_used() {
  [[ -n $(host_names) || -n $(kind_nodes) || -n $(vm_nodes) ]] || remove_host_dnat
}

# remove_host_dnat: what setup_host_dnat made.
remove_host_dnat() {
  remove_chains <<<"nat $HOSTS_CHAIN"
  if [[ -e /proc/sys/net/ipv4/conf/$NODE_LINK/route_localnet ]]; then
    sysctl -qw "net.ipv4.conf.$NODE_LINK.route_localnet=0"
  fi
}
