#!/bin/bash
# The cluster DNS server of rkubelet's local cluster: BIND (Debian's bind9) serving the
# cluster domain and the reverse zone, authoritative only (no recursion: nothing leaves
# the machine), from zone files this loop writes from the API (zone.jq) whenever a
# Service, an Endpoints or a Pod's IP changes (watches), and at least every 30 s.
# It runs as the cluster-dns pod (kube-system, Service kube-dns), with its service
# account's token (kubectl's in-cluster configuration).
#   CLUSTER_DOMAIN  the cluster domain (cluster.local)
#   POD_IP          the pod's own address (the zones' name server)
set -euo pipefail

DOMAIN=${CLUSTER_DOMAIN:-cluster.local}
DIR=/var/lib/cluster-dns
JQ=/usr/local/share/cluster-dns/zone.jq
EVENTS=$DIR/events
: "${POD_IP:?POD_IP must be set (downward API)}"

log() { printf '%s cluster-dns: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

mkdir -p "$DIR"
cat >"$DIR/named.conf" <<EOF
options {
  directory "$DIR";
  pid-file "$DIR/named.pid";
  listen-on port 53 { any; };
  listen-on-v6 { none; };
  recursion no;
  allow-query { any; };
  dnssec-validation no;
};
zone "$DOMAIN" { type primary; file "$DIR/$DOMAIN.zone"; };
zone "in-addr.arpa" { type primary; file "$DIR/in-addr.arpa.zone"; };
EOF

SERIAL=$(date +%s)
# zone_file ORIGIN RECORDS: a zone with its SOA and NS, then RECORDS.
zone_file() {
  cat <<EOF
\$TTL 5
\$ORIGIN $1.
@ IN SOA ns.dns.$DOMAIN. hostmaster.$DOMAIN. ( $SERIAL 5 5 3600 5 )
@ IN NS ns.dns.$DOMAIN.
EOF
  [[ $1 != "$DOMAIN" ]] || echo "ns.dns.$DOMAIN. IN A $POD_IP"
  printf '%s\n' "$2"
}

# generate: the zones from the API; true if they changed (named must reload them).
LAST=""
generate() {
  local json records forward reverse
  # Checked: a failed read must not empty the zones (set -e is off in a condition).
  json=$(kubectl get services,endpoints,pods --all-namespaces -o json) || { log "reading the API failed"; return 1; }
  records=$(jq -r --arg domain "$DOMAIN" -f "$JQ" <<<"$json" | sort -u) || { log "zone.jq failed"; return 1; }
  [[ $records != "$LAST" ]] || return 1
  LAST=$records
  SERIAL=$((SERIAL + 1))
  forward=$(grep -v '\.in-addr\.arpa\. ' <<<"$records" || true)
  reverse=$(grep '\.in-addr\.arpa\. ' <<<"$records" || true)
  zone_file "$DOMAIN" "$forward" >"$DIR/$DOMAIN.zone.new"
  zone_file in-addr.arpa "$reverse" >"$DIR/in-addr.arpa.zone.new"
  mv "$DIR/$DOMAIN.zone.new" "$DIR/$DOMAIN.zone"
  mv "$DIR/in-addr.arpa.zone.new" "$DIR/in-addr.arpa.zone"
  log "zones serial $SERIAL: $(grep -c . <<<"$records") records"
}

until generate; do sleep 1; done
named -g -c "$DIR/named.conf" &
NAMED=$!
trap 'kill -TERM "$NAMED" 2>/dev/null; exit 0' TERM INT

# One line on EVENTS per change that matters: any Service or Endpoints event, a Pod's IP
# seen for the first time. Each watch starts again when the API server ends it.
rm -f "$EVENTS"
mkfifo "$EVENTS"
exec 3<>"$EVENTS"
watch() {
  while :; do
    kubectl get "$@" --all-namespaces --watch-only --request-timeout=0 || true
    sleep 1
  done
}
watch services -o name >&3 &
watch endpoints -o name >&3 &
watch pods -o 'jsonpath={.metadata.namespace}/{.metadata.name} {.status.podIP}{"\n"}' | awk '!seen[$0]++ { print; fflush() }' >&3 &

while kill -0 "$NAMED" 2>/dev/null; do
  if read -r -t 30 -u 3 _; then
    # Changes come in bursts: take them all, then write the zones at most once a second.
    while read -r -t 0.3 -u 3 _; do :; done
  fi
  if generate; then kill -HUP "$NAMED"; fi
  sleep 1
done
log "named exited"
wait "$NAMED"
