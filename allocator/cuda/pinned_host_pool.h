// PinnedHostPool: page-locked host memory for paging device storages out (DESIGN.md: "pinned host memory for
// CUDA" is the second tier).
//
// An Arena over the pinned-host provider (cudaHostAlloc segments of at least 2 MiB), growing on demand up to
// `budget` bytes (REMAT_HOST_BUDGET), never beyond. Blocks are 512-byte aligned. A block that an in-flight copy
// still reads or writes is freed with FreeAfter(event): it returns to the pool once the event completes (polled at
// each allocation; under pressure the pool waits for the events). The pool owns and destroys those events.
// Allocation failures are ResourceExhausted naming the request and the budget. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/arena.h"
#include "allocator/cuda/cuda_runtime.h"

namespace remat::cuda {

struct PinnedHostPoolStats {
  std::size_t budget = 0;
  std::size_t reserved_bytes = 0;   // pinned memory obtained from CUDA
  std::size_t allocated_bytes = 0;  // in blocks, including those waiting for their event
  std::size_t peak_allocated_bytes = 0;
  std::size_t pending_blocks = 0;   // freed, waiting for an event
};

class PinnedHostPool {
 public:
  // `runtime` is not owned and must outlive the pool.
  static absl::StatusOr<std::unique_ptr<PinnedHostPool>> Create(CudaRuntime* runtime, std::size_t budget);
  ~PinnedHostPool();
  PinnedHostPool(const PinnedHostPool&) = delete;
  PinnedHostPool& operator=(const PinnedHostPool&) = delete;

  absl::StatusOr<std::uintptr_t> Allocate(std::size_t bytes);
  absl::Status Free(std::uintptr_t address);
  // Frees `address` once `event` completes; takes ownership of `event`.
  absl::Status FreeAfter(std::uintptr_t address, cudaEvent_t event);
  // Frees blocks whose events completed (with `synchronize`, waits for all). Returns how many.
  absl::StatusOr<std::size_t> Reclaim(bool synchronize);
  PinnedHostPoolStats Stats() const;

 private:
  struct State;
  explicit PinnedHostPool(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace remat::cuda
