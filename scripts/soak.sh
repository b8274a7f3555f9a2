#!/usr/bin/env bash
# Soak: pods created and deleted continuously against the running local cluster, with the
# agent's resident memory, open file descriptors and task count sampled every 10 s; fails
# when one of them grows without bound after a warm-up, and when pods stop reaching the
# state their spec leads to.
#
#   bash scripts/soak.sh DURATION [OUT_DIR]        # DURATION: 300, 300s, 5m, 1h
#
# It needs the cluster `scripts/cluster.sh up` started, and the node rk-node1 free (no
# other agent: run it under `flock /tmp/rk-cluster.lock` next to the integration tests). It
# starts its own agent (target/release/rkubelet if built, else target/debug/rkubelet;
# SOAK_BIN overrides) as rk-node1 with its own root dir under $RKUBELET_STATE, as the
# integration tests do, and stops it by its PID at the end, also on failure.
#
# Each cycle creates, in a namespace of its own, SOAK_COPIES (default 2) of each spec:
# plain busybox, env from a ConfigMap, a Secret volume, a readiness probe, an init
# container, and three that fail: a missing image, a command that exits 1 under
# restartPolicy Never, a missing ConfigMap. It waits until each pod is where its spec leads
# (Ready; ErrImagePull/ImagePullBackOff; Failed; CreateContainerConfigError), then deletes
# them all and waits until they are gone.
#
# OUT_DIR (default out/soak-<date>) gets soak.csv (elapsed_s, rss_kb, fds, tasks,
# pods_created), summary.txt, soak.gp and soak.svg (gnuplot, else a plain SVG), and the
# agent's log. Everything the soak made (pods, ConfigMap, Secret, namespace, agent, its
# root dir) is removed at the end, also when it fails.
#
# The verdict: samples of the first SOAK_WARMUP seconds (default a quarter of the run, at
# most 300) are left out — caches fill then, the timeline of the last 256 pods and the
# event aggregation among them — and the rest is cut in thirds. The mean of the last third
# may exceed the mean of the middle third by at most:
# - RSS: 5 % or 1 MiB, whichever is more. malloc keeps freed pages until its periodic trim
#   and a sync's transient heap (a pod spec, a CRI response, a JSON body) is tens of KiB,
#   so two windows of the same steady state differ by a few hundred KiB; a leak of 2.5 KB
#   per pod at ~2 pods/s moves 1 MiB in 3.5 minutes, so a 30-minute run sees it.
# - fds: 10 or 10 %. CNI plugin pipes, CRI streams and API connections come and go with
#   the pods being worked on at the moment of the sample.
# - tasks: 8 or 20 %. tokio's blocking pool grows with file-system work and its idle
#   threads linger 10 s.
# and the RSS growth per pod created over the same span (least squares) is reported.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$RKUBELET_REPO"

usage() { echo "usage: $0 DURATION [OUT_DIR]   (DURATION: 300, 300s, 5m, 1h)" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
case $1 in
  *h) DURATION=$((${1%h} * 3600)) ;;
  *m) DURATION=$((${1%m} * 60)) ;;
  *s) DURATION=${1%s} ;;
  *) DURATION=$1 ;;
esac
if ! [[ $DURATION =~ ^[0-9]+$ ]] || ((DURATION < 60)); then die "DURATION must be at least 60 s: $1"; fi
OUT="${2:-$RKUBELET_REPO/out/soak-$(date +%Y%m%d-%H%M%S)}"
COPIES="${SOAK_COPIES:-2}"
WARMUP="${SOAK_WARMUP:-$((DURATION / 4 < 300 ? DURATION / 4 : 300))}"
SAMPLE_PERIOD=10
# How long a pod may take to reach its expected state, and its deletion to finish.
POD_TIMEOUT=120

