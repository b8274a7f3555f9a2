#!/usr/bin/env bash
# Runs one coverage-guided fuzz target (fuzz/fuzz_targets/TARGET.rs: libFuzzer with
# AddressSanitizer, through cargo-fuzz on the stable toolchain) for SECONDS (default 300),
# at the lowest CPU priority, and prints libFuzzer's last figures (executions, coverage,
# corpus). `bash scripts/fuzz.sh list` names the targets.
#
# Seeds come from fuzz/corpus/TARGET (in the repository); inputs that reach new coverage
# go to fuzz/corpus-found/TARGET, and an input that crashes, hangs (10 s) or allocates
# beyond 2 GiB to fuzz/artifacts/TARGET (neither kept in git). A finding is fixed, and its
# input copied to fuzz/regressions/TARGET, which the unit tests replay
# (`fuzzing::tests`, in the ordinary test command).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target=${1:?usage: scripts/fuzz.sh TARGET|list [SECONDS]}
seconds=${2:-300}

if [[ $target == list ]]; then
  ls fuzz/fuzz_targets | sed 's/\.rs$//'
  exit 0
fi
[[ -f fuzz/fuzz_targets/$target.rs ]] || { echo "no fuzz target $target" >&2; exit 2; }

if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --version '^0.13' --locked
fi

found=fuzz/corpus-found/$target
mkdir -p "$found" "fuzz/artifacts/$target"
log=$(mktemp /tmp/rkubelet-fuzz-$target.XXXXXX)
# cargo-fuzz needs nightly features; the stable toolchain allows them with RUSTC_BOOTSTRAP.
# One job, niced: the machine is shared.
set +e
RUSTC_BOOTSTRAP=1 nice -n 19 cargo fuzz run --fuzz-dir fuzz "$target" "$found" "fuzz/corpus/$target" -- \
  -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
  -print_final_stats=1 2>&1 | tee "$log" | grep -E '^#[0-9]+[[:space:]]+(INITED|pulse|DONE)|^Done|^==|ERROR|panicked|SUMMARY|Test unit written' | tail -n 40
rc=${PIPESTATUS[0]}
set -e
echo "--- $target: last new coverage $(grep -E '^#[0-9]+[[:space:]]+NEW' "$log" | tail -n 1)"
echo "--- $target: $(grep -E '^#[0-9]+[[:space:]]+(DONE|pulse)' "$log" | tail -n 1)"
grep -E '^stat::' "$log" || true
rm -f "$log"
exit "$rc"
