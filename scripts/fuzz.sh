#!/usr/bin/env bash
# Runs one coverage-guided fuzz target (fuzz/fuzz_targets/TARGET.rs: libFuzzer with
# AddressSanitizer, built through cargo-fuzz on the stable toolchain) at the lowest CPU
# priority until it reaches the plateau, or for at most MAX_SECONDS (default 1800), and
# prints libFuzzer's figures (executions, coverage, corpus), when the last new coverage
# came, and whether the run reached the plateau. `bash scripts/fuzz.sh list` names the
# targets.
#
# The plateau (docs/reliability.md, "Fuzzing"): a run of at least 360 s, counted from the
# corpus loaded (libFuzzer's INITED line), whose second half found no new coverage: neither
# the edges (cov) nor the features (ft) of libFuzzer's status lines grew (a NEW line, or a
# REDUCE that brought features). The run is stopped (SIGINT) as soon as that holds: at
# 360 s if nothing new came after 180 s, else at twice the time of the last new coverage.
# The stamped log stays in fuzz/artifacts/TARGET/last-run.log.
#
# Seeds come from fuzz/corpus/TARGET (in the repository); inputs that reach new coverage
# go to fuzz/corpus-found/TARGET, and an input that crashes, hangs (10 s) or allocates
# beyond 2 GiB to fuzz/artifacts/TARGET (neither kept in git). A finding is fixed, and its
# input copied to fuzz/regressions/TARGET, which the unit tests replay
# (`fuzzing::tests`, in the ordinary test command).
#
# FUZZ_NO_BUILD=1 runs the binary already built (fuzz/target/...), e.g. while the sources
# are being changed for a finding.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target=${1:?usage: scripts/fuzz.sh TARGET|list [MAX_SECONDS]}
max_seconds=${2:-1800}
plateau_min=360

if [[ $target == list ]]; then
  ls fuzz/fuzz_targets | sed 's/\.rs$//'
  exit 0
fi
[[ -f fuzz/fuzz_targets/$target.rs ]] || { echo "no fuzz target $target" >&2; exit 2; }

bin=fuzz/target/x86_64-unknown-linux-gnu/release/$target
if [[ ${FUZZ_NO_BUILD:-} != 1 ]]; then
  if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --version '^0.13' --locked
  fi
  # cargo-fuzz needs nightly features; the stable toolchain allows them with
  # RUSTC_BOOTSTRAP. Release with debug assertions and ASan, as `cargo fuzz run` builds.
  RUSTC_BOOTSTRAP=1 nice -n 19 cargo fuzz build --fuzz-dir fuzz "$target"
fi
[[ -x $bin ]] || { echo "$bin is not built" >&2; exit 2; }

found=fuzz/corpus-found/$target
mkdir -p "$found" "fuzz/artifacts/$target"
work=$(mktemp -d "/tmp/rkubelet-fuzz-$target.XXXXXX")
log=fuzz/artifacts/$target/last-run.log
: >"$log"
fuzzer=
cleanup() {
  if [[ -n $fuzzer ]]; then kill "$fuzzer" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
mkfifo "$work/out"

# One job, niced: the machine is shared.
ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_odr_violation=0 nice -n 19 "$bin" \
  -artifact_prefix="fuzz/artifacts/$target/" -max_total_time="$max_seconds" -timeout=10 \
  -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 "$found" "fuzz/corpus/$target" \
  >"$work/out" 2>&1 &
fuzzer=$!

# Each of libFuzzer's lines stamped with the seconds since the start (tenths); the run
# stopped once the plateau holds.
now() {
  local t=${EPOCHREALTIME/./}
  echo $(((t - start) / 100000))
}
start=${EPOCHREALTIME/./}
inited='' last_new='' new_exec='' stopped='' partial='' cov=0 ft=0
while :; do
  if IFS= read -r -t 5 chunk; then
    line=$partial$chunk partial=
    t=$(now)
    printf '%d.%d %s\n' $((t / 10)) $((t % 10)) "$line" >>"$log"
    if [[ $line =~ ^(#[0-9]+)[[:space:]]+([A-Z]+).*cov:\ ([0-9]+)\ ft:\ ([0-9]+) ]]; then
      if [[ ${BASH_REMATCH[2]} == INITED ]]; then
        inited=$t last_new=$t cov=${BASH_REMATCH[3]} ft=${BASH_REMATCH[4]}
      elif ((BASH_REMATCH[3] > cov || BASH_REMATCH[4] > ft)); then
        cov=${BASH_REMATCH[3]} ft=${BASH_REMATCH[4]}
        last_new=$t new_exec=${BASH_REMATCH[1]}
      fi
    fi
  elif (($? > 128)); then
    partial+=$chunk
  else
    break
  fi
  if [[ -n $inited && -z $stopped ]]; then
    t=$(now)
    ran=$((t - inited))
    if ((ran >= plateau_min * 10 && (last_new - inited) * 2 <= ran)); then
      kill -INT "$fuzzer" 2>/dev/null || true
      stopped=$t
    fi
  fi
done <"$work/out"
set +e
wait "$fuzzer"
rc=$?
set -e
fuzzer=
# libFuzzer exits 72 when interrupted: here that is the plateau reached.
[[ -n $stopped && $rc == 72 ]] && rc=0

grep -E '^[0-9.]+ (#[0-9]+[[:space:]]+(INITED|pulse|DONE)|Done|==|ERROR|SUMMARY|Test unit written)|panicked' "$log" | tail -n 40
last_line=$(grep -E '^[0-9.]+ #[0-9]+[[:space:]]+[A-Z]' "$log" | tail -n 1 | cut -d' ' -f2-)
end=$(tail -n 1 "$log" | cut -d' ' -f1)
echo "--- $target: last status: $last_line"
if [[ -z $inited ]]; then
  echo "--- $target: the corpus never loaded"
else
  ran=$(((10#${end/./} - inited) / 10))
  since=$(((last_new - inited) / 10))
  echo "--- $target: $ran s fuzzed after the corpus loaded ($((inited / 10)) s); last new coverage at $since s, execution ${new_exec:-none}"
  if ((ran >= plateau_min && since * 2 <= ran)); then
    echo "--- $target: plateau (no new coverage in the last $((ran - since)) s of $ran s)"
  else
    echo "--- $target: no plateau (new coverage $((ran - since)) s before the end of $ran s)"
  fi
fi
sed -n 's/^[0-9.]* \(stat::\)/\1/p' "$log"
exit "$rc"
