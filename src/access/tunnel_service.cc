#include "access/tunnel_service.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>

#include "base/encoding.h"
#include "base/ids.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/time.h"
#include "observe/log_store.h"
#include "runtime/runtime.h"
#include "store/endpoint_repository.h"
#include "store/remote_connection_repository.h"
#include "store/training_job_repository.h"

extern char** environ;

namespace kiln::access {

namespace {

using nlohmann::json;

constexpr size_t kBufferBytes = 64 * 1024;
// Bytes of the agent's stderr kept for error messages; the rest is logged and dropped.
constexpr size_t kMaxStderrBytes = 4096;
// An events line longer than this is dropped (the agent writes short JSON lines).
constexpr size_t kMaxEventLineBytes = 64 * 1024;
constexpr size_t kMaxKeyLineBytes = 16 * 1024;
constexpr char kAnonymous[] = "anonymous";

int64_t SteadyMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SetNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) (void)fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

// "<type> <base64 blob> [comment]" → "<type> <blob>" when the blob decodes and names the same
// key type (as OpenSSH's authorized_keys parser checks); InvalidArgument otherwise.
Result<std::string> CheckPublicKey(std::string_view line) {
  auto invalid = [](std::string_view why) {
    return Status::InvalidArgument(
        "the X-Kiln-Ssh-Public-Key header " + std::string(why) +
        "; send one OpenSSH public key line, e.g. the contents of ~/.ssh/sagemaker-ssh-gw.pub (ssh-ed25519 AAAA...)");
  };
  line = Trim(line);
  if (line.empty()) return invalid("is missing or empty");
  if (line.size() > kMaxKeyLineBytes) return invalid("is too long");
  for (char c : line) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return invalid("holds control characters");
  }
  std::vector<std::string_view> parts = Split(line, ' ');
  parts.erase(std::remove(parts.begin(), parts.end(), std::string_view()), parts.end());
  if (parts.size() < 2) return invalid("has no key after the key type");
  static const std::vector<std::string_view> kTypes = {"ssh-ed25519",
                                                       "ssh-rsa",
                                                       "ecdsa-sha2-nistp256",
                                                       "ecdsa-sha2-nistp384",
                                                       "ecdsa-sha2-nistp521",
                                                       "sk-ssh-ed25519@openssh.com",
                                                       "sk-ecdsa-sha2-nistp256@openssh.com"};
  if (std::find(kTypes.begin(), kTypes.end(), parts[0]) == kTypes.end()) {
    return invalid("has an unknown key type \"" + std::string(parts[0].substr(0, 64)) + "\"");
  }
  std::optional<std::string> blob = Base64Decode(parts[1]);
  if (!blob || blob->size() < 4) return invalid("holds no base64 key");
  const auto* b = reinterpret_cast<const unsigned char*>(blob->data());
  const size_t name_length = (size_t{b[0]} << 24) | (size_t{b[1]} << 16) | (size_t{b[2]} << 8) | size_t{b[3]};
  if (name_length != parts[0].size() || blob->size() < 4 + name_length ||
      std::string_view(*blob).substr(4, name_length) != parts[0]) {
    return invalid("holds a key whose type is not " + std::string(parts[0]));
  }
  return std::string(parts[0]) + " " + std::string(parts[1]);
}

bool PrincipalAllowed(const std::vector<std::string>& patterns, const std::string& principal) {
  for (const std::string& pattern : patterns) {
    if (::fnmatch(pattern.c_str(), principal.c_str(), 0) == 0) return true;
  }
  return false;
}

std::string TrainingJobArn(const TunnelServiceOptions& o, const std::string& job) {
  return "arn:aws:sagemaker:" + o.region + ":" + o.account_id + ":training-job/" + ToLower(job);
}

// Waits for `pid` up to `grace`, then SIGKILLs and reaps it. Returns its wait status.
int ReapAgent(pid_t pid, std::chrono::milliseconds grace) {
  int status = 0;
  const int64_t deadline = SteadyMillis() + grace.count();
  for (;;) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return 0;  // not our child any more (cannot happen): nothing to reap
    if (SteadyMillis() >= deadline) break;
    ::usleep(10000);
  }
  (void)::kill(pid, SIGKILL);
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// Reads what is there without blocking, appending at most `max` bytes in all to `out`; false at
// EOF or on an error other than EAGAIN.
bool ReadAvailable(int fd, std::string* out, size_t max) {
  char buffer[4096];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n > 0) {
      if (out->size() < max) out->append(buffer, std::min(static_cast<size_t>(n), max - out->size()));
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

// The last non-empty line of the agent's stderr: its reason for exit code 3.
std::string LastLine(std::string_view text) {
  text = Trim(text);
  size_t nl = text.rfind('\n');
  return std::string(Trim(nl == std::string_view::npos ? text : text.substr(nl + 1)));
}

}  // namespace

// ---- Tunnel -------------------------------------------------------------------------------------

struct TunnelService::Resolution {
  Target target;  // the resource name as the store spells it
  std::string resource_arn;
  std::string instance_id;
  std::string log_group;
  std::string log_stream;
  std::vector<std::string> working_directories;
  bool network_isolated = false;
  bool held = false;  // the post-mortem instance of a finished job's host
  runtime::AccessPoint access;
};

// Why an agent gave no banner (Prepare turns it into the answer).
struct TunnelService::StartFailure {
  Status error;            // spawn failed (then nothing else is set)
  bool timed_out = false;  // no banner within banner_timeout
  int wait_status = 0;
  std::string reason;  // the agent's last stderr line
};

// One connection, from Prepare to its end. Its thread (`thread`) spawns the agent and lives until
// the agent is reaped: the agent's PR_SET_PDEATHSIG fires when the thread that forked it exits, so
// it must not be a server worker that may retire while the connection lasts.
struct TunnelService::Tunnel {
  enum class Phase {
    kStarting,   // the thread spawns the agent and waits for its banner
    kFailed,     // no banner: `start` says why; the agent is reaped, the thread ends
    kReady,      // the banner came; waiting for Run (kAttached) or the PreparedTunnel's end
    kAttached,   // Run gave it the client: splicing
    kAbandoned,  // the PreparedTunnel ended without Run: the agent is killed, the thread ends
  };

  // Set before the thread starts; read-only after.
  std::string id;
  Target target;
  std::string canonical;
  std::string resource_arn;
  std::string instance_id;
  std::string log_group;
  std::string log_stream;
  std::string principal;
  std::string source_address;
  int host_pid = 0;  // the instance's pid the agent entered
  std::vector<std::string> agent_args;
  UniqueFd wake_read;
  UniqueFd wake_write;

