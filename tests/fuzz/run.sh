#!/usr/bin/env bash
# Runs every libFuzzer target of a -DENTROKV_FUZZ=ON build for SECONDS each, starting from the
# seed corpus in tests/fuzz/corpus/<name>/ (copied: what the run adds stays out of the
# repository). Fails on the first target that finds a crash, a sanitizer report, a leak, a
# timeout or an out-of-memory; the reproducer is left in out/fuzz/<name>/.
# Usage: bash tests/fuzz/run.sh BUILD_DIR [SECONDS]   (from the repository root)
set -euo pipefail
build="${1:?usage: run.sh BUILD_DIR [SECONDS]}"
seconds="${2:-45}"
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
for name in statistic npy shm recovery request; do
  fuzzer="$build/tests/fuzz/${name}_fuzzer"
  [ -x "$fuzzer" ] || { echo "run.sh: $fuzzer is missing" >&2; exit 2; }
  mkdir -p "$work/$name" "out/fuzz/$name"
  cp "$here/corpus/$name"/* "$work/$name/"
  echo "== fuzzing $name for ${seconds}s"
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb: a 2 GB process is a memory bug
  # (every target's world is a few MB).
  if ! "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="out/fuzz/$name/" "$work/$name" \
      >"$work/$name.log" 2>&1; then
    tail -n 60 "$work/$name.log"
    echo "run.sh: $name found a problem; reproducer in out/fuzz/$name/" >&2
    status=1
    break
  fi
  grep -a -E "^stat::(number_of_executed_units|new_units_added|peak_rss_mb)" "$work/$name.log" |
    tr '\n' ' '
  echo
done
exit "$status"
