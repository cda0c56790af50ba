// `kiln shim`: one per instance. Started by ProcessRuntime::Launch with
//   --state <instance dir> --lock-fd 3 --report-fd 4
// it detaches (fork + setsid), builds the sandbox's child (sandbox.cc), tells the launcher on the
// report pipe whether the program was exec'd ("ok" / "error <class> <message>"), then captures the
// program's output, answers the control socket and records the exit status. Single-threaded: one
// poll loop over the output pipes, a pidfd for the program, the listening socket and its clients,
// and, for an instance with a network of its own, the loopback relay (loopback_relay.h).
//
// Network (spec.network set; the shim must be root in the node's namespaces): before the fork the
// shim creates the instance's network namespace (unshare(CLONE_NEWNET), keeping descriptors of the
// node's and the new namespace), forks the program's process inside it (it inherits the new one),
// switches itself back to the node's, joins the new namespace to the bridge
// (netlink::ConnectNamespace: veth, eth0, address, routes), opens the loopback forwards' listening
// sockets inside it and only then lets the program start (the go pipe). The namespace lives as
// long as something in it does (the sandbox's processes, the relay's sockets); the shim closes its
// sockets and deletes the host veth when the program has exited, before exit.json is written.
//
// Control protocol (one request line, one reply line, then the shim closes the connection):
//   signal N      -> ok | error <message>
//   stop SECONDS  -> ok          SIGTERM to the program once, SIGKILL when the (shortest) grace ends
//   status        -> {"state":"running"|"exited","pid":...,"started_millis":...,"stop_requested":...}
//   wait          -> exited      sent once exit.json is on disk (EOF means the same)

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "base/strings.h"
#include "base/time.h"
#include "runtime/process/loopback_relay.h"
#include "runtime/process/netlink.h"
#include "runtime/process/process_runtime.h"
#include "runtime/process/sandbox.h"
#include "runtime/process/state.h"

namespace kiln::runtime {
namespace {

namespace ps = process_state;

// How long the shim keeps draining the output pipes after the program exited. Every writer is
// gone by then (the kernel kills the whole PID namespace with its init), so EOF comes at once;
// the bound only guards against a descriptor leaked outside the sandbox.
constexpr int64_t kDrainMillis = 2000;
constexpr size_t kReadChunk = 64 * 1024;

void Log(const char* format, ...) __attribute__((format(printf, 1, 2)));
void Log(const char* format, ...) {
  char buf[2048];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof(buf), format, args);
  va_end(args);
  std::fprintf(stderr, "%s shim[%d]: %s\n", FormatIso8601Millis(NowMillis()).c_str(), getpid(), buf);
  std::fflush(stderr);
}

struct Args {
  std::string state_dir;
  int lock_fd = -1;
  int report_fd = -1;
};

std::optional<Args> ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    if (i + 1 >= argc) return std::nullopt;
    std::string value = argv[++i];
    if (flag == "--state") {
      args.state_dir = value;
    } else if (flag == "--lock-fd" || flag == "--report-fd") {
      std::optional<int64_t> n = ParseInt64(value);
      if (!n || *n < 0 || *n > 1 << 20) return std::nullopt;
      (flag == "--lock-fd" ? args.lock_fd : args.report_fd) = static_cast<int>(*n);
    } else {
      return std::nullopt;
    }
  }
  if (args.state_dir.empty()) return std::nullopt;
  return args;
}

// One captured stream: the read end of a pipe plus the unfinished line.
struct Stream {
  int fd = -1;
  char tag = 'o';
  std::string partial;
};

struct Client {
  int fd = -1;
  std::string request;
};

double MillisSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

class Shim {
 public:
  explicit Shim(Args args) : args_(std::move(args)) {}
  int Run();

 private:
  // Start-up; each returns an error for the launcher ("<class> <message>") or "".
  std::string Prepare();
  std::string EnterUserNamespace();
  void WarnAboutLoopbackResolver();
  void SetUpCgroup();
  std::string StartProgram();
  // The instance's network, between the fork and the go byte (see the top of the file). Returns
  // an error for the launcher or ""; on error the caller kills the child.
  std::string ConnectNetwork();
  // Host veth cleanup when the network was set up (Ok when the link is already gone).
  void DeleteHostVeth();

