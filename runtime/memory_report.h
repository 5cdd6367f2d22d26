// MemoryReport: what an out-of-memory error says about the engine's memory (engine.h, "No memory"): the budget, the
// bytes in use, of those the bytes locked by the running ops, constant (in the arena or not), pinned results and in
// arena blocks no storage holds; where it ran out (the op the caller runs and the innermost replay, with its depth:
// Rematerializer::where); and in arena mode the largest run of free or evictable blocks (the largest window any
// eviction could have made), or with a stitching arena the physical bytes mapped and what the evictable storages hold.
//
// It reads the engine and owns nothing; it is separate so that what an error says is written in one place.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/engine.h"

namespace remat {

class MemoryReport {
 public:
  // Every report holds this phrase: a message that has it carries a report already.
  static constexpr char kMarker[] = "locked by the running ops";

  explicit MemoryReport(const Engine& engine) : engine_(engine) {}

  std::string Describe() const;
  // ResourceExhausted with the executor's out-of-memory `message`, `context`, and the report, unless the message
  // has one already (in arena mode the engine is the arena's pressure handler, and the arena adds DescribeMemory
  // when it gives up).
  absl::Status Annotate(absl::string_view message, absl::string_view context) const;
  // Arena blocks no engine storage holds (a running kernel's own buffers, or memory made where remat cannot see).
  std::int64_t UnknownArenaBytes() const;

 private:
  const Engine& engine_;
};

}  // namespace remat
