#!/usr/bin/env bash
# The main job with embedded defaults and no downloads. Until budgeted PyTorch training lands
# (examples/train.py, issue 6), it replays a real GPU op trace (ResNet-32, DTR authors' log) under shrinking
# memory budgets with several eviction policies, through the same engine the PyTorch path uses.
# Usage: scripts/demo.sh BUILD_DIR
set -euo pipefail
build_dir="${1:-build}"
shared_dir="${REMAT_SHARED_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/shared}"
trace="$shared_dir/traces/dtr/resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log"
if [ ! -f "$trace" ]; then
  echo "demo: trace not found: $trace (set REMAT_SHARED_DIR to the folder holding traces/dtr/)" >&2
  exit 1
fi
echo "remat demo: replaying ResNet-32 (batch 56) op trace under budgets of 90% .. 30% of its peak memory"
# Arena mode is what the PyTorch path runs: real placement, the budget a hard limit, fragmentation counted.
exec "$build_dir/tools/remat-sim" "$trace" --ratios 0.9,0.7,0.5,0.4,0.3 --policies dtr-eq,dte,coop,lru \
  --mode arena
