#!/usr/bin/env bash
# Benchmarks rkubelet side by side with the real kubelet v1.20.2, one after the other, on
# the same node set-up (same control plane, containerd and CNI plugins), and writes a
# Markdown table, the raw JSON results and a PNG plot of the latency distributions to the
# directory it names (default out/bench-<date>). Not a test: it asserts nothing.
#
#   bash scripts/bench.sh [OUT_DIR]
#
# Agents: rkubelet with runtime-owned networking (the same CNI path as the kubelet:
# containerd runs bridge + host-local + portmap), rkubelet with agent-owned networking (as
# a second node of its own pod CIDR: two owners cannot route one CIDR), and the kubelet
# with its v1.20 API defaults (QPS 5, burst 10) and with the newer ones (50/100).
# Scenarios per agent: footprint idle; bursts of 1, 10, 30, 100 and 110 (the kubelet's
# default maxPods) pods bound to the node, with the agent's CPU seconds and resident memory
# from the first create until all are gone; Deployments of 3 and 30 replicas; footprint with
# 110 pods; 100 pods with a readiness and
# a liveness probe each every second (exec, httpGet and tcpSocket evenly), the agent's CPU
# seconds and memory measured over BENCH_FOOTPRINT_SECONDS while they run; 100 pods that
# all use one Secret and one ConfigMap in env and volumes, the agent's reads of Secrets and
# ConfigMaps counted per node identity from the API server's audit log. Then the CRI
# floor, at 1 pod and at every burst count of 30 and more.
# rkubelet's bursts are broken down per step from its pods' start-up timelines (read from
# its debug socket), its deletions from its log (--log-span-timings), so the report breaks its
# largest burst down per step.
#
# The machine is noisy (single runs of the same scenario differ by 15 % and more), so the
# bursts of 30 and more pods and the floor at its best concurrency run BENCH_REPEAT times
# (default 3) and the report gives their medians. Before every measured run the machine
# settles: `bench settle` waits (30 s at most) until the CPUs are quiet, so that no
# scenario inherits the clean-up of the one before.
#
# With BENCH_NODES=N (N > 1), the layout is N nodes as hosts (`cluster.sh up --nodes N`:
# each node its own netns with its own containerd and kube-proxy) and there is one
# scenario: BENCH_BURSTS pods (default 30) on every node at once, BENCH_REPEAT times, with
# each node agent's CPU seconds and resident memory meanwhile (`bench burst --node ...
# --pid ...`). Agents (BENCH_AGENTS, default "rkubelet kubelet-qps50"): rkubelet with
# runtime-owned networking (`cluster.sh start-agents --network-owner runtime`) and the
# kubelet, one per node, each in its node's netns (nsenter, the machine's mount
# namespace). Every agent gets fresh nodes (remove-nodes, add-nodes) and one unmeasured
# burst of one pod per node first (the image pulls). After the first agent, before its
# nodes go, the CRI floor runs on every node's containerd at once (BENCH_BURSTS sandboxes
# each, with the network containerd rendered from the node's pod CIDR): the floor of N
# nodes sharing this machine, e.g.
#   BENCH_NODES=3 bash scripts/bench.sh out/3nodes
#   BENCH_NODES=3 BENCH_BURSTS=110 bash scripts/bench.sh out/3x110
#
# With BENCH_KIND=1, the layout is this machine's node beside two kind-style nodes
# (`cluster.sh add-kind-node`: systemd as PID 1, its own containerd, kubeadm's files), one
# with the cgroupfs driver and one with the systemd driver (kubeadm's and kind's default),
# and there is one scenario: BENCH_BURSTS pods (default 30) bound to a node, in
# BENCH_REPEAT rounds of one burst on each of the three nodes (rkubelet on the host node:
# cgroupfs driver, runtime-owned networking), the order turned every round; then the CRI
# floor inside each kind node, in rounds too: what the systemd driver costs, on the same
# kind of node, with the machine's drift falling alike on every node, e.g.
#   BENCH_KIND=1 bash scripts/bench.sh out/kind
#
# With BENCH_VM=1, the layout is a VM node (`cluster.sh add-vm-node`: a Debian 12 virtual
# machine on cgroup v2 under qemu's software emulation, systemd as PID 1, its own
# containerd with the systemd cgroup driver, kubeadm's files) and there is one scenario:
# BENCH_BURSTS pods (default 10) bound to it, BENCH_REPEAT times, then the CRI floor inside
# the VM (rkubelet stopped, the bench binary run in it against its containerd), as many
# times: the ratio says what rkubelet adds to the runtime on that node; the absolute times
# say only how slow emulation is, e.g.
#   BENCH_VM=1 bash scripts/bench.sh out/vm
#
# With BENCH_SCRAPE=1, the one scenario is `scrape` for rkubelet and the kubelet (QPS 50)
# (BENCH_AGENTS to change them), without the floor: 100 pods bound to the node, then each
# endpoint monitoring reads (/metrics, /metrics/resource, /metrics/probes,
# /metrics/cadvisor, /stats/summary, /configz) fetched BENCH_SCRAPES times (default 20)
# through the node proxy: time per scrape and the agent's CPU per scrape (each endpoint's
# first answer kept in OUT_DIR/bodies, to compare the agents'), e.g.
#   BENCH_SCRAPE=1 bash scripts/bench.sh out/scrape
#
# With BENCH_LOGROTATE=1, there is one scenario, for rkubelet (runtime-owned networking)
# and the kubelet (QPS 50), each started with the same log rotation settings
# (--container-log-max-size=1Mi --container-log-max-files=3, the kubelet's 10 s period):
# BENCH_LOGROTATE_PODS chatty pods (default 4), each logging BENCH_LOGROTATE_RATE MiB/s of
# numbered lines (default 1), the agent's CPU seconds and resident memory over
# BENCH_FOOTPRINT_SECONDS while it rotates and compresses their logs, and the most their
# logs held on disk (sampled every 200 ms), e.g.
#   BENCH_LOGROTATE=1 BENCH_FOOTPRINT_SECONDS=60 bash scripts/bench.sh out/logrotate
#
# To compare two builds in one run, BENCH_AGENTS may add "rkubelet-before": rkubelet with
# runtime-owned networking from the binary BENCH_BEFORE_BIN (e.g. a copy of an earlier
# target/release/rkubelet). For more builds, BENCH_BINS names them (LABEL=PATH, space
# separated) and BENCH_AGENTS runs each as "rkubelet@LABEL" (reported as "rkubelet
# (LABEL)"). An agent may be named more than once: its runs merge into the report's
# medians like repeated bursts, so an A B B A order puts the machine's drift and the cost
# of running first or last on both builds alike, e.g.
#   BENCH_BINS="main=/var/tmp/rk-ab/main/rkubelet" BENCH_SCENARIOS=probes BENCH_FLOOR=0 \
#     BENCH_AGENTS="rkubelet@main rkubelet rkubelet rkubelet@main" bash scripts/bench.sh out/ab
#
# For a shorter run: BENCH_AGENTS (default "rkubelet rkubelet-agent-cni kubelet-qps5
# kubelet-qps50"), BENCH_BURSTS (default "1 10 30 100 110"), BENCH_REPEAT (default 3),
# BENCH_FLOOR=0 (skip the floor), BENCH_FOOTPRINT_SECONDS (default 60), BENCH_SCENARIOS
# (default "all", or some of "idle bursts deployments steady probes probes-deployment sources
# scrape"; probes-deployment: a Deployment of 100 replicas, each with an exec readiness and
# an exec liveness probe every second), e.g.
#   BENCH_SCENARIOS=probes BENCH_AGENTS="rkubelet kubelet-qps50" BENCH_FLOOR=0 bash scripts/bench.sh
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$RKUBELET_REPO"