  void Report(const std::string& line);
  void Loop();
  void ReadStream(Stream& s, int64_t now);
  void AppendRecords(Stream& s, bool at_eof, int64_t now);
  void Accept();
  // Returns true when the client is finished (reply sent or gone).
  bool ServeClient(Client& c);
  std::string Execute(const std::string& request, bool* keep_open);
  void ReapChild();
  void Finish();

  Args args_;
  const std::chrono::steady_clock::time_point shim_start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point fork_start_;
  InstanceSpec spec_;
  std::string socket_path_;
  std::string cgroup_dir_;  // empty: no cgroup
  int output_fd_ = -1;
  int listen_fd_ = -1;
  int pidfd_ = -1;
  pid_t child_ = -1;
  Stream out_{-1, 'o', {}};
  Stream err_{-1, 'e', {}};
  std::vector<Client> clients_;
  std::vector<int> waiters_;
  // The instance's network (spec_.network): descriptors of the node's and the instance's network
  // namespaces while the shim builds it (closed once the program runs: the instance's namespace
  // must die with the sandbox), and the loopback relay.
  int host_netns_fd_ = -1;
  int instance_netns_fd_ = -1;
  double network_millis_ = 0;
  bool veth_created_ = false;
  LoopbackRelay relay_;
  int64_t started_millis_ = 0;
  int64_t finished_millis_ = 0;
  bool exited_ = false;
  int wait_status_ = 0;
  bool stop_requested_ = false;
  bool term_sent_ = false;
  std::optional<int64_t> kill_at_;  // when Stop's grace ends
  bool killed_ = false;
  bool output_error_logged_ = false;
};

void Shim::Report(const std::string& line) {
  if (args_.report_fd < 0) return;
  std::string text = line + "\n";
  (void)WriteAll(args_.report_fd, text);
  close(args_.report_fd);
  args_.report_fd = -1;
}

std::string Shim::EnterUserNamespace() {
  uid_t uid = geteuid();
  gid_t gid = getegid();
  if (unshare(CLONE_NEWUSER) != 0) {
    return "precondition kiln runs as uid " + std::to_string(uid) +
           " and this host does not allow unprivileged user namespaces (" + std::strerror(errno) +
           "); run kiln as root, or allow them (sysctl user.max_user_namespaces > 0, "
           "kernel.unprivileged_userns_clone=1, or the AppArmor restriction "
           "kernel.apparmor_restrict_unprivileged_userns=0)";
  }
  // Map the caller to root inside, as `unshare -r` does; an unprivileged process may map exactly
  // its own ids, and must deny setgroups before writing a gid map.
  auto write = [](const char* path, const std::string& text) -> std::string {
    UniqueFd fd(open(path, O_WRONLY | O_CLOEXEC));
    if (!fd.valid()) return std::string("open ") + path + ": " + std::strerror(errno);
    if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
      return std::string("write ") + path + ": " + std::strerror(errno);
    }
    return "";
  };
  std::string e = write("/proc/self/setgroups", "deny");
  if (e.empty()) e = write("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1");
  if (e.empty()) e = write("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1");
  if (!e.empty()) return "internal cannot set up the user namespace: " + e;
  Log("running unprivileged (uid %u): sandbox in a user namespace, uid %u is root inside", uid, uid);
  return "";
}

