// FakeCudaRuntime: see fake_cuda_runtime.h for the model.
//
// Handles are pointers to the double's own Stream/Event objects, cast to CUDA's opaque handle types; they are
// never dereferenced as CUDA objects. A work item is a copy or kernel (a function), an event record, or a wait.
#include "tests/cuda/fake_cuda_runtime.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace remat::cuda {

thread_local int FakeCudaRuntime::current_device_ = 0;

struct FakeCudaRuntime::Event {
  std::uint64_t recorded = 0;   // generation of the latest record
  std::uint64_t completed = 0;  // generation the stream has reached
  bool destroyed = false;
  Clock clock;                  // what the latest record is ordered after
  const void* stream = nullptr;  // the stream of the latest record
};

struct FakeCudaRuntime::Work {
  enum class Kind { kRun, kRecord, kWait } kind = Kind::kRun;
  std::function<void()> run;
  std::vector<std::pair<std::uintptr_t, std::size_t>> touches;  // memory a copy or declared kernel uses
  Event* event = nullptr;
  std::uint64_t generation = 0;
};

struct FakeCudaRuntime::Stream {
  std::deque<Work> queue;
  bool held = false;
  bool destroyed = false;
  Clock clock;                 // what its latest work is ordered after (itself included)
  std::uint64_t position = 0;  // of its latest work
};

FakeCudaRuntime::FakeCudaRuntime(FakeCudaOptions options) : options_(options) {
  device_used_.assign(static_cast<std::size_t>(std::max(options_.device_count, 0)), 0);
  streams_.push_back(std::make_unique<Stream>());
}

FakeCudaRuntime::~FakeCudaRuntime() {
  for (const auto& [address, allocation] : allocations_) std::free(reinterpret_cast<void*>(address));
  ReleaseVirtualMemory();
}

FakeCudaRuntime::Stream* FakeCudaRuntime::StreamOf(cudaStream_t stream) const {
  if (stream == nullptr) return streams_[0].get();
  for (const auto& s : streams_) {
    if (reinterpret_cast<cudaStream_t>(s.get()) == stream && !s->destroyed) return s.get();
  }
  return nullptr;
}

FakeCudaRuntime::Event* FakeCudaRuntime::EventOf(cudaEvent_t event) const {
  for (const auto& e : events_) {
    if (reinterpret_cast<cudaEvent_t>(e.get()) == event && !e->destroyed) return e.get();
  }
  return nullptr;
}

absl::StatusOr<int> FakeCudaRuntime::DeviceCount() { return options_.device_count; }

absl::StatusOr<int> FakeCudaRuntime::GetDevice() {
  if (options_.device_count <= 0) return absl::FailedPreconditionError("fake cuda: no CUDA-capable device");
  return current_device_;
}

absl::Status FakeCudaRuntime::SetDevice(int device) {
  if (device < 0 || device >= options_.device_count) {
    return absl::InvalidArgumentError(absl::StrCat("fake cuda: cudaSetDevice(", device, "): invalid device"));
  }
  current_device_ = device;
  return absl::OkStatus();
}

absl::StatusOr<DeviceMemoryInfo> FakeCudaRuntime::MemGetInfo() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (options_.device_count <= 0) return absl::FailedPreconditionError("fake cuda: no CUDA-capable device");
  const std::size_t used = device_used_[static_cast<std::size_t>(current_device_)];
  return DeviceMemoryInfo{options_.device_bytes - used, options_.device_bytes};
}

absl::StatusOr<void*> FakeCudaRuntime::DeviceMalloc(std::size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (options_.device_count <= 0) return absl::FailedPreconditionError("fake cuda: no CUDA-capable device");
  if (!fail_next_malloc_.empty()) {
    std::string message = std::exchange(fail_next_malloc_, "");
    return absl::ResourceExhaustedError(absl::StrCat("fake cuda: cudaMalloc(", bytes, "): ", message));
  }
  std::size_t& used = device_used_[static_cast<std::size_t>(current_device_)];
  if (bytes == 0 || bytes > options_.device_bytes - used) {
    return absl::ResourceExhaustedError(absl::StrCat("fake cuda: cudaMalloc(", bytes,
                                                     "): cudaErrorMemoryAllocation: out of memory"));
  }
  void* pointer = std::aligned_alloc(512, (bytes + 511) / 512 * 512);
  if (pointer == nullptr) return absl::ResourceExhaustedError("fake cuda: host memory exhausted");
  std::memset(pointer, 0xCD, bytes);  // device memory is not zeroed; make reads of stale data visible
  used += bytes;
  allocations_[reinterpret_cast<std::uintptr_t>(pointer)] = Allocation{bytes, current_device_};
  ++counters_.device_mallocs;
  return pointer;
}

