// CudaPager: see pager.h. Each page keeps one event recorded on the copy stream after its latest copy; ordering
// between streams is always "record an event on the stream whose work must come first, make the other wait".
#include "allocator/cuda/pager.h"

#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace remat::cuda {
namespace {

enum class PageState { kOut, kIn };

struct Page {
  std::uintptr_t host = 0;  // 0 once handed back to the pool
  std::size_t bytes = 0;
  cudaEvent_t copied = nullptr;  // recorded on the copy stream after the latest copy
  PageState state = PageState::kOut;
};

}  // namespace

struct CudaPager::State {
  CudaRuntime* runtime = nullptr;
  DeviceArena* device = nullptr;
  PinnedHostPool* host = nullptr;
  cudaStream_t copy = nullptr;
  std::mutex mu;
  absl::flat_hash_map<PageId, Page> pages;
  PageId next = 1;
  PagerStats stats;

  // The copy stream waits for the work queued on `stream` so far.
  absl::Status CopyWaitsFor(cudaStream_t stream) {
    absl::StatusOr<cudaEvent_t> event = runtime->EventCreate();
    if (!event.ok()) return event.status();
    absl::Status status = runtime->EventRecord(*event, stream);
    if (status.ok()) status = runtime->StreamWaitEvent(copy, *event);
    (void)runtime->EventDestroy(*event);  // legal with the wait pending, as in CUDA
    return status;
  }

  // A fresh event on the copy stream, handed to the host pool to free `page`'s host block after it.
  absl::Status FreeHostAfterCopies(Page& page) {
    if (page.host == 0) return absl::OkStatus();
    absl::StatusOr<cudaEvent_t> event = runtime->EventCreate();
    if (!event.ok()) return event.status();
    absl::Status status = runtime->EventRecord(*event, copy);
    if (!status.ok()) {
      (void)runtime->EventDestroy(*event);
      return status;
    }
    status = host->FreeAfter(page.host, *event);
    page.host = 0;
    return status;
  }
};

CudaPager::CudaPager(std::unique_ptr<State> state) : state_(std::move(state)) {}

CudaPager::~CudaPager() {
  State& s = *state_;
  ScopedDevice device(s.runtime, s.device->device());
  (void)s.runtime->StreamSynchronize(s.copy);
  for (auto& [id, page] : s.pages) {
    if (page.host != 0) (void)s.host->Free(page.host);
    (void)s.runtime->EventDestroy(page.copied);
  }
  (void)s.runtime->StreamDestroy(s.copy);
}

absl::StatusOr<std::unique_ptr<CudaPager>> CudaPager::Create(CudaRuntime* runtime, DeviceArena* device,
                                                             PinnedHostPool* host) {
  if (runtime == nullptr || device == nullptr || host == nullptr) {
    return absl::InvalidArgumentError("remat: CudaPager needs a runtime, a device arena and a host pool");
  }
  auto state = std::make_unique<State>();
  state->runtime = runtime;
  state->device = device;
  state->host = host;
  ScopedDevice guard(runtime, device->device());
  if (!guard.status().ok()) return guard.status();
  absl::StatusOr<cudaStream_t> copy = runtime->StreamCreate();
  if (!copy.ok()) return copy.status();
  state->copy = *copy;
  return std::unique_ptr<CudaPager>(new CudaPager(std::move(state)));
}

absl::StatusOr<PageId> CudaPager::PageOut(std::uintptr_t address, std::size_t bytes, cudaStream_t producer) {
  State& s = *state_;
  absl::StatusOr<std::size_t> block = s.device->BlockSize(address);
  if (!block.ok() || *block < bytes) {
    return absl::InvalidArgumentError(absl::StrCat("remat: page out of ", bytes, " bytes at ", absl::Hex(address),
                                                   ", which is not a live device block that large"));
  }
  absl::StatusOr<std::uintptr_t> host = s.host->Allocate(bytes);
  if (!host.ok()) return host.status();
  std::lock_guard<std::mutex> lock(s.mu);
  ScopedDevice device(s.runtime, s.device->device());
  absl::Status status = device.status();
  if (status.ok()) status = s.CopyWaitsFor(producer);
  if (status.ok()) {
    status = s.runtime->MemcpyAsync(reinterpret_cast<void*>(*host), reinterpret_cast<const void*>(address), bytes,
                                    CopyKind::kDeviceToHost, s.copy);
  }
  absl::StatusOr<cudaEvent_t> event = absl::InternalError("not created");
  if (status.ok()) {
    event = s.runtime->EventCreate();
    status = event.status();
  }
  if (status.ok()) status = s.runtime->EventRecord(*event, s.copy);
  if (status.ok()) status = s.device->RecordStream(address, s.copy);
  if (!status.ok()) {
    if (event.ok()) (void)s.runtime->EventDestroy(*event);
    (void)s.runtime->StreamSynchronize(s.copy);  // nothing may still write the host block
    (void)s.host->Free(*host);
    return status;
  }
  const PageId id = s.next++;
  s.pages[id] = Page{*host, bytes, *event, PageState::kOut};
  ++s.stats.pages_out;
  s.stats.bytes_out += bytes;
  return id;
}

