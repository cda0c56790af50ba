#include "access/instance_entry.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include "base/fs.h"

namespace kiln::access {
namespace {

std::vector<std::string_view> SplitLines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    if (!line.empty()) lines.push_back(line);
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return lines;
}

std::vector<std::string_view> SplitOn(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  while (true) {
    size_t at = text.find(sep);
    parts.push_back(text.substr(0, at));
    if (at == std::string_view::npos) return parts;
    text.remove_prefix(at + 1);
  }
}

// ppid and start time (clock ticks since boot) from a /proc/<pid>/stat text. The command name is
// in parentheses and may contain anything, so fields are counted from the last ')'.
bool ParseStat(std::string_view stat, int* ppid, unsigned long long* start) {
  size_t close = stat.rfind(')');
  if (close == std::string_view::npos) return false;
  std::string rest(stat.substr(close + 1));
  // Fields after ')': state(3) ppid(4) ... starttime(22).
  std::vector<std::string> fields;
  size_t pos = 0;
  while (pos < rest.size()) {
    while (pos < rest.size() && rest[pos] == ' ') ++pos;
    size_t end = rest.find(' ', pos);
    if (end == std::string::npos) end = rest.size();
    if (end > pos) fields.push_back(rest.substr(pos, end - pos));
    pos = end;
  }
  if (fields.size() < 20) return false;
  *ppid = std::atoi(fields[1].c_str());
  *start = std::strtoull(fields[19].c_str(), nullptr, 10);
  return true;
}

bool HasToolkitVariables(const std::vector<std::string>& environ) {
  for (const std::string& var : environ) {
    if (var.rfind("SM_CURRENT_HOST=", 0) == 0 || var.rfind("SM_TRAINING_ENV=", 0) == 0) return true;
  }
  return false;
}

// Unescapes mountinfo's octal escapes (\040 for a space).
std::string Unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      int v = 0;
      bool ok = true;
      for (size_t k = 1; k <= 3; ++k) {
        char c = s[i + k];
        if (c < '0' || c > '7') ok = false;
        v = v * 8 + (c - '0');
      }
      if (ok) {
        out.push_back(static_cast<char>(v));
        i += 3;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

bool SameFile(int fd, const std::string& path) {
  struct stat a, b;
  return fstat(fd, &a) == 0 && stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

std::vector<std::string> ParseEnviron(std::string_view data) {
  std::vector<std::string> vars;
  for (std::string_view entry : SplitOn(data, '\0')) {
    size_t eq = entry.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    vars.emplace_back(entry);
  }
  return vars;
}

std::vector<std::string> MergeEnvironment(const std::vector<std::string>& base, const std::vector<std::string>& over) {
  std::vector<std::string> merged = base;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < merged.size(); ++i) index.emplace(merged[i].substr(0, merged[i].find('=')), i);
  for (const std::string& var : over) {
    std::string name = var.substr(0, var.find('='));
    auto it = index.find(name);
    if (it != index.end()) {
      merged[it->second] = var;
    } else {
      index.emplace(name, merged.size());
      merged.push_back(var);
    }
  }
  return merged;
}

std::optional<std::pair<int, int>> ParseStatusIds(std::string_view status) {
  std::optional<int> uid, gid;
  for (std::string_view line : SplitLines(status)) {
    for (auto [prefix, out] : {std::pair{std::string_view("Uid:"), &uid}, std::pair{std::string_view("Gid:"), &gid}}) {
      if (line.substr(0, prefix.size()) != prefix) continue;
      // Real, effective, saved, fs: the effective id.
      std::vector<std::string> ids;
      std::string rest(line.substr(prefix.size()));
      for (std::string_view f : SplitOn(rest, '\t')) {
        std::string field(f);
        field.erase(0, field.find_first_not_of(' '));
        if (!field.empty()) ids.push_back(field);
      }
      if (ids.size() >= 2) *out = std::atoi(ids[1].c_str());
    }
  }
  if (!uid || !gid) return std::nullopt;
  return std::pair{*uid, *gid};
}

int FindUserProcess(int root, const std::string& proc_dir) {
  struct Proc {
    int ppid = 0;
    unsigned long long start = 0;
  };
  std::map<int, Proc> procs;
  std::multimap<int, int> children;
  DIR* d = opendir(proc_dir.c_str());
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    int pid = std::atoi(e->d_name);
    Result<std::string> stat = ReadFile(proc_dir + "/" + e->d_name + "/stat");
    Proc p;
    if (!stat.ok() || !ParseStat(*stat, &p.ppid, &p.start)) continue;
    procs[pid] = p;
    children.emplace(p.ppid, pid);
  }
  closedir(d);
  if (procs.count(root) == 0) return 0;
  // Breadth first from root; the best is the deepest match, then the newest.
  int best = 0, best_depth = -1;
  unsigned long long best_start = 0;
  std::vector<std::pair<int, int>> frontier = {{root, 0}};
  std::set<int> seen = {root};
  while (!frontier.empty()) {
    std::vector<std::pair<int, int>> next;
    for (auto [pid, depth] : frontier) {
      if (depth > 0) {
        Result<std::string> environ = ReadFile(proc_dir + "/" + std::to_string(pid) + "/environ");
        if (environ.ok() && HasToolkitVariables(ParseEnviron(*environ))) {
          unsigned long long start = procs[pid].start;
          if (depth > best_depth || (depth == best_depth && start > best_start)) {
            best = pid;
            best_depth = depth;
            best_start = start;
          }
        }
      }
      auto [first, last] = children.equal_range(pid);
      for (auto it = first; it != last; ++it) {
        if (seen.insert(it->second).second) next.emplace_back(it->second, depth + 1);
      }
    }
    frontier = std::move(next);
  }
  return best;
}

std::vector<CgroupMembership> ResolveCgroups(std::string_view proc_cgroup, std::string_view mountinfo) {
  struct Mount {
    std::string root, point;
    std::set<std::string> controllers;  // v1: the super options' controllers and name=X
    bool v2 = false;
  };
  std::vector<Mount> mounts;
  for (std::string_view line : SplitLines(mountinfo)) {
    // id parent major:minor root mount-point options [optional fields...] - fstype source super-options
    size_t dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    std::vector<std::string_view> head = SplitOn(line.substr(0, dash), ' ');
    std::vector<std::string_view> tail = SplitOn(line.substr(dash + 3), ' ');
    if (head.size() < 5 || tail.size() < 3) continue;
    Mount m;
    m.root = Unescape(head[3]);
    m.point = Unescape(head[4]);
    if (tail[0] == "cgroup2") {
      m.v2 = true;
    } else if (tail[0] == "cgroup") {
      for (std::string_view opt : SplitOn(tail[2], ',')) m.controllers.emplace(opt);
    } else {
      continue;
    }
    mounts.push_back(std::move(m));
  }
  std::vector<CgroupMembership> out;
  for (std::string_view line : SplitLines(proc_cgroup)) {
    size_t first = line.find(':');
    size_t second = first == std::string_view::npos ? first : line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    std::string_view controllers = line.substr(first + 1, second - first - 1);
    std::string path(line.substr(second + 1));
    const Mount* found = nullptr;
    for (const Mount& m : mounts) {
      if (controllers.empty() ? !m.v2 : m.v2) continue;
      if (!controllers.empty()) {
        bool all = true;
        for (std::string_view c : SplitOn(controllers, ',')) all = all && m.controllers.count(std::string(c)) != 0;
        if (!all) continue;
      }
      // The mount shows the hierarchy from m.root down: the path must be below it.
      if (m.root != "/" && path != m.root && path.rfind(m.root + "/", 0) != 0) continue;
      found = &m;
      break;
    }
    if (found == nullptr) continue;
    std::string below = found->root == "/" ? path : path.substr(found->root.size());
    std::string dir = found->point + (below == "/" ? "" : below);
    out.push_back({std::string(line), dir + "/cgroup.procs"});
  }
  return out;
}

unsigned long long ProcessStartTime(int pid, const std::string& proc_dir) {
  Result<std::string> stat = ReadFile(proc_dir + "/" + std::to_string(pid) + "/stat");
  int ppid = 0;
  unsigned long long start = 0;
  if (!stat.ok() || !ParseStat(*stat, &ppid, &start)) return 0;
  return start;
}

Result<InstanceIdentity> ReadInstanceIdentity(int pid, const std::string& proc_dir) {
  const std::string dir = proc_dir + "/" + std::to_string(pid);
  auto read = [&](const std::string& name) -> Result<std::string> {
    Result<std::string> text = ReadFile(dir + "/" + name);
    if (text.ok()) return text;
    if (!PathExists(dir)) return Status::NotFound("process " + std::to_string(pid) + " does not exist (it ended)");
    return Status::PermissionDenied("cannot read " + dir + "/" + name + ": " + text.status().message());
  };
  InstanceIdentity who;
  ASSIGN_OR_RETURN(std::string environ, read("environ"));
  ASSIGN_OR_RETURN(std::string status, read("status"));
  ASSIGN_OR_RETURN(std::string cgroup, read("cgroup"));
  who.start_time = ProcessStartTime(pid, proc_dir);
  if (who.start_time == 0) return Status::NotFound("process " + std::to_string(pid) + " does not exist (it ended)");
  who.environment = ParseEnviron(environ);
  if (std::optional<std::pair<int, int>> ids = ParseStatusIds(status)) {
    who.uid = ids->first;
    who.gid = ids->second;
  } else {
    return Status::Internal("no Uid:/Gid: lines in " + dir + "/status");
  }
  who.user_process_pid = FindUserProcess(pid, proc_dir);
  if (who.user_process_pid != 0) {
    Result<std::string> user_environ = ReadFile(proc_dir + "/" + std::to_string(who.user_process_pid) + "/environ");
    if (user_environ.ok()) who.environment = MergeEnvironment(who.environment, ParseEnviron(*user_environ));
  }
  who.cgroups = ResolveCgroups(cgroup, ReadFile("/proc/self/mountinfo").value_or(""));
  return who;
}

Status AdoptResourceLimits(int pid) {
  for (int resource = 0; resource < RLIM_NLIMITS; ++resource) {
    struct rlimit limit;
    if (prlimit(pid, static_cast<__rlimit_resource>(resource), nullptr, &limit) != 0) {
      if (errno == ESRCH) return Status::NotFound("process " + std::to_string(pid) + " does not exist (it ended)");
      continue;
    }
    (void)prlimit(0, static_cast<__rlimit_resource>(resource), &limit, nullptr);
  }
  return Status::Ok();
}

Status JoinCgroups(const std::vector<CgroupMembership>& cgroups) {
  const std::string self = std::to_string(getpid());
  for (const CgroupMembership& cg : cgroups) {
    UniqueFd fd(open(cg.procs_file.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd.valid() || write(fd.get(), self.data(), self.size()) != static_cast<ssize_t>(self.size())) {
      return ErrnoStatus("cannot join the instance's cgroup " + cg.line + " (" + cg.procs_file + ")", errno);
    }
  }
  return Status::Ok();
}

InstanceNamespaces::InstanceNamespaces(InstanceNamespaces&& other) noexcept
    : entries_(std::move(other.entries_)), root_fd_(other.root_fd_) {
  other.entries_.clear();
  other.root_fd_ = -1;
}

InstanceNamespaces::~InstanceNamespaces() {
  for (Entry& e : entries_) {
    if (e.fd >= 0) close(e.fd);
  }
  if (root_fd_ >= 0) close(root_fd_);
}

Result<InstanceNamespaces> OpenInstanceNamespaces(int pid, const std::string& proc_dir) {
  const std::string dir = proc_dir + "/" + std::to_string(pid);
  InstanceNamespaces ns;
  static constexpr std::pair<const char*, int> kOrder[] = {{"cgroup", CLONE_NEWCGROUP}, {"ipc", CLONE_NEWIPC},
                                                           {"uts", CLONE_NEWUTS},       {"net", CLONE_NEWNET},
                                                           {"pid", CLONE_NEWPID},       {"mnt", CLONE_NEWNS}};
  for (auto [name, type] : kOrder) {
    int fd = open((dir + "/ns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (!PathExists(dir)) return Status::NotFound("process " + std::to_string(pid) + " does not exist (it ended)");
      // A kernel without that namespace type (no cgroup namespaces before 4.6) is not an error.
      if (err == ENOENT) continue;
      return ErrnoStatus("cannot open " + dir + "/ns/" + name, err);
    }
    ns.entries_.push_back({name, type, fd});
  }
  ns.root_fd_ = open((dir + "/root").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (ns.root_fd_ < 0) return ErrnoStatus("cannot open " + dir + "/root", errno);
  return ns;
}

Status EnterNamespaces(InstanceNamespaces& ns) {
  for (InstanceNamespaces::Entry& e : ns.entries_) {
    // Already there (an instance sharing the agent's namespace): nothing to do, and no privilege
    // needed.
    if (!SameFile(e.fd, std::string("/proc/self/ns/") + e.name)) {
      if (setns(e.fd, e.nstype) != 0) {
        return ErrnoStatus(std::string("cannot enter the instance's ") + e.name + " namespace (setns)", errno);
      }
    }
    close(e.fd);
    e.fd = -1;
  }
  // setns(CLONE_NEWNS) put us at the namespace's root; the workload's root may be below it.
  if (!SameFile(ns.root_fd_, "/")) {
    if (fchdir(ns.root_fd_) != 0 || chroot(".") != 0) {
      return ErrnoStatus("cannot take the instance's root directory", errno);
    }
  }
  if (chdir("/") != 0) return ErrnoStatus("chdir /", errno);
  close(ns.root_fd_);
  ns.root_fd_ = -1;
  return Status::Ok();
}

}  // namespace kiln::access
