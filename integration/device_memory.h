// DeviceMemory: the memory remat evicts from, as the engine bridge and its executor see it: one device's arena, how
// to make storages in it, and how to move bytes (DESIGN.md, "PyTorch integration").
//
// EngineBridge and TorchExecutor never call an allocator or copy bytes themselves; they go through this seam, so the
// same code drives the CPU arena (CpuDeviceMemory, cpu_device_memory.h) and a CUDA device's arena
// (integration/cuda/cuda_device_memory.h, whose CUDA calls go through the CudaRuntime seam and so run in CI against
// its host-memory test double).
//
// Contract for implementations:
//   - Owns(data) is true only for blocks of this memory's arena: memory remat may evict. Memory from any other
//     allocator (torch's own, numpy, from_blob, another device) is not.
//   - Borrowed(data) is true for memory torch did not allocate for this device (numpy's under torch.from_numpy,
//     from_blob's, a DLPack capsule's, a Python buffer's under torch.frombuffer): its owner may write the bytes
//     between ops without a torch op. Neither this arena's blocks nor the device allocator's (torch's own, the one
//     remat replaced) nor torch's shared memory (share_memory_(), DataLoader workers' batches) are borrowed.
//   - NewStorage allocates through the allocator torch uses for this device now, so that a request that does not
//     fit goes through the arena's pressure handler (the engine) and, failing that, throws c10::OutOfMemoryError.
//   - TryAllocate never calls the pressure handler (the engine uses it while it makes room).
//   - Copies to or from host memory are complete when they return (a device implementation synchronizes with the
//     stream it copies on); a copy within the device is complete for every kernel launched after it on the current
//     stream (stream order: the host does not wait).
//   - pager() (optional): paging that the memory does itself, asynchronously (DevicePager below). When it is set the
//     executor pages through it instead of copying to its host tier with CopyToHost/CopyFromHost.
// Not thread-safe beyond what the allocator guarantees: the bridge serializes every call.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/arena.h"
#include "integration/memory_events.h"

namespace remat::integration {

// Asynchronous paging to a second tier the memory keeps itself (CUDA: pinned host memory, copies on a copy stream
// ordered by events; integration/cuda/cuda_device_memory.h). "The current stream" is the stream kernels on this
// memory are launched on now (torch's current stream). The host never waits for a copy here.
//   PageOut(src, nbytes)  starts copying the block at `src` to a new page, after the work queued so far on the
//       current stream (its producer). The block may be freed as soon as this returns: its memory is not reused
//       before the copy has read it. ResourceExhausted when the tier is full; nothing is copied then.
//   PageIn(page, dst)  starts copying the page into `dst` (a block of this memory, at least the page's size) after
//       the work queued so far on the current stream (the block may be memory that work just freed). Returns at
//       once; on failure the page can be paged in again.
//   WaitForPageIn(page)  orders the current stream's later work after the page's copy in (cudaStreamWaitEvent):
//       called before the first kernel that reads the bytes is launched.
//   Release(page)  forgets the page; its host memory is reused once its copies have finished.
class DevicePager {
 public:
  using Page = std::uint64_t;
  virtual ~DevicePager() = default;
  virtual absl::StatusOr<Page> PageOut(const void* src, std::size_t nbytes) = 0;
  virtual absl::Status PageIn(Page page, void* dst) = 0;
  virtual absl::Status WaitForPageIn(Page page) = 0;
  virtual absl::Status Release(Page page) = 0;
};

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // The device type of the tensors whose storages live here (CPU for the CPU arena; CUDA in production for a CUDA
  // device, CPU in the tests that run the CUDA arena's logic on host memory).
  virtual c10::DeviceType device_type() const = 0;
  // The arena storages are placed in (block owners, windows, relocation), or nullptr when there is none (tests of
  // the executor over torch's own allocator).
  virtual Arena* arena() = 0;
  // A block of this memory's arena: remat may evict it.
  virtual bool Owns(const c10::DataPtr& data) const = 0;
  // Memory torch borrowed from another owner, who may write it behind torch's back (see the contract).
  virtual bool Borrowed(const c10::DataPtr& data) const = 0;
  // A new resizable storage of `nbytes` uninitialized bytes from the allocator torch uses for this device now.
  virtual c10::intrusive_ptr<c10::StorageImpl> NewStorage(std::size_t nbytes) = 0;
  // A block placed as `placement` says, without asking the pressure handler; an empty DataPtr when nothing fits or
  // there is no arena. `bytes` > 0.
  virtual c10::DataPtr TryAllocate(std::size_t bytes, Placement placement) = 0;
  // Moves the arena block `storage` holds to `to`, inside the range the block would free (Arena::Move), bytes
  // included, and points the storage there. The caller makes sure no kernel uses it. DataLoss when the block moved
  // but its bytes did not all follow (a failed device copy): the storage points at `to` then too.
  virtual absl::Status Slide(c10::StorageImpl& storage, std::uintptr_t to) = 0;
  // The hook the arena calls when a request does not fit (the engine bridge), or nullptr. Not owned.
  virtual void SetPressureHandler(PressureHandler* handler) = 0;
  // Which end of a free block this thread's next allocations take (Coop's cheap-tensor partitioning).
  virtual void SetPlacementForThisThread(Placement placement) = 0;
  // Every block's address and size are multiples of it.
  virtual std::size_t alignment() const = 0;

