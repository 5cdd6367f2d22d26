// EngineLock: who may change the engine's state, and when (integration/README.md, "Threads").
//
// The engine (runtime/engine.h) is not thread safe. PyTorch calls into it from any thread: the thread running a
// recorded op (BeforeOp ... AfterOp), any thread whose allocation does not fit (the arena's pressure handler), and
// the Python API (stats, pins, exports). This lock serializes them, with one twist that avoids both spurious
// out-of-memory errors and deadlocks:
//
//   - A recorded op holds the lock from BeforeOp to AfterOp (recursively: the engine's own nested calls on the
//     same thread go ahead), so ops of different threads do not interleave in the engine.
//   - While the holder runs a kernel (the user's op between BeforeOp and AfterOp, or a replay inside the engine),
//     it lends the lock: the kernel's intra-op worker threads, and any other thread, may then borrow it to make
//     room (RoomAccess), one borrower at a time. The holder itself borrows like anyone else if its kernel
//     allocates. Lending ends when the kernel returns, after the borrower (if any) is done. A kernel may wait for
//     its workers, so they must never wait for the holder: while lent, they do not.
//   - A thread that wants room while the lock is held and not lent waits: the holder is doing the engine's own
//     bookkeeping, which waits for no other thread.
//
// Everything an engine entry point reads or writes is protected either way: the holder does not touch the engine
// while it lends (its kernel only reaches it through allocations, which borrow).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace remat::integration {

class EngineLock {
 public:
  EngineLock() = default;
  EngineLock(const EngineLock&) = delete;
  EngineLock& operator=(const EngineLock&) = delete;

  // Recursive. lock() by the holder while it lends just nests.
  void lock();
  void unlock();
  bool HeldByThisThread();

  // The holder is about to run a kernel / its kernel returned (waits for a borrower to finish). Not nested.
  void BeginLend();
  void EndLend();
  // This thread holds the lock and lends it: the caller is code inside the holder's kernel (a Python dispatch
  // mode's handler, a kernel written in Python), which must not change the engine while a borrower may.
  bool LentByThisThread();
  // Takes the lock back from its borrowers for the scope (waits for the one borrowing, if any), then lends it again:
  // for the holder's kernel when it must change the engine itself. Nothing when this thread does not lend it.
  class LendPause {
   public:
    explicit LendPause(EngineLock& lock);
    ~LendPause();
    LendPause(const LendPause&) = delete;
    LendPause& operator=(const LendPause&) = delete;

   private:
    EngineLock* lock_ = nullptr;
  };
  // Lends for the lifetime of the scope if this thread holds the lock and does not lend it already (a replay's
  // kernel inside the engine); otherwise does nothing (the engine was reached by a borrower, or no lock is used).
  class LendScope {
   public:
    explicit LendScope(EngineLock* lock);
    ~LendScope();
    LendScope(const LendScope&) = delete;
    LendScope& operator=(const LendScope&) = delete;

   private:
    EngineLock* lock_ = nullptr;
  };

  // The right to change the engine's state now, for an allocation that needs room: the lock itself (taken, or
  // nested for the holder when it does not lend), or a borrow while the holder lends. Blocks until one is had.
  class RoomAccess {
   public:
    explicit RoomAccess(EngineLock& lock);
    ~RoomAccess();
    RoomAccess(const RoomAccess&) = delete;
    RoomAccess& operator=(const RoomAccess&) = delete;
    // Borrowed by a thread other than the holder while the holder ran a kernel (an intra-op worker, another thread).
    bool borrowed_from_another_thread() const { return borrowed_ && !holder_; }

   private:
    EngineLock& lock_;
    bool borrowed_ = false;
    bool holder_ = false;
  };

  // fork(): lock() and the internal mutex are held across it, so neither the parent's state nor the child's copy is
  // caught half changed by a thread the child does not have; both sides then release them.
  void LockForFork();
  void UnlockAfterFork();

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::thread::id owner_;  // guarded by mutex_
  int depth_ = 0;
  bool lent_ = false;
  std::thread::id borrower_;
  int borrow_depth_ = 0;
  // Tickets: the lock goes to waiters in arrival order. serving_ is the next ticket allowed to take the lock;
  // cancelled_ holds tickets given up by threads that borrowed instead (skipped when reached).
  std::uint64_t next_ticket_ = 0;
  std::uint64_t serving_ = 0;
  std::vector<std::uint64_t> cancelled_;

  void AdvanceLocked();                      // with mutex_ held
  void CancelLocked(std::uint64_t ticket);  // with mutex_ held
};

}  // namespace remat::integration