absl::Status FakeCudaRuntime::DeviceFree(void* pointer) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  auto it = allocations_.find(reinterpret_cast<std::uintptr_t>(pointer));
  if (it == allocations_.end() || it->second.device < 0) {
    return absl::InvalidArgumentError("fake cuda: cudaFree of a pointer cudaMalloc did not return");
  }
  // cudaFree synchronizes the device: everything queued must have run first.
  Pump();
  ForgetAccesses(FakeRange{it->first, it->second.bytes});
  device_used_[static_cast<std::size_t>(it->second.device)] -= it->second.bytes;
  std::free(pointer);
  allocations_.erase(it);
  ++counters_.device_frees;
  return absl::OkStatus();
}

absl::StatusOr<void*> FakeCudaRuntime::HostAllocPinned(std::size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (bytes == 0) return absl::InvalidArgumentError("fake cuda: cudaHostAlloc(0)");
  void* pointer = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (pointer == nullptr) return absl::ResourceExhaustedError("fake cuda: cudaHostAlloc: out of memory");
  allocations_[reinterpret_cast<std::uintptr_t>(pointer)] = Allocation{bytes, -1};
  ++counters_.host_allocs;
  return pointer;
}

absl::Status FakeCudaRuntime::HostFreePinned(void* pointer) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  auto it = allocations_.find(reinterpret_cast<std::uintptr_t>(pointer));
  if (it == allocations_.end() || it->second.device >= 0) {
    return absl::InvalidArgumentError("fake cuda: cudaFreeHost of a pointer cudaHostAlloc did not return");
  }
  ForgetAccesses(FakeRange{it->first, it->second.bytes});  // cudaFreeHost synchronizes too
  std::free(pointer);
  allocations_.erase(it);
  ++counters_.host_frees;
  return absl::OkStatus();
}

bool FakeCudaRuntime::InAllocation(const void* pointer, std::size_t bytes, bool device) const {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  if (device && InMappedRange(address, bytes)) return true;
  auto it = allocations_.upper_bound(address);
  if (it == allocations_.begin()) return false;
  --it;
  if ((it->second.device >= 0) != device) return false;
  return address + bytes <= it->first + it->second.bytes;
}

absl::Status FakeCudaRuntime::MemcpyAsync(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                                          cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Stream* s = StreamOf(stream);
  if (s == nullptr) return absl::InvalidArgumentError("fake cuda: cudaMemcpyAsync on an unknown stream");
  bool dst_device = false;
  bool src_device = false;
  switch (kind) {
    case CopyKind::kHostToDevice: dst_device = true; break;
    case CopyKind::kDeviceToHost: src_device = true; break;
    case CopyKind::kDeviceToDevice: dst_device = src_device = true; break;
    case CopyKind::kDefault:
      dst_device = InAllocation(dst, bytes, true);
      src_device = InAllocation(src, bytes, true);
      break;
  }
  if (!InAllocation(dst, bytes, dst_device) || !InAllocation(src, bytes, src_device)) {
    return absl::InvalidArgumentError(absl::StrCat("fake cuda: cudaMemcpyAsync of ", bytes,
                                                   " bytes outside a live ", dst_device ? "device" : "pinned host",
                                                   " / ", src_device ? "device" : "pinned host", " allocation"));
  }
  if (!fail_next_copy_.empty()) {
    return absl::InternalError(absl::StrCat("fake cuda: cudaMemcpyAsync(", bytes, "): ",
                                            std::exchange(fail_next_copy_, "")));
  }
  ++counters_.copies;
  const std::uint64_t position = Tick(s);
  const std::string what = absl::StrCat("copy #", counters_.copies, " of ", bytes, " bytes");
  CheckAndRecord(s, position, FakeRange{reinterpret_cast<std::uintptr_t>(src), bytes}, false, what);
  CheckAndRecord(s, position, FakeRange{reinterpret_cast<std::uintptr_t>(dst), bytes}, true, what);
  Work work;
  // Checked again when it runs: the memory may have gone since (an unmap, a free) on a real device too.
  work.run = [this, dst, src, bytes, dst_device, src_device] {
    if (!InAllocation(dst, bytes, dst_device) || !InAllocation(src, bytes, src_device)) {
      ++counters_.faults;
      return;
    }
    std::memmove(dst, src, bytes);
  };
  work.touches = {{reinterpret_cast<std::uintptr_t>(dst), bytes}, {reinterpret_cast<std::uintptr_t>(src), bytes}};
  Enqueue(s, std::move(work));
  return absl::OkStatus();
}

