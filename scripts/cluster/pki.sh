# shellcheck shell=bash
# The cluster's identities: its CAs, the components' and nodes' certificates and
# kubeconfigs (openssl), and kubeadm's bootstrap token with its RBAC bindings.
# Sourced by scripts/cluster.sh.

# openssl config for a CA or leaf certificate: $1=kind (ca|client|server|both) $2=SANs
ext_conf() {
  local kind=$1 sans=${2:-}
  echo "[ext]"
  echo "subjectKeyIdentifier = hash"
  if [[ $kind == ca ]]; then
    echo "basicConstraints = critical, CA:TRUE"
    echo "keyUsage = critical, keyCertSign, cRLSign, digitalSignature"
    return
  fi
  echo "authorityKeyIdentifier = keyid"
  echo "basicConstraints = critical, CA:FALSE"
  echo "keyUsage = critical, digitalSignature, keyEncipherment"
  case $kind in
    client) echo "extendedKeyUsage = clientAuth" ;;
    server) echo "extendedKeyUsage = serverAuth" ;;
    both) echo "extendedKeyUsage = serverAuth, clientAuth" ;;
  esac
  [[ -z $sans ]] || echo "subjectAltName = $sans"
}

new_key() { openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1" 2>/dev/null; chmod 600 "$1"; }

# make_ca NAME CN: a self-signed CA NAME.{crt,key}.
make_ca() {
  local name=$1 cn=$2
  [[ -f $PKI/$name.crt ]] && return 0
  [[ -f $PKI/$name.key ]] || new_key "$PKI/$name.key"
  openssl req -x509 -new -key "$PKI/$name.key" -subj "/CN=$cn" -days 3650 -sha256 \
    -config <(printf '[req]\ndistinguished_name=dn\n[dn]\n'; ext_conf ca) -extensions ext \
    -out "$PKI/$name.crt" 2>/dev/null
}

# issue NAME SUBJECT KIND [SANS] [CA]: key + certificate signed by the cluster CA (or CA).
issue() {
  local name=$1 subj=$2 kind=$3 sans=${4:-} ca=${5:-ca}
  [[ -f $PKI/$name.key ]] || new_key "$PKI/$name.key"
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 3650 -sha256 \
    -extfile <(ext_conf "$kind" "$sans") -extensions ext -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr"
}

# kubeconfig FILE USER CERTNAME [SERVER]: a kubeconfig with everything embedded.
kubeconfig() {
  local file=$1 user=$2 cert=$3 server=${4:-$APISERVER}
  write_kubeconfig "$file" "$user" "$server" \
    "client-certificate-data: $(b64 "$PKI/$cert.crt")" \
    "client-key-data: $(b64 "$PKI/$cert.key")"
}

# write_kubeconfig FILE USER SERVER CREDENTIAL...: a kubeconfig (mode 0600) for the
# cluster's CA with the user's credential lines (`token: …`, `client-…-data: …`). It is
# written beside FILE and renamed over it, so a reader (an agent starting while another
# test re-applies the bootstrap token) never sees a half-written file.
write_kubeconfig() {
  local file=$1 user=$2 server=$3 tmp
  shift 3
  tmp=$(mktemp "$file.XXXXXX")
  chmod 600 "$tmp"
  {
    cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: rkubelet
  cluster:
    server: $server
    certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
- name: $user
  user:
EOF
    printf '    %s\n' "$@"
    cat <<EOF
contexts:
- name: $user@rkubelet
  context:
    cluster: rkubelet
    user: $user
current-context: $user@rkubelet
EOF
  } >"$tmp"
  mv -f "$tmp" "$file"
}

# node_credentials NAME [IP]: client identity system:node:NAME (+ kubeconfig) and
# a serving cert for the node's kubelet API (SANs: NAME, IP, 127.0.0.1).
node_credentials() {
  local name=$1 ip=${2:-$NODE_IP}
  [[ $name =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || die "bad node name: $name"
  [[ -f $PKI/ca.key ]] || die "no cluster CA in $PKI: run 'cluster.sh up' first"
  issue "node-$name" "/O=system:nodes/CN=system:node:$name" client
  issue "node-$name-serving" "/O=system:nodes/CN=system:node:$name" server \
    "DNS:$name, IP:$ip, IP:127.0.0.1"
  kubeconfig "$PKI/node-$name.kubeconfig" "system:node:$name" "node-$name"
  log "node credentials for $name: $PKI/node-$name.kubeconfig (serving cert $PKI/node-$name-serving.crt)"
}

make_pki() {
  log "PKI in $PKI"
  mkdir -p "$PKI"
  # Keys in parallel: RSA generation dominates. (A missing key is made again by issue.)
  local k
  for k in ca front-proxy-ca sa apiserver admin apiserver-kubelet-client front-proxy-client \
    controller-manager scheduler "node-$NODE_NAME" "node-$NODE_NAME-serving"; do
    new_key "$PKI/$k.key" &
  done
  wait
  make_ca ca rkubelet-ca
  # Aggregation layer (requestheader) identity, as kubeadm does: its own CA.
  make_ca front-proxy-ca rkubelet-front-proxy-ca
  issue front-proxy-client "/CN=front-proxy-client" client "" front-proxy-ca
  issue apiserver "/CN=kube-apiserver" server \
    "IP:127.0.0.1, IP:10.96.0.1, IP:$NODE_IP, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local"
  issue admin "/O=system:masters/CN=kubernetes-admin" client
  issue apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" client
  issue controller-manager "/CN=system:kube-controller-manager" client
  issue scheduler "/CN=system:kube-scheduler" client
  # Service-account token signing pair.
  [[ -f $PKI/sa.key ]] || new_key "$PKI/sa.key"
  openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  kubeconfig "$KUBECONFIG_ADMIN" kubernetes-admin admin
  kubeconfig "$PKI/controller-manager.kubeconfig" system:kube-controller-manager controller-manager
  kubeconfig "$PKI/scheduler.kubeconfig" system:kube-scheduler scheduler
  node_credentials "$NODE_NAME"
}

# bootstrap_token: what `kubeadm init` makes for `kubeadm join` (phases bootstraptoken):
# a bootstrap token (Secret bootstrap-token-<id> in kube-system, for authentication and
# signing, in group system:bootstrappers:kubeadm:default-node-token), the RBAC bindings
# that let its holders create node CSRs and have them auto-approved (and let nodes renew
# their own client certificates), and a bootstrap kubeconfig holding the token. The token
# is made once and kept in $PKI/bootstrap-token; applying again changes nothing.
BOOTSTRAP_GROUP="system:bootstrappers:kubeadm:default-node-token"
bootstrap_token() {
  [[ -f $PKI/ca.crt ]] || die "no cluster CA in $PKI: run 'cluster.sh up' first"
  # Tests apply it concurrently: one at a time.
  local lock
  exec {lock}>"$PKI/bootstrap-token.lock"
  flock "$lock"
  if [[ ! -s $PKI/bootstrap-token ]]; then
    install -m 600 /dev/null "$PKI/bootstrap-token"
    printf '%s.%s\n' "$(tr -dc 'a-z0-9' </dev/urandom | head -c 6)" \
      "$(tr -dc 'a-z0-9' </dev/urandom | head -c 16)" >"$PKI/bootstrap-token"
  fi
  local token id secret file="$PKI/bootstrap-kubelet.kubeconfig"
  token=$(<"$PKI/bootstrap-token")
  id=${token%%.*} secret=${token#*.}
  kubectl --kubeconfig "$KUBECONFIG_ADMIN" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Secret
metadata:
  name: bootstrap-token-$id
  namespace: kube-system
type: bootstrap.kubernetes.io/token
stringData:
  description: "The default bootstrap token of the rkubelet cluster (as kubeadm init makes)."
  token-id: "$id"
  token-secret: "$secret"
  usage-bootstrap-authentication: "true"
  usage-bootstrap-signing: "true"
  auth-extra-groups: "$BOOTSTRAP_GROUP"
$(bootstrap_binding kubeadm:kubelet-bootstrap system:node-bootstrapper "$BOOTSTRAP_GROUP")
$(bootstrap_binding kubeadm:node-autoapprove-bootstrap \
    system:certificates.k8s.io:certificatesigningrequests:nodeclient "$BOOTSTRAP_GROUP")
$(bootstrap_binding kubeadm:node-autoapprove-certificate-rotation \
    system:certificates.k8s.io:certificatesigningrequests:selfnodeclient system:nodes)
EOF
  write_kubeconfig "$file" tls-bootstrap-token-user "$APISERVER" "token: $token"
  log "bootstrap token $id (group $BOOTSTRAP_GROUP): $file"
  exec {lock}>&-
}

# bootstrap_binding NAME CLUSTERROLE GROUP: a ClusterRoleBinding document.
bootstrap_binding() {
  cat <<EOF
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: $1
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: $2
subjects:
- kind: Group
  apiGroup: rbac.authorization.k8s.io
  name: $3
EOF
}
