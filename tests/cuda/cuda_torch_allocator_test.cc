// RematCudaAllocator (remat as torch's CUDA allocator) over the test double: c10's allocator interface, stats as
// torch.cuda reads them, stream-ordered reuse through recordStream, OutOfMemoryError, eviction through the
// pressure handler (simulated eviction, with and without pending stream-ordered frees), paging round trip,
// installation into c10 (and the calls torch.cuda's memory functions make through it), and the unsupported
// features' messages.
// Streams are the double's handles wrapped with c10::cuda::getStreamFromExternal (which touches no driver); the
// allocator gets their handles back through the injected CudaStreams, never through CUDAStream::stream().
#include "integration/cuda/cuda_allocator.h"

#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "tests/cuda/fake_cuda_runtime.h"
#include "integration/memory_events.h"

namespace remat::integration {
namespace {

using ::testing::HasSubstr;
namespace cca = c10::cuda::CUDACachingAllocator;

constexpr std::size_t kBudget = 1 << 20;

struct Fixture {
  cuda::FakeCudaRuntime rt{cuda::FakeCudaOptions{2, std::size_t{64} << 20}};
  cudaStream_t current = nullptr;  // what torch would call the current stream
  std::map<c10::StreamId, cudaStream_t> handles;
  c10::cuda::CUDAStream Wrap(cudaStream_t stream) {
    c10::cuda::CUDAStream wrapped = c10::cuda::getStreamFromExternal(stream, 0);
    handles[wrapped.id()] = stream;
    return wrapped;
  }
  std::unique_ptr<RematCudaAllocator> allocator;
  explicit Fixture(std::size_t budget = kBudget, std::size_t host_budget = 8 << 20,
                   cuda::DeviceArenaKind arena = cuda::DeviceArenaKind::kContiguous) {
    CudaAllocatorOptions options;
    options.budget = budget;
    options.host_budget = host_budget;
    options.arena = arena;
    CudaStreams streams;
    streams.current = [this](c10::DeviceIndex) { return current; };
    // CUDAStream::stream() would initialize the driver: the test maps c10 stream ids to the double's handles.
    streams.handle = [this](const c10::cuda::CUDAStream& s) { return handles.at(s.id()); };
    allocator = std::make_unique<RematCudaAllocator>(&rt, options, std::move(streams));
  }
  std::int64_t Allocated(c10::DeviceIndex device = 0) {
    return allocator->getDeviceStats(device).allocated_bytes[0].current;
  }
};

template <typename F>
std::string ErrorOf(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(CudaTorchAllocator, AllocateAndFreeWithStats) {
  Fixture f;
  EXPECT_EQ(f.allocator->name(), "remat");
  {
    c10::DataPtr a = f.allocator->allocate(1000);
    c10::DataPtr b = f.allocator->allocate(5000);
    ASSERT_NE(a.get(), nullptr);
    EXPECT_EQ(a.get(), a.get_context());
    EXPECT_EQ(a.device(), c10::Device(c10::DeviceType::CUDA, 0));
    EXPECT_EQ(a.get_deleter(), f.allocator->raw_deleter());
    const auto stats = f.allocator->getDeviceStats(0);
    EXPECT_EQ(stats.allocated_bytes[0].current, 1024 + 5120);   // memory_allocated
    EXPECT_EQ(stats.reserved_bytes[0].current, kBudget);         // memory_reserved: the budget, one segment
    EXPECT_EQ(stats.requested_bytes[0].current, 6000);
    EXPECT_EQ(stats.allocation[0].current, 2);
    EXPECT_EQ(stats.segment[0].current, 1);
    std::size_t largest = 0;
    f.allocator->cacheInfo(0, &largest);
    EXPECT_EQ(largest, kBudget - 6144);
  }
  const auto stats = f.allocator->getDeviceStats(0);
  EXPECT_EQ(stats.allocated_bytes[0].current, 0);
  EXPECT_EQ(stats.allocated_bytes[0].peak, 6144);                // max_memory_allocated
  f.allocator->resetPeakStats(0);                                // reset_peak_memory_stats
  EXPECT_EQ(f.allocator->getDeviceStats(0).allocated_bytes[0].peak, 0);
  f.allocator->resetAccumulatedStats(0);
  EXPECT_EQ(f.allocator->getDeviceStats(0).allocation[0].allocated, 0);
  f.allocator->emptyCache();                                     // empty_cache: nothing allocated, segment goes
  EXPECT_EQ(f.allocator->getDeviceStats(0).reserved_bytes[0].current, 0);
  EXPECT_EQ(f.rt.live_device_allocations(), 0u);
  std::size_t largest = 0;
  f.allocator->cacheInfo(0, &largest);
  EXPECT_EQ(largest, kBudget);
}

TEST(CudaTorchAllocator, ZeroBytesAndRawAlloc) {
  Fixture f;
  c10::DataPtr empty = f.allocator->allocate(0);
  EXPECT_EQ(empty.get(), nullptr);
  void* p = f.allocator->raw_alloc(4096);
  void* q = f.allocator->raw_alloc_with_stream(4096, nullptr);
  EXPECT_EQ(f.Allocated(), 8192);
  std::size_t size = 0;
  EXPECT_EQ(f.allocator->getBaseAllocation(static_cast<char*>(q) + 10, &size), f.allocator->getBaseAllocation(p, nullptr));
  EXPECT_EQ(size, kBudget);
  f.allocator->raw_delete(p);
  f.allocator->raw_delete(q);
  EXPECT_EQ(f.Allocated(), 0);
}

TEST(CudaTorchAllocator, AllocatesOnTheCurrentDevice) {
  Fixture f;
  ASSERT_TRUE(f.rt.SetDevice(1).ok());
  c10::DataPtr a = f.allocator->allocate(512);
  EXPECT_EQ(a.device().index(), 1);
  EXPECT_EQ(f.Allocated(1), 512);
  EXPECT_EQ(f.Allocated(0), 0);
  ASSERT_TRUE(f.rt.SetDevice(0).ok());
  EXPECT_THAT(ErrorOf([&] { f.allocator->getDeviceStats(5); }), HasSubstr("invalid CUDA device 5"));
}

TEST(CudaTorchAllocator, RecordStreamDelaysReuseUntilTheUseFinishes) {
  Fixture f(4096);
  cudaStream_t side = *f.rt.StreamCreate();
  c10::cuda::CUDAStream side_stream = f.Wrap(side);
  void* x = nullptr;
  bool use_done = false;
  {
    c10::DataPtr a = f.allocator->allocate(2048);
    x = a.get();
    f.allocator->recordStream(a, side_stream);  // tensor.record_stream(side)
    f.rt.HoldStream(side);
    f.rt.Launch(side, [&] { use_done = true; });
  }  // freed on the current stream while side still uses it
  EXPECT_EQ(f.allocator->getDeviceStats(0).active_bytes[0].current, 2048);
  c10::DataPtr b = f.allocator->allocate(2048);
  EXPECT_NE(b.get(), x);  // the other half of the budget, not the block in use
  EXPECT_FALSE(use_done);
  // Only x's memory is left: it is reused in the current stream's order, after side's use (on the device: the host
  // does not wait, and the current stream's next kernel runs only once side's use has).
  c10::DataPtr c = f.allocator->allocate(2048);
  EXPECT_EQ(c.get(), x);
  EXPECT_FALSE(use_done);
  bool next_saw_use_done = false;
  f.rt.Launch(f.current, [&] { next_saw_use_done = use_done; });
  f.rt.ReleaseStream(side);
  EXPECT_TRUE(next_saw_use_done);
  EXPECT_EQ(f.allocator->getDeviceStats(0).num_sync_all_streams, 0);
  // A DataPtr that is not ours is ignored, as PyTorch's allocator does.
  c10::DataPtr foreign(reinterpret_cast<void*>(0x1000), c10::Device(c10::DeviceType::CUDA, 0));
  f.allocator->recordStream(foreign, side_stream);
}

TEST(CudaTorchAllocator, OutOfBudgetRaisesOutOfMemoryErrorNamingTheRequest) {
  Fixture f(4096);
  c10::DataPtr a = f.allocator->allocate(3000);
  int observed = 0;
  f.allocator->attachOutOfMemoryObserver([&](std::int64_t device, std::size_t allocated, std::size_t total,
                                             std::size_t) {
    ++observed;
    EXPECT_EQ(device, 0);
    EXPECT_EQ(allocated, 3072u);
    EXPECT_EQ(total, 4096u);
  });
  try {
    (void)f.allocator->allocate(2000);
    FAIL() << "expected OutOfMemoryError";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("tried to allocate 2000 bytes (2048 aligned)"));
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("budget 4096 bytes"));
  }
  EXPECT_EQ(observed, 1);
  EXPECT_EQ(f.allocator->getDeviceStats(0).num_ooms, 1);
}

// A stitching arena through torch's interface (issue 18): memory_reserved is the budget (what may be mapped), a
// request larger than any hole fits once enough granules are free, and out of memory names physical bytes.
TEST(CudaTorchAllocator, AStitchingArenaServesAcrossHolesAndReportsPhysicalBytes) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  Fixture f(8 * kMiB, 0, cuda::DeviceArenaKind::kStitch);
  std::vector<c10::DataPtr> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(f.allocator->allocate(2 * kMiB));
  blocks[0].clear();
  blocks[2].clear();
  c10::DataPtr big = f.allocator->allocate(4 * kMiB);  // no 4 MiB hole: two free granules of 2 MiB
  ASSERT_NE(big.get(), nullptr);
  const auto stats = f.allocator->getDeviceStats(0);
  EXPECT_EQ(stats.reserved_bytes[0].current, static_cast<std::int64_t>(8 * kMiB));
  EXPECT_EQ(stats.allocated_bytes[0].current, static_cast<std::int64_t>(8 * kMiB));
  EXPECT_TRUE(f.allocator->Device(0).Stats().stitched);
  EXPECT_EQ(f.rt.device_bytes_in_use(0), 8 * kMiB);
  const std::string error = ErrorOf([&] { (void)f.allocator->allocate(kMiB); });
  EXPECT_THAT(error, HasSubstr("tried to allocate 1048576 bytes"));
  EXPECT_THAT(error, HasSubstr("budget 8388608 bytes of physical memory in 2097152-byte granules, mapped 8388608"));
  // The snapshot's segments are the mapped granules (8 MiB), not the reserved address space (64 MiB).
  blocks[3].clear();
  const cca::SnapshotInfo info = f.allocator->snapshot();
  std::size_t total = 0, allocated = 0;
  for (const auto& segment : info.segments) {
    total += segment.total_size;
    allocated += segment.allocated_size;
    std::size_t sum = 0;
    for (const auto& block : segment.blocks) sum += block.size;
    EXPECT_EQ(sum, segment.total_size);
  }
  EXPECT_EQ(total, 6 * kMiB);
  EXPECT_EQ(allocated, 6 * kMiB);
  EXPECT_EQ(f.allocator->Device(0).Stats().physical_bytes, 6 * kMiB);
}

