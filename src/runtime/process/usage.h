#pragma once
// Measuring what a process-runtime instance uses (Runtime::Usage): from the instance's own
// cgroup v2 leaf where the shim made one (shim.cc: /sys/fs/cgroup/kiln/<id>, only on hosts with
// cgroup v2 and the cpuset or memory controller), else from /proc over the instance's process
// tree, rooted at the program (PID 1 of the sandbox; started.json records its host pid).
//
// Why the tree and not the PID namespace: /proc/<pid>/stat is world-readable, the ns links are
// not always (ptrace rules), and orphans inside the sandbox are re-parented to its PID 1, so the
// tree from the program holds every process of the sandbox (a nested PID namespace too).
//
// The parsers are pure functions so that tests feed them captured text.
//
// Thread-safety: all functions may be called from any thread (no shared state).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kiln::runtime::process_usage {

// The members of /proc/<pid>/stat that usage needs. Times are in clock ticks (_SC_CLK_TCK).
struct ProcStat {
  int pid = 0;
  int ppid = 0;
  char state = '?';
  uint64_t utime = 0;
  uint64_t stime = 0;
  uint64_t cutime = 0;  // of the children this process waited for (their whole subtree)
  uint64_t cstime = 0;
  uint64_t rss_pages = 0;
};

// Parses one /proc/<pid>/stat line. The command name is in parentheses and may itself contain
// spaces and parentheses, so fields are counted from the last ')'. nullopt on malformed text.
std::optional<ProcStat> ParseProcStat(std::string_view text);

// "Pss:  1234 kB" of /proc/<pid>/smaps_rollup, in bytes; nullopt when absent.
std::optional<uint64_t> ParseSmapsRollupPss(std::string_view text);

// "usage_usec N" of a cgroup v2 cpu.stat; nullopt when absent.
std::optional<uint64_t> ParseCpuStatUsageUsec(std::string_view text);

// The v2 path ("0::/kiln/abc" → "/kiln/abc") of a /proc/<pid>/cgroup file; nullopt when the
// process has no v2 hierarchy line.
std::optional<std::string> ParseCgroupV2Path(std::string_view proc_pid_cgroup);

// The pids of the tree rooted at `root` (root first, then breadth first) among `stats`. Empty if
// `root` is not among them.
std::vector<int> ProcessTree(int root, const std::vector<ProcStat>& stats);

struct TreeUsage {
  // Σ (utime + stime + cutime + cstime) over the tree: a process that ended was waited for by its
  // parent inside the tree (ultimately the program), so its time stays counted and the sum only
  // grows while the instance runs.
  uint64_t cpu_usec = 0;
  uint64_t memory_bytes = 0;  // Σ PSS (RSS where smaps_rollup is unreadable)
  int process_count = 0;
};

// Reads <proc_dir>/<pid>/stat of every process and sums the tree of `root_pid`. NotFound when
// `root_pid` does not exist; FailedPrecondition when its parent is not `expected_ppid` (the pid
// was reused: the program is gone). `expected_ppid` 0 skips that check.
Result<TreeUsage> SampleProcessTree(int root_pid, int expected_ppid, const std::string& proc_dir = "/proc");

struct CgroupUsage {
  uint64_t cpu_usec = 0;
  std::optional<uint64_t> memory_bytes;        // memory.current; nullopt without the memory controller
  std::optional<uint64_t> memory_limit_bytes;  // memory.max; nullopt for "max" or absent
};

// The cgroup v2 leaf of the instance `instance_id` whose program is `pid`: the directory of the
// program's v2 cgroup when that path ends in /kiln/<instance_id> (the shim's leaf) and a v2
// hierarchy is mounted at one of `mount_candidates`; nullopt otherwise (the program then shares a
// cgroup with other processes, whose numbers would not be the instance's).
std::optional<std::string> InstanceCgroupDir(int pid, const std::string& instance_id,
                                             const std::vector<std::string>& mount_candidates = {
                                                 "/sys/fs/cgroup", "/sys/fs/cgroup/unified"});

// Reads cpu.stat, memory.current and memory.max of `dir`. An error when cpu.stat is unreadable.
Result<CgroupUsage> SampleCgroup(const std::string& dir);

}  // namespace kiln::runtime::process_usage
