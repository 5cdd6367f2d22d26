// Stitching host provider (issue 18; memory_provider.h, "Stitching"): segments are address space only (an
// anonymous PROT_NONE reservation, MAP_NORESERVE: no memory, no commit charge); a granule gets memory when a block
// first needs it (mmap(MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE), so the block's first touch does not
// fault page by page). Unmap only marks the range's granules unused: they keep their memory, so a block placed there
// again (best fit reuses freed ranges) costs no system call; when `physical_bytes` worth of granules already hold
// memory, Map moves an unused granule's pages to the range that needs them (mremap, no copy and no zeroing) and
// reserves its old place again. So the process holds at most `physical_bytes` (the budget) whatever the arena does.
//
// Why private anonymous memory rather than one shared pool (a memfd mapped granule by granule, which moves pages
// without zeroing them): shared mappings survive fork() shared, so a forked child (a DataLoader worker) writing a
// tensor it inherited would change the parent's tensor. Private memory is copied on write, as with any allocator.
// Contents are not preserved across Map (a fresh block has undefined contents, as from any allocator).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // mremap
#endif
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "allocator/memory_provider.h"

namespace remat {
namespace {

std::string Errno(int e) { return std::strerror(e); }

class StitchHostProvider final : public MemoryProvider {
 public:
  StitchHostProvider(std::size_t physical_bytes, std::size_t granule)
      : granule_(granule), capacity_(physical_bytes / granule) {}
  ~StitchHostProvider() override {
    for (const auto& [base, size] : segments_) munmap(reinterpret_cast<void*>(base), size);
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
      for (std::uintptr_t g = segment.base / granule_; g < (segment.base + segment.size) / granule_; ++g) {
        if (backed_.erase(g) > 0) cached_.erase(g);
      }
    }
    munmap(reinterpret_cast<void*>(segment.base), segment.size);
  }

  bool BacksMemory() const override { return true; }
  std::string_view Name() const override { return "stitch"; }

  absl::Status Map(std::uintptr_t address, std::size_t bytes) override {
    absl::MutexLock lock(&mu_);
    const std::uintptr_t first = address / granule_, count = bytes / granule_;
    for (std::uintptr_t g = first; g < first + count; ++g) {
      if (backed_.contains(g)) {  // still holds memory from an earlier use: nothing to do
        cached_.erase(g);
        continue;
      }
      void* p = MAP_FAILED;
      if (backed_.size() >= capacity_) {
        if (cached_.empty()) {
          Rollback(first, g);
          return absl::ResourceExhaustedError(
              absl::StrCat("stitch provider: no physical granule left for ", bytes, " bytes at ", address));
        }
        // Every granule's worth of memory is in use somewhere: move the pages of one no block uses here (mremap:
        // no copy, no zeroing, no fault), and reserve its old place again.
        const std::uintptr_t victim = *cached_.begin();
        cached_.erase(cached_.begin());
        backed_.erase(victim);
        void* from = reinterpret_cast<void*>(victim * granule_);
        p = mremap(from, granule_, granule_, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(g * granule_));
        mmap(from, granule_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
      } else {
        p = mmap(reinterpret_cast<void*>(g * granule_), granule_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_POPULATE, -1, 0);
      }
      if (p == MAP_FAILED) {
        const int e = errno;
        Rollback(first, g);
        return absl::ResourceExhaustedError(absl::StrCat("stitch provider: mapping ", granule_, " bytes at ",
                                                         g * granule_, " failed: ", Errno(e)));
      }
      backed_.insert(g);
    }
    return absl::OkStatus();
  }

  // The granules keep their memory (a block placed there again, as best fit often does, costs no system call and no
  // page fault); it goes to another range only when the budget's worth of granules is in use (Map).
  void Unmap(std::uintptr_t address, std::size_t bytes) override {
    absl::MutexLock lock(&mu_);
    for (std::uintptr_t g = address / granule_; g < (address + bytes) / granule_; ++g) {
      if (backed_.contains(g)) cached_.insert(g);
    }
  }

 private:
  // Map failed at granule `failed`: the granules [first, failed) this call backed become unused (they keep their
  // memory, free for any use), as if unmapped.
  void Rollback(std::uintptr_t first, std::uintptr_t failed) {
    for (std::uintptr_t g = first; g < failed; ++g) cached_.insert(g);
  }

  const std::size_t granule_;
  const std::size_t capacity_;  // granules that may hold memory at once
  absl::Mutex mu_;
  absl::flat_hash_set<std::uintptr_t> backed_;  // virtual granule indices holding memory
  absl::btree_set<std::uintptr_t> cached_;       // those no block uses (their memory is reusable)
  absl::flat_hash_map<std::uintptr_t, std::size_t> segments_;  // base -> size
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
  return std::unique_ptr<MemoryProvider>(new StitchHostProvider(physical_bytes, granule));
}

}  // namespace remat
