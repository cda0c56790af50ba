#include "base/crash_handler.h"

#include <signal.h>

#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "base/sanitizers.h"

namespace kiln {
namespace {

// Recurses until the stack runs out: the report must still be written (alternate stack). The
// depth check the compiler cannot prove false keeps it from calling this infinite recursion.
[[gnu::noinline]] int Recurse(volatile int* depth, int limit) {
  volatile char pad[512];
  pad[0] = static_cast<char>(*depth);
  *depth = *depth + 1;
  if (*depth == limit) return pad[0];
  return Recurse(depth, limit) + pad[0];
}

// ASan and UBSan install their own fatal-signal reporting (and UBSan stops a null write before
// it faults): the handler is tested in the plain build.
#if KILN_UNDER_SANITIZERS
#define SKIP_UNDER_SANITIZERS() GTEST_SKIP() << "sanitizers own fatal signals in this build"
#else
#define SKIP_UNDER_SANITIZERS() (void)0
#endif

[[gnu::noinline]] void CrashWithNullWrite() {
  volatile int* volatile null_pointer = nullptr;
  *null_pointer = 1;
}

TEST(CrashHandlerDeathTest, SegfaultWritesSignalAndSymbolisedBacktrace) {
  SKIP_UNDER_SANITIZERS();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        InstallCrashHandler();
        CrashWithNullWrite();
      },
      testing::KilledBySignal(SIGSEGV),
      "msg=\"fatal signal\" signal=SIGSEGV code=[0-9]+ addr=0x0 pid=[0-9]+ tid=[0-9]+(.|\n)*"
      "msg=\"backtrace\" frame=0 at=(.|\n)*CrashWithNullWrite");
}

TEST(CrashHandlerDeathTest, StackOverflowOnAnotherThreadIsReported) {
  SKIP_UNDER_SANITIZERS();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        InstallCrashHandler();
        std::thread([] {
          InstallAlternateSignalStack();
          volatile int depth = 0;
          (void)Recurse(&depth, -1);
        }).join();
      },
      testing::KilledBySignal(SIGSEGV), "msg=\"fatal signal\" signal=SIGSEGV(.|\n)*Recurse");
}

TEST(CrashHandlerDeathTest, UncaughtExceptionIsNamed) {
  SKIP_UNDER_SANITIZERS();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        InstallCrashHandler();
        std::thread([] { throw std::runtime_error("boom in a worker"); }).join();
      },
      testing::KilledBySignal(SIGABRT),
      "msg=\"terminate called\" exception=\"[^\"]*runtime_error\" what=\"boom in a worker\"(.|\n)*"
      "msg=\"fatal signal\" signal=SIGABRT");
}

}  // namespace
}  // namespace kiln