OUT="${1:-$RKUBELET_REPO/out/bench-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
NODES="${BENCH_NODES:-1}"
[[ $NODES =~ ^[1-9][0-9]?$ ]] || die "BENCH_NODES must be a node count (1..99), not '$NODES'"
KIND="${BENCH_KIND:-0}"
[[ $KIND == 0 || ($KIND == 1 && $NODES == 1) ]] || die "BENCH_KIND=1 runs on one host node (BENCH_NODES=1)"
KIND_NODE=rk-kind1
# kind_node_name DRIVER: the kind layout's node with that cgroup driver.
kind_node_name() { echo "$KIND_NODE-${1:0:1}"; }
VM="${BENCH_VM:-0}"
[[ $VM == 0 || ($VM == 1 && $NODES == 1 && $KIND == 0) ]] || die "BENCH_VM=1 runs on one VM node (BENCH_NODES=1, BENCH_KIND=0)"
VM_NODE=rk-vm1
SCRAPE="${BENCH_SCRAPE:-0}"
[[ $SCRAPE == 0 || ($SCRAPE == 1 && $NODES == 1 && $KIND == 0) ]] || die "BENCH_SCRAPE=1 runs on one host node (BENCH_NODES=1, BENCH_KIND=0)"
LOGROTATE="${BENCH_LOGROTATE:-0}"
[[ $LOGROTATE == 0 || ($LOGROTATE == 1 && $NODES == 1 && $KIND == 0) ]] ||
  die "BENCH_LOGROTATE=1 runs on one host node (BENCH_NODES=1, BENCH_KIND=0)"
LOGROTATE_PODS="${BENCH_LOGROTATE_PODS:-4}"
LOGROTATE_RATE="${BENCH_LOGROTATE_RATE:-1}"
LOG_ROTATION_FLAGS=(--container-log-max-size=1Mi --container-log-max-files=3)
[[ $SCRAPE == 0 || $LOGROTATE == 0 ]] || die "BENCH_SCRAPE=1 and BENCH_LOGROTATE=1 are separate runs"
if [[ $SCRAPE == 1 ]]; then
  BURSTS=()
  read -ra AGENTS <<<"${BENCH_AGENTS:-rkubelet kubelet-qps50}"
  BENCH_SCENARIOS=scrape
  BENCH_FLOOR=0
elif [[ $LOGROTATE == 1 ]]; then
  BURSTS=()
  AGENTS=()
elif [[ $KIND == 1 ]]; then
  read -ra BURSTS <<<"${BENCH_BURSTS:-30}"
  AGENTS=()
elif [[ $VM == 1 ]]; then
  read -ra BURSTS <<<"${BENCH_BURSTS:-10}"
  AGENTS=()
