// Stitching host provider (issue 18; memory_provider.h, "Stitching"): segments are address space only (an
// anonymous PROT_NONE reservation, MAP_NORESERVE: no memory, no commit charge); physical memory is one memfd of
// `physical_bytes`, cut into granules. Map backs each granule of a range with a physical granule
// (mmap(MAP_FIXED | MAP_SHARED | MAP_POPULATE), so the block's first touch does not fault page by page). Unmap only
// marks the range's granules unused: they stay mapped, so a block placed there again (best fit reuses freed
// ranges) costs no system call; Map takes the physical granule of an unused mapping (unmapping it) only when the
// pool has no free one left. The arena never has more granules in use than the pool holds, so Map always finds
// one. The memfd's pages are never punched out: the process holds at most the pool (the budget). Contents are not
// preserved (a fresh block has undefined contents, as from any allocator).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "allocator/memory_provider.h"

namespace remat {
namespace {

std::string Errno(int e) { return std::strerror(e); }

class StitchHostProvider final : public MemoryProvider {
 public:
  StitchHostProvider(int fd, std::size_t physical_bytes, std::size_t granule)
      : fd_(fd), granule_(granule) {
    for (std::size_t p = physical_bytes / granule; p > 0; --p) free_.push_back(static_cast<std::uint32_t>(p - 1));
  }
  ~StitchHostProvider() override {
    for (const auto& [base, size] : segments_) munmap(reinterpret_cast<void*>(base), size);
    close(fd_);
  }

  absl::StatusOr<Segment> Reserve(std::size_t bytes, std::size_t alignment) override {
    if (bytes == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0 || bytes % granule_ != 0 ||
        bytes > (std::size_t{1} << 56) || alignment > (std::size_t{1} << 40)) {
      return absl::InvalidArgumentError(absl::StrCat("stitch provider: cannot reserve ", bytes, " bytes aligned to ",
                                                     alignment, " (granule ", granule_, ")"));
    }
    const std::size_t align = std::max(alignment, granule_);  // granules map at granule-aligned addresses
    void* raw = mmap(nullptr, bytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("stitch provider: cannot reserve ", bytes, " bytes of address space: ", Errno(errno)));
    }
    const auto start = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t base = (start + align - 1) & ~(align - 1);
    if (base > start) munmap(raw, base - start);
    if (const std::size_t tail = start + bytes + align - (base + bytes); tail > 0) {
      munmap(reinterpret_cast<void*>(base + bytes), tail);
    }
    absl::MutexLock lock(&mu_);
    segments_[base] = bytes;
    return Segment{base, bytes};
  }

  void Release(const Segment& segment) override {
    {
      absl::MutexLock lock(&mu_);
      auto it = segments_.find(segment.base);
      if (it == segments_.end()) return;
      segments_.erase(it);
      ReturnPhysical(segment.base, segment.size);
    }
    munmap(reinterpret_cast<void*>(segment.base), segment.size);
  }

  bool BacksMemory() const override { return true; }
  std::string_view Name() const override { return "stitch"; }

  absl::Status Map(std::uintptr_t address, std::size_t bytes) override {
    absl::MutexLock lock(&mu_);
    const std::uintptr_t first = address / granule_, count = bytes / granule_;
    for (std::uintptr_t g = first; g < first + count; ++g) {
      auto it = physical_of_.find(g);
      if (it != physical_of_.end()) {  // still mapped from an earlier use: nothing to do
        cached_.erase(g);
        continue;
      }
      std::uint32_t physical;
      if (!free_.empty()) {
        physical = free_.back();
        free_.pop_back();
      } else if (!cached_.empty()) {
        // Every physical granule is mapped somewhere: take one whose virtual granule no block uses.
        const std::uintptr_t victim = *cached_.begin();
        cached_.erase(cached_.begin());
        physical = physical_of_[victim];
        physical_of_.erase(victim);
        mmap(reinterpret_cast<void*>(victim * granule_), granule_, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
      } else {
        Rollback(first, g);
        return absl::ResourceExhaustedError(
            absl::StrCat("stitch provider: no physical granule left for ", bytes, " bytes at ", address));
      }
      void* p = mmap(reinterpret_cast<void*>(g * granule_), granule_, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd_, static_cast<off_t>(physical) * static_cast<off_t>(granule_));
      if (p == MAP_FAILED) {
        const int e = errno;
        free_.push_back(physical);
        Rollback(first, g);
        return absl::ResourceExhaustedError(absl::StrCat("stitch provider: mapping ", granule_, " bytes at ",
                                                         g * granule_, " failed: ", Errno(e)));
      }
      physical_of_[g] = physical;
    }
    return absl::OkStatus();
  }

  // The granules stay mapped (a block placed there again, as best fit often does, costs no system call and no page
  // fault); their physical granules go to another range only when the pool has no free one left (Map).
  void Unmap(std::uintptr_t address, std::size_t bytes) override {
    absl::MutexLock lock(&mu_);
    for (std::uintptr_t g = address / granule_; g < (address + bytes) / granule_; ++g) {
      if (physical_of_.contains(g)) cached_.insert(g);
    }
  }

 private:
  // Map failed at granule `failed`: the granules [first, failed) this call took become cached (still mapped, free
  // for any use), as if unmapped.
  void Rollback(std::uintptr_t first, std::uintptr_t failed) {
    for (std::uintptr_t g = first; g < failed; ++g) cached_.insert(g);
  }
  // A segment goes: its granules' physical memory goes back to the pool (with mu_ held).
  void ReturnPhysical(std::uintptr_t address, std::size_t bytes) {
    for (std::uintptr_t g = address / granule_; g < (address + bytes) / granule_; ++g) {
      auto it = physical_of_.find(g);
      if (it == physical_of_.end()) continue;
      free_.push_back(it->second);
      physical_of_.erase(it);
      cached_.erase(g);
    }
  }

  const int fd_;
  const std::size_t granule_;
  absl::Mutex mu_;
  std::vector<std::uint32_t> free_;                                 // physical granules mapped nowhere
  absl::flat_hash_map<std::uintptr_t, std::uint32_t> physical_of_;  // virtual granule index -> physical granule
  absl::btree_set<std::uintptr_t> cached_;  // mapped virtual granules no block uses (their memory is reusable)
  absl::flat_hash_map<std::uintptr_t, std::size_t> segments_;       // base -> size
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryProvider>> MakeStitchHostProvider(std::size_t physical_bytes,
                                                                       std::size_t granule) {
  const long page = sysconf(_SC_PAGESIZE);
  if (granule == 0 || (granule & (granule - 1)) != 0 || granule % static_cast<std::size_t>(page) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stitch provider: the granule must be a power of two and a multiple of the page size (", page,
                     " bytes), got ", granule));
  }
  physical_bytes -= physical_bytes % granule;
  if (physical_bytes == 0 || physical_bytes / granule > (std::size_t{1} << 31)) {
    return absl::InvalidArgumentError(absl::StrCat("stitch provider: the physical pool must hold between one and 2^31 "
                                                   "granules of ", granule, " bytes"));
  }
  const int fd = memfd_create("remat-stitch-pool", MFD_CLOEXEC);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("stitch provider: memfd_create failed: ", Errno(errno)));
  }
  if (ftruncate(fd, static_cast<off_t>(physical_bytes)) != 0) {
    const int e = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("stitch provider: cannot size the physical pool to ", physical_bytes, " bytes: ", Errno(e)));
  }
  return std::unique_ptr<MemoryProvider>(new StitchHostProvider(fd, physical_bytes, granule));
}

}  // namespace remat