// Best effort (DESIGN.md §6: "cgroup limits apply where the host allows"): a cgroup v2 leaf
// /sys/fs/cgroup/kiln/<id> with cpuset.cpus and memory.max. Hosts without cgroup v2, without the
// controllers or without write access get a log line; cpus still apply through sched_setaffinity.
void Shim::SetUpCgroup() {
  if (spec_.cpus.empty() && spec_.memory_limit_bytes == 0) return;
  std::string root;
  for (const char* candidate : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
    if (PathExists(std::string(candidate) + "/cgroup.controllers")) {
      root = candidate;
      break;
    }
  }
  if (root.empty()) {
    Log("cgroup v2 is not mounted: no cgroup limits (cpus apply through sched_setaffinity only)");
    return;
  }
  Result<std::string> available = ReadFile(root + "/cgroup.controllers");
  std::vector<std::string> wanted;
  if (!spec_.cpus.empty()) wanted.push_back("cpuset");
  if (spec_.memory_limit_bytes != 0) wanted.push_back("memory");
  std::vector<std::string> enable;
  for (const std::string& c : wanted) {
    bool present = false;
    if (available.ok()) {
      for (std::string_view have : Split(Trim(*available), ' ')) present |= have == c;
    }
    if (present) {
      enable.push_back(c);
    } else {
      Log("cgroup v2 controller %s is not available under %s: that limit is not enforced", c.c_str(), root.c_str());
    }
  }
  if (enable.empty()) return;
  auto write = [](const std::string& path, const std::string& text) {
    UniqueFd fd(open(path.c_str(), O_WRONLY | O_CLOEXEC));
    return fd.valid() && ::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size());
  };
  std::string control;
  for (const std::string& c : enable) control += (control.empty() ? "+" : " +") + c;
  std::string parent = root + "/kiln";
  std::string leaf = parent + "/" + spec_.instance_id;
  bool ok = write(root + "/cgroup.subtree_control", control) && (mkdir(parent.c_str(), 0755) == 0 || errno == EEXIST) &&
            write(parent + "/cgroup.subtree_control", control) && (mkdir(leaf.c_str(), 0755) == 0 || errno == EEXIST);
  if (ok && !spec_.cpus.empty() && std::find(enable.begin(), enable.end(), "cpuset") != enable.end()) {
    std::string cpus;
    for (int cpu : spec_.cpus) cpus += (cpus.empty() ? "" : ",") + std::to_string(cpu);
    ok = write(leaf + "/cpuset.cpus", cpus);
  }
  if (ok && spec_.memory_limit_bytes != 0 && std::find(enable.begin(), enable.end(), "memory") != enable.end()) {
    ok = write(leaf + "/memory.max", std::to_string(spec_.memory_limit_bytes));
    // An OOM kill takes the whole sandbox, as it takes a whole container.
    write(leaf + "/memory.oom.group", "1");
  }
  if (!ok) {
    Log("cannot set up cgroup %s (%s): no cgroup limits", leaf.c_str(), std::strerror(errno));
    rmdir(leaf.c_str());
    return;
  }
  cgroup_dir_ = leaf;
  Log("cgroup %s", leaf.c_str());
}

// The sandbox sees the node's /etc/resolv.conf (sandbox.cc leaves it). A resolver on a loopback
// address (systemd-resolved's 127.0.0.53, a local dnsmasq) is the node's own loopback, which a
// network namespace does not share: names other than /etc/hosts' then do not resolve inside. Kiln
// does not invent a DNS server; it says so in shim.log.
void Shim::WarnAboutLoopbackResolver() {
  Result<std::string> text = ReadFile("/etc/resolv.conf");
  if (!text.ok()) return;
  for (std::string_view line : Split(*text, '\n')) {
    line = Trim(line);
    if (!StartsWith(line, "nameserver")) continue;
    std::string_view server = Trim(line.substr(10));
    if (StartsWith(server, "127.") || server == "::1") {
      Log("warning: /etc/resolv.conf names the resolver %.*s on the node's loopback, which the instance's "
          "network namespace cannot reach: only /etc/hosts names resolve inside",
          static_cast<int>(server.size()), server.data());
    }
  }
}

std::string Shim::Prepare() {
  std::string dir = args_.state_dir;
  Result<std::string> text = ReadFile(ps::Join(dir, ps::kSpecFile));
  if (!text.ok()) return "internal cannot read the instance spec: " + text.status().message();
  Result<InstanceSpec> spec = ps::DecodeSpec(*text);
  if (!spec.ok()) return "internal " + spec.status().message();
  spec_ = std::move(*spec);
  if (spec_.argv.empty()) return "invalid no program to run (argv is empty)";
  if (spec_.network) {
    // Creating a veth and moving it into the namespace takes CAP_NET_ADMIN in the node's network
    // namespace: a user namespace of our own cannot give that.
    if (geteuid() != 0) {
      return "precondition an instance with a network of its own (network " + spec_.network->network +
             ") needs the shim to run as root, and kiln runs as uid " + std::to_string(geteuid()) +
             "; run kiln as root, or give instances the node's network (config network.mode: host)";
    }
    WarnAboutLoopbackResolver();
  }
  if (geteuid() != 0) {
    if (std::string e = EnterUserNamespace(); !e.empty()) return e;
  }
  if (!spec_.hosts_file_lines.empty()) {
    std::string hosts;
    for (const std::string& line : spec_.hosts_file_lines) hosts += line + "\n";
    if (Status s = ps::WriteFileRenamed(ps::Join(dir, ps::kHostsFile), hosts); !s.ok())
      return "internal " + s.message();
  }
  SetUpCgroup();
  std::string output = ps::Join(dir, ps::kOutputFile);
  output_fd_ = open(output.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (output_fd_ < 0) return "internal cannot open " + output + ": " + std::strerror(errno);

  socket_path_ = ps::SocketPath(dir);
  unlink(socket_path_.c_str());  // a stale socket of an earlier shim with the same (long) dir
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path_.c_str(), socket_path_.size() + 1);
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listen_fd_, 64) != 0) {
    return "internal cannot listen on " + socket_path_ + ": " + std::strerror(errno);
  }
  return "";
}