bash scripts/cluster.sh status >/dev/null || die "the cluster is not up (scripts/cluster.sh status); start it with scripts/cluster.sh up"
if [[ -f $RKUBELET_STATE/pids/rkubelet.pid ]] && kill -0 "$(<"$RKUBELET_STATE/pids/rkubelet.pid")" 2>/dev/null; then
  die "an agent started by cluster.sh start-agent runs as $NODE_NAME; stop it first"
fi
BIN="${SOAK_BIN:-}"
if [[ -z $BIN ]]; then
  BIN="$RKUBELET_REPO/target/release/rkubelet"
  [[ -x $BIN ]] || BIN="$RKUBELET_REPO/target/debug/rkubelet"
fi
[[ -x $BIN ]] || die "no agent binary: cargo build --release --bin rkubelet (or set SOAK_BIN)"

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export KUBECONFIG="$KUBECONFIG_ADMIN"
k() { kubectl "$@" 2> >(grep -v 'version difference' >&2); }

RUN="soak-$(date +%s)"
NS="$RUN"
ROOT="$RKUBELET_STATE/soak/$RUN"
IMAGE="$REGISTRY/rkubelet/busybox:1.35"
AGENT_PID=""
SAMPLER_PID=""
CREATED_FILE="$OUT/.created"
echo 0 >"$CREATED_FILE"

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n $SAMPLER_PID ]]; then kill "$SAMPLER_PID" 2>/dev/null || true; wait "$SAMPLER_PID" 2>/dev/null || true; fi
  if k get namespace "$NS" >/dev/null 2>&1; then
    log "cleaning up namespace $NS"
    # With the agent still running, so that it tears the pods down (sandboxes, networks,
    # mounts); what it cannot finish in time is forced out.
    if [[ -n $AGENT_PID ]]; then
      k -n "$NS" delete pods --all --wait=true --timeout="${POD_TIMEOUT}s" >/dev/null 2>&1 || true
    fi
    k -n "$NS" delete pods --all --grace-period=0 --force >/dev/null 2>&1 || true
    k delete namespace "$NS" --wait=true --timeout=60s >/dev/null 2>&1 || log "namespace $NS still terminating"
  fi
  stop_agent
  if grep -q " $ROOT/" /proc/self/mountinfo; then
    log "mounts left under $ROOT; not removing it"
  else
    rm -rf "$ROOT"
  fi
  rm -f "$CREATED_FILE"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The agent, as tests/common/agent.rs starts it.
mkdir -p "$ROOT"
log "starting $BIN as $NODE_NAME (root dir $ROOT)"
"$BIN" --log-level info run \
  --kubeconfig "$RKUBELET_STATE/pki/node-$NODE_NAME.kubeconfig" \
  --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
  --root-dir "$ROOT" --pod-logs-dir "$ROOT/logs" \
  --network-owner agent --cni-conf-dir "$RKUBELET_REPO/cni-config" --cni-bin-dir /usr/lib/cni \
  --runtime-cni-conf-dir "$RKUBELET_STATE/cni/net.d" --runtime-cni-bin-dir "$RKUBELET_STATE/cni/bin" \
  --resolv-conf= --address "$NODE_IP" --client-ca-file "$RKUBELET_STATE/pki/ca.crt" \
  --tls-cert-file "$RKUBELET_STATE/pki/node-$NODE_NAME-serving.crt" \
  --tls-private-key-file "$RKUBELET_STATE/pki/node-$NODE_NAME-serving.key" \
  </dev/null >"$OUT/agent.log" 2>&1 &
