#!/usr/bin/env bash
# Builds and loads the container images of rkubelet's local cluster and tests.
# Nothing is pulled from the internet: every image is made here, from the project's
# own pause program and from Debian packages, as an OCI image layout written by hand
# (tar, gzip, sha256sum, jq) so that the recipe stays transparent.
#
#   images.sh build   make the OCI image archives in $IMAGES_CACHE (an archive whose
#                     inputs did not change is kept as is)
#   images.sh load    push every image to the local registry $REGISTRY, busybox also to
#                     the private registry $PRIVATE_REGISTRY, and import the pause image
#                     into containerd's k8s.io namespace (all must run)
#   images.sh clean   remove $IMAGES_CACHE
#
# The images (names as users write them, and what they are for):
#   $PAUSE_IMAGE                 (pause.tar)   the pod sandbox image: containerd's
#       sandbox_image, holding each pod's namespaces. Imported into containerd so that
#       RunPodSandbox never pulls.
#   docker.io/library/busybox:latest, also $REGISTRY/rkubelet/busybox:1.35
#                                (busybox.tar) `image: busybox` in test pods: sh, sleep,
#       httpd, wget, nc... from Debian's static busybox. Also $PRIVATE_BUSYBOX, in the
#       registry that needs a password (image pull secret tests).
#   docker.io/library/nginx:latest, also $REGISTRY/rkubelet/nginx:1.22
#                                (nginx.tar)   `image: nginx` in test pods: the real
#       nginx from Debian (nginx-light), configured like the upstream nginx image.
# busybox and nginx are only pushed to the registry: tests pull them through
# containerd's docker.io mirror (http://$REGISTRY), so docker.io/library/X lands in
# the registry as repository library/X.
#
# Test-only overrides: REGISTRY_OVERRIDE and CONTAINERD_SOCK_OVERRIDE replace
# $REGISTRY (and with it the registry part of $PAUSE_IMAGE) and $CONTAINERD_SOCK, to
# try `load` against a throwaway registry and containerd; PRIVATE_REGISTRY_OVERRIDE
# replaces $PRIVATE_REGISTRY (empty: no private push).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ -n ${REGISTRY_OVERRIDE:-} ]]; then
  PAUSE_IMAGE="$REGISTRY_OVERRIDE/${PAUSE_IMAGE#"$REGISTRY"/}"
  REGISTRY=$REGISTRY_OVERRIDE
fi
CONTAINERD_SOCK="${CONTAINERD_SOCK_OVERRIDE:-$CONTAINERD_SOCK}"
PRIVATE_REGISTRY="${PRIVATE_REGISTRY_OVERRIDE-$PRIVATE_REGISTRY}"

BUSYBOX_IMAGE="docker.io/library/busybox:latest"
BUSYBOX_TAG="$REGISTRY/rkubelet/busybox:1.35"
PRIVATE_BUSYBOX="$PRIVATE_REGISTRY/private/busybox:1.35"
NGINX_IMAGE="docker.io/library/nginx:latest"
NGINX_TAG="$REGISTRY/rkubelet/nginx:1.22"

# The images, in build and load order; each is $IMAGES_CACHE/<key>.tar.
IMAGES=(pause busybox nginx)

# Every file's mtime in a layer, and every image's creation time: Debian 12's release
# day (2023-06-10T00:00:00Z). Fixed, so that a layer made from the same files is the
# same blob, with the same digest.
EPOCH=1686355200
DEFAULT_PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

DEBIAN_SUITE="bookworm"
DEBIAN_MIRROR="${RKUBELET_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
NGINX_PACKAGE="nginx-light"

WORK="$IMAGES_CACHE/work"
NGINX_BASE="$IMAGES_CACHE/rootfs/nginx-base"

# ---------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# The OCI architecture name of this machine (Debian's names, mapped).
oci_arch() {
  local deb
  deb=$(dpkg --print-architecture)
  case $deb in
    amd64 | arm64 | s390x) echo "$deb" ;;
    i386) echo 386 ;;
    ppc64el) echo ppc64le ;;
    *) die "unsupported architecture $deb" ;;
  esac
}

