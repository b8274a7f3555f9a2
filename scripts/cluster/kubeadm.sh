# shellcheck shell=bash
# The nodes that join as `kubeadm join` joins a worker (kind-style nodes, VM nodes): what
# kubeadm writes before it restarts the kubelet (the KubeletConfiguration from the
# cluster's kubelet-config, kubeadm-flags.env, the bootstrap kubeconfig with the cluster's
# bootstrap token, the cluster CA, the static pod dir), and what adding one takes whatever
# it is (checks, an address recorded first, the join or the removal).
# Sourced by scripts/cluster.sh.

# node_join_checks KIND NAME DRIVER BINARY: what every joining node needs: a name (a DNS
# label) no node of $REC/KIND-nodes has, a cgroup driver, an rkubelet binary, the cluster up.
node_join_checks() {
  local kind=$1 name=$2 driver=$3 bin=$4
  [[ $driver == cgroupfs || $driver == systemd ]] || die "--cgroup-driver: cgroupfs or systemd, not '$driver'"
  [[ $name =~ ^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$ ]] || die "bad node name: $name (a DNS label of at most 40 characters)"
  comp_pid kube-apiserver >/dev/null || die "the cluster is not up: run 'cluster.sh up'"
  if awk -v n="$name" '$1 == n {found = 1} END {exit !found}' "$REC/$kind-nodes" 2>/dev/null; then
    die "$kind node $name already exists"
  fi
  [[ -x $bin ]] || die "no rkubelet binary $bin (--binary PATH or RKUBELET_BINARY)"
}

# record_node_address KIND NAME FROM TO: the first address 198.18.0.FROM..TO-1 that no node
# of $REC/KIND-nodes holds, recorded for NAME before anything is made (a node that fails
# half-way is removed like any other); printed.
record_node_address() {
  local kind=$1 name=$2 octet ip
  for ((octet = $3; octet < $4; octet++)); do
    ip="198.18.0.$octet"
    awk -v ip="$ip" '$2 == ip {found = 1} END {exit !found}' "$REC/$kind-nodes" 2>/dev/null || break
  done
  ((octet < $4)) || die "no free address for a $kind node"
  echo "$name $ip" >>"$REC/$kind-nodes"
  echo "$ip"
}

# forget_node KIND NAME: NAME's line out of $REC/KIND-nodes (the file too once empty); the
# DNAT to the control plane once no node uses it.
forget_node() {
  local record="$REC/$1-nodes"
  if [[ -f $record ]]; then
    awk -v n="$2" '$1 != n' "$record" >"$record.new"
    mv "$record.new" "$record"
    [[ -s $record ]] || rm -f "$record"
  fi
  remove_host_dnat_unless_used
}

# join_or_remove KIND NAME ADD LOGS REMOVE ARGS...: `ADD ARGS...` in a subshell not tested
# by `if` or `||`, so that `set -e` ends it at its first failure; when it fails, `LOGS NAME`
# and `REMOVE NAME`, and the command fails.
join_or_remove() {
  local kind=$1 name=$2 add=$3 logs=$4 remove=$5 rc
  shift 5
  set +e
  ("$add" "$@")
  rc=$?
  set -e
  if ((rc != 0)); then
    log "$kind node $name failed: removing it"
    "$logs" "$name" >&2 || true
    "$remove" "$name"
    die "$kind node $name could not join"
  fi
}

# kubeadm_kubelet_config DRIVER: the KubeletConfiguration kubeadm v1.20 renders for a
# worker (its zero durations; everything else the kubelet's defaults), with the cgroup
# driver of the node's containerd.
kubeadm_kubelet_config() {
  cat <<EOC
apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: $1
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
cpuManagerReconcilePeriod: 0s
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
rotateCertificates: true
runtimeRequestTimeout: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
EOC
}

# kubeadm_join_files DIR CONFIG FLAGS: the files `kubeadm join` writes, laid out under DIR
# as under the node's root: the bootstrap kubeconfig (the cluster's bootstrap token, the
# API server at $HOST_SERVER), the CA, CONFIG (a KubeletConfiguration) and FLAGS
# (KUBELET_KUBEADM_ARGS), and the static pod dir.
kubeadm_join_files() {
  local dir=$1 config=$2 flags=$3
  bootstrap_token >/dev/null
  install -d -m 0755 "$dir/etc/kubernetes/pki" "$dir/etc/kubernetes/manifests" "$dir/var/lib/kubelet"
  write_kubeconfig "$dir/etc/kubernetes/bootstrap-kubelet.conf" tls-bootstrap-token-user "$HOST_SERVER" \
    "token: $(<"$PKI/bootstrap-token")"
  install -m 0644 "$PKI/ca.crt" "$dir/etc/kubernetes/pki/ca.crt"
  install -m 0644 /dev/null "$dir/var/lib/kubelet/config.yaml"
  echo "$config" >"$dir/var/lib/kubelet/config.yaml"
  install -m 0644 /dev/null "$dir/var/lib/kubelet/kubeadm-flags.env"
  echo "KUBELET_KUBEADM_ARGS=\"$flags\"" >"$dir/var/lib/kubelet/kubeadm-flags.env"
}
