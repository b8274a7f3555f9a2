#!/usr/bin/env bash
# Records what the real kubelet v1.20.2 serves to a monitoring stack, the reference
# tests/prometheus.rs holds rkubelet to. On an up cluster (`cluster.sh up`, under the
# cluster lock), with no agent on the node: starts the kubelet with the benchmark's flags,
# runs tests/data/monitoring/workload.yaml on it, lets Debian's Prometheus scrape its four
# endpoints (tests/data/monitoring/prometheus.yml, a service account's token) for
# REFERENCE_SECONDS (default 60), evaluates the kubernetes-mixin's expressions
# (tests/data/kubernetes-mixin/queries.json) and writes to OUT_DIR (default
# tests/data/kubelet-v1.20.2):
#   metrics.txt, cadvisor.txt, resource.txt, probes.txt  each endpoint's answer
#   content-types.txt  the Content-Type each endpoint answers with, per Accept header
#   mixin.json  per query and selector: how many series, and their label names
# Then removes the workload, stops the kubelet and Prometheus (its data dir goes too) and
# puts back what the kubelet changes on the host.
#
#   bash scripts/kubelet-reference.sh [OUT_DIR]
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$RKUBELET_REPO"

OUT="${1:-$RKUBELET_REPO/tests/data/kubelet-v1.20.2}"
mkdir -p "$OUT"
SECONDS_TO_SCRAPE="${REFERENCE_SECONDS:-60}"
DATA="$RKUBELET_REPO/tests/data"
export KUBECONFIG="$KUBECONFIG_ADMIN"
PKI="$RKUBELET_STATE/pki"
[[ -f $PKI/node-$NODE_NAME.kubeconfig ]] || die "no cluster: run 'cluster.sh up' first"
command -v prometheus >/dev/null || die "no prometheus: run scripts/setup.sh"

WORK=$(mktemp -d /tmp/rk-kubelet-reference.XXXXXX)
PV_DIR="$RKUBELET_STATE/mon-pv"
KUBELET_PID="" PROM_PID=""
SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops)
declare -A SYSCTL_BEFORE
for s in "${SYSCTLS[@]}"; do SYSCTL_BEFORE[$s]=$(sysctl -n "$s"); done
DIRS_BEFORE=()
for d in /var/log/pods /var/log/containers /var/lib/kubelet; do [[ -e $d ]] && DIRS_BEFORE+=("$d"); done

stop_pid() { # PID
  [[ -n $1 ]] || return 0
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 150); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
workload() { sed -e "s|NODE_NAME|$NODE_NAME|g" -e "s|PV_DIR|$PV_DIR|g" "$DATA/monitoring/workload.yaml"; }
cleanup() {
  local rc=$?
  stop_pid "$PROM_PID"
  if [[ -n $KUBELET_PID ]]; then
    workload | kubectl delete --ignore-not-found --wait=true --timeout=60s -f - >/dev/null 2>&1 || rc=1
    stop_pid "$KUBELET_PID"
  fi
  kubectl delete --ignore-not-found -f "$DATA/monitoring/rbac.yaml" >/dev/null 2>&1 || true
  for s in "${SYSCTLS[@]}"; do sysctl -qw "$s=${SYSCTL_BEFORE[$s]}" || true; done
  for d in /var/log/pods /var/log/containers /var/lib/kubelet; do
    [[ " ${DIRS_BEFORE[*]} " == *" $d "* ]] || rm -rf "$d"
  done
  rm -rf "$WORK" "$PV_DIR"
  exit "$rc"
}
trap cleanup EXIT

