// FakeCudaRuntime: a test double of CudaRuntime over host memory, linked only into tests.
//
// Model:
//   - Devices: `device_count` devices of `device_bytes` each; DeviceMalloc returns 512-byte aligned host memory
//     and fails with ResourceExhausted when a device's allocations would exceed its size. HostAllocPinned returns
//     host memory too. Both kinds are remembered, and MemcpyAsync checks that each side lies inside a live
//     allocation of the kind the copy names (a stray copy is an error, not silent corruption).
//   - Streams are ordered queues of work (copies, event records, waits on events, test "kernels"). A stream runs
//     its work as soon as it is enqueued, unless the test holds it (HoldStream): then work queues up until
//     ReleaseStream. A wait on an event that has not completed blocks its stream's queue until it does. The legacy
//     default stream (nullptr) is a stream like any other.
//   - Events complete when their stream reaches the record. Synchronize (stream or event) models the host waiting
//     for the GPU: it runs the held queues it depends on to the point waited for, and counts as a synchronization.
//   - Launch(stream, fn) enqueues a host function as a kernel, so tests can model uses of memory in stream order;
//     with a range, the kernel is declared to touch it (an unmap checks queued work against it).
//   - Ordering (fake_cuda_order.cc): the double keeps a happens-before relation over everything enqueued, as vector
//     clocks: work on one stream is ordered; StreamWaitEvent orders a stream after the event's latest record; the
//     host learns of completed work by synchronizing or by a query that answers "done" (stream, event, device), and
//     work it enqueues after that is ordered after it. Every copy's device and pinned ranges, and the ranges that
//     tests declare for kernels (LaunchKernel: what a kernel reads and writes), are accesses; an access that
//     conflicts with an earlier one (a read after a write, a write after a read or write of overlapping bytes) and
//     is not ordered after it is a race: counted (counters().races) and described (races()). Host synchronizations
//     are attributed to the streams they wait for (host_waits_for).
//   - Virtual memory (fake_cuda_vmm.cc): reservations are PROT_NONE host address space; a physical handle is a
//     memfd of its size, counted against its device's bytes; MapPhysical maps it there without access, SetAccess
//     opens it read-write. Each call checks CUDA's rules (granularity-aligned, inside a reservation, no double
//     mapping, unmapping whole mappings, releasing only unmapped handles, freeing only empty reservations) and is
//     logged in order (vmm_log). An unmap while queued work (a copy or a declared kernel) still touches the range is
//     an error, as is running a copy on memory that is no longer mapped with access (counted as a fault).
// Thread-safe (one recursive mutex); kernels run under it and may call back into the runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "allocator/cuda/cuda_runtime.h"

namespace remat::cuda {

struct FakeCudaOptions {
  int device_count = 1;
  std::size_t device_bytes = std::size_t{1} << 30;
  bool virtual_memory = true;                        // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  std::size_t vmm_granularity = std::size_t{2} << 20;  // recommended and minimum granularity
};

// One virtual memory call, as the double saw it.
struct VmmCall {
  enum class Kind { kReserve, kFreeAddress, kCreate, kRelease, kMap, kSetAccess, kUnmap } kind;
  std::uintptr_t address = 0;  // reserve/free/map/access/unmap
  std::size_t bytes = 0;
  PhysicalHandle handle = 0;   // create/release/map
  int device = -1;             // create/access
};

struct FakeCudaCounters {
  std::uint64_t device_mallocs = 0;
  std::uint64_t device_frees = 0;
  std::uint64_t host_allocs = 0;
  std::uint64_t host_frees = 0;
  std::uint64_t copies = 0;
  std::uint64_t synchronizations = 0;  // StreamSynchronize + EventSynchronize calls
  std::uint64_t events_created = 0;
  std::uint64_t events_destroyed = 0;
  std::uint64_t stream_waits = 0;
  std::uint64_t device_synchronizations = 0;  // DeviceSynchronize calls (also counted in synchronizations)
  std::uint64_t faults = 0;                   // copies that ran on memory no longer mapped with access (skipped)
  std::uint64_t races = 0;                    // conflicting accesses not ordered after each other (see Ordering)
  std::uint64_t checked_kernels = 0;          // LaunchKernel calls
};

// A range of memory an access touches (device or pinned host; anything else is not tracked).
struct FakeRange {
  std::uintptr_t address = 0;
  std::size_t bytes = 0;
};

class FakeCudaRuntime final : public CudaRuntime {
 public:
  explicit FakeCudaRuntime(FakeCudaOptions options = {});
  ~FakeCudaRuntime() override;

