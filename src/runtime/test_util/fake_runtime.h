#pragma once
// Test helper: a runtime::Runtime without processes, for controller unit tests.
//
// Instances live in memory; only their captured output is a real file (under `state_dir`, in
// runtime.h's record format, so LogPump tails it as it tails the shim's). What an instance does
// is decided at Launch by the first matching rule (AddRule, newest first; else the default
// Behavior): it runs until told otherwise, fails to launch with a message, or exits at once with
// a code. While it runs a test makes it exit with a code (Exit), die by a signal (Kill), lose its
// supervisor (Lose: Inspect says kLost, with a lost_reason when given), be killed by the OOM
// killer (KillByOom: SIGKILL with oom_killed) or vanish with its state (Vanish: Inspect says NotFound),
// and write output lines (WriteOutput). Stop() is recorded with its grace; the instance then
// ends by SIGTERM at once, or, when its behaviour says it hangs, keeps running until a stop with
// grace 0, ExpireGrace() (the SIGKILL the real runtime sends when the grace ends) or Kill().
//
// Endpoint instances: when the launched environment has SAGEMAKER_BIND_TO_PORT, the instance
// answers GET /ping on 127.0.0.1:<port> — on spec.network->address:<port> when the spec has a
// network, as a namespaced container reached on its own address (FakeNetworks hands out 127.0.k.n
// addresses, all loopback, so several instances can listen on one port) — (a raw listener; every
// answer closes its connection)
// with Behavior::ping_status, changeable while it runs (SetPingStatus); Behavior::serve_ping
// false leaves the port unanswered (a container that never becomes healthy). The listener closes
// when the instance stops running.
//
// PrepareImage succeeds at once (an engine that has every image) and is recorded
// (prepared_images); SetPrepareImage scripts it instead (progress texts, a failure, a wait for
// `cancelled`).
//
// Every event (launch, stop, exit) wakes WaitUntil(), so tests wait for "instance X launched" or
// "N launches" without sleeping. Thread-safety: every method may be called from any thread.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/time.h"
#include "runtime/runtime.h"

namespace kiln::runtime::testing {

class FakeRuntime final : public Runtime {
 public:
  // What an instance does, chosen when it is launched.
  struct Behavior {
    enum class OnLaunch {
      kRun,         // runs until told otherwise
      kFailLaunch,  // Launch returns FailedPrecondition(launch_error); nothing is left behind
      kExitAtOnce,  // starts, writes `output`, and has exited with `exit_code` when Launch returns
    };
    OnLaunch on_launch = OnLaunch::kRun;
    std::string launch_error = "cannot execute the program: No such file or directory";
    int exit_code = 0;
    // Ignores SIGTERM: Stop(grace > 0) leaves it running (until ExpireGrace, Kill, or Stop(0)).
    bool hangs_on_stop = false;
    // Lines written at launch, (stream 'o' or 'e', text).
    std::vector<std::pair<char, std::string>> output;
    // GET /ping on SAGEMAKER_BIND_TO_PORT (when set in the environment).
    bool serve_ping = true;
    int ping_status = 200;
    // What Usage() answers while it runs (source "fake" unless set).
    InstanceUsage usage;
    // The pid Access() answers while it runs (0: this test process's pid, whose namespaces an
    // agent can "enter" harmlessly); the hostname is the spec's.
    int access_pid = 0;
  };

  struct StopCall {
    std::string instance_id;
    std::chrono::seconds grace{0};
  };
  struct SignalCall {
    std::string instance_id;
    int signal = 0;
  };

  // `state_dir` holds the output files (created if missing). `clock` (may be null: the system
  // clock) stamps output records and started/finished times.
  explicit FakeRuntime(std::string state_dir, const Clock* clock = nullptr)
      : state_dir_(std::move(state_dir)), clock_(clock) {
    std::filesystem::create_directories(state_dir_);
  }
  ~FakeRuntime() override {
    std::map<std::string, std::shared_ptr<Instance>> instances;
    {
      MutexLock lock(mutex_);
      instances.swap(instances_);
    }
    for (auto& [id, instance] : instances) instance->ping.reset();
  }
  FakeRuntime(const FakeRuntime&) = delete;
  FakeRuntime& operator=(const FakeRuntime&) = delete;

  // ---- Configuration -------------------------------------------------------------------------