  // The thread's alone (Run sets the client's before kAttached, under `mutex`).
  pid_t agent_pid = -1;
  UniqueFd agent_fd;   // the daemon's end of the socketpair
  UniqueFd events_fd;  // read end of the agent's events pipe
  UniqueFd stderr_fd;  // read end of the agent's stdout/stderr
  std::string banner;  // what the agent sent before the client was attached
  std::string stderr_text;
  UniqueFd client_fd;
  std::string to_agent;  // the client's bytes read ahead of the upgrade, then each read
  int64_t start_millis = 0;
  int64_t end_millis = 0;             // when the splice ended (0 before)
  std::vector<std::string> forwards;  // from the agent's events
  std::vector<int> exit_statuses;

  std::atomic<uint64_t> bytes_in{0};
  std::atomic<uint64_t> bytes_out{0};
  std::atomic<bool> done{false};
  std::thread thread;

  Mutex mutex;
  CondVar changed;
  Phase phase GUARDED_BY(mutex) = Phase::kStarting;
  StartFailure failure GUARDED_BY(mutex);      // kFailed
  std::string close_reason GUARDED_BY(mutex);  // set by whoever closes it first

  // Asks the splice loop to end the tunnel with `reason` (the first reason given wins).
  void RequestClose(const std::string& reason) {
    {
      MutexLock lock(mutex);
      if (!close_reason.empty()) return;
      close_reason = reason;
    }
    char byte = 1;
    (void)!::write(wake_write.get(), &byte, 1);
  }
  std::string reason() {
    MutexLock lock(mutex);
    return close_reason;
  }
};

// ---- PreparedTunnel ---------------------------------------------------------------------------

struct PreparedTunnel::State {
  std::shared_ptr<TunnelService::Tunnel> tunnel;

  // Not handed to Run: the agent goes (its thread kills and reaps it).
  ~State() {
    if (!tunnel) return;
    {
      MutexLock lock(tunnel->mutex);
      if (tunnel->phase == TunnelService::Tunnel::Phase::kReady) {
        tunnel->phase = TunnelService::Tunnel::Phase::kAbandoned;
        tunnel->changed.NotifyAll();
      }
    }
    if (tunnel->thread.joinable()) tunnel->thread.join();
  }
};

PreparedTunnel::PreparedTunnel(std::unique_ptr<State> state) : state_(std::move(state)) {}
PreparedTunnel::PreparedTunnel(PreparedTunnel&&) noexcept = default;
PreparedTunnel::~PreparedTunnel() = default;
const std::string& PreparedTunnel::canonical_target() const { return state_->tunnel->canonical; }
const std::string& PreparedTunnel::connection_id() const { return state_->tunnel->id; }

// Spawns the agent of `t` (its fds 3, 4 and 1/2 as the file comment of tunnel_service.h says) and
// waits for its banner. On failure the agent is reaped and the failure says why.
std::optional<TunnelService::StartFailure> TunnelService::StartAgent(Tunnel& t) {
  const TunnelServiceOptions& options = options_;
  auto spawn_error = [](Status error) {
    StartFailure failure;
    failure.error = std::move(error);
    return failure;
  };
  // The agent's fds: the socketpair end (3), the events pipe's write end (4), stdout/stderr to a
  // pipe; nothing else crosses (every fd the server opens is O_CLOEXEC, and closefrom(5) makes sure).
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return spawn_error(ErrnoStatus("socketpair", errno));
  }
  t.agent_fd = UniqueFd(pair[0]);
  UniqueFd agent_end(pair[1]);
  int events[2], errors[2];
  if (::pipe2(events, O_CLOEXEC) != 0) return spawn_error(ErrnoStatus("pipe", errno));
  t.events_fd = UniqueFd(events[0]);
  UniqueFd events_write(events[1]);
  if (::pipe2(errors, O_CLOEXEC) != 0) return spawn_error(ErrnoStatus("pipe", errno));
  t.stderr_fd = UniqueFd(errors[0]);
  UniqueFd errors_write(errors[1]);
  // Sources move to fds >= 10 so that no dup2 in the child overwrites one a later dup2 needs.
  UniqueFd socket_hi(fcntl(agent_end.get(), F_DUPFD_CLOEXEC, 10));
  UniqueFd events_hi(fcntl(events_write.get(), F_DUPFD_CLOEXEC, 10));
  UniqueFd errors_hi(fcntl(errors_write.get(), F_DUPFD_CLOEXEC, 10));
  if (!socket_hi.valid() || !events_hi.valid() || !errors_hi.valid()) {
    return spawn_error(ErrnoStatus("fcntl", errno));
  }
  agent_end.Reset();
  events_write.Reset();
  errors_write.Reset();

  std::vector<std::string> args = t.agent_args;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, errors_hi.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, errors_hi.get(), 2);
  posix_spawn_file_actions_adddup2(&actions, socket_hi.get(), 3);
  posix_spawn_file_actions_adddup2(&actions, events_hi.get(), 4);
  posix_spawn_file_actions_addclosefrom_np(&actions, 5);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  socket_hi.Reset();
  events_hi.Reset();
  errors_hi.Reset();
  if (rc != 0) return spawn_error(ErrnoStatus("cannot start the remote-access agent " + args[0], rc));
  t.agent_pid = pid;
  SetNonBlocking(t.agent_fd.get());
  SetNonBlocking(t.events_fd.get());
  SetNonBlocking(t.stderr_fd.get());

  // The agent enters the instance, then sends its SSH banner: wait for that (or its end).
  const int64_t deadline = SteadyMillis() + options.banner_timeout.count();
  bool agent_eof = false;
  while (t.banner.empty() && !agent_eof) {
    const int64_t left = deadline - SteadyMillis();
    if (left <= 0) break;
    pollfd fds[2] = {{t.agent_fd.get(), POLLIN, 0}, {t.stderr_fd.get(), POLLIN, 0}};
    int n = ::poll(fds, t.stderr_fd.valid() ? 2 : 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno != EINTR) break;
    if (t.stderr_fd.valid() && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      if (!ReadAvailable(t.stderr_fd.get(), &t.stderr_text, kMaxStderrBytes)) t.stderr_fd.Reset();
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buffer[kBufferBytes];
      ssize_t got = ::read(t.agent_fd.get(), buffer, sizeof buffer);
      if (got > 0) {
        t.banner.assign(buffer, static_cast<size_t>(got));
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        agent_eof = true;
      }
    }
  }
  if (!t.banner.empty()) return std::nullopt;

  // No banner: the agent failed (or hangs). Its exit code and last stderr line say why.
  StartFailure failure;
  failure.timed_out = !agent_eof;
  t.agent_fd.Reset();
  if (failure.timed_out) (void)::kill(pid, SIGKILL);
  failure.wait_status = ReapAgent(pid, options.kill_grace);
  t.agent_pid = -1;
  if (t.stderr_fd.valid()) (void)ReadAvailable(t.stderr_fd.get(), &t.stderr_text, kMaxStderrBytes);
  failure.reason = LastLine(t.stderr_text);
  return failure;
}

