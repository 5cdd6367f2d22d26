// DeviceRouter: see device_router.h for the contract.
#include "integration/device_router.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

#include "integration/engine_bridge_internal.h"
#include "integration/storage_eviction.h"

namespace remat::integration {
namespace {

using bridge_internal::ForEachTensor;

// The op between BeforeOp and AfterOp/OpFailed on this thread (one at a time: the hook records outermost ops only).
struct RoutedOp {
  DeviceRoute route;
  bool to_next = false;        // no engine records it: only `next` sees it
  int previous_device = -1;    // the thread's current device before the op, restored after it
  int current_device = -1;     // the device made current last
  std::size_t begun_sources = 0;  // route.sources[0, begun_sources) have begun their reads
  bool destination_begun = false;
};
thread_local RoutedOp t_op;

}  // namespace

DeviceRouter::DeviceRouter(std::vector<DeviceEngine> engines, OpObserver* next)
    : engines_(std::move(engines)), next_(next) {
  TORCH_CHECK(!engines_.empty(), "remat: a device router needs an engine");
  for (std::size_t i = 1; i < engines_.size(); ++i) {
    TORCH_CHECK(engines_[i - 1].device < engines_[i].device, "remat: a device router's engines go in ascending device order");
  }
}

int DeviceRouter::EngineOfDevice(int device) const {
  for (std::size_t i = 0; i < engines_.size(); ++i) {
    if (engines_[i].device == device) return static_cast<int>(i);
  }
  return -1;
}

int DeviceRouter::CurrentEngine() const { return EngineOfDevice(engines_.front().memory->CurrentDevice()); }

int DeviceRouter::EngineOf(c10::StorageImpl& storage) const {
  for (std::size_t i = 0; i < engines_.size(); ++i) {
    if (engines_[i].memory->OnThisDevice(storage)) return static_cast<int>(i);
  }
  if (IsEvicted(storage)) {  // no bytes to place: the engine that evicted or paged it
    for (std::size_t i = 0; i < engines_.size(); ++i) {
      if (engines_[i].bridge->HoldsOutOfMemory(&storage)) return static_cast<int>(i);
    }
  }
  return -1;
}

DeviceRoute DeviceRouter::Decide(const OpRecord& record) const {
  DeviceRoute route;
  const std::size_t n = record.input_storages.size();
  absl::InlinedVector<int, 4> engine(n, -1);
  int lowest = -1;
  bool several = false;
  for (std::size_t k = 0; k < n; ++k) {
    const int e = EngineOf(*record.input_storages[k]);
    engine[k] = e;
    if (e < 0) continue;
    if (lowest >= 0 && e != lowest) several = true;
    if (lowest < 0 || e < lowest) lowest = e;
  }
  // The storages it writes (in place, out=, on the side).
  absl::InlinedVector<bool, 4> written(n, false);
  auto note_written = [&](int argument) {
    if (argument < 0 || static_cast<std::size_t>(argument) >= record.arguments.size()) return;
    ForEachTensor(record.arguments[static_cast<std::size_t>(argument)], [&](const at::Tensor& t) {
      if (!t.defined() || !t.has_storage()) return;
      const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
      for (std::size_t k = 0; k < n; ++k) {
        if (record.input_storages[k].get() == impl) written[k] = true;
      }
    });
  };
  for (const int a : record.traits->written_arguments) note_written(a);
  for (const int a : record.unannotated_writes) note_written(a);
  int destination = -1;
  for (std::size_t k = 0; k < n; ++k) {
    if (written[k] && engine[k] >= 0 && (destination < 0 || engine[k] < destination)) destination = engine[k];
  }
  if (destination < 0) {  // a Device argument naming an engine's device
    const c10::DeviceType type = engines_.front().memory->device_type();
    for (const c10::IValue& value : record.arguments) {
      if (!value.isDevice() || value.toDevice().type() != type) continue;
      destination = value.toDevice().has_index() ? EngineOfDevice(value.toDevice().index()) : CurrentEngine();
      break;
    }
  }
  if (destination < 0 && lowest >= 0) {
    destination = lowest;
    if (several) {
      const int current = CurrentEngine();
      if (current >= 0 && std::find(engine.begin(), engine.end(), current) != engine.end()) destination = current;
    }
  }
  if (destination < 0) destination = CurrentEngine();
  route.destination = destination;
  if (destination < 0) return route;
  for (std::size_t k = 0; k < n; ++k) {
    const int e = engine[k];
    if (e < 0 || e == destination) continue;
    if (written[k]) {
      route.foreign_writes.emplace_back(e, static_cast<int>(k));
      continue;
    }
    auto at = std::find_if(route.sources.begin(), route.sources.end(), [e](const auto& s) { return s.first >= e; });
    if (at == route.sources.end() || at->first != e) at = route.sources.emplace(at, e, std::vector<int>());
    at->second.push_back(static_cast<int>(k));
  }
  return route;  // a storage another engine holds that the op writes is a foreign write only: fixing it reads it back
}

namespace {

// Makes `engine`'s device current for the calling thread (unless it already is).
void UseDevice(RoutedOp& op, const DeviceEngine& engine) {
  if (op.current_device == engine.device) return;
  const absl::Status status = engine.memory->SetCurrentDevice(engine.device);
  TORCH_CHECK(status.ok(), "remat: cannot make device ", engine.device, " current: ", status.message());
  op.current_device = engine.device;
}

// Gives the thread its current device back (nothing to do when it never changed).
void RestoreDevice(RoutedOp& op, const DeviceEngine& engine) noexcept {
  if (op.previous_device < 0 || op.current_device == op.previous_device) return;
  (void)engine.memory->SetCurrentDevice(op.previous_device);
  op.current_device = op.previous_device;
}

}  // namespace

void DeviceRouter::BeforeOp(OpRecord& record) {
  RoutedOp& op = t_op;
  op.route = Decide(record);
  op.to_next = op.route.destination < 0;
  op.begun_sources = 0;
  op.destination_begun = false;
  if (op.to_next) {
    if (next_ != nullptr) next_->BeforeOp(record);
    return;
  }
  const DeviceRoute& route = op.route;
  const DeviceEngine& destination = engines_[static_cast<std::size_t>(route.destination)];
  op.previous_device = destination.memory->CurrentDevice();
  op.current_device = op.previous_device;
  if (route.cross_device()) record.replayable = false;  // the destination keeps its outputs (header)
  try {
    for (const auto& [e, k] : route.foreign_writes) {
      const DeviceEngine& other = engines_[static_cast<std::size_t>(e)];
      UseDevice(op, other);
      const absl::Status status = other.bridge->StorageWillChange(record.input_storages[static_cast<std::size_t>(k)].get());
      TORCH_CHECK(status.ok(), "remat: ", record.traits->name, " writes a storage of device ", other.device,
                  " while device ", destination.device, "'s engine records it, and that storage could not be fixed: ",
                  status.message());
    }
    // Ascending device order: the sources below the destination, the destination, the sources above it.
    for (const auto& [e, reads] : route.sources) {
      if (!op.destination_begun && e > route.destination) {
        UseDevice(op, destination);
        destination.bridge->BeforeOp(record);
        op.destination_begun = true;
      }
      const DeviceEngine& source = engines_[static_cast<std::size_t>(e)];
      UseDevice(op, source);
      source.bridge->BeginRead(record, reads);
      ++op.begun_sources;
    }
    UseDevice(op, destination);  // the kernel runs on the destination's device
    if (!op.destination_begun) {
      destination.bridge->BeforeOp(record);
      op.destination_begun = true;
    }
  } catch (...) {
    for (std::size_t i = op.begun_sources; i-- > 0;) {
      engines_[static_cast<std::size_t>(route.sources[i].first)].bridge->EndRead(record, /*failed=*/true);
    }
    if (op.destination_begun) destination.bridge->OpFailed(record);
    RestoreDevice(op, destination);
    throw;
  }
}

void DeviceRouter::AfterOp(OpRecord&& record) {
  RoutedOp& op = t_op;
  if (op.to_next) {
    if (next_ != nullptr) next_->AfterOp(std::move(record));
    return;
  }
  const DeviceEngine& destination = engines_[static_cast<std::size_t>(op.route.destination)];
  struct Restore {
    RoutedOp& op;
    const DeviceEngine& engine;
    ~Restore() { RestoreDevice(op, engine); }
  } restore{op, destination};
  // The sources first, while the record is whole (the destination may keep it).
  for (std::size_t i = op.begun_sources; i-- > 0;) {
    engines_[static_cast<std::size_t>(op.route.sources[i].first)].bridge->EndRead(record, /*failed=*/false);
  }
  op.begun_sources = 0;
  destination.bridge->AfterOp(std::move(record));
}

void DeviceRouter::OpFailed(OpRecord& record) noexcept {
  RoutedOp& op = t_op;
  if (op.to_next) {
    if (next_ != nullptr) next_->OpFailed(record);
    return;
  }
  const DeviceEngine& destination = engines_[static_cast<std::size_t>(op.route.destination)];
  for (std::size_t i = op.begun_sources; i-- > 0;) {
    engines_[static_cast<std::size_t>(op.route.sources[i].first)].bridge->EndRead(record, /*failed=*/true);
  }
  op.begun_sources = 0;
  destination.bridge->OpFailed(record);
  RestoreDevice(op, destination);
}

bool DeviceRouter::RetryAfterOutOfMemory(OpRecord& record) {
  const RoutedOp& op = t_op;
  if (op.to_next) return next_ != nullptr && next_->RetryAfterOutOfMemory(record);
  // Only the destination allocates (a copy's output, a kernel's workspace on its device).
  return engines_[static_cast<std::size_t>(op.route.destination)].bridge->RetryAfterOutOfMemory(record);
}

bool DeviceRouter::RetryCompositeAfterOutOfMemory() {
  for (const DeviceEngine& engine : engines_) {
    if (engine.bridge->RetryCompositeAfterOutOfMemory()) return true;
  }
  return next_ != nullptr && next_->RetryCompositeAfterOutOfMemory();
}

void DeviceRouter::BeginComposite(std::span<c10::StorageImpl* const> read_raw,
                                  std::span<c10::StorageImpl* const> passed_on, CompositeHold& hold) {
  try {
    for (std::size_t e = 0; e < engines_.size(); ++e) {
      auto engines_own = [&](std::span<c10::StorageImpl* const> storages) {
        absl::InlinedVector<c10::StorageImpl*, 4> mine;
        for (c10::StorageImpl* impl : storages) {
          if (EngineOf(*impl) == static_cast<int>(e)) mine.push_back(impl);
        }
        return mine;
      };
      const absl::InlinedVector<c10::StorageImpl*, 4> mine_raw = engines_own(read_raw);
      const absl::InlinedVector<c10::StorageImpl*, 4> mine_passed_on = engines_own(passed_on);
      if (mine_raw.empty() && mine_passed_on.empty()) continue;
      // What the engine brings back is allocated on the current device: make it the engine's while it does.
      const DeviceEngine& engine = engines_[e];
      RoutedOp scope;
      scope.previous_device = engine.memory->CurrentDevice();
      scope.current_device = scope.previous_device;
      try {
        UseDevice(scope, engine);
        engine.bridge->BeginComposite(mine_raw, mine_passed_on, hold);
      } catch (...) {
        RestoreDevice(scope, engine);
        throw;
      }
      RestoreDevice(scope, engine);
    }
  } catch (...) {
    EndComposite(hold);
    hold.held.clear();
    throw;
  }
}

void DeviceRouter::EndComposite(CompositeHold& hold) noexcept {
  for (const DeviceEngine& engine : engines_) engine.bridge->EndComposite(hold);
}

std::int64_t DeviceRouter::HeldReferences(const c10::StorageImpl* storage) {
  std::int64_t held = 0;
  for (const DeviceEngine& engine : engines_) held += engine.bridge->HeldReferences(storage);
  return held;
}

}  // namespace remat::integration