  // CudaRuntime
  absl::StatusOr<int> DeviceCount() override;
  absl::StatusOr<int> GetDevice() override;
  absl::Status SetDevice(int device) override;
  absl::StatusOr<DeviceMemoryInfo> MemGetInfo() override;
  absl::StatusOr<void*> DeviceMalloc(std::size_t bytes) override;
  absl::Status DeviceFree(void* pointer) override;
  absl::StatusOr<void*> HostAllocPinned(std::size_t bytes) override;
  absl::Status HostFreePinned(void* pointer) override;
  absl::Status MemcpyAsync(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                           cudaStream_t stream) override;
  absl::StatusOr<cudaStream_t> StreamCreate() override;
  absl::Status StreamDestroy(cudaStream_t stream) override;
  absl::Status StreamSynchronize(cudaStream_t stream) override;
  absl::StatusOr<bool> StreamQuery(cudaStream_t stream) override;
  absl::Status StreamWaitEvent(cudaStream_t stream, cudaEvent_t event) override;
  absl::StatusOr<cudaEvent_t> EventCreate() override;
  absl::Status EventRecord(cudaEvent_t event, cudaStream_t stream) override;
  absl::StatusOr<bool> EventQuery(cudaEvent_t event) override;
  absl::Status EventSynchronize(cudaEvent_t event) override;
  absl::Status EventDestroy(cudaEvent_t event) override;
  absl::Status DeviceSynchronize() override;
  absl::StatusOr<VirtualMemorySupport> VirtualMemory(int device) override;
  absl::StatusOr<std::uintptr_t> AddressReserve(std::size_t bytes, std::size_t alignment) override;
  absl::Status AddressFree(std::uintptr_t address, std::size_t bytes) override;
  absl::StatusOr<PhysicalHandle> PhysicalCreate(std::size_t bytes, int device) override;
  absl::Status PhysicalRelease(PhysicalHandle handle) override;
  absl::Status MapPhysical(std::uintptr_t address, std::size_t bytes, PhysicalHandle handle) override;
  absl::Status SetAccess(std::uintptr_t address, std::size_t bytes, int device) override;
  absl::Status UnmapPhysical(std::uintptr_t address, std::size_t bytes) override;

  // Test controls.
  void HoldStream(cudaStream_t stream);     // queue work instead of running it
  void ReleaseStream(cudaStream_t stream);  // run what is queued (as far as waits allow), then run on enqueue
  void Launch(cudaStream_t stream, std::function<void()> kernel);
  void Launch(cudaStream_t stream, std::uintptr_t address, std::size_t bytes, std::function<void()> kernel);
  // A kernel declared by what it reads and writes, enqueued on `stream` (it runs nothing): checked for races
  // against earlier accesses and recorded as an access itself (Ordering, above).
  void LaunchKernel(cudaStream_t stream, const std::vector<FakeRange>& reads, const std::vector<FakeRange>& writes,
                    const std::string& name = "kernel");
  std::vector<std::string> races() const;  // one line per race, in order (capped at 100)
  // Host synchronizations (stream, event or device) that waited for work of `stream`.
  std::uint64_t host_waits_for(cudaStream_t stream) const;
  std::size_t PendingWork(cudaStream_t stream) const;
  void FailNextDeviceMalloc(std::string message = "injected cudaErrorMemoryAllocation");
  // The next MemcpyAsync fails without copying anything (a sticky CUDA error in a real run).
  void FailNextCopy(std::string message = "injected cudaErrorLaunchFailure");
  FakeCudaCounters counters() const;
  std::size_t live_device_allocations() const;
  std::size_t live_host_allocations() const;
  std::size_t live_events() const;
  std::size_t device_bytes_in_use(int device) const;
  std::vector<VmmCall> vmm_log() const;
  std::size_t live_handles() const;       // physical handles not released
  std::size_t live_mappings() const;      // mapped ranges
  std::size_t live_reservations() const;  // reserved address ranges
  // Whether every byte of [address, address + bytes) is mapped with read-write access for `device`.
  bool Accessible(std::uintptr_t address, std::size_t bytes, int device) const;