void TunnelService::Lifecycle(const std::shared_ptr<Tunnel>& tunnel) {
  std::optional<StartFailure> failure = StartAgent(*tunnel);
  bool abandoned = false;
  {
    MutexLock lock(tunnel->mutex);
    if (failure) {
      tunnel->failure = std::move(*failure);
      tunnel->phase = Tunnel::Phase::kFailed;
      tunnel->changed.NotifyAll();
      return;
    }
    tunnel->phase = Tunnel::Phase::kReady;
    tunnel->changed.NotifyAll();
    while (tunnel->phase == Tunnel::Phase::kReady) tunnel->changed.Wait(tunnel->mutex);
    abandoned = tunnel->phase == Tunnel::Phase::kAbandoned;
  }
  if (abandoned) {
    tunnel->agent_fd.Reset();
    (void)::kill(tunnel->agent_pid, SIGKILL);
    (void)ReapAgent(tunnel->agent_pid, options_.kill_grace);
    tunnel->agent_pid = -1;
    return;
  }
  Splice(tunnel);
  Finish(tunnel);
  tunnel->done = true;
}

// ---- TunnelService ------------------------------------------------------------------------------

TunnelService::TunnelService(TunnelServiceOptions options, TunnelServiceDeps deps)
    : options_(std::move(options)), deps_(deps), enabled_(options_.enabled) {}

Result<std::unique_ptr<TunnelService>> TunnelService::Create(TunnelServiceOptions options, TunnelServiceDeps deps) {
  if (deps.database == nullptr || deps.runtime == nullptr) {
    return Status::InvalidArgument("TunnelService needs a database and a runtime");
  }
  if (options.agent_command.empty()) return Status::InvalidArgument("TunnelService needs the agent command");
  if (!options.host_key_path.empty()) {
    std::error_code ec;
    std::filesystem::path dir = std::filesystem::path(options.host_key_path).parent_path();
    if (!dir.empty()) {
      std::filesystem::create_directories(dir, ec);
      if (ec) return Status::Internal("cannot create " + dir.string() + ": " + ec.message());
      std::filesystem::permissions(dir, std::filesystem::perms::owner_all, ec);
    }
  }
  std::unique_ptr<TunnelService> service(new TunnelService(std::move(options), deps));
  // Rows a previous server left open (it stopped or crashed with tunnels up) are ended now.
  store::RemoteConnectionRepository audit(deps.database);
  auto ended = audit.CloseOpen(NowMillis(), "server stopping");
  if (ended.ok() && *ended > 0)
    KLOG(info, "remote connections left open were closed", {{"count", std::to_string(*ended)}});
  return service;
}

TunnelService::~TunnelService() { Stop(); }

void TunnelService::Start() {
  MutexLock lock(mutex_);
  if (started_ || stopping_) return;
  started_ = true;
  watcher_ = std::thread([this] { Watch(); });
}

void TunnelService::Stop() {
  std::vector<std::shared_ptr<Tunnel>> tunnels;
  {
    MutexLock lock(mutex_);
    if (stopping_ && tunnels_.empty() && !watcher_.joinable()) return;
    stopping_ = true;
    wake_.NotifyAll();
  }
  if (watcher_.joinable()) watcher_.join();
  {
    MutexLock lock(mutex_);
    tunnels.swap(tunnels_);
  }
  for (auto& tunnel : tunnels) tunnel->RequestClose("server stopping");
  for (auto& tunnel : tunnels) {
    if (tunnel->thread.joinable()) tunnel->thread.join();
  }
}

void TunnelService::SetEnabled(bool enabled) {
  MutexLock lock(mutex_);
  enabled_ = enabled;
  wake_.NotifyAll();
}

size_t TunnelService::open_tunnels() const {
  MutexLock lock(mutex_);
  return static_cast<size_t>(
      std::count_if(tunnels_.begin(), tunnels_.end(), [](const auto& t) { return !t->done.load(); }));
}

Result<TunnelService::Resolution> TunnelService::Resolve(const Target& target) {
  if (target.resource.kind == ResourceKind::kEndpoint) return ResolveEndpoint(target);
  store::TrainingJobRepository jobs(deps_.database);
  Result<store::TrainingJobRecord> record = jobs.Get(target.resource.name);
  if (record.status().IsNotFound()) {
    if (target.resource.bare && target.host == 1) {
      // "<name>" alone: an endpoint when no training job has that name.
      Target endpoint;
      endpoint.resource = {ResourceKind::kEndpoint, target.resource.name, false};
      Result<Resolution> resolved = ResolveEndpoint(endpoint);
      if (!resolved.status().IsNotFound()) return resolved;
      return Status::NotFound("no training job or endpoint is named " + target.resource.name);
    }
    return Status::NotFound("training job " + target.resource.name + " does not exist");
  }
  if (!record.ok()) return record.status();
  Resolution out;
  out.log_group = options_.training_log_group;
  out.working_directories = options_.working_directories;
  out.target = target;
  out.target.resource.name = record->name;
  out.target.resource.bare = false;
  out.resource_arn = record->arn.empty() ? TrainingJobArn(options_, record->name) : record->arn;
  const json& request = record->request;
  int64_t instance_count = 1;
  if (request.contains("ResourceConfig") && request["ResourceConfig"].is_object()) {
    instance_count = request["ResourceConfig"].value("InstanceCount", int64_t{1});
  }
  const std::string job = "training job " + record->name;
  if (target.host > instance_count) {
    return Status::InvalidArgument(job + " has " + std::to_string(instance_count) + " instance" +
                                   (instance_count == 1 ? "" : "s") + " (algo-1" +
                                   (instance_count == 1 ? "" : " to algo-" + std::to_string(instance_count)) +
                                   "); there is no " + target.HostName());
  }
  const std::string host = target.HostName();
  out.instance_id = "training-" + record->name + "-" + host;
  bool launched = false;
  for (const store::TrainingHostState& h : record->state.hosts) {
    if (h.host != host) continue;
    launched = true;
    if (!h.instance_id.empty()) out.instance_id = h.instance_id;
    out.log_stream = h.log_stream;
  }
  if (record->status != store::TrainingJobStatus::kInProgress) {
    // A finished job's host may be held after exit: its post-mortem instance is the target.
    if (launched && options_.held_instance_id) {
      const std::string held = options_.held_instance_id(out.instance_id);
      if (Result<runtime::AccessPoint> access = deps_.runtime->Access(held); access.ok()) {
        out.instance_id = held;
        out.held = true;
        out.access = *access;
      }
    }
    if (!out.held) {
      std::string message = job + " is " + std::string(store::ToString(record->status)) + "; its instances are gone";
      if (record->state.failure_reason) {
        message += " (FailureReason: " + record->state.failure_reason->substr(0, 512) + ")";
      }
      return Status::InvalidArgument(message);
    }
  }
  bool enabled = false;
  if (request.contains("RemoteDebugConfig") && request["RemoteDebugConfig"].is_object()) {
    const json& flag = request["RemoteDebugConfig"].value("EnableRemoteDebug", json(false));
    enabled = flag.is_boolean() && flag.get<bool>();
  }
  if (!enabled) {
    return Status::PermissionDenied("remote access is not enabled on " + job +
                                    "; enable it with UpdateTrainingJob RemoteDebugConfig={EnableRemoteDebug=true}");
  }
  const json& isolation = request.value("EnableNetworkIsolation", json(false));
  out.network_isolated = isolation.is_boolean() && isolation.get<bool>();
  if (out.held) return out;
  const std::string pending = job + " is InProgress (secondary status " +
                              std::string(store::ToString(record->secondary_status)) + "); " + host +
                              " is not running yet; retry, or use kiln connect --wait";
  if (!launched) return Status::FailedPrecondition(pending);
  Result<runtime::AccessPoint> access = deps_.runtime->Access(out.instance_id);
  if (access.status().IsNotFound() || access.status().code() == StatusCode::kFailedPrecondition) {
    return Status::FailedPrecondition(pending);
  }
  if (access.status().code() == StatusCode::kUnimplemented) {
    return Status::InvalidArgument(job + ": " + access.status().message());
  }
  if (!access.ok()) return access.status();
  out.access = *access;
  return out;
}

