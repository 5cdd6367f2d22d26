// EngineLock: see engine_lock.h for the contract.
#include "integration/engine_lock.h"

#include <algorithm>

namespace remat::integration {

void EngineLock::lock() {
  const std::thread::id me = std::this_thread::get_id();
  std::unique_lock<std::mutex> guard(mutex_);
  if (owner_ == me) {
    ++depth_;
    return;
  }
  // First come, first served: a thread that unlocks and locks again at once (ops back to back) queues behind the
  // threads already waiting (a disable from another thread, the Python API).
  const std::uint64_t ticket = next_ticket_++;
  changed_.wait(guard, [&] { return owner_ == std::thread::id() && serving_ == ticket; });
  AdvanceLocked();
  owner_ = me;
  depth_ = 1;
}

void EngineLock::AdvanceLocked() {
  ++serving_;
  for (auto it = std::find(cancelled_.begin(), cancelled_.end(), serving_); it != cancelled_.end();
       it = std::find(cancelled_.begin(), cancelled_.end(), serving_)) {
    cancelled_.erase(it);
    ++serving_;
  }
}

void EngineLock::CancelLocked(std::uint64_t ticket) {
  if (ticket == serving_) {
    AdvanceLocked();
    changed_.notify_all();
  } else {
    cancelled_.push_back(ticket);
  }
}

void EngineLock::unlock() {
  std::unique_lock<std::mutex> guard(mutex_);
  if (--depth_ > 0) return;
  changed_.wait(guard, [&] { return borrow_depth_ == 0; });  // a borrower finishes before the lock changes hands
  owner_ = std::thread::id();
  lent_ = false;
  changed_.notify_all();
}

bool EngineLock::HeldByThisThread() {
  std::lock_guard<std::mutex> guard(mutex_);
  return owner_ == std::this_thread::get_id();
}

void EngineLock::BeginLend() {
  std::lock_guard<std::mutex> guard(mutex_);
  lent_ = true;
  changed_.notify_all();
}

void EngineLock::EndLend() {
  std::unique_lock<std::mutex> guard(mutex_);
  changed_.wait(guard, [&] { return borrow_depth_ == 0; });
  lent_ = false;
}

bool EngineLock::LentByThisThread() {
  std::lock_guard<std::mutex> guard(mutex_);
  return lent_ && owner_ == std::this_thread::get_id();
}

EngineLock::LendPause::LendPause(EngineLock& lock) {
  if (!lock.LentByThisThread()) return;
  lock.EndLend();
  lock_ = &lock;
}

EngineLock::LendPause::~LendPause() {
  if (lock_ != nullptr) lock_->BeginLend();
}

EngineLock::LendScope::LendScope(EngineLock* lock) {
  if (lock == nullptr) return;
  std::lock_guard<std::mutex> guard(lock->mutex_);
  if (lock->owner_ != std::this_thread::get_id() || lock->lent_) return;
  lock->lent_ = true;
  lock->changed_.notify_all();
  lock_ = lock;
}

EngineLock::LendScope::~LendScope() {
  if (lock_ != nullptr) lock_->EndLend();
}

EngineLock::RoomAccess::RoomAccess(EngineLock& lock) : lock_(lock) {
  const std::thread::id me = std::this_thread::get_id();
  std::unique_lock<std::mutex> guard(lock.mutex_);
  if (lock.owner_ == me && !lock.lent_) {
    ++lock.depth_;
    return;
  }
  // Either a borrow (while the holder lends) or the lock itself, in ticket order like lock().
  const std::uint64_t ticket = lock.next_ticket_++;
  lock.changed_.wait(guard, [&] {
    if (lock.lent_ && (lock.borrow_depth_ == 0 || lock.borrower_ == me)) return true;
    return lock.owner_ == std::thread::id() && lock.serving_ == ticket;
  });
  if (lock.lent_) {  // borrowed: the ticket is given up, so the queue does not stall on it
    borrowed_ = true;
    holder_ = lock.owner_ == me;
    lock.borrower_ = me;
    ++lock.borrow_depth_;
    lock.CancelLocked(ticket);
    return;
  }
  lock.AdvanceLocked();
  lock.owner_ = me;
  lock.depth_ = 1;
}

EngineLock::RoomAccess::~RoomAccess() {
  if (!borrowed_) {
    lock_.unlock();
    return;
  }
  std::lock_guard<std::mutex> guard(lock_.mutex_);
  if (--lock_.borrow_depth_ == 0) {
    lock_.borrower_ = std::thread::id();
    lock_.changed_.notify_all();
  }
}

void EngineLock::LockForFork() {
  lock();
  mutex_.lock();
}

void EngineLock::UnlockAfterFork() {
  mutex_.unlock();
  unlock();
}

}  // namespace remat::integration
