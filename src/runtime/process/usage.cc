#include "runtime/process/usage.h"

#include <dirent.h>
#include <unistd.h>

#include <deque>
#include <unordered_map>

#include "base/fs.h"
#include "base/strings.h"

namespace kiln::runtime::process_usage {
namespace {

// The value of a "key value" line of `text` (cpu.stat's form), as a number.
std::optional<uint64_t> KeyedValue(std::string_view text, std::string_view key) {
  for (std::string_view line : Split(text, '\n')) {
    line = Trim(line);
    if (line.size() > key.size() && StartsWith(line, key) && (line[key.size()] == ' ' || line[key.size()] == '\t')) {
      return ParseUint64(Trim(line.substr(key.size())));
    }
  }
  return std::nullopt;
}

uint64_t TicksToUsec(uint64_t ticks) {
  static const long hz = [] {
    long v = sysconf(_SC_CLK_TCK);
    return v > 0 ? v : 100;
  }();
  return ticks * (1'000'000 / static_cast<uint64_t>(hz));
}

uint64_t PageSize() {
  static const uint64_t size = [] {
    long v = sysconf(_SC_PAGESIZE);
    return v > 0 ? static_cast<uint64_t>(v) : 4096;
  }();
  return size;
}

}  // namespace

std::optional<ProcStat> ParseProcStat(std::string_view text) {
  size_t open = text.find('(');
  size_t close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) return std::nullopt;
  ProcStat st;
  std::optional<int64_t> pid = ParseInt64(Trim(text.substr(0, open)));
  if (!pid || *pid <= 0) return std::nullopt;
  st.pid = static_cast<int>(*pid);
  // After ") ": state(3) ppid(4) pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
  // utime(14) stime(15) cutime(16) cstime(17) priority nice num_threads itrealvalue starttime
  // vsize rss(24) ... — field numbers as proc(5) gives them.
  std::vector<std::string_view> fields;
  for (std::string_view f : Split(Trim(text.substr(close + 1)), ' ')) {
    if (!f.empty()) fields.push_back(f);
  }
  if (fields.size() < 22) return std::nullopt;  // through rss (field 24 = index 21 here)
  auto field = [&](int number) { return fields[static_cast<size_t>(number - 3)]; };
  if (field(3).size() != 1) return std::nullopt;
  st.state = field(3)[0];
  std::optional<int64_t> ppid = ParseInt64(field(4));
  // cutime/cstime are signed in the kernel's format (long); never negative in practice.
  std::optional<uint64_t> utime = ParseUint64(field(14)), stime = ParseUint64(field(15));
  std::optional<int64_t> cutime = ParseInt64(field(16)), cstime = ParseInt64(field(17));
  std::optional<int64_t> rss = ParseInt64(field(24));
  if (!ppid || !utime || !stime || !cutime || !cstime || !rss) return std::nullopt;
  st.ppid = static_cast<int>(*ppid);
  st.utime = *utime;
  st.stime = *stime;
  st.cutime = *cutime > 0 ? static_cast<uint64_t>(*cutime) : 0;
  st.cstime = *cstime > 0 ? static_cast<uint64_t>(*cstime) : 0;
  st.rss_pages = *rss > 0 ? static_cast<uint64_t>(*rss) : 0;
  return st;
}

std::optional<uint64_t> ParseSmapsRollupPss(std::string_view text) {
  for (std::string_view line : Split(text, '\n')) {
    if (!StartsWith(line, "Pss:")) continue;
    std::string_view rest = Trim(line.substr(4));
    if (!EndsWith(rest, "kB")) return std::nullopt;
    std::optional<uint64_t> kb = ParseUint64(Trim(rest.substr(0, rest.size() - 2)));
    if (!kb) return std::nullopt;
    return *kb * 1024;
  }
  return std::nullopt;
}

std::optional<uint64_t> ParseCpuStatUsageUsec(std::string_view text) { return KeyedValue(text, "usage_usec"); }

std::optional<std::string> ParseCgroupV2Path(std::string_view proc_pid_cgroup) {
  for (std::string_view line : Split(proc_pid_cgroup, '\n')) {
    if (StartsWith(line, "0::")) return std::string(Trim(line.substr(3)));
  }
  return std::nullopt;
}

