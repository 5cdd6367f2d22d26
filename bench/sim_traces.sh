# Sourced by the bench/ scripts that replay the five DTR traces: sets repo, build_dir, out_dir, remat_sim and the
# traces array, and fails clearly when remat-sim is not built or a trace is missing.
# Before sourcing, set `script` (for messages) and `default_out` (OUT_DIR's name under BUILD_DIR).
# Arguments of the sourcing script: [BUILD_DIR] [OUT_DIR].
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-$repo/build}"
out_dir="${2:-$build_dir/$default_out}"
shared_dir="${REMAT_SHARED_DIR:-$(dirname "$repo")/shared}"
trace_dir="$shared_dir/traces/dtr"
remat_sim="$build_dir/tools/remat-sim"

[ -x "$remat_sim" ] || { echo "$script: $remat_sim not built (cmake --build $build_dir)" >&2; exit 1; }
traces=(
  "$trace_dir/resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log"
  "$trace_dir/transformer-10-8000000000.0-2020-10-1-10-56-5-default.log"
  "$trace_dir/tv_densenet121-84-10000000000.0-2020-10-1-13-41-18-default.log"
  "$trace_dir/unet-6-8000000000.0-2020-10-1-10-57-18-default.log"
  "$trace_dir/lstm-128-11000000000.0-2020-10-1-16-38-52-default.log"
)
for t in "${traces[@]}"; do
  [ -f "$t" ] || { echo "$script: trace not found: $t (set REMAT_SHARED_DIR)" >&2; exit 1; }
done
mkdir -p "$out_dir"
