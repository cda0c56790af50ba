#include "runtime/process/sandbox.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace kiln::runtime {
namespace {

constexpr char kDefaultPath[] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
// Where the mount-point fallback parks a directory while it rebuilds it (inside the private /tmp).
constexpr char kShadowStaging[] = "/tmp/.kiln-shadow";

std::string Errno(int err) { return std::strerror(err); }

[[noreturn]] void Fail(const SandboxPlan& plan, std::string_view klass, const std::string& message) {
  std::string text = std::string(klass) + " " + message;
  [[maybe_unused]] ssize_t n = write(plan.status_fd, text.data(), text.size());
  _exit(127);
}

void Warn(const std::string& message) { std::fprintf(stderr, "sandbox warning: %s\n", message.c_str()); }

std::string Parent(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos || slash == 0) return "/";
  return path.substr(0, slash);
}

// mkdir -p; returns 0 or the errno of the first failing mkdir.
int MakeDirsErrno(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
  if (path != "/" && !path.empty()) {
    if (int err = MakeDirsErrno(Parent(path)); err != 0) return err;
  }
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return errno;
  return 0;
}

int CreateMountPoint(const std::string& path, bool directory) {
  // An existing mount point of the right kind is used as it is: opening it for writing would fail
  // for files the caller may not write (e.g. /etc/hosts inside an unprivileged user namespace).
  struct stat existing;
  if (stat(path.c_str(), &existing) == 0 && S_ISDIR(existing.st_mode) == directory) return 0;
  if (directory) return MakeDirsErrno(path);
  if (int err = MakeDirsErrno(Parent(path)); err != 0) return err;
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  close(fd);
  return 0;
}

// Replaces directory `dir` (in this mount namespace only) by a tmpfs holding the same entries,
// each bound back from the original, so that new mount points can be created in it although the
// real directory is not writable (read-only root, or unprivileged inside a user namespace). The
// directory looks the same afterwards except that its new entries exist only in the sandbox.
std::string ShadowDirectory(const std::string& dir) {
  if (dir == "/") return "cannot create mount points under /: it is not writable";
  if (mkdir(kShadowStaging, 0700) != 0 && errno != EEXIST)
    return "mkdir " + std::string(kShadowStaging) + ": " + Errno(errno);
  if (mount(dir.c_str(), kShadowStaging, nullptr, MS_BIND | MS_REC, nullptr) != 0) {
    return "bind " + dir + ": " + Errno(errno);
  }
  struct stat st;
  mode_t mode = stat(dir.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0755;
  char options[32];
  std::snprintf(options, sizeof(options), "mode=%o", static_cast<unsigned>(mode));
  if (mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options) != 0) {
    return "mount tmpfs on " + dir + ": " + Errno(errno);
  }
  DIR* d = opendir(kShadowStaging);
  if (d == nullptr) return "opendir " + std::string(kShadowStaging) + ": " + Errno(errno);
  std::string error;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::string from = std::string(kShadowStaging) + "/" + name;
    std::string to = dir + "/" + name;
    struct stat est;
    if (lstat(from.c_str(), &est) != 0) continue;
    if (S_ISLNK(est.st_mode)) {
      char target[4096];
      ssize_t n = readlink(from.c_str(), target, sizeof(target) - 1);
      if (n >= 0 && symlink(std::string(target, n).c_str(), to.c_str()) != 0)
        error = "symlink " + to + ": " + Errno(errno);
      continue;
    }
    if (CreateMountPoint(to, S_ISDIR(est.st_mode)) != 0 ||
        mount(from.c_str(), to.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
      error = "rebind " + to + ": " + Errno(errno);
    }
  }
  closedir(d);
  umount2(kShadowStaging, MNT_DETACH);
  rmdir(kShadowStaging);
  return error;
}

// Makes sure `path` exists as a directory (or file) to mount on, shadowing the deepest existing
// ancestor when it cannot be created in place. Returns an error message or "".
std::string EnsureMountPoint(const std::string& path, bool directory) {
  int err = CreateMountPoint(path, directory);
  if (err == 0) return "";
  if (err != EACCES && err != EPERM && err != EROFS) return "cannot create " + path + ": " + Errno(err);
  std::string ancestor = Parent(path);
  struct stat st;
  while (ancestor != "/" && stat(ancestor.c_str(), &st) != 0) ancestor = Parent(ancestor);
  if (std::string e = ShadowDirectory(ancestor); !e.empty()) {
    return "cannot create " + path + " (" + Errno(err) + ") and cannot shadow " + ancestor + ": " + e;
  }
  Warn(path + " could not be created on the host (" + Errno(err) + "); " + ancestor +
       " is rebuilt on a tmpfs inside the sandbox to hold it");
  if (int again = CreateMountPoint(path, directory); again != 0) return "cannot create " + path + ": " + Errno(again);
  return "";
}

