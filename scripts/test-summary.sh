#!/usr/bin/env bash
# Adds up a `cargo test` log (every test binary's "test result:" line) and prints the
# failed tests by binary, then one closing line of totals: "N passed, M failed".
#   test-summary.sh LOG [EXTRA-FAILED-CHECK ...]
# Extra arguments name checks outside cargo test that failed (the cluster's leak check);
# each counts as one failure. A test binary that died without its result line (a crash,
# a signal) counts as one failure too. Exit status: 0 only if nothing failed.
set -euo pipefail
log=${1:?usage: test-summary.sh LOG [FAILED-CHECK ...]}
shift
awk -v extra="$(printf '%s\n' "$@")" '
  function flush() {
    if (bin != "" && !result) { failed++; names[++n] = bin ": (no test result: the binary died)" }
  }
  /^ *Running / { flush(); bin = ($NF ~ /^\(/) ? $(NF - 1) : $NF; result = 0 }
  /^ *Doc-tests / { flush(); bin = "doc-tests " $2; result = 0 }
  /^test .* \.\.\. FAILED$/ { t = $2; names[++n] = bin ": " t }
  /^test result: / {
    result = 1
    for (i = 1; i <= NF; i++) {
      if ($(i + 1) ~ /^passed;?$/) passed += $i
      if ($(i + 1) ~ /^failed;?$/) failed += $i
    }
  }
  END {
    flush()
    k = split(extra, checks, "\n")
    for (i = 1; i <= k; i++) if (checks[i] != "") { failed++; names[++n] = checks[i] }
    if (n > 0) {
      print "failed:"
      for (i = 1; i <= n; i++) print "  " names[i]
    }
    printf "%d passed, %d failed\n", passed, failed
    exit (failed > 0 || passed == 0) ? 1 : 0
  }
' "$log"
