#!/usr/bin/env bash
# The images the Kubernetes v1.20.2 e2e suite asks for (test/utils/image/manifest.go), made
# here and never pulled: the in-tree test images from the tree itself (their programs built
# by conformance.sh from the same source package as the cluster: agnhost, sample-apiserver,
# nonewprivs, and the tree's pause.c), the others from Debian packages, as images.sh makes
# the cluster's images (oci-image.sh).
#
#   conformance-images.sh build       make the archives in $IMAGES_CACHE/conformance
#                                     (an archive whose inputs did not change is kept)
#   conformance-images.sh load        push them to the local registries under the names
#                                     the suite asks for once remapped by repo-list
#   conformance-images.sh repo-list   print the suite's KUBE_TEST_REPO_LIST file
#   conformance-images.sh dns-image   print the cluster DNS image's name
#   conformance-images.sh docker-config  print the --docker-config-file of the private
#                                     registry test (the private registry's test user)
#
# The suite's registries are remapped to the local ones (repo-list): gcr.io and k8s.gcr.io
# names become paths in $REGISTRY, the authenticated ones paths in $PRIVATE_REGISTRY (the
# one that needs a password), docker.io/library stays (containerd's docker.io mirror is
# the local registry) and invalid.com stays (the "invalid registry" test must fail to
# pull). Versions are the suite's names: agnhost is the tree's (2.25 in its VERSION file)
# under the 2.21 the suite asks for, busybox is Debian's 1.35 as busybox:1.29, and so on.
#
# Images the suite names but nothing here makes (their tests fail for want of them; see
# docs/conformance.md): the volume servers (nfs, iscsi, gluster, rbd: kernel servers in
# a container), cuda-vector-add (a GPU), apparmor-loader, the Windows images, redis,
# echoserver, resource-consumer, the prometheus and stackdriver exporters, perl,
# debian-iptables, the gluster and nfs provisioners, regression-issue-74839, ipc-utils,
# metadata-concealment.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/oci-image.sh"

# Where conformance.sh keeps what it built from the tree: the test images' programs and
# the few source files (src/...) some images are made of.
E2E_DIR="$RKUBELET_CACHE/kubernetes-$K8S_VERSION/e2e"
IMAGES_CACHE="$IMAGES_CACHE/conformance"
WORK="$IMAGES_CACHE/work"

# The suite's registries, remapped (KUBE_TEST_REPO_LIST keys).
E2E_REGISTRY="$REGISTRY/kubernetes-e2e-test-images"
PROMOTER_REGISTRY="$REGISTRY/e2e-test-images"
GC_REGISTRY="$REGISTRY/k8s-gcr-io"
AUTH_REGISTRY="$PRIVATE_REGISTRY/authenticated-image-pulling"
PRIVATE_TEST_REGISTRY="$PRIVATE_REGISTRY/k8s-authenticated-test"
LIBRARY="docker.io/library"
DNS_IMAGE="$REGISTRY/rkubelet/cluster-dns:1.0"

# The images this script makes, in build order; each is $IMAGES_CACHE/<key>.tar.
IMAGES=(agnhost kitten nautilus jessie-dnsutils httpd httpd-new pause nonroot nonewprivs etcd sample-apiserver
  cluster-dns)

AGNHOST_PACKAGES="bash,curl,netcat-openbsd,iproute2,iperf,bind9-dnsutils"
HTTPD_PACKAGES="apache2"
DNS_PACKAGES="bind9,jq"
DNS_DIR="$RKUBELET_REPO/scripts/cluster-dns"
BUSYBOX_BIN=/bin/busybox
ETCD_BIN=/usr/bin/etcd

need_file() { [[ -e $1 ]] || die "missing $1 (${2:-run: scripts/conformance.sh --build-only})"; }

# A busybox root file system (the cluster's busybox image is the same): for the images
# whose upstream base is only a shell.
busybox_tree() {
  local root=$1 applet
  need_file "$BUSYBOX_BIN" "apt-get install busybox-static"
  install -d -m 0755 "$root"/{bin,dev,etc,proc,sys,usr/bin,usr/local/bin}
  install -d -m 1777 "$root/tmp"
  install -m 0755 "$BUSYBOX_BIN" "$root/bin/busybox"
  while read -r applet; do
    [[ $applet == busybox ]] || ln -s busybox "$root/bin/$applet"
  done < <("$BUSYBOX_BIN" --list)
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' >"$root/etc/group"
}

