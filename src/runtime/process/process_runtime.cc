#include "runtime/process/process_runtime.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <thread>

#include "base/fs.h"
#include "base/strings.h"
#include "base/time.h"
#include "runtime/process/state.h"
#include "runtime/process/usage.h"

extern char** environ;

namespace kiln::runtime {
namespace {

namespace ps = process_state;

// How long Launch waits for the shim to report. Building the sandbox takes milliseconds; this
// only bounds a shim that hangs (e.g. a stuck NFS mount in extra_mounts).
constexpr int kLaunchTimeoutMillis = 60'000;
constexpr int kCommandTimeoutMillis = 5'000;

// Reads `fd` until EOF or the deadline. False on timeout.
bool ReadToEof(int fd, std::string* out, int timeout_millis) {
  int64_t deadline = NowMillis() + timeout_millis;
  char buf[4096];
  while (true) {
    int64_t left = deadline - NowMillis();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int n = poll(&p, 1, static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n == 0 ? false : true;
    ssize_t r = read(fd, buf, sizeof(buf));
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return true;
    out->append(buf, r);
  }
}

std::string Tail(const std::string& text, size_t n) {
  return text.size() <= n ? text : "..." + text.substr(text.size() - n);
}

class ProcessRuntime final : public Runtime {
 public:
  explicit ProcessRuntime(ProcessRuntimeOptions options) : options_(std::move(options)) {}

  // Runtime
  Status Launch(const InstanceSpec& spec) override;
  Result<InstanceStatus> Inspect(const std::string& instance_id) override;
  Status Signal(const std::string& instance_id, int signal) override;
  Status Stop(const std::string& instance_id, std::chrono::seconds grace) override;
  Result<InstanceStatus> Wait(const std::string& instance_id, std::chrono::milliseconds timeout) override;
  std::string OutputPath(const std::string& instance_id) const override;
  Result<std::vector<std::string>> List() override;
  Status Remove(const std::string& instance_id) override;
  Result<InstanceUsage> Usage(const std::string& instance_id) override;
  Result<AccessPoint> Access(const std::string& instance_id) override;

 private:
  std::string InstanceDir(const std::string& id) const { return ps::Join(options_.state_dir, id); }
  Status ValidateSpec(const InstanceSpec& spec) const;
  // Starts the shim; returns its report line ("ok" or "error <class> <message>").
  Result<std::string> SpawnShim(const std::string& dir, int lock_fd);
  // Connects to the shim's socket; -1 with errno when that fails.
  int Connect(const std::string& instance_id);
  // Sends one request and returns the reply line. Unavailable when the shim cannot be reached.
  Result<std::string> Command(const std::string& instance_id, const std::string& request);

  const ProcessRuntimeOptions options_;
};

Status ProcessRuntime::ValidateSpec(const InstanceSpec& spec) const {
  if (!ps::ValidInstanceId(spec.instance_id)) {
    return Status::InvalidArgument("instance id must match [A-Za-z0-9._-]{1,128}: " + spec.instance_id);
  }
  if (spec.argv.empty() || spec.argv[0].empty()) return Status::InvalidArgument("no program to run (argv is empty)");
  struct stat st;
  if (spec.opt_ml_dir.empty() || spec.opt_ml_dir[0] != '/' || stat(spec.opt_ml_dir.c_str(), &st) != 0 ||
      !S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("opt_ml_dir must be an existing absolute directory: " + spec.opt_ml_dir);
  }
  for (const BindMount& m : spec.extra_mounts) {
    if (m.host_path.empty() || m.host_path[0] != '/' || m.sandbox_path.empty() || m.sandbox_path[0] != '/') {
      return Status::InvalidArgument("mount paths must be absolute: " + m.host_path + " -> " + m.sandbox_path);
    }
    if (m.sandbox_path.find("/../") != std::string::npos || EndsWith(m.sandbox_path, "/..")) {
      return Status::InvalidArgument("sandbox path must not contain '..': " + m.sandbox_path);
    }
    if (stat(m.host_path.c_str(), &st) != 0) return ErrnoStatus("mount source " + m.host_path, errno);
  }
  if (!spec.working_dir.empty() && spec.working_dir[0] != '/') {
    return Status::InvalidArgument("working_dir must be absolute: " + spec.working_dir);
  }
  if (!spec.network_namespace.empty()) {
    if (spec.network) {
      return Status::InvalidArgument("an instance either gets a network of its own (" + spec.network->network +
                                     ") or joins an existing namespace (" + spec.network_namespace + "), not both");
    }
    if (spec.network_namespace[0] != '/' || stat(spec.network_namespace.c_str(), &st) != 0) {
      return Status::FailedPrecondition("the network namespace " + spec.network_namespace +
                                        " to join does not exist (the instance holding it has ended)");
    }
  }
  if (spec.network) {
    // The shim checks the rest (the bridge exists, the names are free) when it builds the network.
    const NetworkAttachment& n = *spec.network;
    auto link_name_ok = [](const std::string& name) { return !name.empty() && name.size() <= 15; };
    if (!link_name_ok(n.bridge) || !link_name_ok(n.host_veth) || !link_name_ok(n.interface_name)) {
      return Status::InvalidArgument("network " + n.network +
                                     ": bridge, host veth and interface names must be 1-15 bytes (" + n.bridge + ", " +
                                     n.host_veth + ", " + n.interface_name + ")");
    }
    if (n.address.empty() || n.prefix_length < 1 || n.prefix_length > 32) {
      return Status::InvalidArgument("network " + n.network + ": an address and a prefix length 1-32 are required");
    }
    if (!n.isolated && n.gateway.empty()) {
      return Status::InvalidArgument("network " + n.network + ": a gateway is required unless isolated");
    }
    for (int port : n.loopback_forwards) {
      if (port < 1 || port > 65535) {
        return Status::InvalidArgument("network " + n.network +
                                       ": loopback forward port out of range: " + std::to_string(port));
      }
    }
  }
  return Status::Ok();
}

Result<std::string> ProcessRuntime::SpawnShim(const std::string& dir, int lock_fd) {
  UniqueFd log(open(ps::Join(dir, ps::kShimLogFile).c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!log.valid()) return ErrnoStatus("open shim log", errno);
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) return ErrnoStatus("pipe", errno);
  UniqueFd report_read(report[0]);
  UniqueFd report_write(report[1]);
  // The shim gets the lock as fd 3 and the report pipe as fd 4. Sources are first moved to fds
  // >= 10 so that no dup2 in the child overwrites a source that a later dup2 still needs. All
  // stay CLOEXEC here: another thread's fork/exec must not inherit them.
  UniqueFd log_hi(fcntl(log.get(), F_DUPFD_CLOEXEC, 10));
  UniqueFd lock_hi(fcntl(lock_fd, F_DUPFD_CLOEXEC, 10));
  UniqueFd report_hi(fcntl(report_write.get(), F_DUPFD_CLOEXEC, 10));
  if (!log_hi.valid() || !lock_hi.valid() || !report_hi.valid()) return ErrnoStatus("fcntl", errno);
  report_write.Reset();

  std::vector<std::string> args = options_.shim_command;
  for (const char* a : {"--state", dir.c_str(), "--lock-fd", "3", "--report-fd", "4"}) args.emplace_back(a);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, log_hi.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, log_hi.get(), 2);
  posix_spawn_file_actions_adddup2(&actions, lock_hi.get(), 3);
  posix_spawn_file_actions_adddup2(&actions, report_hi.get(), 4);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  report_hi.Reset();
  if (rc != 0) return ErrnoStatus("cannot start the shim " + args[0], rc);

  std::string report_text;
  bool complete = ReadToEof(report_read.get(), &report_text, kLaunchTimeoutMillis);
  // The first shim process forks the real shim and exits at once; reap it.
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (!complete)
    return Status::DeadlineExceeded("the shim did not start the program within 60 s; see " + dir + "/shim.log");
  std::string_view line = Trim(report_text);
  if (line.empty()) {
    std::string shim_log = ReadFile(ps::Join(dir, ps::kShimLogFile)).value_or("");
    return Status::Internal("the shim exited without starting the program: " + Tail(std::string(Trim(shim_log)), 1000));
  }
  return std::string(line);
}

Status ProcessRuntime::Launch(const InstanceSpec& spec) {
  if (spec.container) {
    // Images run through the container runtime (runtime/routed_runtime.h routes them there); one
    // reaching this backend means no engine is configured.
    return Status::FailedPrecondition("the process runtime cannot run container image " + spec.container->requested +
                                      ": configure container_engine (its socket) in the Kiln config file, or map "
                                      "the image to an environment");
  }
  RETURN_IF_ERROR(ValidateSpec(spec));
  RETURN_IF_ERROR(MakeDirs(options_.state_dir));
  std::string dir = InstanceDir(spec.instance_id);
  if (mkdir(dir.c_str(), 0755) != 0) {
    if (errno == EEXIST) return Status::AlreadyExists("instance " + spec.instance_id + " already exists");
    return ErrnoStatus("mkdir " + dir, errno);
  }
  auto fail = [&](Status s) {
    // A shim that reported a failure exits at once; let it finish before its directory goes.
    for (int i = 0; i < 2000 && ps::ShimAlive(dir); ++i) usleep(1000);
    RemoveAll(dir).ok();
    std::string socket = ps::SocketPath(dir);
    if (!StartsWith(socket, dir)) unlink(socket.c_str());
    return s;
  };
  // The lock is taken before the shim exists and handed to it, so the instance never looks lost
  // while it starts (ShimAlive is true from here on).
  UniqueFd lock(open(ps::Join(dir, ps::kLockFile).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock.valid() || flock(lock.get(), LOCK_EX) != 0) return fail(ErrnoStatus("lock " + dir, errno));
  if (Status s = ps::WriteFileRenamed(ps::Join(dir, ps::kSpecFile), ps::EncodeSpec(spec)); !s.ok()) return fail(s);
  Result<std::string> report = SpawnShim(dir, lock.get());
  lock.Reset();  // the shim holds it now (same open file description)
  if (!report.ok()) return fail(report.status());
  if (*report == "ok") return Status::Ok();
  // "error <class> <message>"
  std::string_view rest = *report;
  if (StartsWith(rest, "error ")) rest.remove_prefix(6);
  size_t space = rest.find(' ');
  std::string_view klass = rest.substr(0, space);
  std::string message(space == std::string_view::npos ? rest : rest.substr(space + 1));
  // The shim exits right after reporting (and takes the program with it); nothing is left running.
  if (klass == "invalid") return fail(Status::InvalidArgument(message));
  if (klass == "precondition") return fail(Status::FailedPrecondition(message));
  return fail(Status::Internal(message));
}

Result<InstanceStatus> ProcessRuntime::Inspect(const std::string& instance_id) {
  if (!ps::ValidInstanceId(instance_id)) return Status::NotFound("instance " + instance_id + " not found");
  return ps::ReadStatus(InstanceDir(instance_id), instance_id);
}

int ProcessRuntime::Connect(const std::string& instance_id) {
  std::string path = ps::SocketPath(InstanceDir(instance_id));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

Result<std::string> ProcessRuntime::Command(const std::string& instance_id, const std::string& request) {
  UniqueFd fd(Connect(instance_id));
  if (!fd.valid()) return Status::Unavailable("cannot reach the shim of " + instance_id + ": " + std::strerror(errno));
  std::string line = request + "\n";
  if (send(fd.get(), line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
    return Status::Unavailable("cannot talk to the shim of " + instance_id + ": " + std::strerror(errno));
  }
  std::string reply;
  if (!ReadToEof(fd.get(), &reply, kCommandTimeoutMillis)) {
    return Status::Unavailable("the shim of " + instance_id + " did not answer");
  }
  if (reply.empty()) return Status::Unavailable("the shim of " + instance_id + " closed the connection");
  return std::string(Trim(reply));
}

Status ProcessRuntime::Signal(const std::string& instance_id, int signal) {
  ASSIGN_OR_RETURN(InstanceStatus status, Inspect(instance_id));
  if (status.state != InstanceState::kRunning)
    return Status::FailedPrecondition("instance " + instance_id + " is not running");
  Result<std::string> reply = Command(instance_id, "signal " + std::to_string(signal));
  if (!reply.ok() || *reply != "ok") {
    // The program may have ended in between.
    ASSIGN_OR_RETURN(status, Inspect(instance_id));
    if (status.state != InstanceState::kRunning)
      return Status::FailedPrecondition("instance " + instance_id + " is not running");
    if (!reply.ok()) return reply.status();
    return Status::InvalidArgument("signal " + std::to_string(signal) + " to " + instance_id + ": " + *reply);
  }
  return Status::Ok();
}

Status ProcessRuntime::Stop(const std::string& instance_id, std::chrono::seconds grace) {
  ASSIGN_OR_RETURN(InstanceStatus status, Inspect(instance_id));
  if (status.state != InstanceState::kRunning) return Status::Ok();
  int64_t seconds = std::max<int64_t>(0, grace.count());
  Result<std::string> reply = Command(instance_id, "stop " + std::to_string(seconds));
  if (!reply.ok() || *reply != "ok") {
    ASSIGN_OR_RETURN(status, Inspect(instance_id));
    if (status.state != InstanceState::kRunning) return Status::Ok();
    if (!reply.ok()) return reply.status();
    return Status::Internal("stop " + instance_id + ": " + *reply);
  }
  return Status::Ok();
}

Result<InstanceStatus> ProcessRuntime::Wait(const std::string& instance_id, std::chrono::milliseconds timeout) {
  int64_t deadline = NowMillis() + timeout.count();
  while (true) {
    ASSIGN_OR_RETURN(InstanceStatus status, Inspect(instance_id));
    int64_t left = deadline - NowMillis();
    if (status.state != InstanceState::kRunning || left <= 0) return status;
    // Block on the shim: it answers "wait" (or closes) once the exit record is on disk.
    UniqueFd fd(Connect(instance_id));
    std::string request = "wait\n";
    if (fd.valid() &&
        send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
      pollfd p{fd.get(), POLLIN, 0};
      int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
      if (n == 0) return Inspect(instance_id);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(left, 10)));
    }
  }
}

std::string ProcessRuntime::OutputPath(const std::string& instance_id) const {
  return ps::Join(InstanceDir(instance_id), ps::kOutputFile);
}

Result<std::vector<std::string>> ProcessRuntime::List() {
  std::vector<std::string> ids;
  DIR* d = opendir(options_.state_dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return ids;
    return ErrnoStatus("opendir " + options_.state_dir, errno);
  }
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (!ps::ValidInstanceId(name)) continue;
    struct stat st;
    if (stat(InstanceDir(name).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) ids.push_back(name);
  }
  closedir(d);
  std::sort(ids.begin(), ids.end());
  return ids;
}

Status ProcessRuntime::Remove(const std::string& instance_id) {
  ASSIGN_OR_RETURN(InstanceStatus status, Inspect(instance_id));
  if (status.state == InstanceState::kRunning) {
    return Status::FailedPrecondition("instance " + instance_id + " is still running");
  }
  std::string dir = InstanceDir(instance_id);
  std::string socket = ps::SocketPath(dir);
  if (!StartsWith(socket, dir)) unlink(socket.c_str());
  return RemoveAll(dir);
}

// The shim's cgroup v2 leaf when the program is in one (cpu.stat always; memory.current only
// with the memory controller), else /proc over the program's process tree. started.json gives
// the program's host pid and the shim's pid (the program's parent: a pid reused after the
// program ended has another parent and is refused).
Result<InstanceUsage> ProcessRuntime::Usage(const std::string& instance_id) {
  ASSIGN_OR_RETURN(InstanceStatus status, Inspect(instance_id));
  if (status.state != InstanceState::kRunning) {
    return Status::FailedPrecondition("instance " + instance_id + " is not running");
  }
  const std::string dir = InstanceDir(instance_id);
  Result<std::string> started_text = ReadFile(ps::Join(dir, ps::kStartedFile));
  if (!started_text.ok())
    return Status::FailedPrecondition("instance " + instance_id + " has not started its program yet");
  ASSIGN_OR_RETURN(ps::StartedRecord started, ps::DecodeStarted(*started_text));
  if (started.pid <= 0) return Status::FailedPrecondition("instance " + instance_id + " has no program pid");

  InstanceUsage usage;
  uint64_t spec_limit = 0;
  if (Result<std::string> spec_text = ReadFile(ps::Join(dir, ps::kSpecFile)); spec_text.ok()) {
    if (Result<InstanceSpec> spec = ps::DecodeSpec(*spec_text); spec.ok()) {
      usage.gpus = spec->gpus;
      spec_limit = spec->memory_limit_bytes;
    }
  }
  usage.memory_limit_bytes = spec_limit;

  std::optional<process_usage::CgroupUsage> cgroup;
  if (std::optional<std::string> cgroup_dir = process_usage::InstanceCgroupDir(started.pid, instance_id)) {
    if (Result<process_usage::CgroupUsage> sampled = process_usage::SampleCgroup(*cgroup_dir); sampled.ok()) {
      cgroup = *sampled;
    }
  }
  if (cgroup) {
    usage.source = "cgroup";
    usage.cpu_usec = cgroup->cpu_usec;
    if (cgroup->memory_limit_bytes) usage.memory_limit_bytes = *cgroup->memory_limit_bytes;
    if (cgroup->memory_bytes) {
      usage.memory_bytes = *cgroup->memory_bytes;
      return usage;
    }
  }
  // No cgroup (or one without the memory controller): /proc over the process tree.
  Result<process_usage::TreeUsage> tree = process_usage::SampleProcessTree(started.pid, started.shim_pid);
  if (!tree.ok()) {
    // The program ended between Inspect and now.
    if (tree.status().code() == StatusCode::kNotFound || tree.status().code() == StatusCode::kFailedPrecondition) {
      return Status::FailedPrecondition("instance " + instance_id + " is not running");
    }
    return tree.status();
  }
  if (!cgroup) {
    usage.source = "proc";
    usage.cpu_usec = tree->cpu_usec;
  }
  usage.memory_bytes = tree->memory_bytes;
  usage.process_count = tree->process_count;
  return usage;
}

// started.json's program pid, accepted only while /proc says its parent is the shim that wrote
// the record (a pid reused after the program ended has another parent).
Result<AccessPoint> ProcessRuntime::Access(const std::string& instance_id) {
  ASSIGN_OR_RETURN(InstanceStatus status, Inspect(instance_id));
  if (status.state != InstanceState::kRunning) {
    return Status::FailedPrecondition("instance " + instance_id + " is not running");
  }
  const std::string dir = InstanceDir(instance_id);
  Result<std::string> started_text = ReadFile(ps::Join(dir, ps::kStartedFile));
  if (!started_text.ok())
    return Status::FailedPrecondition("instance " + instance_id + " has not started its program yet");
  ASSIGN_OR_RETURN(ps::StartedRecord started, ps::DecodeStarted(*started_text));
  if (started.pid <= 0) return Status::FailedPrecondition("instance " + instance_id + " has no program pid");
  Result<std::string> stat_text = ReadFile("/proc/" + std::to_string(started.pid) + "/stat");
  std::optional<process_usage::ProcStat> stat;
  if (stat_text.ok()) stat = process_usage::ParseProcStat(*stat_text);
  if (!stat || (started.shim_pid > 0 && stat->ppid != started.shim_pid) || stat->state == 'Z') {
    return Status::FailedPrecondition("instance " + instance_id + " is not running (its program has ended)");
  }
  AccessPoint point;
  point.host_pid = started.pid;
  ASSIGN_OR_RETURN(std::string spec_text, ReadFile(ps::Join(dir, ps::kSpecFile)));
  ASSIGN_OR_RETURN(InstanceSpec spec, ps::DecodeSpec(spec_text));
  point.hostname = spec.hostname;
  return point;
}

}  // namespace

Result<std::unique_ptr<Runtime>> OpenProcessRuntime(ProcessRuntimeOptions options) {
  if (options.state_dir.empty()) return Status::InvalidArgument("process runtime: state_dir is required");
  if (options.shim_command.empty() || options.shim_command[0].empty()) {
    return Status::InvalidArgument("process runtime: shim_command is required");
  }
  RETURN_IF_ERROR(MakeDirs(options.state_dir));
  return std::unique_ptr<Runtime>(new ProcessRuntime(std::move(options)));
}

}  // namespace kiln::runtime
