#include "control/capacity.h"

#include <gtest/gtest.h>
#include <sched.h>

namespace kiln::control {
namespace {

TEST(CapacityTest, ParsesMemInfo) {
  const char* meminfo =
      "MemTotal:       32780412 kB\n"
      "MemFree:         1234567 kB\n"
      "MemAvailable:   20000000 kB\n";
  EXPECT_EQ(ParseMemInfoTotal(meminfo), 32780412ull * 1024);
  EXPECT_EQ(ParseMemInfoTotal("MemFree: 5 kB\n"), std::nullopt);
  EXPECT_EQ(ParseMemInfoTotal("MemTotal: lots kB\n"), std::nullopt);
}

TEST(CapacityTest, ParsesCgroupLimits) {
  EXPECT_EQ(ParseCgroupMemoryLimit("max\n"), std::nullopt);
  EXPECT_EQ(ParseCgroupMemoryLimit("8589934592\n"), 8589934592ull);
  EXPECT_EQ(ParseCgroupMemoryLimit("9223372036854771712\n"), std::nullopt);  // cgroup v1 "unlimited"
  EXPECT_EQ(ParseCgroupMemoryLimit("junk"), std::nullopt);
  EXPECT_EQ(ParseCgroupV2Path("0::/system.slice/kiln.service\n"), "/system.slice/kiln.service");
  EXPECT_EQ(ParseCgroupV2Path("12:memory:/user.slice\n11:cpu:/\n0::/user.slice/x\n"), "/user.slice/x");
  EXPECT_EQ(ParseCgroupV2Path("12:memory:/user.slice\n"), std::nullopt);
}

TEST(CapacityTest, DiscoversThisHost) {
  HostCapacity capacity = DiscoverHostCapacity();
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(static_cast<int>(capacity.cpus.size()), CPU_COUNT(&set));
  for (int cpu : capacity.cpus) EXPECT_TRUE(CPU_ISSET(cpu, &set)) << cpu;
  EXPECT_GT(capacity.memory_bytes, 64ull << 20);
}

}  // namespace
}  // namespace kiln::control
