# shellcheck shell=bash
# The image-making machinery of images.sh (the cluster's images) and
# conformance-images.sh (the images the Kubernetes e2e suite asks for). Source it after
# common.sh; do not run it.
#
# Every image is a one-layer OCI image layout written by hand (tar, gzip, sha256sum, jq),
# made from files of this machine, of the Kubernetes tree or of Debian packages, never
# pulled. An image KEY is defined by the sourcing script with:
#   KEY_inputs     prints what the image is made from besides the scripts' code
#   KEY_rootfs DIR fills DIR with the image's files
#   KEY_config     prints the image config's "config" object
#   KEY_names      prints the image's names, one a line
#   KEY_verify DIR (optional) checks the built root file system
#   OWNER[KEY]     the layer's file owners: "root" (all 0:0) or "keep" (as in DIR)
#   DESCRIPTION[KEY] the image's history entry
# and `build_image KEY` makes $IMAGES_CACHE/KEY.tar when its inputs changed.

declare -A OWNER DESCRIPTION

# Every file's mtime in a layer, and every image's creation time: Debian 12's release
# day (2023-06-10T00:00:00Z). Fixed, so that a layer made from the same files is the
# same blob, with the same digest.
EPOCH=1686355200
# shellcheck disable=SC2034 # used by the sourcing scripts
DEFAULT_PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

DEBIAN_SUITE="bookworm"
DEBIAN_MIRROR="${RKUBELET_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

WORK="$IMAGES_CACHE/work"

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

# Serialises builds and loads: one image script at a time works in $IMAGES_CACHE.
lock_cache() {
  mkdir -p "$IMAGES_CACHE"
  exec 9>"$IMAGES_CACHE/.lock"
  flock 9
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
    --arg diff_id "$diff_id" --arg by "rkubelet scripts/$(basename "$0"): $description" '{
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

# build_image KEY: makes $IMAGES_CACHE/KEY.tar, unless it exists and the hash of its
# inputs (KEY_inputs, its names, the image script and this file) equals the one stored
# next to it in KEY.tar.inputs. Any edit of the scripts rebuilds the images (seconds),
# but not the Debian root file systems, which have their own, narrower, recipe hash.
build_image() {
  local key=$1 archive="$IMAGES_CACHE/$1.tar" inputs dir names
  local owner=${OWNER[$key]} description=${DESCRIPTION[$key]}
  inputs=$(
    {
      "${key}_inputs"
      "${key}_names"
      cat "$0" "${BASH_SOURCE[0]}"
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
# Debian root file systems (debootstrap), cached
# ---------------------------------------------------------------------------------

# debian_base_dir NAME: where the root file system NAME is cached.
debian_base_dir() { echo "$IMAGES_CACHE/rootfs/debian-$1"; }

# The debootstrap recipe of a root file system. Two stages: the first downloads and
# unpacks (network: the Debian mirror only); the second configures the packages in
# private mount, PID and network namespaces, so that nothing it mounts or starts can
# outlive it or touch the host's network.
debian_base_build() {
  local dir=$1 packages=$2
  debootstrap --foreign --variant=minbase ${packages:+--include="$packages"} \
    "$DEBIAN_SUITE" "$dir" "$DEBIAN_MIRROR" >"$dir.log" 2>&1 ||
    { tail -n 20 "$dir.log" >&2; die "debootstrap (first stage) failed, log: $dir.log"; }
  unshare --mount --pid --net --fork --mount-proc \
    chroot "$dir" /debootstrap/debootstrap --second-stage >>"$dir.log" 2>&1 ||
    { tail -n 20 "$dir.log" >&2; die "debootstrap (second stage) failed, log: $dir.log"; }
  debian_base_strip "$dir"
}

# Drops what a container image needs not: documentation (but the copyright files),
# manuals, translations, apt indexes and caches, logs of the installation, device
# nodes (the runtime makes /dev), and the host's resolv.conf and hostname (the runtime
# provides both).
debian_base_strip() {
  local dir=$1
  rm -rf "${dir:?}"/usr/share/{man,info,lintian,linda,locale}/* \
    "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb \
    "$dir"/var/cache/debconf/*-old "$dir"/var/lib/dpkg/*-old "$dir"/tmp/* "$dir"/var/tmp/* \
    "${dir:?}"/dev/* "$dir"/etc/resolv.conf "$dir"/etc/hostname
  find "$dir/usr/share/doc" ! -type d ! -name copyright -delete
  find "$dir/usr/share/doc" -mindepth 1 -type d -empty -delete
  find "$dir/var/log" -type f -delete
}

# ensure_debian_base NAME PACKAGES: makes $(debian_base_dir NAME), a Debian minbase root
# file system with PACKAGES (comma-separated), unless it exists and was made by the
# current recipe. Its stamp (NAME's dir + .stamp) holds the recipe's hash and the
# installed packages: an image's KEY_inputs prints it, so that the image is rebuilt
# when either changes.
ensure_debian_base() {
  local name=$1 packages=$2 base recipe tmp
  base=$(debian_base_dir "$name")
  tmp="$base.new"
  recipe=$(
    {
      declare -f debian_base_build debian_base_strip
      echo "$DEBIAN_SUITE $DEBIAN_MIRROR $packages"
    } | sha256sum | cut -d' ' -f1
  )
  if [[ -d $base && -f $base.stamp ]] && [[ $(head -n1 "$base.stamp") == "recipe $recipe" ]]; then
    log "$name: Debian root file system cached in $base"
    return 0
  fi
  command -v debootstrap >/dev/null || die "debootstrap is needed (apt-get install debootstrap)"
  log "$name: debootstrap $DEBIAN_SUITE minbase + ${packages:-nothing} from $DEBIAN_MIRROR (a few minutes)"
  remove_tree "$tmp"
  rm -f "$base.stamp"
  mkdir -p "$(dirname "$base")"
  debian_base_build "$tmp" "$packages"
  {
    echo "recipe $recipe"
    dpkg-query --admindir="$tmp/var/lib/dpkg" -W -f '${Package}=${Version}\n'
  } >"$tmp.stamp"
  remove_tree "$base"
  mv "$tmp" "$base"
  mv "$tmp.stamp" "$base.stamp"
  rm -f "$tmp.log"
  log "$name: root file system ready, $(du -sh "$base" | cut -f1)"
}

# copy_debian_base NAME ROOT: ROOT (an empty dir) becomes a copy of the cached root file
# system NAME.
copy_debian_base() {
  rmdir "$2"
  cp -a "$(debian_base_dir "$1")" "$2"
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
    *) die "image $name has no place in the registry $REGISTRY (run: $(basename "$0") build)" ;;
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

# require_registry: the local registry answers.
require_registry() {
  curl -fs --noproxy '*' -o /dev/null "http://$REGISTRY/v2/" ||
    die "no registry answers on http://$REGISTRY"
}
