// What the agent reads before it enters an instance: the environment merge, ids, cgroup paths,
// and the toolkit's user process, on captured texts, a fake /proc tree and real processes.
#include "access/instance_entry.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/fs.h"

namespace kiln::access {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::Not;

TEST(InstanceEntryTest, ParsesEnvironAndLaysTheUserProcessOverPid1) {
  using namespace std::string_literals;
  std::string text = "PATH=/bin\0HOME=/root\0junk\0SM_HOSTS=x\0"s;
  EXPECT_THAT(ParseEnviron(text), ElementsAre("PATH=/bin", "HOME=/root", "SM_HOSTS=x"));
  EXPECT_THAT(ParseEnviron(std::string_view("A=\0=b\0", 6)), ElementsAre("A="));
  EXPECT_THAT(MergeEnvironment({"PATH=/bin", "HOME=/root", "A=1"}, {"A=2", "SM_CURRENT_HOST=algo-1", "PATH=/x"}),
              ElementsAre("PATH=/x", "HOME=/root", "A=2", "SM_CURRENT_HOST=algo-1"));
}

TEST(InstanceEntryTest, TakesTheEffectiveIdsFromStatus) {
  std::string status = "Name:\tpython\nUid:\t1000\t1001\t1001\t1001\nGid:\t50\t51\t51\t51\nGroups:\t4 24\n";
  auto ids = ParseStatusIds(status);
  ASSERT_TRUE(ids.has_value());
  EXPECT_EQ(ids->first, 1001);
  EXPECT_EQ(ids->second, 51);
  EXPECT_FALSE(ParseStatusIds("Name:\tx\n").has_value());
}

TEST(InstanceEntryTest, ResolvesCgroupV2AndV1PathsUnderTheirMounts) {
  const std::string mountinfo =
      "24 1 0:22 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
      "30 24 0:26 / /sys/fs/cgroup/cpu,cpuacct rw shared:10 - cgroup cgroup rw,cpu,cpuacct\n"
      "31 24 0:27 / /sys/fs/cgroup/memory rw shared:11 - cgroup cgroup rw,memory\n"
      "32 24 0:28 /docker/abc /sys/fs/cgroup/pids rw shared:12 - cgroup cgroup rw,pids\n"
      "33 24 0:29 / /sys/fs/cgroup/systemd rw shared:13 - cgroup cgroup rw,xattr,name=systemd\n"
      "40 1 8:1 / /data\\040dir rw - ext4 /dev/sda1 rw\n";
  std::vector<CgroupMembership> got = ResolveCgroups(
      "0::/kiln/training-j-algo-1\n"
      "5:cpu,cpuacct:/kiln/x\n"
      "4:memory:/\n"
      "3:pids:/docker/abc/kiln/x\n"
      "2:pids:/elsewhere\n"
      "1:name=systemd:/user.slice\n"
      "7:devices:/kiln/x\n",
      mountinfo);
  std::vector<std::string> files;
  for (const CgroupMembership& cg : got) files.push_back(cg.procs_file);
  EXPECT_THAT(files,
              ElementsAre("/sys/fs/cgroup/kiln/training-j-algo-1/cgroup.procs",
                          "/sys/fs/cgroup/cpu,cpuacct/kiln/x/cgroup.procs", "/sys/fs/cgroup/memory/cgroup.procs",
                          "/sys/fs/cgroup/pids/kiln/x/cgroup.procs", "/sys/fs/cgroup/systemd/user.slice/cgroup.procs"));
  EXPECT_EQ(got[0].line, "0::/kiln/training-j-algo-1");
}

// A /proc-like tree: 10 (PID 1, `train`) → 11 (the toolkit, SM_TRAINING_ENV) → 12 (the user's
// script, SM_CURRENT_HOST) and → 13 (newer, equally deep, SM_CURRENT_HOST); 20 is outside.
class FakeProcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kiln-h2-proc-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)RemoveAll(dir_); }
  void AddProcess(int pid, int ppid, unsigned long long start, const std::string& environ) {
    std::string p = dir_ + "/" + std::to_string(pid);
    ASSERT_TRUE(MakeDirs(p).ok());
    std::string stat = std::to_string(pid) + " (a (weird) name) S " + std::to_string(ppid);
    for (int field = 5; field <= 21; ++field) stat += " 0";
    stat += " " + std::to_string(start) + " 0 0\n";
    ASSERT_TRUE(WriteFileAtomic(p + "/stat", stat).ok());
    ASSERT_TRUE(WriteFileAtomic(p + "/environ", environ).ok());
    ASSERT_TRUE(WriteFileAtomic(p + "/status", "Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n").ok());
    ASSERT_TRUE(WriteFileAtomic(p + "/cgroup", "0::/\n").ok());
  }
  std::string dir_;
};

