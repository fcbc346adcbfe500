#!/usr/bin/env bash
# The sanitizer builds, each in its own build directory beside build/:
#   asan  build-asan/, AddressSanitizer + UndefinedBehaviorSanitizer (GANTRY_SANITIZE): the unit and
#         integration tests.
#   tsan  build-tsan/, ThreadSanitizer (GANTRY_TSAN): the tests of the threaded parts: coordinator and
#         agent (HTTP server and client, SSE, run policies, ingest writer, the cluster CLI), the worker
#         launcher (gang), the console's data source, and comm (frames, the store, Gloo).
# Any report fails the test that triggered it, and this script exits non-zero.
#
#   scripts/sanitize.sh                      # both, everything (what the lead runs before stopping)
#   scripts/sanitize.sh tsan                 # one of them
#   scripts/sanitize.sh asan http_test frame_test   # only these test executables (a quick check)
#   SANITIZE_CMAKE_ARGS=-DGANTRY_ENGINE_ONLY=ON scripts/sanitize.sh   # extra CMake options for both builds
set -euo pipefail
cd "$(dirname "$0")/.."

which="${1:-all}"
shift || true
case "$which" in
  asan | tsan | all) ;;
  *)
    echo "usage: scripts/sanitize.sh [asan|tsan|all] [TEST_TARGET...]" >&2
    exit 2
    ;;
esac

tsan_targets=(http_test sse_test run_policies_test ingest_writer_test cluster_cli_test gang_test
              console_data_source_test frame_test store_test gloo_communicator_test)

extra=()
command -v ninja >/dev/null && extra+=(-G Ninja)
command -v ccache >/dev/null && extra+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

# Reports stop the process with a non-zero exit, so ctest counts them as failures; the leak check and
# the stack traces stay on.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"

# run_build DIR CMAKE_OPTION LABEL_REGEX TARGET...: configure, build the targets (all when none), run
# the tests that were built.
run_build() {
  local dir=$1 option=$2 labels=$3
  shift 3
  local start=$SECONDS
  # shellcheck disable=SC2086 # SANITIZE_CMAKE_ARGS holds several words on purpose
  cmake -S . -B "$dir" "${extra[@]}" -DGANTRY_WERROR=ON -DGANTRY_CUDA=OFF "$option" ${SANITIZE_CMAKE_ARGS:-} >/dev/null
  if (($#)); then
    cmake --build "$dir" --parallel "$(nproc)" --target "$@"
  else
    cmake --build "$dir" --parallel "$(nproc)"
  fi
  echo "sanitize: $dir built in $((SECONDS - start)) s"
  start=$SECONDS
  # Test executables that were not built register as <name>_NOT_BUILT: a partial build runs only its own.
  ctest --test-dir "$dir" --output-on-failure --parallel "$(nproc)" --timeout 1200 -L "$labels" -E '_NOT_BUILT$'
  echo "sanitize: $dir tests took $((SECONDS - start)) s"
}

if [[ "$which" == asan || "$which" == all ]]; then
  run_build build-asan -DGANTRY_SANITIZE=ON '^(unit|integration)$' "$@"
fi
if [[ "$which" == tsan || "$which" == all ]]; then
  if (($#)); then targets=("$@"); else targets=("${tsan_targets[@]}"); fi
  run_build build-tsan -DGANTRY_TSAN=ON '^(unit|integration)$' "${targets[@]}"
fi
echo "sanitize: clean"
