#!/usr/bin/env bash
# Builds the libFuzzer targets (build-fuzz/, clang, ASan+UBSan) and runs each one on a fresh copy of its
# seed corpus (tests/fuzz/corpus/<target>/) for SECONDS_PER_TARGET seconds, default 30, up to nproc
# targets at a time. Prints a table of executions and crashes per target and exits 1 if any target
# crashed, leaked or broke a property; each crashing input is kept under build-fuzz/crashes/<target>/.
#
#   scripts/fuzz.sh          # CI: 30 s per target
#   scripts/fuzz.sh 3600     # an hour per target (docs/HARDENING.md records what such runs found)
#
# After a crash the target is restarted for the rest of its time (its grown corpus kept), so a long run
# counts every distinct crashing input rather than stopping at the first; at most 20 per target.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-30}"
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET]" >&2
  exit 2
fi
jobs="${FUZZ_JOBS:-$(nproc)}"
build=build-fuzz
# The token file and checkpoint targets write a file per input and fsync some: on tmpfs that costs
# nothing, on a disk it would cut their executions tenfold.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi

if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found (scripts/setup.sh installs clang and libclang-rt-14-dev)" >&2
  exit 2
fi
extra=()
command -v ninja >/dev/null && extra+=(-G Ninja)
command -v ccache >/dev/null && extra+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
build_start=$SECONDS
cmake -S . -B "$build" "${extra[@]}" -DCMAKE_CXX_COMPILER=clang++ -DGANTRY_FUZZ=ON -DGANTRY_CUDA=OFF \
  -DGANTRY_TESTS=OFF -DGANTRY_WERROR=ON >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target gantry_fuzz
echo "fuzz: build took $((SECONDS - build_start)) s"

targets=()
for dir in tests/fuzz/corpus/*/; do targets+=("$(basename "$dir")"); done

# run_target NAME: fuzzes until its time is spent, restarting after each crash; writes a result line.
run_target() {
  local name=$1 bin="$build/tests/fuzz/fuzz_$1" work="$build/fuzz-run/$1" crashes="$build/crashes/$1"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$crashes"
  cp -r "tests/fuzz/corpus/$name/." "$work/corpus/"
  find "$crashes" -type f -delete
  local left=$seconds execs=0 runs=0 start=$SECONDS
  while ((left > 0)); do
    runs=$((runs + 1))
    local before after n
    before=$(find "$crashes" -type f | wc -l)
    # -timeout: an input that takes 10 s is a hang worth keeping. Each target makes its own scratch
    # directory under TMPDIR, unique to its pid.
    "$bin" -max_total_time="$left" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$crashes/" "$work/corpus" >"$work/log.$runs" 2>&1 || true
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log.$runs" | tail -1)
    execs=$((execs + ${n:-0}))
    left=$((seconds - (SECONDS - start)))
    grep -q '^Done [0-9]* runs' "$work/log.$runs" && break  # ran its full time without a crash
    after=$(find "$crashes" -type f | wc -l)
    if ((after == before)); then
      # Stopped without a new input: the same crash again (libFuzzer names inputs by their hash), or
      # something that left no input at all, which counts as a crash with its log kept.
      if ((after == 0)); then
        echo "fuzz: fuzz_$name stopped without a result; its log is $work/log.$runs" >&2
        cp "$work/log.$runs" "$crashes/log-without-result"
      fi
      break
    fi
    ((after >= 20)) && break
  done
  local corpus
  corpus=$(find "$work/corpus" -type f | wc -l)
  echo "$name $((SECONDS - start)) $execs $corpus $(find "$crashes" -type f | wc -l)" >"$work/result"
}

echo "fuzz: ${#targets[@]} targets, ${seconds} s each, ${jobs} at a time"
for name in "${targets[@]}"; do
  [ -x "$build/tests/fuzz/fuzz_$name" ] || { echo "fuzz: no target fuzz_$name for tests/fuzz/corpus/$name" >&2; exit 1; }
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  run_target "$name" &
done
wait

printf '\n%-22s %8s %12s %10s %8s %8s\n' target seconds executions exec/s corpus crashes
total_crashes=0
for name in "${targets[@]}"; do
  read -r _ secs execs corpus crashed <"$build/fuzz-run/$name/result"
  printf '%-22s %8s %12s %10s %8s %8s\n' "$name" "$secs" "$execs" "$((execs / (secs > 0 ? secs : 1)))" \
    "$corpus" "$crashed"
  total_crashes=$((total_crashes + crashed))
done
if ((total_crashes > 0)); then
  echo
  echo "fuzz: $total_crashes crashing inputs; reproduce one with $build/tests/fuzz/fuzz_<target> <file>:"
  find "$build/crashes" -type f | sort
  exit 1
fi
echo "fuzz: no crashes"
