# shellcheck shell=bash
# The control plane on loopback and the machine's side of the network: the node address
# on the underlay bridge, the forwarding chain that keeps pods on this machine, etcd, the
# registries, kube-apiserver, kube-controller-manager, kube-scheduler; `up`, `down`,
# `status` and the fault drills that stop and start single components.
# Sourced by scripts/cluster.sh.

# record_sysctls / set them; `down` restores only what we changed.
set_sysctls() {
  local key prev want=1
  for key in "${SYSCTLS[@]}"; do
    prev=$(sysctl -n "$key" 2>/dev/null) || { log "warning: sysctl $key not available"; continue; }
    if [[ $prev != "$want" ]]; then
      echo "$key=$prev" >>"$REC/sysctl"
      sysctl -qw "$key=$want"
    fi
  done
}

restore_sysctls() {
  [[ -f $REC/sysctl ]] || return 0
  local line
  while IFS= read -r line; do
    log "restoring sysctl $line"
    sysctl -qw "$line" || true
  done <"$REC/sysctl"
}

# The node address lives on the underlay bridge $NODE_LINK (no uplink: nothing on it leaves
# the machine). A veth port whose peer sits in its own netns gives it carrier; the nodes of
# `add-nodes` are further ports.
setup_node_link() {
  log "node address $NODE_IP/24 on bridge $NODE_LINK (port $NODE_PORT, peer in netns $NODE_NETNS)"
  [[ -d /run/netns ]] || echo created >"$REC/run-netns"
  ip netns add "$NODE_NETNS"
  echo "$NODE_NETNS" >>"$REC/netns"
  ip link add "$NODE_LINK" type bridge
  echo "$NODE_LINK" >>"$REC/links"
  ip addr add "$NODE_IP/24" dev "$NODE_LINK"
  ip link add "$NODE_PORT" type veth peer name "$NODE_PEER" netns "$NODE_NETNS"
  ip link set "$NODE_PORT" master "$NODE_LINK" up
  ip link set "$NODE_LINK" up
  ip -n "$NODE_NETNS" link set lo up
  ip -n "$NODE_NETNS" link set "$NODE_PEER" up
}

# Pods stay on this machine: only pod<->pod (within the machine: see the blackhole route)
# and pod<->198.18.0.0/15 is forwarded; what
# comes from the underlay (the nodes of `add-nodes`) is bridged between them or delivered
# here, never routed on.
setup_firewall() {
  log "iptables chain $FWD_CHAIN (pods may not leave the machine)"
  remove_chains <<<"filter $FWD_CHAIN"   # a leftover from a crashed run, if any
  # Tables that exist now (iptables-nft makes a table on first use; see remove_new_tables).
  iptables-save | sed -n 's/^\*//p' >"$REC/iptables-tables-before"
  # Remember CNI-* chains that exist now: portmap creates more; `down` removes only new ones.
  local t
  for t in filter nat mangle; do
    iptables -w 5 -t "$t" -S | awk -v t="$t" '$1 == "-N" && $2 ~ /^CNI-/ {print t, $2}'
  done >"$REC/cni-chains-before"
  echo "filter $FWD_CHAIN" >"$REC/chains"
  ipt_restore <<EOF
*filter
:$FWD_CHAIN - [0:0]
-A $FWD_CHAIN -i $NODE_LINK -o $NODE_LINK -j ACCEPT
-A $FWD_CHAIN -s $CLUSTER_CIDR -d $CLUSTER_CIDR -j ACCEPT
-A $FWD_CHAIN -s $CLUSTER_CIDR -d $BENCH_NET -j ACCEPT
-A $FWD_CHAIN -s $BENCH_NET -d $CLUSTER_CIDR -j ACCEPT
-A $FWD_CHAIN -d $CLUSTER_CIDR -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A $FWD_CHAIN -s $CLUSTER_CIDR -j DROP
-A $FWD_CHAIN -i $NODE_LINK -j DROP
-I FORWARD 1 -j $FWD_CHAIN
COMMIT
EOF
  iptables -w 5 -S "$FWD_CHAIN" >"$REC/iptables-rules"
  # A pod or Service address no node bridge holds is dropped here, not sent to the default
  # gateway (the ACCEPT of pod to pod above would let it through): the bridges' /24 routes
  # win.
  ip route replace blackhole "$CLUSTER_CIDR"
  ip route replace blackhole "$SERVICE_CIDR"
}