// What the engine does under pressure, simulated: evicting a storage drops its DataPtr, which frees the block.
class EvictOne final : public PressureHandler {
 public:
  explicit EvictOne(std::vector<c10::DataPtr>* victims) : victims_(victims) {}
  absl::StatusOr<bool> MakeRoom(Arena& arena, std::size_t bytes) override {
    ++calls;
    last_arena = &arena;
    last_request = bytes;
    if (victims_->empty()) return false;
    victims_->pop_back();  // dropping the DataPtr frees the block, as evicting a storage does
    return true;
  }
  int calls = 0;
  Arena* last_arena = nullptr;
  std::size_t last_request = 0;

 private:
  std::vector<c10::DataPtr>* victims_;
};

TEST(CudaTorchAllocator, PressureHandlerEvictsWhenTheBudgetIsFull) {
  Fixture f(4096);
  std::vector<c10::DataPtr> evictable;
  evictable.push_back(f.allocator->allocate(2048));
  evictable.push_back(f.allocator->allocate(2048));
  void* victim = evictable.back().get();
  EvictOne handler(&evictable);
  f.allocator->SetPressureHandler(0, &handler);
  c10::DataPtr fresh = f.allocator->allocate(2000);
  EXPECT_EQ(fresh.get(), victim);  // the evicted block's memory
  EXPECT_EQ(handler.calls, 1);
  EXPECT_EQ(handler.last_request, 2048u);  // aligned
  EXPECT_EQ(handler.last_arena, f.allocator->Device(0).arena());
  EXPECT_EQ(evictable.size(), 1u);
  const auto stats = f.allocator->getDeviceStats(0);
  EXPECT_EQ(stats.num_alloc_retries, 1);
  EXPECT_EQ(stats.num_ooms, 0);
  EXPECT_EQ(stats.allocated_bytes[0].current, 4096);
  EXPECT_EQ(stats.allocated_bytes[0].peak, 4096);
  // Only device 0 has the handler: device 1 fails without asking it.
  ASSERT_TRUE(f.rt.SetDevice(1).ok());
  c10::DataPtr full = f.allocator->allocate(4096);
  EXPECT_THROW((void)f.allocator->allocate(512), c10::OutOfMemoryError);
  EXPECT_EQ(handler.calls, 1);
  ASSERT_TRUE(f.rt.SetDevice(0).ok());
  f.allocator->SetPressureHandler(0, nullptr);
}

