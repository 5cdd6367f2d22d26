// TraceFuture: see trace_future.h.
#include "runtime/trace_future.h"

#include <algorithm>

namespace remat {

TraceFuture::TraceFuture(const Trace& trace, const Engine& engine, const std::vector<std::int64_t>& bound)
    : engine_(engine), bound_(bound), reads_(trace.names.size()), cursor_(trace.names.size(), 0) {
  std::int32_t position = 0;
  for (const TraceOp& op : trace.ops) {
    if (op.kind != TraceOpKind::kCall && op.kind != TraceOpKind::kMutate) continue;
    for (TraceName a : op.args) {
      if (reads_[a].empty() || reads_[a].back() != position) reads_[a].push_back(position);
    }
    ++position;
  }
}

void TraceFuture::Bind(TraceName name, TensorId tensor) {
  const StorageIndex s = engine_.StorageOf(tensor);
  if (names_of_.size() <= s) names_of_.resize(s + 1);
  std::vector<TraceName>& names = names_of_[s];
  if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
}

std::int64_t TraceFuture::OpsUntilNextUse(StorageIndex s) const {
  std::int64_t best = StorageView::kNeverAgain;
  if (s >= names_of_.size()) return best;
  std::vector<TraceName>& names = names_of_[s];
  for (std::size_t i = 0; i < names.size();) {
    const TraceName n = names[i];
    if (bound_[n] < 0 || engine_.StorageOf(static_cast<TensorId>(bound_[n])) != s) {  // rebound since
      names[i] = names.back();
      names.pop_back();
      continue;
    }
    const std::vector<std::int32_t>& reads = reads_[n];
    std::size_t& c = cursor_[n];
    while (c < reads.size() && reads[c] <= position_) ++c;
    if (c < reads.size()) best = std::min<std::int64_t>(best, reads[c] - position_);
    ++i;
  }
  return best;
}

}  // namespace remat