std::vector<int> ProcessTree(int root, const std::vector<ProcStat>& stats) {
  std::unordered_multimap<int, int> children;
  bool found = false;
  for (const ProcStat& st : stats) {
    children.emplace(st.ppid, st.pid);
    found |= st.pid == root;
  }
  std::vector<int> tree;
  if (!found) return tree;
  std::deque<int> queue{root};
  // Bounded by the number of processes read: a pid is visited once even if the snapshot was
  // torn (a pid reused between two reads could otherwise make a cycle).
  std::unordered_map<int, bool> seen;
  while (!queue.empty() && tree.size() < stats.size()) {
    int pid = queue.front();
    queue.pop_front();
    if (seen[pid]) continue;
    seen[pid] = true;
    tree.push_back(pid);
    auto [begin, end] = children.equal_range(pid);
    for (auto it = begin; it != end; ++it) queue.push_back(it->second);
  }
  return tree;
}

Result<TreeUsage> SampleProcessTree(int root_pid, int expected_ppid, const std::string& proc_dir) {
  std::string root_dir = proc_dir + "/" + std::to_string(root_pid);
  Result<std::string> root_text = ReadFile(root_dir + "/stat");
  if (!root_text.ok()) return Status::NotFound("process " + std::to_string(root_pid) + " is gone");
  std::optional<ProcStat> root = ParseProcStat(*root_text);
  if (!root) return Status::Internal("cannot parse " + root_dir + "/stat");
  if (expected_ppid != 0 && root->ppid != expected_ppid) {
    return Status::FailedPrecondition("process " + std::to_string(root_pid) + " is no longer the instance's program");
  }

  std::vector<ProcStat> stats;
  DIR* d = opendir(proc_dir.c_str());
  if (d == nullptr) return ErrnoStatus("opendir " + proc_dir, errno);
  while (dirent* e = readdir(d)) {
    std::optional<int64_t> pid = ParseInt64(e->d_name);
    if (!pid || *pid <= 0) continue;
    // A process may end between readdir and the read: skip it (its time is in its parent's
    // cutime once waited for).
    Result<std::string> text = ReadFile(proc_dir + "/" + e->d_name + "/stat");
    if (!text.ok()) continue;
    if (std::optional<ProcStat> st = ParseProcStat(*text)) stats.push_back(*st);
  }
  closedir(d);

  std::unordered_map<int, const ProcStat*> by_pid;
  for (const ProcStat& st : stats) by_pid[st.pid] = &st;
  TreeUsage usage;
  for (int pid : ProcessTree(root_pid, stats)) {
    const ProcStat& st = *by_pid.at(pid);
    usage.cpu_usec += TicksToUsec(st.utime + st.stime + st.cutime + st.cstime);
    ++usage.process_count;
    if (st.state == 'Z') continue;  // a zombie holds no memory
    std::optional<uint64_t> pss;
    if (Result<std::string> rollup = ReadFile(proc_dir + "/" + std::to_string(pid) + "/smaps_rollup"); rollup.ok()) {
      pss = ParseSmapsRollupPss(*rollup);
    }
    usage.memory_bytes += pss ? *pss : st.rss_pages * PageSize();
  }
  if (usage.process_count == 0) return Status::NotFound("process " + std::to_string(root_pid) + " is gone");
  return usage;
}

std::optional<std::string> InstanceCgroupDir(int pid, const std::string& instance_id,
                                             const std::vector<std::string>& mount_candidates) {
  Result<std::string> text = ReadFile("/proc/" + std::to_string(pid) + "/cgroup");
  if (!text.ok()) return std::nullopt;
  std::optional<std::string> path = ParseCgroupV2Path(*text);
  if (!path || !EndsWith(*path, "/kiln/" + instance_id)) return std::nullopt;
  for (const std::string& mount : mount_candidates) {
    if (!PathExists(mount + "/cgroup.controllers")) continue;
    std::string dir = mount + *path;
    if (PathExists(dir + "/cpu.stat")) return dir;
  }
  return std::nullopt;
}

Result<CgroupUsage> SampleCgroup(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string cpu_stat, ReadFile(dir + "/cpu.stat"));
  std::optional<uint64_t> usage_usec = ParseCpuStatUsageUsec(cpu_stat);
  if (!usage_usec) return Status::Internal("no usage_usec in " + dir + "/cpu.stat");
  CgroupUsage usage;
  usage.cpu_usec = *usage_usec;
  if (Result<std::string> current = ReadFile(dir + "/memory.current"); current.ok()) {
    usage.memory_bytes = ParseUint64(Trim(*current));
  }
  if (Result<std::string> max = ReadFile(dir + "/memory.max"); max.ok()) {
    usage.memory_limit_bytes = ParseUint64(Trim(*max));  // "max" → nullopt
  }
  return usage;
}

}  // namespace kiln::runtime::process_usage
