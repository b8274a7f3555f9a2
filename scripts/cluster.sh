#!/usr/bin/env bash
# A real local Kubernetes v1.20.2 control plane for rkubelet, on loopback:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, a local image
# registry (and a private one, with htpasswd authentication) and containerd (CRI), plus a node address on a veth pair and an
# iptables chain that keeps pod traffic on this machine.
#
#   cluster.sh up [--nodes N]      start everything (idempotent-ish); N > 1: add-nodes N too
#   cluster.sh add-nodes N         N nodes rk-host1..N, each its own netns "host" on the
#                                  underlay bridge, with its own containerd and kube-proxy
#   cluster.sh start-agents [--pod-network-routes none|host-gw|vxlan] [--binary PATH]
#                                  an rkubelet on every added node (by recorded PID)
#   cluster.sh stop-agent NODE     stop one added node's rkubelet
#   cluster.sh remove-nodes        remove the added nodes and all they hold
#   cluster.sh add-kind-node NAME [--cgroup-driver cgroupfs|systemd] [--binary PATH] [--image IMAGE]
#                                  a kind-style node: a podman container booting systemd,
#                                  containerd and rkubelet (the kind node image), in its own
#                                  netns on the underlay, joined by bootstrap token (Ready)
#   cluster.sh kind-exec NAME CMD...  a command inside a kind-style node (podman exec, as the
#                                  scripts run podman); kind-pid NAME: its PID 1 on the host
#   cluster.sh remove-kind-node NAME   remove it, its container, cgroups, netns and link
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
# Everything lives under $RKUBELET_STATE; `down` removes exactly what `up`
# created (processes by recorded PID, links, netns, iptables rules, sysctls).
set -euo pipefail

# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PKI="$RKUBELET_STATE/pki"
PIDS="$RKUBELET_STATE/pids"
LOGS="$RKUBELET_STATE/logs"
REC="$RKUBELET_STATE/records"
CTRD="$RKUBELET_STATE/containerd"
CNI_BIN="$RKUBELET_STATE/cni/bin"
CNI_CONF="$RKUBELET_STATE/cni/net.d"
CNI_TEMPLATE="$RKUBELET_REPO/cni-config/containerd-bridge.conflist.template"
CNI_NET_NAME="rkubelet-runtime"   # "name" in the template: host-local keeps IPs under /var/lib/cni/networks/<name>
CNI_VAR="/var/lib/cni"            # libcni result cache + host-local default dataDir
RUN_CTRD="$(dirname "$CONTAINERD_SOCK")"
APISERVER="https://127.0.0.1:6443"

NODE_LINK="rk-node0"              # the underlay bridge, holding the node address
NODE_PORT="rk-node0-p"            # a veth port of it (carrier) ...
NODE_PEER="rk-node0-peer"         # ... whose peer end sits in $NODE_NETNS
NODE_NETNS="rk-nodepeer"
POD_BRIDGE="rkbr0"                # bridge made by the CNI template
AGENT_BRIDGE="rk0"                # bridge of the agent's own conflist (cni-config/10-rkubelet.conflist)
AGENT_NET_NAME="rkubelet"         # its network name: host-local keeps IPs under /var/lib/cni/networks/<name>
FWD_CHAIN="RKUBELET-FWD"
BENCH_NET="198.18.0.0/15"

# Start order; `down` stops in the reverse of this order (see STOP_ORDER).
COMPONENTS=(registry registry-private etcd kube-apiserver kube-controller-manager kube-scheduler containerd)
STOP_ORDER=(containerd kube-scheduler kube-controller-manager kube-apiserver etcd registry-private registry)
SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables)

# ---------------------------------------------------------------- helpers

need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root"; }

# pid_alive PID: true if the process exists and is not a zombie.
pid_alive() {
  local pid=$1 state
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z && $state != X ]]
}

# comp_pid NAME: the recorded PID of a component, if its binary still matches.
comp_pid() {
  local name=$1 pid exe
  [[ -f $PIDS/$name.pid ]] || return 1
  pid=$(<"$PIDS/$name.pid")
  pid_alive "$pid" || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [[ -f $PIDS/$name.exe && ${exe% (deleted)} == "$(<"$PIDS/$name.exe")" ]] || return 1
  echo "$pid"
}

# start_proc NAME BINARY ARGS...: start detached, log to logs/NAME.log, record the PID.
# With IN_NETNS set, the process runs in that network namespace (nsenter execs in place:
# the recorded PID is still the daemon's), in the machine's mount namespace.
start_proc() {
  local name=$1 bin=$2; shift 2
  log "starting $name"
  # setsid execs in place (we are not a process-group leader), so $! is the daemon. It
  # keeps no descriptor of ours but stdio: one inherited from a caller (a `flock` taken
  # around a test run that restarts a component) would hold that lock while it runs.
  (
    for f in /proc/"$BASHPID"/fd/*; do
      fd=${f##*/}
      if ((fd > 2)) && [[ -e $f ]]; then exec {fd}>&-; fi
    done
    if [[ -n ${IN_NETNS:-} ]]; then
      exec setsid nsenter --net="/run/netns/$IN_NETNS" -- "$bin" "$@"
    fi
    exec setsid "$bin" "$@"
  ) >"$LOGS/$name.log" 2>&1 </dev/null &
  local pid=$! exe i
  exe=$(readlink -f "$bin")
  echo "$pid" >"$PIDS/$name.pid"
  echo "$exe" >"$PIDS/$name.exe"
  # Wait for the exec so that comp_pid recognises the process from now on.
  for ((i = 0; i < 50; i++)); do
    [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$exe" ]] && return 0
    pid_alive "$pid" || break
    sleep 0.05
  done
  tail -n 20 "$LOGS/$name.log" >&2 || true
  die "$name did not start"
}

# wait_for DESC TIMEOUT COMPONENT CMD...: poll CMD until it succeeds; fail early if COMPONENT died.
wait_for() {
  local desc=$1 timeout=$2 comp=$3; shift 3
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if [[ -n $comp ]] && ! comp_pid "$comp" >/dev/null; then
      tail -n 30 "$LOGS/$comp.log" >&2 || true
      die "$comp exited while waiting for $desc"
    fi
    ((SECONDS < deadline)) || die "timed out after ${timeout}s waiting for $desc"
    sleep 0.2
  done
  log "$desc: ready"
}

