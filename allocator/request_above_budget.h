// The sentence an out-of-memory message adds when one request alone is larger than the budget: evicting everything
// would not make room for it, so the advice differs from "evict more" (a kernel's own scratch buffer, such as a
// oneDNN convolution's workspace on a CPU without AVX-512, is such a request; remat cannot evict it).
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"

namespace remat {

// Empty when `aligned_request` fits in `budget`.
inline std::string RequestAboveBudgetNote(std::size_t aligned_request, std::size_t budget) {
  if (budget == 0 || aligned_request <= budget) return "";
  return absl::StrCat(" This one request is larger than the whole budget (by ", aligned_request - budget,
                      " bytes): no eviction can make room for it, so the budget must be above it (a kernel's own "
                      "scratch buffer, such as a oneDNN convolution's workspace, counts against the budget too).");
}

}  // namespace remat