log "starting the kubelet $K8S_VERSION as $NODE_NAME"
mkdir -p "$PV_DIR"
"$K8S_BIN/kubelet" --kubeconfig "$PKI/node-$NODE_NAME.kubeconfig" \
  --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --root-dir "$RKUBELET_STATE/reference-kubelet" \
  --container-runtime=remote --container-runtime-endpoint="unix://$CONTAINERD_SOCK" \
  --cgroup-driver=cgroupfs --cgroups-per-qos=false --enforce-node-allocatable= --fail-swap-on=false \
  --eviction-hard= --image-gc-high-threshold=100 --resolv-conf= --read-only-port=0 \
  --address="$NODE_IP" --anonymous-auth=false --client-ca-file="$PKI/ca.crt" \
  --tls-cert-file="$PKI/node-$NODE_NAME-serving.crt" --tls-private-key-file="$PKI/node-$NODE_NAME-serving.key" \
  --authentication-token-webhook --authorization-mode=Webhook \
  >"$WORK/kubelet.log" 2>&1 &
KUBELET_PID=$!
wait_node_ready "$NODE_NAME" 120 "see $WORK/kubelet.log"

kubectl apply -f "$DATA/monitoring/rbac.yaml" >/dev/null
workload | kubectl apply -f - >/dev/null
kubectl wait --for=condition=Ready pod/mon-web --timeout=120s >/dev/null

kubectl create token mon-prometheus --duration=1h >"$WORK/token" 2>/dev/null
sed -e "s|TARGET|$NODE_IP:10250|" -e "s|CA_FILE|$PKI/ca.crt|" -e "s|TOKEN_FILE|$WORK/token|" \
  -e "s|RULES_FILE|$DATA/kubernetes-mixin/rules.json|" "$DATA/monitoring/prometheus.yml" >"$WORK/prometheus.yml"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log "Prometheus on 127.0.0.1:$port, scraping for $SECONDS_TO_SCRAPE s"
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/data" \
  --web.listen-address="127.0.0.1:$port" >"$WORK/prometheus.log" 2>&1 &
PROM_PID=$!
sleep "$SECONDS_TO_SCRAPE"
curl -fsS "http://127.0.0.1:$port/api/v1/targets" |
  jq -e '[.data.activeTargets[] | select(.health != "up")] | length == 0' >/dev/null ||
  die "a target is not up: $(curl -fsS "http://127.0.0.1:$port/api/v1/targets" | jq -c '[.data.activeTargets[] | {scrapeUrl, health, lastError}]')"

for e in metrics:/metrics cadvisor:/metrics/cadvisor resource:/metrics/resource probes:/metrics/probes; do
  kubectl get --raw "/api/v1/nodes/$NODE_NAME/proxy${e#*:}" >"$OUT/${e%%:*}.txt"
done

# The wire format each kind of client gets: none (curl, kubectl get --raw), Prometheus 2.42's
# Accept header, a text-only one.
PROM_ACCEPT='application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1'
for path in /metrics /metrics/cadvisor /metrics/probes /metrics/resource; do
  for accept in "" "$PROM_ACCEPT" "text/plain;version=0.0.4"; do
    ct=$(curl -fsS -o /dev/null -w '%{content_type}' --cacert "$PKI/ca.crt" \
      -H "Authorization: Bearer $(cat "$WORK/token")" ${accept:+-H "Accept: $accept"} \
      "https://$NODE_IP:10250$path")
    printf '%s\tAccept: %s\t-> %s\n' "$path" "${accept:-(none)}" "$ct"
  done
done >"$OUT/content-types.txt"

# query EXPR: {series, labels} of its answer now.
query() {
  curl -fsS "http://127.0.0.1:$port/api/v1/query" --data-urlencode "query=$1" |
    jq -c '.data.result | {series: length, labels: ([.[].metric | keys[]] | unique)}'
}
log "evaluating the mixin's expressions"
jq -c '.[]' "$DATA/kubernetes-mixin/queries.json" | while read -r entry; do
  q=$(jq -r .query <<<"$entry")
  jq -c --argjson r "$(query "$q")" '{source, query, answer: $r}' <<<"$entry"
  jq -r '.selectors[]' <<<"$entry" | while read -r s; do
    jq -nc --arg s "$s" --argjson r "$(query "$s")" '{selector: $s, answer: $r}'
  done
done | jq -s '.' >"$OUT/mixin.json"
log "wrote $OUT: $(jq '[.[] | select(.answer.series > 0)] | length' "$OUT/mixin.json") of $(jq length "$OUT/mixin.json") queries and selectors have series"