  // What PrepareImage does: called with its arguments (on the caller's thread, outside the
  // fake's lock); null (the default) succeeds at once. Every call is recorded either way.
  using PrepareImageHook =
      std::function<Status(const ContainerImage& image, const std::function<void(const std::string&)>& progress,
                           const std::function<bool()>& cancelled)>;
  void SetPrepareImage(PrepareImageHook hook) {
    MutexLock lock(mutex_);
    prepare_image_ = std::move(hook);
  }

  void SetDefaultBehavior(Behavior behavior) {
    MutexLock lock(mutex_);
    default_ = std::move(behavior);
  }
  // Instances whose spec matches get `behavior` (the newest matching rule wins).
  void AddRule(std::function<bool(const InstanceSpec&)> match, Behavior behavior) {
    MutexLock lock(mutex_);
    rules_.insert(rules_.begin(), {std::move(match), std::move(behavior)});
  }
  static std::function<bool(const InstanceSpec&)> IdStartsWith(std::string prefix) {
    return [prefix](const InstanceSpec& s) { return s.instance_id.rfind(prefix, 0) == 0; };
  }
  static std::function<bool(const InstanceSpec&)> ProgramIs(std::string argv0) {
    return [argv0](const InstanceSpec& s) { return !s.argv.empty() && s.argv[0] == argv0; };
  }

  // ---- What happens to a running instance ----------------------------------------------------

  // The program exits with `code`. FailedPrecondition unless it runs.
  Status Exit(const std::string& id, int code) { return End(id, code, 0, InstanceState::kExited); }
  // The program is killed by `signal` (exit_code -1, term_signal `signal`).
  Status Kill(const std::string& id, int signal = SIGKILL) { return End(id, -1, signal, InstanceState::kExited); }
  // The supervisor disappears without recording an exit (Inspect: kLost, with `reason` as its
  // lost_reason).
  Status Lose(const std::string& id, std::string reason = "") {
    return End(id, -1, 0, InstanceState::kLost, false, std::move(reason));
  }
  // The kernel's OOM killer ends the program: SIGKILL, with oom_killed (as the container engine
  // reports it).
  Status KillByOom(const std::string& id) { return End(id, -1, SIGKILL, InstanceState::kExited, true); }
  // The instance and its state directory disappear (Inspect: NotFound), running or not.
  void Vanish(const std::string& id) {
    std::shared_ptr<Instance> instance;
    {
      MutexLock lock(mutex_);
      auto it = instances_.find(id);
      if (it == instances_.end()) return;
      instance = it->second;
      instances_.erase(it);
      ++events_;
    }
    instance->ping.reset();
    std::error_code ec;
    std::filesystem::remove_all(InstanceDir(id), ec);
    cv_.NotifyAll();
  }
  // The grace of a hanging instance's stop has ended: SIGKILL.
  Status ExpireGrace(const std::string& id) { return Kill(id, SIGKILL); }
  // Appends one output record (`stream` 'o' or 'e'), as the shim would.
  Status WriteOutput(const std::string& id, char stream, const std::string& line) {
    MutexLock lock(mutex_);
    if (!instances_.count(id)) return Status::NotFound("instance " + id + " not found");
    return AppendOutputLocked(id, stream, line);
  }
  // As a backend that places instances elsewhere (the Slurm runtime) reports them: still running
  // but waiting to start (`reason`; "" once started), and where its network is (`address`).
  Status SetWaiting(const std::string& id, std::string reason, std::string address = "") {
    {
      MutexLock lock(mutex_);
      auto it = instances_.find(id);
      if (it == instances_.end()) return Status::NotFound("instance " + id + " not found");
      it->second->status.waiting_reason = std::move(reason);
      it->second->status.address = std::move(address);
      ++events_;
    }
    cv_.NotifyAll();
    return Status::Ok();
  }
  // The cluster took the instance back: kLost with `reason`, preempted.
  Status Preempt(const std::string& id, std::string reason) {
    std::shared_ptr<Instance> instance;
    {
      MutexLock lock(mutex_);
      auto it = instances_.find(id);
      if (it == instances_.end()) return Status::NotFound("instance " + id + " not found");
      if (it->second->status.state != InstanceState::kRunning) {
        return Status::FailedPrecondition("instance " + id + " is not running");
      }
      instance = it->second;
      instance->status.preempted = true;
      EndLocked(*instance, -1, 0, InstanceState::kLost, false, std::move(reason));
    }
    cv_.NotifyAll();
    ClosePingIfEnded(instance);
    return Status::Ok();
  }
  Status SetPingStatus(const std::string& id, int status) {
    MutexLock lock(mutex_);
    auto it = instances_.find(id);
    if (it == instances_.end()) return Status::NotFound("instance " + id + " not found");
    it->second->ping_status->store(status);
    return Status::Ok();
  }