absl::StatusOr<cudaStream_t> FakeCudaRuntime::StreamCreate() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  streams_.push_back(std::make_unique<Stream>());
  return reinterpret_cast<cudaStream_t>(streams_.back().get());
}

absl::Status FakeCudaRuntime::StreamDestroy(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Stream* s = StreamOf(stream);
  if (s == nullptr || stream == nullptr) return absl::InvalidArgumentError("fake cuda: cudaStreamDestroy of an unknown stream");
  // Like CUDA, queued work still runs; the handle becomes invalid at once.
  s->held = false;
  Pump();
  s->destroyed = true;
  return absl::OkStatus();
}

void FakeCudaRuntime::Enqueue(Stream* stream, Work work) {
  stream->queue.push_back(std::move(work));
  if (!stream->held) Pump();
}

bool FakeCudaRuntime::RunReady(Stream* stream) {
  bool ran = false;
  while (!stream->queue.empty()) {
    Work& work = stream->queue.front();
    if (work.kind == Work::Kind::kWait && work.event->completed < work.generation) break;
    Work done = std::move(work);
    stream->queue.pop_front();
    if (done.kind == Work::Kind::kRun) done.run();
    if (done.kind == Work::Kind::kRecord) done.event->completed = std::max(done.event->completed, done.generation);
    ran = true;
  }
  return ran;
}

void FakeCudaRuntime::Pump() {
  bool progress = true;
  while (progress) {
    progress = false;
    for (std::size_t i = 0; i < streams_.size(); ++i) {  // index: kernels may create streams
      Stream* s = streams_[i].get();
      if (!s->held && RunReady(s)) progress = true;
    }
  }
}

absl::Status FakeCudaRuntime::SyncUntil(const std::function<bool()>& done) {
  ++counters_.synchronizations;
  Pump();
  // The host waits for the GPU: held streams make progress too, one item at a time, until `done`.
  while (!done()) {
    bool progress = false;
    for (std::size_t i = 0; i < streams_.size() && !done(); ++i) {
      Stream* s = streams_[i].get();
      if (s->queue.empty()) continue;
      Work& work = s->queue.front();
      if (work.kind == Work::Kind::kWait && work.event->completed < work.generation) continue;
      Work item = std::move(work);
      s->queue.pop_front();
      if (item.kind == Work::Kind::kRun) item.run();
      if (item.kind == Work::Kind::kRecord) item.event->completed = std::max(item.event->completed, item.generation);
      progress = true;
      Pump();
    }
    if (!progress) return absl::InternalError("fake cuda: synchronization would wait forever (a wait on an event "
                                              "that is never recorded)");
  }
  return absl::OkStatus();
}

absl::Status FakeCudaRuntime::StreamSynchronize(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Stream* s = StreamOf(stream);
  if (s == nullptr) return absl::InvalidArgumentError("fake cuda: cudaStreamSynchronize of an unknown stream");
  ++host_waits_[s];
  HostLearns(s->clock);
  return SyncUntil([s] { return s->queue.empty(); });
}

absl::StatusOr<bool> FakeCudaRuntime::StreamQuery(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Stream* s = StreamOf(stream);
  if (s == nullptr) return absl::InvalidArgumentError("fake cuda: cudaStreamQuery of an unknown stream");
  if (s->queue.empty()) HostLearns(s->clock);
  return s->queue.empty();
}

absl::Status FakeCudaRuntime::StreamWaitEvent(cudaStream_t stream, cudaEvent_t event) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Stream* s = StreamOf(stream);
  Event* e = EventOf(event);
  if (s == nullptr || e == nullptr) return absl::InvalidArgumentError("fake cuda: cudaStreamWaitEvent: unknown handle");
  ++counters_.stream_waits;
  Merge(s->clock, e->clock);
  Work work;
  work.kind = Work::Kind::kWait;
  work.event = e;
  work.generation = e->recorded;  // waits for the most recent record at the time of the call
  Enqueue(s, std::move(work));
  return absl::OkStatus();
}