// A bind source opened before /tmp is covered (a source may live under the host's /tmp); mounts
// then name it as /proc/self/fd/N.
struct Source {
  std::string host_path;
  int fd = -1;
  std::string Path() const { return "/proc/self/fd/" + std::to_string(fd); }
};

std::string OpenSource(const std::string& host_path, Source* source) {
  source->host_path = host_path;
  source->fd = open(host_path.c_str(), O_PATH | O_CLOEXEC);
  if (source->fd < 0) return "cannot bind " + host_path + ": " + Errno(errno);
  return "";
}

std::string Bind(const Source& source, const std::string& sandbox, bool read_only) {
  const std::string& host = source.host_path;
  struct stat st;
  if (fstat(source.fd, &st) != 0) return "cannot bind " + host + ": " + Errno(errno);
  if (std::string e = EnsureMountPoint(sandbox, S_ISDIR(st.st_mode)); !e.empty()) return e;
  if (mount(source.Path().c_str(), sandbox.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
    return "cannot bind " + host + " at " + sandbox + ": " + Errno(errno);
  }
  if (read_only) {
    // A read-only bind is a remount of the bind; the flags it already has must be repeated (a
    // user namespace may not clear locked ones).
    struct statvfs vfs;
    unsigned long flags = MS_BIND | MS_REMOUNT | MS_RDONLY;
    if (statvfs(sandbox.c_str(), &vfs) == 0) {
      if (vfs.f_flag & ST_NOSUID) flags |= MS_NOSUID;
      if (vfs.f_flag & ST_NODEV) flags |= MS_NODEV;
      if (vfs.f_flag & ST_NOEXEC) flags |= MS_NOEXEC;
      if (vfs.f_flag & ST_NOATIME) flags |= MS_NOATIME;
      if (vfs.f_flag & ST_NODIRATIME) flags |= MS_NODIRATIME;
      if (vfs.f_flag & ST_RELATIME) flags |= MS_RELATIME;
    }
    if (mount(nullptr, sandbox.c_str(), nullptr, flags, nullptr) != 0) {
      return "cannot make " + sandbox + " read-only: " + Errno(errno);
    }
  }
  return "";
}

// Binds /dev/null over every /dev/nvidia<N> whose N is not assigned, so that the driver (and
// nvidia-smi) cannot open the other GPUs. Best effort: a failure is logged, not fatal.
void HideOtherGpus(const std::vector<int>& gpus) {
  DIR* d = opendir("/dev");
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.size() <= 6 || name.compare(0, 6, "nvidia") != 0) continue;
    std::string digits = name.substr(6);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    int index = std::atoi(digits.c_str());
    if (std::find(gpus.begin(), gpus.end(), index) != gpus.end()) continue;
    std::string path = "/dev/" + name;
    if (mount("/dev/null", path.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      Warn("cannot hide " + path + ": " + Errno(errno));
    }
  }
  closedir(d);
}

// execvp's search, but in the program's own PATH (not the shim's) and with its environment.
// Returns the errno to report.
int ExecSearching(const std::string& file, char* const argv[], char* const envp[], const std::string& path) {
  if (file.find('/') != std::string::npos) {
    execve(file.c_str(), argv, envp);
    return errno;
  }
  bool saw_eacces = false;
  size_t start = 0;
  while (start <= path.size()) {
    size_t colon = path.find(':', start);
    if (colon == std::string::npos) colon = path.size();
    std::string dir = path.substr(start, colon - start);
    start = colon + 1;
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + file;
    execve(candidate.c_str(), argv, envp);
    switch (errno) {
      case EACCES: saw_eacces = true; break;
      case ENOENT:
      case ENOTDIR:
      case ESTALE:
      case ENODEV:
      case ETIMEDOUT: break;
      default: return errno;
    }
  }
  return saw_eacces ? EACCES : ENOENT;
}

}  // namespace