teardown_firewall() {
  local range
  for range in "$CLUSTER_CIDR" "$SERVICE_CIDR"; do
    if ip route show type blackhole "$range" | grep -q .; then
      ip route delete blackhole "$range" || true
    fi
  done
  # Chains portmap (CNI) created while we ran: CNI-* chains not present at `up`.
  if [[ -f $REC/cni-chains-before ]]; then
    local t
    for t in filter nat mangle; do
      iptables -w 5 -t "$t" -S 2>/dev/null | awk -v t="$t" '$1 == "-N" && $2 ~ /^CNI-/ {print t, $2}'
    done | grep -vxF -f "$REC/cni-chains-before" >"$REC/cni-chains-new" || true
    remove_chains <"$REC/cni-chains-new"
  fi
  # Our own chains have dedicated names: remove them even if the records are gone.
  remove_chains <<<"filter $FWD_CHAIN
nat $HOSTS_CHAIN"
  remove_new_tables
}

# iptables-nft creates a table (filter for our chain, nat for portmap) on first use and
# the iptables CLI cannot delete one. Tables that did not exist at `up` and are empty
# now (built-in chains, no rules) are deleted with nft, if nft is installed.
remove_new_tables() {
  [[ -f $REC/iptables-tables-before ]] || return 0
  local t rest
  for t in $(iptables-save | sed -n 's/^\*//p' | grep -vxF -f "$REC/iptables-tables-before"); do
    rest=$(iptables-save -t "$t" | grep -vE '^(#|\*|COMMIT$|:(PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) ACCEPT )' || true)
    [[ -z $rest ]] || continue
    if command -v nft >/dev/null && iptables -V | grep -q nf_tables; then
      if nft delete table ip "$t"; then log "removed empty iptables table $t"; fi
    else
      log "note: empty iptables table $t stays (install nftables to remove it)"
    fi
  done
}

start_etcd() {
  mkdir -p "$RKUBELET_STATE/etcd"
  chmod 700 "$RKUBELET_STATE/etcd"
  start_proc etcd /usr/bin/etcd \
    --name=rkubelet \
    --data-dir="$RKUBELET_STATE/etcd" \
    --listen-client-urls=http://127.0.0.1:2379 \
    --advertise-client-urls=http://127.0.0.1:2379 \
    --listen-peer-urls=http://127.0.0.1:2380 \
    --initial-advertise-peer-urls=http://127.0.0.1:2380 \
    --initial-cluster=rkubelet=http://127.0.0.1:2380 \
    --initial-cluster-state=new \
    --logger=zap --log-outputs=stderr
}

# registry_config ADDR DIR [HTPASSWD]: the config of a registry serving plain HTTP on
# ADDR and storing in DIR; with HTPASSWD (a bcrypt htpasswd file) every request needs
# one of its users.
registry_config() {
  local addr=$1 dir=$2 htpasswd=${3:-}
  cat <<EOF
version: 0.1
log:
  level: info
  fields:
    service: registry
storage:
  filesystem:
    rootdirectory: $dir
  delete:
    enabled: true
  cache:
    blobdescriptor: inmemory
http:
  addr: $addr
  headers:
    X-Content-Type-Options: [nosniff]
EOF
  if [[ -n $htpasswd ]]; then
    cat <<EOF
auth:
  htpasswd:
    realm: rkubelet-private
    path: $htpasswd
EOF
  fi
}

start_registry() {
  mkdir -p "$RKUBELET_STATE/registry"
  registry_config "$REGISTRY" "$RKUBELET_STATE/registry" >"$RKUBELET_STATE/registry.yml"
  start_proc registry /usr/bin/docker-registry serve "$RKUBELET_STATE/registry.yml"
}

