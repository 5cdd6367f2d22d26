// CudaDeviceMemory: see cuda_device_memory.h.
#include "integration/cuda/cuda_device_memory.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "integration/cpu_allocator.h"
#include "integration/memory_events.h"

namespace remat::integration {

absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> CudaDeviceMemory::Create(RematCudaAllocator* allocator,
                                                                           c10::DeviceIndex device,
                                                                           c10::Allocator* storage_allocator,
                                                                           c10::DeviceType tensor_device) {
  if (allocator == nullptr || storage_allocator == nullptr) {
    return absl::InvalidArgumentError("remat: CUDA device memory needs remat's CUDA allocator");
  }
  cuda::DeviceArena* device_arena = nullptr;
  try {
    device_arena = &allocator->Device(device);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(e.what_without_backtrace());
  }
  absl::StatusOr<Arena*> arena = device_arena->Reserve();
  if (!arena.ok()) return arena.status();
  return std::unique_ptr<CudaDeviceMemory>(
      new CudaDeviceMemory(allocator, device, *arena, storage_allocator, tensor_device));
}

absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> CudaDeviceMemory::ForInstalledAllocator(c10::DeviceIndex device) {
  RematCudaAllocator* allocator = InstalledCudaAllocator();
  if (allocator == nullptr) {
    return absl::FailedPreconditionError(
        "remat: the engine on CUDA needs remat's CUDA allocator installed first (remat.install_cuda_allocator)");
  }
  return Create(allocator, device, allocator, c10::DeviceType::CUDA);
}

CudaDeviceMemory::CudaDeviceMemory(RematCudaAllocator* allocator, c10::DeviceIndex device, Arena* arena,
                                   c10::Allocator* storage_allocator, c10::DeviceType tensor_device)
    : allocator_(allocator),
      device_(device),
      arena_(arena),
      storage_allocator_(storage_allocator),
      tensor_device_(tensor_device) {}

CudaDeviceMemory::~CudaDeviceMemory() {
  own_pager_.reset();  // waits for its copy stream; before the pool its pages live in
  own_pool_.reset();
  if (staging_ != nullptr) (void)allocator_->runtime()->HostFreePinned(staging_);
}

c10::Device CudaDeviceMemory::DataPtrDevice() const {
  return tensor_device_ == c10::DeviceType::CUDA ? c10::Device(c10::DeviceType::CUDA, device_)
                                                  : c10::Device(tensor_device_);
}

bool CudaDeviceMemory::Owns(const c10::DataPtr& data) const {
  return data.get() != nullptr && data.get_deleter() == allocator_->raw_deleter() &&
         allocator_->Device(device_).Owns(reinterpret_cast<std::uintptr_t>(data.get()));
}

bool CudaDeviceMemory::Borrowed(const c10::DataPtr& data) const {
  if (data.get() == nullptr || data.get_deleter() == allocator_->raw_deleter()) return false;
  // The test double's tensors are CPU tensors: torch's CPU allocator's memory is torch's own there.
  return tensor_device_ == c10::DeviceType::CUDA || BorrowedCpuMemory(data);
}

bool CudaDeviceMemory::OnThisDevice(c10::StorageImpl& storage) const {
  // A CUDA storage names its device, evicted or not; CPU tensors over the double's memory only by their bytes.
  if (tensor_device_ == c10::DeviceType::CUDA) return storage.device() == c10::Device(c10::DeviceType::CUDA, device_);
  return Owns(storage._mutable_data_ptr_no_checks());
}

int CudaDeviceMemory::CurrentDevice() const {
  const absl::StatusOr<int> current = allocator_->runtime()->GetDevice();
  return current.ok() ? *current : -1;
}

absl::Status CudaDeviceMemory::SetCurrentDevice(int device) { return allocator_->runtime()->SetDevice(device); }

c10::intrusive_ptr<c10::StorageImpl> CudaDeviceMemory::NewStorage(std::size_t nbytes) {
  // The allocator serves the current device: make it ours for this allocation.
  const cuda::ScopedDevice scoped(allocator_->runtime(), device_);
  TORCH_CHECK(scoped.status().ok(), "remat: cannot select CUDA device ", static_cast<int>(device_), ": ",
              scoped.status().message());
  return c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                               storage_allocator_->allocate(nbytes), storage_allocator_,
                                               /*resizable=*/true);
}

