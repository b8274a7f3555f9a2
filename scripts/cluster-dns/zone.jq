# The cluster's DNS records, from a List of Services, Endpoints and Pods (what
# `kubectl get services,endpoints,pods -A -o json` prints), as the Kubernetes DNS
# specification (kube-dns, CoreDNS's kubernetes plugin) gives them, in zone file lines
# (one record a line, fully qualified names). $domain: the cluster domain (cluster.local).
#   - a Service with a cluster IP: <svc>.<ns>.svc A <cluster IP>, its PTR, and an SRV
#     record _<port>._<proto>.<svc>.<ns>.svc for each named port;
#   - a headless Service: an A record for each ready address of its Endpoints, and
#     <hostname>.<svc>.<ns>.svc (the address's hostname, else its IP with dashes) A, PTR
#     and SRV records for each named port;
#   - an ExternalName Service: a CNAME to its external name;
#   - a Pod with an IP of its own (not the host's): <a-b-c-d>.<ns>.pod A <its IP>.
def dashed: gsub("\\."; "-");
def reverse_name: split(".") | reverse | join(".") + ".in-addr.arpa.";
def rr($name; $type; $data): "\($name) IN \($type) \($data)";
def srv($name; $ports; $target):
  $ports[]? | select((.name // "") != "")
  | rr("_\(.name)._\(.protocol // "TCP" | ascii_downcase).\($name)"; "SRV"; "0 100 \(.port) \($target)");

.items as $items
| ($items | map(select(.kind == "Endpoints") | {key: "\(.metadata.namespace)/\(.metadata.name)", value: .})
   | from_entries) as $endpoints
| (
    ($items[] | select(.kind == "Service") | . as $svc
     | "\(.metadata.name).\(.metadata.namespace).svc.\($domain)." as $fqdn
     | if .spec.type == "ExternalName" then
         select((.spec.externalName // "") != "") | rr($fqdn; "CNAME"; "\(.spec.externalName | rtrimstr(".")).")
       elif (.spec.clusterIP // "None") != "None" and .spec.clusterIP != "" then
         rr($fqdn; "A"; .spec.clusterIP),
         rr(.spec.clusterIP | reverse_name; "PTR"; $fqdn),
         srv($fqdn; .spec.ports; $fqdn)
       else
         $endpoints["\(.metadata.namespace)/\(.metadata.name)"].subsets[]? | . as $subset
         | .addresses[]? | "\(.hostname // (.ip | dashed)).\($fqdn)" as $host
         | rr($fqdn; "A"; .ip), rr($host; "A"; .ip), rr(.ip | reverse_name; "PTR"; $host),
           srv($fqdn; $subset.ports; $host)
       end),
    ($items[] | select(.kind == "Pod" and (.spec.hostNetwork | not) and (.status.podIP // "") != "")
     | rr("\(.status.podIP | dashed).\(.metadata.namespace).pod.\($domain)."; "A"; .status.podIP))
  )
