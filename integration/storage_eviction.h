// Storage eviction: drop and restore the memory of a c10::StorageImpl in place (DESIGN.md, "PyTorch integration").
//
// remat evicts at the storage level, with no wrapper tensors: every tensor, view and autograd-saved variable that
// shares a StorageImpl keeps pointing at the same object, and only the object's memory comes and goes.
//
//   EvictStorage    frees the memory now (the DataPtr's own deleter runs, so memory from any allocator goes back
//                   where it came from), leaves an empty DataPtr on the same device and nbytes 0, and marks the
//                   storage so that reading or writing its data throws a c10::Error naming remat instead of
//                   touching freed memory. Returns the byte size that RestoreStorage needs.
//   RestoreStorage  moves the memory of a freshly computed storage (a replay's output) into the evicted one,
//                   restores nbytes and clears the mark; the source is left empty. Layout checks (sizes, strides,
//                   offset) are the caller's business: this layer only sees bytes.
//
// A storage that torch itself guards (a materializer such as copy-on-write, or data-access checks set by someone
// else) is not evicted: FailedPrecondition. Neither is one that is already evicted, or has no memory.
//
// Thread safety: none beyond torch's own; the caller (the runtime) serializes evict/restore of one storage and
// must not evict a storage an op is running on (locked).
#pragma once

#include <c10/core/StorageImpl.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace remat::integration {

absl::StatusOr<std::size_t> EvictStorage(c10::StorageImpl& storage);

// True when `storage` was evicted by EvictStorage and not restored since.
bool IsEvicted(c10::StorageImpl& storage);

// `nbytes` is what EvictStorage returned; `source` must be a different storage on the same device holding exactly
// `nbytes` bytes.
absl::Status RestoreStorage(c10::StorageImpl& target, std::size_t nbytes, c10::StorageImpl& source);

// The message of the c10::Error thrown when an evicted storage's data is accessed. The dispatch hook adds the
// context kUnrecordedReadContext and the op's name when the read happened inside an op it let through.
inline constexpr const char kEvictedAccessMessage[] =
    "remat: this tensor's storage is evicted (remat dropped its memory to stay within the budget) and its data was "
    "accessed outside an op remat records. From Python, numpy(), data_ptr(), DLPack and torch.save bring it back "
    "(import remat first); from C++, call remat::integration::MakeResident(tensor) before reading a raw pointer. "
    "Inside an op, this is a remat bug: please report the op named below";
inline constexpr const char kUnrecordedReadContext[] = "remat: the evicted storage was read by the unrecorded op";

}  // namespace remat::integration
