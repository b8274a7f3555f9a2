# shellcheck shell=bash
# VM nodes (`add-vm-node`, `vm-exec`, `remove-vm-node`): a Debian 12 virtual machine on
# cgroup v2, booted by Debian's qemu (software emulation), with systemd, containerd and
# rkubelet as its kubelet.service, joined with kubeadm's files.
# Sourced by scripts/cluster.sh.

# `add-vm-node NAME`: the VM image (`image.sh build-vm-node`: disk, kernel, initramfs;
# cached) gets the rkubelet binary written into a copy of its disk (debugfs: nothing is
# mounted); qemu boots it with the node's address on its kernel command line, on a tap
# device of the underlay bridge (198.18.0.200 and up /24, the API server and registries at
# $NODE_IP as for the other nodes, no default route: nothing leaves the machine). Once SSH
# answers, the node joins as `kubeadm join` joins a worker: the files kubeadm writes
# (kubeadm.sh), then `systemctl restart kubelet`, and TLS bootstrap. Its rkubelet keeps
# host-gw routes to the other nodes' pods (and theirs to its own), as the nodes of
# `add-nodes` do with `start-agents --pod-network-routes host-gw`.
VM_DIR="$RKUBELET_STATE/vm"
VM_TAP_PREFIX="rkv-"              # the node's tap device: rkv-<last octet of its IP>
VM_NODE_LABEL="rkubelet.io/vm-node=true"
VM_MEMORY_MIB=2048
VM_CPUS=2
VM_BOOT_TIMEOUT=300               # seconds from qemu's start until SSH answers
VM_READY_TIMEOUT=300              # seconds from the join until the Node is Ready

vm_nodes() { [[ -f $REC/vm-nodes ]] && awk '{print $1}' "$REC/vm-nodes"; return 0; }
vm_ip() { awk -v n="$1" '$1 == n {print $2}' "$REC/vm-nodes" 2>/dev/null; }

# vm_ssh_opts NAME: ssh's options for the node: its address (never a name to look up),
# the scripts' key, the image's host key (checked), the node's control socket (one
# connection, many sessions: a new SSH connection costs seconds of emulated CPU), no user
# configuration. (ssh takes an option's first value: overrides go before these.)
vm_ssh_opts() {
  local keys="$VM_IMAGE_DIR/ssh"
  printf '%s\n' -F /dev/null -i "$keys/id_ed25519" -o IdentitiesOnly=yes \
    -o HostName="$(vm_ip "$1")" -o HostKeyAlias="$VM_HOST_KEY_ALIAS" \
    -o UserKnownHostsFile="$keys/known_hosts" -o StrictHostKeyChecking=yes -o BatchMode=yes \
    -o LogLevel=ERROR -o ConnectTimeout=10 -o ServerAliveInterval=5 -o ServerAliveCountMax=3 \
    -o ControlPath="$VM_DIR/$1/ssh.sock"
}

# vm_ssh_master NAME: the node's SSH connection, started (by recorded PID, as ssh@NAME)
# unless it runs; a reboot of the node ends it, the next command starts it again.
vm_ssh_master() {
  local name=$1 opts lock i pid
  [[ -n $(vm_ip "$name") ]] || die "no VM node $name"
  mapfile -t opts < <(vm_ssh_opts "$name")
  ssh "${opts[@]}" -O check "root@$name" >/dev/null 2>&1 && return 0
  exec {lock}>"$VM_DIR/$name/ssh.lock"
  flock "$lock"
  if ! ssh "${opts[@]}" -O check "root@$name" >/dev/null 2>&1; then
    if pid=$(comp_pid "ssh@$name"); then stop_pid "ssh@$name" "$pid" 5; fi
    rm -f "$VM_DIR/$name/ssh.sock"
    start_proc "ssh@$name" /usr/bin/ssh -o ControlMaster=yes "${opts[@]}" -N "root@$name"
    for ((i = 0; i < 150; i++)); do
      ssh "${opts[@]}" -O check "root@$name" >/dev/null 2>&1 && break
      comp_pid "ssh@$name" >/dev/null || break
      sleep 0.1
    done
  fi
  exec {lock}>&-
  ssh "${opts[@]}" -O check "root@$name" >/dev/null 2>&1
}