TEST(CudaTorchAllocator, HandlerThatFreesNothingGivesOutOfMemoryErrorWithTheNumbers) {
  Fixture f(4096);
  c10::DataPtr a = f.allocator->allocate(3000);
  std::vector<c10::DataPtr> nothing;
  EvictOne handler(&nothing);
  f.allocator->SetPressureHandler(0, &handler);
  try {
    (void)f.allocator->allocate(2000);
    FAIL() << "expected OutOfMemoryError";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_THAT(message, HasSubstr("tried to allocate 2000 bytes (2048 aligned)"));
    EXPECT_THAT(message, HasSubstr("budget 4096 bytes, allocated 3072"));
    EXPECT_THAT(message, HasSubstr("largest free block 1024"));
    EXPECT_THAT(message, HasSubstr("the pressure handler freed nothing after 1 round(s)"));
  }
  EXPECT_EQ(handler.calls, 1);
  // Larger than the whole budget: evicting everything would not help, so the handler is not asked.
  EXPECT_THAT(ErrorOf([&] { (void)f.allocator->allocate(8192); }), HasSubstr("larger than any segment"));
  EXPECT_EQ(handler.calls, 1);
  const auto stats = f.allocator->getDeviceStats(0);
  EXPECT_EQ(stats.num_ooms, 2);
  EXPECT_EQ(stats.allocated_bytes[0].current, 3072);  // the failures changed nothing
  f.allocator->SetPressureHandler(0, nullptr);
}

