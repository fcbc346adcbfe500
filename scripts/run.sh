#!/usr/bin/env bash
# The main job until the console exists: set up, build, then train the tiny config headless on the
# built-in synthetic corpus, one progress line per step. Extra arguments go to `gantry-engine train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec build/app/gantry-engine train --config assets/configs/tiny.toml "$@"