# stop_pid NAME PID [TIMEOUT]: SIGTERM, wait, then SIGKILL.
stop_pid() {
  local name=$1 pid=$2 timeout=${3:-15} i
  pid_alive "$pid" || return 0
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < timeout * 10; i++)); do
    pid_alive "$pid" || return 0
    sleep 0.1
  done
  log "$name did not exit after ${timeout}s: SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do pid_alive "$pid" || return 0; sleep 0.1; done
}

ctr_() { ctr --address "$CONTAINERD_SOCK" "$@"; }
b64() { base64 -w0 <"$1"; }
ipt_restore() { iptables-restore -w 5 --noflush; }

# ---------------------------------------------------------------- PKI

# openssl config for a CA or leaf certificate: $1=kind (ca|client|server|both) $2=SANs
ext_conf() {
  local kind=$1 sans=${2:-}
  echo "[ext]"
  echo "subjectKeyIdentifier = hash"
  if [[ $kind == ca ]]; then
    echo "basicConstraints = critical, CA:TRUE"
    echo "keyUsage = critical, keyCertSign, cRLSign, digitalSignature"
    return
  fi
  echo "authorityKeyIdentifier = keyid"
  echo "basicConstraints = critical, CA:FALSE"
  echo "keyUsage = critical, digitalSignature, keyEncipherment"
  case $kind in
    client) echo "extendedKeyUsage = clientAuth" ;;
    server) echo "extendedKeyUsage = serverAuth" ;;
    both) echo "extendedKeyUsage = serverAuth, clientAuth" ;;
  esac
  [[ -z $sans ]] || echo "subjectAltName = $sans"
}