# config_with FIELDS: an image config with PATH, the root as working dir, and FIELDS (a jq
# object).
config_with() { jq -cn --arg path "PATH=$DEFAULT_PATH" "{Env: [\$path], WorkingDir: \"/\"} + $1"; }

# ---- agnhost: the tree's test/images/agnhost on Debian with the tools its Dockerfile adds
# (dig and nslookup, curl, nc, ss and ip, iperf, bash); not CoreDNS, which Debian does not
# package. /agnhost-2 and the porter's certificate as in the Dockerfile.
OWNER[agnhost]=keep
DESCRIPTION[agnhost]="agnhost from the Kubernetes $K8S_VERSION tree on Debian $DEBIAN_SUITE with $AGNHOST_PACKAGES"
agnhost_inputs() {
  need_file "$E2E_DIR/agnhost"
  sha256sum "$E2E_DIR/agnhost" "$E2E_DIR"/src/test/images/agnhost/porter/localhost.*
  cat "$(debian_base_dir agnhost).stamp"
}
agnhost_rootfs() {
  local root=$1
  copy_debian_base agnhost "$root"
  install -m 0755 "$E2E_DIR/agnhost" "$root/agnhost"
  ln -s agnhost "$root/agnhost-2"
  install -d -m 0755 "$root/uploads"
  install -m 0644 "$E2E_DIR"/src/test/images/agnhost/porter/localhost.{crt,key} "$root/"
  ln -sf /usr/bin/iperf "$root/usr/local/bin/iperf"
}
agnhost_verify() { chroot "$1" /agnhost --help >/dev/null || die "agnhost does not run"; }
agnhost_config() {
  config_with '{Entrypoint: ["/agnhost"], Cmd: ["pause"],
    ExposedPorts: {"80/tcp": {}, "8080/tcp": {}, "8081/tcp": {}, "9376/tcp": {}}}'
}
agnhost_names() { echo "$PROMOTER_REGISTRY/agnhost:2.21"; }

