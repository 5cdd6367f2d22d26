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
repo="$(cd "$(dirname "$0")/.." && pwd)"
build_dir="${1:-$repo/build}"
out_dir="${2:-$build_dir/paging}"
shared_dir="${REMAT_SHARED_DIR:-$(dirname "$repo")/shared}"
trace_dir="$shared_dir/traces/dtr"
remat_sim="$build_dir/tools/remat-sim"

[ -x "$remat_sim" ] || { echo "paging_figure: $remat_sim not built (cmake --build $build_dir)" >&2; exit 1; }
traces=(
  "$trace_dir/resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log"
  "$trace_dir/transformer-10-8000000000.0-2020-10-1-10-56-5-default.log"
  "$trace_dir/tv_densenet121-84-10000000000.0-2020-10-1-13-41-18-default.log"
  "$trace_dir/unet-6-8000000000.0-2020-10-1-10-57-18-default.log"
  "$trace_dir/lstm-128-11000000000.0-2020-10-1-16-38-52-default.log"
)
for t in "${traces[@]}"; do
  [ -f "$t" ] || { echo "paging_figure: trace not found: $t (set REMAT_SHARED_DIR)" >&2; exit 1; }
done
mkdir -p "$out_dir"

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
