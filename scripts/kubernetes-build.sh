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

# The tree vendors github.com/modern-go/reflect2 v1.0.1, whose link to the Go runtime's
# mapiterinit has the signature Go 1.18 changed. Built with Debian 12's Go 1.19, every
# json-iterator encoding of a map then faults: the API server died ("fatal error: fault",
# SIGSEGV in mapiternext) the first time the conformance suite published a CRD's OpenAPI.
# v1.0.2 is that fix and nothing else; Debian packages it. It replaces the vendored copy
# before the build (go.mod and vendor/modules.txt keep naming v1.0.1: -mod=vendor builds
# the vendored files).
K8S_REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2

k8s_vendor_fixes() {
  local tree=$1 vendored="$1/vendor/github.com/modern-go/reflect2"
  [[ -f $K8S_REFLECT2_SRC/go_above_118.go ]] ||
    die "$K8S_REFLECT2_SRC has no go_above_118.go: install golang-github-modern-go-reflect2-dev (>= 1.0.2)"
  rm -f "$vendored"/*.go
  cp "$K8S_REFLECT2_SRC"/*.go "$vendored/"
}

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
  k8s_vendor_fixes "$tree"
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
