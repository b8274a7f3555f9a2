# shellcheck shell=bash
# Builds parts of the Kubernetes v1.20.2 tree from Debian's `kubernetes` source package:
# sourced by setup.sh (the control plane, the kubelet, kube-proxy, kubectl) and by
# conformance.sh (e2e.test, ginkgo and the test images' programs). Source it after
# common.sh; do not run it.
#
#   k8s_build OUT_DIR TARGET...   unpacks the source package into a work dir under
#                                 $RKUBELET_CACHE, runs the tree's own
#                                 `make WHAT="TARGET..."` (cmd/kubelet,
#                                 test/e2e/e2e.test, vendor/github.com/onsi/ginkgo/ginkgo,
#                                 ...) and installs each target's binary (its last path
#                                 element) into OUT_DIR; then removes the work dir.
#                                 K8S_BUILD_KEEP=FILE... (paths in the tree) are copied to
#                                 OUT_DIR/src/ first (sources some images are made of).
#
# The source package: what `apt-get source --download-only kubernetes` gives (about
# 34 MB), taken from $RKUBELET_CACHE/k8s-source when a .dsc is there, else downloaded
# into it (this needs the deb-src entry setup.sh adds).

K8S_SOURCE_DIR="$RKUBELET_CACHE/k8s-source"

# k8s_source_package: makes sure $K8S_SOURCE_DIR holds the source package; prints its .dsc.
k8s_source_package() {
  local dscs
  mkdir -p "$K8S_SOURCE_DIR"
  dscs=("$K8S_SOURCE_DIR"/kubernetes_*.dsc)
  if [[ ! -f ${dscs[0]} ]]; then
    log "downloading Debian's kubernetes source package into $K8S_SOURCE_DIR"
    (cd "$K8S_SOURCE_DIR" && apt-get source --download-only -qq kubernetes >/dev/null)
    dscs=("$K8S_SOURCE_DIR"/kubernetes_*.dsc)
  fi
  [[ -f ${dscs[0]} ]] || die "no kubernetes source package in $K8S_SOURCE_DIR"
  echo "${dscs[0]}"
}

k8s_build() {
  local out=$1
  shift
  local work tree dsc t f
  work=$(mktemp -d "$RKUBELET_CACHE/build.XXXXXX")
  dsc=$(k8s_source_package)
  tree="$work/src"
  (cd "$work" && dpkg-source --no-check -x "$dsc" src >/dev/null)
  mkdir -p "$out"
  for f in ${K8S_BUILD_KEEP:-}; do
    mkdir -p "$out/src/$(dirname "$f")"
    cp -a "$tree/$f" "$out/src/$f"
  done
  log "building $* from the Kubernetes tree (several minutes; log: $work/build.log)"
  mkdir -p "$tree/.go/src/k8s.io"
  ln -sfn "$tree" "$tree/.go/src/k8s.io/kubernetes"
  if ! (
    cd "$tree/.go/src/k8s.io/kubernetes"
    export GOPATH="$tree/.go" CGO_ENABLED=0 GOFLAGS=-mod=vendor GOCACHE="$work/gocache"
    make WHAT="$*" >"$work/build.log" 2>&1
  ); then
    tail -n 40 "$work/build.log" >&2
    die "the Kubernetes build failed (log kept: $work/build.log)"
  fi
  for t in "$@"; do install -m 0755 "$tree/_output/bin/${t##*/}" "$out/${t##*/}"; done
  rm -rf "$work"
}
