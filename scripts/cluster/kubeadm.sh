# shellcheck shell=bash
# What `kubeadm join` writes on a worker before it restarts the kubelet, for the nodes
# that join as kubeadm joins them (kind-style nodes, VM nodes): the KubeletConfiguration
# from the cluster's kubelet-config, kubeadm-flags.env, the bootstrap kubeconfig with the
# cluster's bootstrap token, the cluster CA, the static pod dir.
# Sourced by scripts/cluster.sh.

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
