#include "modelserver/worker_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace kiln::modelserver {
namespace {

// The child's fd 3 and 2 are dup2'd from descriptors first moved to >= 10 (close-on-exec, like
// every fd here), so no dup2 in the child overwrites a source another dup2 still needs, and dup2
// always changes the number (which is what clears close-on-exec on the copy).
constexpr int kHighFd = 10;

UniqueFd DupHigh(int fd) { return UniqueFd(fcntl(fd, F_DUPFD_CLOEXEC, kHighFd)); }

// The server's environment with `overrides` set (replacing same-named variables).
std::vector<std::string> BuildEnvironment(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    size_t eq = entry.find('=');
    std::string name(entry.substr(0, eq));
    if (overrides.count(name) == 0) env.emplace_back(entry);
  }
  for (const auto& [name, value] : overrides) env.push_back(name + "=" + value);
  return env;
}

uint64_t StatmRss(pid_t pid) {
  std::ifstream statm("/proc/" + std::to_string(pid) + "/statm");
  uint64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

Result<std::unique_ptr<WorkerProcess>> WorkerProcess::Spawn(const WorkerSpawnOptions& options) {
  if (options.argv.empty()) return Status::InvalidArgument("the worker command is empty");
  std::unique_ptr<WorkerProcess> process(new WorkerProcess());

  UniqueFd child_socket;
  if (options.socket) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return ErrnoStatus("socketpair", errno);
    process->socket_.Reset(pair[0]);
    UniqueFd child_end(pair[1]);
    int flags = fcntl(pair[0], F_GETFL);
    if (flags < 0 || fcntl(pair[0], F_SETFL, flags | O_NONBLOCK) != 0) return ErrnoStatus("fcntl", errno);
    child_socket = DupHigh(child_end.get());
    if (!child_socket.valid()) return ErrnoStatus("fcntl", errno);
  }
  UniqueFd child_stderr;
  if (options.capture_stderr) {
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) return ErrnoStatus("pipe", errno);
    process->stderr_.Reset(pipe_fds[0]);
    UniqueFd write_end(pipe_fds[1]);
    child_stderr = DupHigh(write_end.get());
    if (!child_stderr.valid()) return ErrnoStatus("fcntl", errno);
  }

  std::vector<std::string> args = options.argv;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = BuildEnvironment(options.env);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  if (child_stderr.valid()) posix_spawn_file_actions_adddup2(&actions, child_stderr.get(), 2);
  if (child_socket.valid()) posix_spawn_file_actions_adddup2(&actions, child_socket.get(), 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  // Group 0: the child leads a new group, so Kill reaches what it starts (pip, a data loader's
  // processes) as well.
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return ErrnoStatus("cannot start the worker " + options.argv[0], rc);
  process->pid_ = pid;
  return process;
}

WorkerProcess::~WorkerProcess() {
  if (pid_ > 0 && !reaped_.load()) {
    Kill(SIGKILL);
    Wait();
  }
}

void WorkerProcess::Kill(int signal) {
  if (pid_ <= 0 || reaped_.load()) return;
  ::kill(-pid_, signal);
}

int WorkerProcess::Wait() {
  if (reaped_.load() || pid_ <= 0) return wait_status_;
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0) {
    if (errno != EINTR) {
      status = 0;  // ECHILD: someone else reaped it (SIGCHLD ignored); nothing more to learn
      break;
    }
  }
  wait_status_ = status;
  reaped_.store(true);
  return wait_status_;
}

std::optional<int> WorkerProcess::TryWait() {
  if (reaped_.load() || pid_ <= 0) return wait_status_;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return std::nullopt;
  wait_status_ = r < 0 ? 0 : status;
  reaped_.store(true);
  return wait_status_;
}

int WorkerProcess::WaitOrKill(int timeout_ms) {
  // Polls rather than blocking: a child can close its socket and go on running, and we must not
  // wait on it forever. Exiting Python takes a few ms, so the first checks come quickly.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto pause = std::chrono::microseconds(200);
  while (true) {
    if (std::optional<int> status = TryWait()) return *status;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
  }
  Kill(SIGKILL);
  return Wait();
}

uint64_t WorkerProcess::RssBytes() const {
  if (pid_ <= 0 || reaped_.load()) return 0;
  return ProcessRssBytes(pid_);
}

uint64_t ProcessRssBytes(pid_t pid) {
  if (pid <= 0) return 0;
  uint64_t total = StatmRss(pid);
  // Direct children (a worker's data loader processes, say); needs CONFIG_PROC_CHILDREN, else none.
  std::ifstream children("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  pid_t child;
  while (children >> child) total += StatmRss(child);
  return total;
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return "exit status " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    int sig = WTERMSIG(wait_status);
    const char* abbrev = sigabbrev_np(sig);
    return "killed by signal " + std::to_string(sig) + (abbrev ? std::string(" (SIG") + abbrev + ")" : "");
  }
  return "wait status " + std::to_string(wait_status);
}

}  // namespace kiln::modelserver
