#!/usr/bin/env bash
# Configures the CMake build once; later calls only re-run CMake when the build directory is missing.
# Usage: scripts/configure.sh BUILD_DIR [extra cmake args...]
set -euo pipefail
build_dir="$1"; shift
REMAT_VENV="${REMAT_VENV:-$HOME/.cache/remat/venv}"
if [ -f "$build_dir/build.ninja" ] && [ $# -eq 0 ]; then
  exit 0  # ninja re-runs CMake by itself when a CMakeLists.txt changes
fi
torch_prefix=$("$REMAT_VENV/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S . -B "$build_dir" -G Ninja \
  -DCMAKE_PREFIX_PATH="$torch_prefix" \
  "$@"
