#include "runtime/process/usage.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "base/fs.h"

namespace kiln::runtime::process_usage {
namespace {

TEST(ParseProcStatTest, ReadsTheFieldsAfterTheCommandName) {
  // A real line (python3 with 3 threads), comm with a space and a ')' in it.
  const char* text =
      "4242 (my) proc x) S 4200 4242 4200 0 -1 4194560 2456 0 0 0 1234 567 89 10 20 0 3 0 123456 "
      "41259008 2048 18446744073709551615 1 1 0 0 0 0 0 16781312 2 0 0 0 17 1 0 0 0 0 0\n";
  std::optional<ProcStat> st = ParseProcStat(text);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->pid, 4242);
  EXPECT_EQ(st->ppid, 4200);
  EXPECT_EQ(st->state, 'S');
  EXPECT_EQ(st->utime, 1234u);
  EXPECT_EQ(st->stime, 567u);
  EXPECT_EQ(st->cutime, 89u);
  EXPECT_EQ(st->cstime, 10u);
  EXPECT_EQ(st->rss_pages, 2048u);
}

TEST(ParseProcStatTest, RefusesTruncatedOrMalformedLines) {
  EXPECT_FALSE(ParseProcStat("").has_value());
  EXPECT_FALSE(ParseProcStat("12 (sh) S 1 2 3").has_value());
  EXPECT_FALSE(ParseProcStat("12 sh S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22").has_value());
  EXPECT_FALSE(ParseProcStat("x (sh) S 1 1 1 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 1 1 1").has_value());
  EXPECT_FALSE(ParseProcStat("12 (sh) S 1 1 1 0 -1 0 0 0 0 0 a 1 0 0 20 0 1 0 1 1 1").has_value());
}

TEST(ParseProcStatTest, ReadsThisProcess) {
  std::optional<ProcStat> st = ParseProcStat(ReadFile("/proc/self/stat").value());
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->pid, getpid());
  EXPECT_EQ(st->ppid, getppid());
  EXPECT_GT(st->rss_pages, 0u);
}

TEST(ParseSmapsRollupPssTest, ReadsPssInBytes) {
  const char* text =
      "55d0c2a6b000-7ffd7f9f1000 ---p 00000000 00:00 0                          [rollup]\n"
      "Rss:               12345 kB\n"
      "Pss:                6789 kB\n"
      "Pss_Anon:           4000 kB\n";
  EXPECT_EQ(ParseSmapsRollupPss(text), 6789u * 1024);
  EXPECT_FALSE(ParseSmapsRollupPss("Rss: 1 kB\n").has_value());
  EXPECT_FALSE(ParseSmapsRollupPss("Pss: lots\n").has_value());
}

TEST(ParseCpuStatTest, ReadsUsageUsec) {
  const char* text = "usage_usec 8210771\nuser_usec 5000000\nsystem_usec 3210771\nnr_periods 0\nnr_throttled 0\n";
  EXPECT_EQ(ParseCpuStatUsageUsec(text), 8210771u);
  EXPECT_FALSE(ParseCpuStatUsageUsec("user_usec 5\n").has_value());
  EXPECT_FALSE(ParseCpuStatUsageUsec("usage_usec_x 5\n").has_value());
}

TEST(ParseCgroupV2PathTest, FindsTheUnifiedLine) {
  EXPECT_EQ(ParseCgroupV2Path("12:memory:/x\n0::/kiln/job-1-algo-1\n"), "/kiln/job-1-algo-1");
  EXPECT_FALSE(ParseCgroupV2Path("4:memory:/process_api/abc\n1:cpu:/\n").has_value());
}

ProcStat Stat(int pid, int ppid) {
  ProcStat st;
  st.pid = pid;
  st.ppid = ppid;
  return st;
}

TEST(ProcessTreeTest, CollectsDescendantsOnly) {
  std::vector<ProcStat> stats = {Stat(1, 0),     Stat(100, 1), Stat(101, 100), Stat(102, 101),
                                 Stat(103, 100), Stat(200, 1), Stat(201, 200)};
  std::vector<int> tree = ProcessTree(100, stats);
  ASSERT_FALSE(tree.empty());
  EXPECT_EQ(tree.front(), 100);  // the root first
  std::sort(tree.begin(), tree.end());
  EXPECT_EQ(tree, (std::vector<int>{100, 101, 102, 103}));
  EXPECT_TRUE(ProcessTree(999, stats).empty());
  EXPECT_EQ(ProcessTree(201, stats), (std::vector<int>{201}));
}

TEST(ProcessTreeTest, ATornSnapshotWithACycleEnds) {
  // A pid reused between two reads can make a process look like its own ancestor.
  std::vector<ProcStat> stats = {Stat(10, 11), Stat(11, 10)};
  EXPECT_EQ(ProcessTree(10, stats).size(), 2u);
}

// A real process tree: a child that forks a grandchild, both burning CPU. Their CPU time grows
// by roughly the wall time × 2 (on hosts with 2 cores free) and at least by some of it.
TEST(SampleProcessTreeTest, SumsCpuAndMemoryOfARealTree) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Its own process group, so that one kill ends both; both die with their parent too.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (fork() == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      while (true) {
      }
    }
    while (true) {
    }
  }
  setpgid(child, child);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the grandchild exist
  Result<TreeUsage> first = SampleProcessTree(child, getpid());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  Result<TreeUsage> second = SampleProcessTree(child, getpid());
  auto wall_usec = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->process_count, 2);
  EXPECT_GT(second->memory_bytes, 0u);
  EXPECT_GE(second->cpu_usec, first->cpu_usec);
  double percent = 100.0 * static_cast<double>(second->cpu_usec - first->cpu_usec) / static_cast<double>(wall_usec);
  // Two busy processes: more than a trickle even on a loaded 2-core host, never more than
  // the host's cores allow (+ tick granularity).
  EXPECT_GT(percent, 10.0);
  EXPECT_LE(percent, 100.0 * static_cast<double>(std::thread::hardware_concurrency()) + 10.0);

  // The wrong parent (a reused pid) is refused; a pid that is gone is NotFound.
  EXPECT_EQ(SampleProcessTree(child, 1).status().code(), StatusCode::kFailedPrecondition);
  kill(-child, SIGKILL);
  int st;
  waitpid(child, &st, 0);
  EXPECT_EQ(SampleProcessTree(child, getpid()).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace kiln::runtime::process_usage
