#include "base/crash_handler.h"

#define BOOST_STACKTRACE_LINK
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <typeinfo>

#include <boost/stacktrace.hpp>

#include "base/log_flush.h"

namespace kiln {

namespace {

constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
constexpr unsigned kWatchdogSeconds = 5;
constexpr size_t kMaxFrames = 64;

std::atomic<bool> g_installed{false};
std::atomic<bool> g_crashing{false};

// --- async-signal-safe line building: fixed buffer, no allocation --------------------------------

class LineBuffer {
 public:
  void Append(const char* text) { Append(text, std::strlen(text)); }
  void Append(const char* text, size_t n) {
    for (size_t i = 0; i < n && size_ < sizeof(data_) - 1; ++i) data_[size_++] = text[i];
  }
  void AppendUnsigned(unsigned long long value, unsigned base = 10, int min_digits = 1) {
    char digits[32];
    int count = 0;
    do {
      digits[count++] = "0123456789abcdef"[value % base];
      value /= base;
    } while (value != 0 && count < 32);
    while (count < min_digits && count < 32) digits[count++] = '0';
    while (count > 0) Append(&digits[--count], 1);
  }
  void AppendSigned(long long value) {
    if (value < 0) {
      Append("-");
      AppendUnsigned(static_cast<unsigned long long>(-(value + 1)) + 1);
    } else {
      AppendUnsigned(static_cast<unsigned long long>(value));
    }
  }
  // "ts=2026-12-01T16:06:22.123Z level=critical " as the logger writes it (logfmt).
  void AppendPrefix() {
    timespec now{};
    clock_gettime(CLOCK_REALTIME, &now);
    long long days = now.tv_sec / 86400, secs = now.tv_sec % 86400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    days += 719468;
    long long era = (days >= 0 ? days : days - 146096) / 146097;
    long long doe = days - era * 146097;
    long long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    long long doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    long long mp = (5 * doy + 2) / 153;
    long long day = doy - (153 * mp + 2) / 5 + 1;
    long long month = mp < 10 ? mp + 3 : mp - 9;
    long long year = yoe + era * 400 + (month <= 2);
    Append("ts=");
    AppendUnsigned(static_cast<unsigned long long>(year), 10, 4);
    Append("-");
    AppendUnsigned(static_cast<unsigned long long>(month), 10, 2);
    Append("-");
    AppendUnsigned(static_cast<unsigned long long>(day), 10, 2);
    Append("T");
    AppendUnsigned(static_cast<unsigned long long>(secs / 3600), 10, 2);
    Append(":");
    AppendUnsigned(static_cast<unsigned long long>(secs / 60 % 60), 10, 2);
    Append(":");
    AppendUnsigned(static_cast<unsigned long long>(secs % 60), 10, 2);
    Append(".");
    AppendUnsigned(static_cast<unsigned long long>(now.tv_nsec / 1000000), 10, 3);
    Append("Z level=critical ");
  }
  // A logfmt quoted value: quotes and backslashes escaped, control characters dropped.
  void AppendQuoted(const char* text, size_t n) {
    Append("\"");
    for (size_t i = 0; i < n; ++i) {
      char c = text[i];
      if (c == '"' || c == '\\') {
        Append("\\");
        Append(&c, 1);
      } else if (static_cast<unsigned char>(c) >= 0x20) {
        Append(&c, 1);
      }
    }
    Append("\"");
  }
  void WriteLine() {
    data_[size_++] = '\n';
    size_t done = 0;
    while (done < size_) {
      ssize_t n = ::write(STDERR_FILENO, data_ + done, size_ - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    size_ = 0;
  }

 private:
  char data_[2048];
  size_t size_ = 0;
};

const char* SignalName(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    case SIGALRM: return "SIGALRM";
    default: return "signal";
  }
}

// Writes the symbolised frames, one line each. Not async-signal-safe (see the header); the
// watchdog bounds it.
void WriteBacktrace(size_t skip) {
  boost::stacktrace::stacktrace trace(skip, kMaxFrames);
  size_t index = 0;
  for (const boost::stacktrace::frame& frame : trace) {
    std::string where = boost::stacktrace::to_string(frame);
    LineBuffer line;
    line.AppendPrefix();
    line.Append("msg=\"backtrace\" frame=");
    line.AppendUnsigned(index++);
    line.Append(" at=");
    line.AppendQuoted(where.data(), where.size());
    line.WriteLine();
  }
}

// Restores the default action and re-raises, so the process ends the way the signal says.
[[noreturn]] void DieWith(int sig) {
  signal(sig, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  raise(sig);
  _exit(128 + sig);
}

void OnWatchdog(int) {
  LineBuffer line;
  line.AppendPrefix();
  line.Append("msg=\"crash report cut short: symbolising the backtrace took too long\"");
  line.WriteLine();
  DieWith(SIGABRT);
}

void OnFatalSignal(int sig, siginfo_t* info, void*) {
  if (g_crashing.exchange(true)) {
    // A second thread crashing, or a crash inside the report: the first report stands.
    DieWith(sig);
  }
  signal(SIGALRM, OnWatchdog);
  alarm(kWatchdogSeconds);
  // What was logged just before is the best clue; write it first unless its writer is mid-write.
  TryFlushLogs();
  LineBuffer line;
  line.AppendPrefix();
  line.Append("msg=\"fatal signal\" signal=");
  line.Append(SignalName(sig));
  line.Append(" code=");
  line.AppendSigned(info != nullptr ? info->si_code : 0);
  if (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL) {
    line.Append(" addr=0x");
    line.AppendUnsigned(reinterpret_cast<uintptr_t>(info != nullptr ? info->si_addr : nullptr), 16);
  }
  line.Append(" pid=");
  line.AppendSigned(getpid());
  line.Append(" tid=");
  line.AppendSigned(static_cast<long long>(syscall(SYS_gettid)));
  line.WriteLine();
  WriteBacktrace(/*skip=*/0);
  DieWith(sig);
}

void OnTerminate() {
  // Uncaught exception (or std::terminate): name it, then die through SIGABRT's report.
  LineBuffer line;
  line.AppendPrefix();
  line.Append("msg=\"terminate called\"");
  if (std::exception_ptr current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& e) {
      line.Append(" exception=");
      line.AppendQuoted(typeid(e).name(), std::strlen(typeid(e).name()));
      line.Append(" what=");
      line.AppendQuoted(e.what(), std::strlen(e.what()));
    } catch (...) {
      line.Append(" exception=\"unknown\"");
    }
  }
  TryFlushLogs();
  line.WriteLine();
  std::abort();
}

struct AltStack {
  std::unique_ptr<char[]> memory;
  ~AltStack() {
    if (memory) {
      stack_t off{};
      off.ss_flags = SS_DISABLE;
      sigaltstack(&off, nullptr);
    }
  }
};

}  // namespace

void InstallAlternateSignalStack() {
  thread_local AltStack stack;
  if (stack.memory) return;
  // Room for the handler and libbacktrace's symbolising (it reads DWARF with some recursion).
  const size_t size = 256 * 1024;
  stack.memory.reset(new char[size]);
  stack_t ss{};
  ss.ss_sp = stack.memory.get();
  ss.ss_size = size;
  if (sigaltstack(&ss, nullptr) != 0) stack.memory.reset();
}

void InstallCrashHandler() {
  InstallAlternateSignalStack();
  if (g_installed.exchange(true)) return;
  struct sigaction action {};
  action.sa_sigaction = OnFatalSignal;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (int sig : kFatalSignals) sigaction(sig, &action, nullptr);
  std::set_terminate(OnTerminate);
  // libbacktrace reads /proc/self/exe lazily; warming it up here keeps the first crash's report
  // from doing file I/O for the symbol tables on an already broken heap.
  (void)boost::stacktrace::to_string(boost::stacktrace::stacktrace(0, 1));
}

}  // namespace kiln
