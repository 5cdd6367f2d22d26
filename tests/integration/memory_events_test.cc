// The memory history (integration/memory_events.h): off records nothing, the ring keeps the newest events, scopes
// nest into contexts, ops get begin/end events.
#include "integration/memory_events.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace remat::integration {
namespace {

std::vector<std::string> ContextOf(const MemoryHistory& history, const MemoryEvent& event) {
  std::vector<std::string> labels;
  for (const std::uint32_t id : history.contexts.at(event.context)) labels.push_back(history.labels.at(id));
  return labels;
}

TEST(MemoryEvents, NothingIsRecordedWhileOff) {
  StartMemoryHistory(16);
  StopMemoryHistory();
  RecordMemoryEvent(MemoryEventKind::kAlloc, 64, 64);
  { const MemoryEventScope scope("aten::mm", /*op=*/true); }
  const MemoryHistory history = CopyMemoryHistory();
  EXPECT_TRUE(history.events.empty());
  EXPECT_FALSE(history.enabled);
}

TEST(MemoryEvents, TheRingKeepsTheNewestEventsAndCountsTheDropped) {
  StartMemoryHistory(4);
  for (std::uint64_t i = 0; i < 10; ++i) RecordMemoryEvent(MemoryEventKind::kAlloc, 64 * i, 64);
  StopMemoryHistory();
  const MemoryHistory history = CopyMemoryHistory();
  ASSERT_EQ(history.events.size(), 4u);
  EXPECT_EQ(history.dropped, 6u);
  for (std::size_t k = 0; k < 4; ++k) EXPECT_EQ(history.events[k].address, 64 * (6 + k));  // oldest first
  for (std::size_t k = 1; k < 4; ++k) EXPECT_LE(history.events[k - 1].time_ns, history.events[k].time_ns);
}

TEST(MemoryEvents, ScopesNestIntoContextsAndOpsGetBeginAndEnd) {
  StartMemoryHistory(64);
  {
    const MemoryEventScope op("aten::mm", /*op=*/true);
    {
      const MemoryEventScope replay("aten::relu", /*op=*/true, /*replay=*/true);
      const MemoryEventScope evict("remat: evict", /*op=*/false);
      RecordMemoryEvent(MemoryEventKind::kFree, 128, 64);
    }
    RecordMemoryEvent(MemoryEventKind::kAlloc, 256, 64);
  }
  RecordMemoryEvent(MemoryEventKind::kAlloc, 512, 64);
  StopMemoryHistory();
  const MemoryHistory history = CopyMemoryHistory();
  std::vector<MemoryEventKind> kinds;
  for (const MemoryEvent& e : history.events) kinds.push_back(e.kind);
  using K = MemoryEventKind;
  EXPECT_EQ(kinds, (std::vector<K>{K::kOpBegin, K::kOpBegin, K::kFree, K::kOpEnd, K::kAlloc, K::kOpEnd, K::kAlloc}));
  EXPECT_EQ(ContextOf(history, history.events[2]),
            (std::vector<std::string>{"aten::mm", "aten::relu", "remat: evict"}));
  EXPECT_EQ(ContextOf(history, history.events[4]), (std::vector<std::string>{"aten::mm"}));
  EXPECT_TRUE(ContextOf(history, history.events[6]).empty());
  EXPECT_EQ(history.labels.at(history.events[1].label), "aten::relu");
  EXPECT_EQ(history.events[1].extra, 1u);  // a replay
  EXPECT_EQ(history.events[0].extra, 0u);
}

TEST(MemoryEvents, EachThreadHasItsOwnContextAndNumber) {
  StartMemoryHistory(64);
  const MemoryEventScope op("main op", /*op=*/false);
  std::thread other([] { RecordMemoryEvent(MemoryEventKind::kAlloc, 64, 64); });
  other.join();
  RecordMemoryEvent(MemoryEventKind::kAlloc, 128, 64);
  StopMemoryHistory();
  const MemoryHistory history = CopyMemoryHistory();
  ASSERT_EQ(history.events.size(), 2u);
  EXPECT_TRUE(ContextOf(history, history.events[0]).empty());
  EXPECT_EQ(ContextOf(history, history.events[1]), (std::vector<std::string>{"main op"}));
  EXPECT_NE(history.events[0].thread, history.events[1].thread);
}

}  // namespace
}  // namespace remat::integration
