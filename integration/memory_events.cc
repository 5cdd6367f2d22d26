#include "integration/memory_events.h"

#include <algorithm>
#include <chrono>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"

namespace remat::integration {
namespace memory_history_detail {
std::atomic<bool> g_enabled{false};
}  // namespace memory_history_detail

namespace {

using memory_history_detail::g_enabled;

// A context keeps the innermost labels only: replay chains can be a hundred frames deep.
constexpr std::size_t kMaxContextDepth = 16;

struct Log {
  std::mutex mutex;
  std::vector<MemoryEvent> ring;  // `head` is the oldest once the ring is full
  std::size_t capacity = 0;
  std::size_t head = 0;
  std::uint64_t dropped = 0;
  std::chrono::steady_clock::time_point start;
  std::vector<std::string> labels{""};
  absl::flat_hash_map<std::string, std::uint32_t> label_ids{{"", 0}};
  std::vector<std::vector<std::uint32_t>> contexts{{}};
  absl::flat_hash_map<std::vector<std::uint32_t>, std::uint32_t> context_ids{{{}, 0}};
  std::atomic<std::uint32_t> next_thread{0};
};

Log& TheLog() {
  static Log* log = new Log();  // never destroyed: threads may record while the process exits
  return *log;
}

thread_local std::vector<std::uint32_t> t_stack;
thread_local std::uint32_t t_context = 0;
thread_local std::uint32_t t_thread = UINT32_MAX;

std::uint32_t InternLabel(Log& log, std::string_view label) {
  auto it = log.label_ids.find(absl::string_view(label.data(), label.size()));
  if (it != log.label_ids.end()) return it->second;
  const auto id = static_cast<std::uint32_t>(log.labels.size());
  log.labels.emplace_back(label);
  log.label_ids.emplace(std::string(label), id);
  return id;
}

// The id of this thread's current stack (its innermost kMaxContextDepth labels). Called with log.mutex held.
std::uint32_t InternContext(Log& log) {
  const std::size_t skip = t_stack.size() > kMaxContextDepth ? t_stack.size() - kMaxContextDepth : 0;
  std::vector<std::uint32_t> key(t_stack.begin() + static_cast<std::ptrdiff_t>(skip), t_stack.end());
  auto it = log.context_ids.find(key);
  if (it != log.context_ids.end()) return it->second;
  const auto id = static_cast<std::uint32_t>(log.contexts.size());
  log.contexts.push_back(key);
  log.context_ids.emplace(std::move(key), id);
  return id;
}

// Appends with log.mutex held.
void Append(Log& log, MemoryEventKind kind, std::uint64_t address, std::uint64_t size, std::uint64_t extra,
            std::uint32_t label, std::int16_t device = kHistoryCpu) {
  if (t_thread == UINT32_MAX) t_thread = log.next_thread.fetch_add(1, std::memory_order_relaxed);
  MemoryEvent event;
  event.time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - log.start)
                      .count();
  event.address = address;
  event.size = size;
  event.extra = extra;
  event.context = t_context;
  event.label = label;
  event.thread = t_thread;
  event.device = device;
  event.kind = kind;
  if (log.ring.size() < log.capacity) {
    log.ring.push_back(event);
    return;
  }
  log.ring[log.head] = event;
  log.head = (log.head + 1) % log.capacity;
  ++log.dropped;
}

}  // namespace

void StartMemoryHistory(std::size_t max_entries) {
  Log& log = TheLog();
  std::lock_guard<std::mutex> lock(log.mutex);
  log.capacity = std::max<std::size_t>(1, max_entries);
  log.ring.clear();
  log.ring.reserve(std::min<std::size_t>(log.capacity, 1 << 16));
  log.head = 0;
  log.dropped = 0;
  log.start = std::chrono::steady_clock::now();
  g_enabled.store(true, std::memory_order_relaxed);
}

void StopMemoryHistory() { g_enabled.store(false, std::memory_order_relaxed); }

MemoryHistory CopyMemoryHistory() {
  Log& log = TheLog();
  std::lock_guard<std::mutex> lock(log.mutex);
  MemoryHistory out;
  out.events.reserve(log.ring.size());
  out.events.insert(out.events.end(), log.ring.begin() + static_cast<std::ptrdiff_t>(log.head), log.ring.end());
  out.events.insert(out.events.end(), log.ring.begin(), log.ring.begin() + static_cast<std::ptrdiff_t>(log.head));
  out.labels = log.labels;
  out.contexts = log.contexts;
  out.dropped = log.dropped;
  out.enabled = g_enabled.load(std::memory_order_relaxed);
  return out;
}

void AppendMemoryEvent(MemoryEventKind kind, std::uint64_t address, std::uint64_t size, std::uint64_t extra,
                       std::int16_t device) {
  Log& log = TheLog();
  std::lock_guard<std::mutex> lock(log.mutex);
  Append(log, kind, address, size, extra, 0, device);
}

void MemoryEventScope::Begin(std::string_view label, bool op, bool replay) {
  Log& log = TheLog();
  std::lock_guard<std::mutex> lock(log.mutex);
  active_ = true;
  op_ = op;
  replay_ = replay;
  label_ = InternLabel(log, label);
  t_stack.push_back(label_);
  t_context = InternContext(log);
  if (op_) Append(log, MemoryEventKind::kOpBegin, 0, 0, replay_ ? 1 : 0, label_);
}

void MemoryEventScope::End() {
  Log& log = TheLog();
  std::lock_guard<std::mutex> lock(log.mutex);
  // Recorded even if the history stopped meanwhile, so that every begin in the ring has its end.
  if (op_ && log.capacity > 0) Append(log, MemoryEventKind::kOpEnd, 0, 0, replay_ ? 1 : 0, label_);
  if (!t_stack.empty()) t_stack.pop_back();
  t_context = InternContext(log);
}

}  // namespace remat::integration
