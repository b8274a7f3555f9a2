#!/usr/bin/env bash
# The one command that runs every test of rkubelet, as root on a Debian 12 machine:
# set-up (packages, cached Kubernetes build), format and lint checks, then unit and
# integration tests against a real local cluster that this script brings up and always
# takes down again, also when a step fails, then checks that nothing of it survived.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$RKUBELET_REPO"

started=$SECONDS
bash scripts/setup.sh

log "format and lint"
cargo fmt --check
cargo clippy --locked --all-targets -- -D warnings

log "build"
cargo build --locked --all-targets
cargo test --locked --no-run

# A cluster left over from an interrupted run is removed first; ours is removed on exit,
# and the run fails if anything of it survives that.
bash scripts/cluster.sh down
down_and_check() {
  local rc=$?
  bash scripts/cluster.sh down || rc=1
  bash scripts/cluster.sh leak-check || rc=1
  exit "$rc"
}
trap down_and_check EXIT
bash scripts/cluster.sh up
# A second node identity on this host, for runtime-owned networking beside agent-owned.
bash scripts/cluster.sh node-credentials rk-node2 "$NODE_IP"

log "unit and integration tests"
cargo test --locked -- --include-ignored --test-threads=2

log "all tests passed in $((SECONDS - started)) s"