  // ---- Observation ---------------------------------------------------------------------------

  // Ids in launch order (successful launches only, including those no longer known).
  std::vector<std::string> launches() const {
    MutexLock lock(mutex_);
    return launches_;
  }
  // When each of launches() happened (steady clock), same order.
  std::vector<std::chrono::steady_clock::time_point> launch_times() const {
    MutexLock lock(mutex_);
    return launch_times_;
  }
  int launch_attempts() const {
    MutexLock lock(mutex_);
    return launch_attempts_;
  }
  // The images PrepareImage was called with, in order.
  std::vector<ContainerImage> prepared_images() const {
    MutexLock lock(mutex_);
    return prepared_images_;
  }
  std::vector<StopCall> stops() const {
    MutexLock lock(mutex_);
    return stops_;
  }
  std::vector<SignalCall> signals() const {
    MutexLock lock(mutex_);
    return signals_;
  }
  // The spec an instance was last launched with (nullopt if never).
  std::optional<InstanceSpec> spec(const std::string& id) const {
    MutexLock lock(mutex_);
    auto it = specs_.find(id);
    if (it == specs_.end()) return std::nullopt;
    return it->second;
  }
  bool running(const std::string& id) const {
    MutexLock lock(mutex_);
    auto it = instances_.find(id);
    return it != instances_.end() && it->second->status.state == InstanceState::kRunning;
  }
  // Ids of the instances that run now, sorted.
  std::vector<std::string> running_ids() const {
    MutexLock lock(mutex_);
    std::vector<std::string> ids;
    for (const auto& [id, instance] : instances_) {
      if (instance->status.state == InstanceState::kRunning) ids.push_back(id);
    }
    return ids;
  }

  // Waits until `done()` holds, re-checking after every event of this runtime and at least every
  // 10 ms (for conditions on other objects). False if `timeout` passed first.
  bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    MutexLock lock(mutex_);
    while (true) {
      lock.Unlock();
      if (done()) return true;
      lock.Lock();
      if (std::chrono::steady_clock::now() >= deadline) return false;
      uint64_t seen = events_;
      const auto recheck = std::chrono::steady_clock::now() + std::chrono::milliseconds(10);
      while (events_ == seen && cv_.WaitUntil(mutex_, recheck) == std::cv_status::no_timeout) {
      }
    }
  }
  bool WaitForLaunch(const std::string& id, std::chrono::milliseconds timeout) const {
    return WaitUntil([&] { return Launched(id); }, timeout);
  }
  // Waits for the n-th successful launch (counting from the first) and returns its id.
  std::optional<std::string> WaitForLaunchNumber(size_t n, std::chrono::milliseconds timeout) const {
    if (!WaitUntil([&] { return launches().size() >= n; }, timeout)) return std::nullopt;
    return launches().at(n - 1);
  }

  // ---- Runtime -------------------------------------------------------------------------------

  Status PrepareImage(const ContainerImage& image, const std::function<void(const std::string&)>& progress,
                      const std::function<bool()>& cancelled) override {
    PrepareImageHook hook;
    {
      MutexLock lock(mutex_);
      prepared_images_.push_back(image);
      hook = prepare_image_;
      ++events_;
    }
    cv_.NotifyAll();
    return hook ? hook(image, progress, cancelled) : Status::Ok();
  }

