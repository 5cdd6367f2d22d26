#!/usr/bin/env bash
# The DTR paper's figure on the five DTR traces: compute overhead against memory ratio in counter mode (no
# addresses, as simrd), one panel per trace, one line per heuristic, ratios 0.9 down to 0.1.
#
# Usage: bench/sim_counter_plot.sh [BUILD_DIR] [OUT_DIR]      (defaults: build, BUILD_DIR/plots)
# Writes OUT_DIR/counter.csv, OUT_DIR/counter.png and OUT_DIR/counter_table.txt.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
build_dir="${1:-$repo/build}"
out_dir="${2:-$build_dir/plots}"
trace_dir="${REMAT_SHARED_DIR:-$(dirname "$repo")/shared}/traces/dtr"
remat_sim="$build_dir/tools/remat-sim"
[ -x "$remat_sim" ] || { echo "sim_counter_plot: $remat_sim not built (cmake --build $build_dir)" >&2; exit 1; }
mkdir -p "$out_dir"
"$remat_sim" \
  "$trace_dir/resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log" \
  "$trace_dir/transformer-10-8000000000.0-2020-10-1-10-56-5-default.log" \
  "$trace_dir/tv_densenet121-84-10000000000.0-2020-10-1-13-41-18-default.log" \
  "$trace_dir/unet-6-8000000000.0-2020-10-1-10-57-18-default.log" \
  "$trace_dir/lstm-128-11000000000.0-2020-10-1-16-38-52-default.log" \
  --dtr-paper --mode counter --policies dtr,dtr-eq,dtr-local,msps,lru,largest \
  --ratios 0.9,0.8,0.7,0.6,0.5,0.4,0.3,0.2,0.1 --overhead-limit 2.0 \
  --out "$out_dir/counter.csv" --plot "$out_dir/counter.png" > "$out_dir/counter_table.txt"
echo "files: $out_dir/{counter.csv,counter.png,counter_table.txt}"
