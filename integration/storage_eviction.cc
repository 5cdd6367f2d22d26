// Storage eviction: see storage_eviction.h for the contract.
//
// The evicted mark is torch's own "throw on data access" flag with our message in the StorageExtraMeta. Every
// data accessor (data(), mutable_data(), data_ptr()) checks that flag on its slow path, so a kernel that reaches
// an evicted storage throws instead of dereferencing null. We recognise our own mark by the message, so we never
// mistake a storage that torch guards for one of ours.
#include "integration/storage_eviction.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace remat::integration {
namespace {

bool HasOurMark(c10::StorageImpl& storage) {
  if (!storage.throw_on_immutable_data_ptr()) return false;
  const std::optional<std::string>& msg = storage.get_extra_meta().custom_data_ptr_error_msg_;
  return msg.has_value() && *msg == kEvictedAccessMessage;
}

}  // namespace

bool IsEvicted(c10::StorageImpl& storage) { return HasOurMark(storage); }

absl::StatusOr<std::size_t> EvictStorage(c10::StorageImpl& storage) {
  if (HasOurMark(storage)) return absl::FailedPreconditionError("remat: storage is already evicted");
  if (storage.has_materializer() || storage.throw_on_immutable_data_ptr() || storage.throw_on_mutable_data_ptr()) {
    return absl::FailedPreconditionError(
        "remat: storage has a materializer or data-access checks set by torch; it cannot be evicted");
  }
  if (storage.sym_nbytes().is_heap_allocated()) {
    return absl::FailedPreconditionError("remat: storage has a symbolic size");
  }
  const std::size_t nbytes = storage.nbytes();
  if (nbytes == 0 || storage._mutable_data_ptr_no_checks().get() == nullptr) {
    return absl::FailedPreconditionError("remat: storage holds no memory");
  }
  const c10::Device device = storage.device();
  // The old DataPtr is destroyed here, which runs its deleter: memory goes back to the allocator that made it.
  storage.set_data_ptr_noswap(at::DataPtr(nullptr, device));
  storage.set_nbytes(0);
  storage.release_data_and_set_meta_custom_data_ptr_error_msg_(std::string(kEvictedAccessMessage));
  return nbytes;
}

absl::Status RestoreStorage(c10::StorageImpl& target, std::size_t nbytes, c10::StorageImpl& source) {
  if (&target == &source) return absl::InvalidArgumentError("remat: restore from the storage itself");
  if (!HasOurMark(target)) return absl::FailedPreconditionError("remat: restore of a storage that is not evicted");
  if (source.throw_on_immutable_data_ptr() || source.has_materializer()) {
    return absl::InvalidArgumentError("remat: restore source is guarded (evicted, or a materializer is pending)");
  }
  if (source.sym_nbytes().is_heap_allocated()) {
    return absl::InvalidArgumentError("remat: restore source has a symbolic size");
  }
  if (source.nbytes() != nbytes) {
    return absl::InvalidArgumentError(absl::StrCat("remat: restore source holds ", source.nbytes(),
                                                   " bytes, the evicted storage held ", nbytes));
  }
  if (source.device() != target.device()) {
    return absl::InvalidArgumentError(absl::StrCat("remat: restore source is on ", source.device().str(),
                                                   ", the evicted storage on ", target.device().str()));
  }
  at::DataPtr memory = std::move(source._mutable_data_ptr_no_checks());
  source.set_data_ptr_noswap(at::DataPtr(nullptr, memory.device()));
  source.set_nbytes(0);
  target.clear_data_ptr_access_error_msg_();
  target.set_data_ptr_noswap(std::move(memory));
  target.set_nbytes(nbytes);
  return absl::OkStatus();
}

}  // namespace remat::integration