namespace {

// The configuration entry of `instance`'s variant in the deployment it runs (an update rolling
// out runs two).
const json* VariantOf(const store::EndpointRecord& record, const store::InstanceRecord& instance) {
  if (record.pending && record.pending->deployed_millis == instance.generation) {
    return record.pending->FindVariant(instance.variant);
  }
  return record.deployment.FindVariant(instance.variant);
}

bool SsmAccessEnabled(const json* variant) {
  if (variant == nullptr || !variant->is_object()) return false;
  const json& flag = variant->value("EnableSSMAccess", json(false));
  return flag.is_boolean() && flag.get<bool>();
}

bool EndpointGone(store::EndpointStatus status) {
  return status == store::EndpointStatus::kFailed || status == store::EndpointStatus::kDeleting;
}

}  // namespace

Result<TunnelService::Resolution> TunnelService::ResolveEndpoint(const Target& target) {
  store::EndpointRepository endpoints(deps_.database);
  Result<store::EndpointRecord> record = endpoints.Get(target.resource.name);
  if (record.status().IsNotFound()) return Status::NotFound("endpoint " + target.resource.name + " does not exist");
  if (!record.ok()) return record.status();
  const std::string what = "endpoint " + record->name;
  if (EndpointGone(record->status)) {
    return Status::InvalidArgument(
        what + " is " + std::string(store::ToString(record->status)) + "; its instances are gone" +
        (record->failure_reason.empty() ? "" : " (FailureReason: " + record->failure_reason.substr(0, 512) + ")"));
  }
  // The instances the target names (all, a variant's, or one), in launch order.
  std::vector<const store::InstanceRecord*> named;
  std::vector<std::string> known;
  for (const store::InstanceRecord& instance : record->state.instances) {
    known.push_back(instance.variant + "/" + instance.instance_id);
    if (!target.variant.empty() && instance.variant != target.variant) continue;
    if (!target.instance_id.empty() && instance.instance_id != target.instance_id) continue;
    named.push_back(&instance);
  }
  if (named.empty()) {
    if (!target.instance_id.empty() || !target.variant.empty()) {
      return Status::InvalidArgument(
          what + " has no instance " + target.Canonical() +
          (known.empty() ? std::string(" (it has none yet)") : " (its instances: " + Join(known, ", ") + ")"));
    }
    return Status::FailedPrecondition(what + " is " + std::string(store::ToString(record->status)) +
                                      " and has no instance yet; retry, or use kiln connect --wait");
  }
  // One instance named: that one. Otherwise the first one access is enabled on and that runs.
  Status last = Status::Ok();
  for (const store::InstanceRecord* instance : named) {
    const json* variant = VariantOf(*record, *instance);
    Resolution out;
    out.target.resource = {ResourceKind::kEndpoint, record->name, false};
    out.target.variant = instance->variant;
    out.target.instance_id = instance->instance_id;
    out.resource_arn = record->arn;
    out.instance_id = instance->runtime_id;
    out.log_group = options_.endpoint_log_group_prefix + record->name;
    out.log_stream = instance->variant + "/" + instance->instance_id;
    out.working_directories = options_.endpoint_working_directories;
    const json model = record->deployment.Model(instance->model_name);
    const json& isolation = model.value("EnableNetworkIsolation", json(false));
    out.network_isolated = isolation.is_boolean() && isolation.get<bool>();
    if (!SsmAccessEnabled(variant)) {
      last = Status::PermissionDenied("remote access is not enabled on production variant " + instance->variant +
                                      " of " + what +
                                      "; set EnableSSMAccess=true on the variant in a new endpoint configuration "
                                      "and UpdateEndpoint to it");
      continue;
    }
    Result<runtime::AccessPoint> access = deps_.runtime->Access(instance->runtime_id);
    if (access.ok()) {
      out.access = *access;
      return out;
    }
    if (access.status().IsNotFound() || access.status().code() == StatusCode::kFailedPrecondition) {
      last = Status::FailedPrecondition(what + " instance " + out.target.Canonical() +
                                        " is not running; retry, or use kiln connect --wait");
    } else if (access.status().code() == StatusCode::kUnimplemented) {
      last = Status::InvalidArgument(what + ": " + access.status().message());
    } else {
      last = access.status();
    }
  }
  return last;
}

Status TunnelService::Authorize(const ConnectRequest& request, const Resolution& resolution) const {
  (void)request;
  if (resolution.network_isolated && !options_.allow_network_isolated) {
    return Status::PermissionDenied(
        "training job " + resolution.target.resource.name +
        " runs with EnableNetworkIsolation, and this Kiln server's operator does not "
        "allow remote access to network-isolated jobs (remote_access.allow_network_isolated)");
  }
  return Status::Ok();
}

Status TunnelService::CheckCaller(const ConnectRequest& request) const {
  const std::string principal = request.principal_arn.empty() ? kAnonymous : request.principal_arn;
  {
    MutexLock lock(mutex_);
    if (stopping_) return Status::Unavailable("the Kiln server is stopping; retry against the next one");
    if (!enabled_) {
      return Status::PermissionDenied(
          "remote access is turned off on this Kiln server (its operator set remote_access.enabled to false)");
    }
  }
  if (!PrincipalAllowed(options_.allowed_principals, principal)) {
    return Status::PermissionDenied(principal + " is not allowed to perform kiln:RemoteConnect on this Kiln server " +
                                    "(remote_access.allowed_principals)");
  }
  return Status::Ok();
}

