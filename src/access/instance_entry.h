#pragma once
// Entering a running instance (spec remote-access.md ): what the agent process does
// before it serves, given the host pid of the instance's PID 1 (runtime::AccessPoint::host_pid).
//
//   ASSIGN_OR_RETURN(InstanceIdentity who, ReadInstanceIdentity(pid));   // /proc, host view
//   ... create the AgentSession (host key from the host's file system) ...
//   ASSIGN_OR_RETURN(InstanceNamespaces ns, OpenInstanceNamespaces(pid));
//   RETURN_IF_ERROR(JoinCgroups(who.cgroups));
//   RETURN_IF_ERROR(EnterNamespaces(ns));                                 // single-threaded only
//
// The environment is PID 1's with the toolkit's user process's laid over it: SageMaker's
// training toolkit starts the user's script with SM_* variables (SM_CURRENT_HOST,
// SM_TRAINING_ENV, SM_HPS, ...) that PID 1 (e.g. `train`) does not have, and a shell should see
// what the script sees. That process is the deepest descendant of PID 1 whose environ has
// SM_CURRENT_HOST or SM_TRAINING_ENV (the newest among equally deep ones).
//
// Thread-safety: the readers are thread-safe; EnterNamespaces must run while the process has one
// thread (setns(CLONE_NEWNS) refuses a process whose threads share its fs context).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kiln::access {

// One cgroup the instance is in, and the cgroup.procs file that moves a process into it.
struct CgroupMembership {
  std::string line;        // the /proc/<pid>/cgroup line, for messages
  std::string procs_file;  // <mount point>/<path>/cgroup.procs
};

struct InstanceIdentity {
  // "NAME=value" entries: PID 1's environ with the user process's laid over it.
  std::vector<std::string> environment;
  int uid = -1;  // /proc/<pid>/status Uid: and Gid: (the effective ids, as the host sees them)
  int gid = -1;
  // The toolkit's user process whose environ was merged; 0 when none was found.
  int user_process_pid = 0;
  std::vector<CgroupMembership> cgroups;
  // The process's start time (clock ticks since boot, /proc/<pid>/stat field 22): with the pid,
  // identifies it (ProcessStartTime after opening its namespaces tells a reused pid apart).
  unsigned long long start_time = 0;
};

// The start time of `pid` (as InstanceIdentity::start_time); 0 when it does not exist.
unsigned long long ProcessStartTime(int pid, const std::string& proc_dir = "/proc");

// "A=1\0B=2\0" → {"A=1", "B=2"} (entries without '=' are dropped).
std::vector<std::string> ParseEnviron(std::string_view data);

// `base` with each of `over`'s variables replacing the same name (kept in base's position) or
// appended (in over's order).
std::vector<std::string> MergeEnvironment(const std::vector<std::string>& base, const std::vector<std::string>& over);

// The effective uid and gid from a /proc/<pid>/status text; nullopt when absent.
std::optional<std::pair<int, int>> ParseStatusIds(std::string_view status);

// The toolkit's user process among the descendants of `root` in `proc_dir` (a /proc or a copy of
// one with <pid>/stat and <pid>/environ files): the deepest one whose environ has SM_CURRENT_HOST
// or SM_TRAINING_ENV, the newest (largest start time) among equally deep ones; 0 when none.
int FindUserProcess(int root, const std::string& proc_dir = "/proc");

// Where each line of a /proc/<pid>/cgroup text lives under the mounts of a /proc/self/mountinfo
// text: v2 ("0::/path") under the cgroup2 mount, v1 ("N:cpu,cpuacct:/path") under the cgroup
// mount carrying those controllers (or "name=X"). A mount whose root is not "/" (the reader is
// itself in a container) serves paths below that root. Lines with no matching mount are left out.
std::vector<CgroupMembership> ResolveCgroups(std::string_view proc_cgroup, std::string_view mountinfo);

// Reads the environment, ids and cgroups of `pid` from `proc_dir` (host view). NotFound when the
// pid does not exist; PermissionDenied when its files cannot be read.
Result<InstanceIdentity> ReadInstanceIdentity(int pid, const std::string& proc_dir = "/proc");

// Gives this process (and so the session's children, which inherit them) the resource limits of
// `pid` (prlimit: open files, locked memory for RDMA/NCCL, processes, stack, core...), which
// the container engine or the workload set and the daemon's own may differ from. Limits that
// cannot be read or set are left as they are (best effort); NotFound when `pid` is gone.
Status AdoptResourceLimits(int pid);

// Moves this process into each cgroup (writes its pid to cgroup.procs). The first failure is
// returned, naming the cgroup.
Status JoinCgroups(const std::vector<CgroupMembership>& cgroups);

// Descriptors of /proc/<pid>/ns/{cgroup,ipc,uts,net,pid,mnt} and /proc/<pid>/root, opened while
// the pid is known to be the instance (a later exit of the pid cannot make them point elsewhere).
class InstanceNamespaces {
 public:
  InstanceNamespaces() = default;
  InstanceNamespaces(InstanceNamespaces&& other) noexcept;
  InstanceNamespaces& operator=(InstanceNamespaces&&) = delete;
  ~InstanceNamespaces();

 private:
  friend Result<InstanceNamespaces> OpenInstanceNamespaces(int pid, const std::string& proc_dir);
  friend Status EnterNamespaces(InstanceNamespaces& ns);
  struct Entry {
    const char* name;
    int nstype;
    int fd;
  };
  std::vector<Entry> entries_;  // in setns order
  int root_fd_ = -1;
};

Result<InstanceNamespaces> OpenInstanceNamespaces(int pid, const std::string& proc_dir = "/proc");

// setns into each namespace that differs from this process's (cgroup, ipc, uts, net, pid, mnt, in
// that order), then takes the instance's root directory (chroot to /proc/<pid>/root, which also
// covers a workload that chroots inside its mount namespace). The pid namespace applies to
// children forked afterwards. Must be called while the process is single-threaded. The fds are
// closed.
Status EnterNamespaces(InstanceNamespaces& ns);

}  // namespace kiln::access
