// PinnedHostPool: see pinned_host_pool.h. The arena does placement; this file adds the event-guarded frees.
#include "allocator/cuda/pinned_host_pool.h"

#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/cuda/cuda_provider.h"

namespace remat::cuda {

struct PinnedHostPool::State final : public PressureHandler {
  struct Pending {
    std::uintptr_t address = 0;
    cudaEvent_t event = nullptr;
  };

  CudaRuntime* runtime = nullptr;
  std::size_t budget = 0;
  std::unique_ptr<Arena> arena;
  std::mutex mu;  // guards `pending`
  std::vector<Pending> pending;

  ~State() override {
    (void)Reclaim(/*synchronize=*/true);
    arena.reset();
  }

  absl::StatusOr<std::size_t> Reclaim(bool synchronize) {
    std::lock_guard<std::mutex> lock(mu);
    std::size_t reclaimed = 0;
    absl::Status first_error;
    std::vector<Pending> still;
    for (const Pending& p : pending) {
      absl::Status status;
      bool done = true;
      if (synchronize) {
        status = runtime->EventSynchronize(p.event);
      } else {
        absl::StatusOr<bool> query = runtime->EventQuery(p.event);
        status = query.status();
        done = query.ok() && *query;
      }
      if (!status.ok()) {
        if (first_error.ok()) first_error = status;
        done = false;
      }
      if (!done) {
        still.push_back(p);
        continue;
      }
      (void)runtime->EventDestroy(p.event);
      (void)arena->Free(p.address);
      ++reclaimed;
    }
    pending = std::move(still);
    if (reclaimed == 0 && !first_error.ok()) return first_error;
    return reclaimed;
  }

  absl::StatusOr<bool> MakeRoom(Arena&, std::size_t) override {
    absl::StatusOr<std::size_t> done = Reclaim(false);
    if (done.ok() && *done > 0) return true;
    done = Reclaim(true);
    if (!done.ok()) return done.status();  // a failed synchronization is no lack of memory: the allocation says so
    return *done > 0;
  }
};

PinnedHostPool::PinnedHostPool(std::unique_ptr<State> state) : state_(std::move(state)) {}
PinnedHostPool::~PinnedHostPool() = default;

absl::StatusOr<std::unique_ptr<PinnedHostPool>> PinnedHostPool::Create(CudaRuntime* runtime, std::size_t budget) {
  if (runtime == nullptr) return absl::InvalidArgumentError("remat: PinnedHostPool needs a CUDA runtime");
  if (budget == 0) return absl::InvalidArgumentError("remat: the pinned host budget must be > 0 bytes");
  auto state = std::make_unique<State>();
  state->runtime = runtime;
  state->budget = budget;
  ArenaOptions options;
  options.capacity = 0;
  options.alignment = 512;
  options.grow = true;
  options.growth_limit = budget;
  absl::StatusOr<std::unique_ptr<Arena>> arena = Arena::Create(MakePinnedHostProvider(runtime), options);
  if (!arena.ok()) return arena.status();
  state->arena = std::move(*arena);
  state->arena->SetPressureHandler(state.get());
  return std::unique_ptr<PinnedHostPool>(new PinnedHostPool(std::move(state)));
}

absl::StatusOr<std::uintptr_t> PinnedHostPool::Allocate(std::size_t bytes) {
  (void)state_->Reclaim(/*synchronize=*/false);
  absl::StatusOr<std::uintptr_t> address = state_->arena->Allocate(bytes, kNoOwner);
  if (!address.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("remat: pinned host budget exhausted: tried to page out ",
                                                     bytes, " bytes; host budget ", state_->budget,
                                                     " bytes (REMAT_HOST_BUDGET). (", address.status().message(),
                                                     ")"));
  }
  return address;
}

absl::Status PinnedHostPool::Free(std::uintptr_t address) { return state_->arena->Free(address); }

absl::Status PinnedHostPool::FreeAfter(std::uintptr_t address, cudaEvent_t event) {
  absl::StatusOr<BlockInfo> block = state_->arena->Block(address);
  if (!block.ok() || block->free) {
    (void)state_->runtime->EventDestroy(event);
    return absl::InvalidArgumentError(absl::StrCat("remat: ", absl::Hex(address), " is not a pinned host block"));
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->pending.push_back({address, event});
  return absl::OkStatus();
}

absl::StatusOr<std::size_t> PinnedHostPool::Reclaim(bool synchronize) { return state_->Reclaim(synchronize); }

PinnedHostPoolStats PinnedHostPool::Stats() const {
  const ArenaStats a = state_->arena->Stats();
  PinnedHostPoolStats out;
  out.budget = state_->budget;
  out.reserved_bytes = a.reserved_bytes;
  out.allocated_bytes = a.allocated_bytes;
  out.peak_allocated_bytes = a.peak_allocated_bytes;
  std::lock_guard<std::mutex> lock(state_->mu);
  out.pending_blocks = state_->pending.size();
  return out;
}

}  // namespace remat::cuda
