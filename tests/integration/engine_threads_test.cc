// Engine bridge and threads (engine_lock.h; integration/README.md, "Threads"): a kernel whose worker thread
// allocates under pressure gets room (it borrows the lock its op lends while the kernel runs), an unrelated thread
// allocating while another thread runs ops gets room, disable from another thread while ops run is safe, a
// forked child starts with no lock held and reads what the parent had evicted, and a fork while another thread's
// kernel calls into remat does not deadlock.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sum.h>
#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/library.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "integration/dispatch_hook.h"
#include "integration/engine_session.h"
#include "integration/same_bytes.h"
#include "tests/integration/chain_workload.h"

namespace {

// A kernel that waits for a worker thread it starts, as an intra-op parallel kernel waits for its pool, while the
// worker allocates 256 KiB.
at::Tensor WorkerAllocates(const at::Tensor& x) {
  at::Tensor scratch;
  std::thread worker([&] { scratch = at::empty({1 << 16}); });
  worker.join();
  return x.clone();  // nested op: part of this one
}

// A kernel that reads its input's bytes through an export, as C++ code must (engine_session.h, MakeResident), a
// little while after it started: the export asks for the session's mutex while its thread holds the engine lock.
at::Tensor ExportsInside(const at::Tensor& x) {
  std::this_thread::sleep_for(std::chrono::microseconds(200));
  const absl::Status status = remat::integration::MakeResident(x, /*writable=*/false);
  TORCH_CHECK(status.ok(), std::string(status.message()));
  return x.clone();
}

TORCH_LIBRARY(remat_threads_test, m) {
  m.def("worker_allocates(Tensor x) -> Tensor");
  m.def("exports_inside(Tensor x) -> Tensor");
}
TORCH_LIBRARY_IMPL(remat_threads_test, CPU, m) {
  m.impl("worker_allocates", &WorkerAllocates);
  m.impl("exports_inside", &ExportsInside);
}

at::Tensor CallWorkerAllocates(const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("remat_threads_test::worker_allocates", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

at::Tensor CallExportsInside(const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("remat_threads_test::exports_inside", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

}  // namespace

namespace remat::integration {
namespace {

constexpr std::size_t kKiB = 1024;

TEST(EngineThreads, AWorkerOfARunningKernelThatAllocatesUnderPressureGetsRoom) {
  const at::Tensor x = at::randn({128, 128});  // 64 KiB, outside the arena
  at::manual_seed(7);
  const std::vector<at::Tensor> reference = Chain(x, 16);
  EngineGuard guard(EngineSessionOptions{640 * kKiB, "dtr-eq"});
  at::manual_seed(7);
  std::vector<at::Tensor> ys = Chain(x, 16);  // fills the budget with evictable storages
  const at::Tensor y = CallWorkerAllocates(ys.back());
  EXPECT_TRUE(SameBytes(y, reference.back()));
  const absl::StatusOr<BridgeStats> stats = GetEngineStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GE(stats->borrowed_room, 1) << "the worker made room while the kernel lent the lock";
  for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << i;
}

TEST(EngineThreads, AnotherThreadAllocatingWhileOpsRunGetsRoom) {
  const at::Tensor x = at::randn({128, 128});
  at::manual_seed(9);
  const std::vector<at::Tensor> reference = Chain(x, 24);
  EngineGuard guard(EngineSessionOptions{1024 * kKiB, "dtr-eq"});
  std::atomic<bool> done{false};
  std::atomic<int> failures{0}, allocations{0};
  std::thread other([&] {  // not tracked: its tensors are never evicted, its allocations make room
    while (!done.load()) {
      try {
        at::Tensor t = at::empty({1 << 15});  // 128 KiB, freed at once
        allocations.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      } catch (const c10::OutOfMemoryError&) {
        failures.fetch_add(1);
      }
    }
  });
  for (int round = 0; round < 20; ++round) {
    at::manual_seed(9);
    const std::vector<at::Tensor> ys = Chain(x, 24);
    for (std::size_t i = 0; i < ys.size(); ++i) EXPECT_TRUE(SameBytes(ys[i], reference[i])) << round << " " << i;
  }
  done = true;
  other.join();
  EXPECT_EQ(failures.load(), 0) << "an allocation of the other thread ran out of memory";
  EXPECT_GT(allocations.load(), 0);
  EXPECT_GT(GetEngineStats()->engine.evictions, 0);
}

// Chain(x, 30) one step at a time (each step its own Chain call), keeping every result.
std::vector<at::Tensor> Steps(const at::Tensor& x, int n, const std::function<void(int)>& after_step = {}) {
  std::vector<at::Tensor> out;
  at::Tensor y = x;
  for (int i = 0; i < n; ++i) {
    y = Chain(y, 1).back();
    out.push_back(y);
    if (after_step) after_step(i);
  }
  return out;
}

TEST(EngineThreads, DisableFromAnotherThreadWhileOpsRunIsSafe) {
  const at::Tensor x = at::randn({128, 128});
  at::manual_seed(5);
  const std::vector<at::Tensor> reference = Steps(x, 30);
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(EnableRematEngine(EngineSessionOptions{400 * kKiB, "dtr-eq"}).ok());
    std::atomic<bool> started{false};
    std::thread disabler([&] {
      while (!started.load()) std::this_thread::yield();
      EXPECT_TRUE(DisableRematEngine().ok());
    });
    at::manual_seed(5);
    const std::vector<at::Tensor> ys = Steps(x, 30, [&](int i) { started = started || i == 3; });  // disable races
    disabler.join();
    for (std::size_t i = 0; i < ys.size(); ++i) ASSERT_TRUE(SameBytes(ys[i], reference[i])) << round << " " << i;
    EXPECT_FALSE(RematEngineEnabled());
  }
}

// Chain(x, 20) without remat (`reference`), then the same under a 512 KiB budget (`ys`: most of them evicted), with
// remat on for as long as it lives.
struct EvictedChain {
  static std::vector<at::Tensor> Seeded(const at::Tensor& x) {
    at::manual_seed(3);
    return Chain(x, 20);
  }
  // How many of ys differ from the reference; reading them rematerializes them.
  int Wrong() const {
    int bad = 0;
    for (std::size_t i = 0; i < ys.size(); ++i) bad += !SameBytes(ys[i], reference[i]);
    return bad;
  }

  const at::Tensor x = at::randn({128, 128});
  const std::vector<at::Tensor> reference = Seeded(x);
  EngineGuard engine{EngineSessionOptions{512 * kKiB, "dtr-eq"}};
  const std::vector<at::Tensor> ys = Seeded(x);
};

TEST(EngineThreads, AForkedChildStartsWithNoLockHeldAndReadsWhatTheParentEvicted) {
  const EvictedChain chain;
  const at::Tensor& x = chain.x;
  ASSERT_GT(GetEngineStats()->engine.evictions, 0);
  // What the busy thread and the child run is set up once before the fork: a first use registers static destructors
  // (__cxa_atexit, under a libc lock), and a fork while the busy thread held that lock left the child waiting for it
  // forever (seen once: the child in at::set_num_threads creating its thread pool).
  (void)at::sum(at::mul(x, 2.0));
  at::set_num_threads(at::get_num_threads());
  std::atomic<bool> stop{false};
  std::thread busy([&] {  // another thread in ops and allocations while the fork happens
    while (!stop.load()) (void)at::sum(at::mul(x, 2.0));
  });
  const pid_t child = fork();
  if (child == 0) {
    alarm(30);               // a hung child ends too (an alarm is not inherited)
    at::set_num_threads(1);  // GNU OpenMP does not survive fork(); DataLoader workers do the same
    const int bad = chain.Wrong();  // rematerialized here
    const at::Tensor big = at::empty({1 << 20});  // 4 MiB: more than the budget; the child has no budget
    _exit(bad == 0 && big.numel() == (1 << 20) ? 0 : 1);
  }
  stop = true;
  busy.join();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_EQ(chain.Wrong(), 0);
}

// A thread that frees arena blocks holds the arena's lock outside every lock fork()'s handlers take, so a child may
// start with that lock held by a thread it does not have: the child must never touch the arena. Its rematerializations
// named their blocks' owners in it (TorchExecutor::SetOwner) and waited forever, now and then. Many forks while a
// thread allocates and frees make the window likely; a hang ends the test by SIGALRM.
TEST(EngineThreads, ForkedChildrenRematerializeWhileAnotherThreadFreesArenaBlocks) {
  const EvictedChain chain;
  ASSERT_GT(GetEngineStats()->engine.evictions, 0);
  (void)at::empty({1024});  // set up before the fork (see the test above)
  at::set_num_threads(at::get_num_threads());
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop.load()) (void)at::empty({1024});  // an arena Allocate and Free, over and over
  });
  alarm(120);
  for (int round = 0; round < 40; ++round) {
    const pid_t child = fork();
    if (child == 0) {
      alarm(30);  // a hung child ends too (an alarm is not inherited), so no orphan holds the test's output open
      at::set_num_threads(1);
      _exit(chain.Wrong() == 0 ? 0 : 1);  // rematerialized here
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "round " << round << ", child status " << status;
  }
  alarm(0);
  stop = true;
  busy.join();
}

// fork()'s handlers take every engine lock, then the session's mutex: an op whose kernel exports (and so asks for
// the mutex while its thread holds the engine lock) finishes first. They took the mutex first, and the two waited
// for each other. A deadlock ends the test by SIGALRM instead of hanging it.
TEST(EngineThreads, AForkWhileAnotherThreadsKernelExportsDoesNotDeadlock) {
  const at::Tensor x = at::randn({64, 64});
  EngineGuard guard(EngineSessionOptions{64 << 20, "dtr-eq"});
  (void)CallExportsInside(x);  // set up before the fork (see the test above)
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0};
  std::thread busy([&] {
    const ScopedHook hook;  // a C++ thread's ops are recorded once it switches the hook on
    while (!stop.load()) {
      (void)CallExportsInside(x);
      calls.fetch_add(1);
    }
  });
  alarm(60);
  for (int i = 0; i < 50; ++i) {
    const pid_t child = fork();
    if (child == 0) _exit(0);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  stop = true;
  busy.join();
  alarm(0);
  EXPECT_GT(calls.load(), 0);
}

}  // namespace
}  // namespace remat::integration
