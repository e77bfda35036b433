#!/usr/bin/env bash
# The fuzz targets' long mode: each target of fuzzing runs
# coverage-guided (cargo-fuzz, libFuzzer) for FUZZ_SECONDS (default 60) from
# its committed corpus, then the corpus is minimised in place. A crash is
# copied to fuzz/regressions/<target>/ (replayed by `cargo test -p
# vynil-fuzzing` once fixed) and fails the run; so does a target that ran
# fewer than FUZZ_MIN_EXECS (default 10000) inputs.
#
#   scripts/fuzz.sh                 every target, 60 s each
#   FUZZ_SECONDS=600 scripts/fuzz.sh registry objects
#
# No nightly toolchain can be fetched here: RUSTC_BOOTSTRAP=1 lets the stable
# compiler take cargo-fuzz's -Z flags, and `-s none` needs no sanitizer
# runtime (panics are what the targets report). Needs a C++ compiler (g++)
# for libFuzzer; cargo-fuzz is installed from crates.io when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
min_execs=${FUZZ_MIN_EXECS:-10000}
export RUSTC_BOOTSTRAP=1 PROTOC=/bin/false CARGO_TERM_COLOR=never
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
command -v c++ >/dev/null 2>&1 || { echo "fuzz: libFuzzer needs a C++ compiler: apt-get install g++" >&2; exit 2; }
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(annotations names retention registry objects gateway)
fi
(cd fuzz && cargo fuzz build -s none)
failed=0
printf '%-12s %12s %10s %8s %8s\n' target executions exec/s corpus crashes
for target in "${targets[@]}"; do
  corpus=fuzz/corpus/$target artifacts=fuzz/artifacts/$target log=fuzz/artifacts/$target.log
  mkdir -p "$corpus" "$artifacts" "fuzz/regressions/$target"
  rc=0
  (cd fuzz && cargo fuzz run -s none "$target" "../$corpus" -- \
    -max_total_time="$seconds" -max_len=4096 -timeout=10 -print_final_stats=1) >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  speed=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  crashes=0
  for crash in "$artifacts"/crash-* "$artifacts"/timeout-* "$artifacts"/oom-*; do
    [ -e "$crash" ] || continue
    mv "$crash" "fuzz/regressions/$target/"
    crashes=$((crashes + 1))
  done
  # Minimised on edges alone: the inputs that reach every edge reached, not every hit count.
  (cd fuzz && cargo fuzz cmin -s none "$target" "../$corpus" -- -use_counters=0 >/dev/null 2>&1) || true
  printf '%-12s %12s %10s %8s %8s\n' "$target" "${execs:-0}" "${speed:-0}" "$(ls "$corpus" | wc -l)" "$crashes"
  if [ "$rc" -ne 0 ] || [ "$crashes" -gt 0 ]; then
    echo "fuzz: $target failed (exit $rc); its log: $log; inputs kept in fuzz/regressions/$target/" >&2
    failed=1
  elif [ "${execs:-0}" -lt "$min_execs" ]; then
    echo "fuzz: $target ran ${execs:-0} inputs, fewer than FUZZ_MIN_EXECS=$min_execs" >&2
    failed=1
  fi
done
exit $failed
