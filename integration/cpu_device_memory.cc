// CpuDeviceMemory: see cpu_device_memory.h.
#include "integration/cpu_device_memory.h"

#include <c10/core/CPUAllocator.h>

#include <cstring>

#include "integration/cpu_allocator.h"
#include "integration/op_capture.h"

namespace remat::integration {

Arena* CpuDeviceMemory::arena() { return InForkedChildOfCpuArena() ? nullptr : arena_; }

bool CpuDeviceMemory::Owns(const c10::DataPtr& data) const { return AllocatedByRematArena(data); }

bool CpuDeviceMemory::Borrowed(const c10::DataPtr& data) const { return BorrowedCpuMemory(data); }

c10::intrusive_ptr<c10::StorageImpl> CpuDeviceMemory::NewStorage(std::size_t nbytes) {
  c10::Allocator* allocator = c10::GetCPUAllocator();
  return c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                               allocator->allocate(nbytes), allocator, /*resizable=*/true);
}

c10::DataPtr CpuDeviceMemory::TryAllocate(std::size_t bytes, Placement placement) {
  return TryAllocateInCpuArena(bytes, placement);
}

absl::Status CpuDeviceMemory::Slide(c10::StorageImpl& storage, std::uintptr_t to) {
  return SlideInCpuArena(storage, to);
}

void CpuDeviceMemory::SetPressureHandler(PressureHandler* handler) {
  SetCpuPressureHandler(handler);
  // The engine handling pressure sees the ops the hook records: blocks made outside them go out of its way.
  SetCpuOutsideOpsProbe(handler != nullptr ? &InsideRecordedOp : nullptr);
}

void CpuDeviceMemory::SetPlacementForThisThread(Placement placement) { SetCpuPlacementForThisThread(placement); }

std::size_t CpuDeviceMemory::alignment() const { return kCpuAlignment; }

absl::Status CpuDeviceMemory::Copy(void* dst, const void* src, std::size_t nbytes) {
  if (nbytes > 0) std::memcpy(dst, src, nbytes);
  return absl::OkStatus();
}

absl::Status CpuDeviceMemory::CopyToHost(void* host, const void* src, std::size_t nbytes) {
  return Copy(host, src, nbytes);
}

absl::Status CpuDeviceMemory::CopyFromHost(void* dst, const void* host, std::size_t nbytes) {
  return Copy(dst, host, nbytes);
}

}  // namespace remat::integration