TEST(CudaTorchAllocator, PendingStreamFreesAreTakenBackBeforeTheHandlerIsAsked) {
  Fixture f(4096);
  cudaStream_t side = *f.rt.StreamCreate();
  c10::cuda::CUDAStream side_stream = f.Wrap(side);
  std::vector<c10::DataPtr> evictable;
  evictable.push_back(f.allocator->allocate(2048));
  EvictOne handler(&evictable);
  f.allocator->SetPressureHandler(0, &handler);
  bool use_done = false;
  void* x = nullptr;
  {
    c10::DataPtr a = f.allocator->allocate(2048);
    x = a.get();
    f.allocator->recordStream(a, side_stream);
    f.rt.HoldStream(side);
    f.rt.Launch(side, [&] { use_done = true; });
  }  // pending: side still uses it
  EXPECT_EQ(f.allocator->getDeviceStats(0).active_bytes[0].current, 4096);
  c10::DataPtr b = f.allocator->allocate(2048);
  EXPECT_EQ(b.get(), x);          // the pending block, in the current stream's order after side's use
  EXPECT_EQ(handler.calls, 0);    // taking it back was enough: nothing was evicted
  EXPECT_EQ(evictable.size(), 1u);
  EXPECT_EQ(f.allocator->getDeviceStats(0).num_sync_all_streams, 0);  // the host did not wait
  bool next_saw_use_done = false;
  f.rt.Launch(f.current, [&] { next_saw_use_done = use_done; });
  EXPECT_FALSE(use_done);
  f.rt.ReleaseStream(side);
  EXPECT_TRUE(next_saw_use_done);
  f.allocator->SetPressureHandler(0, nullptr);
}