elif ((NODES > 1)); then
  read -ra BURSTS <<<"${BENCH_BURSTS:-30}"
  read -ra AGENTS <<<"${BENCH_AGENTS:-rkubelet kubelet-qps50}"
else
  read -ra BURSTS <<<"${BENCH_BURSTS:-1 10 30 100 110}"
  read -ra AGENTS <<<"${BENCH_AGENTS:-rkubelet rkubelet-agent-cni kubelet-qps5 kubelet-qps50}"
fi
# bench_bin LABEL: the binary BENCH_BINS names LABEL.
bench_bin() {
  local entry
  for entry in ${BENCH_BINS:-}; do
    [[ ${entry%%=*} != "$1" ]] || { echo "${entry#*=}"; return; }
  done
  die "BENCH_BINS names no binary '$1' (LABEL=PATH, space separated)"
}
# Every build an agent names is there before the cluster comes up.
for agent in "${AGENTS[@]}"; do
  case $agent in
    rkubelet@*) [[ -x $(bench_bin "${agent#rkubelet@}") ]] || die "BENCH_BINS: ${agent#rkubelet@} is not an executable" ;;
    rkubelet-before) [[ -x ${BENCH_BEFORE_BIN:-} ]] || die "rkubelet-before needs BENCH_BEFORE_BIN, the rkubelet binary of an earlier build" ;;
  esac
done
FOOTPRINT_SECONDS="${BENCH_FOOTPRINT_SECONDS:-60}"
REPEAT="${BENCH_REPEAT:-3}"
# The kind layout turns the order of its three nodes every round and swaps its two floors:
# 6 rounds give every node every place alike.
[[ $KIND == 0 || -n ${BENCH_REPEAT:-} ]] || REPEAT=6
ALL_SCENARIOS="idle bursts deployments steady probes probes-deployment sources scrape"
SCENARIOS="${BENCH_SCENARIOS:-all}"
[[ $SCENARIOS != all ]] || SCENARIOS=$ALL_SCENARIOS
for s in $SCENARIOS; do
  [[ " $ALL_SCENARIOS " == *" $s "* ]] || die "unknown scenario in BENCH_SCENARIOS: $s (one of: all $ALL_SCENARIOS)"
done
want() { [[ " $SCENARIOS " == *" $1 "* ]]; }
PROBE_PODS=100
# The footprint's pods: the kubelet's default maxPods, the most a node takes.
STEADY_PODS=110
SCRAPES="${BENCH_SCRAPES:-20}"
SECOND_NODE=rk-node2

# The floor uses containerd's own network, whose config containerd renders from the pod
# CIDR an agent with runtime-owned networking sends it (UpdateRuntimeConfig).
if ((NODES == 1)) && [[ $KIND == 0 && $VM == 0 && $LOGROTATE == 0 && ${BENCH_FLOOR:-1} == 1 && " ${AGENTS[*]} " != *" rkubelet "* && " ${AGENTS[*]} " != *" kubelet-qps"* ]]; then
  die "the CRI floor needs containerd's CNI config, rendered once rkubelet or the kubelet ran: add one to BENCH_AGENTS, or set BENCH_FLOOR=0"
fi

bash scripts/setup.sh
if ! command -v gnuplot >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null
fi
log "building (release)"
cargo build --locked --release --bins
RK="$RKUBELET_REPO/target/release/rkubelet"
BENCH="$RKUBELET_REPO/target/release/bench"
export KUBECONFIG="$KUBECONFIG_ADMIN"
k() { kubectl "$@" 2> >(grep -v 'version difference' >&2); }

# What the real kubelet changes on the host, put back at the end.
SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops)
declare -A SYSCTL_BEFORE
for s in "${SYSCTLS[@]}"; do SYSCTL_BEFORE[$s]=$(sysctl -n "$s"); done
LOG_DIRS_BEFORE=()
# (and the kubelet's device plugin directory, which no flag moves)
for d in /var/log/pods /var/log/containers /var/lib/kubelet; do [[ -e $d ]] && LOG_DIRS_BEFORE+=("$d"); done

AGENT_PID=""
NODE_AGENT_PIDS=()
HOSTS=()
for ((i = 1; i <= NODES; i++)); do HOSTS+=("rk-host$i"); done
host_dir() { echo "$RKUBELET_STATE/hosts/$1"; }
host_ip() { echo "198.18.0.$((10 + ${1#rk-host}))"; } # as cluster.sh assigns them

# stop_node_agents: the kubelets this script started in the nodes' netns (by PID), then
# the nodes' rkubelets (cluster.sh records them).
stop_node_agents() {
  local pid h
  for pid in "${NODE_AGENT_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${NODE_AGENT_PIDS[@]}"; do
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  NODE_AGENT_PIDS=()
  for h in "${HOSTS[@]}"; do
    [[ ! -f $RKUBELET_STATE/pids/rkubelet@$h.pid ]] || bash scripts/cluster.sh stop-agent "$h" 2>/dev/null || true
  done
}

cleanup() {
  stop_agent
  stop_node_agents
  if [[ $KIND == 1 ]]; then
    for d in cgroupfs systemd; do bash scripts/cluster.sh remove-kind-node "$(kind_node_name "$d")" || true; done
  fi
  [[ $VM == 0 ]] || bash scripts/cluster.sh remove-vm-node "$VM_NODE" || true
  bash scripts/cluster.sh down || true
  for s in "${SYSCTLS[@]}"; do sysctl -qw "$s=${SYSCTL_BEFORE[$s]}" || true; done
  for d in /var/log/pods /var/log/containers /var/lib/kubelet; do
    [[ " ${LOG_DIRS_BEFORE[*]} " == *" $d "* ]] || rm -rf "$d"
  done
}
trap cleanup EXIT