# Removes a directory tree this script made, first unmounting anything mounted under
# it, and never crossing into another file system.
remove_tree() {
  local dir=$1 mnt
  [[ -e $dir ]] || return 0
  dir=$(realpath "$dir")
  while read -r mnt; do
    if [[ -n $mnt ]]; then umount -R "$mnt" 2>/dev/null || true; fi
  done < <(findmnt -rn -o TARGET | awk -v d="$dir" 'index($0, d "/") == 1 || $0 == d' | sort -r)
  rm -rf --one-file-system "$dir"
}

# ---------------------------------------------------------------------------------
# OCI image layout
# ---------------------------------------------------------------------------------

# make_layer ROOTFS OUT.tar OWNER: an uncompressed layer tar of ROOTFS, the same bytes
# for the same files: names sorted bytewise, no "./" prefix, fixed mtime, numeric
# owners. OWNER "root" makes every entry 0:0; "keep" keeps the files' numeric owners.
make_layer() {
  local rootfs=$1 out=$2 owner=$3 list
  local -a opts=(--format=gnu --numeric-owner --mtime="@$EPOCH" --no-recursion)
  [[ $owner == root ]] && opts+=(--owner=0 --group=0)
  list="$out.list"
  (cd "$rootfs" && find . -mindepth 1 -printf '%P\0' | LC_ALL=C sort -z) >"$list"
  tar --create --file="$out" --directory="$rootfs" "${opts[@]}" --null --files-from="$list"
  rm -f "$list"
}

# add_blob LAYOUT FILE MEDIATYPE: moves FILE into LAYOUT/blobs/sha256 and prints its
# OCI descriptor.
add_blob() {
  local layout=$1 file=$2 mediatype=$3 digest size
  digest=$(sha256_of "$file")
  size=$(stat -c %s "$file")
  mv "$file" "$layout/blobs/sha256/$digest"
  jq -cn --arg m "$mediatype" --arg d "sha256:$digest" --argjson s "$size" \
    '{mediaType: $m, digest: $d, size: $s}'
}

# oci_archive ROOTFS OWNER CONFIG DESCRIPTION OUT NAME...: writes the one-layer image
# of ROOTFS as an OCI image layout tar OUT, named NAME... (one index entry per name, all
# for the same manifest). CONFIG is the image config's "config" object (JSON).
oci_archive() {
  local rootfs=$1 owner=$2 config=$3 description=$4 out=$5
  shift 5
  local tmp="$out.d" created arch layer diff_id config_desc manifest_desc name
  remove_tree "$tmp"
  mkdir -p "$tmp/layout/blobs/sha256"
  created=$(date -u -d "@$EPOCH" +%Y-%m-%dT%H:%M:%SZ)
  arch=$(oci_arch)

  make_layer "$rootfs" "$tmp/layer.tar" "$owner"
  diff_id="sha256:$(sha256_of "$tmp/layer.tar")"
  gzip -n -6 "$tmp/layer.tar"
  layer=$(add_blob "$tmp/layout" "$tmp/layer.tar.gz" application/vnd.oci.image.layer.v1.tar+gzip)

  jq -cn --arg created "$created" --arg arch "$arch" --argjson config "$config" \
    --arg diff_id "$diff_id" --arg by "rkubelet scripts/images.sh: $description" '{
      created: $created, architecture: $arch, os: "linux", config: $config,
      rootfs: {type: "layers", diff_ids: [$diff_id]},
      history: [{created: $created, created_by: $by}]
    }' >"$tmp/config.json"
  config_desc=$(add_blob "$tmp/layout" "$tmp/config.json" application/vnd.oci.image.config.v1+json)

  jq -cn --argjson config "$config_desc" --argjson layer "$layer" '{
      schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
      config: $config, layers: [$layer]
    }' >"$tmp/manifest.json"
  manifest_desc=$(add_blob "$tmp/layout" "$tmp/manifest.json" application/vnd.oci.image.manifest.v1+json)

  for name in "$@"; do
    jq -cn --argjson m "$manifest_desc" --arg arch "$arch" --arg name "$name" \
      '$m + {platform: {architecture: $arch, os: "linux"},
             annotations: {"io.containerd.image.name": $name,
                           "org.opencontainers.image.ref.name": $name}}'
  done | jq -cs '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json",
                  manifests: .}' >"$tmp/layout/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$tmp/layout/oci-layout"

  tar --create --file="$out.new" --directory="$tmp/layout" --format=gnu --sort=name \
    --mtime="@$EPOCH" --owner=0 --group=0 --numeric-owner oci-layout index.json blobs
  mv "$out.new" "$out"
  remove_tree "$tmp"
}