 private:
  struct Event;
  struct Work;
  struct Stream;
  using Clock = std::map<const void*, std::uint64_t>;  // vector clock: stream -> position of its work
  struct Access {
    FakeRange range;
    bool write = false;
    const void* stream = nullptr;
    std::uint64_t position = 0;
    std::string what;
  };
  struct Allocation {
    std::size_t bytes = 0;
    int device = -1;  // -1: pinned host
  };
  struct Handle {
    std::size_t bytes = 0;
    int device = 0;
    int fd = -1;
    int maps = 0;
  };
  struct Mapping {
    std::size_t bytes = 0;
    PhysicalHandle handle = 0;
    int access_device = -1;  // -1: mapped, no access yet
  };

  Stream* StreamOf(cudaStream_t stream) const;  // nullptr for an unknown handle
  Event* EventOf(cudaEvent_t event) const;
  void Enqueue(Stream* stream, Work work);
  bool RunReady(Stream* stream);  // runs queued work until empty or blocked; true if anything ran
  void Pump();                    // runs every released stream until nothing more can run
  absl::Status SyncUntil(const std::function<bool()>& done);
  bool InAllocation(const void* pointer, std::size_t bytes, bool device) const;
  // Virtual memory (fake_cuda_vmm.cc): whether [address, address + bytes) is mapped with access for some device.
  bool InMappedRange(std::uintptr_t address, std::size_t bytes) const;
  bool QueuedWorkTouches(std::uintptr_t address, std::size_t bytes) const;
  void ReleaseVirtualMemory();  // at destruction
  // Ordering (fake_cuda_order.cc).
  std::uint64_t Tick(Stream* stream);  // the next position on `stream`, ordered after what the host knows
  static void Merge(Clock& into, const Clock& from);
  void HostLearns(const Clock& clock);  // the host saw this work complete
  void CheckAndRecord(Stream* stream, std::uint64_t position, const FakeRange& range, bool write,
                      const std::string& what);
  bool Tracked(const FakeRange& range) const;
  void ForgetAccesses(const FakeRange& range);  // the memory went back (cudaFree and cudaFreeHost synchronize)

  FakeCudaOptions options_;
  mutable std::recursive_mutex mu_;
  std::map<std::uintptr_t, Allocation> allocations_;
  std::vector<std::size_t> device_used_;
  std::vector<std::unique_ptr<Stream>> streams_;  // [0] is the legacy default stream
  std::vector<std::unique_ptr<Event>> events_;
  FakeCudaCounters counters_;
  std::string fail_next_malloc_;
  std::string fail_next_copy_;
  std::map<std::uintptr_t, std::size_t> reservations_;  // base -> bytes
  std::map<PhysicalHandle, Handle> handles_;
  std::map<std::uintptr_t, Mapping> mappings_;          // address -> mapping
  PhysicalHandle next_handle_ = 1;
  std::vector<VmmCall> vmm_log_;
  Clock host_clock_;
  std::vector<Access> accesses_;
  std::vector<std::string> race_log_;
  std::map<const void*, std::uint64_t> host_waits_;
  static thread_local int current_device_;
};

}  // namespace remat::cuda
