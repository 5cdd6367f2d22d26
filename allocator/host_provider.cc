// Host memory provider: aligned host memory for the CPU path.
//
// Small segments (< 1 MiB) come from aligned_alloc; larger ones from an anonymous private mmap with
// MAP_NORESERVE, so a budget-sized arena costs nothing until its pages are touched. An mmap with an alignment
// above the page size over-maps by the alignment and trims both ends. The provider remembers how each live
// segment was obtained, so Release undoes exactly that; releasing anything else is a programming error and
// aborts (a silent leak or a wrong free would corrupt the process later, far from the cause).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "allocator/memory_provider.h"

namespace remat {
namespace {

constexpr std::size_t kMmapThreshold = std::size_t{1} << 20;

enum class Kind { kMalloc, kMmap };

class HostProvider final : public MemoryProvider {
 public:
  ~HostProvider() override {
    // Segments still held here were never released by their arena; give them back rather than leak.
    for (const auto& [base, rec] : live_) Free(base, rec);
  }

  absl::StatusOr<Segment> Reserve(std::size_t bytes, std::size_t alignment) override {
    if (bytes == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("host provider: cannot reserve ", bytes, " bytes aligned to ", alignment));
    }
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    if (alignment > (std::size_t{1} << 40) || bytes > (std::size_t{1} << 56)) {
      return absl::ResourceExhaustedError(absl::StrCat("host provider: cannot reserve ", bytes, " bytes"));
    }
    Rec rec;
    void* p = nullptr;
    if (bytes < kMmapThreshold) {
      rec.kind = Kind::kMalloc;
      const std::size_t a = std::max(alignment, sizeof(void*));  // aligned_alloc wants the size a multiple of it
      rec.size = (bytes + a - 1) & ~(a - 1);
      p = std::aligned_alloc(a, rec.size);
    } else {
      rec.kind = Kind::kMmap;
      rec.size = (bytes + page - 1) & ~(page - 1);
      const std::size_t extra = alignment > page ? alignment : 0;
      void* raw = mmap(nullptr, rec.size + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
      if (raw != MAP_FAILED) {
        const auto start = reinterpret_cast<std::uintptr_t>(raw);
        const std::uintptr_t base = (start + alignment - 1) & ~(alignment - 1);
        if (base > start) munmap(raw, base - start);
        const std::uintptr_t end = start + rec.size + extra;
        if (end > base + rec.size) munmap(reinterpret_cast<void*>(base + rec.size), end - base - rec.size);
        p = reinterpret_cast<void*>(base);
      }
    }
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("host provider: cannot reserve ", bytes,
                                                       " bytes aligned to ", alignment, ": ", std::strerror(errno)));
    }
    const auto base = reinterpret_cast<std::uintptr_t>(p);
    absl::MutexLock lock(&mu_);
    live_.emplace(base, rec);
    return Segment{base, rec.size};
  }

  void Release(const Segment& segment) override {
    Rec rec;
    {
      absl::MutexLock lock(&mu_);
      auto it = live_.find(segment.base);
      if (it == live_.end() || it->second.size != segment.size) {
        std::fprintf(stderr, "remat host provider: Release of a segment it did not reserve (base %#zx, %zu bytes)\n",
                     static_cast<std::size_t>(segment.base), segment.size);
        std::abort();
      }
      rec = it->second;
      live_.erase(it);
    }
    Free(segment.base, rec);
  }

  bool BacksMemory() const override { return true; }
  std::string_view Name() const override { return "host"; }

 private:
  struct Rec {
    Kind kind = Kind::kMalloc;
    std::size_t size = 0;
  };
  static void Free(std::uintptr_t base, const Rec& rec) {
    if (rec.kind == Kind::kMalloc) {
      std::free(reinterpret_cast<void*>(base));
    } else {
      munmap(reinterpret_cast<void*>(base), rec.size);
    }
  }
  absl::Mutex mu_;
  absl::flat_hash_map<std::uintptr_t, Rec> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<MemoryProvider> MakeHostProvider() { return std::make_unique<HostProvider>(); }

}  // namespace remat