c10::DataPtr CudaDeviceMemory::TryAllocate(std::size_t bytes, Placement placement) {
  absl::StatusOr<std::uintptr_t> address =
      allocator_->Device(device_).TryAllocate(bytes, allocator_->CurrentStream(device_), placement);
  if (!address.ok()) return c10::DataPtr(nullptr, DataPtrDevice());
  if (MemoryHistoryEnabled()) {
    RecordMemoryEvent(MemoryEventKind::kAlloc, *address,
                      allocator_->Device(device_).BlockSize(*address).value_or(bytes), 0, device_);
  }
  void* pointer = reinterpret_cast<void*>(*address);
  return c10::DataPtr(pointer, pointer, allocator_->raw_deleter(), DataPtrDevice());
}

absl::Status CudaDeviceMemory::Slide(c10::StorageImpl& storage, std::uintptr_t to) {
  c10::DataPtr& data = storage._mutable_data_ptr_no_checks();
  if (!Owns(data)) return absl::FailedPreconditionError("remat: only a block of the CUDA arena can slide");
  const auto from = reinterpret_cast<std::uintptr_t>(data.get());
  const absl::Status moved = allocator_->Device(device_).Move(from, to);
  if (!moved.ok() && !absl::IsDataLoss(moved)) return moved;  // nothing moved
  if (MemoryHistoryEnabled()) {
    RecordMemoryEvent(MemoryEventKind::kMove, from, allocator_->Device(device_).BlockSize(to).value_or(0), to,
                      device_);
  }
  // The copies ran on the block's stream; kernels on the current stream read it next: order them after the copies.
  cuda::CudaRuntime* runtime = allocator_->runtime();
  if (absl::StatusOr<cudaStream_t> owner = allocator_->Device(device_).BlockStream(to);
      owner.ok() && *owner != allocator_->CurrentStream(device_)) {
    const cuda::ScopedDevice scoped(runtime, device_);
    absl::StatusOr<cudaEvent_t> event = runtime->EventCreate();
    absl::Status waited = event.ok() ? runtime->EventRecord(*event, *owner) : event.status();
    if (waited.ok()) waited = runtime->StreamWaitEvent(allocator_->CurrentStream(device_), *event);
    if (event.ok()) (void)runtime->EventDestroy(*event);
    if (!waited.ok()) (void)runtime->StreamSynchronize(*owner);  // no event: the host waits instead
  }
  // The block now lives at `to` (with its bytes, unless DataLoss): the old DataPtr must not free anything.
  void* pointer = reinterpret_cast<void*>(to);
  c10::DataPtr old = storage.set_data_ptr(c10::DataPtr(pointer, pointer, allocator_->raw_deleter(), data.device()));
  (void)old.release_context();
  return moved;
}

void CudaDeviceMemory::SetPressureHandler(PressureHandler* handler) {
  allocator_->SetPressureHandler(device_, handler);
}

void CudaDeviceMemory::SetPlacementForThisThread(Placement placement) { SetCudaPlacementForThisThread(placement); }

std::size_t CudaDeviceMemory::alignment() const { return arena_->alignment(); }

absl::Status CudaDeviceMemory::CopyAndWait(void* dst, const void* src, std::size_t nbytes, cuda::CopyKind kind) {
  if (nbytes == 0) return absl::OkStatus();
  cuda::CudaRuntime* runtime = allocator_->runtime();
  const cuda::ScopedDevice scoped(runtime, device_);
  if (!scoped.status().ok()) return scoped.status();
  const cudaStream_t stream = allocator_->CurrentStream(device_);
  // A device block another stream made (or last wrote) is read or overwritten only once that stream's work is done:
  // the current stream waits for it on the device (an event), the host does not.
  cuda::DeviceArena& device_arena = allocator_->Device(device_);
  const bool src_on_device = kind == cuda::CopyKind::kDeviceToHost || kind == cuda::CopyKind::kDeviceToDevice;
  const bool dst_on_device = kind == cuda::CopyKind::kHostToDevice || kind == cuda::CopyKind::kDeviceToDevice;
  for (const auto& [on_device, pointer] : {std::pair{src_on_device, src}, std::pair{dst_on_device, (const void*)dst}}) {
    if (!on_device) continue;
    absl::StatusOr<cudaStream_t> owner = device_arena.BlockStream(reinterpret_cast<std::uintptr_t>(pointer));
    if (!owner.ok() || *owner == stream) continue;
    absl::StatusOr<cudaEvent_t> event = runtime->EventCreate();
    if (!event.ok()) return event.status();
    absl::Status waited = runtime->EventRecord(*event, *owner);
    if (waited.ok()) waited = runtime->StreamWaitEvent(stream, *event);
    (void)runtime->EventDestroy(*event);  // legal with the wait pending, as in CUDA
    if (!waited.ok()) return waited;
  }
  if (absl::Status copied = runtime->MemcpyAsync(dst, src, nbytes, kind, stream); !copied.ok()) return copied;
  // Between two device blocks, stream order is enough: whatever reads `dst` next runs on this stream or waits for
  // it. Host memory is read or reused by the host as soon as this returns: wait for the copy.
  if (kind == cuda::CopyKind::kDeviceToDevice) return absl::OkStatus();
  return runtime->StreamSynchronize(stream);
}