# ---------------------------------------------------------------------------------
# Images. Each image KEY has:
#   KEY_inputs     prints what the image is made from besides this script's code
#   KEY_rootfs DIR fills DIR with the image's files
#   KEY_config     prints the image config's "config" object
#   KEY_names      prints the image's names, one a line
#   KEY_verify DIR (optional) checks the built root file system
#   OWNER[KEY]     the layer's file owners: "root" (all 0:0) or "keep" (as in DIR)
#   DESCRIPTION[KEY] the image's history entry
# ---------------------------------------------------------------------------------
declare -A OWNER DESCRIPTION

# pause: the project's own pause program, src/bin/pause.rs, built static with rustc
# alone; the image holds only /pause and runs as 65535:65535, like registry.k8s.io/pause.
PAUSE_SRC="$RKUBELET_REPO/src/bin/pause.rs"
OWNER[pause]=root
DESCRIPTION[pause]="static pause program from src/bin/pause.rs at /pause"
# The source only, not the compiler's version: a cached image must not need rustc (it
# may not be on root's PATH under sudo).
pause_inputs() {
  [[ -f $PAUSE_SRC ]] || die "missing $PAUSE_SRC"
  sha256sum "$PAUSE_SRC"
}
pause_rootfs() {
  local root=$1 rustc
  rustc=$(command -v rustc || echo "${CARGO_HOME:-$HOME/.cargo}/bin/rustc")
  [[ -x $rustc ]] || die "rustc is needed to build the pause program"
  "$rustc" --edition 2024 -C opt-level=s -C panic=abort -C strip=symbols \
    -C target-feature=+crt-static -o "$root/pause" "$PAUSE_SRC"
  if readelf -l "$root/pause" | grep -q 'program interpreter'; then
    die "pause is not statically linked"
  fi
  chmod 0755 "$root/pause"
}
pause_verify() {
  local out
  out=$("$1/pause" -v) || die "pause -v failed"
  log "pause: $out ($(stat -c %s "$1/pause") bytes, static)"
}
pause_config() {
  jq -cn --arg path "PATH=$DEFAULT_PATH" \
    '{User: "65535:65535", Env: [$path], Entrypoint: ["/pause"], WorkingDir: "/"}'
}
pause_names() { echo "$PAUSE_IMAGE"; }

# busybox: Debian's static busybox with a symlink in /bin for each of its applets,
# /etc/passwd and /etc/group (root, nobody and a few system users), /tmp; runs sh.
BUSYBOX_BIN=/bin/busybox
BUSYBOX_REQUIRED=(sh httpd sleep wget nc cat echo ls ps env hostname ip true false id
  mkdir touch date grep head tail kill top)
OWNER[busybox]=root
DESCRIPTION[busybox]="Debian busybox-static with applet links in /bin"
busybox_inputs() {
  [[ -x $BUSYBOX_BIN ]] || die "missing $BUSYBOX_BIN (apt-get install busybox-static)"
  sha256sum "$BUSYBOX_BIN"
}
busybox_rootfs() {
  local root=$1 applet
  if readelf -l "$BUSYBOX_BIN" | grep -q 'program interpreter'; then
    die "$BUSYBOX_BIN is not static (install busybox-static)"
  fi
  install -d -m 0755 "$root"/{bin,dev,etc,home,proc,sys,usr/bin,usr/sbin,var/spool/mail,var/www}
  install -d -m 0700 "$root/root"
  install -d -m 1777 "$root/tmp"
  install -m 0755 "$BUSYBOX_BIN" "$root/bin/busybox"
  while read -r applet; do
    [[ $applet == busybox ]] || ln -s busybox "$root/bin/$applet"
  done < <("$BUSYBOX_BIN" --list)
  ln -s /bin/env "$root/usr/bin/env" # for `#!/usr/bin/env sh` scripts
  for applet in "${BUSYBOX_REQUIRED[@]}"; do
    [[ -L $root/bin/$applet ]] || die "busybox has no $applet applet"
  done
  cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
EOF
  cat >"$root/etc/group" <<'EOF'
root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
tty:x:5:
www-data:x:33:
users:x:100:
nobody:x:65534:
EOF
  chmod 0644 "$root/etc/passwd" "$root/etc/group"
}
busybox_verify() {
  local out
  # shellcheck disable=SC2016 # expanded by the image's sh
  out=$(chroot "$1" /bin/sh -c 'echo "$(id -un) $(hostname >/dev/null && echo ok)"') ||
    die "busybox: sh does not run"
  [[ $out == "root ok" ]] || die "busybox: unexpected output: $out"
}
busybox_config() {
  jq -cn --arg path "PATH=$DEFAULT_PATH" '{Env: [$path], Cmd: ["sh"], WorkingDir: "/"}'
}
busybox_names() { printf '%s\n' "$BUSYBOX_IMAGE" "$BUSYBOX_TAG"; }

