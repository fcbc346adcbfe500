#!/usr/bin/env bash
# clang-format over every C++ and CUDA source the project owns, with the repo's .clang-format and Debian's
# clang-format (the version CI has). `scripts/format.sh` rewrites the files; `scripts/format.sh --check`
# changes nothing and exits 1 naming each file that differs (CI runs this).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "format: clang-format not found (scripts/setup.sh installs Debian's clang-format)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    clang-format --style=file "$f" | cmp -s - "$f" || bad+=("$f")
  done
  if ((${#bad[@]})); then
    echo "format: ${#bad[@]} of ${#files[@]} files differ from clang-format ($(clang-format --version)):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    echo "format: run scripts/format.sh to rewrite them" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files as clang-format writes them"
else
  clang-format -i --style=file "${files[@]}"
fi
