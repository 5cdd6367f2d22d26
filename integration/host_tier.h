// HostTier: the second memory tier the CPU integration pages storages to (issue 7; runtime/executor.h, "Paging").
//
// On CPU the "device" is the remat arena; the second tier is memory outside it that the budget does not count:
//   - kMemory: one heap block per paged storage (malloc'd, outside the arena);
//   - kFile: a temporary file (created in `directory`, default $TMPDIR or /tmp, unlinked at once so nothing is left
//     behind), written with pwrite and read back with pread, as POET pages to flash. Space in the file is reused
//     (first fit over freed extents, coalesced); the file grows as needed.
// Both have a byte budget (REMAT_HOST_BUDGET / host_budget=): Store of a copy that does not fit is ResourceExhausted
// and stores nothing. The budget counts the storages' bytes exactly as the engine's host_budget does
// (EngineStats::host_used_bytes), so the engine's own check and this one agree.
//
// Keys are the engine's storage indices; one copy per key. Errors (an I/O error, a missing key) are statuses; after
// a failed Store the tier is unchanged, after a failed Load the copy is still there (nothing is lost).
// Not thread-safe: the engine bridge serializes every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace remat::integration {

enum class HostTierKind { kMemory, kFile };

// "memory" or "file"; InvalidArgument naming the accepted values otherwise.
absl::StatusOr<HostTierKind> ParseHostTierKind(std::string_view text);
std::string_view HostTierKindName(HostTierKind kind);

struct HostTierOptions {
  HostTierKind kind = HostTierKind::kMemory;
  std::int64_t budget = std::numeric_limits<std::int64_t>::max();  // bytes
  std::string directory = "";  // kFile: where the temporary file goes; empty: $TMPDIR, else /tmp
};

struct HostTierStats {
  std::int64_t used_bytes = 0;
  std::int64_t peak_bytes = 0;
  std::int64_t stores = 0;
  std::int64_t loads = 0;
  std::int64_t stored_bytes = 0;
  std::int64_t loaded_bytes = 0;
  std::int64_t store_ns = 0;  // wall time copying out (memcpy or pwrite)
  std::int64_t load_ns = 0;   // wall time copying back (memcpy or pread)
  std::int64_t file_bytes = 0;  // kFile: the file's size
};

class HostTier {
 public:
  // kFile: InvalidArgument/Internal when the temporary file cannot be created (the message names the directory).
  static absl::StatusOr<std::unique_ptr<HostTier>> Create(const HostTierOptions& options);
  ~HostTier();
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Copies `nbytes` from `data` under `key`. AlreadyExists if key holds a copy; ResourceExhausted beyond the budget.
  absl::Status Store(std::uint32_t key, const void* data, std::size_t nbytes);
  // Copies key's bytes to `out` (nbytes must be the stored size); the copy stays until Release.
  absl::Status Load(std::uint32_t key, void* out, std::size_t nbytes);
  // Drops key's copy (no-op without one).
  void Release(std::uint32_t key);
  bool Holds(std::uint32_t key) const { return copies_.contains(key); }
  std::int64_t budget() const { return options_.budget; }
  HostTierKind kind() const { return options_.kind; }
  const HostTierStats& stats() const { return stats_; }
  // kFile: the temporary file's path as created (already unlinked); empty for kMemory.
  const std::string& file_path() const { return path_; }

 private:
  explicit HostTier(const HostTierOptions& options) : options_(options) {}
  struct Copy {
    std::size_t nbytes = 0;
    std::unique_ptr<std::byte[]> memory;  // kMemory
    std::int64_t offset = 0;              // kFile
  };
  // kFile: an extent of `nbytes` bytes (rounded up to 4 KiB) in the file; grows the file when no free one fits.
  absl::StatusOr<std::int64_t> AllocateExtent(std::size_t nbytes);
  void FreeExtent(std::int64_t offset, std::size_t nbytes);

  HostTierOptions options_;
  absl::flat_hash_map<std::uint32_t, Copy> copies_;
  HostTierStats stats_;
  int fd_ = -1;
  std::string path_;
  std::map<std::int64_t, std::int64_t> free_extents_;  // kFile: offset -> length
};

}  // namespace remat::integration