absl::Status CudaDeviceMemory::Copy(void* dst, const void* src, std::size_t nbytes) {
  return CopyAndWait(dst, src, nbytes, cuda::CopyKind::kDeviceToDevice);
}

absl::Status CudaDeviceMemory::EnsureStaging(std::size_t nbytes) {
  if (nbytes <= staging_bytes_) return absl::OkStatus();
  cuda::CudaRuntime* runtime = allocator_->runtime();
  if (staging_ != nullptr) {
    if (absl::Status freed = runtime->HostFreePinned(staging_); !freed.ok()) return freed;
    staging_ = nullptr;
    staging_bytes_ = 0;
  }
  absl::StatusOr<void*> pinned = runtime->HostAllocPinned(nbytes);
  if (!pinned.ok()) return pinned.status();
  staging_ = *pinned;
  staging_bytes_ = nbytes;
  return absl::OkStatus();
}

absl::Status CudaDeviceMemory::CopyToHost(void* host, const void* src, std::size_t nbytes) {
  if (nbytes == 0) return absl::OkStatus();
  if (absl::Status staged = EnsureStaging(nbytes); !staged.ok()) return staged;
  if (absl::Status copied = CopyAndWait(staging_, src, nbytes, cuda::CopyKind::kDeviceToHost); !copied.ok()) {
    return copied;
  }
  std::memcpy(host, staging_, nbytes);
  return absl::OkStatus();
}

absl::Status CudaDeviceMemory::CopyFromHost(void* dst, const void* host, std::size_t nbytes) {
  if (nbytes == 0) return absl::OkStatus();
  if (absl::Status staged = EnsureStaging(nbytes); !staged.ok()) return staged;
  std::memcpy(staging_, host, nbytes);
  return CopyAndWait(dst, staging_, nbytes, cuda::CopyKind::kHostToDevice);
}

// ---- asynchronous paging (DevicePager) --------------------------------------------------------------------------

absl::StatusOr<cuda::CudaPager*> CudaDeviceMemory::Pager() {
  if (pager_ != nullptr) return pager_;
  absl::StatusOr<cuda::CudaPager*> shared = allocator_->Pager(device_);
  if (shared.ok()) return pager_ = *shared;
  if (!absl::IsFailedPrecondition(shared.status())) return shared.status();
  // No host budget on the allocator: a pool of our own, bounded by the engine's host budget instead.
  absl::StatusOr<std::unique_ptr<cuda::PinnedHostPool>> pool =
      cuda::PinnedHostPool::Create(allocator_->runtime(), std::numeric_limits<std::size_t>::max() / 2);
  if (!pool.ok()) return pool.status();
  absl::StatusOr<std::unique_ptr<cuda::CudaPager>> pager =
      cuda::CudaPager::Create(allocator_->runtime(), &allocator_->Device(device_), pool->get());
  if (!pager.ok()) return pager.status();
  own_pool_ = std::move(*pool);
  own_pager_ = std::move(*pager);
  return pager_ = own_pager_.get();
}

absl::StatusOr<DevicePager::Page> CudaDeviceMemory::PageOut(const void* src, std::size_t nbytes) {
  absl::StatusOr<cuda::CudaPager*> pager = Pager();
  if (!pager.ok()) return pager.status();
  return (*pager)->PageOut(reinterpret_cast<std::uintptr_t>(src), nbytes, allocator_->CurrentStream(device_));
}

absl::Status CudaDeviceMemory::PageIn(Page page, void* dst) {
  absl::StatusOr<cuda::CudaPager*> pager = Pager();
  if (!pager.ok()) return pager.status();
  return (*pager)->PageInto(page, reinterpret_cast<std::uintptr_t>(dst), allocator_->CurrentStream(device_));
}

absl::Status CudaDeviceMemory::WaitForPageIn(Page page) {
  absl::StatusOr<cuda::CudaPager*> pager = Pager();
  if (!pager.ok()) return pager.status();
  return (*pager)->WaitForPage(page, allocator_->CurrentStream(device_));
}

absl::Status CudaDeviceMemory::Release(Page page) {
  absl::StatusOr<cuda::CudaPager*> pager = Pager();
  if (!pager.ok()) return pager.status();
  return (*pager)->Release(page);
}

}  // namespace remat::integration
