#!/usr/bin/env bash
# Counter, arena and stitch modes side by side (issue 18): coop, dtr-eq, dte and msps on the five DTR traces at
# ratios 0.9 down to 0.1. Counter mode counts bytes (no placement); arena mode places blocks in an arena the size of
# the budget (fragmentation counts); stitch mode places them in a stitching arena whose budget counts mapped
# granules (--granule, default 2MiB), so a request needs free granules, not a hole.
#
# Usage: bench/stitch_table.sh [BUILD_DIR] [OUT_DIR] [GRANULE]      (defaults: build, BUILD_DIR/stitch, 2MiB)
# Writes OUT_DIR/{counter,arena,stitch}.csv and OUT_DIR/stitch_summary.md (also printed).
set -euo pipefail
script=stitch_table
default_out=stitch
# shellcheck source=bench/sim_traces.sh
source "$(dirname "$0")/sim_traces.sh"
granule="${3:-2MiB}"

start=$(date +%s.%N)
for mode in counter arena stitch; do
  "$remat_sim" "${traces[@]}" --mode "$mode" --granule "$granule" --policies coop,dtr-eq,dte,msps \
    --ratios 0.9,0.8,0.7,0.6,0.5,0.4,0.3,0.2,0.1 --overhead-limit 2.0 --out "$out_dir/$mode.csv" > /dev/null
done
end=$(date +%s.%N)

python="${REMAT_PYTHON:-python3}"
"$python" "$repo/bench/stitch_summary.py" "$out_dir/counter.csv" "$out_dir/arena.csv" "$out_dir/stitch.csv" \
  > "$out_dir/stitch_summary.md"
cat "$out_dir/stitch_summary.md"
elapsed=$(awk "BEGIN{printf \"%.2f\", $end - $start}")
echo "540 simulations in $elapsed s wall (granule $granule)"