# Which reads of Secrets and ConfigMaps each client makes, one audit line per request as
# it arrives (the benchmark counts them per node identity); nothing else is audited.
write_audit_policy() {
  cat >"$RKUBELET_STATE/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["ResponseStarted", "ResponseComplete", "Panic"]
rules:
- level: Metadata
  verbs: ["get", "list", "watch"]
  resources:
  - group: ""
    resources: ["secrets", "configmaps"]
- level: None
EOF
}

# The private registry of image pull secret tests: its one user is
# $PRIVATE_REGISTRY_USER (bcrypt hash made by htpasswd, the password read from stdin).
start_private_registry() {
  local dir="$RKUBELET_STATE/registry-private"
  mkdir -p "$dir/data"
  printf '%s' "$PRIVATE_REGISTRY_PASSWORD" | htpasswd -iBn "$PRIVATE_REGISTRY_USER" >"$dir/htpasswd"
  registry_config "$PRIVATE_REGISTRY" "$dir/data" "$dir/htpasswd" >"$dir/registry.yml"
  start_proc registry-private /usr/bin/docker-registry serve "$dir/registry.yml"
}

private_registry_ready() {
  curl -fsS -u "$PRIVATE_REGISTRY_USER:$PRIVATE_REGISTRY_PASSWORD" "http://$PRIVATE_REGISTRY/v2/"
}

# Serves on 127.0.0.1 only. It advertises $NODE_IP, not 127.0.0.1: the `kubernetes`
# Endpoints may not hold a loopback address (with 127.0.0.1 the apiserver logs an error
# every 10s). Nothing listens on $NODE_IP:6443, so pods cannot reach the apiserver.
# EphemeralContainers (alpha in 1.20, GA and on by default since 1.25) serves the
# pods/ephemeralcontainers subresource `kubectl debug` writes; a kubelet without the gate
# (the benchmark's) ignores ephemeral containers, and pods without them are unchanged.
start_apiserver() {
  write_audit_policy
  start_proc kube-apiserver "$K8S_BIN/kube-apiserver" \
    --audit-policy-file="$RKUBELET_STATE/audit-policy.yaml" \
    --audit-log-path="$RKUBELET_STATE/audit.log" \
    --audit-log-maxsize=100 --audit-log-maxbackup=1 \
    --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=127.0.0.1 \
    --advertise-address="$NODE_IP" \
    --secure-port=6443 \
    --cert-dir="$PKI" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --client-ca-file="$PKI/ca.crt" \
    --tls-cert-file="$PKI/apiserver.crt" \
    --tls-private-key-file="$PKI/apiserver.key" \
    --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction \
    --enable-bootstrap-token-auth=true \
    --allow-privileged=true \
    --feature-gates=EphemeralContainers=true \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User \
    --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" \
    --proxy-client-key-file="$PKI/front-proxy-client.key"
}

start_controller_manager() {
  local kc="$PKI/controller-manager.kubeconfig"
  start_proc kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig="$kc" \
    --authentication-kubeconfig="$kc" \
    --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 \
    --address=127.0.0.1 \
    --leader-elect=false \
    --controllers='*,bootstrapsigner,tokencleaner' \
    --use-service-account-credentials=true \
    --allocate-node-cidrs=true \
    --cluster-cidr="$CLUSTER_CIDR" \
    --node-cidr-mask-size="$NODE_CIDR_MASK" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --root-ca-file="$PKI/ca.crt" \
    --service-account-private-key-file="$PKI/sa.key" \
    --cluster-signing-cert-file="$PKI/ca.crt" \
    --cluster-signing-key-file="$PKI/ca.key"
}

start_scheduler() {
  local kc="$PKI/scheduler.kubeconfig"
  start_proc kube-scheduler "$K8S_BIN/kube-scheduler" \
    --kubeconfig="$kc" \
    --authentication-kubeconfig="$kc" \
    --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 \
    --address=127.0.0.1 \
    --leader-elect=false
}

