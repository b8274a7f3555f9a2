# shellcheck shell=bash
# Kind-style nodes (`add-kind-node`, `remove-kind-node`): a podman container booting
# systemd, containerd and rkubelet as kubelet.service, joined with kubeadm's files.
# Sourced by scripts/cluster.sh.

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
# where it cannot does not boot (add-kind-node fails and removes it). Then, as kind's
# entrypoint does (systemd does it only outside a container), the root file system is made
# rshared: /var/lib/kubelet is then on a shared mount, which the kubelet would otherwise
# make by bind-mounting it onto itself at its start, hiding the volumes already mounted
# under it (a node handed from rkubelet to the kubelet, docs/packaging.md).
KIND_INIT=$(
  cat <<'EOS'
m=/sys/fs/cgroup/systemd
if awk -v m="$m" '$5 == m { root = $4 } END { exit !(root != "" && root != "/") }' /proc/self/mountinfo; then
  umount "$m/release_agent" 2>/dev/null || true
  umount "$m" || { echo "kind node init: cannot unmount $m" >&2; exit 1; }
fi
mount --make-rshared / || { echo "kind node init: cannot make / rshared" >&2; exit 1; }
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
# worker: kubeadm's (kubeadm.sh) with kind's settings, eviction thresholds that disable
# disk eviction and no image garbage collection, swap allowed.
kind_kubelet_config() {
  kubeadm_kubelet_config "$1"
  cat <<EOC
evictionHard:
  imagefs.available: 0%
  nodefs.available: 0%
  nodefs.inodesFree: 0%
failSwapOn: false
imageGCHighThresholdPercent: 100
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
  [[ -n ${bin:-} ]] || bin="$RKUBELET_REPO/target/debug/rkubelet"
  node_join_checks kind "$name" "$driver" "$bin"
  ensure_podman
  if podman_ container exists "$name"; then die "a podman container $name already exists"; fi
  local t0=$SECONDS version ip octet netns link dir
  version=$("$bin" --version)
  image=${image:-localhost/rkubelet-kind-node:${version##*rkubelet-}}
  RKUBELET_BINARY=$bin RKUBELET_KIND_IMAGE=$image nice bash "$RKUBELET_REPO/scripts/image.sh" build-kind-node
  local built=$SECONDS
  # Its address: the first free one from 198.18.0.100.
  ip=$(record_node_address kind "$name" 100 200)
  octet=${ip##*.}
  netns="$KIND_NETNS_PREFIX$name" link="$KIND_LINK_PREFIX$octet" dir="$KIND_DIR/$name"
  join_or_remove kind "$name" add_kind_node kind_node_logs remove_kind_node \
    "$name" "$ip" "$netns" "$link" "$dir" "$driver" "$image"
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
  # kubeadm's flags for this node; rkubelet's own setting in the environment file its unit
  # and the kubelet's read (the kubelet ignores it, so either agent can run with these
  # files): containerd owns pod networking here, as on a kind node.
  echo "KUBELET_KUBEADM_ARGS=\"--container-runtime=remote --container-runtime-endpoint=unix:///run/containerd/containerd.sock --fail-swap-on=false --node-ip=$ip --node-labels=$KIND_NODE_LABEL --provider-id=kind://podman/kind/$name\"" |
    kind_node_write "$name" /var/lib/kubelet/kubeadm-flags.env 0644
  echo "RKUBELET_NETWORK_OWNER=runtime" | kind_node_write "$name" /etc/default/kubelet 0644
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
  forget_node kind "$name"
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
