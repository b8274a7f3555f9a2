#!/usr/bin/env bash
# The main job: set up this machine, bring up the local cluster, start rkubelet as the
# node agent of node rk-node1 (with only its node identity), and follow the seed's story:
# `kubectl create deployment nginx --image=nginx --replicas=3`, until the pods serve HTTP.
# Then tells the story of one pod with `rkubelet inspect` (scripts/story.sh).
# Leaves everything running; stop it all with `scripts/cluster.sh down`.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$RKUBELET_REPO"

bash scripts/setup.sh
log "building rkubelet (release)"
cargo build --locked --release
bash scripts/cluster.sh up

rk="$RKUBELET_REPO/target/release/rkubelet"
"$rk" cri version
"$rk" cri status || true

bash scripts/cluster.sh start-agent "$rk" run \
  --kubeconfig "$RKUBELET_STATE/pki/node-$NODE_NAME.kubeconfig" \
  --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
  --root-dir "$RKUBELET_STATE/rkubelet" --pod-logs-dir "$RKUBELET_STATE/rkubelet/logs" \
  --network-owner agent \
  --cni-conf-dir "$RKUBELET_REPO/cni-config" --cni-bin-dir /usr/lib/cni \
  --runtime-cni-conf-dir "$RKUBELET_STATE/cni/net.d" --runtime-cni-bin-dir "$RKUBELET_STATE/cni/bin" \
  --resolv-conf "" \
  --address "$NODE_IP" --client-ca-file "$RKUBELET_STATE/pki/ca.crt" \
  --tls-cert-file "$RKUBELET_STATE/pki/node-$NODE_NAME-serving.crt" \
  --tls-private-key-file "$RKUBELET_STATE/pki/node-$NODE_NAME-serving.key"

export KUBECONFIG="$KUBECONFIG_ADMIN"
k() { kubectl "$@" 2> >(grep -v 'version difference' >&2); }
log "waiting for node $NODE_NAME to be Ready"
k wait --for=condition=Ready "node/$NODE_NAME" --timeout=60s
k create deployment nginx --image=nginx --replicas=3
k rollout status deployment/nginx --timeout=120s
k get pods -o wide
ip=$(k get pods -l app=nginx -o jsonpath='{.items[0].status.podIP}')
log "HTTP answer of pod $ip:"
curl -sS -i "http://$ip/" | head -n 12
# How the pod is wired and where its start-up time went, as `rkubelet inspect` shows it.
bash scripts/story.sh "$RKUBELET_STATE/story"
log "the story's outputs and pictures (node.svg, timeline.svg): $RKUBELET_STATE/story (the README tells it)"
log "rkubelet's log: $RKUBELET_STATE/logs/rkubelet.log; stop everything with: bash scripts/cluster.sh down"