absl::StatusOr<cudaEvent_t> FakeCudaRuntime::EventCreate() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  events_.push_back(std::make_unique<Event>());
  ++counters_.events_created;
  return reinterpret_cast<cudaEvent_t>(events_.back().get());
}

absl::Status FakeCudaRuntime::EventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Stream* s = StreamOf(stream);
  Event* e = EventOf(event);
  if (s == nullptr || e == nullptr) return absl::InvalidArgumentError("fake cuda: cudaEventRecord: unknown handle");
  Tick(s);
  e->clock = s->clock;
  e->stream = s;
  Work work;
  work.kind = Work::Kind::kRecord;
  work.event = e;
  work.generation = ++e->recorded;
  Enqueue(s, std::move(work));
  return absl::OkStatus();
}

absl::StatusOr<bool> FakeCudaRuntime::EventQuery(cudaEvent_t event) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Event* e = EventOf(event);
  if (e == nullptr) return absl::InvalidArgumentError("fake cuda: cudaEventQuery of an unknown event");
  if (e->completed >= e->recorded) HostLearns(e->clock);
  return e->completed >= e->recorded;
}

absl::Status FakeCudaRuntime::EventSynchronize(cudaEvent_t event) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Event* e = EventOf(event);
  if (e == nullptr) return absl::InvalidArgumentError("fake cuda: cudaEventSynchronize of an unknown event");
  const std::uint64_t target = e->recorded;
  ++host_waits_[e->stream];
  HostLearns(e->clock);
  return SyncUntil([e, target] { return e->completed >= target; });
}

absl::Status FakeCudaRuntime::EventDestroy(cudaEvent_t event) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Event* e = EventOf(event);
  if (e == nullptr) return absl::InvalidArgumentError("fake cuda: cudaEventDestroy of an unknown event");
  // Pending records and waits keep the object (it is never freed before the runtime); the handle dies now.
  e->destroyed = true;
  ++counters_.events_destroyed;
  return absl::OkStatus();
}

absl::Status FakeCudaRuntime::DeviceSynchronize() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  ++counters_.device_synchronizations;
  for (const auto& s : streams_) {
    ++host_waits_[s.get()];
    HostLearns(s->clock);
  }
  return SyncUntil([this] {
    for (const auto& s : streams_) {
      if (!s->queue.empty()) return false;
    }
    return true;
  });
}

// Used by UnmapPhysical (fake_cuda_vmm.cc): streams' queues live here.
bool FakeCudaRuntime::QueuedWorkTouches(std::uintptr_t address, std::size_t bytes) const {
  for (const auto& s : streams_) {
    for (const Work& work : s->queue) {
      for (const auto& [at, size] : work.touches) {
        if (at < address + bytes && address < at + size) return true;
      }
    }
  }
  return false;
}

void FakeCudaRuntime::HoldStream(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (Stream* s = StreamOf(stream)) s->held = true;
}

void FakeCudaRuntime::ReleaseStream(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (Stream* s = StreamOf(stream)) {
    s->held = false;
    Pump();
  }
}

void FakeCudaRuntime::Launch(cudaStream_t stream, std::function<void()> kernel) {
  Launch(stream, 0, 0, std::move(kernel));
}

void FakeCudaRuntime::Launch(cudaStream_t stream, std::uintptr_t address, std::size_t bytes,
                             std::function<void()> kernel) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Stream* s = StreamOf(stream);
  if (s == nullptr) std::abort();  // a test bug
  Tick(s);
  Work work;
  work.run = std::move(kernel);
  if (bytes > 0) work.touches = {{address, bytes}};
  Enqueue(s, std::move(work));
}

void FakeCudaRuntime::LaunchKernel(cudaStream_t stream, const std::vector<FakeRange>& reads,
                                   const std::vector<FakeRange>& writes, const std::string& name) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Stream* s = StreamOf(stream);
  if (s == nullptr) std::abort();  // a test bug
  ++counters_.checked_kernels;
  const std::uint64_t position = Tick(s);
  for (const FakeRange& range : reads) CheckAndRecord(s, position, range, false, name);
  for (const FakeRange& range : writes) CheckAndRecord(s, position, range, true, name);
  Work work;
  work.run = [] {};
  Enqueue(s, std::move(work));
}

