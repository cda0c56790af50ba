#pragma once
// Clang thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html).
//
// Under clang with -Wthread-safety (CMake option KILN_THREAD_SAFETY, on in CI's clang build) the
// compiler checks at every access that the mutex a member is GUARDED_BY is held, and at every call
// that a function's REQUIRES / EXCLUDES contract is met. Under other compilers the macros expand to
// nothing, so they cost nothing and change nothing.
//
// libstdc++'s std::mutex carries no capability attributes, so the analysis cannot see it: lock
// through kiln::Mutex / kiln::MutexLock / kiln::CondVar (base/mutex.h), which carry them.
//
//   class Cache {
//    public:
//     void Put(std::string k) EXCLUDES(mu_);   // takes mu_ itself
//    private:
//     void EvictLocked() REQUIRES(mu_);        // caller holds mu_
//     Mutex mu_;
//     std::map<std::string, int> entries_ GUARDED_BY(mu_);
//   };

#if defined(__clang__)
#define KILN_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define KILN_THREAD_ANNOTATION_(x)  // no-op outside clang
#endif

// A class that is a lock (kiln::Mutex). `x` names the kind in diagnostics ("mutex").
#define CAPABILITY(x) KILN_THREAD_ANNOTATION_(capability(x))

// An RAII class that holds a capability for its lifetime (kiln::MutexLock).
#define SCOPED_CAPABILITY KILN_THREAD_ANNOTATION_(scoped_lockable)

// A data member read and written only while the given mutex is held.
#define GUARDED_BY(x) KILN_THREAD_ANNOTATION_(guarded_by(x))

// A pointer member whose pointee (not the pointer itself) is guarded by the given mutex.
#define PT_GUARDED_BY(x) KILN_THREAD_ANNOTATION_(pt_guarded_by(x))

// Lock ordering: this mutex is taken before / after the given ones (checked with -Wthread-safety-beta).
#define ACQUIRED_BEFORE(...) KILN_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) KILN_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))

// The caller must hold the given mutexes (exclusively / shared) when calling this function.
#define REQUIRES(...) KILN_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) KILN_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))

// The function acquires / releases the given mutexes (with no argument on a member of a
// CAPABILITY or SCOPED_CAPABILITY class: `this`).
#define ACQUIRE(...) KILN_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) KILN_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) KILN_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) KILN_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
#define RELEASE_GENERIC(...) KILN_THREAD_ANNOTATION_(release_generic_capability(__VA_ARGS__))

// The function tries to acquire; it holds the mutex exactly when it returns the first argument.
#define TRY_ACQUIRE(...) KILN_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define TRY_ACQUIRE_SHARED(...) KILN_THREAD_ANNOTATION_(try_acquire_shared_capability(__VA_ARGS__))

// The caller must NOT hold the given mutexes (the function takes them itself; a non-recursive
// mutex would deadlock).
#define EXCLUDES(...) KILN_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))

// The function checks (at run time, or by contract) that the mutex is held; after the call the
// analysis assumes it is.
#define ASSERT_CAPABILITY(x) KILN_THREAD_ANNOTATION_(assert_capability(x))
#define ASSERT_SHARED_CAPABILITY(x) KILN_THREAD_ANNOTATION_(assert_shared_capability(x))

// The function returns a reference to the given mutex (an accessor the analysis can see through).
#define RETURN_CAPABILITY(x) KILN_THREAD_ANNOTATION_(lock_returned(x))

// Turns the analysis off for one function. Use only where the locking is correct but beyond what
// the analysis can express (a lock handed between objects, a wrapper over std primitives), and
// say why in a comment beside it.
#define NO_THREAD_SAFETY_ANALYSIS KILN_THREAD_ANNOTATION_(no_thread_safety_analysis)