TEST(CudaTorchAllocator, EvictedBlockStillInUseOnAnotherStreamIsReusedOnlyAfterTheUse) {
  Fixture f(4096);
  cudaStream_t side = *f.rt.StreamCreate();
  c10::cuda::CUDAStream side_stream = f.Wrap(side);
  std::vector<c10::DataPtr> evictable;
  evictable.push_back(f.allocator->allocate(2048));
  void* victim = evictable.back().get();
  f.allocator->recordStream(evictable.back(), side_stream);
  bool use_done = false;
  f.rt.HoldStream(side);
  f.rt.Launch(side, [&] { use_done = true; });  // the victim's last use, still queued when it is evicted
  c10::DataPtr kept = f.allocator->allocate(2048);
  EvictOne handler(&evictable);
  f.allocator->SetPressureHandler(0, &handler);
  c10::DataPtr fresh = f.allocator->allocate(2048);
  EXPECT_EQ(handler.calls, 1);
  EXPECT_EQ(fresh.get(), victim);
  // Handed out in the current stream's order after side's use: its next kernel runs only once that use has.
  bool next_saw_use_done = false;
  f.rt.Launch(f.current, [&] { next_saw_use_done = use_done; });
  EXPECT_FALSE(use_done);
  f.rt.ReleaseStream(side);
  EXPECT_TRUE(next_saw_use_done);
  EXPECT_EQ(f.allocator->getDeviceStats(0).active_bytes[0].current, 4096);
  f.allocator->SetPressureHandler(0, nullptr);
}

TEST(CudaTorchAllocator, PagingRoundTripIsByteIdentical) {
  Fixture f;
  cudaStream_t s = *f.rt.StreamCreate();
  f.current = s;
  const std::size_t bytes = 6000;
  c10::DataPtr a = f.allocator->allocate(bytes);
  const auto address = reinterpret_cast<std::uintptr_t>(a.get());
  f.rt.Launch(s, [&] {
    for (std::size_t i = 0; i < bytes; ++i) static_cast<unsigned char*>(a.get())[i] = static_cast<unsigned char>(i * 7);
  });
  std::vector<unsigned char> expected(bytes);
  std::memcpy(expected.data(), a.get(), bytes);

  absl::StatusOr<cuda::CudaPager*> pager = f.allocator->Pager(0);
  ASSERT_TRUE(pager.ok()) << pager.status();
  cuda::PageId page = *(*pager)->PageOut(address, bytes, s);
  a.clear();  // the storage's device memory goes
  c10::DataPtr scribble = f.allocator->allocate(kBudget);  // all of it, including a's old block
  f.rt.Launch(s, [&] { std::memset(scribble.get(), 0x5A, kBudget); });
  scribble.clear();
  absl::StatusOr<std::uintptr_t> back = (*pager)->PageIn(page, s);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE((*pager)->WaitForPage(page, s).ok());
  ASSERT_TRUE(f.rt.StreamSynchronize(s).ok());
  EXPECT_EQ(std::memcmp(reinterpret_cast<void*>(*back), expected.data(), bytes), 0);
  ASSERT_TRUE((*pager)->Release(page).ok());
  f.allocator->raw_delete(reinterpret_cast<void*>(*back));
}

TEST(CudaTorchAllocator, PagingNeedsAHostBudget) {
  Fixture f(kBudget, 0);
  EXPECT_THAT(f.allocator->Pager(0).status().message(), HasSubstr("pinned host budget"));
}

TEST(CudaTorchAllocator, MemoryFractionAndInfoGoThroughTheRuntime) {
  Fixture f;
  const auto [free_bytes, total] = f.allocator->getMemoryInfo(0);
  EXPECT_EQ(total, std::size_t{64} << 20);
  EXPECT_EQ(free_bytes, total);
  EXPECT_DOUBLE_EQ(f.allocator->getMemoryFraction(0), 1.0 / 64);
  f.allocator->setMemoryFraction(0.5, 0);
  EXPECT_DOUBLE_EQ(f.allocator->getMemoryFraction(0), 0.5);
  c10::DataPtr a = f.allocator->allocate(512);
  EXPECT_THAT(ErrorOf([&] { f.allocator->setMemoryFraction(0.25, 0); }),
              HasSubstr("can only change while nothing is allocated"));
  EXPECT_THAT(ErrorOf([&] { f.allocator->setMemoryFraction(1.5, 0); }), HasSubstr("(0, 1]"));
}

