#include "access/agent_main.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "access/agent_session.h"
#include "access/instance_entry.h"
#include "base/fs.h"

namespace kiln::access {
namespace {

constexpr int kBadArguments = 2;
constexpr int kCannotEnter = 3;
// How long the agent holds the socket after the connection ended, waiting for the daemon to close.
constexpr int kLingerMillis = 3000;

// The connection's socket, for the signal handler: shutdown(2) is async-signal-safe, and a shut
// down transport ends Serve like a client that left (children killed, Serve returns).
volatile sig_atomic_t g_socket_fd = -1;
volatile sig_atomic_t g_terminated = 0;

void OnTerminate(int) {
  g_terminated = 1;
  int fd = g_socket_fd;
  if (fd >= 0) shutdown(fd, SHUT_RDWR);
}

int Fail(int code, const std::string& reason) {
  // One line: the daemon shows it to the user as the reason the connection closed.
  std::string line = "kiln agent: " + reason;
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  line += "\n";
  ssize_t ignored = write(2, line.data(), line.size());
  (void)ignored;
  return code;
}

std::optional<int> ParseFd(std::string_view text) {
  if (text.empty() || text.size() > 9) return std::nullopt;
  int value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value;
}

bool FdOpen(int fd) { return fcntl(fd, F_GETFD) >= 0; }

void WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the daemon stopped listening: events are best effort
    done += static_cast<size_t>(n);
  }
}

// A command longer than this is cut in its event (with "..."): event lines stay short whatever
// the client runs (the daemon drops lines over 64 KiB).
constexpr size_t kMaxEventCommandBytes = 4096;

std::string EventJson(const AgentEvent& e) {
  nlohmann::json j = {{"event", AgentEventName(e.kind)}};
  std::string command = e.command;
  if (command.size() > kMaxEventCommandBytes) command = command.substr(0, kMaxEventCommandBytes) + "...";
  switch (e.kind) {
    case AgentEvent::Kind::kAuthenticated: j["user"] = e.user; break;
    case AgentEvent::Kind::kShellStarted: break;
    case AgentEvent::Kind::kExecStarted: j["command"] = command; break;
    case AgentEvent::Kind::kExecEnded:
    case AgentEvent::Kind::kShellEnded:
      if (e.kind == AgentEvent::Kind::kExecEnded) j["command"] = command;
      if (e.signal.empty()) {
        j["exit_status"] = e.exit_status;
      } else {
        j["signal"] = e.signal;
      }
      break;
    case AgentEvent::Kind::kDirectTcpip:
      j["host"] = e.host;
      j["port"] = e.port;
      break;
    case AgentEvent::Kind::kTcpipForward:
      j["address"] = e.host;
      j["port"] = e.port;
      break;
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

struct Arguments {
  int pid = 0;
  int socket_fd = -1;
  int events_fd = -1;
  std::vector<std::string> authorized_keys;
  std::string host_key;
  std::vector<std::string> working_directories;
  int keepalive_seconds = 15;
};

// Parses argv (argv[0] is "agent"); an error message or nullopt.
std::optional<std::string> Parse(int argc, char** argv, Arguments* args) {
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    std::string value;
    size_t eq = flag.find('=');
    if (flag.substr(0, 2) == "--" && eq != std::string_view::npos) {
      value = std::string(flag.substr(eq + 1));
      flag = flag.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return "missing value for " + std::string(flag);
    }
    if (flag == "--pid" || flag == "--socket-fd" || flag == "--events-fd" || flag == "--keepalive-seconds") {
      std::optional<int> n = ParseFd(value);
      if (!n) return std::string(flag) + " needs a non-negative integer, got '" + value + "'";
      if (flag == "--pid") args->pid = *n;
      if (flag == "--socket-fd") args->socket_fd = *n;
      if (flag == "--events-fd") args->events_fd = *n;
      if (flag == "--keepalive-seconds") args->keepalive_seconds = *n;
    } else if (flag == "--authorized-key") {
      args->authorized_keys.push_back(value);
    } else if (flag == "--host-key") {
      args->host_key = value;
    } else if (flag == "--working-directory") {
      args->working_directories.push_back(value);
    } else {
      return "unknown argument " + std::string(flag);
    }
  }
  if (args->pid <= 0) return std::string("--pid <host pid of the instance> is required");
  if (args->socket_fd < 0) return std::string("--socket-fd <fd> is required");
  if (!FdOpen(args->socket_fd)) return "--socket-fd " + std::to_string(args->socket_fd) + " is not an open descriptor";
  if (args->events_fd >= 0 && !FdOpen(args->events_fd)) {
    return "--events-fd " + std::to_string(args->events_fd) + " is not an open descriptor";
  }
  if (args->authorized_keys.empty()) return std::string("at least one --authorized-key is required");
  return std::nullopt;
}

}  // namespace