Result<PreparedTunnel> TunnelService::Prepare(const ConnectRequest& request) {
  ASSIGN_OR_RETURN(Target target, ParseTarget(request.target));
  const std::string principal = request.principal_arn.empty() ? kAnonymous : request.principal_arn;
  RETURN_IF_ERROR(CheckCaller(request));
  ASSIGN_OR_RETURN(std::string key, CheckPublicKey(request.public_key));
  ASSIGN_OR_RETURN(Resolution resolution, Resolve(target));
  RETURN_IF_ERROR(Authorize(request, resolution));

  auto tunnel = std::make_shared<Tunnel>();
  tunnel->id = "rc-" + RandomHex(8);
  tunnel->target = resolution.target;
  tunnel->canonical = resolution.target.Canonical();
  tunnel->resource_arn = resolution.resource_arn;
  tunnel->instance_id = resolution.instance_id;
  tunnel->log_group = resolution.log_group;
  tunnel->log_stream = resolution.log_stream;
  tunnel->principal = principal;
  tunnel->source_address = request.source_address;
  tunnel->host_pid = resolution.access.host_pid;
  std::vector<std::string>& args = tunnel->agent_args;
  args = options_.agent_command;
  for (std::string a :
       {std::string("--pid"), std::to_string(resolution.access.host_pid), std::string("--socket-fd"), std::string("3"),
        std::string("--events-fd"), std::string("4"), std::string("--authorized-key")}) {
    args.push_back(std::move(a));
  }
  args.push_back(key);
  if (!options_.host_key_path.empty()) {
    args.push_back("--host-key");
    args.push_back(options_.host_key_path);
  }
  for (const std::string& dir : resolution.working_directories) {
    args.push_back("--working-directory");
    args.push_back(dir);
  }
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) return ErrnoStatus("pipe", errno);
  tunnel->wake_read = UniqueFd(wake[0]);
  tunnel->wake_write = UniqueFd(wake[1]);

  // The tunnel's own thread spawns the agent (see Tunnel) and says when its banner came.
  tunnel->thread = std::thread([this, tunnel] { Lifecycle(tunnel); });
  StartFailure failure;
  bool ready = false;
  {
    MutexLock lock(tunnel->mutex);
    while (tunnel->phase == Tunnel::Phase::kStarting) tunnel->changed.Wait(tunnel->mutex);
    ready = tunnel->phase == Tunnel::Phase::kReady;
    if (!ready) failure = tunnel->failure;
  }
  if (ready) {
    auto state = std::make_unique<PreparedTunnel::State>();
    state->tunnel = std::move(tunnel);
    return PreparedTunnel(std::move(state));
  }
  tunnel->thread.join();
  if (!failure.error.ok()) return failure.error;
  const std::string& reason = failure.reason;
  const int wait_status = failure.wait_status;
  const std::string where =
      "the remote-access agent for " + tunnel->canonical + " (instance " + tunnel->instance_id + ")";
  KLOG(warn, "remote-access agent failed",
       {{"target", tunnel->canonical},
        {"instance", tunnel->instance_id},
        {"status", std::to_string(wait_status)},
        {"stderr", reason}});
  if (failure.timed_out) {
    return Status::Internal(where + " did not answer within " + std::to_string(options_.banner_timeout.count() / 1000) +
                            " s" + (reason.empty() ? "" : ": " + reason));
  }
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 3) {
    // Cannot enter: most often the instance ended meanwhile. Say what the resource says now.
    Result<Resolution> again = Resolve(target);
    if (!again.ok()) return again.status();
    return Status::FailedPrecondition(where + " could not enter it: " + (reason.empty() ? "no reason given" : reason) +
                                      "; retry");
  }
  return Status::Internal(where + " failed (" +
                          (WIFEXITED(wait_status) ? "exit code " + std::to_string(WEXITSTATUS(wait_status))
                                                  : "signal " + std::to_string(WTERMSIG(wait_status))) +
                          ")" + (reason.empty() ? "" : ": " + reason));
}

void TunnelService::Run(PreparedTunnel prepared, UniqueFd client_fd, std::string buffered) {
  std::shared_ptr<Tunnel> tunnel = std::move(prepared.state_->tunnel);
  tunnel->client_fd = std::move(client_fd);
  tunnel->to_agent = std::move(buffered);
  tunnel->start_millis = NowMillis();
  SetNonBlocking(tunnel->client_fd.get());

  store::RemoteConnectionRecord row;
  row.id = tunnel->id;
  row.resource_arn = tunnel->resource_arn;
  row.target = tunnel->canonical;
  row.principal = tunnel->principal;
  row.source_address = tunnel->source_address;
  row.start_millis = tunnel->start_millis;
  Status inserted = store::RemoteConnectionRepository(deps_.database).Insert(row);
  if (!inserted.ok()) KLOG(warn, "remote connection audit row not written", {{"error", inserted.ToString()}});
  WriteLogLine(tunnel->log_group, tunnel->log_stream,
               "[kiln] remote connection " + tunnel->id + " opened by " + tunnel->principal + " from " +
                   tunnel->source_address + " (target " + tunnel->canonical + ")");
  KLOG(info, "remote connection opened",
       {{"connection", tunnel->id},
        {"target", tunnel->canonical},
        {"principal", tunnel->principal},
        {"remote", tunnel->source_address}});
  {
    MutexLock lock(mutex_);
    if (stopping_) tunnel->RequestClose("server stopping");
    tunnels_.push_back(tunnel);
  }
  MutexLock lock(tunnel->mutex);
  tunnel->phase = Tunnel::Phase::kAttached;
  tunnel->changed.NotifyAll();
}

