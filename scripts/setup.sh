#!/usr/bin/env bash
# Installs the Debian packages Gantry builds and tests with. Idempotent: installs only what is missing,
# and runs apt-get update only when something is.
set -euo pipefail

packages=(
  build-essential cmake ninja-build git pkg-config
  googletest libgtest-dev libgmock-dev   # tests
  libcli11-dev nlohmann-json3-dev        # gantry-engine's flags, manifests and JSON lines
  libsqlite3-dev                         # storage/: the run history
  libxxhash-dev                          # cross-checks our own XXH64 in the tests
  libgloo-dev                            # the CPU communicator (engine/core/comm); GPU machines use NCCL
  # engine/cluster: the HTTP API's server (cpp-httplib), its client (libcurl), HTTPS for both (OpenSSL).
  # Not needed for GANTRY_ENGINE_ONLY builds.
  libcpp-httplib-dev libcurl4-openssl-dev libssl-dev
  # ui/ and the `gantry` console: Dear ImGui (with its GLFW and OpenGL3 backends), GLFW, stb's PNG writer,
  # DejaVu fonts found at build time, and Xvfb with Mesa's software OpenGL for the window tests.
  libimgui-dev libglfw3-dev libstb-dev fonts-dejavu-core xvfb xauth libgl1-mesa-dri
  # scripts/fuzz.sh: clang and its runtimes (libFuzzer, ASan, UBSan) for the fuzz targets in tests/fuzz.
  clang libclang-rt-14-dev
  clang-format                           # scripts/format.sh --check (CI): the one formatter version
  # tests/app/slurm_test.cpp: a real Slurm cluster on loopback (munged, slurmctld, slurmd, the clients).
  slurmctld slurmd slurm-client munge
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
# nvcc is not a Debian package here: CUDA 13 lives in /usr/local/cuda on these machines. Without it the
# CUDA sources are skipped (the build says so) and everything else still builds and tests.
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; then
  echo "setup: nvcc found, CUDA sources will be compiled"
else
  echo "setup: no nvcc, CUDA sources will be skipped"
fi