# ip_int A.B.C.D: the address as a number.
ip_int() {
  local a b c d
  IFS=. read -r a b c d <<<"$1"
  echo $(((a << 24) | (b << 16) | (c << 8) | d))
}

# captures CIDR OURS: whether CIDR (a route's, an address's or a rule's) would take traffic
# meant for the range OURS: the two overlap and CIDR is as specific as OURS or more (a
# broader route, such as a default one, loses to the cluster's own routes).
captures() {
  local net=${1%/*} len=${1#*/} ours=${2%/*} olen=${2#*/}
  [[ $1 == */* ]] || len=32
  ((len >= olen)) || return 1
  local mask=$(((0xffffffff << (32 - olen)) & 0xffffffff))
  ((($(ip_int "$net") & mask) == ($(ip_int "$ours") & mask)))
}

# check_ranges_free: the cluster's pod range, Service range and node addresses must be free
# on this machine: no route, interface address or iptables rule of someone else (another
# cluster's bridge on 10.244.0.0/16, flannel's routes, a VPN) may capture them, or the
# tests fail much later with "No route to host". Run after a stale state of ours is gone.
check_ranges_free() {
  local found=() range what line word cidr routes addrs rules
  routes=$(ip -4 route show table all 2>/dev/null | grep -v '^default' || true)
  addrs=$(ip -4 -o addr show 2>/dev/null || true)
  rules=$(iptables-save 2>/dev/null | grep -E '^-A ' || true)
  for range in "$CLUSTER_CIDR pod range" "$SERVICE_CIDR Service range" "$BENCH_NET node addresses"; do
    what=${range#* }
    range=${range%% *}
    while IFS= read -r line; do
      cidr=${line%% *}
      # An address's own local and broadcast routes: the address is reported below.
      [[ $cidr == local || $cidr == broadcast ]] && continue
      [[ $cidr == blackhole || $cidr == unreachable || $cidr == prohibit ]] && cidr=${line#* } && cidr=${cidr%% *}
      [[ $cidr =~ ^[0-9.]+(/[0-9]+)?$ ]] || continue
      if captures "$cidr" "$range"; then found+=("$what $range: route '${line% }' (remove it: ip route del ${line% })"); fi
    done <<<"$routes"
    while IFS= read -r line; do
      read -r _ dev _ cidr _ <<<"$line"
      if captures "$cidr" "$range"; then found+=("$what $range: interface $dev holds $cidr (ip addr del $cidr dev $dev, or ip link delete $dev)"); fi
    done <<<"$addrs"
    while IFS= read -r line; do
      for word in $line; do
        [[ $word =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+(/[0-9]+)?$ ]] || continue
        if captures "$word" "$range"; then found+=("$what $range: iptables rule '$line'"); break; fi
      done
    done <<<"$rules"
  done
  if ((${#found[@]} > 0)); then
    log "error: this machine already routes addresses the local cluster needs:"
    printf '  %s\n' "${found[@]}" >&2
    die "another cluster (kind, flannel, a CNI bridge) or network uses them: stop it or remove what is listed, then run 'cluster.sh up' again"
  fi
}

check_ports_free() {
  local port busy=()
  for port in 2379 2380 6443 5000 5001 10251 10252 10257 10259; do
    if ss -Hltn "sport = :$port" | grep -q .; then busy+=("$port"); fi
  done
  [[ ${#busy[@]} -eq 0 ]] || die "ports already in use: ${busy[*]} (something else is running)"
}

api_ready() {
  curl -fsS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$APISERVER/readyz"
}

# ---------------------------------------------------------------- up

UP_OK=0
on_up_exit() {
  local rc=$?
  [[ $UP_OK -eq 1 ]] && return 0
  log "up failed (exit $rc): tearing down what was started"
  local f
  for f in "$LOGS"/*.log; do
    [[ -f $f ]] || continue
    echo "---- last lines of $(basename "$f") ----" >&2
    tail -n 15 "$f" >&2
  done
  cmd_down || true
  exit "$rc"
}

cmd_up() {
  need_root
  local n_alive=0 n_rec=0 c nodes=1
  case ${1:-} in
    "") ;;
    --nodes) nodes=${2:-} ;;
    *) die "usage: $0 up [--nodes N]" ;;
  esac
  if ! [[ $nodes =~ ^[0-9]+$ ]] || ((nodes < 1)); then die "usage: $0 up [--nodes N]"; fi
  for c in "${COMPONENTS[@]}"; do
    if [[ -f $PIDS/$c.pid ]]; then
      n_rec=$((n_rec + 1))
      if comp_pid "$c" >/dev/null; then n_alive=$((n_alive + 1)); fi
    fi
  done
  if ((n_alive == ${#COMPONENTS[@]})); then
    log "cluster already up (all ${#COMPONENTS[@]} components alive)"
    local have
    have=$(host_names | wc -l)
    if ((nodes > 1 && have == 0)); then
      cmd_add_nodes "$nodes"
    elif ((nodes > 1 && have != nodes)); then
      die "the running cluster has $have added nodes, not $nodes: run 'cluster.sh remove-nodes' first"
    fi
    print_summary
    return 0
  fi
  if ((n_alive > 0)); then
    die "cluster partially up ($n_alive of ${#COMPONENTS[@]} alive): run 'cluster.sh down' first"
  fi
  if [[ -d $RKUBELET_STATE ]]; then
    log "stale state in $RKUBELET_STATE ($n_rec recorded, none alive): cleaning it first"
    cmd_down
  fi
  for c in etcd docker-registry htpasswd containerd kubectl openssl iptables-restore curl ctr ss; do
    command -v "$c" >/dev/null || die "missing $c: run scripts/setup.sh"
  done
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    [[ -x $K8S_BIN/$c ]] || die "missing $K8S_BIN/$c: run scripts/setup.sh"
  done
  check_ports_free
  check_ranges_free

  local t0=$SECONDS
  mkdir -p "$RKUBELET_STATE" "$PIDS" "$LOGS" "$REC"
  trap on_up_exit EXIT
  trap 'exit 130' INT TERM

  log "images: build (cached)"
  bash "$RKUBELET_REPO/scripts/images.sh" build

  make_pki
  set_sysctls
  setup_node_link
  setup_firewall

  start_etcd
  start_registry
  start_private_registry
  start_containerd
  wait_for "etcd" 60 etcd curl -fsS http://127.0.0.1:2379/health
  start_apiserver
  wait_for "registry http://$REGISTRY/v2/" 60 registry curl -fsS "http://$REGISTRY/v2/"
  wait_for "private registry http://$PRIVATE_REGISTRY/v2/" 60 registry-private private_registry_ready
  wait_for "containerd (CRI)" 60 containerd ctr_ version

  # Push the images while the API server boots.
  log "images: load into the registry and containerd"
  bash "$RKUBELET_REPO/scripts/images.sh" load

  wait_for "kube-apiserver /readyz" 120 kube-apiserver api_ready
  start_controller_manager
  start_scheduler
  wait_for "ServiceAccount default/default" 120 kube-controller-manager \
    kubectl --kubeconfig "$KUBECONFIG_ADMIN" -n default get serviceaccount default
  comp_pid kube-scheduler >/dev/null || die "kube-scheduler died (see $LOGS/kube-scheduler.log)"
  bootstrap_token

  # More than one node: each its own netns (the root namespace's node stays unused).
  if ((nodes > 1)); then cmd_add_nodes "$nodes"; fi

  UP_OK=1
  trap - EXIT INT TERM
  log "cluster up in $((SECONDS - t0))s"
  print_summary
}

print_summary() {
  cat <<EOF
admin kubeconfig: $KUBECONFIG_ADMIN
node kubeconfig:  $PKI/node-$NODE_NAME.kubeconfig
bootstrap:        $PKI/bootstrap-kubelet.kubeconfig (token, as kubeadm join uses it)
node:             $NODE_NAME $NODE_IP (on $NODE_LINK)
containerd:       $CONTAINERD_SOCK   registry: http://$REGISTRY
private registry: http://$PRIVATE_REGISTRY (user $PRIVATE_REGISTRY_USER)
EOF
  kubectl --kubeconfig "$KUBECONFIG_ADMIN" get --raw /version
  echo
}

teardown_network() {
  local n l
  # Sandbox netns made by our containerd: cni-* that were not there before it started.
  if [[ -f $REC/netns-before ]]; then
    for n in $(find /run/netns -maxdepth 1 -name 'cni-*' -printf '%f\n' 2>/dev/null | grep -vxF -f "$REC/netns-before"); do
      log "removing netns $n"
      delete_netns "$n"
    done
  fi
  # The pod bridges (the runtime's and the agent's) and any veth still attached to them.
  local bridge
  for bridge in "$POD_BRIDGE" "$AGENT_BRIDGE"; do
    if ip link show "$bridge" >/dev/null 2>&1; then
      for l in $(ip -o link show master "$bridge" | awk -F': ' '{print $2}' | cut -d@ -f1); do
        ip link delete "$l" 2>/dev/null || true
      done
      log "removing bridge $bridge"
      ip link delete "$bridge" 2>/dev/null || true
    fi
  done
  # The node-address veth and its netns (dedicated names).
  if ip link show "$NODE_LINK" >/dev/null 2>&1; then
    log "removing $NODE_LINK"
    ip link delete "$NODE_LINK" 2>/dev/null || true
  fi
  delete_netns "$NODE_NETNS"
  # /run/netns itself, if `ip netns add` created it for us and it is now empty.
  if [[ -f $REC/run-netns && -d /run/netns ]] && [[ -z $(ls -A /run/netns) ]]; then
    while mountpoint -q /run/netns; do umount /run/netns 2>/dev/null || umount -l /run/netns || break; done
    rmdir /run/netns 2>/dev/null || true
  fi
  # CNI IPAM leases of our network and libcni results cached while our containerd ran.
  rm -rf "${CNI_VAR:?}/networks/$CNI_NET_NAME" "${CNI_VAR:?}/networks/$AGENT_NET_NAME"
  if [[ -f $REC/containerd-started && -d $CNI_VAR/results ]]; then
    find "$CNI_VAR/results" -type f -newer "$REC/containerd-started" -delete
  fi
  if [[ -f $REC/var-lib-cni ]]; then rm -rf "$CNI_VAR"; fi
}

cmd_down() {
  need_root
  local t0=$SECONDS c pid
  [[ -d $RKUBELET_STATE ]] || log "no state in $RKUBELET_STATE: cleaning up leftovers only"

  # 0. An agent started on this cluster (scripts/run.sh records it like a component):
  #    stopped first, so it does not re-create what is removed next.
  if pid=$(comp_pid rkubelet); then stop_pid rkubelet "$pid"; fi
  # The VM nodes (`add-vm-node`), the kind-style nodes (`add-kind-node`), then the nodes of
  # `add-nodes`, each with all it holds.
  remove_vm_nodes
  remove_kind_nodes
  remove_hosts
  # 1. Containers first, while containerd still runs.
  remove_containers
  # 2. Processes, by recorded PID, in reverse start order.
  for c in "${STOP_ORDER[@]}"; do
    if pid=$(comp_pid "$c"); then stop_pid "$c" "$pid"; fi
    if [[ $c == containerd ]]; then kill_leftover_shims; kill_recorded_shims; fi
  done
  remove_ns_cgroups
  # 3. Mounts under our state and containerd's run dir.
  unmount_under "$RKUBELET_STATE"
  if [[ -f $REC/containerd-started ]]; then unmount_under "$RUN_CTRD"; fi
  # 4. Network: netns, bridge, node link, iptables, sysctls.
  teardown_network
  teardown_firewall
  restore_sysctls
  # 5. containerd's socket / run dir, then the state itself.
  if [[ -d $REC ]]; then
    rm -f "$CONTAINERD_SOCK" "$CONTAINERD_SOCK.ttrpc"
    if [[ -f $REC/run-containerd ]]; then rm -rf "$RUN_CTRD"; fi
  fi
  if [[ -d $RKUBELET_STATE ]]; then
    unmount_under "$RKUBELET_STATE"
    rm -rf "${RKUBELET_STATE:?}"
  fi
  log "down in $((SECONDS - t0))s"
}

# Fault drills stop and start single components of a running cluster, by recorded PID.
DRILL_COMPONENTS=(containerd kube-apiserver)

drill_component() {
  local c IFS='|'
  for c in "${DRILL_COMPONENTS[@]}"; do [[ $1 == "$c" ]] && return 0; done
  die "usage: $0 {kill|stop|start} {${DRILL_COMPONENTS[*]}} (got '${1:-}')"
}

# cmd_kill NAME: SIGKILL the component by its recorded PID, and wait until it is gone.
cmd_kill() {
  need_root
  drill_component "${1:-}"
  local pid i
  pid=$(comp_pid "$1") || die "$1 is not running"
  log "killing $1 (pid $pid, SIGKILL)"
  kill -KILL "$pid"
  for ((i = 0; i < 100; i++)); do pid_alive "$pid" || return 0; sleep 0.05; done
  die "$1 (pid $pid) survived SIGKILL"
}

# cmd_stop NAME: SIGTERM (SIGKILL after 15 s) by recorded PID.
cmd_stop() {
  need_root
  drill_component "${1:-}"
  local pid
  pid=$(comp_pid "$1") || die "$1 is not running"
  stop_pid "$1" "$pid"
}

# cmd_start NAME: start a stopped component again as `up` did, and wait until it serves.
# Its previous log is kept as logs/NAME.log.prev.
cmd_start() {
  need_root
  drill_component "${1:-}"
  [[ -d $PIDS ]] || die "cluster is down (no $PIDS): run 'cluster.sh up'"
  if comp_pid "$1" >/dev/null; then die "$1 already runs (pid $(comp_pid "$1"))"; fi
  [[ ! -f $LOGS/$1.log ]] || mv -f "$LOGS/$1.log" "$LOGS/$1.log.prev"
  case $1 in
    containerd)
      launch_containerd
      wait_for "containerd (CRI)" 60 containerd ctr_ version
      ;;
    kube-apiserver)
      start_apiserver
      wait_for "kube-apiserver /readyz" 120 kube-apiserver api_ready
      ;;
  esac
}

cmd_status() {
  local c pid bad=0
  if [[ ! -d $PIDS ]]; then
    echo "cluster is down (no $PIDS)"
    return 1
  fi
  for c in "${COMPONENTS[@]}"; do
    if pid=$(comp_pid "$c"); then
      printf '%-24s pid %-8s alive\n' "$c" "$pid"
    else
      printf '%-24s pid %-8s DEAD\n' "$c" "$(cat "$PIDS/$c.pid" 2>/dev/null || echo -)"
      bad=1
    fi
  done
  local h
  for h in $(host_names); do
    for c in "containerd@$h" "kube-proxy@$h" "rkubelet@$h"; do
      if pid=$(comp_pid "$c"); then
        printf '%-24s pid %-8s alive\n' "$c" "$pid"
      elif [[ -f $PIDS/$c.pid ]]; then
        printf '%-24s pid %-8s DEAD\n' "$c" "$(cat "$PIDS/$c.pid")"
        [[ $c == rkubelet@* ]] || bad=1
      fi
    done
  done
  printf '%-24s %s\n' "node address" "$(ip -o -4 addr show dev "$NODE_LINK" 2>/dev/null | awk '{print $4}' || true)"
  printf '%-24s %s\n' "iptables $FWD_CHAIN" "$(iptables -w 5 -C FORWARD -j "$FWD_CHAIN" 2>/dev/null && echo present || echo MISSING)"
  return "$bad"
}