// Ordering: see the header. Vector clocks over streams; the host's clock is what it has seen complete.
std::uint64_t FakeCudaRuntime::Tick(Stream* stream) {
  Merge(stream->clock, host_clock_);
  stream->clock[stream] = ++stream->position;
  return stream->position;
}

void FakeCudaRuntime::Merge(Clock& into, const Clock& from) {
  for (const auto& [stream, position] : from) {
    std::uint64_t& mine = into[stream];
    mine = std::max(mine, position);
  }
}

void FakeCudaRuntime::HostLearns(const Clock& clock) { Merge(host_clock_, clock); }

bool FakeCudaRuntime::Tracked(const FakeRange& range) const {
  return range.bytes > 0 && (InAllocation(reinterpret_cast<const void*>(range.address), range.bytes, true) ||
                             InAllocation(reinterpret_cast<const void*>(range.address), range.bytes, false));
}

void FakeCudaRuntime::ForgetAccesses(const FakeRange& range) {
  std::erase_if(accesses_, [&](const Access& a) {
    return a.range.address < range.address + range.bytes && range.address < a.range.address + a.range.bytes;
  });
}

void FakeCudaRuntime::CheckAndRecord(Stream* stream, std::uint64_t position, const FakeRange& range, bool write,
                                     const std::string& what) {
  if (!Tracked(range)) return;
  auto ordered_after = [&](const Access& a) {
    if (a.stream == stream) return true;
    auto it = stream->clock.find(a.stream);
    return it != stream->clock.end() && it->second >= a.position;
  };
  std::vector<Access> kept;
  kept.reserve(accesses_.size() + 1);
  for (Access& a : accesses_) {
    const bool overlaps =
        a.range.address < range.address + range.bytes && range.address < a.range.address + a.range.bytes;
    if (overlaps && (write || a.write) && !ordered_after(a)) {
      ++counters_.races;
      if (race_log_.size() < 100) {
        race_log_.push_back(absl::StrCat(what, (write ? " writes " : " reads "), range.bytes, " bytes at ",
                                         absl::Hex(range.address), " unordered after ", a.what,
                                         (a.write ? " (wrote " : " (read "), a.range.bytes, " bytes at ",
                                         absl::Hex(a.range.address), ")"));
      }
    }
    // Superseded: covered by this access, which is ordered after it and conflicts with whatever it conflicts with.
    const bool covered = a.range.address >= range.address &&
                         a.range.address + a.range.bytes <= range.address + range.bytes;
    if (covered && ordered_after(a) && (write || !a.write)) continue;
    kept.push_back(std::move(a));
  }
  kept.push_back(Access{range, write, stream, position, what});
  accesses_ = std::move(kept);
}

std::vector<std::string> FakeCudaRuntime::races() const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return race_log_;
}

std::uint64_t FakeCudaRuntime::host_waits_for(cudaStream_t stream) const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  const Stream* s = StreamOf(stream);
  auto it = host_waits_.find(s);
  return it == host_waits_.end() ? 0 : it->second;
}

std::size_t FakeCudaRuntime::PendingWork(cudaStream_t stream) const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  Stream* s = StreamOf(stream);
  return s == nullptr ? 0 : s->queue.size();
}

void FakeCudaRuntime::FailNextDeviceMalloc(std::string message) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  fail_next_malloc_ = message.empty() ? "injected failure" : std::move(message);
}

void FakeCudaRuntime::FailNextCopy(std::string message) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  fail_next_copy_ = message.empty() ? "injected failure" : std::move(message);
}

FakeCudaCounters FakeCudaRuntime::counters() const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return counters_;
}

std::size_t FakeCudaRuntime::live_device_allocations() const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return static_cast<std::size_t>(
      std::count_if(allocations_.begin(), allocations_.end(), [](const auto& a) { return a.second.device >= 0; }));
}

std::size_t FakeCudaRuntime::live_host_allocations() const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return static_cast<std::size_t>(
      std::count_if(allocations_.begin(), allocations_.end(), [](const auto& a) { return a.second.device < 0; }));
}

std::size_t FakeCudaRuntime::live_events() const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return static_cast<std::size_t>(
      std::count_if(events_.begin(), events_.end(), [](const auto& e) { return !e->destroyed; }));
}

std::size_t FakeCudaRuntime::device_bytes_in_use(int device) const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return device_used_[static_cast<std::size_t>(device)];
}

}  // namespace remat::cuda
