# shellcheck shell=bash
# A containerd of the cluster (the control plane's node, or a node of `add-nodes` through
# use_host): its config (CRI, CNI, registry mirrors to the local registries), its start,
# and its removal: every task and container, shims that outlived it, the cgroups runc
# left. Sourced by scripts/cluster.sh.

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
