#pragma once
// Mutexes and a condition variable that clang's -Wthread-safety analysis understands
// (base/thread_annotations.h). They are thin wrappers over the std primitives: same cost, same
// semantics, plus the capability attributes libstdc++'s types lack.
//
//   Mutex mu_;
//   CondVar changed_;
//   std::deque<Job> queue_ GUARDED_BY(mu_);
//
//   void Push(Job j) EXCLUDES(mu_) {
//     MutexLock lock(mu_);
//     queue_.push_back(std::move(j));
//     changed_.NotifyOne();
//   }
//   Job Pop() EXCLUDES(mu_) {
//     MutexLock lock(mu_);
//     while (queue_.empty()) changed_.Wait(mu_);  // the loop, not a predicate lambda: see CondVar
//     ...
//   }
//
// Rules: lock only through MutexLock / ReaderMutexLock / WriterMutexLock (std::lock_guard and
// std::unique_lock over these types compile, but the analysis cannot see them, so every guarded
// access under them warns). Thread-safety: each type is as thread-safe as the std type it wraps.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "base/thread_annotations.h"

namespace kiln {

class CondVar;

// An exclusive, non-recursive mutex (std::mutex). lock/unlock/try_lock keep the std spelling so it
// is a standard Lockable; code should still take it through MutexLock.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  // True when the mutex was free and is now held by the caller.
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }

  // Tells the analysis the caller holds this mutex, where it cannot see the lock itself (a
  // callback run by code that locked it). Not checked at run time: it states a contract.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// A recursive mutex (std::recursive_mutex): the owning thread may lock it again. Only for code
// whose reentrancy is part of its contract (store::Database); prefer Mutex everywhere else.
class CAPABILITY("mutex") RecursiveMutex {
 public:
  RecursiveMutex() = default;
  RecursiveMutex(const RecursiveMutex&) = delete;
  RecursiveMutex& operator=(const RecursiveMutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  std::recursive_mutex mu_;
};

// A reader/writer mutex (std::shared_mutex): many readers or one writer.
class CAPABILITY("mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  void lock_shared() ACQUIRE_SHARED() { mu_.lock_shared(); }
  void unlock_shared() RELEASE_SHARED() { mu_.unlock_shared(); }
  bool try_lock_shared() TRY_ACQUIRE_SHARED(true) { return mu_.try_lock_shared(); }
  void AssertHeld() const ASSERT_CAPABILITY(this) {}
  void AssertReaderHeld() const ASSERT_SHARED_CAPABILITY(this) {}

 private:
  std::shared_mutex mu_;
};

// Holds a Mutex from construction to destruction. Unlock()/Lock() release and retake it inside the
// scope (work that must not hold the mutex); the destructor unlocks only if it is held then.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Precondition: held (Unlock) / not held (Lock) by this MutexLock.
  void Unlock() RELEASE() {
    mu_.unlock();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    mu_.lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// MutexLock for a RecursiveMutex.
class SCOPED_CAPABILITY RecursiveMutexLock {
 public:
  explicit RecursiveMutexLock(RecursiveMutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~RecursiveMutexLock() RELEASE() { mu_.unlock(); }
  RecursiveMutexLock(const RecursiveMutexLock&) = delete;
  RecursiveMutexLock& operator=(const RecursiveMutexLock&) = delete;

 private:
  RecursiveMutex& mu_;
};

// Shared (reader) hold of a SharedMutex for the scope.
class SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex& mu) ACQUIRE_SHARED(mu) : mu_(mu) { mu_.lock_shared(); }
  ~ReaderMutexLock() RELEASE() { mu_.unlock_shared(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex& mu_;
};

// Exclusive (writer) hold of a SharedMutex for the scope.
class SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~WriterMutexLock() RELEASE() { mu_.unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex& mu_;
};

// A condition variable over a Mutex (std::condition_variable: no extra allocation or lock, unlike
// std::condition_variable_any). Every Wait* requires the caller to hold `mu` (the analysis checks
// it), releases it while blocked and holds it again on return, exactly as std::condition_variable.
//
// Wake-ups may be spurious, so wait in a loop on the condition, written in the caller:
//   while (!ready_) cv_.Wait(mu_);
// rather than through a predicate lambda, whose body the analysis checks as a separate function
// that holds nothing (every guarded read in it would warn).
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex& mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // the caller's MutexLock still owns the (re-acquired) mutex
  }

  // Blocks until notified, a spurious wake-up, or `deadline`; std::cv_status::timeout when the
  // deadline had passed on waking.
  template <class Clock, class Duration>
  std::cv_status WaitUntil(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    std::cv_status status = cv_.wait_until(lock, deadline);
    lock.release();
    return status;
  }

  // As WaitUntil(now + timeout), measured on the steady clock.
  template <class Rep, class Period>
  std::cv_status WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    std::cv_status status = cv_.wait_for(lock, timeout);
    lock.release();
    return status;
  }

  void NotifyOne() noexcept { cv_.notify_one(); }
  void NotifyAll() noexcept { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace kiln