  // Byte copies between two places of this memory, and between it and host memory (paging).
  virtual absl::Status Copy(void* dst, const void* src, std::size_t nbytes) = 0;
  virtual absl::Status CopyToHost(void* host, const void* src, std::size_t nbytes) = 0;
  virtual absl::Status CopyFromHost(void* dst, const void* host, std::size_t nbytes) = 0;
  // Host code may read and write this memory directly (the CPU): paging copies need no staging buffer.
  virtual bool host_accessible() const = 0;
  // Asynchronous paging of its own (above), or nullptr: the executor copies to its host tier instead.
  virtual DevicePager* pager() { return nullptr; }
  // Whose memory the history (memory_events.h) files this memory's events under: kHistoryCpu (-1) for the CPU
  // arena, the device index for a CUDA device's arena. The engine session keys its engines by it (one per device).
  virtual std::int16_t history_device() const = 0;

  // Routing ops among the engines of several devices (device_router.h); the CPU has one engine and is never routed.
  // Whether `storage` is on this memory's device. CUDA: the storage's device (an evicted storage keeps it). CPU
  // tensors over a device's memory (the CUDA runtime's test double) carry no device index: there, whether its bytes
  // are in this memory's arena, which an evicted storage's are not (the router then asks the engines).
  virtual bool OnThisDevice(c10::StorageImpl& storage) const { return Owns(storage._mutable_data_ptr_no_checks()); }
  // The calling thread's current device (CUDA: cudaGetDevice), -1 where there is none (the CPU).
  virtual int CurrentDevice() const { return -1; }
  // Makes `device` the calling thread's current device (CUDA: cudaSetDevice). The router runs each engine's work and
  // each op's kernel with the engine's device current, as a CUDA kernel's device guard does; on the test double,
  // whose kernels are the CPU's, that is what puts their allocations on the op's device. Nothing to do on the CPU.
  virtual absl::Status SetCurrentDevice(int device) { return absl::OkStatus(); }
};

// A new storage holding a copy of `source`'s bytes: in `memory` when `source` is on its device type (a copy within
// the device), else from torch's allocator for `source`'s device (host memory: memcpy). Throws as NewStorage does;
// a failed copy is a c10::Error.
c10::intrusive_ptr<c10::StorageImpl> CopyStorage(DeviceMemory& memory, c10::StorageImpl& source);

// True when remat may evict this storage's memory: it holds bytes, `memory` owns them, and torch puts no guard on
// it (copy-on-write materializer, data-access checks).
bool EvictableMemory(const DeviceMemory& memory, c10::StorageImpl& storage);

}  // namespace remat::integration
