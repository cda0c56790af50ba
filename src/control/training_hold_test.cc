#include "control/training_hold.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

namespace kiln::control {
namespace {

TEST(TrainingHoldTest, TagValues) {
  EXPECT_FALSE(HoldStartSeconds({{"other", "1"}})->has_value());
  EXPECT_EQ(**HoldStartSeconds({{"other", "1"}, {kHoldStartTag, "600"}}), 600);
  EXPECT_EQ(**HoldStartSeconds({{kHoldStartTag, " 0 "}}), 0);
  EXPECT_EQ(**HoldStartSeconds({{kHoldStartTag, "3600"}}), 3600);
  for (const char* bad : {"3601", "-1", "ten", "", "1.5"}) {
    auto hold = HoldStartSeconds({{kHoldStartTag, bad}});
    ASSERT_FALSE(hold.ok()) << bad;
    EXPECT_NE(hold.status().message().find("from 0 to 3600"), std::string::npos) << hold.status().message();
  }
}

TEST(TrainingHoldTest, IdleStopTag) {
  EXPECT_FALSE(IdleStopSeconds({{kHoldStartTag, "5"}})->has_value());
  EXPECT_EQ(**IdleStopSeconds({{kIdleStopTag, "1800"}}), 1800);
  for (const char* bad : {"0", "-5", "604801", "half an hour"}) {
    auto idle = IdleStopSeconds({{kIdleStopTag, bad}});
    ASSERT_FALSE(idle.ok()) << bad;
    EXPECT_NE(idle.status().message().find("from 1 to 604800"), std::string::npos) << idle.status().message();
  }
}

TEST(TrainingHoldTest, IdleSince) {
  // Nobody connected: idle since training started.
  EXPECT_EQ(IdleSinceMillis({}, 1000), 1000);
  store::RemoteConnectionRecord closed;
  closed.end_millis = 5000;
  store::RemoteConnectionRecord older;
  older.end_millis = 3000;
  EXPECT_EQ(IdleSinceMillis({closed, older}, 1000), 5000);
  // A connection that ended before training started (held before start) counts from the start.
  EXPECT_EQ(IdleSinceMillis({older}, 4000), 4000);
  store::RemoteConnectionRecord open;
  EXPECT_EQ(IdleSinceMillis({closed, open}, 1000), std::nullopt);
}

TEST(TrainingHoldTest, WrapsTheProgram) {
  EXPECT_EQ(HoldStartArgv("/usr/bin/kiln", 30, {"/usr/bin/python3", "train.py"}),
            (std::vector<std::string>{"/usr/bin/kiln", "hold-start", "--seconds", "30", "--", "/usr/bin/python3",
                                      "train.py"}));
}

TEST(TrainingHoldTest, TellsAHoldFromItsProgram) {
  // A process whose second word is "hold-start" (sh running a script of that name), then one
  // whose is not.
  auto dir = std::filesystem::temp_directory_path() / ("kiln-hold-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "hold-start") << "sleep 30\n"; }
  pid_t held = fork();
  if (held == 0) {
    if (chdir(dir.c_str()) != 0) _exit(1);
    execl("/bin/sh", "sh", "hold-start", static_cast<char*>(nullptr));
    _exit(127);
  }
  bool seen = false;
  for (int i = 0; i < 200 && !seen; ++i) {
    seen = IsHoldingBeforeStart(held);
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(seen);
  kill(held, SIGKILL);
  waitpid(held, nullptr, 0);
  EXPECT_FALSE(IsHoldingBeforeStart(held));
  EXPECT_FALSE(IsHoldingBeforeStart(getpid()));
  EXPECT_FALSE(IsHoldingBeforeStart(0));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln::control