TEST(CudaTorchAllocator, SnapshotListsTheArenaBlocks) {
  Fixture f;
  c10::DataPtr a = f.allocator->allocate(1024);
  cca::SnapshotInfo info = f.allocator->snapshot();
  ASSERT_EQ(info.segments.size(), 1u);
  EXPECT_EQ(info.segments[0].total_size, kBudget);
  EXPECT_EQ(info.segments[0].allocated_size, 1024u);
  EXPECT_EQ(info.segments[0].blocks.size(), 2u);
}

// torch.cuda.memory._record_memory_history and _snapshot: remat's memory history as the snapshot's device traces,
// remat's own events as annotations on the block they concern.
TEST(CudaTorchAllocator, RecordedHistoryIsTheSnapshotsDeviceTrace) {
  Fixture f;
  c10::DataPtr before = f.allocator->allocate(512);  // before recording: not in the trace
  f.allocator->recordHistory(true, nullptr, 1000, cca::RecordContext::ALL, false, {});
  EXPECT_TRUE(f.allocator->isHistoryEnabled());
  c10::DataPtr a = f.allocator->allocate(1000);
  const auto address = reinterpret_cast<std::size_t>(a.get());
  {
    const MemoryEventScope evicting("remat: evict", /*op=*/false);
    RecordMemoryEvent(MemoryEventKind::kEvict, address, 1024, 7, /*device=*/0);  // what TorchExecutor::Evict records
    a.clear();
  }
  EXPECT_THROW(f.allocator->allocate(2 * kBudget), c10::OutOfMemoryError);
  RecordMemoryEvent(MemoryEventKind::kAlloc, 64, 64);  // the CPU arena's: not in a CUDA device's trace
  f.allocator->recordHistory(false, nullptr, 0, cca::RecordContext::NEVER, false, {});
  EXPECT_FALSE(f.allocator->isHistoryEnabled());

  const cca::SnapshotInfo info = f.allocator->snapshot({0, 0}, /*include_traces=*/true);
  ASSERT_EQ(info.device_traces.size(), 2u);  // the double's two devices
  EXPECT_TRUE(info.device_traces[1].empty());
  const std::vector<c10::CachingDeviceAllocator::TraceEntry>& trace = info.device_traces[0];
  using Trace = c10::CachingDeviceAllocator::TraceEntry;
  std::vector<Trace::Action> actions;
  for (const Trace& entry : trace) actions.push_back(entry.action_);
  EXPECT_EQ(actions, (std::vector<Trace::Action>{Trace::ALLOC, Trace::ANNOTATE, Trace::FREE_REQUESTED,
                                                 Trace::FREE_COMPLETED, Trace::OOM}));
  EXPECT_EQ(trace[0].addr_, address);
  EXPECT_EQ(trace[0].size_, 1024u);  // the block: 512-byte aligned
  EXPECT_EQ(trace[1].addr_, address);
  EXPECT_EQ(trace[1].user_metadata_, "remat_evict storage 7 in: remat: evict");
  EXPECT_EQ(trace[3].addr_, address);
  EXPECT_EQ(trace[3].size_, 1024u);
  EXPECT_EQ(trace[4].size_, 2 * kBudget);  // OOM: the request, addr_ = the free bytes
  EXPECT_EQ(trace[4].addr_, kBudget - 512);
  EXPECT_TRUE(f.allocator->snapshot({0, 0}, /*include_traces=*/false).device_traces.empty());
}

