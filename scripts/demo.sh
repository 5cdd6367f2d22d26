#!/usr/bin/env bash
# The main job with embedded defaults and no downloads, in two parts:
#  1. remat-sim replays a real GPU op trace (ResNet-32, DTR authors' log) under shrinking budgets with several
#     eviction policies, in arena mode, through the same engine the PyTorch path uses;
#  2. examples/train.py trains torchvision's resnet18 on synthetic data on the CPU under 0.35 of its unconstrained
#     peak, with real eviction, rematerialization and paging to a file (gradients and optimizer state included),
#     and checks that losses and parameters are bitwise identical to a run without remat. A file, not host memory:
#     on a CPU the host tier in memory is the same RAM as the arena, so paging there would move memory, not save it.
# Usage: scripts/demo.sh BUILD_DIR
set -euo pipefail
build_dir="${1:-build}"
REMAT_VENV="${REMAT_VENV:-$HOME/.cache/remat/venv}"
export REMAT_BUILD_DIR="$(cd "$build_dir" && pwd)"
shared_dir="${REMAT_SHARED_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/shared}"
trace="$shared_dir/traces/dtr/resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log"
if [ ! -f "$trace" ]; then
  echo "demo: trace not found: $trace (set REMAT_SHARED_DIR to the folder holding traces/dtr/)" >&2
  exit 1
fi
echo "== remat demo 1/2: replaying ResNet-32 (batch 56) op trace under budgets of 90% .. 30% of its peak memory"
# Arena mode is what the PyTorch path runs: real placement, the budget a hard limit, fragmentation counted.
"$build_dir/tools/remat-sim" "$trace" --ratios 0.9,0.7,0.5,0.4,0.3 --policies dtr-eq,dte,coop,lru --mode arena
echo
echo "== remat demo 2/2: training resnet18 on the CPU under 0.35 of its peak memory, paging to a file"
"$REMAT_VENV/bin/python" examples/train.py --model resnet18 --budget 0.35 --offload auto --host-tier file \
  --costs estimated
