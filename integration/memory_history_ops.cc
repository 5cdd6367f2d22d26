// The torch ops behind remat's pictures of a run (memory_events.h; the Python side is remat/_history.py):
// torch.ops.remat.memory_history_start / _stop / memory_history / memory_blocks. Thin wrappers, no logic.
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "integration/cpu_allocator.h"
#include "integration/memory_events.h"

namespace remat::integration {
namespace {

void HistoryStart(int64_t max_entries) {
  TORCH_CHECK(max_entries > 0, "remat: max_entries must be a positive number of events, got ", max_entries);
  StartMemoryHistory(static_cast<std::size_t>(max_entries));
}

void HistoryStop() { StopMemoryHistory(); }

// Columns flattened, 9 per event: time_ns, kind (MemoryEventKind), address, size, extra, context, label, thread,
// device (-1: the CPU arena).
// Contexts flattened: for each, its length, then its label ids (outermost first).
std::tuple<std::vector<int64_t>, std::vector<std::string>, std::vector<int64_t>, int64_t, bool> History() {
  MemoryHistory history = CopyMemoryHistory();
  std::vector<int64_t> events;
  events.reserve(history.events.size() * 9);
  for (const MemoryEvent& e : history.events) {
    for (const std::uint64_t value : {static_cast<std::uint64_t>(e.time_ns), static_cast<std::uint64_t>(e.kind),
                                      e.address, e.size, e.extra, std::uint64_t{e.context}, std::uint64_t{e.label},
                                      std::uint64_t{e.thread}}) {
      events.push_back(static_cast<int64_t>(value));
    }
    events.push_back(e.device);
  }
  std::vector<int64_t> contexts;
  for (const std::vector<std::uint32_t>& context : history.contexts) {
    contexts.push_back(static_cast<int64_t>(context.size()));
    contexts.insert(contexts.end(), context.begin(), context.end());
  }
  return {std::move(events), std::move(history.labels), std::move(contexts), static_cast<int64_t>(history.dropped),
          history.enabled};
}

// The installed CPU arena's blocks, 3 per block: address, size, allocated (0 or 1). Empty when none is installed.
std::vector<int64_t> Blocks() {
  std::vector<int64_t> out;
  for (const BlockInfo& block : CpuArenaBlocks()) {
    out.push_back(static_cast<int64_t>(block.address));
    out.push_back(static_cast<int64_t>(block.size));
    out.push_back(block.free ? 0 : 1);
  }
  return out;
}

}  // namespace
}  // namespace remat::integration

TORCH_LIBRARY_FRAGMENT(remat, m) {
  using namespace remat::integration;
  m.def("memory_history_start(int max_entries) -> ()", &HistoryStart);
  m.def("memory_history_stop() -> ()", &HistoryStop);
  m.def("memory_history() -> (int[], str[], int[], int, bool)", &History);
  m.def("memory_blocks() -> int[]", &Blocks);
}