bash scripts/cluster.sh down
bash scripts/cluster.sh up
# The control plane's processes, whose CPU time the bursts count apart (the floor has none).
CONTROL_PLANE_PIDS=()
for c in etcd kube-apiserver kube-controller-manager kube-scheduler; do
  CONTROL_PLANE_PIDS+=(--control-plane-pid "$(<"$RKUBELET_STATE/pids/$c.pid")")
done
((NODES > 1)) || bash scripts/cluster.sh node-credentials "$SECOND_NODE" "$NODE_IP"

start_agent() { # NAME NODE COMMAND...
  local name=$1 node=$2; shift 2
  log "starting $name as node $node"
  # Appended: an agent named twice keeps both runs' spans (the report reads each run's).
  "$@" >>"$OUT/$name.log" 2>&1 &
  AGENT_PID=$!
  wait_node_ready "$node" 120
}

rkubelet_cmd() { # NODE OWNER [BINARY]
  local node=$1 owner=$2
  echo "${3:-$RK}" run --kubeconfig "$RKUBELET_STATE/pki/node-$node.kubeconfig" \
    --hostname-override "$node" --node-ip "$NODE_IP" \
    --root-dir "$RKUBELET_STATE/bench/rkubelet-$node" --pod-logs-dir "$RKUBELET_STATE/bench/logs-$node" \
    --network-owner "$owner" --cni-conf-dir "$RKUBELET_REPO/cni-config" --cni-bin-dir /usr/lib/cni \
    --runtime-cni-conf-dir "$RKUBELET_STATE/cni/net.d" --runtime-cni-bin-dir "$RKUBELET_STATE/cni/bin" \
    --resolv-conf= --address "$NODE_IP" --client-ca-file "$RKUBELET_STATE/pki/ca.crt" \
    --tls-cert-file "$RKUBELET_STATE/pki/node-$node-serving.crt" \
    --tls-private-key-file "$RKUBELET_STATE/pki/node-$node-serving.key" \
    --log-format json --log-span-timings
}

kubelet_cmd() { # QPS BURST [NODE IP KUBECONFIG ROOT_DIR CONTAINERD_SOCK] (default: this machine's node)
  local node=${3:-$NODE_NAME} ip=${4:-$NODE_IP} kubeconfig=${5:-$RKUBELET_STATE/pki/node-$NODE_NAME.kubeconfig}
  local root=${6:-$RKUBELET_STATE/bench/kubelet} sock=${7:-$CONTAINERD_SOCK}
  echo "$K8S_BIN/kubelet" --kubeconfig "$kubeconfig" \
    --hostname-override "$node" --node-ip "$ip" --root-dir "$root" \
    --container-runtime=remote --container-runtime-endpoint="unix://$sock" \
    --cgroup-driver=cgroupfs --cgroups-per-qos=false --enforce-node-allocatable= --fail-swap-on=false \
    --eviction-hard= --image-gc-high-threshold=100 --resolv-conf= --read-only-port=0 \
    --address="$ip" --anonymous-auth=false --client-ca-file="$RKUBELET_STATE/pki/ca.crt" \
    --tls-cert-file="$RKUBELET_STATE/pki/node-$node-serving.crt" \
    --tls-private-key-file="$RKUBELET_STATE/pki/node-$node-serving.key" \
    --kube-api-qps="$1" --kube-api-burst="$2"
}

settle() { "$BENCH" settle >>"$OUT/settle.log"; }

footprint() { # AGENT STATE
  "$BENCH" footprint --pid "$AGENT_PID" --seconds "$FOOTPRINT_SECONDS" --agent "$1" --state "$2" >>"$OUT/footprint.json"
}

