// EngineBridge, plan mode (policy "plan"): the plan driver's setup and its per-op and per-iteration calls
// (integration/plan_driver.h), and what a forked child turns off. The bridge's other parts do not know about plans.
#include "allocator/arena.h"
#include "integration/cpu_allocator.h"
#include "integration/engine_bridge.h"

namespace remat::integration {

std::unique_ptr<PlanDriver> EngineBridge::MakePlanDriver() const {
  ReplayOptions base;
  base.policy = "dtr-eq";  // the online fallback: what the engine's "plan" policy chooses as
  base.budget_bytes = static_cast<std::int64_t>(options_.budget);
  base.overhead_limit = 0;  // the product has no thrash limit
  if (Arena* arena = memory_->arena(); arena != nullptr) {
    // Planned with the arena's placement (a stitching arena's granules, a contiguous one's holes): a plan made by
    // counting bytes alone can be one the run cannot follow (resnet50 at 0.5: msps's, cheapest when counted, ran
    // out 89 replays deep in its first followed iteration on either arena; planned with placement, another
    // candidate is chosen and followed). The layout at the iteration's start is not in the recording: the
    // replay starts from an empty arena.
    base.mode = AccountingMode::kArena;
    base.arena_alignment = static_cast<std::int64_t>(kCpuAlignment);
    base.stitch_granule = static_cast<std::int64_t>(arena->Stats().granule);
  }
  const PagingOptions& paging = options_.paging;
  base.offload = paging.mode;
  base.bandwidth_bytes_per_s = paging.bandwidth_bytes_per_s;
  base.link_latency_ns = paging.latency_ns;
  base.host_budget_bytes = paging.host_budget == std::numeric_limits<std::int64_t>::max() ? 0 : paging.host_budget;
  base.page_constants = paging.page_constants;
  base.duplex_link = paging.duplex;
  DeviceMemory* memory = memory_;
  return std::make_unique<PlanDriver>(base, options_.estimated_costs,
                                      [memory](c10::StorageImpl& storage) { return EvictableMemory(*memory, storage); });
}

void EngineBridge::NotePlannedOp(std::string_view name, std::span<const OutputSpec> specs,
                                 std::span<const TensorId> outs) {
  plan_made_.clear();
  std::int64_t bytes = 0;
  for (std::size_t j = 0; j < specs.size(); ++j) {
    if (specs[j].alias >= 0) continue;
    plan_made_.push_back(engine_->StorageOf(outs[j]));
    c10::StorageImpl& impl = *current_.plan.spec_impl[j];
    if (EvictableMemory(*memory_, impl)) bytes += static_cast<std::int64_t>(impl.nbytes());
  }
  plan_->AfterEngineOp(*engine_, name, plan_made_, bytes);
}

std::vector<c10::intrusive_ptr<c10::StorageImpl>> EngineBridge::HeldStoragesLocked() {
  std::vector<c10::intrusive_ptr<c10::StorageImpl>> held;
  entries_.ForEachLive([&](const StorageEntries::Entry& entry) {
    c10::intrusive_ptr<c10::StorageImpl> impl = entry.weak.lock();
    if (!impl || !engine_->Resident(engine_->StorageOf(entry.root)) || !EvictableMemory(*memory_, *impl)) return;
    held.push_back(std::move(impl));
  });
  return held;
}

std::vector<c10::intrusive_ptr<c10::StorageImpl>> EngineBridge::HeldStorages() {
  std::lock_guard<EngineLock> lock(lock_);
  return HeldStoragesLocked();
}

void EngineBridge::MarkStep() {
  std::lock_guard<EngineLock> lock(lock_);
  const EngineLock::LendPause pause(lock_);  // called from inside an op's kernel: no borrower meanwhile
  if (plan_ == nullptr || retired_.load(std::memory_order_acquire)) return;
  // Kept alive while they are declared.
  const std::vector<c10::intrusive_ptr<c10::StorageImpl>> held = HeldStoragesLocked();
  std::vector<c10::StorageImpl*> live;
  live.reserve(held.size());
  for (const auto& impl : held) live.push_back(impl.get());
  plan_->EndIteration(*engine_, live);
}

}  // namespace remat::integration

namespace remat::integration {

void EngineBridge::AfterForkInChild() {
  engine_->ForgetArena();
  if (plan_ != nullptr) plan_->AfterForkInChild(*engine_);
}

std::string EngineBridge::PlannedTrace() {
  std::lock_guard<EngineLock> lock(lock_);
  return plan_ != nullptr ? plan_->PlannedTrace() : std::string();
}

}  // namespace remat::integration