void TunnelService::Splice(const std::shared_ptr<Tunnel>& tunnel) {
  Tunnel& s = *tunnel;
  std::string to_client = std::move(s.banner);
  std::string& to_agent = tunnel->to_agent;
  std::string events_line;
  bool client_open = true;
  bool agent_open = true;
  const int64_t start = SteadyMillis();
  int64_t last_activity = start;
  const int64_t idle_ms = std::chrono::duration_cast<std::chrono::milliseconds>(options_.idle_timeout).count();
  const int64_t max_ms = std::chrono::duration_cast<std::chrono::milliseconds>(options_.max_connection).count();
  tunnel->bytes_out += to_client.size();
  tunnel->bytes_in += to_agent.size();  // sent by the client with its request head
  char buffer[kBufferBytes];

  auto handle_event = [&](std::string_view line) {
    json event = json::parse(line, nullptr, false);
    if (!event.is_object()) return;
    const std::string kind = event.value("event", "");
    if ((kind == "exec" || kind == "shell") && event.contains("exit_status") && event["exit_status"].is_number()) {
      tunnel->exit_statuses.push_back(event["exit_status"].get<int>());
    } else if (kind == "direct-tcpip") {
      tunnel->forwards.push_back("direct-tcpip " + event.value("host", std::string()) + ":" +
                                 std::to_string(event.value("port", 0)));
    } else if (kind == "tcpip-forward") {
      tunnel->forwards.push_back("tcpip-forward " + std::to_string(event.value("port", 0)));
    }
  };

  for (;;) {
    if (!tunnel->reason().empty()) break;
    // Ends: a side that closed, once what it sent is delivered to the other.
    if (!client_open && to_agent.empty()) {
      tunnel->RequestClose("client disconnected");
      break;
    }
    if (!agent_open && to_client.empty()) {
      tunnel->RequestClose("agent exited");
      break;
    }
    const int64_t now = SteadyMillis();
    if (idle_ms > 0 && now - last_activity >= idle_ms) {
      tunnel->RequestClose("idle timeout");
      break;
    }
    if (max_ms > 0 && now - start >= max_ms) {
      tunnel->RequestClose("max connection time");
      break;
    }
    int64_t timeout = 1000;
    if (idle_ms > 0) timeout = std::min(timeout, last_activity + idle_ms - now);
    if (max_ms > 0) timeout = std::min(timeout, start + max_ms - now);

    pollfd fds[5];
    const int client = tunnel->client_fd.get();
    const int agent = s.agent_fd.get();
    fds[0] = {client,
              static_cast<short>((client_open && to_agent.empty() ? POLLIN : 0) | (!to_client.empty() ? POLLOUT : 0)),
              0};
    fds[1] = {agent,
              static_cast<short>((agent_open && to_client.empty() ? POLLIN : 0) | (!to_agent.empty() ? POLLOUT : 0)),
              0};
    fds[2] = {tunnel->wake_read.get(), POLLIN, 0};
    fds[3] = {s.events_fd.valid() ? s.events_fd.get() : -1, POLLIN, 0};
    fds[4] = {s.stderr_fd.valid() ? s.stderr_fd.get() : -1, POLLIN, 0};
    int n = ::poll(fds, 5, static_cast<int>(std::max<int64_t>(timeout, 0)));
    if (n < 0) {
      if (errno == EINTR) continue;
      tunnel->RequestClose("internal error: poll failed");
      break;
    }
    if (fds[2].revents) break;  // RequestClose from elsewhere
    // Client → agent.
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR) && client_open && to_agent.empty()) {
      ssize_t got = ::read(client, buffer, sizeof buffer);
      if (got > 0) {
        to_agent.assign(buffer, static_cast<size_t>(got));
        tunnel->bytes_in += static_cast<uint64_t>(got);
        last_activity = SteadyMillis();
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        client_open = false;
      }
    }
    if (!to_agent.empty() && agent_open) {
      ssize_t put = ::send(agent, to_agent.data(), to_agent.size(), MSG_NOSIGNAL);
      if (put > 0) {
        to_agent.erase(0, static_cast<size_t>(put));
      } else if (put < 0 && errno != EAGAIN && errno != EINTR) {
        agent_open = false;
        to_agent.clear();
      }
    } else if (!agent_open) {
      to_agent.clear();
    }
    // Agent → client.
    if (fds[1].revents & (POLLIN | POLLHUP | POLLERR) && agent_open && to_client.empty()) {
      ssize_t got = ::read(agent, buffer, sizeof buffer);
      if (got > 0) {
        to_client.assign(buffer, static_cast<size_t>(got));
        tunnel->bytes_out += static_cast<uint64_t>(got);
        last_activity = SteadyMillis();
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        agent_open = false;
      }
    }
    if (!to_client.empty() && client_open) {
      ssize_t put = ::send(client, to_client.data(), to_client.size(), MSG_NOSIGNAL);
      if (put > 0) {
        to_client.erase(0, static_cast<size_t>(put));
      } else if (put < 0 && errno != EAGAIN && errno != EINTR) {
        client_open = false;
        to_client.clear();
      }
    } else if (!client_open) {
      to_client.clear();
    }
    // The agent's events (audit) and diagnostics.
    if (s.events_fd.valid() && (fds[3].revents & (POLLIN | POLLHUP | POLLERR))) {
      std::string chunk;
      if (!ReadAvailable(s.events_fd.get(), &chunk, kMaxEventLineBytes)) s.events_fd.Reset();
      events_line += chunk;
      for (size_t nl; (nl = events_line.find('\n')) != std::string::npos;) {
        handle_event(std::string_view(events_line).substr(0, nl));
        events_line.erase(0, nl + 1);
      }
      if (events_line.size() > kMaxEventLineBytes) events_line.clear();
    }
    if (s.stderr_fd.valid() && (fds[4].revents & (POLLIN | POLLHUP | POLLERR))) {
      std::string chunk;
      if (!ReadAvailable(s.stderr_fd.get(), &chunk, kMaxStderrBytes)) s.stderr_fd.Reset();
      if (!chunk.empty()) {
        KLOG(debug, "remote-access agent", {{"connection", s.id}, {"stderr", std::string(Trim(chunk))}});
        s.stderr_text = chunk;
      }
    }
  }

  // The reason is final before the client sees the end, and so is the audit row (bytes; the
  // agent's last events complete it in Finish): a client that asks why right after EOF is told.
  {
    std::string reason = tunnel->reason();
    if (reason == "client disconnected" || reason == "agent exited") {
      // The session may have ended because its resource did (a stopped job's processes die with
      // its pid namespace, and the client leaves before the watcher looks): say so.
      std::string resource_reason = ResourceCloseReason(*tunnel);
      if (!resource_reason.empty()) {
        MutexLock lock(tunnel->mutex);
        tunnel->close_reason = resource_reason;
      }
    }
    WriteAudit(*tunnel);
  }
  // The end: the client's socket closes first (the user sees the session end), then the agent
  // gets EOF and SIGTERM (its children are killed with it), SIGKILL after the grace.
  (void)::shutdown(tunnel->client_fd.get(), SHUT_RDWR);
  tunnel->client_fd.Reset();
  s.agent_fd.Reset();
  if (s.agent_pid > 0) {
    (void)::kill(s.agent_pid, SIGTERM);
    (void)ReapAgent(s.agent_pid, options_.kill_grace);
    s.agent_pid = -1;
  }
  // Events written before the agent ended.
  if (s.events_fd.valid()) {
    std::string rest;
    (void)ReadAvailable(s.events_fd.get(), &rest, kMaxEventLineBytes);
    events_line += rest;
    for (size_t nl; (nl = events_line.find('\n')) != std::string::npos;) {
      handle_event(std::string_view(events_line).substr(0, nl));
      events_line.erase(0, nl + 1);
    }
  }
}