scenarios() { # AGENT NODE
  local agent=$1 node=$2 n runs run timelines=()
  # rkubelet's start-up breakdown comes from its pods' timelines (its debug socket).
  [[ $agent != rkubelet* ]] || timelines=(--agent-root-dir "$RKUBELET_STATE/bench/rkubelet-$node")
  if want idle; then footprint "$agent" idle; fi
  if want bursts; then
    for n in "${BURSTS[@]}"; do
      runs=1
      ((n < 30)) || runs=$REPEAT
      for ((run = 1; run <= runs; run++)); do
        settle
        log "$agent: burst of $n (run $run of $runs)"
        "$BENCH" burst --kubeconfig "$KUBECONFIG_ADMIN" --node "$node" --count "$n" --agent "$agent" \
          --pid "$AGENT_PID" "${CONTROL_PLANE_PIDS[@]}" "${timelines[@]}" >>"$OUT/burst.json"
      done
    done
  fi
  if want deployments; then
    for n in 3 30; do
      settle
      log "$agent: deployment of $n"
      "$BENCH" deployment --kubeconfig "$KUBECONFIG_ADMIN" --node "$node" --count "$n" --agent "$agent" >>"$OUT/deployment.json"
    done
  fi
  if want steady; then
    log "$agent: footprint with $STEADY_PODS pods"
    k create deployment steady --image=127.0.0.1:5000/rkubelet/busybox:1.35 --replicas=$STEADY_PODS -- sh -c "trap 'exit 0' TERM; sleep 3600 & wait" >/dev/null
    k patch deployment steady --type=merge -p "{\"spec\":{\"template\":{\"spec\":{\"nodeSelector\":{\"kubernetes.io/hostname\":\"$node\"}}}}}" >/dev/null
    k rollout status deployment/steady --timeout=600s >/dev/null
    footprint "$agent" "$STEADY_PODS pods"
    k delete deployment steady --wait=true >/dev/null
    while [[ -n $(k get pods -o name) ]]; do sleep 1; done
  fi
  if want sources; then
    settle
    log "$agent: 100 pods using one Secret and one ConfigMap"
    "$BENCH" sources --kubeconfig "$KUBECONFIG_ADMIN" --node "$node" --count 100 --agent "$agent" \
      --audit-log "$RKUBELET_STATE/audit.log" >>"$OUT/sources.json"
  fi
  if want probes-deployment; then
    settle
    log "$agent: a Deployment of $PROBE_PODS replicas with exec probes every second"
    "$BENCH" deployment --exec-probes --kubeconfig "$KUBECONFIG_ADMIN" --node "$node" --count "$PROBE_PODS" \
      --agent "$agent" >>"$OUT/deployment.json"
  fi
  if want probes; then
    settle
    log "$agent: $PROBE_PODS pods with probes every second, $FOOTPRINT_SECONDS s"
    "$BENCH" probes --kubeconfig "$KUBECONFIG_ADMIN" --node "$node" --count "$PROBE_PODS" --agent "$agent" \
      --pid "$AGENT_PID" --seconds "$FOOTPRINT_SECONDS" "${timelines[@]}" >>"$OUT/probes.json"
  fi
  if want scrape; then
    settle
    log "$agent: 100 pods, each monitoring endpoint scraped $SCRAPES times"
    "$BENCH" scrape --kubeconfig "$KUBECONFIG_ADMIN" --node "$node" --count 100 --agent "$agent" \
      --pid "$AGENT_PID" --scrapes "$SCRAPES" --bodies "$OUT/bodies" >>"$OUT/scrape.json"
  fi
}

run_agent() { # NAME NODE COMMAND...
  local name=$1 node=$2; shift 2
  start_agent "$name" "$node" "$@"
  scenarios "$name" "$node"
  stop_agent
}

# floor_runs COUNT OUT_FILE ENDPOINT...: the CRI floor, COUNT sandboxes on each endpoint (all
# at once when there are several). The concurrency that gives the shortest wall time is
# found with one run of each, then measured BENCH_REPEAT times in all (once below 30).
floor_runs() {
  local n=$1 out=$2 best="" c e wall run tmp endpoints=()
  shift 2
  for e in "$@"; do endpoints+=(--endpoint "unix://$e"); done
  for c in 1 5 10 20 50; do
    ((c <= n)) || continue
    settle
    log "CRI floor: $n sandboxes on each of $# runtimes, $c at a time"
    tmp="$OUT/floor-$n-$#-$c.tmp"
    "$BENCH" floor --count "$n" --concurrency "$c" "${endpoints[@]}" >"$tmp"
    wall=$(jq .all_ready "$tmp")
    if [[ -z $best || $(jq -n "$wall < $(jq .all_ready "$best")") == true ]]; then best=$tmp; fi
  done
  cp "$best" "$out"
  c=$(jq .concurrency "$best")
  for ((run = 2; run <= (n < 30 ? 1 : REPEAT); run++)); do
    settle
    log "CRI floor: $n sandboxes on each of $# runtimes, $c at a time (run $run of $REPEAT)"
    "$BENCH" floor --count "$n" --concurrency "$c" "${endpoints[@]}" >>"$out"
  done
  rm -f "$OUT"/floor-*.tmp
}

# ---- N nodes as hosts (BENCH_NODES > 1)

# Whether the floor on every node's runtime ran (once a run, after the first agent).
NODES_FLOOR_DONE=0

# start_node_agents AGENT: one agent per node; their PIDs in NODE_AGENT_PIDS (node order).
start_node_agents() {
  local h
  case $1 in
    rkubelet)
      bash scripts/cluster.sh start-agents --network-owner runtime --binary "$RK"
      for h in "${HOSTS[@]}"; do NODE_AGENT_PIDS+=("$(<"$RKUBELET_STATE/pids/rkubelet@$h.pid")"); done
      ;;
    kubelet-qps5 | kubelet-qps50)
      local qps=${1#kubelet-qps}
      for h in "${HOSTS[@]}"; do
        log "starting the kubelet (QPS $qps) as node $h, in its netns"
        # shellcheck disable=SC2046  # the command is a word list on purpose
        nsenter --net="/run/netns/$h" -- $(kubelet_cmd "$qps" $((qps * 2)) "$h" "$(host_ip "$h")" \
          "$(host_dir "$h")/kubelet.kubeconfig" "$(host_dir "$h")/kubelet" "$(host_dir "$h")/containerd.sock") \
          >"$OUT/kubelet-qps$qps-$h.log" 2>&1 &
        NODE_AGENT_PIDS+=("$!")
      done
      ;;
    *) die "unknown agent in BENCH_AGENTS for BENCH_NODES > 1: $1 (one of rkubelet kubelet-qps5 kubelet-qps50)" ;;
  esac
  for h in "${HOSTS[@]}"; do
    wait_node_ready "$h" 240
  done
  log "$1: nodes ${HOSTS[*]} Ready"
}

