// FakeCudaRuntime's virtual memory model (fake_cuda_runtime.h): reserved ranges are PROT_NONE host address space,
// a physical handle is a memfd, a mapping maps it MAP_SHARED there (no access until SetAccess opens it read-write),
// so bytes written through one mapping of a handle are what a later mapping of it reads, as on a device. Every call
// checks the rules the driver enforces and those remat's contract adds (cuda_runtime.h), and is logged.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "tests/cuda/fake_cuda_runtime.h"

namespace remat::cuda {
namespace {

absl::Status Invalid(const std::string& what) { return absl::InvalidArgumentError(absl::StrCat("fake cuda: ", what)); }

}  // namespace

absl::StatusOr<VirtualMemorySupport> FakeCudaRuntime::VirtualMemory(int device) {
  if (device < 0 || device >= options_.device_count) return Invalid(absl::StrCat("invalid device ", device));
  if (!options_.virtual_memory) return VirtualMemorySupport{};
  return VirtualMemorySupport{true, options_.vmm_granularity};
}

absl::StatusOr<std::uintptr_t> FakeCudaRuntime::AddressReserve(std::size_t bytes, std::size_t alignment) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  const std::size_t g = options_.vmm_granularity;
  if (!options_.virtual_memory) return absl::FailedPreconditionError("fake cuda: no virtual memory management");
  if (bytes == 0 || bytes % g != 0 || alignment % g != 0 || (alignment & (alignment - 1)) != 0) {
    return Invalid(absl::StrCat("cuMemAddressReserve(", bytes, ", alignment ", alignment,
                                "): not multiples of the granularity ", g));
  }
  void* raw = mmap(nullptr, bytes + alignment, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return absl::ResourceExhaustedError("fake cuda: cuMemAddressReserve: no address space");
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t base = (start + alignment - 1) & ~(alignment - 1);
  if (base > start) munmap(raw, base - start);
  if (const std::size_t tail = start + alignment - base; tail > 0) munmap(reinterpret_cast<void*>(base + bytes), tail);
  reservations_[base] = bytes;
  vmm_log_.push_back({VmmCall::Kind::kReserve, base, bytes, 0, -1});
  return base;
}

absl::Status FakeCudaRuntime::AddressFree(std::uintptr_t address, std::size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  auto it = reservations_.find(address);
  if (it == reservations_.end() || it->second != bytes) return Invalid("cuMemAddressFree of a range not reserved");
  auto mapped = mappings_.lower_bound(address);
  if (mapped != mappings_.end() && mapped->first < address + bytes) {
    return Invalid("cuMemAddressFree of a reservation with memory still mapped in it");
  }
  munmap(reinterpret_cast<void*>(address), bytes);
  reservations_.erase(it);
  vmm_log_.push_back({VmmCall::Kind::kFreeAddress, address, bytes, 0, -1});
  return absl::OkStatus();
}

absl::StatusOr<PhysicalHandle> FakeCudaRuntime::PhysicalCreate(std::size_t bytes, int device) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (device < 0 || device >= options_.device_count) return Invalid(absl::StrCat("cuMemCreate on device ", device));
  if (bytes == 0 || bytes % options_.vmm_granularity != 0) {
    return Invalid(absl::StrCat("cuMemCreate(", bytes, "): not a multiple of the granularity"));
  }
  std::size_t& used = device_used_[static_cast<std::size_t>(device)];
  if (bytes > options_.device_bytes - used) {
    return absl::ResourceExhaustedError(
        absl::StrCat("fake cuda: cuMemCreate(", bytes, "): CUDA_ERROR_OUT_OF_MEMORY on device ", device));
  }
  const int fd = memfd_create("fake-cuda-physical", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    if (fd >= 0) close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("fake cuda: cuMemCreate: ", std::strerror(errno)));
  }
  // Device memory is not zeroed: make reads of stale data visible.
  if (void* p = mmap(nullptr, bytes, PROT_WRITE, MAP_SHARED, fd, 0); p != MAP_FAILED) {
    std::memset(p, 0xCD, bytes);
    munmap(p, bytes);
  }
  used += bytes;
  const PhysicalHandle handle = next_handle_++;
  handles_[handle] = Handle{bytes, device, fd, 0};
  vmm_log_.push_back({VmmCall::Kind::kCreate, 0, bytes, handle, device});
  return handle;
}

absl::Status FakeCudaRuntime::PhysicalRelease(PhysicalHandle handle) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  auto it = handles_.find(handle);
  if (it == handles_.end()) return Invalid("cuMemRelease of an unknown handle");
  if (it->second.maps > 0) return Invalid("cuMemRelease of a handle that is still mapped");
  device_used_[static_cast<std::size_t>(it->second.device)] -= it->second.bytes;
  close(it->second.fd);
  handles_.erase(it);
  vmm_log_.push_back({VmmCall::Kind::kRelease, 0, 0, handle, -1});
  return absl::OkStatus();
}

