#include "runtime/link_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/engine.h"

namespace remat {

LinkModel::LinkModel(const PagingOptions& options)
    : bandwidth_bytes_per_s_(options.bandwidth_bytes_per_s),
      latency_ns_(options.latency_ns),
      duplex_(options.duplex) {}

std::int64_t LinkModel::TransferNs(std::int64_t bytes) const {
  const double bw = bandwidth_bytes_per_s_;
  const double ns = bw > 0 ? static_cast<double>(bytes) * 1e9 / bw : std::numeric_limits<double>::infinity();
  if (ns >= 1e18) return std::numeric_limits<std::int64_t>::max() / 4;
  return latency_ns_ + static_cast<std::int64_t>(std::ceil(ns));
}

std::int64_t LinkModel::Issue(std::int64_t bytes, bool in, std::int64_t now, std::int64_t not_before) {
  std::int64_t& free = in && duplex_ ? in_free_ : out_free_;
  const std::int64_t start = std::max({now, free, not_before});
  free = start + TransferNs(bytes);
  return free;
}

}  // namespace remat