void SetupSandboxAndExec(const SandboxPlan& plan) {
  const InstanceSpec& spec = *plan.spec;
  // The program must not outlive its shim: without the shim nobody records its exit or drains
  // its output, and the instance reads as kLost.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (plan.go_fd >= 0) {
    char byte;
    if (read(plan.go_fd, &byte, 1) != 1) Fail(plan, "internal", "the shim did not release the sandbox");
    close(plan.go_fd);
  }
  if (unshare(CLONE_NEWNS | CLONE_NEWUTS) != 0) {
    Fail(plan, "internal", "cannot create mount/UTS namespaces: " + Errno(errno));
  }
  // Nothing mounted in here may propagate back to the host (or to other sandboxes).
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    Fail(plan, "internal", "cannot make mounts private: " + Errno(errno));
  }
  if (!spec.hostname.empty() && sethostname(spec.hostname.data(), spec.hostname.size()) != 0) {
    Fail(plan, "internal", "cannot set hostname " + spec.hostname + ": " + Errno(errno));
  }
  Source opt_ml, hosts;
  std::vector<Source> extra(spec.extra_mounts.size());
  if (std::string e = OpenSource(spec.opt_ml_dir, &opt_ml); !e.empty()) Fail(plan, "invalid", e);
  for (size_t i = 0; i < extra.size(); ++i) {
    if (std::string e = OpenSource(spec.extra_mounts[i].host_path, &extra[i]); !e.empty()) Fail(plan, "invalid", e);
  }
  if (!plan.hosts_file.empty()) {
    if (std::string e = OpenSource(plan.hosts_file, &hosts); !e.empty()) Fail(plan, "internal", e);
  }
  // /tmp first: the mount-point fallback stages under it.
  if (mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0) {
    Fail(plan, "internal", "cannot mount a private /tmp: " + Errno(errno));
  }
  if (std::string e = Bind(opt_ml, "/opt/ml", false); !e.empty()) Fail(plan, "internal", e);
  for (size_t i = 0; i < extra.size(); ++i) {
    const BindMount& m = spec.extra_mounts[i];
    if (std::string e = Bind(extra[i], m.sandbox_path, m.read_only); !e.empty()) Fail(plan, "invalid", e);
  }
  // Networking needs nothing here: the shim forked this process inside the instance's network
  // namespace (when the spec has one) and builds it before sending the go byte. /etc/resolv.conf
  // stays the node's: a resolver on the node's loopback (systemd-resolved's 127.0.0.53) is not
  // reachable from a namespace, which the shim logs; Kiln does not invent a DNS server.
  if (hosts.fd >= 0) {
    if (std::string e = Bind(hosts, "/etc/hosts", false); !e.empty()) Fail(plan, "internal", e);
  }
  for (Source* source : {&opt_ml, &hosts}) {
    if (source->fd >= 0) close(source->fd);
  }
  for (Source& source : extra) close(source.fd);
  HideOtherGpus(spec.gpus);
  // PyTorch's DataLoader shares tensors through /dev/shm: give each sandbox its own.
  struct stat st;
  if (stat("/dev/shm", &st) == 0 && mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0) {
    Warn("cannot mount a private /dev/shm: " + Errno(errno));
  }
  // The sandbox's own /proc, so that ps shows its processes only (and PID 1 is the program).
  if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
    Warn("cannot mount /proc for the PID namespace (the host's stays visible): " + Errno(errno));
  }
  if (!spec.cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : spec.cpus) {
      if (cpu < 0 || cpu >= CPU_SETSIZE) Fail(plan, "invalid", "cpu index out of range: " + std::to_string(cpu));
      CPU_SET(cpu, &set);
    }
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
      Fail(plan, "invalid", "cannot restrict the program to the assigned cpus: " + Errno(errno));
    }
  }
  std::string cwd = spec.working_dir.empty() ? "/" : spec.working_dir;
  if (chdir(cwd.c_str()) != 0) Fail(plan, "invalid", "cannot change to working directory " + cwd + ": " + Errno(errno));

  int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(plan.stdout_fd, 1) < 0 || dup2(plan.stderr_fd, 2) < 0) {
    Fail(plan, "internal", "cannot set up stdin/stdout/stderr: " + Errno(errno));
  }
  if (null_fd > 2) close(null_fd);
  umask(022);
  // Signal dispositions set to "ignore" survive exec: give the program the defaults, as a fresh
  // container gets them.
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);

  std::vector<std::string> env_strings;
  std::string path = kDefaultPath;
  for (const auto& [key, value] : spec.env) {
    env_strings.push_back(key + "=" + value);
    if (key == "PATH") path = value;
  }
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = spec.argv;
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  int err = ExecSearching(spec.argv[0], argv.data(), envp.data(), path);
  std::string message = "cannot execute " + spec.argv[0] + ": " + Errno(err);
  if (spec.argv[0].find('/') == std::string::npos) message += " (searched PATH=" + path + ")";
  Fail(plan, "invalid", message);
}

}  // namespace kiln::runtime