# nginx: a Debian minbase root file system with nginx-light (made once by debootstrap
# and cached in $NGINX_BASE), configured like the upstream nginx image: port 80, the
# welcome page in /usr/share/nginx/html, logs to the container's stdout and stderr,
# run in the foreground, stopped gracefully by SIGQUIT.
OWNER[nginx]=keep
DESCRIPTION[nginx]="Debian $DEBIAN_SUITE minbase with $NGINX_PACKAGE, configured like the upstream nginx image"
nginx_inputs() { cat "$NGINX_BASE.stamp"; }
nginx_rootfs() {
  local root=$1
  rmdir "$root"
  cp -a "$NGINX_BASE" "$root"
  # The server of upstream's /etc/nginx/conf.d/default.conf, instead of Debian's
  # /var/www/html site. IPv4 only: upstream's entry point adds [::]:80 only when the
  # kernel has IPv6, and this image has no entry point.
  rm -f "$root/etc/nginx/sites-enabled/default"
  cat >"$root/etc/nginx/conf.d/default.conf" <<'EOF'
server {
    listen       80;
    server_name  localhost;

    location / {
        root   /usr/share/nginx/html;
        index  index.html index.htm;
    }

    error_page   500 502 503 504  /50x.html;
    location = /50x.html {
        root   /usr/share/nginx/html;
    }
}
EOF
  install -d -m 0755 "$root/usr/share/nginx/html"
  [[ -f $root/usr/share/nginx/html/index.html ]] ||
    cat >"$root/usr/share/nginx/html/index.html" <<'EOF'
<!DOCTYPE html>
<html>
<head><title>Welcome to nginx!</title></head>
<body>
<h1>Welcome to nginx!</h1>
<p>If you see this page, the nginx web server is successfully installed and working.</p>
</body>
</html>
EOF
  cat >"$root/usr/share/nginx/html/50x.html" <<'EOF'
<!DOCTYPE html>
<html>
<head><title>Error</title></head>
<body>
<h1>An error occurred.</h1>
<p>Sorry, the page you are looking for is currently unavailable.</p>
</body>
</html>
EOF
  chmod 0644 "$root"/usr/share/nginx/html/*.html
  # Logs go to the container's output, as in the upstream image.
  ln -sfn /dev/stdout "$root/var/log/nginx/access.log"
  ln -sfn /dev/stderr "$root/var/log/nginx/error.log"
}
nginx_verify() { nginx_smoke_test "$1"; }
nginx_config() {
  jq -cn --arg path "PATH=$DEFAULT_PATH" '{
    Env: [$path], Cmd: ["nginx", "-g", "daemon off;"], WorkingDir: "/",
    ExposedPorts: {"80/tcp": {}}, StopSignal: "SIGQUIT"}'
}
nginx_names() { printf '%s\n' "$NGINX_IMAGE" "$NGINX_TAG"; }

# The debootstrap recipe of $NGINX_BASE. Two stages: the first downloads and unpacks
# (network: the Debian mirror only); the second configures the packages in private
# mount, PID and network namespaces, so that nothing it mounts or starts can outlive
# it or touch the host's network.
nginx_base_build() {
  local dir=$1
  debootstrap --foreign --variant=minbase --include="$NGINX_PACKAGE" \
    "$DEBIAN_SUITE" "$dir" "$DEBIAN_MIRROR" >"$dir.log" 2>&1 ||
    { tail -n 20 "$dir.log" >&2; die "debootstrap (first stage) failed, log: $dir.log"; }
  unshare --mount --pid --net --fork --mount-proc \
    chroot "$dir" /debootstrap/debootstrap --second-stage >>"$dir.log" 2>&1 ||
    { tail -n 20 "$dir.log" >&2; die "debootstrap (second stage) failed, log: $dir.log"; }
  nginx_base_strip "$dir"
}

# Drops what a container image needs not: documentation (but the copyright files),
# manuals, translations, apt indexes and caches, logs of the installation, device
# nodes (the runtime makes /dev), and the host's resolv.conf and hostname (the runtime
# provides both).
nginx_base_strip() {
  local dir=$1
  rm -rf "${dir:?}"/usr/share/{man,info,lintian,linda,locale}/* \
    "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb \
    "$dir"/var/cache/debconf/*-old "$dir"/var/lib/dpkg/*-old "$dir"/tmp/* "$dir"/var/tmp/* \
    "${dir:?}"/dev/* "$dir"/etc/resolv.conf "$dir"/etc/hostname
  find "$dir/usr/share/doc" ! -type d ! -name copyright -delete
  find "$dir/usr/share/doc" -mindepth 1 -type d -empty -delete
  find "$dir/var/log" -type f -delete
}

# Makes $NGINX_BASE unless it exists and was made by the current recipe. Its stamp
# holds the recipe's hash and the installed packages (so the nginx image is rebuilt
# when either changes).
ensure_nginx_base() {
  local recipe tmp="$NGINX_BASE.new"
  recipe=$(
    {
      declare -f nginx_base_build nginx_base_strip
      echo "$DEBIAN_SUITE $DEBIAN_MIRROR $NGINX_PACKAGE"
    } | sha256sum | cut -d' ' -f1
  )
  if [[ -d $NGINX_BASE && -f $NGINX_BASE.stamp ]] &&
    [[ $(head -n1 "$NGINX_BASE.stamp") == "recipe $recipe" ]]; then
    log "nginx: Debian root file system cached in $NGINX_BASE"
    return 0
  fi
  command -v debootstrap >/dev/null || die "debootstrap is needed (apt-get install debootstrap)"
  log "nginx: debootstrap $DEBIAN_SUITE minbase + $NGINX_PACKAGE from $DEBIAN_MIRROR (a few minutes)"
  remove_tree "$tmp"
  rm -f "$NGINX_BASE.stamp"
  mkdir -p "$(dirname "$NGINX_BASE")"
  nginx_base_build "$tmp"
  {
    echo "recipe $recipe"
    dpkg-query --admindir="$tmp/var/lib/dpkg" -W -f '${Package}=${Version}\n'
  } >"$tmp.stamp"
  remove_tree "$NGINX_BASE"
  mv "$tmp" "$NGINX_BASE"
  mv "$tmp.stamp" "$NGINX_BASE.stamp"
  rm -f "$tmp.log"
  log "nginx: root file system ready, $(du -sh "$NGINX_BASE" | cut -f1), $(grep "^$NGINX_PACKAGE=" "$NGINX_BASE.stamp")"
}

# Runs nginx from ROOTFS for real, in private mount, PID and network namespaces
# (nothing reaches the host's port 80): `nginx -t`, then the image's command must serve
# the welcome page on port 80, log the request to its stdout, and stop on SIGQUIT.
nginx_smoke_test() {
  local root=$1
  unshare --mount --pid --net --fork --mount-proc \
    bash -c "set -euo pipefail; $(declare -f nginx_smoke_test_inner); nginx_smoke_test_inner \"\$1\"" \
    _ "$root" || die "nginx: the image's nginx does not work"
}
nginx_smoke_test_inner() {
  local root=$1 out="$1.stdout" pid page=""
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  ip link set lo up
  chroot "$root" nginx -t 2>&1 | sed 's/^/  nginx -t: /' >&2
  chroot "$root" nginx -g 'daemon off;' >"$out" 2>/dev/null &
  pid=$!
  for _ in $(seq 50); do
    page=$(curl -fsS --noproxy '*' http://127.0.0.1:80/ 2>/dev/null) && break
    sleep 0.1
  done
  kill -QUIT "$pid"
  wait "$pid" || { echo "nginx did not exit 0 on SIGQUIT" >&2; return 1; }
  grep -q 'Welcome to nginx!' <<<"$page" || { echo "no welcome page on port 80" >&2; return 1; }
  grep -q '"GET / HTTP/1.1" 200' "$out" || { echo "no access log on stdout" >&2; return 1; }
  echo "  nginx served the welcome page on port 80, logged it to stdout, quit on SIGQUIT" >&2
}

# build_image KEY: makes $IMAGES_CACHE/KEY.tar, unless it exists and the hash of its
# inputs (KEY_inputs, its names, and this whole script) equals the one stored next to
# it in KEY.tar.inputs. Any edit of this script rebuilds the images (seconds), but not
# the nginx root file system, which has its own, narrower, recipe hash.
build_image() {
  local key=$1 archive="$IMAGES_CACHE/$1.tar" inputs dir names
  local owner=${OWNER[$key]} description=${DESCRIPTION[$key]}
  inputs=$(
    {
      "${key}_inputs"
      "${key}_names"
      cat "${BASH_SOURCE[0]}"
    } | sha256sum | cut -d' ' -f1
  )
  if [[ -f $archive && -f $archive.inputs && $(<"$archive.inputs") == "$inputs" ]]; then
    log "$key: cached, $archive ($(du -h "$archive" | cut -f1))"
    return 0
  fi
  log "$key: building"
  rm -f "$archive.inputs"
  dir="$WORK/$key"
  remove_tree "$dir"
  mkdir -p "$dir/rootfs"
  "${key}_rootfs" "$dir/rootfs"
  mapfile -t names < <("${key}_names")
  oci_archive "$dir/rootfs" "$owner" "$("${key}_config")" "$description" "$dir/image.tar" "${names[@]}"
  # Checked after the layer is made (running the image's programs may leave files in
  # the root file system), and before the archive replaces the cached one.
  if declare -F "${key}_verify" >/dev/null; then "${key}_verify" "$dir/rootfs"; fi
  mv "$dir/image.tar" "$archive"
  echo "$inputs" >"$archive.inputs"
  remove_tree "$dir"
  log "$key: $archive ($(du -h "$archive" | cut -f1)) = ${names[*]}"
}

# ---------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------

# The image names in an archive, from its index.json.
archive_names() {
  tar -xOf "$1" index.json | jq -r '.manifests[].annotations["io.containerd.image.name"]'
}

# The manifest digest of image NAME in an archive.
archive_digest() {
  tar -xOf "$1" index.json |
    jq -r --arg n "$2" '.manifests[] | select(.annotations["io.containerd.image.name"] == $n) | .digest'
}

# Where image NAME lives in the local registry: docker.io/X is served by the registry
# as X (containerd's docker.io mirror); $REGISTRY/X is X already.
registry_ref() {
  local name=$1
  case $name in
    docker.io/*) echo "$REGISTRY/${name#docker.io/}" ;;
    "$REGISTRY"/*) echo "$name" ;;
    *) die "image $name has no place in the registry $REGISTRY (run: images.sh build)" ;;
  esac
}

# registry_digest REF [USER:PASSWORD]: the digest the registry of REF
# (host:port/repo:tag) holds for it, or nothing.
registry_digest() {
  local host=${1%%/*} path=${1#*/}
  local -a auth=()
  [[ -n ${2:-} ]] && auth=(-u "$2")
  curl -fsSI --noproxy '*' "${auth[@]}" -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
    "http://$host/v2/${path%:*}/manifests/${path##*:}" 2>/dev/null |
    tr -d '\r' | awk 'tolower($1) == "docker-content-digest:" { print $2 }'
}

