// CpuDeviceMemory: DeviceMemory (device_memory.h) over remat's CPU arena (cpu_allocator.h). Storages come from
// c10's current CPU allocator (the arena while remat is installed, torch's own after it is uninstalled), copies
// are memcpy, and the arena operations go to the installed arena.
#pragma once

#include "integration/device_memory.h"

namespace remat::integration {

class CpuDeviceMemory final : public DeviceMemory {
 public:
  // `arena`: the installed CPU arena (InstalledCpuArena()), or nullptr.
  explicit CpuDeviceMemory(Arena* arena) : arena_(arena) {}

  c10::DeviceType device_type() const override { return c10::DeviceType::CPU; }
  // None in a forked child: the arena's lock may have been held by a parent thread that does not exist there (a
  // rematerialization in a DataLoader worker naming its block's owner waited for it forever).
  Arena* arena() override;
  bool Owns(const c10::DataPtr& data) const override;
  bool Borrowed(const c10::DataPtr& data) const override;
  c10::intrusive_ptr<c10::StorageImpl> NewStorage(std::size_t nbytes) override;
  c10::DataPtr TryAllocate(std::size_t bytes, Placement placement) override;
  absl::Status Slide(c10::StorageImpl& storage, std::uintptr_t to) override;
  void SetPressureHandler(PressureHandler* handler) override;
  void SetPlacementForThisThread(Placement placement) override;
  std::size_t alignment() const override;
  absl::Status Copy(void* dst, const void* src, std::size_t nbytes) override;
  absl::Status CopyToHost(void* host, const void* src, std::size_t nbytes) override;
  absl::Status CopyFromHost(void* dst, const void* host, std::size_t nbytes) override;
  bool host_accessible() const override { return true; }
  std::int16_t history_device() const override { return kHistoryCpu; }

 private:
  Arena* arena_;
};

}  // namespace remat::integration