store::RemoteConnectionRecord TunnelService::WriteAudit(Tunnel& tunnel) {
  store::RemoteConnectionRecord row;
  row.id = tunnel.id;
  row.resource_arn = tunnel.resource_arn;
  row.target = tunnel.canonical;
  row.principal = tunnel.principal;
  row.source_address = tunnel.source_address;
  row.start_millis = tunnel.start_millis;
  if (tunnel.end_millis == 0) tunnel.end_millis = NowMillis();
  row.end_millis = tunnel.end_millis;
  row.bytes_in = tunnel.bytes_in.load();
  row.bytes_out = tunnel.bytes_out.load();
  row.forwards = tunnel.forwards;
  row.exit_statuses = tunnel.exit_statuses;
  row.close_reason = tunnel.reason();
  Status closed = store::RemoteConnectionRepository(deps_.database).Close(row);
  if (!closed.ok()) KLOG(warn, "remote connection audit row not completed", {{"error", closed.ToString()}});
  return row;
}

void TunnelService::Finish(const std::shared_ptr<Tunnel>& tunnel) {
  const Tunnel& s = *tunnel;
  const store::RemoteConnectionRecord row = WriteAudit(*tunnel);
  const int64_t seconds = (*row.end_millis - row.start_millis + 500) / 1000;
  WriteLogLine(s.log_group, s.log_stream,
               "[kiln] remote connection " + s.id + " closed after " + std::to_string(seconds) +
                   "s: " + row.close_reason + ", in " + std::to_string(row.bytes_in) + " B, out " +
                   std::to_string(row.bytes_out) + " B");
  KLOG(info, "remote connection closed",
       {{"connection", s.id},
        {"target", s.canonical},
        {"reason", row.close_reason},
        {"bytes_in", std::to_string(row.bytes_in)},
        {"bytes_out", std::to_string(row.bytes_out)},
        {"seconds", std::to_string(seconds)}});
}

void TunnelService::WriteLogLine(const std::string& group, const std::string& stream, const std::string& message) {
  if (deps_.log_store == nullptr || group.empty() || stream.empty()) return;
  (void)deps_.log_store->CreateGroup(group);  // AlreadyExists is the usual answer
  (void)deps_.log_store->CreateStream(group, stream);
  auto appended = deps_.log_store->Append(group, stream, {{NowMillis(), message}});
  if (!appended.ok())
    KLOG(warn, "remote access log line not written", {{"stream", stream}, {"error", appended.status().ToString()}});
}

std::string TunnelService::ResourceCloseReason(const Tunnel& tunnel) {
  Result<Resolution> now = Resolve(tunnel.target);
  if (now.ok()) return now->access.host_pid != tunnel.host_pid ? "instance gone" : "";
  switch (now.status().code()) {
    case StatusCode::kPermissionDenied: return "access disabled";
    case StatusCode::kInvalidArgument:
      return tunnel.target.resource.kind == ResourceKind::kTrainingJob ? "job ended" : "instance gone";
    case StatusCode::kNotFound:
    case StatusCode::kFailedPrecondition: return "instance gone";
    default: return "";  // a busy database: no verdict
  }
}

void TunnelService::Watch() {
  MutexLock lock(mutex_);
  while (!stopping_) {
    (void)wake_.WaitFor(mutex_, options_.watch_interval);
    if (stopping_) break;
    const bool enabled = enabled_;
    std::vector<std::shared_ptr<Tunnel>> finished;
    std::vector<std::shared_ptr<Tunnel>> open;
    for (auto& t : tunnels_) (t->done ? finished : open).push_back(t);
    tunnels_ = open;
    lock.Unlock();
    for (auto& t : finished) {
      if (t->thread.joinable()) t->thread.join();
    }
    // whatever changed the resource (UpdateTrainingJob, the job's end, the operator),
    // its tunnels close within one interval of the change.
    for (auto& t : open) {
      if (!enabled) {
        t->RequestClose("access disabled");
        continue;
      }
      const std::string reason = ResourceCloseReason(*t);
      if (!reason.empty()) t->RequestClose(reason);
    }
    lock.Lock();
  }
}

Result<nlohmann::json> TunnelService::Targets(const std::string& resource) {
  ASSIGN_OR_RETURN(ResourceRef ref, ParseResource(resource));
  if (ref.kind == ResourceKind::kEndpoint) return EndpointTargets(ref.name);
  store::TrainingJobRepository jobs(deps_.database);
  Result<store::TrainingJobRecord> record = jobs.Get(ref.name);
  if (record.status().IsNotFound()) {
    if (ref.bare) {
      Result<json> endpoint = EndpointTargets(ref.name);
      if (!endpoint.status().IsNotFound()) return endpoint;
      return Status::NotFound("no training job or endpoint is named " + ref.name);
    }
    return Status::NotFound("training job " + ref.name + " does not exist");
  }
  if (!record.ok()) return record.status();
  const json& request = record->request;
  int64_t instance_count = 1;
  if (request.contains("ResourceConfig") && request["ResourceConfig"].is_object()) {
    instance_count = request["ResourceConfig"].value("InstanceCount", int64_t{1});
  }
  bool enabled = false;
  if (request.contains("RemoteDebugConfig") && request["RemoteDebugConfig"].is_object()) {
    const json& flag = request["RemoteDebugConfig"].value("EnableRemoteDebug", json(false));
    enabled = flag.is_boolean() && flag.get<bool>();
  }
  json out = {{"ResourceArn", record->arn.empty() ? TrainingJobArn(options_, record->name) : record->arn},
              {"ResourceStatus", std::string(store::ToString(record->status))},
              {"SecondaryStatus", std::string(store::ToString(record->secondary_status))}};
  if (record->status == store::TrainingJobStatus::kFailed && record->state.failure_reason) {
    out["FailureReason"] = *record->state.failure_reason;
  }
  out["AccessEnabled"] = enabled;
  json targets = json::array();
  for (int64_t n = 1; n <= std::min<int64_t>(instance_count, 9999); ++n) {
    Target t;
    t.resource = {ResourceKind::kTrainingJob, record->name, false};
    t.host = static_cast<int>(n);
    const std::string host = t.HostName();
    std::string instance_id = "training-" + record->name + "-" + host;
    bool launched = false;
    for (const store::TrainingHostState& h : record->state.hosts) {
      if (h.host != host) continue;
      launched = true;
      if (!h.instance_id.empty()) instance_id = h.instance_id;
    }
    std::string state = "Pending";
    if (record->status != store::TrainingJobStatus::kInProgress) {
      state = "Gone";
      if (launched && options_.held_instance_id && deps_.runtime->Access(options_.held_instance_id(instance_id)).ok()) {
        state = "Held";
      }
    } else if (launched) {
      Result<runtime::AccessPoint> access = deps_.runtime->Access(instance_id);
      if (access.ok()) {
        state = "Ready";
      } else {
        Result<runtime::InstanceStatus> inspected = deps_.runtime->Inspect(instance_id);
        if (inspected.ok() && inspected->state != runtime::InstanceState::kRunning) state = "Gone";
      }
    }
    targets.push_back({{"Target", t.Canonical()},
                       {"Alias", t.Alias()},
                       {"InstanceId", instance_id},
                       {"Hostname", host},
                       {"State", state}});
  }
  out["Targets"] = std::move(targets);
  return out;
}

