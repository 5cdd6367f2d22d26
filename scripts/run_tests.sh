#!/usr/bin/env bash
# Runs every test: ctest (GoogleTest, C++) and pytest (Python). Prints both runners' summary lines and fails
# if either fails. Usage: scripts/run_tests.sh BUILD_DIR
set -uo pipefail
build_dir="${1:-build}"
REMAT_VENV="${REMAT_VENV:-$HOME/.cache/remat/venv}"
export REMAT_BUILD_DIR="$(cd "$build_dir" && pwd)"

ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)"
ctest_status=$?

"$REMAT_VENV/bin/python" -m pytest -q tests/python
pytest_status=$?

echo "ctest exit status: $ctest_status, pytest exit status: $pytest_status"
[ $ctest_status -eq 0 ] && [ $pytest_status -eq 0 ]