absl::StatusOr<std::uintptr_t> CudaPager::PageIn(PageId id, cudaStream_t consumer, Placement placement) {
  State& s = *state_;
  std::size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.pages.find(id);
    if (it == s.pages.end()) return absl::NotFoundError(absl::StrCat("remat: no page ", id));
    if (it->second.state != PageState::kOut) {
      return absl::FailedPreconditionError(absl::StrCat("remat: page ", id, " is already paged in"));
    }
    bytes = it->second.bytes;
  }
  // Outside our lock: the device arena may call the runtime's pressure handler, which may page out.
  absl::StatusOr<std::uintptr_t> address = s.device->Allocate(bytes, consumer, placement);
  if (!address.ok()) return address.status();
  absl::Status status = PageInto(id, *address, consumer);
  // The caller may free the block before waiting for the page: it is not reused before the copy has written it.
  if (status.ok()) status = s.device->RecordStream(*address, s.copy);
  if (!status.ok()) {
    (void)s.runtime->StreamSynchronize(s.copy);
    (void)s.device->Free(*address);
    return status;
  }
  return *address;
}

absl::Status CudaPager::PageInto(PageId id, std::uintptr_t address, cudaStream_t consumer) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.pages.find(id);
  if (it == s.pages.end()) return absl::NotFoundError(absl::StrCat("remat: no page ", id));
  if (it->second.state != PageState::kOut) {
    return absl::FailedPreconditionError(absl::StrCat("remat: page ", id, " is already paged in"));
  }
  Page& page = it->second;
  const std::size_t bytes = page.bytes;
  absl::StatusOr<std::size_t> block = s.device->BlockSize(address);
  if (!block.ok() || *block < bytes) {
    return absl::InvalidArgumentError(absl::StrCat("remat: page-in of ", bytes, " bytes into ", absl::Hex(address),
                                                   ", which is not a live device block that large"));
  }
  ScopedDevice device(s.runtime, s.device->device());
  absl::Status status = device.status();
  // The block may be memory that work queued on `consumer` just freed: the copy starts after that work.
  if (status.ok()) status = s.CopyWaitsFor(consumer);
  if (status.ok()) {
    // Copy-out of this page ran earlier on the same stream: stream order covers it.
    status = s.runtime->MemcpyAsync(reinterpret_cast<void*>(address), reinterpret_cast<const void*>(page.host),
                                    bytes, CopyKind::kHostToDevice, s.copy);
  }
  if (status.ok()) status = s.runtime->EventRecord(page.copied, s.copy);
  if (!status.ok()) {
    (void)s.runtime->StreamSynchronize(s.copy);  // nothing may still write the block the caller gets back
    return status;
  }
  page.state = PageState::kIn;
  status = s.FreeHostAfterCopies(page);
  ++s.stats.pages_in;
  s.stats.bytes_in += bytes;
  return status;
}

absl::Status CudaPager::WaitForPage(PageId id, cudaStream_t stream) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.pages.find(id);
  if (it == s.pages.end()) return absl::NotFoundError(absl::StrCat("remat: no page ", id));
  if (it->second.state != PageState::kIn) {
    return absl::FailedPreconditionError(absl::StrCat("remat: page ", id, " is not paged in; call PageIn first"));
  }
  ScopedDevice device(s.runtime, s.device->device());
  if (!device.status().ok()) return device.status();
  return s.runtime->StreamWaitEvent(stream, it->second.copied);
}

absl::StatusOr<bool> CudaPager::CopyDone(PageId id) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.pages.find(id);
  if (it == s.pages.end()) return absl::NotFoundError(absl::StrCat("remat: no page ", id));
  return s.runtime->EventQuery(it->second.copied);
}

absl::Status CudaPager::Release(PageId id) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.pages.find(id);
  if (it == s.pages.end()) return absl::NotFoundError(absl::StrCat("remat: no page ", id));
  ScopedDevice device(s.runtime, s.device->device());
  absl::Status status = s.FreeHostAfterCopies(it->second);
  (void)s.runtime->EventDestroy(it->second.copied);
  s.pages.erase(it);
  return status;
}

cudaStream_t CudaPager::copy_stream() const { return state_->copy; }

PagerStats CudaPager::Stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  PagerStats out = state_->stats;
  out.pages_held = state_->pages.size();
  return out;
}

}  // namespace remat::cuda