AGENT_PID=$!
echo "$AGENT_PID" >"$OUT/agent.pid"
for _ in $(seq 120); do
  kill -0 "$AGENT_PID" 2>/dev/null || die "the agent exited at start (see $OUT/agent.log)"
  [[ $(k get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]] && break
  sleep 1
done

k create namespace "$NS" >/dev/null
k -n "$NS" create configmap soak-config --from-literal=GREETING=hello >/dev/null
k -n "$NS" create secret generic soak-secret --from-literal=password=s3cret >/dev/null
# Pods need the namespace's default ServiceAccount (and its token Secret) first.
for _ in $(seq 60); do
  [[ -n $(k -n "$NS" get serviceaccount default -o jsonpath='{.secrets[0].name}' 2>/dev/null) ]] && break
  sleep 1
done

# One pod of each spec, as YAML; `expect` is the state its spec leads to.
pod_yaml() { # NAME EXPECT RESTART SPEC...
  local name=$1 expect=$2 restart=$3
  shift 3
  cat <<EOF
---
apiVersion: v1
kind: Pod
metadata: {name: $name, labels: {soak-cycle: "$CYCLE", soak-expect: $expect}}
spec:
  nodeName: $NODE_NAME
  restartPolicy: $restart
  terminationGracePeriodSeconds: 5
EOF
  printf '%s\n' "$@"
}
SLEEP='command: [sh, -c, "trap \"exit 0\" TERM; sleep 3600 & wait"]'
cycle_yaml() {
  local c i
  for ((i = 0; i < COPIES; i++)); do
    c="c$CYCLE-$i"
    pod_yaml "plain-$c" ready Always "  containers: [{name: main, image: $IMAGE, $SLEEP}]"
    pod_yaml "env-$c" ready Always "  containers: [{name: main, image: $IMAGE, $SLEEP, envFrom: [{configMapRef: {name: soak-config}}]}]"
    pod_yaml "secret-$c" ready Always "  containers: [{name: main, image: $IMAGE, $SLEEP, volumeMounts: [{name: s, mountPath: /etc/s}]}]" \
      "  volumes: [{name: s, secret: {secretName: soak-secret}}]"
    pod_yaml "probe-$c" ready Always "  containers: [{name: main, image: $IMAGE, $SLEEP, readinessProbe: {exec: {command: [cat, /proc/1/status]}, periodSeconds: 1}}]"
    pod_yaml "init-$c" ready Always "  initContainers: [{name: init, image: $IMAGE, command: ['true']}]" \
      "  containers: [{name: main, image: $IMAGE, $SLEEP}]"
    pod_yaml "noimage-$c" ErrImagePull Always "  containers: [{name: main, image: $REGISTRY/rkubelet/no-such-image:1.0}]"
    pod_yaml "exit1-$c" Failed Never "  containers: [{name: main, image: $IMAGE, command: [sh, -c, 'exit 1']}]"
    pod_yaml "nocm-$c" CreateContainerConfigError Always "  containers: [{name: main, image: $IMAGE, $SLEEP, envFrom: [{configMapRef: {name: no-such-config}}]}]"
  done
}
PER_CYCLE=$((8 * COPIES))

# Where each pod of the cycle is: Ready, Failed, or its first container's waiting reason.
states() {
  k -n "$NS" get pods -l "soak-cycle=$CYCLE" -o go-template='{{range .items}}{{index .metadata.labels "soak-expect"}} {{.status.phase}}{{range .status.conditions}}{{if eq .type "Ready"}} ready={{.status}}{{end}}{{end}}{{range .status.containerStatuses}} {{if .state.waiting}}{{.state.waiting.reason}}{{end}}{{end}}{{"\n"}}{{end}}'
}

# Whether every pod of the cycle is where its spec leads.
arrived() {
  local lines n=0 expect rest
  lines=$(states) || return 1
  while read -r expect rest; do
    [[ -n $expect ]] || continue
    case $expect in
      ready) [[ $rest == *ready=True* ]] || return 1 ;;
      Failed) [[ $rest == Failed* ]] || return 1 ;;
      ErrImagePull) [[ $rest == *ErrImagePull* || $rest == *ImagePullBackOff* ]] || return 1 ;;
      *) [[ $rest == *"$expect"* ]] || return 1 ;;
    esac
    n=$((n + 1))
  done <<<"$lines"
  ((n == PER_CYCLE))
}

