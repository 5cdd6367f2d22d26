// TimelineWriter: one replay's timeline (runtime/replay.h, TimelineSample) as the Chrome trace JSON that
// remat.trace writes, so one plot script draws both (integration/python/remat/plot.py): counter tracks
// "memory (bytes)" (in use, paged out) and "evicted, released and rematerialized (bytes, so far)", and a zero-length
// "replay" span at each sample where ops were replayed. Times are the simulated clock (op time, replays included).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/replay.h"

namespace remat::sim {

// The JSON text; `title` goes to otherData.title.
std::string TimelineJson(const std::vector<TimelineSample>& samples, const std::string& title);

// Writes TimelineJson to `path`; an error names the path and the reason.
absl::Status WriteTimeline(const std::vector<TimelineSample>& samples, const std::string& title,
                           const std::string& path);

}  // namespace remat::sim