# multi_node_agent AGENT NAME: fresh nodes, the agents, the bursts; then the nodes go.
multi_node_agent() {
  local agent=$1 name=$2 n run h pid nodes=() pids=()
  bash scripts/cluster.sh add-nodes "$NODES"
  start_node_agents "$agent"
  for h in "${HOSTS[@]}"; do nodes+=(--node "$h"); done
  for pid in "${NODE_AGENT_PIDS[@]}"; do pids+=(--pid "$pid"); done
  log "$name: warm-up, 1 pod per node (image pulls, not measured)"
  "$BENCH" burst --kubeconfig "$KUBECONFIG_ADMIN" "${nodes[@]}" --count 1 --agent "$name" >>"$OUT/warm-up.log"
  for n in "${BURSTS[@]}"; do
    for ((run = 1; run <= REPEAT; run++)); do
      settle
      log "$name: $n pods on each of $NODES nodes at once (run $run of $REPEAT)"
      "$BENCH" burst --kubeconfig "$KUBECONFIG_ADMIN" "${nodes[@]}" --count "$n" --agent "$name" \
        "${pids[@]}" "${CONTROL_PLANE_PIDS[@]}" >>"$OUT/nodes.json"
    done
  done
  stop_node_agents
  # The floor on every node's runtime at once, with the network containerd rendered from
  # the node's pod CIDR, once a run (after the first agent, before its nodes go).
  if [[ ${BENCH_FLOOR:-1} == 1 && $NODES_FLOOR_DONE == 0 ]]; then
    local socks=()
    for h in "${HOSTS[@]}"; do socks+=("$(host_dir "$h")/containerd.sock"); done
    for n in "${BURSTS[@]}"; do floor_runs "$n" "$OUT/floor-nodes-$n.json" "${socks[@]}"; done
    NODES_FLOOR_DONE=1
  fi
  for h in "${HOSTS[@]}"; do
    [[ ! -f $RKUBELET_STATE/logs/rkubelet@$h.log ]] || cp "$RKUBELET_STATE/logs/rkubelet@$h.log" "$OUT/$agent-$h.log"
  done
  bash scripts/cluster.sh remove-nodes
  # The next agent registers its nodes afresh (a stale Ready would pass its wait).
  k delete node "${HOSTS[@]}" --ignore-not-found >/dev/null
}

if ((NODES > 1)); then
  for agent in "${AGENTS[@]}"; do
    case $agent in
      rkubelet) multi_node_agent rkubelet "rkubelet" ;;
      kubelet-qps5) multi_node_agent kubelet-qps5 "kubelet QPS 5" ;;
      kubelet-qps50) multi_node_agent kubelet-qps50 "kubelet QPS 50" ;;
      *) die "unknown agent in BENCH_AGENTS for BENCH_NODES > 1: $agent (one of rkubelet kubelet-qps5 kubelet-qps50)" ;;
    esac
  done
fi

# ---- a kind-style node beside the host node (BENCH_KIND=1)

# kind_root NODE: the kind node's PID 1's root on the host.
kind_root() {
  local pid
  pid=$(bash scripts/cluster.sh kind-pid "$1")
  [[ $pid =~ ^[1-9][0-9]*$ ]] || die "no PID 1 for kind node $1"
  echo "/proc/$pid/root"
}

# KIND_LAYOUT: the three nodes of the layout, each as NODE|NAME|ROOT_DIR (rkubelet's root
# dir, for its debug socket: through the kind node's PID 1's root), set by kind_layout_up.
KIND_LAYOUT=()

# kind_layout_up: rkubelet on the host node (cgroupfs driver, runtime-owned networking) and
# two fresh kind nodes, one per cgroup driver (containerd's `SystemdCgroup` follows), all
# up at once, each after one unmeasured pod (the image pull).
kind_layout_up() {
  local driver node entry root
  # Its log named as its bursts, for the report's deletion breakdown.
  # shellcheck disable=SC2046  # the command is a word list on purpose
  start_agent "rkubelet, host node, cgroupfs driver" "$NODE_NAME" $(rkubelet_cmd "$NODE_NAME" runtime)
  KIND_LAYOUT=("$NODE_NAME|rkubelet, host node, cgroupfs driver|$RKUBELET_STATE/bench/rkubelet-$NODE_NAME")
  for driver in cgroupfs systemd; do
    node=$(kind_node_name "$driver")
    bash scripts/cluster.sh add-kind-node "$node" --cgroup-driver "$driver" --binary "$RK"
    root=$(kind_root "$node")
    KIND_LAYOUT+=("$node|rkubelet, kind node, $driver driver|$root/var/lib/kubelet")
  done
  for entry in "${KIND_LAYOUT[@]}"; do
    IFS='|' read -r node _ _ <<<"$entry"
    "$BENCH" burst --kubeconfig "$KUBECONFIG_ADMIN" --node "$node" --count 1 --agent warm-up >>"$OUT/warm-up.log"
  done
}

