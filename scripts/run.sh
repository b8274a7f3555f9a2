#!/usr/bin/env bash
# The main job: set up this machine, bring up the local cluster, start rkubelet as the
# node agent (with only its node identity), and follow the seed's story:
# `kubectl create deployment nginx --image=nginx --replicas=3`, until the pods serve HTTP.
#
#   bash scripts/run.sh [--nodes N] [--pod-network-routes none|host-gw|vxlan] [--kind-node|--vm-node]
#
# One node (the default): rkubelet runs node rk-node1 here, and the story of one pod is
# told with `rkubelet inspect` (scripts/story.sh). N > 1 nodes: each node rk-host1..N is its
# own network namespace with its own containerd, kube-proxy and rkubelet (which keeps the
# routes to the other nodes' pod CIDRs in the given mode); the Deployment gets 2 replicas
# per node and a ClusterIP Service, and each node prints an answer of it. --kind-node: the
# Deployment runs on a kind-style node instead (`cluster.sh add-kind-node rk-kind1`: a
# podman container booting systemd, containerd and rkubelet as its kubelet.service, joined
# by bootstrap token with kubeadm's files and the systemd cgroup driver); the answer comes
# from the node's network namespace and `rkubelet inspect` runs inside the node.
# --vm-node: the Deployment runs on a VM node instead (`cluster.sh add-vm-node rk-vm1`: a
# Debian 12 virtual machine on cgroup v2 under qemu's software emulation, booting systemd,
# containerd and rkubelet as its kubelet.service, joined by bootstrap token with kubeadm's
# files and the systemd cgroup driver); the answer and `rkubelet inspect` come from inside
# the VM, and the run says how long the VM took (image, boot, join, the Deployment).
# Leaves everything running; stop it all with `scripts/cluster.sh down`.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$RKUBELET_REPO"

nodes=1 routes=none kind=0 vm=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --nodes) nodes=${2:-}; shift 2 ;;
    --pod-network-routes) routes=${2:-}; shift 2 ;;
    --kind-node) kind=1; shift ;;
    --vm-node) vm=1; shift ;;
    *) die "usage: $0 [--nodes N] [--pod-network-routes none|host-gw|vxlan] [--kind-node|--vm-node]" ;;
  esac
done
((kind == 0 || nodes == 1)) || die "--kind-node runs on one kind-style node: no --nodes"
((vm == 0 || (nodes == 1 && kind == 0))) || die "--vm-node runs on one VM node: no --nodes, no --kind-node"
if ! [[ $nodes =~ ^[0-9]+$ ]] || ((nodes < 1)); then die "--nodes wants a number ≥ 1"; fi
[[ $routes =~ ^(none|host-gw|vxlan)$ ]] || die "--pod-network-routes: none, host-gw or vxlan"

bash scripts/setup.sh
log "building rkubelet (release)"
cargo build --locked --release
bash scripts/cluster.sh up --nodes "$nodes"

rk="$RKUBELET_REPO/target/release/rkubelet"
export KUBECONFIG="$KUBECONFIG_ADMIN"
k() { kubectl "$@" 2> >(grep -v 'version difference' >&2); }

if ((kind == 1)); then
  kind_node="rk-kind1"
  bash scripts/cluster.sh add-kind-node "$kind_node" --binary "$rk"
  in_node() { bash scripts/cluster.sh kind-exec "$kind_node" "$@"; }
  in_node systemctl --no-pager status kubelet | head -n 4
  k get node "$kind_node" -o wide
  k create deployment nginx --image=nginx --replicas=3
  k patch deployment nginx --type=merge \
    -p "{\"spec\":{\"template\":{\"spec\":{\"nodeSelector\":{\"kubernetes.io/hostname\":\"$kind_node\"}}}}}"
  k rollout status deployment/nginx --timeout=120s
  k get pods -o wide
  pod=$(k get pods -l app=nginx -o jsonpath='{.items[0].metadata.name}')
  ip=$(k get pod "$pod" -o jsonpath='{.status.podIP}')
  log "HTTP answer of pod $ip, from the node's network namespace:"
  ip netns exec "rk-kind-$kind_node" curl -sS -i "http://$ip/" | head -n 12
  log "rkubelet inspect pod default/$pod, inside the node:"
  in_node rkubelet inspect pod "default/$pod"
  log "rkubelet inspect node, inside the node:"
  in_node rkubelet inspect node
  log "the pod's cgroup, a slice systemd made (inside the node):"
  in_node systemctl --no-pager list-units --type=slice 'kubepods*'
  log "the node's journal: bash scripts/cluster.sh kind-exec $kind_node journalctl -u kubelet"
