// CUDA providers: see cuda_provider.h. One class for both tiers; they differ in the runtime calls only.
#include "allocator/cuda/cuda_provider.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace remat::cuda {
namespace {

constexpr std::size_t kRuntimeAlignment = 256;  // what cudaMalloc and cudaHostAlloc guarantee

class CudaProvider final : public MemoryProvider {
 public:
  CudaProvider(CudaRuntime* runtime, int device) : runtime_(runtime), device_(device) {}

  ~CudaProvider() override {
    // Segments never released by their arena: give them back rather than leak device memory.
    for (const auto& [base, raw] : live_) (void)FreeRaw(raw.pointer);
  }

  absl::StatusOr<Segment> Reserve(std::size_t bytes, std::size_t alignment) override {
    if (bytes == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(Name()), " provider: cannot reserve ", bytes, " bytes aligned to ", alignment));
    }
    const std::size_t extra = alignment > kRuntimeAlignment ? alignment - kRuntimeAlignment : 0;
    absl::StatusOr<void*> raw = AllocateRaw(bytes + extra);
    if (!raw.ok()) {
      return absl::Status(raw.status().code(), absl::StrCat(std::string(Name()), " provider: cannot reserve ", bytes,
                                                            " bytes: ", raw.status().message()));
    }
    const auto start = reinterpret_cast<std::uintptr_t>(*raw);
    const std::uintptr_t base = (start + alignment - 1) & ~(alignment - 1);
    absl::MutexLock lock(&mu_);
    live_[base] = Raw{*raw, bytes};
    return Segment{base, bytes};
  }

  void Release(const Segment& segment) override {
    Raw raw;
    {
      absl::MutexLock lock(&mu_);
      auto it = live_.find(segment.base);
      if (it == live_.end() || it->second.size != segment.size) {
        std::fprintf(stderr, "remat %s provider: Release of a segment it did not reserve (base %#zx, %zu bytes)\n",
                     std::string(Name()).c_str(), static_cast<std::size_t>(segment.base), segment.size);
        std::abort();
      }
      raw = it->second;
      live_.erase(it);
    }
    const absl::Status status = FreeRaw(raw.pointer);
    if (!status.ok()) {
      // Freeing can only fail after an earlier asynchronous error (a sticky CUDA error); report, do not abort.
      std::fprintf(stderr, "remat %s provider: %s\n", std::string(Name()).c_str(),
                   std::string(status.message()).c_str());
    }
  }

  bool BacksMemory() const override { return true; }
  std::string_view Name() const override { return device_ >= 0 ? "cuda" : "pinned host"; }

 private:
  struct Raw {
    void* pointer = nullptr;
    std::size_t size = 0;
  };

  // Runs `call` with the current device switched to ours and restored afterwards.
  template <typename Call>
  auto OnDevice(Call call) -> decltype(call()) {
    absl::StatusOr<int> previous = runtime_->GetDevice();
    if (!previous.ok()) return previous.status();
    if (*previous != device_) {
      absl::Status set = runtime_->SetDevice(device_);
      if (!set.ok()) return set;
    }
    auto result = call();
    if (*previous != device_) (void)runtime_->SetDevice(*previous);
    return result;
  }

  absl::StatusOr<void*> AllocateRaw(std::size_t bytes) {
    if (device_ < 0) return runtime_->HostAllocPinned(bytes);
    return OnDevice([&]() -> absl::StatusOr<void*> { return runtime_->DeviceMalloc(bytes); });
  }

  absl::Status FreeRaw(void* pointer) {
    if (device_ < 0) return runtime_->HostFreePinned(pointer);
    return OnDevice([&]() -> absl::Status { return runtime_->DeviceFree(pointer); });
  }

  CudaRuntime* runtime_;
  int device_;  // -1: pinned host
  absl::Mutex mu_;
  absl::flat_hash_map<std::uintptr_t, Raw> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<MemoryProvider> MakeCudaDeviceProvider(CudaRuntime* runtime, int device) {
  return std::make_unique<CudaProvider>(runtime, device < 0 ? 0 : device);
}

std::unique_ptr<MemoryProvider> MakePinnedHostProvider(CudaRuntime* runtime) {
  return std::make_unique<CudaProvider>(runtime, -1);
}

}  // namespace remat::cuda