# push_image ARCHIVE NAME [DEST USER:PASSWORD]: copies image NAME of ARCHIVE to DEST (by
# default its place in $REGISTRY), unless the registry already holds the same manifest.
push_image() {
  local archive=$1 name=$2 dest=${3:-} creds=${4:-} digest
  local -a auth=()
  [[ -n $dest ]] || dest=$(registry_ref "$name")
  [[ -n $creds ]] && auth=(--dest-creds "$creds")
  digest=$(archive_digest "$archive" "$name")
  if [[ $(registry_digest "$dest" "$creds") == "$digest" ]]; then
    log "registry: $dest is up to date"
    return 0
  fi
  # --insecure-policy: our own archives, copied over loopback; no signature policy.
  skopeo copy --quiet --insecure-policy --preserve-digests --retry-times 3 \
    --dest-tls-verify=false "${auth[@]}" "oci-archive:$archive:$name" "docker://$dest"
  [[ $(registry_digest "$dest" "$creds") == "$digest" ]] || die "registry: $dest does not hold $digest"
  log "registry: pushed $name as $dest"
}

ctr_k8s() { ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }

# Imports the pause image into containerd's k8s.io namespace (unpacked, so the CRI
# plugin can run sandboxes from it at once), pinned against image garbage collection.
import_pause() {
  local archive="$IMAGES_CACHE/pause.tar" digest got
  digest=$(archive_digest "$archive" "$PAUSE_IMAGE")
  [[ -n $digest ]] || die "$archive has no image $PAUSE_IMAGE (run: images.sh build)"
  ctr_k8s images import --all-platforms "$archive" >/dev/null
  got=$(ctr_k8s images ls | awk -v n="$PAUSE_IMAGE" '$1 == n { print $3 }')
  [[ $got == "$digest" ]] || die "containerd: $PAUSE_IMAGE is '${got:-missing}', not $digest"
  ctr_k8s images label "$PAUSE_IMAGE" io.cri-containerd.pinned=pinned >/dev/null
  log "containerd: imported $PAUSE_IMAGE ($digest)"
}