TEST(CudaTorchAllocator, UnsupportedFeaturesSaySo) {
  Fixture f;
  const c10::MempoolId_t pool{1, 0};
  EXPECT_THAT(ErrorOf([&] { f.allocator->beginAllocateToPool(0, pool, [](cudaStream_t) { return true; }); }),
              HasSubstr("remat does not support CUDA graph private memory pools"));
  EXPECT_THAT(ErrorOf([&] { f.allocator->endAllocateToPool(0, pool); }), HasSubstr("remat does not support"));
  EXPECT_THAT(ErrorOf([&] { f.allocator->releasePool(0, pool); }), HasSubstr("remat does not support"));
  EXPECT_THAT(ErrorOf([&] { f.allocator->shareIpcHandle(nullptr); }), HasSubstr("remat does not support CUDA IPC"));
  EXPECT_THAT(ErrorOf([&] { f.allocator->getIpcDevPtr("x"); }), HasSubstr("remat does not support CUDA IPC"));
  EXPECT_THAT(ErrorOf([&] { f.allocator->getCheckpointState(0, pool); }), HasSubstr("remat does not support"));
  EXPECT_THAT(ErrorOf([&] { f.allocator->setCheckpointPoolState(0, nullptr); }), HasSubstr("remat does not support"));
  EXPECT_THAT(ErrorOf([&] { f.allocator->attachAllocatorTraceTracker([](const auto&) {}); }),
              HasSubstr("remat does not support"));
  EXPECT_THAT(ErrorOf([&] { f.allocator->emptyCache(pool); }), HasSubstr("remat does not support"));
  EXPECT_THAT(ErrorOf([&] { f.allocator->snapshot(pool); }), HasSubstr("remat does not support"));
  EXPECT_THAT(ErrorOf([&] { f.allocator->getPoolUseCount(0, pool); }), HasSubstr("remat does not yet support"));
  EXPECT_TRUE(f.allocator->getExpandableSegmentSizes(0).empty());
}

// Puts c10's CUDA allocator back as it was (at the lowest priority c10 accepts).
void RestoreNative(cca::CUDAAllocator* native) {
  cca::allocator.store(native);
  for (int p = 0; p < 256 && c10::GetAllocator(c10::DeviceType::CUDA) != native; ++p) {
    c10::SetAllocator(c10::DeviceType::CUDA, native, static_cast<std::uint8_t>(p));
  }
}

// What torch.cuda.memory_allocated / memory_reserved / max_memory_allocated / reset_peak_memory_stats /
// empty_cache and cuDNN's cacheInfo call: c10's free functions, which go to the installed allocator.
TEST(CudaTorchAllocator, TorchCudaMemoryCallsReachTheInstalledAllocator) {
  Fixture f;
  cca::CUDAAllocator* native = cca::allocator.load();
  ASSERT_TRUE(InstallCudaAllocator(f.allocator.get()).ok());
  {
    c10::DataPtr a = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(100000);
    {
      c10::DataPtr b = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(4096);
      EXPECT_EQ(cca::getDeviceStats(0).allocated_bytes[0].current, 100352 + 4096);
    }
    const auto stats = cca::getDeviceStats(0);
    EXPECT_EQ(stats.allocated_bytes[0].current, 100352);        // memory_allocated
    EXPECT_EQ(stats.allocated_bytes[0].peak, 100352 + 4096);    // max_memory_allocated
    EXPECT_EQ(stats.reserved_bytes[0].current, kBudget);        // memory_reserved
    cca::resetPeakStats(0);                                     // reset_peak_memory_stats
    EXPECT_EQ(cca::getDeviceStats(0).allocated_bytes[0].peak, 100352);
    std::size_t largest = 0;
    cca::cacheInfo(0, &largest);                                // cuDNN's workspace sizing
    EXPECT_EQ(largest, kBudget - 100352);
    cca::emptyCache();                                          // something is allocated: the segment stays
    EXPECT_EQ(cca::getDeviceStats(0).reserved_bytes[0].current, kBudget);
  }
  cca::emptyCache();
  EXPECT_EQ(cca::getDeviceStats(0).reserved_bytes[0].current, 0);
  EXPECT_EQ(f.rt.live_device_allocations(), 0u);
  EXPECT_EQ(cca::name(), "remat");                              // torch.cuda.get_allocator_backend()
  ASSERT_TRUE(UninstallCudaAllocator().ok());
  RestoreNative(native);
  EXPECT_EQ(c10::GetAllocator(c10::DeviceType::CUDA), native);
}