# kind_layout_bursts: for each burst count, BENCH_REPEAT rounds of one burst on each node of
# the layout, the order turned by one node every round (the machine's drift over a run and
# the order each node runs in fall alike on the three), into burst.json with rkubelet's
# start-up breakdown.
kind_layout_bursts() {
  local n run i turn node name root
  for n in "${BURSTS[@]}"; do
    for ((run = 1; run <= REPEAT; run++)); do
      for ((i = 0; i < ${#KIND_LAYOUT[@]}; i++)); do
        turn=$(((i + run - 1) % ${#KIND_LAYOUT[@]}))
        IFS='|' read -r node name root <<<"${KIND_LAYOUT[$turn]}"
        settle
        log "$name: burst of $n (round $run of $REPEAT)"
        "$BENCH" burst --kubeconfig "$KUBECONFIG_ADMIN" --node "$node" --count "$n" --agent "$name" \
          --agent-root-dir "$root" >>"$OUT/burst.json"
      done
    done
  done
}

# kind_floor: the CRI floor inside each kind node (the bench binary run in it, against its
# containerd; rkubelet stopped in both nodes meanwhile), BENCH_REPEAT rounds for each burst
# count, the two nodes' order swapped every round, 10 sandboxes at a time (the floor's
# fastest on this machine's node at 30 and 100): what the runtime alone costs with each
# driver. A runtime whose runc uses systemd refuses a sandbox without a slice for its
# parent: `system.slice` (no pod slice, the runtime's own cost).
kind_floor() {
  local driver node n run order parent root
  for driver in cgroupfs systemd; do
    node=$(kind_node_name "$driver")
    root=$(kind_root "$node")
    install -m 0755 "$BENCH" "$root/usr/local/bin/rk-bench"
    bash scripts/cluster.sh kind-exec "$node" systemctl stop kubelet
  done
  for n in "${BURSTS[@]}"; do
    for ((run = 1; run <= REPEAT; run++)); do
      order=(cgroupfs systemd)
      ((run % 2 == 1)) || order=(systemd cgroupfs)
      for driver in "${order[@]}"; do
        node=$(kind_node_name "$driver") parent=()
        [[ $driver == cgroupfs ]] || parent=(--cgroup-parent system.slice)
        settle
        log "CRI floor in the kind node, $driver driver: $n sandboxes, 10 at a time (round $run of $REPEAT)"
        bash scripts/cluster.sh kind-exec "$node" rk-bench floor --count "$n" --concurrency 10 \
          "${parent[@]}" --agent "CRI floor, kind node, $driver driver" >>"$OUT/floor-kind.json"
      done
    done
  done
}

# kind_layout_down: each kind node's agent log kept (`journalctl -u kubelet`), the kind
# nodes go (their Nodes with them), then the host node's agent.
kind_layout_down() {
  local driver node
  for driver in cgroupfs systemd; do
    node=$(kind_node_name "$driver")
    bash scripts/cluster.sh kind-exec "$node" journalctl -u kubelet -o cat --no-pager \
      >"$OUT/rkubelet in the kind node, $driver driver.journal" 2>&1 || true
    bash scripts/cluster.sh remove-kind-node "$node"
  done
  stop_agent
}

if [[ $KIND == 1 ]]; then
  kind_layout_up
  kind_layout_bursts
  kind_floor
  kind_layout_down
fi

# ---- a VM node (BENCH_VM=1)

VM_AGENT="rkubelet, VM node, systemd driver"

# vm_layout: the VM node with the release build, one unmeasured pod (the image pull); for
# each burst count, BENCH_REPEAT bursts on it; then, rkubelet stopped in the VM, the CRI
# floor inside it (the bench binary against its containerd, 10 sandboxes at a time, under
# system.slice: runc with the systemd driver refuses a sandbox without a slice) as many
# times; the VM's agent log kept; the VM goes.
vm_layout() {
  local n run
  bash scripts/cluster.sh add-vm-node "$VM_NODE" --binary "$RK"
  cp "$RKUBELET_STATE/vm/$VM_NODE/took" "$OUT/vm-node-took.txt"
  "$BENCH" burst --kubeconfig "$KUBECONFIG_ADMIN" --node "$VM_NODE" --count 1 --agent warm-up >>"$OUT/warm-up.log"
  for n in "${BURSTS[@]}"; do
    for ((run = 1; run <= REPEAT; run++)); do
      settle
      log "$VM_AGENT: burst of $n (round $run of $REPEAT)"
      "$BENCH" burst --kubeconfig "$KUBECONFIG_ADMIN" --node "$VM_NODE" --count "$n" --agent "$VM_AGENT" \
        >>"$OUT/burst.json"
    done
  done
  bash scripts/cluster.sh vm-exec "$VM_NODE" 'cat >/usr/local/bin/rk-bench && chmod 0755 /usr/local/bin/rk-bench' <"$BENCH"
  bash scripts/cluster.sh vm-exec "$VM_NODE" systemctl stop kubelet
  for n in "${BURSTS[@]}"; do
    for ((run = 1; run <= REPEAT; run++)); do
      settle
      log "CRI floor in the VM node: $n sandboxes, 10 at a time (round $run of $REPEAT)"
      bash scripts/cluster.sh vm-exec "$VM_NODE" rk-bench floor --count "$n" --concurrency 10 \
        --cgroup-parent system.slice --agent "'CRI floor, VM node'" >>"$OUT/floor-vm.json"
    done
  done
  bash scripts/cluster.sh vm-exec "$VM_NODE" journalctl -u kubelet -o cat --no-pager \
    >"$OUT/rkubelet in the VM node.journal" 2>&1 || true
  bash scripts/cluster.sh remove-vm-node "$VM_NODE"
}

[[ $VM == 0 ]] || vm_layout

# ---- log rotation (BENCH_LOGROTATE=1)

# logrotate_run NAME POD_LOGS_DIR COMMAND...: the agent with the log rotation flags, one
# unmeasured pod (the image pull), then the chatty pods.
logrotate_run() {
  local name=$1 dir=$2; shift 2
  start_agent "$name" "$NODE_NAME" "$@" "${LOG_ROTATION_FLAGS[@]}"
  "$BENCH" burst --kubeconfig "$KUBECONFIG_ADMIN" --node "$NODE_NAME" --count 1 --agent "$name" >>"$OUT/warm-up.log"
  settle
  log "$name: $LOGROTATE_PODS pods logging $LOGROTATE_RATE MiB/s each, $FOOTPRINT_SECONDS s"
  "$BENCH" logrotate --kubeconfig "$KUBECONFIG_ADMIN" --node "$NODE_NAME" --count "$LOGROTATE_PODS" \
    --agent "$name" --pid "$AGENT_PID" --seconds "$FOOTPRINT_SECONDS" \
    --mib-per-second "$LOGROTATE_RATE" --pod-logs-dir "$dir" >>"$OUT/logrotate.json"
  stop_agent
}

if [[ $LOGROTATE == 1 ]]; then
  # shellcheck disable=SC2046  # the commands are word lists on purpose
  logrotate_run "rkubelet" "$RKUBELET_STATE/bench/logs-$NODE_NAME" $(rkubelet_cmd "$NODE_NAME" runtime)
  # shellcheck disable=SC2046
  logrotate_run "kubelet QPS 50" /var/log/pods $(kubelet_cmd 50 100)
fi

# ---- one node

# shellcheck disable=SC2046  # the commands are word lists on purpose
for agent in "${AGENTS[@]}"; do
  ((NODES == 1)) || break
  case $agent in
    rkubelet) run_agent "rkubelet" "$NODE_NAME" $(rkubelet_cmd "$NODE_NAME" runtime) ;;
    rkubelet-agent-cni) run_agent "rkubelet (agent CNI)" "$SECOND_NODE" $(rkubelet_cmd "$SECOND_NODE" agent) ;;
    rkubelet-before) run_agent "rkubelet (before)" "$NODE_NAME" $(rkubelet_cmd "$NODE_NAME" runtime "$BENCH_BEFORE_BIN") ;;
    rkubelet@*)
      run_agent "rkubelet (${agent#rkubelet@})" "$NODE_NAME" $(rkubelet_cmd "$NODE_NAME" runtime "$(bench_bin "${agent#rkubelet@}")") ;;
    kubelet-qps5) run_agent "kubelet QPS 5" "$NODE_NAME" $(kubelet_cmd 5 10) ;;
    kubelet-qps50) run_agent "kubelet QPS 50" "$NODE_NAME" $(kubelet_cmd 50 100) ;;
    *) echo "unknown agent in BENCH_AGENTS: $agent" >&2; exit 2 ;;
  esac
done

# The floor, with containerd's own network (rendered from rk-node1's pod CIDR by now): at
# one pod and at every burst count of 30 and more.
FLOOR_COUNTS=()
for n in "${BURSTS[@]}"; do ((n != 1 && n < 30)) || FLOOR_COUNTS+=("$n"); done
[[ ${BENCH_FLOOR:-1} == 1 && $NODES == 1 && $KIND == 0 && $VM == 0 && $LOGROTATE == 0 ]] || FLOOR_COUNTS=()
for n in "${FLOOR_COUNTS[@]}"; do floor_runs "$n" "$OUT/floor-$n.json" "$CONTAINERD_SOCK"; done
rm -f "$OUT"/*.tmp

machine="$(date -u +%Y-%m-%d), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r), containerd $(containerd --version | awk '{print $3}')"
((NODES == 1)) || machine+=", $NODES nodes as hosts (a netns, containerd and kube-proxy each) on this machine"
[[ $KIND == 0 ]] || machine+=", a kind-style node (podman, systemd as PID 1, its own containerd) beside the host node"
[[ $VM == 0 ]] || machine+=", a VM node (qemu software emulation, 2 vCPUs, Debian 12, cgroup v2, systemd driver)"
"$BENCH" report "$OUT" --machine "($machine)" >/dev/null
# (no start-up latencies in the log rotation layout: nothing to plot)
[[ -s $OUT/latency.dat ]] && gnuplot <<EOF
set terminal pngcairo size 1000,600
set output "$OUT/latency.png"
set title "Pod create → Ready (cumulative), $machine"
set xlabel "seconds after create"
set ylabel "fraction of pods Ready"
set key bottom right
set grid
plot for [i=0:*] "$OUT/latency.dat" index i using 1:2 with steps title columnheader(1)
EOF
cat "$OUT/report.md"
log "results in $OUT (report.md, latency.png, *.json, agent logs)"