  Status Launch(const InstanceSpec& spec) override {
    MutexLock lock(mutex_);
    ++launch_attempts_;
    if (instances_.count(spec.instance_id)) {
      return Status::AlreadyExists("instance " + spec.instance_id + " already exists");
    }
    Behavior behavior = default_;
    for (const auto& rule : rules_) {
      if (rule.first(spec)) {
        behavior = rule.second;
        break;
      }
    }
    if (behavior.on_launch == Behavior::OnLaunch::kFailLaunch) {
      ++events_;
      cv_.NotifyAll();
      return Status::FailedPrecondition(behavior.launch_error);
    }
    auto instance = std::make_shared<Instance>();
    instance->behavior = behavior;
    instance->status.instance_id = spec.instance_id;
    instance->status.state = InstanceState::kRunning;
    instance->status.started_millis = Now();
    instance->ping_status->store(behavior.ping_status);
    std::error_code ec;
    std::filesystem::create_directories(InstanceDir(spec.instance_id), ec);
    if (FILE* f = std::fopen(OutputPath(spec.instance_id).c_str(), "w")) std::fclose(f);
    instances_[spec.instance_id] = instance;
    specs_[spec.instance_id] = spec;
    launches_.push_back(spec.instance_id);
    launch_times_.push_back(std::chrono::steady_clock::now());
    for (const auto& [stream, line] : behavior.output) (void)AppendOutputLocked(spec.instance_id, stream, line);
    auto port = spec.env.find("SAGEMAKER_BIND_TO_PORT");
    if (behavior.serve_ping && port != spec.env.end() && behavior.on_launch == Behavior::OnLaunch::kRun) {
      // An instance joining another's namespace (InstanceSpec::network_namespace) listens at that
      // one's address: the running instance with a network whose id prefixes its own followed
      // by "-c" (the multi-container naming, control/endpoint_instance.h).
      std::string address = spec.network ? spec.network->address : "127.0.0.1";
      if (!spec.network && !spec.network_namespace.empty()) {
        for (const auto& [other_id, other] : specs_) {
          if (other.network && spec.instance_id.rfind(other_id + "-c", 0) == 0) address = other.network->address;
        }
      }
      auto server = PingServer::Open(address, std::atoi(port->second.c_str()), instance->ping_status);
      if (server) {
        instance->ping = std::move(server);
      } else {
        // As a real server that cannot bind: it says why and exits.
        (void)AppendOutputLocked(spec.instance_id, 'e', "fake: cannot bind " + address + ":" + port->second);
        EndLocked(*instance, 1, 0, InstanceState::kExited);
      }
    }
    if (behavior.on_launch == Behavior::OnLaunch::kExitAtOnce) {
      EndLocked(*instance, behavior.exit_code, 0, InstanceState::kExited);
    }
    ++events_;
    lock.Unlock();
    cv_.NotifyAll();
    return Status::Ok();
  }

  Result<InstanceStatus> Inspect(const std::string& id) override {
    MutexLock lock(mutex_);
    auto it = instances_.find(id);
    if (it == instances_.end()) return Status::NotFound("instance " + id + " not found");
    return it->second->status;
  }

  Status Signal(const std::string& id, int signal) override {
    {
      MutexLock lock(mutex_);
      auto it = instances_.find(id);
      if (it == instances_.end()) return Status::NotFound("instance " + id + " not found");
      if (it->second->status.state != InstanceState::kRunning) {
        return Status::FailedPrecondition("instance " + id + " is not running");
      }
      signals_.push_back({id, signal});
      ++events_;
    }
    cv_.NotifyAll();
    if (signal == SIGKILL) return Kill(id, SIGKILL);
    return Status::Ok();
  }

  Status Stop(const std::string& id, std::chrono::seconds grace) override {
    std::shared_ptr<Instance> instance;
    {
      MutexLock lock(mutex_);
      auto it = instances_.find(id);
      if (it == instances_.end()) return Status::NotFound("instance " + id + " not found");
      stops_.push_back({id, grace});
      ++events_;
      if (it->second->status.state != InstanceState::kRunning) {
        cv_.NotifyAll();
        return Status::Ok();
      }
      it->second->status.stop_requested = true;
      instance = it->second;
      if (!instance->behavior.hangs_on_stop) {
        EndLocked(*instance, -1, SIGTERM, InstanceState::kExited);
      } else if (grace.count() <= 0) {
        EndLocked(*instance, -1, SIGKILL, InstanceState::kExited);
      }
    }
    cv_.NotifyAll();
    ClosePingIfEnded(instance);
    return Status::Ok();
  }

