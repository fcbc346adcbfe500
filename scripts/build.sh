#!/usr/bin/env bash
# Configures and builds into build/ (Release with debug info, warnings as errors). Extra arguments go to
# CMake, e.g. scripts/build.sh -DGANTRY_ENGINE_ONLY=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B build "${generator[@]}" -DGANTRY_WERROR=ON "$@"
cmake --build build --parallel "$(nproc)"
