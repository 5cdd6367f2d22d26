// DeviceMemory helpers: see device_memory.h.
#include "integration/device_memory.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <string>

namespace remat::integration {

c10::intrusive_ptr<c10::StorageImpl> CopyStorage(DeviceMemory& memory, c10::StorageImpl& source) {
  const std::size_t nbytes = source.nbytes();
  const void* from = source._mutable_data_ptr_no_checks().get();
  if (source.device_type() == memory.device_type()) {
    c10::intrusive_ptr<c10::StorageImpl> copy = memory.NewStorage(nbytes);
    if (nbytes > 0) {
      const absl::Status copied = memory.Copy(copy->_mutable_data_ptr_no_checks().get(), from, nbytes);
      TORCH_CHECK(copied.ok(), "remat: copying a storage failed: ", std::string(copied.message()));
    }
    return copy;
  }
  TORCH_CHECK(source.device_type() == c10::DeviceType::CPU, "remat: cannot copy a storage on ", source.device(),
              " into memory for ", memory.device_type(), " tensors");
  c10::Allocator* allocator = c10::GetAllocator(c10::DeviceType::CPU);
  c10::DataPtr data = allocator->allocate(nbytes);
  if (nbytes > 0) std::memcpy(data.get(), from, nbytes);
  return c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes, std::move(data),
                                               allocator, /*resizable=*/true);
}

bool EvictableMemory(const DeviceMemory& memory, c10::StorageImpl& storage) {
  if (storage.has_materializer() || storage.throw_on_immutable_data_ptr() || storage.throw_on_mutable_data_ptr()) {
    return false;
  }
  if (storage.sym_nbytes().is_heap_allocated() || storage.nbytes() == 0) return false;
  return memory.Owns(storage._mutable_data_ptr_no_checks());
}

}  // namespace remat::integration
