// CudaStitchProvider: see cuda_stitch_provider.h. The pool's bookkeeping mirrors the CPU's stitching provider
// (allocator/stitch_host_provider.cc): free handles, the handle behind each mapped virtual granule, and the mapped
// granules no block uses; what differs is the driver calls and the wait before a steal.
#include "allocator/cuda/cuda_stitch_provider.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace remat::cuda {
namespace {

class Provider final : public CudaStitchProvider {
 public:
  Provider(CudaRuntime* runtime, int device, std::size_t max_handles, std::size_t granule)
      : runtime_(runtime), device_(device), max_handles_(max_handles), granule_(granule) {}

  ~Provider() override {
    std::vector<Segment> segments;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [base, size] : segments_) segments.push_back(Segment{base, size});
    }
    for (const Segment& segment : segments) Release(segment);
    absl::MutexLock lock(&mu_);
    ScopedDevice on(runtime_, device_);
    for (PhysicalHandle handle : free_) Report(runtime_->PhysicalRelease(handle));
  }

  absl::StatusOr<Segment> Reserve(std::size_t bytes, std::size_t alignment) override {
    if (bytes == 0 || bytes % granule_ != 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(Who(), "cannot reserve ", bytes, " bytes aligned to ", alignment,
                                                     " (granule ", granule_, ")"));
    }
    ScopedDevice on(runtime_, device_);
    if (!on.status().ok()) return on.status();
    absl::StatusOr<std::uintptr_t> base = runtime_->AddressReserve(bytes, std::max(alignment, granule_));
    if (!base.ok()) {
      return absl::Status(base.status().code(), absl::StrCat(Who(), "cannot reserve ", bytes,
                                                             " bytes of address space: ", base.status().message()));
    }
    absl::MutexLock lock(&mu_);
    segments_[*base] = bytes;
    return Segment{*base, bytes};
  }

  void Release(const Segment& segment) override {
    absl::MutexLock lock(&mu_);
    auto it = segments_.find(segment.base);
    if (it == segments_.end()) {
      std::fprintf(stderr, "remat %sRelease of a segment it did not reserve (base %#zx)\n", Who().c_str(),
                   static_cast<std::size_t>(segment.base));
      std::abort();
    }
    ScopedDevice on(runtime_, device_);
    const std::uintptr_t first = segment.base / granule_, end = (segment.base + segment.size) / granule_;
    bool waited = false;
    for (std::uintptr_t g = first; g < end; ++g) {
      auto mapped = handle_of_.find(g);
      if (mapped == handle_of_.end()) continue;
      if (!waited) {  // what ran on the segment must finish before its memory goes
        WaitForDevice();
        waited = true;
      }
      Report(runtime_->UnmapPhysical(g * granule_, granule_));
      free_.push_back(mapped->second);
      handle_of_.erase(mapped);
      Uncache(g);
    }
    Report(runtime_->AddressFree(segment.base, segment.size));
    segments_.erase(it);
  }

  bool BacksMemory() const override { return true; }
  std::string_view Name() const override { return "cuda stitch"; }

  absl::Status Map(std::uintptr_t address, std::size_t bytes) override {
    absl::MutexLock lock(&mu_);
    ScopedDevice on(runtime_, device_);
    if (!on.status().ok()) return on.status();
    const std::uintptr_t first = address / granule_, count = bytes / granule_;
    for (std::uintptr_t g = first; g < first + count; ++g) {
      if (handle_of_.contains(g)) {  // still mapped from an earlier use
        Uncache(g);
        ++counters_.cache_hits;
        continue;
      }
      absl::StatusOr<PhysicalHandle> handle = TakeHandle();
      absl::Status status = handle.status();
      if (status.ok()) status = runtime_->MapPhysical(g * granule_, granule_, *handle);
      if (status.ok()) {
        status = runtime_->SetAccess(g * granule_, granule_, device_);
        if (!status.ok()) Report(runtime_->UnmapPhysical(g * granule_, granule_));
      }
      if (!status.ok()) {
        if (handle.ok()) free_.push_back(*handle);
        for (std::uintptr_t done = first; done < g; ++done) Cache(done);  // as if unmapped
        return absl::Status(status.code(), absl::StrCat(Who(), "backing ", bytes, " bytes at ", absl::Hex(address),
                                                        " failed: ", status.message()));
      }
      handle_of_[g] = *handle;
      ++counters_.maps;
    }
    return absl::OkStatus();
  }

  void Unmap(std::uintptr_t address, std::size_t bytes) override {
    absl::MutexLock lock(&mu_);
    ++unmap_epoch_;
    for (std::uintptr_t g = address / granule_; g < (address + bytes) / granule_; ++g) {
      if (handle_of_.contains(g)) Cache(g);
    }
  }

  std::size_t granule() const override { return granule_; }

  StitchCounters counters() const override {
    absl::MutexLock lock(&mu_);
    return counters_;
  }

 private:
  std::string Who() const { return absl::StrCat("cuda stitch provider (device ", device_, "): "); }

  // A handle for a granule about to be mapped: a free one, a new one while the pool is below its size, else the
  // handle of a cached granule (unmapped there first). With mu_ held and the device current.
  absl::StatusOr<PhysicalHandle> TakeHandle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!free_.empty()) {
      const PhysicalHandle handle = free_.back();
      free_.pop_back();
      return handle;
    }
    absl::Status created_error;
    if (created_ < max_handles_) {
      absl::StatusOr<PhysicalHandle> created = runtime_->PhysicalCreate(granule_, device_);
      if (created.ok()) {
        ++created_;
        ++counters_.handles_created;
        return *created;
      }
      created_error = created.status();
    }
    if (cached_.empty()) {
      if (!created_error.ok()) return created_error;
      return absl::ResourceExhaustedError(absl::StrCat("all ", max_handles_, " granules of the pool are in use"));
    }
    // The least recently freed granule: the likeliest to be done with already.
    const auto [epoch, g] = *freed_order_.begin();
    if (epoch > synchronized_epoch_) WaitForDevice();
    Uncache(g);
    const PhysicalHandle handle = handle_of_[g];
    handle_of_.erase(g);
    absl::Status unmapped = runtime_->UnmapPhysical(g * granule_, granule_);
    if (!unmapped.ok()) {
      free_.push_back(handle);  // the driver's state is unknown; do not hand the range out again as mapped
      return unmapped;
    }
    ++counters_.steals;
    return handle;
  }

  void Cache(std::uintptr_t g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Uncache(g);
    cached_[g] = unmap_epoch_;
    freed_order_.insert({unmap_epoch_, g});
  }
  void Uncache(std::uintptr_t g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = cached_.find(g);
    if (it == cached_.end()) return;
    freed_order_.erase({it->second, g});
    cached_.erase(it);
  }

  // Every granule freed so far is then safe to unmap.
  void WaitForDevice() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Report(runtime_->DeviceSynchronize());
    synchronized_epoch_ = unmap_epoch_;
    ++counters_.synchronizations;
  }

  // Failures where nothing can be returned (releasing): reported, never fatal, as for cudaFree.
  void Report(const absl::Status& status) const {
    if (!status.ok()) std::fprintf(stderr, "remat %s%s\n", Who().c_str(), std::string(status.message()).c_str());
  }

  CudaRuntime* const runtime_;
  const int device_;
  const std::size_t max_handles_;
  const std::size_t granule_;
  mutable absl::Mutex mu_;
  std::size_t created_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<PhysicalHandle> free_ ABSL_GUARDED_BY(mu_);                              // mapped nowhere
  absl::flat_hash_map<std::uintptr_t, PhysicalHandle> handle_of_ ABSL_GUARDED_BY(mu_);  // virtual granule -> handle
  // Mapped granules no block uses -> the epoch of the Unmap that freed them, and the same in the order freed.
  absl::flat_hash_map<std::uintptr_t, std::uint64_t> cached_ ABSL_GUARDED_BY(mu_);
  absl::btree_set<std::pair<std::uint64_t, std::uintptr_t>> freed_order_ ABSL_GUARDED_BY(mu_);
  std::uint64_t unmap_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t synchronized_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // granules freed up to here are no longer in use
  absl::flat_hash_map<std::uintptr_t, std::size_t> segments_ ABSL_GUARDED_BY(mu_);
  StitchCounters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaStitchProvider>> MakeCudaStitchProvider(CudaRuntime* runtime, int device,
                                                                           std::size_t physical_bytes,
                                                                           std::size_t granule) {
  if (runtime == nullptr) return absl::InvalidArgumentError("remat: the cuda stitch provider needs a CUDA runtime");
  absl::StatusOr<VirtualMemorySupport> support = runtime->VirtualMemory(device);
  if (!support.ok()) return support.status();
  if (!support->supported) {
    return absl::FailedPreconditionError(
        absl::StrCat("remat: CUDA device ", device, " does not support virtual memory management (cuMemMap)"));
  }
  if (granule == 0 || (granule & (granule - 1)) != 0 || granule % support->granularity != 0) {
    return absl::InvalidArgumentError(absl::StrCat("remat: a stitching granule of ", granule,
                                                   " bytes is not a power of two multiple of CUDA device ", device,
                                                   "'s granularity (", support->granularity, " bytes)"));
  }
  if (physical_bytes < granule) {
    return absl::InvalidArgumentError(absl::StrCat("remat: a stitching budget of ", physical_bytes,
                                                   " bytes does not hold one granule (", granule, " bytes)"));
  }
  return std::unique_ptr<CudaStitchProvider>(new Provider(runtime, device, physical_bytes / granule, granule));
}

}  // namespace remat::cuda