  Result<InstanceStatus> Wait(const std::string& id, std::chrono::milliseconds timeout) override {
    MutexLock lock(mutex_);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!EndedLocked(id) && cv_.WaitUntil(mutex_, deadline) == std::cv_status::no_timeout) {
    }
    auto it = instances_.find(id);
    if (it == instances_.end()) return Status::NotFound("instance " + id + " not found");
    return it->second->status;
  }

  std::string OutputPath(const std::string& id) const override { return InstanceDir(id) + "/output"; }

  Result<std::vector<std::string>> List() override {
    MutexLock lock(mutex_);
    std::vector<std::string> ids;
    for (const auto& [id, instance] : instances_) ids.push_back(id);
    return ids;
  }

  Status Remove(const std::string& id) override {
    {
      MutexLock lock(mutex_);
      auto it = instances_.find(id);
      if (it == instances_.end()) return Status::NotFound("instance " + id + " not found");
      if (it->second->status.state == InstanceState::kRunning) {
        return Status::FailedPrecondition("instance " + id + " is still running");
      }
      instances_.erase(it);
      removed_.push_back(id);
      ++events_;
    }
    std::error_code ec;
    std::filesystem::remove_all(InstanceDir(id), ec);
    cv_.NotifyAll();
    return Status::Ok();
  }

  Result<InstanceUsage> Usage(const std::string& id) override {
    MutexLock lock(mutex_);
    auto it = instances_.find(id);
    if (it == instances_.end()) return Status::NotFound("instance " + id + " not found");
    if (it->second->status.state != InstanceState::kRunning) {
      return Status::FailedPrecondition("instance " + id + " is not running");
    }
    InstanceUsage usage = it->second->behavior.usage;
    if (usage.source.empty()) usage.source = "fake";
    auto spec = specs_.find(id);
    if (usage.gpus.empty() && spec != specs_.end()) usage.gpus = spec->second.gpus;
    return usage;
  }

  Result<AccessPoint> Access(const std::string& id) override {
    MutexLock lock(mutex_);
    auto it = instances_.find(id);
    if (it == instances_.end()) return Status::NotFound("instance " + id + " not found");
    if (it->second->status.state != InstanceState::kRunning) {
      return Status::FailedPrecondition("instance " + id + " is not running");
    }
    AccessPoint point;
    point.host_pid = it->second->behavior.access_pid != 0 ? it->second->behavior.access_pid : getpid();
    auto spec = specs_.find(id);
    if (spec != specs_.end()) point.hostname = spec->second.hostname;
    return point;
  }

  // Ids Remove()d, in order.
  std::vector<std::string> removed() const {
    MutexLock lock(mutex_);
    return removed_;
  }
  bool Launched(const std::string& id) const {
    MutexLock lock(mutex_);
    return std::find(launches_.begin(), launches_.end(), id) != launches_.end();
  }

 private:
  // Answers GET /ping on address:port (IPv4) with the current status, one request per connection.
  class PingServer {
   public:
    static std::unique_ptr<PingServer> Open(const std::string& address, int port,
                                            std::shared_ptr<std::atomic<int>> status) {
      in_addr ip{};
      if (::inet_pton(AF_INET, address.c_str(), &ip) != 1) return nullptr;
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) return nullptr;
      int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr = ip;
      addr.sin_port = htons(static_cast<uint16_t>(port));
      if (port <= 0 || port > 65535 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
          ::listen(fd, 16) != 0) {
        ::close(fd);
        return nullptr;
      }
      return std::unique_ptr<PingServer>(new PingServer(fd, std::move(status)));
    }
    ~PingServer() {
      stop_ = true;
      ::shutdown(fd_, SHUT_RDWR);
      thread_.join();
      ::close(fd_);
    }

   private:
    PingServer(int fd, std::shared_ptr<std::atomic<int>> status) : fd_(fd), status_(std::move(status)) {
      thread_ = std::thread([this] { Serve(); });
    }
    void Serve() {
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 20) <= 0) continue;
        int conn = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (conn < 0) continue;
        std::string request;
        char buffer[4096];
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        while (!stop_ && request.find("\r\n\r\n") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
          pollfd c{conn, POLLIN, 0};
          if (::poll(&c, 1, 20) <= 0) continue;
          ssize_t n = ::read(conn, buffer, sizeof(buffer));
          if (n <= 0) break;
          request.append(buffer, static_cast<size_t>(n));
        }
        if (request.find("\r\n\r\n") != std::string::npos) {
          const int code = status_->load();
          const std::string body = code == 200 ? "{}" : "unhealthy";
          std::string answer = "HTTP/1.1 " + std::to_string(code) + (code == 200 ? " OK" : " Error") +
                               "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                               "\r\nConnection: close\r\n\r\n" + body;
          (void)!::send(conn, answer.data(), answer.size(), MSG_NOSIGNAL);
          // The client closes first (it was told "Connection: close"), so that TIME_WAIT lands
          // on its ephemeral port, not on this port: a controller checks a port block is free
          // by binding it, and many pings must not make it look taken.
          auto close_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
          while (!stop_ && std::chrono::steady_clock::now() < close_deadline) {
            pollfd c{conn, POLLIN, 0};
            if (::poll(&c, 1, 20) <= 0) continue;
            if (::read(conn, buffer, sizeof(buffer)) <= 0) break;
          }
        }
        ::close(conn);
      }
    }
    int fd_;
    std::shared_ptr<std::atomic<int>> status_;
    std::atomic<bool> stop_{false};
    std::thread thread_;
  };

  struct Instance {
    Behavior behavior;
    InstanceStatus status;
    std::shared_ptr<std::atomic<int>> ping_status = std::make_shared<std::atomic<int>>(200);
    std::unique_ptr<PingServer> ping;  // closed (outside the lock) once the instance ends
  };

  int64_t Now() const { return (clock_ != nullptr ? *clock_ : Clock::System()).NowMillis(); }
  std::string InstanceDir(const std::string& id) const { return state_dir_ + "/" + id; }

  // Gone or no longer running.
  bool EndedLocked(const std::string& id) const REQUIRES(mutex_) {
    auto it = instances_.find(id);
    return it == instances_.end() || it->second->status.state != InstanceState::kRunning;
  }

  // Under mutex_ so that records of concurrent writers never interleave in the file.
  Status AppendOutputLocked(const std::string& id, char stream, const std::string& line) REQUIRES(mutex_) {
    FILE* f = std::fopen(OutputPath(id).c_str(), "a");
    if (f == nullptr) return Status::Internal("cannot append to the output of " + id);
    std::string record = std::to_string(Now()) + " " + stream + " " + line + "\n";
    std::fwrite(record.data(), 1, record.size(), f);
    std::fclose(f);
    return Status::Ok();
  }

  void EndLocked(Instance& instance, int code, int signal, InstanceState state, bool oom_killed = false,
                 std::string lost_reason = "") REQUIRES(mutex_) {
    instance.status.state = state;
    instance.status.oom_killed = oom_killed;
    instance.status.lost_reason = std::move(lost_reason);
    instance.status.exit_code = state == InstanceState::kExited ? code : -1;
    instance.status.term_signal = state == InstanceState::kExited ? signal : 0;
    instance.status.finished_millis = state == InstanceState::kExited ? Now() : 0;
    ++events_;
  }

  Status End(const std::string& id, int code, int signal, InstanceState state, bool oom_killed = false,
             std::string lost_reason = "") {
    std::shared_ptr<Instance> instance;
    {
      MutexLock lock(mutex_);
      auto it = instances_.find(id);
      if (it == instances_.end()) return Status::NotFound("instance " + id + " not found");
      if (it->second->status.state != InstanceState::kRunning) {
        return Status::FailedPrecondition("instance " + id + " is not running");
      }
      instance = it->second;
      EndLocked(*instance, code, signal, state, oom_killed, std::move(lost_reason));
    }
    cv_.NotifyAll();
    ClosePingIfEnded(instance);
    return Status::Ok();
  }

  // The listener goes with the program (its port refuses connections from then on).
  void ClosePingIfEnded(const std::shared_ptr<Instance>& instance) {
    std::unique_ptr<PingServer> ping;
    {
      MutexLock lock(mutex_);
      if (instance->status.state == InstanceState::kRunning) return;
      ping = std::move(instance->ping);
    }
    ping.reset();
  }

  const std::string state_dir_;
  const Clock* const clock_;

  // Also guards each Instance's status and ping (a nested struct cannot name this mutex).
  mutable Mutex mutex_;
  mutable CondVar cv_;
  uint64_t events_ GUARDED_BY(mutex_) = 0;  // bumped by every change, for WaitUntil
  Behavior default_ GUARDED_BY(mutex_);
  std::vector<std::pair<std::function<bool(const InstanceSpec&)>, Behavior>> rules_ GUARDED_BY(mutex_);
  std::map<std::string, std::shared_ptr<Instance>> instances_ GUARDED_BY(mutex_);
  std::map<std::string, InstanceSpec> specs_ GUARDED_BY(mutex_);
  std::vector<std::string> launches_ GUARDED_BY(mutex_);
  std::vector<std::chrono::steady_clock::time_point> launch_times_ GUARDED_BY(mutex_);
  std::vector<std::string> removed_ GUARDED_BY(mutex_);
  std::vector<StopCall> stops_ GUARDED_BY(mutex_);
  std::vector<SignalCall> signals_ GUARDED_BY(mutex_);
  int launch_attempts_ GUARDED_BY(mutex_) = 0;
  PrepareImageHook prepare_image_ GUARDED_BY(mutex_);
  std::vector<ContainerImage> prepared_images_ GUARDED_BY(mutex_);
};

}  // namespace kiln::runtime::testing
