#!/usr/bin/env bash
# Paging results for issue 7: coop and dtr-eq on the five DTR traces at ratios 0.9 down to 0.1, in arena mode,
# with offload off and auto over a 12 GB/s link (the V100 <-> pinned host figure of Beaumont et al.; the engine's
# default 10 us latency per copy, unlimited host tier).
#
# Usage: bench/paging_figure.sh [BUILD_DIR] [OUT_DIR]      (defaults: build, BUILD_DIR/paging)
#   Extra remat-sim flags can be passed in $PAGING_SIM_FLAGS (e.g. "--duplex-link" or "--host-budget 16GiB").
# Writes OUT_DIR/paging.csv (one row per run), OUT_DIR/paging.png (overhead vs ratio, one panel per trace, one
# line per policy x offload), OUT_DIR/paging_table.txt (remat-sim's table) and OUT_DIR/paging_summary.md (the
# Markdown tables: overhead and lowest feasible ratio, traffic, effect of paging; also printed).
set -euo pipefail
script=paging_figure
default_out=paging
# shellcheck source=bench/sim_traces.sh
source "$(dirname "$0")/sim_traces.sh"

start=$(date +%s.%N)
# shellcheck disable=SC2086  # PAGING_SIM_FLAGS is a list of flags
"$remat_sim" "${traces[@]}" --mode arena --policies coop,dtr-eq --offload off,auto --bandwidth 12GB/s \
  --ratios 0.9,0.8,0.7,0.6,0.5,0.4,0.3,0.2,0.1 --overhead-limit 2.0 ${PAGING_SIM_FLAGS:-} \
  --out "$out_dir/paging.csv" --plot "$out_dir/paging.png" > "$out_dir/paging_table.txt"
end=$(date +%s.%N)

python="${REMAT_PYTHON:-python3}"
"$python" "$repo/bench/paging_summary.py" "$out_dir/paging.csv" > "$out_dir/paging_summary.md"
cat "$out_dir/paging_summary.md"
elapsed=$(awk "BEGIN{printf \"%.2f\", $end - $start}")
echo "180 simulations (5 traces x 2 policies x 2 offload modes x 9 ratios) in $elapsed s wall"
echo "files: $out_dir/{paging.csv,paging.png,paging_table.txt,paging_summary.md}"
