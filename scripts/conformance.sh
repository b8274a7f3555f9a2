#!/usr/bin/env bash
# The Kubernetes conformance suite (e2e.test of the same v1.20.2 tree as the cluster) on
# the multi-node layout, with rkubelet or the real kubelet as every node's agent.
#
#   conformance.sh [--agent rkubelet|kubelet] [--nodes N] [--focus REGEX] [--skip REGEX]
#                  [--parallel P] [--out DIR] [--binary PATH] [--no-serial]
#       builds what is missing (e2e.test, ginkgo, the test images' programs, the images,
#       a release rkubelet), brings up the cluster with N nodes (3; each a network
#       namespace with its own containerd and kube-proxy, docs/multinode.md) and the agent
#       on each, runs the tests matching --focus ('\[Conformance\]') with the suite's own
#       skips for the provider (skeleton): P at a time (4) but the [Serial] ones, then the
#       [Serial] ones one at a time; writes DIR/junit/ (the suite's JUnit files),
#       DIR/results.tsv (one line per test: result, seconds, name), DIR/summary.txt and the
#       suite's output, and takes the cluster down (also on failure).
#   conformance.sh --build-only
#       only builds what is missing.
#   conformance.sh report RKUBELET_DIR KUBELET_DIR
#       the side-by-side report (markdown) of two runs' results.tsv: both pass, only the
#       kubelet passes, only rkubelet passes, both fail; a test whose name matches a line of
#       scripts/conformance-causes.tsv (REGEX, tab, cause) is given that cause.
#
# Holds the cluster while it runs: take the machine's cluster lock around it when others
# share the machine. Everything here is the same for both agents: the layout, the images,
# the routes the control plane gets to the pods and Services (it needs them for webhooks,
# aggregated APIs and the proxy subresources), the inter-node pod routes (host-gw: the
# agent's own for rkubelet, this script's for the kubelet, as flannel would program them).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/kubernetes-build.sh"
cd "$RKUBELET_REPO"
export KUBECONFIG="$KUBECONFIG_ADMIN"

E2E_DIR="$RKUBELET_CACHE/kubernetes-$K8S_VERSION/e2e"
E2E_TARGETS=(test/e2e/e2e.test vendor/github.com/onsi/ginkgo/ginkgo test/images/agnhost
  vendor/k8s.io/sample-apiserver test/images/nonewprivs)
# Files of the tree the images are made of, and the suite's list of conformance tests.
E2E_KEEP="build/pause/linux/pause.c test/images/kitten/html test/images/nautilus/html \
test/images/agnhost/porter/localhost.crt test/images/agnhost/porter/localhost.key \
test/conformance/testdata/conformance.yaml"
HOST_PREFIX="rk-host" # the nodes cluster.sh add-nodes makes
CLUSTER_DNS="10.96.0.10"
CLUSTER_DOMAIN="cluster.local"
# The same hard eviction thresholds and image GC for both agents: the kubelet's defaults
# but for the disk (this machine's disk is shared by several builds and often more than
# 90 % full: 10 % would taint every node with disk-pressure), and no image garbage
# collection (an image the suite pulls stays for the run).
EVICTION_HARD="memory.available<100Mi,nodefs.available<2%,imagefs.available<2%,nodefs.inodesFree<5%"
IMAGE_GC_HIGH=100

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -n 's/^# \{0,1\}//p' >&2
  exit 2
}

# ---------------------------------------------------------------- build

