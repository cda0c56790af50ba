// Compiled (not linked) by ctest under clang -Wthread-safety -Werror (src/base/CMakeLists.txt):
// with no KILN_TS_* macro it must compile cleanly; each KILN_TS_* macro adds one locking mistake
// that the analysis must reject with the diagnostic the test expects. Shows the annotations in
// base/mutex.h are wired to the analysis (a macro that expanded to nothing would pass the first
// test and fail the others).
#include "base/mutex.h"

namespace kiln {

class Account {
 public:
  void Deposit(int amount) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    AddLocked(amount);
    changed_.NotifyAll();
  }
  int WaitForAtLeast(int amount) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    while (balance_ < amount) changed_.Wait(mu_);
    return balance_;
  }
  int ReadWithoutHolding() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    lock.Unlock();
#ifdef KILN_TS_READ_AFTER_UNLOCK
    return balance_;
#else
    return 0;
#endif
  }
  int Balance() {
#ifdef KILN_TS_UNGUARDED
    return balance_;
#else
    MutexLock lock(mu_);
    return balance_;
#endif
  }
  void DepositTwice(int amount) EXCLUDES(mu_) {
#ifdef KILN_TS_MISSING_REQUIRES
    AddLocked(amount);
#else
    MutexLock lock(mu_);
    AddLocked(amount);
#endif
#ifdef KILN_TS_DOUBLE_LOCK
    MutexLock again(mu_);
#endif
  }
  void WaitUnlocked() {
#ifdef KILN_TS_WAIT_UNLOCKED
    changed_.Wait(mu_);
#endif
  }

 private:
  void AddLocked(int amount) REQUIRES(mu_) { balance_ += amount; }

  Mutex mu_;
  CondVar changed_;
  int balance_ GUARDED_BY(mu_) = 0;
};

class Table {
 public:
  int Get() {
#ifdef KILN_TS_WRITE_UNDER_READER
    ReaderMutexLock lock(mu_);
    return ++rows_;
#else
    ReaderMutexLock lock(mu_);
    return rows_;
#endif
  }
  void Put() {
    WriterMutexLock lock(mu_);
    ++rows_;
  }

 private:
  SharedMutex mu_;
  int rows_ GUARDED_BY(mu_) = 0;
};

}  // namespace kiln
