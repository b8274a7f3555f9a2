# shellcheck shell=bash
# The leak check: everything of the cluster that survived `down`, one line each.
# Sourced by scripts/cluster.sh.

# Everything of the cluster that survives `down`, one line each: processes (components,
# agents, containerd shims and their containers), sandbox netns, pod bridges and their
# veths, the node link and netns, our iptables rules, mounts, CNI state, pod cgroups and
# the state dir. It needs no records: `down` removed them.
list_leaks() {
  local l ps_out shims
  # Processes naming the state dir (every component's flags do; shells and tools that
  # merely mention it are not the cluster's), those working in it (a shim works in its
  # task bundle, also once that is deleted), and the children of those.
  ps_out=$(ps -eo pid=,ppid=,comm=,args=)
  shims=$(find /proc/[0-9]*/cwd -maxdepth 0 -lname "$RKUBELET_STATE/*" -printf '%h\n' 2>/dev/null | cut -d/ -f3 || true)
  awk -v state="$RKUBELET_STATE" -v cwd="${shims//$'\n'/ }" '
    BEGIN { n = split(cwd, c, " "); for (i = 1; i <= n; i++) incwd[c[i]] = 1 }
    { pid = $1; ppid = $2; comm = $3; $1 = $2 = $3 = ""; sub(/^ +/, "") }
    comm ~ /^(bash|sh|flock|timeout|grep|awk|sed|tail|less|cat|find|ps)$/ { next }
    index($0, state) || (pid in incwd) { print "process " pid ": " $0; next }
    ppid in incwd { print "process " pid ": " $0 " (child of " ppid ")" }' <<<"$ps_out"
  # Network: the node netns, sandbox netns (mounts, below), links by their dedicated names.
  [[ ! -e /run/netns/$NODE_NETNS ]] || echo "netns /run/netns/$NODE_NETNS"
  find /run/netns -maxdepth 1 -name "$HOST_PREFIX*" -printf 'netns %p\n' 2>/dev/null || true
  ip -o link show 2>/dev/null | awk -F': ' -v p="$HOST_PREFIX" 'index($2, p) == 1 {print "link " $2}' | cut -d@ -f1
  for l in "$POD_BRIDGE" "$AGENT_BRIDGE"; do
    if ip link show "$l" >/dev/null 2>&1; then
      echo "bridge $l ($(ip -o link show master "$l" | wc -l) veths on it)"
    fi
  done
  if ip link show "$NODE_LINK" >/dev/null 2>&1; then echo "link $NODE_LINK"; fi
  iptables_leaks
  ip route show type blackhole "$CLUSTER_CIDR" | sed 's/^/route /'
  ip route show type blackhole "$SERVICE_CIDR" | sed 's/^/route /'
  # An agent's routes to other nodes (proto 211) and its VXLAN device, in this namespace.
  ip route show proto 211 | sed 's/^/route /'
  # Routes of `cluster.sh pod-routes` to the nodes' pod CIDRs and the Service range.
  ip route show proto "$POD_ROUTES_PROTO" | sed 's/^/route /'
  if ip link show rkvx.1 >/dev/null 2>&1; then echo "link rkvx.1"; fi
  # Mounts under the state dir (rootfs, sandbox netns, volumes of test agents' pods).
  findmnt -rn -o TARGET | awk -v r="$RKUBELET_STATE" 'index($0, r "/") == 1 || $0 == r {print "mount " $0}'
  # CNI: host-local reservations and libcni's cached results of our two networks.
  for l in "$CNI_NET_NAME" "$AGENT_NET_NAME"; do
    [[ ! -d $CNI_VAR/networks/$l ]] || echo "host-local dir $CNI_VAR/networks/$l"
    find "$CNI_VAR/results" -maxdepth 1 -name "$l-[0-9a-f]*" -printf 'CNI cache entry %p\n' 2>/dev/null || true
  done
  # Pod cgroups (the agents' kubepods hierarchy), in any hierarchy.
  find /sys/fs/cgroup/*/kubepods* /sys/fs/cgroup/kubepods* -maxdepth 2 -type d -name 'pod*' \
    -printf 'pod cgroup %p\n' 2>/dev/null || true
  find /sys/fs/cgroup/ /sys/fs/cgroup/*/ -maxdepth 1 -type d -name "$HOST_PREFIX*" \
    -printf 'node cgroup %p\n' 2>/dev/null || true
  kind_leaks
  vm_leaks
  [[ ! -e $RKUBELET_STATE ]] || echo "state dir $RKUBELET_STATE"
}

# iptables_leaks: rules in any table that jump to or sit in our chain, or that the CNI
# plugins wrote for our networks (their comments name the network).
iptables_leaks() {
  iptables-save 2>/dev/null | cluster_rules | sed 's/^/iptables rule /'
}

# cluster_rules < iptables-save output: the cluster's rules and chains: our chain, rules
# whose comment names one of our networks, rules naming a pod address (10.244.x.y).
cluster_rules() {
  local pods=${CLUSTER_CIDR%%.0.0/*}
  grep -E -- "(^|[ :])($FWD_CHAIN|$HOSTS_CHAIN)( |\$)|name: [\\]?\"($CNI_NET_NAME|$AGENT_NET_NAME)[\\]?\"| ${pods//./\\.}\\." || true
}

cmd_leak_check() {
  need_root
  local leaks l
  leaks=$(list_leaks) || die "leak check: could not look at everything"
  if [[ -n $leaks ]]; then
    log "the cluster left behind ($(wc -l <<<"$leaks")):"
    while IFS= read -r l; do printf '  %s\n' "$l"; done <<<"$leaks" >&2
    return 1
  fi
  log "leak check: nothing of the cluster is left"
}