std::string Shim::ConnectNetwork() {
  const NetworkAttachment& net = *spec_.network;
  auto t0 = std::chrono::steady_clock::now();
  if (Status s = netlink::ConnectNamespace(instance_netns_fd_, net); !s.ok()) {
    return "internal cannot connect the instance to bridge " + net.bridge + " of network " + net.network + " (" +
           net.address + ", host veth " + net.host_veth + "): " + s.message();
  }
  veth_created_ = true;
  double connect_millis = MillisSince(t0);
  auto t1 = std::chrono::steady_clock::now();
  if (!net.loopback_forwards.empty()) {
    // Sockets belong to the namespace they were created in: these listen on the instance's
    // 127.0.0.1 for as long as the shim keeps them, whatever namespace the shim is in later.
    if (setns(instance_netns_fd_, CLONE_NEWNET) != 0) {
      return std::string("internal cannot enter the instance's network namespace: ") + std::strerror(errno);
    }
    std::string failure;
    for (int port : net.loopback_forwards) {
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      int one = 1;
      if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
          bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 128) != 0) {
        failure = "internal cannot listen on 127.0.0.1:" + std::to_string(port) +
                  " inside the instance's network namespace: " + std::strerror(errno);
        if (fd >= 0) close(fd);
        break;
      }
      // The target has the same address: the relay connects from the node's namespace.
      relay_.AddListener(fd, addr);
    }
    if (setns(host_netns_fd_, CLONE_NEWNET) != 0) {
      // The relay would connect inside the instance: refuse rather than forward to the wrong place.
      return std::string("internal cannot return to the node's network namespace: ") + std::strerror(errno);
    }
    if (!failure.empty()) return failure;
  }
  // From here on only the sandbox's processes and the relay's sockets hold the namespace.
  close(instance_netns_fd_);
  close(host_netns_fd_);
  instance_netns_fd_ = host_netns_fd_ = -1;
  double forwards_millis = MillisSince(t1);
  double namespace_millis = network_millis_;
  network_millis_ += connect_millis + forwards_millis;
  Log("network %s: %s %s/%d on bridge %s (host veth %s)%s, %zu loopback forward(s): %.2f ms (namespace %.2f, "
      "veth + addresses + routes %.2f, forwards %.2f)",
      net.network.c_str(), net.interface_name.c_str(), net.address.c_str(), net.prefix_length, net.bridge.c_str(),
      net.host_veth.c_str(), net.isolated ? ", isolated (no default route)" : "", net.loopback_forwards.size(),
      network_millis_, namespace_millis, connect_millis, forwards_millis);
  return "";
}

void Shim::DeleteHostVeth() {
  if (!veth_created_) return;
  veth_created_ = false;
  if (Status s = netlink::DeleteLink(spec_.network->host_veth); !s.ok()) {
    Log("cannot delete host veth %s: %s", spec_.network->host_veth.c_str(), s.ToString().c_str());
  }
}

