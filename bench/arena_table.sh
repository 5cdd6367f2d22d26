#!/usr/bin/env bash
# Arena-mode results for the README: coop, dtr-eq and dte on the five DTR traces at ratios 0.9 down to 0.1, with
# real placement in an arena the size of the budget (fragmentation counts).
#
# Usage: bench/arena_table.sh [BUILD_DIR] [OUT_DIR]      (defaults: build, BUILD_DIR/arena)
# Writes OUT_DIR/arena.csv (one row per run), OUT_DIR/arena.png (overhead vs ratio, one panel per trace),
# OUT_DIR/arena_table.txt (remat-sim's table) and OUT_DIR/arena_summary.md (the Markdown tables, also printed).
set -euo pipefail
script=arena_table
default_out=arena
# shellcheck source=bench/sim_traces.sh
source "$(dirname "$0")/sim_traces.sh"

start=$(date +%s.%N)
"$remat_sim" "${traces[@]}" --mode arena --policies coop,dtr-eq,dte \
  --ratios 0.9,0.8,0.7,0.6,0.5,0.4,0.3,0.2,0.1 --overhead-limit 2.0 \
  --out "$out_dir/arena.csv" --plot "$out_dir/arena.png" > "$out_dir/arena_table.txt"
end=$(date +%s.%N)

python="${REMAT_PYTHON:-python3}"
"$python" "$repo/bench/arena_summary.py" "$out_dir/arena.csv" > "$out_dir/arena_summary.md"
cat "$out_dir/arena_summary.md"
elapsed=$(awk "BEGIN{printf \"%.2f\", $end - $start}")
echo "135 simulations in $elapsed s wall"
echo "files: $out_dir/{arena.csv,arena.png,arena_table.txt,arena_summary.md}"
