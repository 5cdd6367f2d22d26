#include "integration/cuda/cuda_history.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace remat::integration {
namespace {

using Trace = c10::CachingDeviceAllocator::TraceEntry;

const char* RematAction(MemoryEventKind kind) {
  switch (kind) {
    case MemoryEventKind::kEvict:
      return "remat_evict";
    case MemoryEventKind::kRelease:
      return "remat_release";
    case MemoryEventKind::kRematerialize:
      return "remat_rematerialize";
    case MemoryEventKind::kPageOut:
      return "remat_page_out";
    case MemoryEventKind::kPageIn:
      return "remat_page_in";
    default:
      return nullptr;
  }
}

}  // namespace

std::vector<std::vector<Trace>> CudaDeviceTraces(const MemoryHistory& history, std::size_t device_count) {
  std::vector<std::vector<Trace>> traces(device_count);
  for (const MemoryEvent& e : history.events) {
    if (e.device < 0 || static_cast<std::size_t>(e.device) >= device_count) continue;
    const auto device = static_cast<c10::DeviceIndex>(e.device);
    std::vector<Trace>& out = traces[static_cast<std::size_t>(e.device)];
    auto add = [&](Trace::Action action, std::size_t address, std::size_t size, std::string metadata = {}) {
      out.emplace_back(action, device, address, size, nullptr, c10::MempoolId_t{0, 0}, 0, nullptr, "",
                       std::move(metadata));
      out.back().time_.t_ = static_cast<time_t>(e.time_ns / 1000);
    };
    switch (e.kind) {
      case MemoryEventKind::kAlloc:
        add(Trace::ALLOC, e.address, e.size);
        break;
      case MemoryEventKind::kFree:
        add(Trace::FREE_REQUESTED, e.address, e.size);
        add(Trace::FREE_COMPLETED, e.address, e.size);
        break;
      case MemoryEventKind::kMove:
        add(Trace::FREE_REQUESTED, e.address, e.size);
        add(Trace::FREE_COMPLETED, e.address, e.size);
        add(Trace::ALLOC, e.extra, e.size);
        break;
      case MemoryEventKind::kOutOfMemory:
        add(Trace::OOM, e.extra, e.size);
        break;
      default:
        if (const char* action = RematAction(e.kind)) {
          std::vector<std::string> context;
          for (const std::uint32_t label : history.contexts.at(e.context)) context.push_back(history.labels.at(label));
          std::string metadata = absl::StrCat(action, " storage ", e.extra);
          if (!context.empty()) absl::StrAppend(&metadata, " in: ", absl::StrJoin(context, " > "));
          add(Trace::ANNOTATE, e.address, e.size, std::move(metadata));
        }
        break;
    }
  }
  return traces;
}

}  // namespace remat::integration