ensure_suite() {
  local t missing=0
  for t in "${E2E_TARGETS[@]}"; do [[ -x $E2E_DIR/${t##*/} ]] || missing=1; done
  [[ -f $E2E_DIR/src/build/pause/linux/pause.c ]] || missing=1
  if ((missing)); then
    K8S_BUILD_KEEP=$E2E_KEEP k8s_build "$E2E_DIR" "${E2E_TARGETS[@]}"
  fi
  log "suite: $("$E2E_DIR/e2e.test" --version 2>/dev/null || echo e2e.test) in $E2E_DIR"
}

# ---------------------------------------------------------------- nodes and agents

k() { kubectl "$@" 2> >(grep -v 'version difference' >&2); }

# The agent on every node (cluster.sh start-agents), the Nodes Ready, and the routes to
# their pods: the control plane's (webhooks, aggregated API servers, proxy subresources)
# and, for the kubelet, those between the nodes (rkubelet programs its own: host-gw).
start_agents() {
  local h between=()
  case $AGENT in
    rkubelet)
      bash scripts/cluster.sh start-agents --pod-network-routes host-gw --binary "$BINARY" -- \
        --cluster-dns "$CLUSTER_DNS" --cluster-domain "$CLUSTER_DOMAIN" \
        --eviction-hard "$EVICTION_HARD" --image-gc-high-threshold "$IMAGE_GC_HIGH"
      ;;
    kubelet)
      # (its --eviction-hard adds to start-agents' empty one; so does its GC threshold)
      bash scripts/cluster.sh start-agents --agent kubelet -- \
        --cluster-dns="$CLUSTER_DNS" --cluster-domain="$CLUSTER_DOMAIN" \
        --eviction-hard="$EVICTION_HARD" --image-gc-high-threshold="$IMAGE_GC_HIGH"
      between=(--between-nodes)
      ;;
  esac
  for h in "${HOSTS[@]}"; do wait_node_ready "$h" 240 "agent logs: $RKUBELET_STATE/logs"; done
  bash scripts/cluster.sh pod-routes "${between[@]}"
  log "$AGENT: nodes ${HOSTS[*]} Ready"
}

# The cluster DNS add-on (scripts/cluster-dns): BIND serving the cluster domain from the
# API, as a Deployment on the nodes behind the Service kube-dns at $CLUSTER_DNS.
start_cluster_dns() {
  sed -e "s|IMAGE|$(bash scripts/conformance-images.sh dns-image)|; s|CLUSTER_DNS|$CLUSTER_DNS|" \
    -e "s|CLUSTER_DOMAIN|$CLUSTER_DOMAIN|" scripts/cluster-dns/cluster-dns.yaml | k apply -f - >/dev/null
  k -n kube-system rollout status deployment/cluster-dns --timeout=300s >/dev/null ||
    die "the cluster DNS did not become ready"
  log "cluster DNS ready at $CLUSTER_DNS ($CLUSTER_DOMAIN)"
}

# ---------------------------------------------------------------- the suite

# The serial phase's focus: the tests FOCUS matches that are [Serial] (RE2 has no
# look-ahead: either order).
serial_focus() { echo "(\\[Serial\\].*($1))|(($1).*\\[Serial\\])"; }

# run_suite NAME PARALLEL FOCUS SKIP: one e2e.test run (through ginkgo when PARALLEL > 1),
# its JUnit files in $OUT/junit/NAME, its output in $OUT/NAME.log.
run_suite() {
  local name=$1 parallel=$2 focus=$3 skip=$4 rc=0
  local -a args=(
    --kubeconfig="$KUBECONFIG_ADMIN" --provider=skeleton --num-nodes="${#HOSTS[@]}"
    --kubectl-path="$K8S_BIN/kubectl" --report-dir="$OUT/junit/$name" --report-prefix="$name"
    --docker-config-file="$OUT/docker-config.json" --allowed-not-ready-nodes=0
    --dns-domain="$CLUSTER_DOMAIN"
    --ginkgo.noColor --ginkgo.focus="$focus"
  )
  [[ -z $skip ]] || args+=(--ginkgo.skip="$skip")
  mkdir -p "$OUT/junit/$name"
  log "$name: e2e.test, $parallel at a time, focus \"$focus\"${skip:+, skip \"$skip\"} (output: $OUT/$name.log)"
  local start=$SECONDS
  if ((parallel > 1)); then
    KUBE_TEST_REPO_LIST="$OUT/repo-list.yaml" "$E2E_DIR/ginkgo" -nodes="$parallel" -noColor \
      "$E2E_DIR/e2e.test" -- "${args[@]}" >"$OUT/$name.log" 2>&1 || rc=$?
  else
    KUBE_TEST_REPO_LIST="$OUT/repo-list.yaml" "$E2E_DIR/e2e.test" "${args[@]}" >"$OUT/$name.log" 2>&1 || rc=$?
  fi
  echo "$name $((SECONDS - start))" >>"$OUT/phases"
  log "$name: done in $((SECONDS - start)) s (exit $rc); $(grep -E '^(Ran|FAIL|SUCCESS)' "$OUT/$name.log" | tr '\n' ' ')"
}

# junit_results FILE...: one line per test case: passed|failed|skipped, seconds, name
# (ginkgo's JUnit: a <testcase> with a <failure> failed, with <skipped> was skipped).
junit_results() {
  awk '
    function attr(s, a,   r) {
      if (match(s, a "=\"[^\"]*\"")) { r = substr(s, RSTART + length(a) + 2, RLENGTH - length(a) - 3); return r }
      return ""
    }
    function unescape(s) {
      gsub(/&#34;|&quot;/, "\"", s); gsub(/&#39;|&apos;/, "\047", s); gsub(/&lt;/, "<", s)
      gsub(/&gt;/, ">", s); gsub(/&#x9;/, " ", s); gsub(/&amp;/, "\\&", s); return s
    }
    /<testcase / { name = unescape(attr($0, "name")); t = attr($0, "time"); state = "passed"; open = 1 }
    open && /<failure|<error/ { state = "failed" }
    open && /<skipped/ { state = "skipped" }
    open && (/<\/testcase>/ || /<testcase [^>]*\/>/) { printf "%s\t%.1f\t%s\n", state, t, name; open = 0 }
  ' "$@"
}

write_results() {
  local files=()
  mapfile -t files < <(find "$OUT/junit" -name '*.xml' | sort)
  ((${#files[@]} > 0)) || die "no JUnit files in $OUT/junit: the suite did not run (see $OUT/*.log)"
  # [BeforeSuite]/[AfterSuite] entries of each parallel node are not tests.
  # Tests out of focus are "skipped" in 0 s: left out; a test the suite skipped itself (a
  # provider or feature it needs) took some time to decide so, and stays.
  junit_results "${files[@]}" | grep -vP '\t\[(Before|After)Suite\]$' |
    awk -F'\t' '!($1 == "skipped" && $2 == "0.0")' | sort -t $'\t' -k3 >"$OUT/results.tsv"
  local passed failed skipped
  passed=$(grep -c '^passed' "$OUT/results.tsv" || true)
  failed=$(grep -c '^failed' "$OUT/results.tsv" || true)
  skipped=$(grep -c '^skipped' "$OUT/results.tsv" || true)
  {
    echo "agent: $AGENT"
    echo "commit: $(git -C "$RKUBELET_REPO" rev-parse --short HEAD)$(git -C "$RKUBELET_REPO" diff --quiet HEAD || echo ' (with local changes)')"
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "nodes: ${#HOSTS[@]}; parallel: $PARALLEL; focus: $FOCUS${SKIP:+; skip: $SKIP}"
    while read -r phase secs; do echo "phase $phase: $secs s"; done <"$OUT/phases"
    echo "wall: $(awk '{ s += $2 } END { print s }' "$OUT/phases") s"
    echo "ran: $((passed + failed)); passed: $passed; failed: $failed; skipped: $skipped"
  } >"$OUT/summary.txt"
  cat "$OUT/summary.txt" >&2
  grep '^failed' "$OUT/results.tsv" | cut -f3 | sed 's/^/  failed: /' >&2 || true
}

# ---------------------------------------------------------------- report

# report RKUBELET_DIR KUBELET_DIR: the two runs side by side (markdown), each test with its
# known cause from $CAUSES when one matches its name.
CAUSES="$RKUBELET_REPO/scripts/conformance-causes.tsv"
cmd_report() {
  local rk=$1 kl=$2 group
  [[ -f $rk/results.tsv && -f $kl/results.tsv ]] || die "usage: $0 report RKUBELET_DIR KUBELET_DIR (each with results.tsv)"
  local joined
  joined=$(join -t $'\t' -1 1 -2 1 -a 1 -a 2 -e missing -o 0,1.2,1.3,2.2,2.3 \
    <(awk -F'\t' '$1 != "skipped" { print $3 "\t" $1 "\t" $2 }' "$rk/results.tsv" | sort -t $'\t' -k1,1) \
    <(awk -F'\t' '$1 != "skipped" { print $3 "\t" $1 "\t" $2 }' "$kl/results.tsv" | sort -t $'\t' -k1,1))
  echo "| | rkubelet | kubelet |"
  echo "|---|---|---|"
  # (a focus's | would end a table cell: escaped)
  awk -F': ' 'NR == FNR { v[$1] = substr($0, length($1) + 3); gsub(/\|/, "\\|", v[$1]); next }
    { r = substr($0, length($1) + 3); gsub(/\|/, "\\|", r); printf "| %s | %s | %s |\n", $1, r, v[$1] }' "$kl/summary.txt" "$rk/summary.txt"
  for group in "both pass:passed:passed" "only the kubelet passes:failed|missing:passed" \
    "only rkubelet passes:passed:failed|missing" "both fail:failed|missing:failed|missing"; do
    local title=${group%%:*} rest=${group#*:}
    local want_rk=${rest%%:*} want_kl=${rest#*:} lines
    lines=$(awk -F'\t' -v a="^($want_rk)\$" -v b="^($want_kl)\$" '$2 ~ a && $4 ~ b' <<<"$joined")
    echo
    echo "### $title: $(grep -c . <<<"$lines" || true)"
    echo
    [[ -z $lines ]] || awk -F'\t' '
      BEGIN { n = 0 }
      NR == FNR { if ($0 !~ /^#/ && NF >= 2) { re[n] = $1; why[n] = $2; n++ }; next }
      { c = ""; for (i = 0; i < n; i++) if ($1 ~ re[i]) { c = " — " why[i]; break }
        printf "- %s (rkubelet %s s, kubelet %s s)%s\n", $1, $3, $5, c }' "$CAUSES" - <<<"$lines"
  done
}

# ---------------------------------------------------------------- main

AGENT=rkubelet
NODES=3
FOCUS='\[Conformance\]'
SKIP=""
PARALLEL=4
OUT=""
BINARY=""
SERIAL=1
BUILD_ONLY=0
if [[ ${1:-} == report ]]; then
  shift
  cmd_report "$@"
  exit 0
fi
while [[ $# -gt 0 ]]; do
  case $1 in
    --agent) AGENT=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --focus) FOCUS=$2; shift 2 ;;
    --skip) SKIP=$2; shift 2 ;;
    --parallel) PARALLEL=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --binary) BINARY=$2; shift 2 ;;
    --no-serial) SERIAL=0; shift ;;
    --build-only) BUILD_ONLY=1; shift ;;
    *) usage ;;
  esac
done
[[ $AGENT == rkubelet || $AGENT == kubelet ]] || usage
if ! [[ $NODES =~ ^[0-9]+$ && $PARALLEL =~ ^[0-9]+$ ]] || ((NODES < 1 || NODES > 10 || PARALLEL < 1)); then
  usage
fi
[[ $(id -u) -eq 0 ]] || die "conformance.sh must run as root"

ensure_suite
bash scripts/conformance-images.sh build
if [[ $AGENT == rkubelet && -z $BINARY ]]; then
  log "building rkubelet (release)"
  cargo build --locked --release --bin rkubelet
  BINARY="$RKUBELET_REPO/target/release/rkubelet"
fi
((BUILD_ONLY == 0)) || exit 0

OUT=${OUT:-$RKUBELET_CACHE/conformance/$AGENT-$(date -u +%Y%m%dT%H%M%S)}
rm -rf "$OUT"
mkdir -p "$OUT/logs" "$OUT/junit"
: >"$OUT/phases"
log "results in $OUT"
HOSTS=()
for ((i = 1; i <= NODES; i++)); do HOSTS+=("$HOST_PREFIX$i"); done

cleanup() {
  local rc=$? h
  for h in "${HOSTS[@]}"; do
    cp "$RKUBELET_STATE/logs/"{rkubelet,kubelet}@"$h.log" "$OUT/logs/" 2>/dev/null || true
  done
  bash scripts/cluster.sh down || rc=1
  bash scripts/cluster.sh leak-check || rc=1
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bash scripts/cluster.sh down
bash scripts/cluster.sh up
bash scripts/cluster.sh add-nodes "$NODES"
bash scripts/conformance-images.sh load
bash scripts/conformance-images.sh repo-list >"$OUT/repo-list.yaml"
bash scripts/conformance-images.sh docker-config >"$OUT/docker-config.json"
start_agents
start_cluster_dns

run_suite parallel "$PARALLEL" "$FOCUS" "\\[Serial\\]${SKIP:+|$SKIP}"
if ((SERIAL)); then
  run_suite serial 1 "$(serial_focus "$FOCUS")" "$SKIP"
fi
write_results