new_key() { openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1" 2>/dev/null; chmod 600 "$1"; }

# make_ca NAME CN: a self-signed CA NAME.{crt,key}.
make_ca() {
  local name=$1 cn=$2
  [[ -f $PKI/$name.crt ]] && return 0
  [[ -f $PKI/$name.key ]] || new_key "$PKI/$name.key"
  openssl req -x509 -new -key "$PKI/$name.key" -subj "/CN=$cn" -days 3650 -sha256 \
    -config <(printf '[req]\ndistinguished_name=dn\n[dn]\n'; ext_conf ca) -extensions ext \
    -out "$PKI/$name.crt" 2>/dev/null
}

# issue NAME SUBJECT KIND [SANS] [CA]: key + certificate signed by the cluster CA (or CA).
issue() {
  local name=$1 subj=$2 kind=$3 sans=${4:-} ca=${5:-ca}
  [[ -f $PKI/$name.key ]] || new_key "$PKI/$name.key"
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 3650 -sha256 \
    -extfile <(ext_conf "$kind" "$sans") -extensions ext -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr"
}

# kubeconfig FILE USER CERTNAME [SERVER]: a kubeconfig with everything embedded.
kubeconfig() {
  local file=$1 user=$2 cert=$3 server=${4:-$APISERVER}
  write_kubeconfig "$file" "$user" "$server" \
    "client-certificate-data: $(b64 "$PKI/$cert.crt")" \
    "client-key-data: $(b64 "$PKI/$cert.key")"
}

# write_kubeconfig FILE USER SERVER CREDENTIAL...: a kubeconfig (mode 0600) for the
# cluster's CA with the user's credential lines (`token: …`, `client-…-data: …`). It is
# written beside FILE and renamed over it, so a reader (an agent starting while another
# test re-applies the bootstrap token) never sees a half-written file.
write_kubeconfig() {
  local file=$1 user=$2 server=$3 tmp
  shift 3
  tmp=$(mktemp "$file.XXXXXX")
  chmod 600 "$tmp"
  {
    cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: rkubelet
  cluster:
    server: $server
    certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
- name: $user
  user:
EOF
    printf '    %s\n' "$@"
    cat <<EOF
contexts:
- name: $user@rkubelet
  context:
    cluster: rkubelet
    user: $user
current-context: $user@rkubelet
EOF
  } >"$tmp"
  mv -f "$tmp" "$file"
}

# node_credentials NAME [IP]: client identity system:node:NAME (+ kubeconfig) and
# a serving cert for the node's kubelet API (SANs: NAME, IP, 127.0.0.1).
node_credentials() {
  local name=$1 ip=${2:-$NODE_IP}
  [[ $name =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || die "bad node name: $name"
  [[ -f $PKI/ca.key ]] || die "no cluster CA in $PKI: run 'cluster.sh up' first"
  issue "node-$name" "/O=system:nodes/CN=system:node:$name" client
  issue "node-$name-serving" "/O=system:nodes/CN=system:node:$name" server \
    "DNS:$name, IP:$ip, IP:127.0.0.1"
  kubeconfig "$PKI/node-$name.kubeconfig" "system:node:$name" "node-$name"
  log "node credentials for $name: $PKI/node-$name.kubeconfig (serving cert $PKI/node-$name-serving.crt)"
}

make_pki() {
  log "PKI in $PKI"
  mkdir -p "$PKI"
  # Keys in parallel: RSA generation dominates. (A missing key is made again by issue.)
  local k
  for k in ca front-proxy-ca sa apiserver admin apiserver-kubelet-client front-proxy-client \
    controller-manager scheduler "node-$NODE_NAME" "node-$NODE_NAME-serving"; do
    new_key "$PKI/$k.key" &
  done
  wait
  make_ca ca rkubelet-ca
  # Aggregation layer (requestheader) identity, as kubeadm does: its own CA.
  make_ca front-proxy-ca rkubelet-front-proxy-ca
  issue front-proxy-client "/CN=front-proxy-client" client "" front-proxy-ca
  issue apiserver "/CN=kube-apiserver" server \
    "IP:127.0.0.1, IP:10.96.0.1, IP:$NODE_IP, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local"
  issue admin "/O=system:masters/CN=kubernetes-admin" client
  issue apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" client
  issue controller-manager "/CN=system:kube-controller-manager" client
  issue scheduler "/CN=system:kube-scheduler" client
  # Service-account token signing pair.
  [[ -f $PKI/sa.key ]] || new_key "$PKI/sa.key"
  openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  kubeconfig "$KUBECONFIG_ADMIN" kubernetes-admin admin
  kubeconfig "$PKI/controller-manager.kubeconfig" system:kube-controller-manager controller-manager
  kubeconfig "$PKI/scheduler.kubeconfig" system:kube-scheduler scheduler
  node_credentials "$NODE_NAME"
}

# ---------------------------------------------------------------- host networking

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

# remove_chains < "TABLE CHAIN" lines: delete the rules that jump to each chain,
# then flush and delete it. One iptables-restore per operation, so a rule that is
# already gone does not stop the rest.
remove_chains() {
  local items=() item t c line
  mapfile -t items
  for item in "${items[@]}"; do
    read -r t c <<<"$item"
    { iptables -w 5 -t "$t" -S 2>/dev/null | grep -E -- "-j $c( |\$)" || true; } | while IFS= read -r line; do
      printf '*%s\n%s\nCOMMIT\n' "$t" "-D ${line#-A }" | ipt_restore 2>/dev/null || true
    done
  done
  for item in "${items[@]}"; do
    read -r t c <<<"$item"
    printf '*%s\n-F %s\nCOMMIT\n' "$t" "$c" | ipt_restore 2>/dev/null || true
  done
  for item in "${items[@]}"; do
    read -r t c <<<"$item"
    if printf '*%s\n-X %s\nCOMMIT\n' "$t" "$c" | ipt_restore 2>/dev/null; then
      log "removed iptables chain $t/$c"
    fi
  done
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

# ---------------------------------------------------------------- components

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

write_containerd_config() {
  mkdir -p "$CTRD"/{root,state,runc,opt} "$CTRD/certs.d/docker.io" "$CTRD/certs.d/$REGISTRY" \
    "$CTRD/certs.d/$PRIVATE_REGISTRY" \
    "$CNI_BIN" "$CNI_CONF"
  # Every Debian CNI plugin, by symlink; the agent may add its own shim here.
  local p
  for p in /usr/lib/cni/*; do ln -sfn "$p" "$CNI_BIN/$(basename "$p")"; done
  [[ -f $CNI_TEMPLATE ]] || die "missing CNI template $CNI_TEMPLATE"

  # docker.io never reaches the internet: server and mirror are the local registry. A
  # node in its own netns reaches the registries at the control plane's address
  # (REGISTRY_VIA, PRIVATE_REGISTRY_VIA); images keep their 127.0.0.1 names.
  local via=${REGISTRY_VIA:-$REGISTRY} pvia=${PRIVATE_REGISTRY_VIA:-$PRIVATE_REGISTRY}
  cat >"$CTRD/certs.d/docker.io/hosts.toml" <<EOF
server = "http://$via"

[host."http://$via"]
  capabilities = ["pull", "resolve"]
EOF
  cat >"$CTRD/certs.d/$REGISTRY/hosts.toml" <<EOF
server = "http://$REGISTRY"

[host."http://$via"]
  capabilities = ["pull", "resolve", "push"]
EOF
  # Plain HTTP too; the credentials come with each pull (CRI PullImage's auth).
  cat >"$CTRD/certs.d/$PRIVATE_REGISTRY/hosts.toml" <<EOF
server = "http://$PRIVATE_REGISTRY"

[host."http://$pvia"]
  capabilities = ["pull", "resolve"]
EOF

  cat >"$CTRD/config.toml" <<EOF
version = 2
root = "$CTRD/root"
state = "$CTRD/state"
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = "$CONTAINERD_SOCK"

[plugins."io.containerd.internal.v1.opt"]
  path = "$CTRD/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # No CAP_SYS_RESOURCE here: never lower oom_score_adj (see ENVIRONMENT.md).
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # Sandbox netns under our state dir (not /var/run/netns), so down finds them there.
  netns_mounts_under_state_dir = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$CTRD/runc"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$CNI_CONF"
    conf_template = "$CNI_TEMPLATE"
    max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$CTRD/certs.d"
EOF
}

start_containerd() {
  if [[ -S $CONTAINERD_SOCK ]] && ctr_ version >/dev/null 2>&1; then
    die "another containerd already serves $CONTAINERD_SOCK"
  fi
  [[ -d $RUN_CTRD ]] || echo created >"$REC/run-containerd"
  [[ -d $CNI_VAR ]] || echo created >"$REC/var-lib-cni"
  # Netns present now are not ours; containerd names its own /run/netns/cni-*.
  find /run/netns -maxdepth 1 -name 'cni-*' -printf '%f\n' 2>/dev/null >"$REC/netns-before" || true
  # Per-namespace parent cgroups (/k8s.io, ...) runc makes and never removes: note the present ones.
  findmnt -rn -t cgroup,cgroup2 -o TARGET | while read -r h; do
    find "$h" -mindepth 1 -maxdepth 1 -type d
  done >"$REC/cgroups-before"
  write_containerd_config
  touch "$REC/containerd-started"
  launch_containerd
}

# launch_containerd: containerd with the config `up` wrote; `start` (after a drill's kill)
# runs only this, so the records `down` relies on stay those of `up`.
launch_containerd() {
  # Refuse to fight another containerd on the same socket.
  if [[ -S $CONTAINERD_SOCK ]] && ctr_ version >/dev/null 2>&1; then
    die "another containerd already serves $CONTAINERD_SOCK"
  fi
  start_proc containerd /usr/bin/containerd --config "$CTRD/config.toml"
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

# bootstrap_token: what `kubeadm init` makes for `kubeadm join` (phases bootstraptoken):
# a bootstrap token (Secret bootstrap-token-<id> in kube-system, for authentication and
# signing, in group system:bootstrappers:kubeadm:default-node-token), the RBAC bindings
# that let its holders create node CSRs and have them auto-approved (and let nodes renew
# their own client certificates), and a bootstrap kubeconfig holding the token. The token
# is made once and kept in $PKI/bootstrap-token; applying again changes nothing.
BOOTSTRAP_GROUP="system:bootstrappers:kubeadm:default-node-token"
bootstrap_token() {
  [[ -f $PKI/ca.crt ]] || die "no cluster CA in $PKI: run 'cluster.sh up' first"
  # Tests apply it concurrently: one at a time.
  local lock
  exec {lock}>"$PKI/bootstrap-token.lock"
  flock "$lock"
  if [[ ! -s $PKI/bootstrap-token ]]; then
    install -m 600 /dev/null "$PKI/bootstrap-token"
    printf '%s.%s\n' "$(tr -dc 'a-z0-9' </dev/urandom | head -c 6)" \
      "$(tr -dc 'a-z0-9' </dev/urandom | head -c 16)" >"$PKI/bootstrap-token"
  fi
  local token id secret file="$PKI/bootstrap-kubelet.kubeconfig"
  token=$(<"$PKI/bootstrap-token")
  id=${token%%.*} secret=${token#*.}
  kubectl --kubeconfig "$KUBECONFIG_ADMIN" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Secret
metadata:
  name: bootstrap-token-$id
  namespace: kube-system
type: bootstrap.kubernetes.io/token
stringData:
  description: "The default bootstrap token of the rkubelet cluster (as kubeadm init makes)."
  token-id: "$id"
  token-secret: "$secret"
  usage-bootstrap-authentication: "true"
  usage-bootstrap-signing: "true"
  auth-extra-groups: "$BOOTSTRAP_GROUP"
$(bootstrap_binding kubeadm:kubelet-bootstrap system:node-bootstrapper "$BOOTSTRAP_GROUP")
$(bootstrap_binding kubeadm:node-autoapprove-bootstrap \
    system:certificates.k8s.io:certificatesigningrequests:nodeclient "$BOOTSTRAP_GROUP")
$(bootstrap_binding kubeadm:node-autoapprove-certificate-rotation \
    system:certificates.k8s.io:certificatesigningrequests:selfnodeclient system:nodes)
EOF
  write_kubeconfig "$file" tls-bootstrap-token-user "$APISERVER" "token: $token"
  log "bootstrap token $id (group $BOOTSTRAP_GROUP): $file"
  exec {lock}>&-
}

# bootstrap_binding NAME CLUSTERROLE GROUP: a ClusterRoleBinding document.
bootstrap_binding() {
  cat <<EOF
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: $1
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: $2
subjects:
- kind: Group
  apiGroup: rbac.authorization.k8s.io
  name: $3
EOF
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

# ---------------------------------------------------------------- down

# Kill every task and delete every container in every containerd namespace.
remove_containers() {
  comp_pid "${CTRD_COMP:-containerd}" >/dev/null || return 0
  ctr_ version >/dev/null 2>&1 || return 0
  local ns id
  for ns in $(ctr_ namespaces ls -q 2>/dev/null); do
    for id in $(ctr_ -n "$ns" tasks ls -q 2>/dev/null); do
      ctr_ -n "$ns" tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    echo "$ns" >>"$REC/namespaces"
    # Every container id, before any is removed: a shim that outlives its task (a sandbox
    # whose network teardown failed) is found by it once containerd is gone.
    ctr_ -n "$ns" containers ls -q 2>/dev/null | sed "s|^|$ns |" >>"$REC/containers"
    for id in $(ctr_ -n "$ns" tasks ls -q 2>/dev/null); do
      # CRI may delete a task itself once it exits: only a task still listed is a problem.
      if ! timeout 20 ctr_ -n "$ns" tasks rm -f "$id" >/dev/null 2>&1 &&
        ctr_ -n "$ns" tasks ls -q 2>/dev/null | grep -qxF "$id"; then
        log "warning: could not delete task $ns/$id"
      fi
    done
    for id in $(ctr_ -n "$ns" containers ls -q 2>/dev/null); do
      ctr_ -n "$ns" containers rm "$id" >/dev/null 2>&1 || log "warning: could not delete container $ns/$id"
    done
  done
}

# Shims (and their containers) that outlived containerd. Only processes named by our
# state dir: each task bundle holds init.pid (the container) and `address` (the shim's
# socket); the shim is the process listening there (or init's parent). A candidate
# must really be a containerd shim serving our namespace and socket.
kill_leftover_shims() {
  local dir="$CTRD/state/io.containerd.runtime.v2.task" d id ns pid sock cands
  [[ -d $dir ]] || return 0
  for d in "$dir"/*/*/; do
    [[ -d $d ]] || continue
    id=$(basename "$d")
    ns=$(basename "$(dirname "$d")")
    cands=()
    if [[ -f $d/init.pid ]]; then
      pid=$(<"$d/init.pid")
      if pid_alive "$pid"; then
        cands+=("$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null || true)")
        # The container itself, if its cgroup path names the task id.
        if grep -q "$id" "/proc/$pid/cgroup" 2>/dev/null; then
          log "killing container $ns/$id (pid $pid)"
          kill -KILL "$pid" 2>/dev/null || true
        fi
      fi
    fi
    if [[ -f $d/address ]]; then
      sock=$(sed 's|^unix://||' "$d/address")
      mapfile -t -O "${#cands[@]}" cands < <(ss -Hxlp "src $sock" 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2)
    fi
    for pid in $(printf '%s\n' "${cands[@]}" | sort -u); do
      if is_our_shim "$pid" "$ns"; then stop_pid "shim $ns/$id" "$pid" 5; fi
    done
    remove_task_cgroup "$d/config.json"
  done
}

# Shims with no task left in the state dir: any containerd shim serving our socket for a
# container id our containerd held (recorded by remove_containers), or whose working
# directory is a (deleted) task bundle of our containerd's state dir (a shim whose
# container was removed before the cluster went down).
kill_recorded_shims() {
  local p pid cmd ns id cwd
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [[ $(readlink "$p/exe" 2>/dev/null) == */containerd-shim* ]] || continue
    cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
    [[ $cmd =~ -namespace\ ([^ ]+)\ .*-id\ ([0-9a-f]+)\  ]] || continue
    ns=${BASH_REMATCH[1]} id=${BASH_REMATCH[2]}
    cwd=$(readlink "$p/cwd" 2>/dev/null) || cwd=""
    if { grep -qxF "$ns $id" "$REC/containers" 2>/dev/null ||
      [[ $cwd == "$CTRD/state/io.containerd.runtime.v2.task/$ns/"* ]]; } &&
      is_our_shim "$pid" "$ns"; then
      stop_pid "shim $ns/$id" "$pid" 5
    fi
  done
}

# remove_task_cgroup CONFIG: the cgroup runc made for a container killed without
# `runc delete` (cgroupfs: linux.cgroupsPath in every hierarchy). rmdir only: a cgroup
# that still has tasks or children stays.
remove_task_cgroup() {
  local cfg=$1 cg h i
  [[ -f $cfg ]] || return 0
  cg=$(jq -r '.linux.cgroupsPath // empty' "$cfg" 2>/dev/null || true)
  [[ $cg == /* && $cg != *..* ]] || return 0
  for h in $(findmnt -rn -t cgroup,cgroup2 -o TARGET); do
    [[ -d $h$cg ]] || continue
    for ((i = 0; i < 20; i++)); do
      rmdir "$h$cg" 2>/dev/null && break
      sleep 0.1
    done
  done
}

# is_our_shim PID NS: a containerd-shim* started for namespace NS by our containerd.
is_our_shim() {
  local pid=$1 ns=$2 exe cmd
  pid_alive "$pid" || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [[ $exe == */containerd-shim* ]] || return 1
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline")
  [[ $cmd == *"-namespace $ns "* && $cmd == *"-address $CONTAINERD_SOCK"* ]]
}

# The /<namespace> parent cgroups our containerd's runc made (k8s.io for CRI pods without
# a cgroup parent), and the agents' QoS hierarchy (/kubepods, --cgroups-per-qos), if they
# were not there before and are empty now (rmdir only).
remove_ns_cgroups() {
  [[ -f $REC/cgroups-before ]] || return 0
  local ns h d
  for ns in $(sort -u "$REC/namespaces" 2>/dev/null) k8s.io default kubepods; do
    [[ $ns =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || continue
    for h in $(findmnt -rn -t cgroup,cgroup2 -o TARGET); do
      d="$h/$ns"
      if [[ -d $d ]] && ! grep -qxF "$d" "$REC/cgroups-before"; then
        find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
      fi
    done
  done
}

# Unmount everything under a directory, deepest first.
unmount_under() {
  local root=$1 m
  [[ -d $root ]] || return 0
  findmnt -rn -o TARGET | awk -v r="$root" 'index($0, r "/") == 1 || $0 == r' \
    | awk '{print gsub("/", "/"), $0}' | sort -rn | cut -d' ' -f2- | while IFS= read -r m; do
      m=$(printf '%b' "$m")  # findmnt -r escapes blanks as \x20
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "warning: could not unmount $m"
    done
}

delete_netns() {
  local n=$1
  [[ -e /run/netns/$n ]] || return 0
  ip netns delete "$n" 2>/dev/null || { umount -l "/run/netns/$n" 2>/dev/null; rm -f "/run/netns/$n"; }
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
  # The kind-style nodes (`add-kind-node`), then the nodes of `add-nodes`, each with all
  # it holds.
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

# ---------------------------------------------------------------- nodes as hosts

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

# start-agents [--pod-network-routes MODE] [--network-owner OWNER] [--binary PATH] [-- ARGS]:
# an rkubelet on every added node that has none running (pod networking: agent-owned unless
# said otherwise).
cmd_start_agents() {
  need_root
  local routes=() owner=agent bin="$RKUBELET_REPO/target/debug/rkubelet" extra=() h
  while [[ $# -gt 0 ]]; do
    case $1 in
      --pod-network-routes) routes=(--pod-network-routes "$2"); shift 2 ;;
      --network-owner) owner=$2; shift 2 ;;
      --binary) bin=$2; shift 2 ;;
      --) shift; extra=("$@"); break ;;
      *) die "usage: $0 start-agents [--pod-network-routes none|host-gw|vxlan] [--network-owner agent|runtime] [--binary PATH] [-- ARGS]" ;;
    esac
  done
  [[ -x $bin ]] || die "no agent binary $bin (cargo build)"
  [[ -n $(host_names) ]] || die "no nodes: run 'cluster.sh add-nodes N' first"
  for h in $(host_names); do
    comp_pid "rkubelet@$h" >/dev/null && continue
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

# stop-agent NODE: SIGTERM (SIGKILL after 15 s) its rkubelet, by recorded PID.
cmd_stop_agent() {
  need_root
  local pid
  if [[ -z ${1:-} ]] || ! host_names | grep -qxF "$1"; then
    die "usage: $0 stop-agent NODE (one of: $(host_names | tr '\n' ' '))"
  fi
  pid=$(comp_pid "rkubelet@$1") || die "no agent runs on $1"
  stop_pid "rkubelet@$1" "$pid"
}

# remove_hosts: every added node's processes (agent, kube-proxy, containers, containerd and
# its shims), then its namespace (with it the links, routes, FDB entries, VXLAN devices
# and iptables rules inside), its link, its cgroups and its state.
remove_hosts() {
  local h pid c
  for h in $(host_names); do
    for c in "rkubelet@$h" "kube-proxy@$h"; do
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
    rm -f "$PIDS/"{rkubelet,kube-proxy,containerd}@"$h".{pid,exe}
  done
  rm -f "$REC/hosts"
  # The kind nodes reach the control plane through the same DNAT.
  [[ -n $(kind_nodes) ]] || remove_host_dnat
}

# remove_host_dnat: what setup_host_dnat made.
remove_host_dnat() {
  remove_chains <<<"nat $HOSTS_CHAIN"
  if [[ -e /proc/sys/net/ipv4/conf/$NODE_LINK/route_localnet ]]; then
    sysctl -qw "net.ipv4.conf.$NODE_LINK.route_localnet=0"
  fi
}

# remove_cgroup_tree PATH: a cgroup and everything under it, in every hierarchy, if empty.
remove_cgroup_tree() {
  local h
  for h in $(findmnt -rn -t cgroup,cgroup2 -o TARGET); do
    if [[ -d $h$1 ]]; then find "$h$1" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
}

# ---------------------------------------------------------------- kind-style nodes

# `add-kind-node NAME`: a kind-style node, booted for real: a podman container of the
# kind node image (`image.sh build-kind-node`: systemd as PID 1, containerd + runc, the
# CNI plugins, rkubelet as kubelet.service), in a network namespace of its own on the
# underlay bridge (198.18.0.100 and up /24, reaching the API server and the registries at
# $NODE_IP as the nodes of `add-nodes` do), joined as `kubeadm join` joins a kind worker:
# the files kubeadm writes (KubeletConfiguration, kubeadm-flags.env, the bootstrap token
# kubeconfig, the cluster CA), then `systemctl restart kubelet`, and TLS bootstrap.
KIND_DIR="$RKUBELET_STATE/kind"
KIND_NETNS_PREFIX="rk-kind-"      # the node's network namespace: rk-kind-NAME
KIND_LINK_PREFIX="rkk-"           # the host end of its veth: rkk-<last octet of its IP>
KIND_CGROUP_PREFIX="/rk-kind-"    # its podman cgroup parent (cgroupfs manager): /rk-kind-NAME
KIND_LABEL="org.rkubelet.kind-node"
KIND_NODE_LABEL="rkubelet.io/kind-node=true"

# The node's PID 1: systemd, in the node's own name=systemd tree. For systemd as PID 1 on
# cgroup v1, podman stacks the whole name=systemd hierarchy, from the machine's root
# (`/../..`), over the node's own view of it (its cgroup namespace's): the node's systemd
# then ran its units, and a cgroupfs node's rkubelet its pod cgroups, in the machine's
# root, shared with the host's agent and every other kind node (whose orphan clean-ups
# took each other's pod cgroups), and left them there. That top mount goes first; a node
# where it cannot does not boot (add-kind-node fails and removes it).
KIND_INIT=$(
  cat <<'EOS'
m=/sys/fs/cgroup/systemd
if awk -v m="$m" '$5 == m { root = $4 } END { exit !(root != "" && root != "/") }' /proc/self/mountinfo; then
  umount "$m/release_agent" 2>/dev/null || true
  umount "$m" || { echo "kind node init: cannot unmount $m" >&2; exit 1; }
fi
exec /lib/systemd/systemd
EOS
)

kind_nodes() { [[ -f $REC/kind-nodes ]] && awk '{print $1}' "$REC/kind-nodes"; return 0; }
kind_ip() { awk -v n="$1" '$1 == n {print $2}' "$REC/kind-nodes" 2>/dev/null; }

# The cgroup manager podman uses for the nodes: systemd's where systemd runs the machine
# (the node's cgroup is then machine.slice/libpod-<id>.scope), else cgroupfs (the node's
# cgroup is $KIND_CGROUP_PREFIX<name>/libpod-<id>, conmon's .../conmon).
kind_cgroup_manager() { if [[ -d /run/systemd/system ]]; then echo systemd; else echo cgroupfs; fi; }

# podman_ ARGS: podman as the scripts run it: a network config dir of its own (podman
# would make /etc/cni/net.d and its default network there), events in a file (no journald
# here), the cgroup manager above.
podman_() {
  mkdir -p "$KIND_DIR/podman-net"
  podman --cgroup-manager="$(kind_cgroup_manager)" --events-backend=file \
    --network-config-dir="$KIND_DIR/podman-net" "$@"
}

# ensure_podman: Debian's podman, installed if missing, with /etc/cni as it was.
ensure_podman() {
  command -v podman >/dev/null && return 0
  local before
  before=$(cni_dirs)
  log "installing Debian's podman"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman >/dev/null
  restore_cni_dir "$before"
}

# kind_container_exists NAME: podman holds a container NAME that is a kind node of ours.
kind_container_exists() {
  command -v podman >/dev/null || return 1
  [[ -n $(podman_ ps -a --quiet --filter "label=$KIND_LABEL=$1" 2>/dev/null) ]]
}

# kind_node_exec NAME CMD...: CMD inside the node (its systemd's namespaces).
kind_node_exec() { podman_ exec "$@"; }

# kind_node_write NAME PATH MODE < TEXT: a file in the node, as kubeadm writes it.
kind_node_write() {
  # shellcheck disable=SC2016  # the node's shell expands them
  podman_ exec -i "$1" sh -ec 'mkdir -p "$(dirname "$1")"; cat >"$1.tmp"; chmod "$2" "$1.tmp"; mv "$1.tmp" "$1"' \
    sh "$2" "$3"
}

# kind_kubelet_config DRIVER: the KubeletConfiguration kubeadm v1.20 renders for a kind
# worker (its zero durations, kind's eviction thresholds that disable disk eviction), with
# the cgroup driver of the node's containerd.
kind_kubelet_config() {
  cat <<EOC
apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: $1
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
cpuManagerReconcilePeriod: 0s
evictionHard:
  imagefs.available: 0%
  nodefs.available: 0%
  nodefs.inodesFree: 0%
evictionPressureTransitionPeriod: 0s
failSwapOn: false
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageGCHighThresholdPercent: 100
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
rotateCertificates: true
runtimeRequestTimeout: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
EOC
}

kind_node_ready() {
  [[ $(kubectl --kubeconfig "$KUBECONFIG_ADMIN" get node "$1" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

kind_node_booted() {
  local state
  state=$(podman_ exec "$1" systemctl is-system-running 2>/dev/null) || true
  [[ $state == running || $state == degraded ]]
}

# add-kind-node NAME [--cgroup-driver cgroupfs|systemd] [--binary PATH] [--image NAME]
cmd_add_kind_node() {
  need_root
  local name=${1:-} driver=${RKUBELET_KIND_CGROUP_DRIVER:-systemd} bin=${RKUBELET_BINARY:-}
  local image=${RKUBELET_KIND_IMAGE:-} usage
  usage="usage: $0 add-kind-node NAME [--cgroup-driver cgroupfs|systemd] [--binary PATH] [--image IMAGE]"
  [[ -n $name ]] || die "$usage"
  shift
  while [[ $# -gt 0 ]]; do
    case $1 in
      --cgroup-driver) driver=${2:-}; shift 2 ;;
      --binary) bin=${2:-}; shift 2 ;;
      --image) image=${2:-}; shift 2 ;;
      *) die "$usage" ;;
    esac
  done
  [[ $driver == cgroupfs || $driver == systemd ]] || die "$usage"
  [[ $name =~ ^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$ ]] || die "bad node name: $name (a DNS label of at most 40 characters)"
  comp_pid kube-apiserver >/dev/null || die "the cluster is not up: run 'cluster.sh up'"
  if kind_nodes | grep -qxF "$name"; then die "kind node $name already exists"; fi
  [[ -z ${bin:-} ]] && bin="$RKUBELET_REPO/target/debug/rkubelet"
  [[ -x $bin ]] || die "no rkubelet binary $bin (--binary PATH or RKUBELET_BINARY)"
  ensure_podman
  if podman_ container exists "$name"; then die "a podman container $name already exists"; fi
  local t0=$SECONDS version ip octet netns link dir
  version=$("$bin" --version)
  image=${image:-localhost/rkubelet-kind-node:${version##*rkubelet-}}
  RKUBELET_BINARY=$bin RKUBELET_KIND_IMAGE=$image nice bash "$RKUBELET_REPO/scripts/image.sh" build-kind-node
  local built=$SECONDS
  # Its address: the first free one from 198.18.0.100.
  for ((octet = 100; octet < 200; octet++)); do
    ip="198.18.0.$octet"
    awk -v ip="$ip" '$2 == ip {found = 1} END {exit !found}' "$REC/kind-nodes" 2>/dev/null || break
  done
  ((octet < 200)) || die "no free address for a kind node"
  netns="$KIND_NETNS_PREFIX$name" link="$KIND_LINK_PREFIX$octet" dir="$KIND_DIR/$name"
  # Recorded first: a node that fails half-way is removed like any other.
  echo "$name $ip" >>"$REC/kind-nodes"
  local rc
  set +e
  (add_kind_node "$name" "$ip" "$netns" "$link" "$dir" "$driver" "$image")
  rc=$?
  set -e
  if ((rc != 0)); then
    log "kind node $name failed: removing it"
    kind_node_logs "$name" >&2 || true
    remove_kind_node "$name"
    die "kind node $name could not join"
  fi
  log "kind node $name ($ip, cgroup driver $driver) Ready: image $((built - t0)) s, boot to Ready $((SECONDS - built)) s"
}

# add_kind_node NAME IP NETNS LINK DIR DRIVER IMAGE (in a subshell not tested by `if` or
# `||`, so that `set -e` ends it at the first failure).
add_kind_node() {
  set -e
  local name=$1 ip=$2 netns=$3 link=$4 dir=$5 driver=$6 image=$7 systemd_cgroup=false
  [[ $driver == systemd ]] && systemd_cgroup=true
  log "kind node $name: netns $netns, $ip/24 on $NODE_LINK ($link)"
  mkdir -p "$dir/containerd"
  [[ -d /run/netns ]] || echo created >"$REC/run-netns"
  ip netns add "$netns"
  ip link add "$link" type veth peer name eth0 netns "$netns"
  ip link set "$link" master "$NODE_LINK" up
  ip -n "$netns" addr add "$ip/24" dev eth0
  ip -n "$netns" link set lo up
  ip -n "$netns" link set eth0 up
  # Pods reach the control plane from the node's address (the control plane has no route
  # to the node's pods); nothing else leaves: the namespace has no default route.
  ip netns exec "$netns" iptables -w 5 -t nat -A POSTROUTING -s "$CLUSTER_CIDR" -d "$NODE_IP/32" -j MASQUERADE
  setup_host_dnat
  # The node as kind starts it: privileged, systemd as PID 1 with a cgroup namespace of
  # its own (runc inside mounts the node's cgroups, not the host's), containerd's root on
  # the host's file system (no overlayfs on overlayfs), no name server, its own hostname.
  local cgroup_parent=()
  [[ $(kind_cgroup_manager) == systemd ]] || cgroup_parent=(--cgroup-parent "$KIND_CGROUP_PREFIX$name")
  podman_ create --name "$name" --label "$KIND_LABEL=$name" \
    --privileged --systemd=always --cgroupns=private "${cgroup_parent[@]}" \
    --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
    --network "ns:/run/netns/$netns" --dns=none --no-hosts --hostname "$name" \
    --volume "$dir/containerd:/var/lib/containerd" \
    "$image" sh -c "$KIND_INIT" >/dev/null
  # Before it boots: its /etc/hosts, and containerd's cgroup driver.
  printf '127.0.0.1\tlocalhost\n%s\t%s\n' "$ip" "$name" >"$dir/hosts"
  podman_ cp "$dir/hosts" "$name:/etc/hosts"
  podman_ cp "$name:/etc/containerd/config.toml" "$dir/containerd-config.toml"
  sed -i "s/^\([[:space:]]*SystemdCgroup = \).*/\1$systemd_cgroup/" "$dir/containerd-config.toml"
  podman_ cp "$dir/containerd-config.toml" "$name:/etc/containerd/config.toml"
  podman_ start "$name" >/dev/null
  local deadline=$((SECONDS + 90))
  until kind_node_booted "$name"; do
    ((SECONDS < deadline)) || { log "kind node $name: systemd did not finish booting"; return 1; }
    sleep 0.5
  done
  until kind_node_exec "$name" ctr version >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { log "kind node $name: containerd does not answer"; return 1; }
    sleep 0.5
  done
  log "kind node $name: systemd running, containerd up"
  # What `kubeadm join` writes on a kind worker, then its `systemctl restart kubelet`.
  bootstrap_token >/dev/null
  write_kubeconfig "$dir/bootstrap-kubelet.conf" tls-bootstrap-token-user "$HOST_SERVER" \
    "token: $(<"$PKI/bootstrap-token")"
  kind_node_write "$name" /etc/kubernetes/pki/ca.crt 0644 <"$PKI/ca.crt"
  kind_node_write "$name" /etc/kubernetes/bootstrap-kubelet.conf 0600 <"$dir/bootstrap-kubelet.conf"
  kind_kubelet_config "$driver" | kind_node_write "$name" /var/lib/kubelet/config.yaml 0644
  # kubeadm's flags for this node, and (as kind's kubeletExtraArgs) rkubelet's own:
  # containerd owns pod networking here, as on a kind node.
  echo "KUBELET_KUBEADM_ARGS=\"--container-runtime=remote --container-runtime-endpoint=unix:///run/containerd/containerd.sock --fail-swap-on=false --node-ip=$ip --node-labels=$KIND_NODE_LABEL --provider-id=kind://podman/kind/$name --network-owner=runtime\"" |
    kind_node_write "$name" /var/lib/kubelet/kubeadm-flags.env 0644
  kind_node_exec "$name" mkdir -p /etc/kubernetes/manifests
  # A Node of this name left from an earlier kind node would pass the wait for Ready below
  # before this node's agent registered: the new node registers afresh.
  kubectl --kubeconfig "$KUBECONFIG_ADMIN" delete node "$name" --ignore-not-found >/dev/null
  kind_node_exec "$name" systemctl restart kubelet
  deadline=$((SECONDS + 180))
  until kind_node_ready "$name"; do
    ((SECONDS < deadline)) || { log "kind node $name: not Ready after 180 s"; return 1; }
    sleep 0.5
  done
}

# kind_node_logs NAME: the last lines of the node's kubelet and containerd journals.
kind_node_logs() {
  local u
  for u in kubelet containerd; do
    echo "---- kind node $1: journalctl -u $u (last 30 lines) ----"
    podman_ exec "$1" journalctl -u "$u" --no-pager -n 30 2>&1 || true
  done
}

# remove_kind_node NAME: its Node, its container (systemd halts it: kubelet, containerd and
# every pod go with its PID namespace), its cgroups, its namespace and link, its files.
remove_kind_node() {
  local name=$1 ip octet netns id
  ip=$(kind_ip "$name")
  octet=${ip##*.}
  netns="$KIND_NETNS_PREFIX$name"
  if comp_pid kube-apiserver >/dev/null; then
    kubectl --kubeconfig "$KUBECONFIG_ADMIN" delete node "$name" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
  if kind_container_exists "$name"; then
    id=$(podman_ inspect --format '{{.Id}}' "$name" 2>/dev/null || true)
    log "removing kind node $name (container ${id:0:12})"
    podman_ stop --time 30 "$name" >/dev/null 2>&1 || true
    podman_ rm --force --time 10 "$name" >/dev/null 2>&1 || log "warning: podman rm $name failed"
  fi
  remove_cgroup_tree "$KIND_CGROUP_PREFIX$name"
  [[ -z $octet ]] || ip link delete "$KIND_LINK_PREFIX$octet" 2>/dev/null || true
  delete_netns "$netns"
  unmount_under "$KIND_DIR/$name"
  rm -rf "${KIND_DIR:?}/$name"
  if [[ -f $REC/kind-nodes ]]; then
    awk -v n="$name" '$1 != n' "$REC/kind-nodes" >"$REC/kind-nodes.new"
    mv "$REC/kind-nodes.new" "$REC/kind-nodes"
    [[ -s $REC/kind-nodes ]] || rm -f "$REC/kind-nodes"
  fi
  [[ -n $(kind_nodes) || -n $(host_names) ]] || remove_host_dnat
}

# remove_kind_nodes: every recorded kind node, and any container of ours left unrecorded.
remove_kind_nodes() {
  local n
  for n in $(kind_nodes); do remove_kind_node "$n"; done
  if command -v podman >/dev/null; then
    for n in $(podman_ ps -a --filter "label=$KIND_LABEL" --format '{{.Names}}' 2>/dev/null); do
      remove_kind_node "$n"
    done
  fi
  rm -rf "${KIND_DIR:?}"
}

cmd_remove_kind_node() {
  need_root
  [[ -n ${1:-} ]] || die "usage: $0 remove-kind-node NAME"
  if ! kind_nodes | grep -qxF "$1" && ! kind_container_exists "$1"; then
    die "no kind node $1 (kind nodes: $(kind_nodes | tr '\n' ' '))"
  fi
  remove_kind_node "$1"
}

# kind_leaks: what of the kind nodes survived (leak-check): containers with our label,
# processes in their cgroups (conmon, the node's systemd and all below it), their
# cgroups, namespaces and links.
kind_leaks() {
  local netcfg
  if command -v podman >/dev/null; then
    # (Any podman command makes /etc/cni/net.d unless given a network config dir.)
    netcfg=$(mktemp -d)
    podman --network-config-dir "$netcfg" ps -a --filter "label=$KIND_LABEL" \
      --format 'kind node container {{.Names}} ({{.ID}}, {{.Status}})' 2>/dev/null || true
    rm -rf "$netcfg"
  fi
  grep -l "${KIND_CGROUP_PREFIX}[^/]*/" /proc/[0-9]*/cgroup 2>/dev/null | cut -d/ -f3 |
    while read -r pid; do echo "process $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) (kind node cgroup)"; done
  find /sys/fs/cgroup/ /sys/fs/cgroup/*/ -maxdepth 1 -type d -name "${KIND_CGROUP_PREFIX#/}*" \
    -printf 'kind node cgroup %p\n' 2>/dev/null || true
  # Where systemd does not run this machine, a unit's cgroup at the root of the name=systemd
  # hierarchy was made by a kind node's systemd outside its own tree.
  if [[ $(kind_cgroup_manager) == cgroupfs && -d /sys/fs/cgroup/systemd ]]; then
    find /sys/fs/cgroup/systemd/ -mindepth 1 -maxdepth 1 -type d \
      \( -name '*.scope' -o -name '*.slice' -o -name '*.mount' -o -name '*.service' \) \
      -printf 'systemd unit cgroup %p (made by a kind node systemd outside its tree)\n' 2>/dev/null || true
  fi
  find /run/netns -maxdepth 1 -name "$KIND_NETNS_PREFIX*" -printf 'netns %p\n' 2>/dev/null || true
  ip -o link show 2>/dev/null | awk -F': ' -v p="$KIND_LINK_PREFIX" 'index($2, p) == 1 {print "link " $2}' | cut -d@ -f1
}

# ---------------------------------------------------------------- leak check

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

# ---------------------------------------------------------------- drills

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

# ---------------------------------------------------------------- status

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

# ---------------------------------------------------------------- main

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  add-nodes) cmd_add_nodes "${2:-}" ;;
  remove-nodes) need_root; remove_hosts ;;
  add-kind-node) shift; cmd_add_kind_node "$@" ;;
  remove-kind-node) cmd_remove_kind_node "${2:-}" ;;
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
    echo "usage: $0 {up [--nodes N]|down|status|leak-check|node-credentials NAME [IP]|bootstrap-token|start-agent BINARY [ARGS...]|kill|stop|start COMPONENT|add-nodes N|remove-nodes|add-kind-node NAME [...]|remove-kind-node NAME|start-agents [--pod-network-routes MODE] [--binary PATH]|stop-agent NODE}" >&2
    exit 2
    ;;
esac
