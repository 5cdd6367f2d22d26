// Executor defaults: an executor that does not implement paging refuses it loudly (never drops data).
#include "runtime/executor.h"

#include "absl/strings/str_cat.h"

namespace remat {

absl::Status Executor::PageOut(Engine&, std::uint32_t storage) {
  return absl::UnimplementedError(absl::StrCat("this executor cannot page storages out (storage ", storage,
                                               "); run with offload off or use an executor that implements PageOut"));
}

absl::Status Executor::PageIn(Engine&, std::uint32_t storage) {
  return absl::UnimplementedError(absl::StrCat("this executor cannot page storages in (storage ", storage, ")"));
}

void Executor::DropPaged(Engine&, std::uint32_t) {}

absl::StatusOr<bool> Executor::Relocate(Engine&, std::uint32_t, AddressRange) { return false; }

absl::StatusOr<bool> Executor::Slide(Engine&, std::uint32_t, std::uintptr_t) { return false; }

}  // namespace remat