absl::Status FakeCudaRuntime::MapPhysical(std::uintptr_t address, std::size_t bytes, PhysicalHandle handle) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  auto h = handles_.find(handle);
  if (h == handles_.end()) return Invalid("cuMemMap of an unknown handle");
  if (h->second.bytes != bytes) return Invalid("cuMemMap of a size other than the handle's");
  if (address % options_.vmm_granularity != 0) return Invalid("cuMemMap at an address off the granularity");
  auto r = reservations_.upper_bound(address);
  if (r == reservations_.begin() || (--r, address + bytes > r->first + r->second)) {
    return Invalid("cuMemMap outside a reserved range");
  }
  auto next = mappings_.lower_bound(address);
  if (next != mappings_.end() && next->first < address + bytes) return Invalid("cuMemMap over a mapped range");
  if (next != mappings_.begin() && std::prev(next)->first + std::prev(next)->second.bytes > address) {
    return Invalid("cuMemMap over a mapped range");
  }
  if (mmap(reinterpret_cast<void*>(address), bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, h->second.fd, 0) == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("fake cuda: cuMemMap: ", std::strerror(errno)));
  }
  ++h->second.maps;
  mappings_[address] = Mapping{bytes, handle, -1};
  vmm_log_.push_back({VmmCall::Kind::kMap, address, bytes, handle, -1});
  return absl::OkStatus();
}

absl::Status FakeCudaRuntime::SetAccess(std::uintptr_t address, std::size_t bytes, int device) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  // The range must be mapped throughout (it may span several mappings).
  std::vector<Mapping*> covered;
  for (std::uintptr_t at = address; at < address + bytes;) {
    auto it = mappings_.find(at);
    if (it == mappings_.end()) return Invalid("cuMemSetAccess on a range that is not mapped throughout");
    covered.push_back(&it->second);
    at += it->second.bytes;
  }
  if (mprotect(reinterpret_cast<void*>(address), bytes, PROT_READ | PROT_WRITE) != 0) {
    return absl::InternalError(absl::StrCat("fake cuda: cuMemSetAccess: ", std::strerror(errno)));
  }
  for (Mapping* m : covered) m->access_device = device;
  vmm_log_.push_back({VmmCall::Kind::kSetAccess, address, bytes, 0, device});
  return absl::OkStatus();
}

absl::Status FakeCudaRuntime::UnmapPhysical(std::uintptr_t address, std::size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  std::vector<std::map<std::uintptr_t, Mapping>::iterator> covered;
  for (std::uintptr_t at = address; at < address + bytes;) {
    auto it = mappings_.find(at);
    if (it == mappings_.end()) return Invalid("cuMemUnmap of a range that is not whole mappings");
    covered.push_back(it);
    at += it->second.bytes;
  }
  if (QueuedWorkTouches(address, bytes)) {
    return Invalid("cuMemUnmap of a range that queued work still uses (the host did not wait for the device)");
  }
  mmap(reinterpret_cast<void*>(address), bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
       -1, 0);
  for (auto it : covered) {
    --handles_[it->second.handle].maps;
    mappings_.erase(it);
  }
  vmm_log_.push_back({VmmCall::Kind::kUnmap, address, bytes, 0, -1});
  return absl::OkStatus();
}

bool FakeCudaRuntime::InMappedRange(std::uintptr_t address, std::size_t bytes) const {
  auto it = mappings_.upper_bound(address);
  if (it == mappings_.begin()) return false;
  --it;
  for (std::uintptr_t at = address; at < address + bytes;) {
    if (it == mappings_.end() || it->first > at || it->first + it->second.bytes <= at ||
        it->second.access_device < 0) {
      return false;
    }
    at = it->first + it->second.bytes;
    ++it;
  }
  return true;
}

bool FakeCudaRuntime::Accessible(std::uintptr_t address, std::size_t bytes, int device) const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (!InMappedRange(address, bytes)) return false;
  for (auto it = std::prev(mappings_.upper_bound(address)); it != mappings_.end() && it->first < address + bytes;
       ++it) {
    if (it->second.access_device != device) return false;
  }
  return true;
}

void FakeCudaRuntime::ReleaseVirtualMemory() {
  for (const auto& [base, bytes] : reservations_) munmap(reinterpret_cast<void*>(base), bytes);
  for (const auto& [handle, h] : handles_) close(h.fd);
}

std::vector<VmmCall> FakeCudaRuntime::vmm_log() const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return vmm_log_;
}

std::size_t FakeCudaRuntime::live_handles() const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return handles_.size();
}

std::size_t FakeCudaRuntime::live_mappings() const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return mappings_.size();
}

std::size_t FakeCudaRuntime::live_reservations() const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return reservations_.size();
}

}  // namespace remat::cuda