# vm_ssh NAME CMD...: CMD inside the node, as root, through its SSH connection.
vm_ssh() {
  local name=$1 opts
  shift
  vm_ssh_master "$name" || return 255
  mapfile -t opts < <(vm_ssh_opts "$name")
  ssh -o ControlMaster=no "${opts[@]}" "root@$name" "$@"
}

# vm_ssh_answers NAME: one SSH login to the node succeeds, without its control socket
# (its boot reached sshd).
vm_ssh_answers() {
  local opts
  mapfile -t opts < <(vm_ssh_opts "$1")
  ssh -o ControlPath=none -o ConnectTimeout=5 "${opts[@]}" "root@$1" true >/dev/null 2>&1
}

vm_node_ready() {
  [[ $(kubectl --kubeconfig "$KUBECONFIG_ADMIN" get node "$1" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

# add-vm-node NAME [--cgroup-driver cgroupfs|systemd] [--binary PATH]
cmd_add_vm_node() {
  need_root
  local name=${1:-} driver=systemd bin=${RKUBELET_BINARY:-} usage
  usage="usage: $0 add-vm-node NAME [--cgroup-driver cgroupfs|systemd] [--binary PATH]"
  [[ -n $name ]] || die "$usage"
  shift
  while [[ $# -gt 0 ]]; do
    case $1 in
      --cgroup-driver) driver=${2:-}; shift 2 ;;
      --binary) bin=${2:-}; shift 2 ;;
      *) die "$usage" ;;
    esac
  done
  [[ -n ${bin:-} ]] || bin="$RKUBELET_REPO/target/debug/rkubelet"
  node_join_checks vm "$name" "$driver" "$bin"
  command -v qemu-system-x86_64 >/dev/null || die "qemu is needed (apt-get install qemu-system-x86)"
  local t0=$SECONDS ip
  nice bash "$RKUBELET_REPO/scripts/image.sh" build-vm-node
  # Its address: the first free one from 198.18.0.200.
  ip=$(record_node_address vm "$name" 200 250)
  join_or_remove vm "$name" add_vm_node vm_node_logs remove_vm_node \
    "$name" "$ip" "$driver" "$bin" "$((SECONDS - t0))"
}

# add_vm_node NAME IP DRIVER BINARY IMAGE_SECONDS (join_or_remove runs it).
add_vm_node() {
  set -e
  local name=$1 ip=$2 driver=$3 bin=$4 image_s=$5 dir="$VM_DIR/$1" tap="$VM_TAP_PREFIX${2##*.}"
  local t0=$SECONDS booted
  log "VM node $name: $ip/24 on $NODE_LINK ($tap), $VM_CPUS CPUs, $VM_MEMORY_MIB MiB"
  mkdir -p "$dir"
  # The node's disk: the image's, with the binary under test as /usr/bin/rkubelet (the
  # kubelet package's place).
  cp --sparse=always "$VM_IMAGE_DIR/disk.img" "$dir/disk.img"
  debugfs -w -R "write $bin /usr/bin/rkubelet" "$dir/disk.img" >/dev/null 2>&1
  debugfs -R "stat /usr/bin/rkubelet" "$dir/disk.img" 2>/dev/null | grep -q 'Type: regular' ||
    { log "VM node $name: could not write rkubelet into its disk"; return 1; }
  ip tuntap add dev "$tap" mode tap
  ip link set "$tap" master "$NODE_LINK" up
  setup_host_dnat
  # Software emulation (KVM hangs here), both CPUs; `systemctl reboot` inside reboots
  # the machine, `poweroff` ends qemu. The kernel's command line sets the node's address
  # (systemd-network-generator), its hostname, and reserves 2 MiB huge pages for pods.
  start_proc "qemu@$name" /usr/bin/qemu-system-x86_64 -name "$name" \
    -accel tcg,thread=multi -cpu max -smp "$VM_CPUS" -m "$VM_MEMORY_MIB" \
    -kernel "$VM_IMAGE_DIR/vmlinuz" -initrd "$VM_IMAGE_DIR/initrd.img" \
    -append "console=ttyS0 root=/dev/vda rw quiet net.ifnames=0 ip=$ip:::255.255.255.0::eth0:off systemd.hostname=$name hugepages=16" \
    -drive "file=$dir/disk.img,format=raw,if=virtio,cache=unsafe" \
    -nic "tap,ifname=$tap,script=no,downscript=no,model=virtio-net-pci" \
    -serial "file:$dir/console.log" -monitor none -display none -nodefaults
  local deadline=$((SECONDS + VM_BOOT_TIMEOUT))
  until vm_ssh_answers "$name"; do
    comp_pid "qemu@$name" >/dev/null || { log "VM node $name: qemu exited"; return 1; }
    ((SECONDS < deadline)) || { log "VM node $name: no SSH after ${VM_BOOT_TIMEOUT} s"; return 1; }
    sleep 1
  done
  booted=$SECONDS
  log "VM node $name: SSH answers $((booted - t0)) s after qemu started"
  vm_join "$name" "$ip" "$driver"
  deadline=$((SECONDS + VM_READY_TIMEOUT))
  until vm_node_ready "$name"; do
    ((SECONDS < deadline)) || { log "VM node $name: not Ready after ${VM_READY_TIMEOUT} s"; return 1; }
    sleep 1
  done
  printf 'image %s\nboot %s\njoin %s\n' "$image_s" "$((booted - t0))" "$((SECONDS - booted))" >"$dir/took"
  log "VM node $name ($ip, cgroup driver $driver) Ready: image ${image_s} s, boot to SSH $((booted - t0)) s," \
    "join to Ready $((SECONDS - booted)) s"
}

# vm_join NAME IP DRIVER: what `kubeadm join` writes (kubeadm.sh), with the node's own
# flags as kubeletExtraArgs put them in kubeadm-flags.env (containerd owns pod
# networking, as on a kind node; host-gw routes to the other nodes' pods), and what the
# machine's set-up adds: its hostname and hosts file, the address translation that lets
# its pods reach the control plane (which has no route to them), and containerd's cgroup
# driver; then `systemctl restart kubelet`.
vm_join() {
  local name=$1 ip=$2 driver=$3 files="$VM_DIR/$1/join" systemd_cgroup=false
  [[ $driver == systemd ]] && systemd_cgroup=true
  rm -rf "$files"
  kubeadm_join_files "$files" "$(kubeadm_kubelet_config "$driver")" \
    "--container-runtime=remote --container-runtime-endpoint=unix:///run/containerd/containerd.sock --node-ip=$ip --node-labels=$VM_NODE_LABEL --network-owner=runtime --pod-network-routes=host-gw"
  echo "$name" >"$files/etc/hostname"
  printf '127.0.0.1\tlocalhost\n%s\t%s\n' "$ip" "$name" >"$files/etc/hosts"
  install -d "$files/etc/systemd/system"
  cat >"$files/etc/systemd/system/rk-underlay-nat.service" <<EOF
# Pods reach the local cluster's control plane at $NODE_IP from the node's address: the
# control plane has no route to the nodes' pods.
[Unit]
Description=Pod traffic to the control plane from the node's address
Before=kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'iptables -w 5 -t nat -C POSTROUTING -s $CLUSTER_CIDR -d $NODE_IP/32 -j MASQUERADE 2>/dev/null || iptables -w 5 -t nat -A POSTROUTING -s $CLUSTER_CIDR -d $NODE_IP/32 -j MASQUERADE'

[Install]
WantedBy=multi-user.target
EOF
  # A Node of this name left from an earlier VM would pass the wait for Ready before this
  # node's agent registered: the new node registers afresh.
  kubectl --kubeconfig "$KUBECONFIG_ADMIN" delete node "$name" --ignore-not-found >/dev/null
  tar --create --directory="$files" --owner=0 --group=0 --numeric-owner . |
    vm_ssh "$name" "set -e
      tar --extract --directory=/ --no-overwrite-dir
      hostname $name
      sed -i 's/^\([[:space:]]*SystemdCgroup = \).*/\1$systemd_cgroup/' /etc/containerd/config.toml
      systemctl daemon-reload
      systemctl enable --now rk-underlay-nat.service 2>/dev/null
      systemctl restart containerd
      systemctl restart kubelet"
}

# vm_node_logs NAME: the last lines of the node's kubelet and containerd journals, or of
# its console when it cannot be reached.
vm_node_logs() {
  local u
  if vm_ssh_answers "$1"; then
    for u in kubelet containerd; do
      echo "---- VM node $1: journalctl -u $u (last 30 lines) ----"
      vm_ssh "$1" journalctl -u "$u" --no-pager -n 30 2>&1 || true
    done
  else
    echo "---- VM node $1: console (last 30 lines) ----"
    tail -n 30 "$VM_DIR/$1/console.log" 2>/dev/null || true
  fi
}

# remove_vm_node NAME: its Node, its SSH connection, its qemu (the machine is switched
# off: everything in it goes), its tap device and its files (the disk).
remove_vm_node() {
  local name=$1 ip pid
  ip=$(vm_ip "$name")
  if comp_pid kube-apiserver >/dev/null; then
    kubectl --kubeconfig "$KUBECONFIG_ADMIN" delete node "$name" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
  if pid=$(comp_pid "ssh@$name"); then stop_pid "ssh@$name" "$pid" 5; fi
  if pid=$(comp_pid "qemu@$name"); then
    log "removing VM node $name (qemu pid $pid)"
    stop_pid "qemu@$name" "$pid" 15
  fi
  [[ -z $ip ]] || ip link delete "$VM_TAP_PREFIX${ip##*.}" 2>/dev/null || true
  rm -f "$PIDS/qemu@$name".{pid,exe} "$PIDS/ssh@$name".{pid,exe}
  rm -rf "${VM_DIR:?}/$name"
  forget_node vm "$name"
}

# remove_vm_nodes: every recorded VM node, and any tap device of ours left unrecorded.
remove_vm_nodes() {
  local n l
  for n in $(vm_nodes); do remove_vm_node "$n"; done
  for l in $(vm_taps); do ip link delete "$l" 2>/dev/null || true; done
  rm -rf "${VM_DIR:?}"
}

cmd_remove_vm_node() {
  need_root
  [[ -n ${1:-} ]] || die "usage: $0 remove-vm-node NAME"
  vm_nodes | grep -qxF "$1" || die "no VM node $1 (VM nodes: $(vm_nodes | tr '\n' ' '))"
  remove_vm_node "$1"
}

cmd_vm_exec() {
  need_root
  [[ -n ${1:-} && -n ${2:-} ]] || die "usage: $0 vm-exec NAME COMMAND [ARG...]"
  vm_nodes | grep -qxF "$1" || die "no VM node $1"
  vm_ssh "$@"
}

vm_taps() { ip -o link show 2>/dev/null | awk -F': ' -v p="$VM_TAP_PREFIX" 'index($2, p) == 1 {print $2}' | cut -d@ -f1; }

# vm_leaks: what of the VM nodes survived (leak-check): their tap devices. Their qemu and
# SSH processes name the state dir (their disk, their socket), which list_leaks finds.
vm_leaks() {
  vm_taps | sed 's/^/VM node tap /'
}
