#!/usr/bin/env bash
# Regenerates the reference vectors of this directory with the kubelet v1.20.2's own code:
# builds hashgen/ (a small program calling the vendored Kubernetes functions) inside a
# copy of the Kubernetes v1.20.2 tree, then runs it over the inputs.
#   K8S_TREE   the unpacked tree (default /work/ref/k8s; scripts/setup.sh unpacks Debian's
#              source package under /var/cache/rkubelet/build/src)
#   WORK       where the copy and the build go (default /var/cache/rkubelet/hashgen)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tree=${K8S_TREE:-/work/ref/k8s}
work=${WORK:-/var/cache/rkubelet/hashgen}
mkdir -p "$work/gopath/src/k8s.io"
[[ -d $work/k8s ]] || cp -a "$tree" "$work/k8s"
mkdir -p "$work/k8s/cmd/hashgen"
cp "$here"/hashgen/*.go "$work/k8s/cmd/hashgen/"
ln -sfn "$work/k8s" "$work/gopath/src/k8s.io/kubernetes"
(cd "$work/gopath/src/k8s.io/kubernetes" &&
  GO111MODULE=off GOPATH="$work/gopath" CGO_ENABLED=0 go build -o "$work/hashgen" ./cmd/hashgen)
cd "$here"
python3 make_inputs.py
"$work/hashgen" hash <containers.jsonl >container-hashes.jsonl
"$work/hashgen" quantity <quantities.txt >quantities.jsonl
"$work/hashgen" staticpod static-pods n1 >static-pods.jsonl
"$work/hashgen" schema >../../../src/goapi/layout-v1.20.2.json
