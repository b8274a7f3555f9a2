# shellcheck shell=bash disable=SC2034  # sourced: the variables are used by the other parts
# The cluster scripts' vocabulary: the state layout, the names of what `up` makes, and
# the helpers every part uses (processes by recorded PID, iptables chains, netns, mounts,
# cgroups). Sourced by scripts/cluster.sh; not run on its own.

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

# remove_cgroup_tree PATH: a cgroup and everything under it, in every hierarchy, if empty.
remove_cgroup_tree() {
  local h
  for h in $(findmnt -rn -t cgroup,cgroup2 -o TARGET); do
    if [[ -d $h$1 ]]; then find "$h$1" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
}
