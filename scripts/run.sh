#!/usr/bin/env bash
# The main job: set up this machine, bring up the local cluster and show the container
# runtime's status through rkubelet's CRI client. Leaves the cluster running; stop it with
# `scripts/cluster.sh down`.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$RKUBELET_REPO"

bash scripts/setup.sh
cargo build --locked --release
bash scripts/cluster.sh up

rk="$RKUBELET_REPO/target/release/rkubelet"
"$rk" cri version
"$rk" cri status || true
kubectl --kubeconfig "$KUBECONFIG_ADMIN" get nodes,namespaces
