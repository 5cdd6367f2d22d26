#!/usr/bin/env bash
# Runs the whole model zoo: tests/python/test_zoo.py with REMAT_ZOO=all (every model of tests/python/zoo.py at 0.5 of
# its peak, offload off and auto), and writes the table of results to BUILD_DIR/zoo.md (REMAT_ZOO_MARKDOWN to
# choose; REMAT_ZOO=name,name for some models only). Fails if a run fails; known gaps are warnings.
# Usage: scripts/run_zoo.sh BUILD_DIR
set -uo pipefail
build_dir="${1:-build}"
REMAT_VENV="${REMAT_VENV:-$HOME/.cache/remat/venv}"
export REMAT_BUILD_DIR="$(cd "$build_dir" && pwd)"
export REMAT_ZOO="${REMAT_ZOO:-all}"
export REMAT_ZOO_MARKDOWN="${REMAT_ZOO_MARKDOWN:-$REMAT_BUILD_DIR/zoo.md}"

# -s: one line per model and mode as it finishes (the whole zoo takes about 40 minutes)
"$REMAT_VENV/bin/python" -m pytest -q -s -rfEw tests/python/test_zoo.py
status=$?
echo "zoo table: $REMAT_ZOO_MARKDOWN; pytest exit status: $status"
exit $status