TEST(CudaTorchAllocator, InstallNewChecksForADeviceBeforeInstalling) {
  cca::CUDAAllocator* native = cca::allocator.load();
  CudaAllocatorOptions options;
  options.budget = kBudget;
  auto streams = [] {
    CudaStreams s;
    s.current = [](c10::DeviceIndex) { return cudaStream_t{nullptr}; };
    s.handle = [](const c10::cuda::CUDAStream&) { return cudaStream_t{nullptr}; };
    return s;
  };
  cuda::FakeCudaRuntime no_gpu(cuda::FakeCudaOptions{0, 0});
  absl::StatusOr<RematCudaAllocator*> failed = InstallNewCudaAllocator(&no_gpu, options, streams());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(failed.status().message(), HasSubstr("no CUDA device is available"));
  EXPECT_THAT(failed.status().message(), HasSubstr("reports 0 devices"));
  EXPECT_EQ(InstalledCudaAllocator(), nullptr);
  EXPECT_EQ(cca::allocator.load(), native);

  EXPECT_EQ(InstallNewCudaAllocator(&no_gpu, CudaAllocatorOptions{}, streams()).status().code(),
            absl::StatusCode::kInvalidArgument);

  cuda::FakeCudaRuntime one_gpu;
  absl::StatusOr<RematCudaAllocator*> installed = InstallNewCudaAllocator(&one_gpu, options, streams());
  ASSERT_TRUE(installed.ok()) << installed.status();
  EXPECT_EQ(InstalledCudaAllocator(), *installed);
  EXPECT_EQ(cca::get(), *installed);
  EXPECT_EQ(InstallNewCudaAllocator(&one_gpu, options, streams()).status().code(),
            absl::StatusCode::kAlreadyExists);
  {
    c10::DataPtr a = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(512);
    EXPECT_EQ(cca::getDeviceStats(0).allocated_bytes[0].current, 512);
  }
  ASSERT_TRUE(UninstallCudaAllocator().ok());
  delete *installed;
  RestoreNative(native);
}

TEST(CudaTorchAllocator, InstallsIntoC10AndServesItsCudaAllocator) {
  Fixture f;
  cca::CUDAAllocator* native = cca::allocator.load();
  ASSERT_FALSE(cca::allocator.load() != nullptr && cca::allocator.load()->initialized())
      << "this process has no GPU; torch's allocator must be uninitialized";
  ASSERT_TRUE(InstallCudaAllocator(f.allocator.get()).ok());
  EXPECT_EQ(InstalledCudaAllocator(), f.allocator.get());
  EXPECT_EQ(cca::get(), f.allocator.get());
  EXPECT_EQ(c10::GetAllocator(c10::DeviceType::CUDA), f.allocator.get());
  EXPECT_EQ(InstallCudaAllocator(f.allocator.get()).code(), absl::StatusCode::kAlreadyExists);
  {
    c10::DataPtr a = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(4096);
    EXPECT_EQ(cca::getDeviceStats(0).allocated_bytes[0].current, 4096);  // what torch.cuda.memory_allocated reads
  }
  cca::init(2);  // torch's CUDA lazy init calls this on the installed allocator
  EXPECT_TRUE(f.allocator->initialized());
  ASSERT_TRUE(UninstallCudaAllocator().ok());
  EXPECT_NE(cca::get(), f.allocator.get());
  EXPECT_EQ(InstalledCudaAllocator(), nullptr);

  // Once CUDA is initialized (the installed allocator says so), another install fails with a clear message.
  Fixture other;
  ASSERT_TRUE(InstallCudaAllocator(f.allocator.get()).ok());  // f's allocator is initialized now
  ASSERT_TRUE(UninstallCudaAllocator().ok());
  cca::allocator.store(f.allocator.get());  // as if torch had initialized CUDA with it
  const absl::Status status = InstallCudaAllocator(other.allocator.get());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("CUDA is already initialized"));
  ASSERT_TRUE(InstallCudaAllocator(f.allocator.get()).ok());  // same allocator: allowed
  ASSERT_TRUE(UninstallCudaAllocator().ok());
  RestoreNative(native);  // leave c10 as we found it
  EXPECT_EQ(c10::GetAllocator(c10::DeviceType::CUDA), native);
}

}  // namespace
}  // namespace remat::integration
