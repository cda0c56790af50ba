#include "control/capacity.h"

#include <sched.h>

#include <algorithm>
#include <string>

#include "base/fs.h"
#include "base/log.h"
#include "base/strings.h"

namespace kiln::control {

std::optional<uint64_t> ParseMemInfoTotal(std::string_view meminfo) {
  for (std::string_view line : Split(meminfo, '\n')) {
    if (!StartsWith(line, "MemTotal:")) continue;
    std::string_view rest = Trim(line.substr(9));
    size_t space = rest.find(' ');
    std::string_view number = rest.substr(0, space);
    std::optional<uint64_t> kib = ParseUint64(number);
    if (!kib) return std::nullopt;
    // The unit is always "kB" (KiB) in /proc/meminfo.
    return *kib * 1024;
  }
  return std::nullopt;
}

std::optional<uint64_t> ParseCgroupMemoryLimit(std::string_view text) {
  text = Trim(text);
  if (text == "max") return std::nullopt;
  std::optional<uint64_t> bytes = ParseUint64(text);
  // cgroup v1 reports "no limit" as a huge page-aligned number (0x7FFFFFFFFFFFF000).
  if (!bytes || *bytes >= (1ull << 62)) return std::nullopt;
  return bytes;
}

std::optional<std::string> ParseCgroupV2Path(std::string_view proc_self_cgroup) {
  for (std::string_view line : Split(proc_self_cgroup, '\n')) {
    if (StartsWith(line, "0::")) return std::string(Trim(line.substr(3)));
  }
  return std::nullopt;
}

namespace {

std::vector<int> AffinityCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
    }
  } else {
    KLOG(warn, "capacity: sched_getaffinity failed", {});
  }
  return cpus;
}

// The tightest memory limit of this process's cgroup and its ancestors (v2), or the v1 limit.
std::optional<uint64_t> CgroupMemoryLimit() {
  std::optional<uint64_t> limit;
  auto lower = [&](std::optional<uint64_t> v) {
    if (v && (!limit || *v < *limit)) limit = v;
  };
  Result<std::string> self = ReadFile("/proc/self/cgroup");
  if (self.ok()) {
    if (std::optional<std::string> path = ParseCgroupV2Path(*self)) {
      std::string dir = *path;
      while (true) {
        std::string file = "/sys/fs/cgroup" + (dir == "/" ? std::string() : dir) + "/memory.max";
        if (Result<std::string> text = ReadFile(file); text.ok()) lower(ParseCgroupMemoryLimit(*text));
        if (dir.empty() || dir == "/") break;
        size_t slash = dir.rfind('/');
        dir = slash == 0 || slash == std::string::npos ? "/" : dir.substr(0, slash);
      }
    }
  }
  if (Result<std::string> v1 = ReadFile("/sys/fs/cgroup/memory/memory.limit_in_bytes"); v1.ok()) {
    lower(ParseCgroupMemoryLimit(*v1));
  }
  return limit;
}

}  // namespace

HostCapacity DiscoverHostCapacity() {
  HostCapacity capacity;
  capacity.cpus = AffinityCpus();
  if (Result<std::string> meminfo = ReadFile("/proc/meminfo"); meminfo.ok()) {
    capacity.memory_bytes = ParseMemInfoTotal(*meminfo).value_or(0);
  }
  if (capacity.memory_bytes == 0) KLOG(warn, "capacity: could not read MemTotal from /proc/meminfo", {});
  if (std::optional<uint64_t> limit = CgroupMemoryLimit()) {
    if (capacity.memory_bytes == 0 || *limit < capacity.memory_bytes) capacity.memory_bytes = *limit;
  }
  capacity.gpus = runtime::DiscoverGpus();
  return capacity;
}

}  // namespace kiln::control