Result<nlohmann::json> TunnelService::Release(const ConnectRequest& request) {
  ASSIGN_OR_RETURN(Target target, ParseTarget(request.target));
  RETURN_IF_ERROR(CheckCaller(request));
  ASSIGN_OR_RETURN(Resolution resolution, Resolve(target));
  std::string hold;
  if (resolution.held) {
    hold = "hold after exit";
  } else if (options_.is_holding_before_start && options_.is_holding_before_start(resolution.access.host_pid)) {
    hold = "hold before start";
  } else {
    return Status::FailedPrecondition(resolution.target.Canonical() +
                                      " is not held (its program runs); there is nothing to release");
  }
  // The hold (PID 1 of the instance) ends on SIGUSR1: the program starts, or the post-mortem
  // instance exits.
  RETURN_IF_ERROR(deps_.runtime->Signal(resolution.instance_id, SIGUSR1));
  WriteLogLine(resolution.log_group, resolution.log_stream,
               "[kiln] " + resolution.target.HostName() + " released (" + hold + ") by " +
                   (request.principal_arn.empty() ? std::string(kAnonymous) : request.principal_arn));
  return json{{"Target", resolution.target.Canonical()}, {"InstanceId", resolution.instance_id}, {"Released", hold}};
}

Result<nlohmann::json> TunnelService::EndpointTargets(const std::string& name) {
  Result<store::EndpointRecord> record = store::EndpointRepository(deps_.database).Get(name);
  if (record.status().IsNotFound()) return Status::NotFound("endpoint " + name + " does not exist");
  if (!record.ok()) return record.status();
  json out = {{"ResourceArn", record->arn}, {"ResourceStatus", std::string(store::ToString(record->status))}};
  if (!record->failure_reason.empty()) out["FailureReason"] = record->failure_reason;
  bool any_enabled = false;
  json targets = json::array();
  for (const store::InstanceRecord& instance : record->state.instances) {
    const bool enabled = SsmAccessEnabled(VariantOf(*record, instance));
    any_enabled = any_enabled || enabled;
    Target t;
    t.resource = {ResourceKind::kEndpoint, record->name, false};
    t.variant = instance.variant;
    t.instance_id = instance.instance_id;
    std::string state = "Pending";
    std::string hostname = instance.instance_id;
    if (EndpointGone(record->status)) {
      state = "Gone";
    } else if (Result<runtime::AccessPoint> access = deps_.runtime->Access(instance.runtime_id); access.ok()) {
      state = "Ready";
      if (!access->hostname.empty()) hostname = access->hostname;
    } else if (Result<runtime::InstanceStatus> inspected = deps_.runtime->Inspect(instance.runtime_id);
               !inspected.ok() || inspected->state != runtime::InstanceState::kRunning) {
      state = inspected.ok() || inspected.status().IsNotFound() ? "Gone" : "Pending";
    }
    targets.push_back({{"Target", t.Canonical()},
                       {"Alias", t.Alias()},
                       {"InstanceId", instance.instance_id},
                       {"Hostname", hostname},
                       {"Variant", instance.variant},
                       {"AccessEnabled", enabled},
                       {"State", state}});
  }
  for (const std::string& variant : record->deployment.VariantNames()) {
    any_enabled = any_enabled || SsmAccessEnabled(record->deployment.FindVariant(variant));
  }
  out["AccessEnabled"] = any_enabled;
  out["Targets"] = std::move(targets);
  return out;
}

Result<nlohmann::json> TunnelService::Connections(const std::string& resource, int max_results,
                                                  const std::string& connection_id) {
  if (max_results < 1 || max_results > 1000) {
    return Status::InvalidArgument("max-results must be from 1 to 1000, got " + std::to_string(max_results));
  }
  std::string arn;
  if (!resource.empty()) {
    ASSIGN_OR_RETURN(ResourceRef ref, ParseResource(resource));
    Result<store::EndpointRecord> endpoint = Status::NotFound("");
    if (ref.kind == ResourceKind::kEndpoint || ref.bare)
      endpoint = store::EndpointRepository(deps_.database).Get(ref.name);
    const bool job_exists =
        ref.kind == ResourceKind::kTrainingJob && store::TrainingJobRepository(deps_.database).Get(ref.name).ok();
    if (ref.kind == ResourceKind::kEndpoint || (ref.bare && !job_exists && endpoint.ok())) {
      arn = endpoint.ok() && !endpoint->arn.empty()
                ? endpoint->arn
                : "arn:aws:sagemaker:" + options_.region + ":" + options_.account_id + ":endpoint/" + ToLower(ref.name);
    } else {
      // The job may be deleted while its audit stays: its ARN is then derived from the name.
      Result<store::TrainingJobRecord> record = store::TrainingJobRepository(deps_.database).Get(ref.name);
      arn = record.ok() && !record->arn.empty() ? record->arn : TrainingJobArn(options_, ref.name);
    }
  }
  std::vector<store::RemoteConnectionRecord> rows;
  if (!connection_id.empty()) {
    Result<store::RemoteConnectionRecord> one = store::RemoteConnectionRepository(deps_.database).Get(connection_id);
    if (one.status().IsNotFound()) return Status::NotFound("there is no remote connection " + connection_id);
    if (!one.ok()) return one.status();
    if (arn.empty() || EqualsIgnoreCase(one->resource_arn, arn)) rows.push_back(std::move(one).value());
  } else {
    ASSIGN_OR_RETURN(rows, store::RemoteConnectionRepository(deps_.database).List(arn, max_results));
  }
  json list = json::array();
  for (const store::RemoteConnectionRecord& r : rows) {
    json c = {{"ConnectionId", r.id},
              {"ResourceArn", r.resource_arn},
              {"Target", r.target},
              {"Principal", r.principal},
              {"SourceAddress", r.source_address},
              {"StartTime", static_cast<double>(r.start_millis) / 1000.0}};
    if (r.end_millis) c["EndTime"] = static_cast<double>(*r.end_millis) / 1000.0;
    c["BytesIn"] = r.bytes_in;
    c["BytesOut"] = r.bytes_out;
    c["Forwards"] = r.forwards;
    c["ExitStatuses"] = r.exit_statuses;
    if (!r.close_reason.empty()) c["CloseReason"] = r.close_reason;
    list.push_back(std::move(c));
  }
  return json{{"Connections", std::move(list)}};
}

}  // namespace kiln::access
