#!/usr/bin/env bash
# The seed's story, told by this machine: after `kubectl create deployment nginx
# --image=nginx --replicas=3` (the main job, scripts/run.sh), take what `rkubelet
# inspect` shows of one nginx pod and of the node — the pause process and its
# namespaces, the veth pair and the bridge, the IP host-local reserved, the CNI result,
# each step of the pod's start-up — as text, JSON and two pictures, and nginx's answer.
#
#   scripts/story.sh [OUT_DIR]     (default: $RKUBELET_STATE/story)
#
# Needs the main job's cluster and agent running. The README's story was taken this way
# (into docs/story).
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$RKUBELET_REPO"
[[ $(id -u) -eq 0 ]] || die "must run as root (it reads /proc, netlink and the CNI state)"

out=${1:-$RKUBELET_STATE/story}
mkdir -p "$out"
rk=${RKUBELET_BIN:-$RKUBELET_REPO/target/release/rkubelet}
[[ -x $rk ]] || die "no $rk: build it first (cargo build --release)"
# The agent's own flags where they differ from its defaults (as scripts/run.sh starts it).
inspect() {
  "$rk" inspect --root-dir "$RKUBELET_STATE/rkubelet" \
    --runtime-cni-conf-dir "$RKUBELET_STATE/cni/net.d" \
    --kubeconfig "$RKUBELET_STATE/pki/node-$NODE_NAME.kubeconfig" \
    --hostname-override "$NODE_NAME" "$@"
}
export KUBECONFIG="$KUBECONFIG_ADMIN"
k() { kubectl "$@" 2> >(grep -v 'version difference' >&2); }

pod=$(k get pods -l app=nginx -o jsonpath='{.items[0].metadata.name}')
[[ -n $pod ]] || die "no nginx pod: run scripts/run.sh first"
k wait --for=condition=Ready "pod/$pod" --timeout=120s >/dev/null
log "the story of pod default/$pod, into $out"

k get pods -l app=nginx -o wide > "$out/pods.txt"
for what in pod timeline; do
  inspect "$what" "default/$pod" > "$out/$what.txt"
  inspect "$what" "default/$pod" --output json > "$out/$what.json"
done
inspect node > "$out/node.txt"
inspect node --output json > "$out/node.json"
inspect node --output svg > "$out/node.svg"
inspect timeline "default/$pod" --output svg > "$out/timeline.svg"
ip=$(k get pod "$pod" -o jsonpath='{.status.podIP}')
curl -sS -i --max-time 10 "http://$ip/" | head -n 8 > "$out/http.txt"

log "pods:            $out/pods.txt"
log "the pod, wired:  $out/pod.txt (and .json)"
log "the node:        $out/node.txt (and .json), picture $out/node.svg"
log "its start-up:    $out/timeline.txt (and .json), picture $out/timeline.svg"
log "nginx answering: $out/http.txt"