# ---- kitten, nautilus: agnhost's test-webserver serving the tree's pictures (one image
# each, their functions made here for both).
picture_rootfs() {
  local root=$1 name=$2
  agnhost_rootfs "$root"
  install -m 0644 "$E2E_DIR/src/test/images/$name/html/$name.jpg" "$E2E_DIR/src/test/images/$name/html/data.json" "$root/"
}
for picture in kitten nautilus; do
  OWNER[$picture]=keep
  DESCRIPTION[$picture]="agnhost test-webserver with the tree's $picture picture"
  eval "${picture}_inputs() { agnhost_inputs; sha256sum \"\$E2E_DIR\"/src/test/images/$picture/html/*; }
    ${picture}_rootfs() { picture_rootfs \"\$1\" $picture; }
    ${picture}_config() { config_with '{Entrypoint: [\"/agnhost\"], Cmd: [\"test-webserver\"], ExposedPorts: {\"80/tcp\": {}}}'; }
    ${picture}_names() { echo \"\$E2E_REGISTRY/$picture:1.0\"; }"
done

# ---- jessie-dnsutils: Debian with dig and nslookup (the DNS tests' prober); the agnhost
# image's Debian root file system without agnhost (bookworm's dnsutils, not jessie's).
OWNER[jessie-dnsutils]=keep
DESCRIPTION[jessie-dnsutils]="Debian $DEBIAN_SUITE with $AGNHOST_PACKAGES"
jessie-dnsutils_inputs() { cat "$(debian_base_dir agnhost).stamp"; }
jessie-dnsutils_rootfs() { copy_debian_base agnhost "$1"; }
jessie-dnsutils_verify() { chroot "$1" dig -v 2>/dev/null || die "jessie-dnsutils: dig does not run"; }
jessie-dnsutils_config() { config_with '{Cmd: ["bash"]}'; }
jessie-dnsutils_names() { echo "$E2E_REGISTRY/jessie-dnsutils:1.0"; }

# ---- httpd: Debian's Apache configured like the upstream httpd image: the document root
# /usr/local/apache2/htdocs (the StatefulSet tests move its index.html away and back to
# fail and pass the readiness probe), "It works!", port 80, logs to the container's
# output, `httpd-foreground`, stopped gracefully by SIGWINCH. Two versions, as the suite
# asks (the new one for rolling updates): the same files, each its own image.
httpd_tree() {
  local root=$1
  copy_debian_base httpd "$root"
  install -d -m 0755 "$root/usr/local/apache2/htdocs"
  echo '<html><body><h1>It works!</h1></body></html>' >"$root/usr/local/apache2/htdocs/index.html"
  chmod 0644 "$root/usr/local/apache2/htdocs/index.html"
  cat >"$root/etc/apache2/sites-available/000-default.conf" <<'EOF'
<VirtualHost *:80>
    DocumentRoot /usr/local/apache2/htdocs
    <Directory /usr/local/apache2/htdocs>
        Require all granted
    </Directory>
</VirtualHost>
EOF
  cat >"$root/etc/apache2/conf-available/container-logs.conf" <<'EOF'
ErrorLog /proc/self/fd/2
CustomLog /proc/self/fd/1 combined
EOF
  ln -sfn ../conf-available/container-logs.conf "$root/etc/apache2/conf-enabled/container-logs.conf"
  cat >"$root/usr/local/bin/httpd-foreground" <<'EOF'
#!/bin/sh
set -e
# Apache gets grumpy about PID files pre-existing
rm -f /var/run/apache2/apache2.pid
. /etc/apache2/envvars
mkdir -p "$APACHE_RUN_DIR" "$APACHE_LOCK_DIR" "$APACHE_LOG_DIR"
exec /usr/sbin/apache2 -DFOREGROUND "$@"
EOF
  chmod 0755 "$root/usr/local/bin/httpd-foreground"
}
# shellcheck disable=SC2016 # expanded by the inner bash
httpd_check() {
  unshare --mount --pid --net --fork --mount-proc bash -c '
    set -e
    root=$1
    mount -t proc proc "$root/proc"
    ip link set lo up
    chroot "$root" /usr/local/bin/httpd-foreground >/dev/null 2>&1 &
    for _ in $(seq 50); do
      page=$(curl -fsS --noproxy "*" http://127.0.0.1:80/index.html 2>/dev/null) && break
      sleep 0.1
    done
    kill -WINCH $!
    wait $! || true
    umount "$root/proc"
    [[ $page == *"It works!"* ]]' _ "$1" || die "httpd: the image's Apache does not serve index.html"
}
httpd_config_of() {
  config_with "{Cmd: [\"httpd-foreground\"], ExposedPorts: {\"80/tcp\": {}}, StopSignal: \"SIGWINCH\",
    Labels: {\"org.opencontainers.image.version\": \"$1\"}}"
}
OWNER[httpd]=keep
DESCRIPTION[httpd]="Debian $DEBIAN_SUITE minbase with $HTTPD_PACKAGES, configured like the upstream httpd image"
httpd_inputs() { cat "$(debian_base_dir httpd).stamp"; }
httpd_rootfs() { httpd_tree "$1"; }
httpd_verify() { httpd_check "$1"; }
httpd_config() { httpd_config_of 2.4.38; }
httpd_names() { echo "$LIBRARY/httpd:2.4.38-alpine"; }
OWNER[httpd-new]=keep
DESCRIPTION[httpd-new]=${DESCRIPTION[httpd]}
httpd-new_inputs() { httpd_inputs; }
httpd-new_rootfs() { httpd_tree "$1"; }
httpd-new_config() { httpd_config_of 2.4.39; }
httpd-new_names() { echo "$LIBRARY/httpd:2.4.39-alpine"; }

# ---- pause: the tree's build/pause/linux/pause.c, built static; /pause as 65535:65535.
OWNER[pause]=root
DESCRIPTION[pause]="build/pause/linux/pause.c of the Kubernetes $K8S_VERSION tree, static"
pause_inputs() { need_file "$E2E_DIR/src/build/pause/linux/pause.c"; sha256sum "$E2E_DIR/src/build/pause/linux/pause.c"; }
pause_rootfs() {
  command -v gcc >/dev/null || die "gcc is needed to build pause.c"
  gcc -Os -static -Wall -Werror -DVERSION=v3.2-rkubelet -o "$1/pause" "$E2E_DIR/src/build/pause/linux/pause.c"
  strip "$1/pause"
}
pause_verify() { "$1/pause" -v >/dev/null || die "pause -v failed"; }
pause_config() { config_with '{User: "65535:65535", Entrypoint: ["/pause"]}'; }
pause_names() { echo "$GC_REGISTRY/pause:3.2"; }

# ---- nonroot: a shell whose default user is 1234 (upstream: debian-base with USER 1234).
OWNER[nonroot]=root
DESCRIPTION[nonroot]="Debian busybox-static, user 1234"
nonroot_inputs() { sha256sum "$BUSYBOX_BIN"; }
nonroot_rootfs() { busybox_tree "$1"; }
nonroot_config() { config_with '{User: "1234", Cmd: ["sh"]}'; }
nonroot_names() { echo "$E2E_REGISTRY/nonroot:1.0"; }

# ---- nonewprivs: the tree's nnp (prints its effective uid), setuid root.
OWNER[nonewprivs]=root
DESCRIPTION[nonewprivs]="nnp from test/images/nonewprivs of the Kubernetes $K8S_VERSION tree, setuid, on busybox"
nonewprivs_inputs() { need_file "$E2E_DIR/nonewprivs"; sha256sum "$E2E_DIR/nonewprivs" "$BUSYBOX_BIN"; }
nonewprivs_rootfs() {
  busybox_tree "$1"
  install -m 4755 "$E2E_DIR/nonewprivs" "$1/usr/local/bin/nnp"
}
nonewprivs_config() { config_with '{Cmd: ["nnp"]}'; }
nonewprivs_names() { echo "$E2E_REGISTRY/nonewprivs:1.0"; }

# ---- etcd: Debian's etcd-server (3.4) at /usr/local/bin/etcd, with the libraries it
# links, on busybox (the aggregator test runs it beside the sample API server).
OWNER[etcd]=root
DESCRIPTION[etcd]="Debian etcd-server at /usr/local/bin/etcd, on busybox"
etcd_inputs() { need_file "$ETCD_BIN" "apt-get install etcd-server"; sha256sum "$ETCD_BIN" "$BUSYBOX_BIN"; }
etcd_rootfs() {
  local root=$1 lib
  busybox_tree "$root"
  install -m 0755 "$ETCD_BIN" "$root/usr/local/bin/etcd"
  while read -r lib; do
    install -D -m 0755 "$lib" "$root$lib"
  done < <(ldd "$ETCD_BIN" | grep -o '/[^ ]*')
}
etcd_verify() { chroot "$1" /usr/local/bin/etcd --version >/dev/null || die "etcd does not run"; }
etcd_config() { config_with '{Cmd: ["/usr/local/bin/etcd"], ExposedPorts: {"2379/tcp": {}, "2380/tcp": {}}}'; }
etcd_names() { echo "$GC_REGISTRY/etcd:3.4.13-0"; }

# ---- sample-apiserver: the tree's k8s.io/sample-apiserver (the aggregator test's).
OWNER[sample-apiserver]=root
DESCRIPTION[sample-apiserver]="k8s.io/sample-apiserver of the Kubernetes $K8S_VERSION tree, on busybox"
sample-apiserver_inputs() { need_file "$E2E_DIR/sample-apiserver"; sha256sum "$E2E_DIR/sample-apiserver" "$BUSYBOX_BIN"; }
sample-apiserver_rootfs() {
  busybox_tree "$1"
  install -m 0755 "$E2E_DIR/sample-apiserver" "$1/sample-apiserver"
}
sample-apiserver_config() { config_with '{Entrypoint: ["/sample-apiserver"]}'; }
sample-apiserver_names() { echo "$E2E_REGISTRY/sample-apiserver:1.17"; }

# ---- cluster-dns: the cluster's DNS server (not one of the suite's images: Debian packages
# no CoreDNS): Debian's BIND serving the zones cluster-dns/cluster-dns.sh writes from the
# API with the tree's kubectl (cluster-dns/cluster-dns.yaml runs it).
OWNER[cluster-dns]=keep
DESCRIPTION[cluster-dns]="Debian $DEBIAN_SUITE minbase with $DNS_PACKAGES, kubectl $K8S_VERSION and cluster-dns.sh"
cluster-dns_inputs() {
  need_file "$K8S_BIN/kubectl" "run: scripts/setup.sh"
  sha256sum "$K8S_BIN/kubectl" "$DNS_DIR/cluster-dns.sh" "$DNS_DIR/zone.jq"
  cat "$(debian_base_dir cluster-dns).stamp"
}
cluster-dns_rootfs() {
  local root=$1
  copy_debian_base cluster-dns "$root"
  install -m 0755 "$K8S_BIN/kubectl" "$root/usr/local/bin/kubectl"
  install -m 0755 "$DNS_DIR/cluster-dns.sh" "$root/usr/local/bin/cluster-dns"
  install -D -m 0644 "$DNS_DIR/zone.jq" "$root/usr/local/share/cluster-dns/zone.jq"
}
cluster-dns_verify() { chroot "$1" named -V >/dev/null || die "cluster-dns: named does not run"; }
cluster-dns_config() { config_with '{Entrypoint: ["/usr/local/bin/cluster-dns"], ExposedPorts: {"53/udp": {}, "53/tcp": {}}}'; }
cluster-dns_names() { echo "$DNS_IMAGE"; }

# Further names of the cluster's own images (images.sh): ARCHIVE NAME DEST [private].
EXTRA_NAMES=(
  "busybox.tar docker.io/library/busybox:latest $LIBRARY/busybox:1.29"
  "nginx.tar docker.io/library/nginx:latest $LIBRARY/nginx:1.14-alpine"
  "nginx.tar docker.io/library/nginx:latest $LIBRARY/nginx:1.15-alpine"
  # The authenticated test image (upstream: alpine; the tests run only `sh`).
  "busybox.tar docker.io/library/busybox:latest $AUTH_REGISTRY/alpine:3.7 private"
)

cmd_build() {
  local start=$SECONDS key
  [[ $(id -u) -eq 0 ]] || die "build must run as root (debootstrap, chroot, namespaces)"
  umask 022
  lock_cache
  ensure_debian_base agnhost "$AGNHOST_PACKAGES"
  ensure_debian_base httpd "$HTTPD_PACKAGES"
  ensure_debian_base cluster-dns "$DNS_PACKAGES"
  for key in "${IMAGES[@]}"; do build_image "$key"; done
  remove_tree "$WORK"
  log "conformance images built in $((SECONDS - start))s"
}

cmd_load() {
  local key name archive extra src dest private creds
  lock_cache
  require_registry
  for key in "${IMAGES[@]}"; do
    archive="$IMAGES_CACHE/$key.tar"
    need_file "$archive" "run: conformance-images.sh build"
    while read -r name; do
      if [[ $name == "$PRIVATE_REGISTRY"/* ]]; then
        push_image "$archive" "$name" "$name" "$PRIVATE_REGISTRY_USER:$PRIVATE_REGISTRY_PASSWORD"
      else
        push_image "$archive" "$name" "$(registry_ref "$name")"
      fi
    done < <(archive_names "$archive")
  done
  for extra in "${EXTRA_NAMES[@]}"; do
    read -r archive src dest private <<<"$extra"
    archive="$RKUBELET_CACHE/images/$archive"
    need_file "$archive" "run: images.sh build"
    creds=""
    [[ -z $private ]] || creds="$PRIVATE_REGISTRY_USER:$PRIVATE_REGISTRY_PASSWORD"
    [[ -n $private ]] || dest=$(registry_ref "$dest")
    push_image "$archive" "$src" "$dest" "$creds"
  done
}

cmd_repo_list() {
  cat <<EOF
dockerLibraryRegistry: $LIBRARY
e2eRegistry: $E2E_REGISTRY
e2eVolumeRegistry: $E2E_REGISTRY/volume
promoterE2eRegistry: $PROMOTER_REGISTRY
buildImageRegistry: $REGISTRY/build-image
gcRegistry: $GC_REGISTRY
sigStorageRegistry: $REGISTRY/sig-storage
gcrReleaseRegistry: $REGISTRY/gke-release
sampleRegistry: $REGISTRY/google-samples
gcAuthenticatedRegistry: $AUTH_REGISTRY
privateRegistry: $PRIVATE_TEST_REGISTRY
invalidRegistry: invalid.com/invalid
EOF
}

cmd_docker_config() {
  jq -n --arg r "$PRIVATE_REGISTRY" \
    --arg a "$(printf '%s:%s' "$PRIVATE_REGISTRY_USER" "$PRIVATE_REGISTRY_PASSWORD" | base64 -w0)" \
    '{auths: {($r): {auth: $a}}}'
}

cmd_dns_image() { echo "$DNS_IMAGE"; }

COMMANDS="build|load|repo-list|docker-config|dns-image"
[[ $# -eq 1 && $1 =~ ^($COMMANDS)$ ]] || { echo "usage: $(basename "$0") $COMMANDS" >&2; exit 2; }
"cmd_${1//-/_}"