sampler() {
  local start=$1 now rss fds tasks
  echo "elapsed_s,rss_kb,fds,tasks,pods_created" >"$OUT/soak.csv"
  while kill -0 "$AGENT_PID" 2>/dev/null; do
    now=$(date +%s)
    rss=$(awk '/^VmRSS:/{print $2}' "/proc/$AGENT_PID/status" 2>/dev/null) || break
    fds=$(find "/proc/$AGENT_PID/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    tasks=$(find "/proc/$AGENT_PID/task" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    echo "$((now - start)),$rss,$fds,$tasks,$(<"$CREATED_FILE")" >>"$OUT/soak.csv"
    sleep "$SAMPLE_PERIOD"
  done
}

START=$(date +%s)
sampler "$START" &
SAMPLER_PID=$!
log "churning pods for ${DURATION}s ($PER_CYCLE a cycle), samples every ${SAMPLE_PERIOD}s into $OUT/soak.csv"
CYCLE=0
CREATED=0
STUCK=0
while (($(date +%s) - START < DURATION)); do
  CYCLE=$((CYCLE + 1))
  cycle_yaml | k -n "$NS" create -f - >/dev/null
  CREATED=$((CREATED + PER_CYCLE))
  echo "$CREATED" >"$CREATED_FILE"
  deadline=$(($(date +%s) + POD_TIMEOUT))
  until arrived; do
    if (($(date +%s) > deadline)); then
      STUCK=$((STUCK + 1))
      log "cycle $CYCLE: not every pod reached its state in ${POD_TIMEOUT}s:"
      states | sort | uniq -c >&2 || true
      break
    fi
    sleep 1
  done
  kill -0 "$AGENT_PID" 2>/dev/null || die "the agent died (see $OUT/agent.log)"
  k -n "$NS" delete pods -l "soak-cycle=$CYCLE" --wait=true --timeout="${POD_TIMEOUT}s" >/dev/null ||
    { STUCK=$((STUCK + 1)); log "cycle $CYCLE: deletion did not finish in ${POD_TIMEOUT}s"; }
done
# One more sample with every pod gone, then the sampler stops.
sleep "$SAMPLE_PERIOD"
kill "$SAMPLER_PID" 2>/dev/null || true
wait "$SAMPLER_PID" 2>/dev/null || true
SAMPLER_PID=""

# The verdict and the summary.
verdict=0
awk -F, -v warmup="$WARMUP" -v created="$CREATED" -v cycles="$CYCLE" -v stuck="$STUCK" '
  NR == 1 { next }
  { n++; t[n] = $1; rss[n] = $2; fds[n] = $3; tasks[n] = $4; pods[n] = $5 }
  function mean(a, from, to,   s, i) { s = 0; for (i = from; i <= to; i++) s += a[i]; return s / (to - from + 1) }
  function check(name, a, abs, rel, unit,   m2, m3, limit) {
    m2 = mean(a, b2, e2); m3 = mean(a, b3, e3)
    limit = m2 * rel > abs ? m2 * rel : abs
    printf "%-6s first %8d  middle third %10.1f  last third %10.1f  max %8d  growth %+9.1f %s (allowed %.1f)%s\n", \
      name, a[1], m2, m3, maxof(a), m3 - m2, unit, limit, (m3 - m2 > limit ? "  GROWS" : "")
    if (m3 - m2 > limit) bad = 1
  }
  function maxof(a,   i, m) { m = a[1]; for (i = 2; i <= n; i++) if (a[i] > m) m = a[i]; return m }
  END {
    first = 0
    for (i = 1; i <= n; i++) if (t[i] >= warmup) { first = i; break }
    if (first == 0 || n - first + 1 < 6) { print "too few samples after the warm-up to judge"; exit 2 }
    len = int((n - first + 1) / 3)
    b2 = first + len; e2 = first + 2 * len - 1; b3 = first + 2 * len; e3 = n
    printf "%d cycles, %d pods created, %d cycles with pods late or stuck; %d samples, warm-up %d s\n", cycles, created, stuck, n, warmup
    check("rss", rss, 1024, 0.05, "KiB")
    check("fds", fds, 10, 0.10, "")
    check("tasks", tasks, 8, 0.20, "")
    # RSS per pod created after the warm-up: least-squares slope.
    sx = sy = sxx = sxy = 0; m = 0
    for (i = first; i <= n; i++) { m++; sx += pods[i]; sy += rss[i]; sxx += pods[i] * pods[i]; sxy += pods[i] * rss[i] }
    d = m * sxx - sx * sx
    if (d > 0) printf "rss per pod after the warm-up: %+.2f KiB (least squares over %d pods)\n", (m * sxy - sx * sy) / d, pods[n] - pods[first]
    printf "rss start %.1f MiB, after warm-up %.1f MiB, end %.1f MiB\n", rss[1] / 1024, rss[first] / 1024, rss[n] / 1024
    if (stuck * 10 > cycles) { print "too many cycles with pods that did not reach their state"; bad = 1 }
    exit bad
  }' "$OUT/soak.csv" | tee "$OUT/summary.txt" || verdict=$?

# The plot: memory (MiB, left axis), fds and tasks (right axis) over time.
cat >"$OUT/soak.gp" <<EOF
set terminal svg size 900,500 dynamic
set output "$OUT/soak.svg"
set datafile separator ","
set title "rkubelet soak: $CREATED pods in $CYCLE cycles, $(date -u +%Y-%m-%d)"
set xlabel "seconds"
set ylabel "resident memory (MiB)"
set y2label "count"
set y2tics
set ytics nomirror
set yrange [0:*]
set y2range [0:*]
set offsets 0, 0, graph 0.25, 0
set key outside below horizontal
set grid
set arrow from $WARMUP, graph 0 to $WARMUP, graph 1 nohead dashtype 2
set label "warm-up" at $WARMUP, graph 0.95 right offset -0.5, 0
plot "$OUT/soak.csv" using 1:(\$2/1024) with lines lw 2 title "RSS (MiB)", \
     "" using 1:3 axes x1y2 with lines title "open fds", \
     "" using 1:4 axes x1y2 with lines title "tasks"
EOF
if command -v gnuplot >/dev/null; then
  gnuplot "$OUT/soak.gp"
else
  # No gnuplot: three polylines, each scaled to its own maximum.
  awk -F, 'NR > 1 { n++; t[n] = $1; for (c = 2; c <= 4; c++) { v[c, n] = $c; if ($c > mx[c]) mx[c] = $c } }
    END {
      w = 900; h = 500; p = 50
      printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\">\n", w, h
      printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      split("RSS fds tasks", name, " "); split("#c00 #060 #00c", color, " ")
      for (c = 2; c <= 4; c++) {
        printf "<polyline fill=\"none\" stroke=\"%s\" points=\"", color[c - 1]
        for (i = 1; i <= n; i++) printf "%.1f,%.1f ", p + (w - 2 * p) * t[i] / (t[n] ? t[n] : 1), h - p - (h - 2 * p) * v[c, i] / (mx[c] ? mx[c] : 1)
        printf "\"/>\n<text x=\"%d\" y=\"%d\" fill=\"%s\">%s (max %d)</text>\n", p + 200 * (c - 2), 30, color[c - 1], name[c - 1], mx[c]
      }
      printf "<text x=\"%d\" y=\"%d\">seconds 0 to %d; each line scaled to its maximum</text>\n</svg>\n", p, h - 15, t[n]
    }' "$OUT/soak.csv" >"$OUT/soak.svg"
fi
log "results in $OUT (soak.csv, summary.txt, soak.svg, agent.log)"
exit "$verdict"
