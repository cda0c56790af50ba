#include "cli/hold_start_command.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "base/strings.h"

namespace kiln::cli {
namespace {

void Say(const std::string& line) {
  std::string text = "[kiln] " + line + "\n";
  (void)!::write(STDOUT_FILENO, text.data(), text.size());
}

}  // namespace

int RunHoldStart(int argc, char** argv) {
  int seconds = -1;
  bool after_exit = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--after-exit") {
      after_exit = true;
      continue;
    }
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "--seconds" && i + 1 < argc) {
      std::optional<int64_t> n = ParseInt64(argv[++i]);
      if (!n || *n < 0 || *n > 24 * 3600) {
        std::fprintf(stderr, "kiln hold-start: --seconds must be a whole number of seconds, not %s\n", argv[i]);
        return 2;
      }
      seconds = static_cast<int>(*n);
      continue;
    }
    std::fprintf(stderr, "kiln hold-start: unexpected argument %s (usage: kiln hold-start --seconds N -- PROGRAM...)\n",
                 argv[i]);
    return 2;
  }
  if (seconds < 0 || (i >= argc) != after_exit) {
    std::fprintf(stderr,
                 "usage: kiln hold-start --seconds N -- PROGRAM [ARGS...]\n"
                 "       kiln hold-start --seconds N --after-exit\n");
    return 2;
  }
  std::vector<char*> program(argv + i, argv + argc);
  program.push_back(nullptr);

  // Blocked, then taken with sigtimedwait: no handler runs, so nothing of the hold survives exec.
  sigset_t waited;
  sigemptyset(&waited);
  for (int s : {SIGUSR1, SIGTERM, SIGINT, SIGHUP}) sigaddset(&waited, s);
  sigset_t previous;
  sigprocmask(SIG_BLOCK, &waited, &previous);

  if (after_exit) {
    Say("held after the program's exit until `kiln release <target>` (or `kill -USR1 1` inside the instance), at "
        "the latest " +
        std::to_string(seconds) + " s");
  } else {
    Say("Waiting for remote connection: the program starts after `kiln release <target>` (or `kill -USR1 1` inside "
        "the instance), at the latest in " +
        std::to_string(seconds) + " s");
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::string why;
  while (why.empty()) {
    auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      why = "the hold of " + std::to_string(seconds) + " s passed";
      break;
    }
    timespec timeout{static_cast<time_t>(left.count() / 1000000000), static_cast<long>(left.count() % 1000000000)};
    siginfo_t info{};
    int got = sigtimedwait(&waited, &info, &timeout);
    if (got == SIGUSR1) {
      why = "released";
    } else if (got == SIGTERM || got == SIGINT || got == SIGHUP) {
      Say(std::string(after_exit ? "hold ended" : "stopped while waiting for a remote connection") + " (" +
          strsignal(got) + ")");
      return 128 + got;
    } else if (got < 0 && errno != EINTR && errno != EAGAIN) {
      why = std::string("cannot wait for a release (") + std::strerror(errno) + ")";
    }
  }
  if (after_exit) {
    Say(why + "; the hold ends");
    return 0;
  }
  Say(why + "; starting the program");

  // Back to how the runtime started us: a release that raced with the deadline is discarded
  // (setting SIG_IGN drops a pending signal), then default dispositions and the original mask.
  for (int s : {SIGUSR1, SIGTERM, SIGINT, SIGHUP}) {
    signal(s, SIG_IGN);
    signal(s, SIG_DFL);
  }
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  execvp(program[0], program.data());
  const int error = errno;
  Say(std::string("cannot execute ") + program[0] + ": " + std::strerror(error));
  return 127;
}

}  // namespace kiln::cli
