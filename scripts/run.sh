#!/usr/bin/env bash
# The main job: set up, build, then open the console (`gantry`) on an embedded local cluster with a tiny
# run ready to launch. Where there is no display, train the tiny config headless instead, one progress
# line per step. Extra arguments go to `gantry` (or, headless, to `gantry-engine train`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
if [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ] && [ -x build/app/gantry ]; then
  exec build/app/gantry "$@"
fi
echo "run: no display, so the tiny GPT trains headless (the console needs DISPLAY; see README.md)" >&2
exec build/app/gantry-engine train --config assets/configs/tiny.toml "$@"