std::string Shim::StartProgram() {
  int out[2], err[2], status[2], go[2] = {-1, -1};
  // The child waits for the go byte when the shim has work to do between the fork and the exec:
  // moving it into its cgroup, building its network.
  bool hold_child = !cgroup_dir_.empty() || spec_.network.has_value();
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(status, O_CLOEXEC) != 0 ||
      (hold_child && pipe2(go, O_CLOEXEC) != 0)) {
    return std::string("internal pipe: ") + std::strerror(errno);
  }
  // The next child is PID 1 of a new PID namespace. The program itself is that PID 1, not an
  // init of ours in front of it: exactly a container's semantics (training-contract.md §2, "Kiln
  // does not wrap PID 1 in an init that would swallow SIGTERM"). So, as under Docker, a program
  // without a SIGTERM handler ignores SIGTERM and dies by Stop's SIGKILL after the grace; the
  // training toolkit installs its own handlers. Killing that PID 1 kills the whole sandbox.
  fork_start_ = std::chrono::steady_clock::now();
  if (spec_.network) {
    auto t0 = std::chrono::steady_clock::now();
    // The child must be forked inside the new network namespace (a process cannot be moved into
    // one from outside), so the shim enters it first and leaves it right after the fork.
    host_netns_fd_ = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (host_netns_fd_ < 0)
      return std::string("internal cannot open the node's network namespace: ") + std::strerror(errno);
    if (unshare(CLONE_NEWNET) != 0)
      return std::string("internal cannot create a network namespace: ") + std::strerror(errno);
    instance_netns_fd_ = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (instance_netns_fd_ < 0) {
      return std::string("internal cannot open the instance's network namespace: ") + std::strerror(errno);
    }
    network_millis_ = MillisSince(t0);
  }
  if (!spec_.network_namespace.empty()) {
    // Joins an existing namespace (another instance's, runtime.h): forked inside it, the shim
    // itself goes back to the node's right after the fork.
    host_netns_fd_ = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (host_netns_fd_ < 0)
      return std::string("internal cannot open the node's network namespace: ") + std::strerror(errno);
    UniqueFd joined(open(spec_.network_namespace.c_str(), O_RDONLY | O_CLOEXEC));
    if (!joined.valid()) {
      return "precondition cannot open the network namespace " + spec_.network_namespace +
             " to join (the instance holding it has ended?): " + std::strerror(errno);
    }
    if (setns(joined.get(), CLONE_NEWNET) != 0) {
      return "precondition cannot join the network namespace " + spec_.network_namespace + ": " + std::strerror(errno);
    }
  }
  if (unshare(CLONE_NEWPID) != 0) return std::string("internal cannot create a PID namespace: ") + std::strerror(errno);
  pid_t pid = fork();
  if (pid < 0) return std::string("internal fork: ") + std::strerror(errno);
  if (pid == 0) {
    SandboxPlan plan;
    plan.spec = &spec_;
    if (!spec_.hosts_file_lines.empty()) plan.hosts_file = ps::Join(args_.state_dir, ps::kHostsFile);
    plan.stdout_fd = out[1];
    plan.stderr_fd = err[1];
    plan.status_fd = status[1];
    plan.go_fd = go[0];
    SetupSandboxAndExec(plan);
  }
  child_ = pid;
  if (!spec_.network_namespace.empty()) {
    if (setns(host_netns_fd_, CLONE_NEWNET) != 0) {
      // The relay and any later socket would live in the joined namespace: refuse.
      const std::string why = std::strerror(errno);
      kill(pid, SIGKILL);
      int st;
      while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      child_ = -1;
      return "internal cannot return to the node's network namespace: " + why;
    }
    close(host_netns_fd_);
    host_netns_fd_ = -1;
  }
  close(out[1]);
  close(err[1]);
  close(status[1]);
  out_.fd = out[0];
  err_.fd = err[0];
  if (go[1] >= 0) {
    close(go[0]);
    if (!cgroup_dir_.empty()) {
      UniqueFd procs(open((cgroup_dir_ + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
      std::string text = std::to_string(pid);
      if (!procs.valid() || write(procs.get(), text.data(), text.size()) < 0) {
        Log("cannot move the program into %s: %s", cgroup_dir_.c_str(), std::strerror(errno));
      }
    }
    if (spec_.network) {
      std::string failure;
      if (setns(host_netns_fd_, CLONE_NEWNET) != 0) {
        failure = std::string("internal cannot return to the node's network namespace: ") + std::strerror(errno);
      } else {
        failure = ConnectNetwork();
      }
      if (!failure.empty()) {
        // The program never started: kill its process (waiting for the go byte), close what
        // holds the namespace, and delete the host veth now rather than when the kernel gets to
        // the namespace's teardown.
        kill(pid, SIGKILL);
        close(go[1]);
        close(status[0]);
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
        child_ = -1;
        return failure;  // Run's failure path closes the relay and deletes the veth
      }
    }
    [[maybe_unused]] ssize_t n = write(go[1], "g", 1);
    close(go[1]);
  }
  // The status pipe closes with nothing in it exactly when exec succeeded (CLOEXEC).
  std::string failure;
  char buf[4096];
  while (true) {
    ssize_t n = read(status[0], buf, sizeof(buf));
    if (n > 0) {
      failure.append(buf, n);
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(status[0]);
  if (!failure.empty()) {
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    child_ = -1;
    return failure;
  }
  started_millis_ = NowMillis();
  pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd_ < 0) Log("pidfd_open: %s; polling for the program's exit instead", std::strerror(errno));
  return "";
}

int Shim::Run() {
  // Descriptors inherited from the launcher must not reach the program.
  if (args_.lock_fd >= 0) fcntl(args_.lock_fd, F_SETFD, FD_CLOEXEC);
  if (args_.report_fd >= 0) fcntl(args_.report_fd, F_SETFD, FD_CLOEXEC);
  close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  // The shim ends with its program (Stop, or SIGKILL), never by a signal sent to every process
  // of a group: Slurm's scancel and time limit SIGTERM every process of a job step, which would
  // otherwise end the shim before the program's exit is recorded (runtime/slurm: `kiln node`
  // stops the program itself and reports the exit). The program gets default dispositions
  // (sandbox.cc), so this does not reach it.
  signal(SIGTERM, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  if (args_.lock_fd < 0) {
    // Started by hand: take the lock ourselves.
    args_.lock_fd = open(ps::Join(args_.state_dir, ps::kLockFile).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (args_.lock_fd < 0 || flock(args_.lock_fd, LOCK_EX | LOCK_NB) != 0) {
      Report("error internal another shim holds " + args_.state_dir);
      return 1;
    }
  }
  // Detach: the launcher reaps the parent at once; the shim lives on in its own session, so
  // neither the server's exit nor a signal to its process group reaches it.
  pid_t pid = fork();
  if (pid < 0) {
    Report(std::string("error internal fork: ") + std::strerror(errno));
    return 1;
  }
  if (pid > 0) _exit(0);
  setsid();
  if (chdir("/") != 0) {
    // Only so as not to pin the launcher's working directory; harmless if it fails.
  }
  std::string failure = Prepare();
  if (failure.empty()) failure = StartProgram();
  if (!failure.empty()) {
    Log("cannot start: %s", failure.c_str());
    Report("error " + failure);
    // The program's process is gone (killed or failed to exec): once the relay's sockets are
    // closed nothing holds the network namespace; the veth is deleted now, not at the kernel's
    // asynchronous teardown of the namespace.
    relay_.CloseAll();
    DeleteHostVeth();
    if (!socket_path_.empty()) unlink(socket_path_.c_str());
    if (!cgroup_dir_.empty()) rmdir(cgroup_dir_.c_str());
    return 1;
  }
  // started.json before "ok", so that Inspect reports started_millis as soon as Launch returns.
  ps::StartedRecord started{started_millis_, getpid(), child_, socket_path_};
  if (Status s = ps::WriteFileRenamed(ps::Join(args_.state_dir, ps::kStartedFile), ps::EncodeStarted(started));
      !s.ok()) {
    Log("%s", s.ToString().c_str());
  }
  Report("ok");
  // Launch latency is on the job-start path: say where it goes.
  Log("started pid %d: %s (%.2f ms after the shim's main, of which network + sandbox + exec %.2f ms, network "
      "%.2f ms)",
      child_, spec_.argv[0].c_str(), MillisSince(shim_start_), MillisSince(fork_start_), network_millis_);
  Loop();
  Finish();
  return 0;
}

void Shim::AppendRecords(Stream& s, bool at_eof, int64_t now) {
  std::string batch;
  std::string prefix = std::to_string(now) + " " + s.tag + " ";
  size_t start = 0;
  auto emit = [&](size_t from, size_t len) {
    batch += prefix;
    batch.append(s.partial, from, len);
    batch += '\n';
  };
  while (start < s.partial.size()) {
    size_t nl = s.partial.find('\n', start);
    size_t len = (nl == std::string::npos ? s.partial.size() : nl) - start;
    if (len > kMaxOutputLineBytes) {
      emit(start, kMaxOutputLineBytes);
      start += kMaxOutputLineBytes;
    } else if (nl != std::string::npos) {
      emit(start, len);
      start = nl + 1;
    } else if (at_eof) {
      emit(start, len);
      start = s.partial.size();
    } else {
      break;
    }
  }
  s.partial.erase(0, start);
  if (batch.empty()) return;
  // One write(2) per read: a tailing reader sees whole records as soon as they are read.
  if (Status st = WriteAll(output_fd_, batch); !st.ok() && !output_error_logged_) {
    Log("cannot write output: %s", st.ToString().c_str());
    output_error_logged_ = true;
  }
}

void Shim::ReadStream(Stream& s, int64_t now) {
  char buf[kReadChunk];
  ssize_t n = read(s.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    AppendRecords(s, /*at_eof=*/true, now);
    close(s.fd);
    s.fd = -1;
    return;
  }
  s.partial.append(buf, n);
  AppendRecords(s, /*at_eof=*/false, now);
}

void Shim::Accept() {
  while (true) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    clients_.push_back({fd, {}});
  }
}

std::string Shim::Execute(const std::string& request, bool* keep_open) {
  std::vector<std::string_view> words = Split(Trim(request), ' ');
  std::string_view verb = words.empty() ? "" : words[0];
  if (verb == "signal" && words.size() == 2) {
    std::optional<int64_t> sig = ParseInt64(words[1]);
    if (!sig || *sig <= 0 || *sig >= NSIG) return "error bad signal";
    if (exited_) return "error not running";
    if (kill(child_, static_cast<int>(*sig)) != 0) return std::string("error kill: ") + std::strerror(errno);
    return "ok";
  }
  if (verb == "stop" && words.size() == 2) {
    std::optional<int64_t> grace = ParseInt64(words[1]);
    if (!grace || *grace < 0) return "error bad grace";
    if (!stop_requested_) {
      stop_requested_ = true;
      // On disk before the reply, so that Inspect reports it from then on.
      (void)ps::WriteFileRenamed(ps::Join(args_.state_dir, ps::kStopFile), "");
    }
    if (!exited_) {
      if (!term_sent_) {
        term_sent_ = true;
        kill(child_, SIGTERM);
        Log("stop: SIGTERM sent, grace %lld s", static_cast<long long>(*grace));
      }
      int64_t deadline = NowMillis() + *grace * 1000;
      if (!kill_at_ || deadline < *kill_at_) kill_at_ = deadline;
    }
    return "ok";
  }
  if (verb == "status" && words.size() == 1) {
    nlohmann::json j = {{"state", exited_ ? "exited" : "running"},
                        {"pid", child_},
                        {"started_millis", started_millis_},
                        {"stop_requested", stop_requested_}};
    return j.dump();
  }
  if (verb == "wait" && words.size() == 1) {
    *keep_open = true;
    return "";
  }
  return "error unknown command";
}

bool Shim::ServeClient(Client& c) {
  char buf[512];
  ssize_t n = read(c.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return false;
  if (n <= 0) return true;
  c.request.append(buf, n);
  size_t nl = c.request.find('\n');
  if (nl == std::string::npos) return c.request.size() > 4096;
  bool keep_open = false;
  std::string reply = Execute(c.request.substr(0, nl), &keep_open);
  if (keep_open) {
    waiters_.push_back(c.fd);
    c.fd = -1;
    return true;
  }
  reply += "\n";
  [[maybe_unused]] ssize_t w = send(c.fd, reply.data(), reply.size(), MSG_NOSIGNAL);
  return true;
}

void Shim::ReapChild() {
  int st;
  pid_t r = waitpid(child_, &st, WNOHANG);
  if (r != child_) return;
  exited_ = true;
  wait_status_ = st;
  finished_millis_ = NowMillis();
}

void Shim::Loop() {
  int64_t drain_until = 0;
  while (true) {
    int64_t now = NowMillis();
    if (exited_ && ((out_.fd < 0 && err_.fd < 0) || now >= drain_until)) break;
    if (!exited_ && kill_at_ && !killed_ && now >= *kill_at_) {
      // Killing the namespace's init makes the kernel kill every process of the sandbox.
      kill(child_, SIGKILL);
      killed_ = true;
      Log("stop: grace over, SIGKILL sent");
    }
    std::vector<pollfd> fds;
    fds.push_back({out_.fd, POLLIN, 0});
    fds.push_back({err_.fd, POLLIN, 0});
    fds.push_back({exited_ ? -1 : pidfd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const Client& c : clients_) fds.push_back({c.fd, POLLIN, 0});
    const size_t polled_clients = clients_.size();  // Accept appends clients that were not polled
    const size_t relay_first = fds.size();
    relay_.AppendPollFds(&fds);
    const size_t relay_count = fds.size() - relay_first;
    int timeout = -1;
    if (exited_) timeout = static_cast<int>(std::max<int64_t>(0, drain_until - now));
    if (!exited_ && kill_at_ && !killed_) timeout = static_cast<int>(std::max<int64_t>(0, *kill_at_ - now));
    if (!exited_ && pidfd_ < 0) timeout = timeout < 0 ? 50 : std::min(timeout, 50);
    int n = poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) {
      Log("poll: %s", std::strerror(errno));
      break;
    }
    now = NowMillis();
    if (fds[0].revents) ReadStream(out_, now);
    if (fds[1].revents) ReadStream(err_, now);
    if (relay_count > 0) relay_.HandleEvents(fds.data() + relay_first, relay_count);
    if (!exited_ && (pidfd_ < 0 || fds[2].revents)) {
      ReapChild();
      if (exited_) {
        drain_until = finished_millis_ + kDrainMillis;
        // Nothing is left to relay for; the sockets are what still holds the namespace.
        relay_.CloseAll();
      }
    }
    if (fds[3].revents) Accept();
    std::vector<Client> kept;
    for (size_t i = 0; i < clients_.size(); ++i) {
      Client& c = clients_[i];
      bool polled = i < polled_clients;
      if (polled && fds[4 + i].revents && ServeClient(c)) {
        if (c.fd >= 0) close(c.fd);
        continue;
      }
      kept.push_back(std::move(c));
    }
    clients_ = std::move(kept);
  }
}

void Shim::Finish() {
  int64_t now = NowMillis();
  for (Stream* s : {&out_, &err_}) {
    if (s->fd >= 0) {
      AppendRecords(*s, /*at_eof=*/true, now);
      close(s->fd);
      s->fd = -1;
    }
  }
  ps::ExitRecord record;
  record.started_millis = started_millis_;
  record.finished_millis = finished_millis_;
  record.stop_requested = stop_requested_;
  if (WIFEXITED(wait_status_)) {
    record.exit_code = WEXITSTATUS(wait_status_);
  } else if (WIFSIGNALED(wait_status_)) {
    record.term_signal = WTERMSIG(wait_status_);
  }
  // Every process of the sandbox is gone (its init was reaped), so the cgroup is empty now; remove
  // it before the exit is visible, so that a caller who saw the exit finds no leftovers.
  if (!cgroup_dir_.empty() && rmdir(cgroup_dir_.c_str()) != 0) {
    Log("cannot remove %s: %s", cgroup_dir_.c_str(), std::strerror(errno));
  }
  // Likewise the host veth: the kernel removes it with the namespace, but asynchronously.
  relay_.CloseAll();
  DeleteHostVeth();
  // Durable: the exit status is what the controller acts on, also after a node crash.
  if (Status s = WriteFileAtomic(ps::Join(args_.state_dir, ps::kExitFile), ps::EncodeExit(record)); !s.ok()) {
    Log("cannot record the exit: %s", s.ToString().c_str());
  }
  Log("program exited: code %d signal %d", record.exit_code, record.term_signal);
  for (int fd : waiters_) {
    [[maybe_unused]] ssize_t w = send(fd, "exited\n", 7, MSG_NOSIGNAL);
    close(fd);
  }
  for (const Client& c : clients_) close(c.fd);
  close(listen_fd_);
  unlink(socket_path_.c_str());
}

}  // namespace

int RunShim(int argc, char** argv) {
  std::optional<Args> args = ParseArgs(argc, argv);
  if (!args) {
    std::fprintf(stderr, "usage: kiln shim --state DIR [--lock-fd N] [--report-fd N]\n");
    return 2;
  }
  return Shim(std::move(*args)).Run();
}

}  // namespace kiln::runtime
