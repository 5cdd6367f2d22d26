// CudaPager: the paging primitive for CUDA storages (DESIGN.md, "Offloading"): copies between a DeviceArena and a
// PinnedHostPool on a dedicated copy stream, ordered with events so that an op waits only for its own inputs.
// The engine's paging policy (when to page what) is not here; this is the mechanism it calls.
//
//   PageOut(address, bytes, producer)  the copy stream waits for the work already queued on `producer` (the
//       stream that wrote the block), then copies the block to a new pinned host block. The copy stream is
//       recorded as a user of the device block, so the caller may DeviceArena::Free it right away: its memory is
//       not reused before the copy has read it.
//   PageIn(page, consumer)  allocates a device block for use on `consumer`, and copies the page back on the copy
//       stream after the work queued on `consumer` so far (the new block may be memory that work just freed).
//       Returns the address at once; the copy runs asynchronously.
//   PageInto(page, address, consumer)  the same copy into a live device block the caller allocated for `consumer`
//       (at least the page's size), e.g. one that a torch storage already owns. The copy stream is not recorded as a
//       user of that block: the caller makes `consumer` wait for the page (WaitForPage) before it uses or frees it.
//   WaitForPage(page, stream)  makes `stream` wait for that page's copy-in only (cudaStreamWaitEvent): an op
//       calls it for each paged-in input before it is launched, and is not held up by other pages still copying.
//   Release(page)  forgets the page; its host block returns to the pool once the copies that use it finish.
//
// Errors: ResourceExhausted from the host pool or the device arena; FailedPrecondition for a page in the wrong
// state (paging in twice, waiting on a page that is not in); NotFound for an unknown page. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/cuda/cuda_runtime.h"
#include "allocator/cuda/device_arena.h"
#include "allocator/cuda/pinned_host_pool.h"

namespace remat::cuda {

using PageId = std::uint64_t;

struct PagerStats {
  std::uint64_t pages_out = 0;
  std::uint64_t pages_in = 0;
  std::uint64_t bytes_out = 0;
  std::uint64_t bytes_in = 0;
  std::size_t pages_held = 0;  // pages not yet released
};

class CudaPager {
 public:
  // Creates the copy stream on `device`'s device. None of the pointers is owned; all must outlive the pager.
  static absl::StatusOr<std::unique_ptr<CudaPager>> Create(CudaRuntime* runtime, DeviceArena* device,
                                                           PinnedHostPool* host);
  ~CudaPager();  // waits for the copy stream, then destroys it
  CudaPager(const CudaPager&) = delete;
  CudaPager& operator=(const CudaPager&) = delete;

  absl::StatusOr<PageId> PageOut(std::uintptr_t address, std::size_t bytes, cudaStream_t producer);
  absl::StatusOr<std::uintptr_t> PageIn(PageId page, cudaStream_t consumer, Placement placement = Placement::kLow);
  absl::Status PageInto(PageId page, std::uintptr_t address, cudaStream_t consumer);
  absl::Status WaitForPage(PageId page, cudaStream_t stream);
  // True once the page's last copy (out, or in after PageIn) has finished.
  absl::StatusOr<bool> CopyDone(PageId page);
  absl::Status Release(PageId page);

  cudaStream_t copy_stream() const;
  PagerStats Stats() const;

 private:
  struct State;
  explicit CudaPager(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace remat::cuda
