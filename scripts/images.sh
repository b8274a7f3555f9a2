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
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/oci-image.sh"

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

NGINX_PACKAGE="nginx-light"

# ---------------------------------------------------------------------------------
# Images (see oci-image.sh for what each KEY_ function does)
# ---------------------------------------------------------------------------------

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
# and cached: ensure_debian_base), configured like the upstream nginx image: port 80, the
# welcome page in /usr/share/nginx/html, logs to the container's stdout and stderr,
# run in the foreground, stopped gracefully by SIGQUIT.
OWNER[nginx]=keep
DESCRIPTION[nginx]="Debian $DEBIAN_SUITE minbase with $NGINX_PACKAGE, configured like the upstream nginx image"
nginx_inputs() { cat "$(debian_base_dir nginx).stamp"; }
nginx_rootfs() {
  local root=$1
  copy_debian_base nginx "$root"
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

# ---------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------

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
  require_registry
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

cmd_build() {
  local start=$SECONDS key
  [[ $(id -u) -eq 0 ]] || die "build must run as root (debootstrap, chroot, namespaces)"
  umask 022
  lock_cache
  build_image pause
  build_image busybox
  ensure_debian_base nginx "$NGINX_PACKAGE"
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
