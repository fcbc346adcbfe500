#!/usr/bin/env bash
# Everything a fresh Debian machine needs to pass the tests: packages, build, the formatting check, the
# whole suite. The suite runs in parallel and in random order, so a test that depends on another's files
# or on running first shows up here rather than as a rare flake.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/format.sh --check
bash scripts/build.sh
ctest --test-dir build --output-on-failure --parallel "$(nproc)" --schedule-random --timeout 600
