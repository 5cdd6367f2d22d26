// EngineLock (engine_lock.h): recursive for its holder; a borrow while the holder lends it (and only then); lending
// ends after the borrower is done; a pause takes the lock back from a borrower; waiters are served in arrival order.
#include "integration/engine_lock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace remat::integration {
namespace {

using std::chrono::milliseconds;

TEST(EngineLock, IsRecursiveForItsHolder) {
  EngineLock lock;
  lock.lock();
  lock.lock();
  EXPECT_TRUE(lock.HeldByThisThread());
  { EngineLock::RoomAccess nested(lock); }  // the holder, not lending: nested, no wait
  lock.unlock();
  EXPECT_TRUE(lock.HeldByThisThread());
  lock.unlock();
  EXPECT_FALSE(lock.HeldByThisThread());
}

TEST(EngineLock, AnotherThreadBorrowsOnlyWhileTheHolderLends) {
  EngineLock lock;
  lock.lock();
  std::atomic<bool> in{false}, release{false};
  std::atomic<bool> borrowed{false};
  std::thread other([&] {
    EngineLock::RoomAccess access(lock);
    borrowed = access.borrowed_from_another_thread();
    in = true;
    while (!release.load()) std::this_thread::yield();
  });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(in.load()) << "the holder does not lend: the other thread waits";
  lock.BeginLend();
  while (!in.load()) std::this_thread::yield();
  EXPECT_TRUE(borrowed.load());
  std::atomic<bool> lend_ended{false};
  std::thread holder_side([&] {
    std::this_thread::sleep_for(milliseconds(50));
    lend_ended = true;
    release = true;
  });
  lock.EndLend();  // returns only once the borrower is done
  EXPECT_TRUE(lend_ended.load());
  other.join();
  holder_side.join();
  lock.unlock();
}

TEST(EngineLock, TheHoldersOwnKernelBorrowsLikeAnyoneElse) {
  EngineLock lock;
  lock.lock();
  lock.BeginLend();
  {
    EngineLock::RoomAccess access(lock);  // the holder's kernel allocates
    EXPECT_FALSE(access.borrowed_from_another_thread());
    EngineLock::RoomAccess nested(lock);  // and again, inside (recursive borrow)
  }
  lock.EndLend();
  lock.unlock();
}

TEST(EngineLock, CodeInsideTheHoldersKernelTakesTheLockBackFromABorrower) {
  EngineLock lock;
  lock.lock();
  EXPECT_FALSE(lock.LentByThisThread());
  lock.BeginLend();
  EXPECT_TRUE(lock.LentByThisThread());
  std::atomic<bool> in{false}, release{false}, out{false};
  std::thread other([&] {
    EXPECT_FALSE(lock.LentByThisThread()) << "a borrower does not lend";
    EngineLock::RoomAccess access(lock);
    in = true;
    while (!release.load()) std::this_thread::yield();
    out = true;
  });
  while (!in.load()) std::this_thread::yield();
  std::thread releaser([&] {
    std::this_thread::sleep_for(milliseconds(50));
    release = true;
  });
  {
    EngineLock::LendPause pause(lock);  // waits for the borrower to be done
    EXPECT_TRUE(out.load());
    EXPECT_FALSE(lock.LentByThisThread());
  }
  EXPECT_TRUE(lock.LentByThisThread()) << "lent again after the pause";
  other.join();
  releaser.join();
  {
    EngineLock::RoomAccess access(lock);  // the holder's kernel still borrows as before
  }
  lock.EndLend();
  { EngineLock::LendPause nothing(lock); }  // not lending: nothing to pause
  EXPECT_FALSE(lock.LentByThisThread());
  lock.unlock();
}

TEST(EngineLock, WaitersAreServedInArrivalOrder) {
  EngineLock lock;
  lock.lock();
  std::vector<int> order;
  std::mutex order_mutex;
  std::atomic<int> waiting{0};
  std::thread second([&] {
    ++waiting;
    lock.lock();
    {
      std::lock_guard<std::mutex> guard(order_mutex);
      order.push_back(2);
    }
    lock.unlock();
  });
  while (waiting.load() == 0) std::this_thread::yield();
  std::this_thread::sleep_for(milliseconds(50));  // `second` is queued
  lock.unlock();
  lock.lock();  // back at once: behind `second`
  {
    std::lock_guard<std::mutex> guard(order_mutex);
    order.push_back(1);
  }
  lock.unlock();
  second.join();
  EXPECT_EQ(order, (std::vector<int>{2, 1}));
}

}  // namespace
}  // namespace remat::integration
