#!/usr/bin/env bash
# The one command that runs every test of rkubelet, as root on a Debian 12 machine:
# set-up (packages, cached Kubernetes build, cached VM node image), format and lint
# checks, then unit and integration tests against a real local cluster that this script
# brings up and always takes down again, also when a step fails, then checks that nothing
# of it survived.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$RKUBELET_REPO"

started=$SECONDS
bash scripts/setup.sh
# The VM node's disk, kernel and initramfs (tests/vm_node.rs boots them): made here, with
# the Debian mirror, at set-up; reused while their recipe holds (a fraction of a second).
bash scripts/image.sh build-vm-node

log "format and lint"
cargo fmt --check
cargo clippy --locked --all-targets -- -D warnings

log "build"
cargo build --locked --all-targets
cargo test --locked --no-run

# A cluster left over from an interrupted run is removed first; ours is removed on exit,
# and the run fails if anything of it survives that. The last line is the totals.
TEST_LOG=$(mktemp /tmp/rkubelet-tests.XXXXXX)
TESTS_RAN=0
bash scripts/cluster.sh down
down_and_check() {
  local rc=$?
  local extra=()
  bash scripts/cluster.sh down || { rc=1; extra+=("cluster.sh down"); }
  bash scripts/cluster.sh leak-check || { rc=1; extra+=("cluster.sh leak-check"); }
  if [[ $TESTS_RAN -eq 1 ]]; then
    bash scripts/test-summary.sh "$TEST_LOG" "${extra[@]}" || rc=1
  fi
  rm -f "$TEST_LOG"
  exit "$rc"
}
trap down_and_check EXIT
bash scripts/cluster.sh up
# A second node identity on this host, for runtime-owned networking beside agent-owned.
bash scripts/cluster.sh node-credentials rk-node2 "$NODE_IP"

# Every test binary runs even when an earlier one fails (--no-fail-fast); the summary on
# exit adds them up and names every failed test.
log "unit and integration tests"
TESTS_RAN=1
set +e
cargo test --locked --no-fail-fast -- --include-ignored --test-threads=2 2>&1 | tee "$TEST_LOG"
test_rc=${PIPESTATUS[0]}
set -e
log "tests done in $((SECONDS - started)) s (cargo test exit $test_rc)"
exit "$test_rc"