elif ((vm == 1)); then
  vm_node="rk-vm1"
  bash scripts/cluster.sh add-vm-node "$vm_node" --binary "$rk"
  in_vm() { bash scripts/cluster.sh vm-exec "$vm_node" "$@"; }
  in_vm systemctl --no-pager status kubelet | head -n 4
  # shellcheck disable=SC2016  # expanded inside the VM
  log "inside the VM: $(in_vm 'echo "$(uname -sr), systemd $(systemctl --version | head -n 1 | cut -d" " -f2), /sys/fs/cgroup is $(stat -fc %T /sys/fs/cgroup)"')"
  k get node "$vm_node" -o wide
  deployed=$SECONDS
  k create deployment nginx --image=nginx --replicas=3
  k patch deployment nginx --type=merge \
    -p "{\"spec\":{\"template\":{\"spec\":{\"nodeSelector\":{\"kubernetes.io/hostname\":\"$vm_node\"}}}}}"
  k rollout status deployment/nginx --timeout=600s
  deployed=$((SECONDS - deployed))
  k get pods -o wide
  pod=$(k get pods -l app=nginx -o jsonpath='{.items[0].metadata.name}')
  ip=$(k get pod "$pod" -o jsonpath='{.status.podIP}')
  log "HTTP answer of pod $ip, from inside the VM:"
  in_vm curl -sS -i "http://$ip/" | head -n 12
  log "rkubelet inspect pod default/$pod, inside the VM:"
  in_vm rkubelet inspect pod "default/$pod"
  log "rkubelet inspect node, inside the VM:"
  in_vm rkubelet inspect node
  log "the pods' cgroups, slices systemd made on cgroup v2 (inside the VM):"
  in_vm systemctl --no-pager list-units --type=slice 'kubepods*'
  read -r image boot join < <(awk '{print $2}' "$RKUBELET_STATE/vm/$vm_node/took" | xargs)
  log "the VM node took: image ${image} s (cached after the first build), boot to SSH ${boot} s," \
    "join to Ready ${join} s, 3 replicas rolled out in ${deployed} s (software emulation: every process is slow)"
  log "inside the VM: bash scripts/cluster.sh vm-exec $vm_node journalctl -u kubelet"
elif ((nodes > 1)); then
  bash scripts/cluster.sh start-agents --binary "$rk" --pod-network-routes "$routes" -- "${KIND_AGENT_FLAGS[@]}"
  log "waiting for $nodes nodes to be Ready"
  for ((i = 1; i <= nodes; i++)); do
    wait_node_ready "rk-host$i" 120 "see $RKUBELET_STATE/logs/rkubelet@rk-host$i.log"
  done
  k create deployment nginx --image=nginx --replicas=$((2 * nodes))
  k rollout status deployment/nginx --timeout=180s
  k expose deployment nginx --port=80
  k get nodes -o custom-columns=NODE:.metadata.name,INTERNAL-IP:.status.addresses[0].address,POD-CIDR:.spec.podCIDR
  k get pods -o wide
  ip=$(k get service nginx -o jsonpath='{.spec.clusterIP}')
  for ((i = 1; i <= nodes; i++)); do
    if [[ $routes == none ]]; then
      # No routes between nodes: only this node's own pods are reachable from it.
      target=$(k get pods -l app=nginx --field-selector "spec.nodeName=rk-host$i" -o jsonpath='{.items[0].status.podIP}')
    else
      target=$ip
    fi
    log "answer of http://$target/ from node rk-host$i:"
    ip netns exec "rk-host$i" curl -sS -m 5 "http://$target/" | grep -m1 '<title>'
  done
  [[ $routes != none ]] || log "pods on different nodes reach each other with --pod-network-routes host-gw or vxlan"
  h="$RKUBELET_STATE/hosts/rk-host1"
  log "a node's pods and routes to the others, e.g. rk-host1's: ip netns exec rk-host1 $rk inspect node" \
    "--hostname-override rk-host1 --root-dir $h/rkubelet --container-runtime-endpoint unix://$h/containerd.sock" \
    "--runtime-cni-conf-dir $h/cni/net.d"
else
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
    --tls-private-key-file "$RKUBELET_STATE/pki/node-$NODE_NAME-serving.key" \
    "${KIND_AGENT_FLAGS[@]}"
  log "waiting for node $NODE_NAME to be Ready"
  wait_node_ready "$NODE_NAME" 60
  k create deployment nginx --image=nginx --replicas=3
  k rollout status deployment/nginx --timeout=120s
  k get pods -o wide
  ip=$(k get pods -l app=nginx -o jsonpath='{.items[0].status.podIP}')
  log "HTTP answer of pod $ip:"
  curl -sS -i "http://$ip/" | head -n 12
  # How the pod is wired and where its start-up time went, as `rkubelet inspect` shows it.
  bash scripts/story.sh "$RKUBELET_STATE/story"
  log "the story's outputs and pictures (node.svg, timeline.svg): $RKUBELET_STATE/story (the README tells it)"
fi
log "use the cluster: export KUBECONFIG=$KUBECONFIG_ADMIN"
log "agent logs: $RKUBELET_STATE/logs/rkubelet*.log; stop everything with: bash scripts/cluster.sh down"
