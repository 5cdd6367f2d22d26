// HostTier: see host_tier.h for the contract.
#include "integration/host_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <new>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace remat::integration {
namespace {

constexpr std::int64_t kExtentAlignment = 4096;

std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::int64_t RoundUp(std::size_t nbytes) {
  const auto n = static_cast<std::int64_t>(nbytes);
  return (n + kExtentAlignment - 1) / kExtentAlignment * kExtentAlignment;
}

// strerror, and what a full disk means for the file tier.
std::string IoError(int error) {
  std::string text = std::strerror(error);
  if (error == ENOSPC || error == EDQUOT) {
    absl::StrAppend(&text, " (the disk holding the host tier file is full: free space there, or set TMPDIR to a "
                           "directory on a disk with room)");
  }
  return text;
}

}  // namespace

absl::StatusOr<HostTierKind> ParseHostTierKind(std::string_view text) {
  const std::string kind = absl::AsciiStrToLower(absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size())));
  if (kind == "memory") return HostTierKind::kMemory;
  if (kind == "file") return HostTierKind::kFile;
  return absl::InvalidArgumentError(absl::StrCat("unknown host tier \"", std::string(text), "\"; expected memory or file"));
}

std::string_view HostTierKindName(HostTierKind kind) { return kind == HostTierKind::kFile ? "file" : "memory"; }

absl::StatusOr<std::unique_ptr<HostTier>> HostTier::Create(const HostTierOptions& options) {
  if (options.budget < 0) return absl::InvalidArgumentError("host tier budget must be >= 0 bytes");
  std::unique_ptr<HostTier> tier(new HostTier(options));
  if (options.kind == HostTierKind::kFile) {
    std::string directory = options.directory;
    if (directory.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      directory = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    }
    std::string templ = directory + "/remat-host-tier-XXXXXX";
    std::vector<char> name(templ.begin(), templ.end());
    name.push_back('\0');
    const int fd = mkstemp(name.data());
    if (fd < 0) {
      return absl::InvalidArgumentError(absl::StrCat("remat: cannot create the file-backed host tier in ", directory,
                                                     ": ", std::strerror(errno)));
    }
    tier->fd_ = fd;
    tier->path_ = name.data();
    (void)unlink(name.data());  // anonymous from now on: the space goes back when the tier (or the process) ends
  }
  return tier;
}

HostTier::~HostTier() {
  if (fd_ >= 0) (void)close(fd_);
}

absl::StatusOr<std::int64_t> HostTier::AllocateExtent(std::size_t nbytes) {
  const std::int64_t length = RoundUp(nbytes);
  for (auto it = free_extents_.begin(); it != free_extents_.end(); ++it) {
    if (it->second < length) continue;
    const std::int64_t offset = it->first;
    const std::int64_t rest = it->second - length;
    free_extents_.erase(it);
    if (rest > 0) free_extents_[offset + length] = rest;
    return offset;
  }
  const std::int64_t offset = stats_.file_bytes;
  if (ftruncate(fd_, offset + length) != 0) {
    // Unavailable, not ResourceExhausted: the file system failed, not remat's memory (no "raise the budget").
    return absl::UnavailableError(absl::StrCat("remat: cannot grow the host tier file ", path_, " to ",
                                               offset + length, " bytes: ", IoError(errno)));
  }
  stats_.file_bytes = offset + length;
  return offset;
}

void HostTier::FreeExtent(std::int64_t offset, std::size_t nbytes) {
  std::int64_t length = RoundUp(nbytes);
  auto next = free_extents_.lower_bound(offset);
  if (next != free_extents_.end() && next->first == offset + length) {  // coalesce with the one after
    length += next->second;
    next = free_extents_.erase(next);
  }
  if (next != free_extents_.begin()) {  // and with the one before
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += length;
      return;
    }
  }
  free_extents_[offset] = length;
}

absl::Status HostTier::Store(std::uint32_t key, const void* data, std::size_t nbytes) {
  if (copies_.contains(key)) return absl::AlreadyExistsError(absl::StrCat("remat: host tier already holds ", key));
  const auto n = static_cast<std::int64_t>(nbytes);
  if (stats_.used_bytes > options_.budget - n) {
    return absl::ResourceExhaustedError(absl::StrCat("remat: host tier budget ", options_.budget, " bytes: ",
                                                     stats_.used_bytes, " in use, ", n, " more do not fit"));
  }
  const std::int64_t start = NowNs();
  Copy copy;
  copy.nbytes = nbytes;
  if (options_.kind == HostTierKind::kMemory) {
    copy.memory.reset(new (std::nothrow) std::byte[nbytes == 0 ? 1 : nbytes]);
    if (copy.memory == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("remat: host tier: cannot allocate ", n, " bytes"));
    }
    if (nbytes > 0) std::memcpy(copy.memory.get(), data, nbytes);
  } else {
    absl::StatusOr<std::int64_t> offset = AllocateExtent(nbytes);
    if (!offset.ok()) return offset.status();
    std::size_t done = 0;
    while (done < nbytes) {
      const ssize_t w = pwrite(fd_, static_cast<const char*>(data) + done, nbytes - done,
                               static_cast<off_t>(*offset + static_cast<std::int64_t>(done)));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int error = errno;
        FreeExtent(*offset, nbytes);
        return absl::UnavailableError(absl::StrCat("remat: writing ", n, " bytes to the host tier file ", path_,
                                                   ": ", w < 0 ? IoError(error) : "nothing written"));
      }
      done += static_cast<std::size_t>(w);
    }
    copy.offset = *offset;
  }
  copies_.emplace(key, std::move(copy));
  stats_.used_bytes += n;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.used_bytes);
  ++stats_.stores;
  stats_.stored_bytes += n;
  stats_.store_ns += NowNs() - start;
  return absl::OkStatus();
}

absl::Status HostTier::Load(std::uint32_t key, void* out, std::size_t nbytes) {
  auto it = copies_.find(key);
  if (it == copies_.end()) return absl::NotFoundError(absl::StrCat("remat: host tier holds no copy of ", key));
  const Copy& copy = it->second;
  if (copy.nbytes != nbytes) {
    return absl::InvalidArgumentError(absl::StrCat("remat: host tier copy of ", key, " holds ", copy.nbytes,
                                                   " bytes, asked for ", nbytes));
  }
  const std::int64_t start = NowNs();
  if (options_.kind == HostTierKind::kMemory) {
    if (nbytes > 0) std::memcpy(out, copy.memory.get(), nbytes);
  } else {
    std::size_t done = 0;
    while (done < nbytes) {
      const ssize_t r = pread(fd_, static_cast<char*>(out) + done, nbytes - done,
                              static_cast<off_t>(copy.offset + static_cast<std::int64_t>(done)));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        return absl::InternalError(absl::StrCat("remat: reading ", nbytes, " bytes from the host tier file ", path_,
                                                ": ", r < 0 ? std::strerror(errno) : "end of file"));
      }
      done += static_cast<std::size_t>(r);
    }
  }
  ++stats_.loads;
  stats_.loaded_bytes += static_cast<std::int64_t>(nbytes);
  stats_.load_ns += NowNs() - start;
  return absl::OkStatus();
}

void HostTier::Release(std::uint32_t key) {
  auto it = copies_.find(key);
  if (it == copies_.end()) return;
  if (options_.kind == HostTierKind::kFile) FreeExtent(it->second.offset, it->second.nbytes);
  stats_.used_bytes -= static_cast<std::int64_t>(it->second.nbytes);
  copies_.erase(it);
}

}  // namespace remat::integration