require_archives() {
  local key
  for key in "${IMAGES[@]}"; do
    [[ -f $IMAGES_CACHE/$key.tar ]] || die "missing $IMAGES_CACHE/$key.tar (run: images.sh build)"
  done
}

require_services() {
  curl -fs --noproxy '*' -o /dev/null "http://$REGISTRY/v2/" ||
    die "no registry answers on http://$REGISTRY"
  if [[ -n $PRIVATE_REGISTRY ]]; then
    curl -fs --noproxy '*' -o /dev/null -u "$PRIVATE_REGISTRY_USER:$PRIVATE_REGISTRY_PASSWORD" \
      "http://$PRIVATE_REGISTRY/v2/" || die "no private registry answers on http://$PRIVATE_REGISTRY"
  fi
  if [[ ! -S $CONTAINERD_SOCK ]] || ! ctr --address "$CONTAINERD_SOCK" version >/dev/null 2>&1; then
    die "containerd does not answer on $CONTAINERD_SOCK"
  fi
}

# ---------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------

# Serialises builds and loads: one images.sh at a time works in $IMAGES_CACHE.
lock_cache() {
  mkdir -p "$IMAGES_CACHE"
  exec 9>"$IMAGES_CACHE/.lock"
  flock 9
}

cmd_build() {
  local start=$SECONDS key
  [[ $(id -u) -eq 0 ]] || die "build must run as root (debootstrap, chroot, namespaces)"
  umask 022
  lock_cache
  build_image pause
  build_image busybox
  ensure_nginx_base
  build_image nginx
  remove_tree "$WORK"
  for key in "${IMAGES[@]}"; do
    [[ -f $IMAGES_CACHE/$key.tar ]] || die "missing $IMAGES_CACHE/$key.tar"
  done
  log "build done in $((SECONDS - start))s"
}

cmd_load() {
  local key name archive
  lock_cache
  require_archives
  require_services
  for key in "${IMAGES[@]}"; do
    archive="$IMAGES_CACHE/$key.tar"
    while read -r name; do
      push_image "$archive" "$name"
    done < <(archive_names "$archive")
  done
  if [[ -n $PRIVATE_REGISTRY ]]; then
    push_image "$IMAGES_CACHE/busybox.tar" "$BUSYBOX_IMAGE" "$PRIVATE_BUSYBOX" \
      "$PRIVATE_REGISTRY_USER:$PRIVATE_REGISTRY_PASSWORD"
  fi
  import_pause
}

cmd_clean() {
  log "removing $IMAGES_CACHE"
  remove_tree "$IMAGES_CACHE"
}

usage() {
  echo "usage: $(basename "$0") build|load|clean" >&2
  exit 2
}

main() {
  [[ $# -eq 1 ]] || usage
  case $1 in
    build) cmd_build ;;
    load) cmd_load ;;
    clean) cmd_clean ;;
    *) usage ;;
  esac
}

main "$@"