TEST_F(FakeProcTest, FindsTheDeepestNewestProcessWithToolkitVariables) {
  using namespace std::string_literals;
  AddProcess(10, 1, 100, "PATH=/bin\0A=pid1\0"s);
  AddProcess(11, 10, 110, "PATH=/bin\0SM_TRAINING_ENV={}\0"s);
  AddProcess(12, 11, 120, "PATH=/bin\0SM_CURRENT_HOST=algo-1\0A=old\0"s);
  AddProcess(13, 11, 130, "PATH=/usr/bin\0SM_CURRENT_HOST=algo-1\0A=script\0"s);
  AddProcess(14, 13, 140, "PATH=/bin\0"s);  // deeper, but not the toolkit's
  AddProcess(20, 1, 200, "SM_CURRENT_HOST=algo-9\0"s);
  EXPECT_EQ(FindUserProcess(10, dir_), 13);
  EXPECT_EQ(FindUserProcess(12, dir_), 0);
  EXPECT_EQ(FindUserProcess(99, dir_), 0);
  Result<InstanceIdentity> who = ReadInstanceIdentity(10, dir_);
  ASSERT_TRUE(who.ok()) << who.status().ToString();
  EXPECT_EQ(who->user_process_pid, 13);
  EXPECT_THAT(who->environment, ElementsAre("PATH=/usr/bin", "A=script", "SM_CURRENT_HOST=algo-1"));
  EXPECT_EQ(who->start_time, 100u);
  EXPECT_EQ(ReadInstanceIdentity(99, dir_).status().code(), StatusCode::kNotFound);
}

// Real processes: a shell (the "PID 1") whose background child has the toolkit's variables.
TEST(InstanceEntryLiveTest, ReadsARealProcessTree) {
  pid_t root = fork();
  ASSERT_GE(root, 0);
  if (root == 0) {
    const char* env[] = {"PATH=/usr/bin:/bin", "ONLY_IN_PID1=yes", "SHARED=from-pid1", nullptr};
    execle("/bin/sh", "sh", "-c", "SHARED=from-script SM_CURRENT_HOST=algo-2 sleep 30 & wait", nullptr, env);
    _exit(127);
  }
  Result<InstanceIdentity> who = Status::Unavailable("not read yet");
  for (int i = 0; i < 200; ++i) {
    who = ReadInstanceIdentity(root);
    if (who.ok() && who->user_process_pid != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(who.ok()) << who.status().ToString();
  EXPECT_NE(who->user_process_pid, 0);
  EXPECT_THAT(who->environment, Contains("ONLY_IN_PID1=yes"));
  EXPECT_THAT(who->environment, Contains("SHARED=from-script"));
  EXPECT_THAT(who->environment, Contains("SM_CURRENT_HOST=algo-2"));
  EXPECT_THAT(who->environment, Not(Contains("SHARED=from-pid1")));
  EXPECT_EQ(who->uid, static_cast<int>(geteuid()));
  EXPECT_EQ(who->gid, static_cast<int>(getegid()));
  EXPECT_FALSE(who->cgroups.empty());  // at least the hierarchy this test runs in
  EXPECT_EQ(ProcessStartTime(root), who->start_time);
  kill(who->user_process_pid, SIGKILL);
  kill(root, SIGKILL);
  waitpid(root, nullptr, 0);
  EXPECT_EQ(ProcessStartTime(root), 0u);
}

}  // namespace
}  // namespace kiln::access
