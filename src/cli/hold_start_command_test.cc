#include "cli/hold_start_command.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace kiln::cli {
namespace {

struct HoldRun {
  int status = 0;
  std::string output;
  double seconds = 0;
};

// Runs RunHoldStart(args) in a child whose stdout is captured; `act(pid)` runs in the parent
// meanwhile (e.g. sends the release).
HoldRun RunHold(std::vector<std::string> args, const std::function<void(pid_t)>& act = nullptr) {
  int out[2];
  EXPECT_EQ(pipe(out), 0);
  auto start = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    _exit(RunHoldStart(static_cast<int>(args.size()), argv.data()));
  }
  close(out[1]);
  HoldRun run;
  char buf[4096];
  ssize_t n;
  if (act) {
    // The hold line is printed once the signals are blocked, right before the wait: a signal sent
    // after it is pending or taken by the wait, never fatal.
    while (run.output.find("\n") == std::string::npos && (n = read(out[0], buf, sizeof(buf))) > 0) {
      run.output.append(buf, n);
    }
    act(pid);
  }
  while ((n = read(out[0], buf, sizeof(buf))) > 0) run.output.append(buf, n);
  close(out[0]);
  waitpid(pid, &run.status, 0);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

TEST(HoldStartTest, ReleaseExecsTheProgramWithDefaultSignals) {
  HoldRun run = RunHold({"hold-start", "--seconds", "30", "--", "/bin/cat", "/proc/self/status"},
                        [](pid_t pid) { kill(pid, SIGUSR1); });
  ASSERT_TRUE(WIFEXITED(run.status));
  EXPECT_EQ(WEXITSTATUS(run.status), 0);
  EXPECT_LT(run.seconds, 10);
  EXPECT_NE(run.output.find("[kiln] Waiting for remote connection"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("[kiln] released; starting the program"), std::string::npos) << run.output;
  // The program (cat, exec'd in place of the hold) has nothing blocked or ignored by the hold.
  EXPECT_NE(run.output.find("SigBlk:\t0000000000000000"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("SigIgn:\t0000000000000000"), std::string::npos) << run.output;
}

TEST(HoldStartTest, StartsWhenTheHoldPasses) {
  HoldRun run = RunHold({"hold-start", "--seconds", "1", "--", "/bin/echo", "ran"});
  ASSERT_TRUE(WIFEXITED(run.status));
  EXPECT_EQ(WEXITSTATUS(run.status), 0);
  EXPECT_GE(run.seconds, 0.9);
  EXPECT_NE(run.output.find("the hold of 1 s passed; starting the program"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("\nran\n"), std::string::npos) << run.output;
}

TEST(HoldStartTest, StoppedWhileHolding) {
  HoldRun run =
      RunHold({"hold-start", "--seconds", "30", "--", "/bin/echo", "ran"}, [](pid_t pid) { kill(pid, SIGTERM); });
  ASSERT_TRUE(WIFEXITED(run.status));
  EXPECT_EQ(WEXITSTATUS(run.status), 128 + SIGTERM);
  EXPECT_EQ(run.output.find("ran"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("stopped while waiting for a remote connection"), std::string::npos) << run.output;
}

TEST(HoldStartTest, AfterExitHoldEndsOnReleaseOrTime) {
  HoldRun released = RunHold({"hold-start", "--seconds", "30", "--after-exit"}, [](pid_t pid) { kill(pid, SIGUSR1); });
  ASSERT_TRUE(WIFEXITED(released.status));
  EXPECT_EQ(WEXITSTATUS(released.status), 0);
  EXPECT_LT(released.seconds, 10);
  EXPECT_NE(released.output.find("released; the hold ends"), std::string::npos) << released.output;
  HoldRun passed = RunHold({"hold-start", "--seconds", "1", "--after-exit"});
  EXPECT_EQ(WEXITSTATUS(passed.status), 0);
  EXPECT_NE(passed.output.find("the hold of 1 s passed; the hold ends"), std::string::npos) << passed.output;
  EXPECT_EQ(WEXITSTATUS(RunHold({"hold-start", "--seconds", "1", "--after-exit", "--", "/bin/true"}).status), 2);
}

TEST(HoldStartTest, BadCommandLinesAndMissingPrograms) {
  EXPECT_EQ(WEXITSTATUS(RunHold({"hold-start", "--seconds", "x", "--", "/bin/true"}).status), 2);
  EXPECT_EQ(WEXITSTATUS(RunHold({"hold-start", "--seconds", "1"}).status), 2);
  EXPECT_EQ(WEXITSTATUS(RunHold({"hold-start", "--", "/bin/true"}).status), 2);
  HoldRun missing = RunHold({"hold-start", "--seconds", "0", "--", "/nonexistent/program"});
  EXPECT_EQ(WEXITSTATUS(missing.status), 127);
  EXPECT_NE(missing.output.find("cannot execute /nonexistent/program"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace kiln::cli