int RunAgentMain(int argc, char** argv) {
  // Die with the daemon's thread that started us (the socket's other end goes with it anyway).
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  Arguments args;
  if (std::optional<std::string> error = Parse(argc, argv, &args)) return Fail(kBadArguments, *error);

  // Neither descriptor may leak into the shells and commands the session starts.
  fcntl(args.socket_fd, F_SETFD, FD_CLOEXEC);
  if (args.events_fd >= 0) fcntl(args.events_fd, F_SETFD, FD_CLOEXEC);
  // A daemon gone before the write must not kill the agent before it cleans up.
  signal(SIGPIPE, SIG_IGN);

  g_socket_fd = args.socket_fd;
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_handler = OnTerminate;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);

  // 1. Who the workload is, read from the host's /proc.
  Result<InstanceIdentity> who = ReadInstanceIdentity(args.pid);
  if (!who.ok())
    return Fail(kCannotEnter, "cannot read instance process " + std::to_string(args.pid) + ": " +
                                  std::string(who.status().message()));
  // The working directory: the first that exists in the instance's file system (seen from here
  // through /proc/<pid>/root; the agent chdirs to it again once inside).
  std::string cwd = "/";
  const std::string root = "/proc/" + std::to_string(args.pid) + "/root";
  for (const std::string& dir : args.working_directories) {
    struct stat st;
    if (!dir.empty() && dir[0] == '/' && stat((root + dir).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      cwd = dir;
      break;
    }
  }
  // 2. The session: the host key lives in the host's file system, so before the mount namespace.
  AgentOptions options;
  options.working_directory = cwd;
  options.host_key_path = args.host_key;
  options.authorized_keys = args.authorized_keys;
  options.environment = who->environment;
  options.uid = who->uid;
  options.gid = who->gid;
  options.keepalive_interval_s = args.keepalive_seconds;
  const int events_fd = args.events_fd;
  if (events_fd >= 0) options.on_event = [events_fd](const AgentEvent& e) { WriteAll(events_fd, EventJson(e)); };
  Result<std::unique_ptr<AgentSession>> agent = AgentSession::Create(std::move(options));
  if (!agent.ok()) {
    return Fail(agent.status().IsInvalidArgument() ? kBadArguments : kCannotEnter,
                std::string(agent.status().message()));
  }
  // 3. In: cgroups (from the host's view of /sys/fs/cgroup), then the namespaces.
  Result<InstanceNamespaces> ns = OpenInstanceNamespaces(args.pid);
  if (!ns.ok()) return Fail(kCannotEnter, std::string(ns.status().message()));
  // The pid may have ended and been reused between reading /proc and opening the namespaces: the
  // descriptors must be that process's.
  if (ProcessStartTime(args.pid) != who->start_time) {
    return Fail(kCannotEnter, "instance process " + std::to_string(args.pid) + " ended");
  }
  if (Status adopted = AdoptResourceLimits(args.pid); !adopted.ok()) {
    return Fail(kCannotEnter, std::string(adopted.message()));
  }
  if (Status joined = JoinCgroups(who->cgroups); !joined.ok()) {
    return Fail(kCannotEnter, std::string(joined.message()));
  }
  if (Status entered = EnterNamespaces(*ns); !entered.ok()) return Fail(kCannotEnter, std::string(entered.message()));
  // The children chdir to it themselves (AgentOptions::working_directory); this is for sftp paths.
  if (chdir(cwd.c_str()) != 0 && chdir("/") != 0) return Fail(kCannotEnter, "cannot chdir to / in the instance");

  if (g_terminated) return 0;
  // Serve closes its descriptor; this one keeps the socket open after it returns (below).
  UniqueFd linger(fcntl(args.socket_fd, F_DUPFD_CLOEXEC, 0));
  if (linger.valid()) g_socket_fd = linger.get();
  Status served = (*agent)->Serve(args.socket_fd);
  if (!served.ok() && !g_terminated) {
    // Not a failure of the agent: the client left early or spoke no SSH. Said for the log.
    Fail(0, std::string(served.message()));
  }
  // A client that disconnects sends DISCONNECT and then closes its connection; the agent ends on
  // the first, and the daemon, which names a connection's end by the side that closed first,
  // would see the agent go before the client. So the socket stays open until the daemon closes
  // it (or a bounded while, for a client that keeps its side open), reading nothing more.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(kLingerMillis);
  while (linger.valid() && !g_terminated) {
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(give_up - std::chrono::steady_clock::now()).count());
    if (left <= 0) break;
    pollfd p{linger.get(), POLLIN, 0};
    int n = poll(&p, 1, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    char buf[4096];
    ssize_t got = read(linger.get(), buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // the daemon closed its end (or the socket failed)
  }
  g_socket_fd = -1;
  return 0;
}

}  // namespace kiln::access
