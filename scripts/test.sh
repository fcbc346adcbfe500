#!/usr/bin/env bash
# Everything a fresh Debian machine needs to pass the tests: packages, build, the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure --parallel "$(nproc)" --timeout 600
