#pragma once
// TunnelService: the daemon's end of remote access (spec remote-access.md ..R-14,
// ..R-28; /work/notes/issue16-design.md "The daemon side").
//
// The front door hands it the three /_kiln/remote routes after SigV4 verification:
//   connect      Prepare() checks the request (target, public key), resolves the target from the
//                store (training job → status, RemoteDebugConfig, EnableNetworkIsolation,
//                ResourceConfig.InstanceCount → instance id training-<job>-algo-<n>; endpoint → its
//                instances, EnableSSMAccess of the variant in the deployment each runs, the model's
//                EnableNetworkIsolation) and the runtime
//                (Access → host pid), authorizes it (operator switch, allowed principals, network
//                isolation), spawns `kiln agent` over one end of a socketpair and waits for its SSH
//                banner. The front door then answers 101 (ResponseWriter::Upgrade) and gives the
//                socket to Run(), which splices it to the agent on a thread of its own.
//   targets      Targets(resource): the resource's instances and their states.
//   connections  Connections(resource, max): the audit records, newest first.
//
// Errors are Status codes the front door maps to AWS-shaped JSON errors:
//   InvalidArgument → 400 ValidationException (bad target or key, host out of range, finished job)
//   NotFound → 404 ResourceNotFound; PermissionDenied → 403 AccessDeniedException;
//   FailedPrecondition → 409 ConflictException (not ready yet: retry or --wait);
//   Unavailable → 503 ServiceUnavailable (the server is stopping); Internal → 500.
//
// Open tunnels are watched every `watch_interval`: one whose resource no longer allows it
// (access disabled by UpdateTrainingJob, the job no longer InProgress, the instance gone, the
// operator switch off) is closed: the agent gets SIGTERM, SIGKILL after `kill_grace`, the client's
// socket is closed. Each tunnel also closes after `idle_timeout` without bytes in either direction
// and after `max_connection` in all. Every connection has an audit row (store/remote_connection_
// repository.h) written at open and completed at close, and `[kiln]` lines in the instance's log
// stream.
//
// Thread-safety: every method may be called from any thread. Each tunnel runs on its own thread;
// one watcher thread runs from Start() to Stop().

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "access/target.h"
#include "base/fs.h"
#include "base/mutex.h"
#include "base/status.h"

namespace kiln::observe {
class LogStore;
}
namespace kiln::runtime {
class Runtime;
}
namespace kiln::store {
class Database;
struct RemoteConnectionRecord;
}  // namespace kiln::store

namespace kiln::access {

struct TunnelServiceOptions {
  // The operator's switch (config remote_access.enabled). Off: every connect is refused (403) and
  // open tunnels close within a watch interval of SetEnabled(false).
  bool enabled = true;
  // fnmatch globs over the caller's principal ARN (kiln:RemoteConnect, R-25). A request without
  // credentials (listener auth "off") has the principal "anonymous".
  std::vector<std::string> allowed_principals = {"*"};
  // false: jobs with EnableNetworkIsolation are refused (R-5 lets the operator forbid them).
  bool allow_network_isolated = true;
  // A tunnel without a byte in either direction this long closes ("idle timeout", R-27).
  std::chrono::seconds idle_timeout{3600};
  // A tunnel open this long closes ("max connection time"); 0: no limit.
  std::chrono::seconds max_connection{0};
  // The agent program and its leading arguments: {"<kiln binary>", "agent"}.
  std::vector<std::string> agent_command;
  // The server's SSH host key (created by the agent on first use).
  std::string host_key_path;
  // Where shells start: the first that exists inside the instance, for training hosts and
  // for endpoint instances.
  std::vector<std::string> working_directories = {"/opt/ml/code", "/opt/ml"};
  std::vector<std::string> endpoint_working_directories = {"/opt/ml/model/code", "/opt/ml/model"};
  // The CloudWatch Logs group of training jobs' streams (control::kTrainingLogGroup).
  std::string training_log_group = "/aws/sagemaker/TrainingJobs";
  // Endpoint instances' streams are <variant>/<instance id> in <prefix><endpoint>.
  std::string endpoint_log_group_prefix = "/aws/sagemaker/Endpoints/";
  // Holds (R-15, R-16; control/training_hold.h): the post-mortem instance of a finished job's
  // host (null: no holds after exit), and whether a host pid is still the hold before start
  // (null: none). The server passes control::HeldInstanceId and control::IsHoldingBeforeStart.
  std::function<std::string(const std::string&)> held_instance_id;
  std::function<bool(int)> is_holding_before_start;
  // How often open tunnels are re-checked (R-2/R-28 ask for 5 s at most).
  std::chrono::milliseconds watch_interval{1000};
  // SIGTERM → SIGKILL of an agent being closed.
  std::chrono::milliseconds kill_grace{2000};
  // How long Prepare waits for the agent's SSH banner (it enters the instance first).
  std::chrono::milliseconds banner_timeout{15000};
  // ARNs in answers.
  std::string region = "us-east-1";
  std::string account_id = "000000000000";
};

struct TunnelServiceDeps {
  store::Database* database = nullptr;     // required
  runtime::Runtime* runtime = nullptr;     // required
  observe::LogStore* log_store = nullptr;  // optional: no [kiln] lines without it
};

// One connect request, as the front door read it.
struct ConnectRequest {
  std::string target;          // the target text, percent-decoded
  std::string public_key;      // X-Kiln-Ssh-Public-Key: "ssh-ed25519 AAAA... [comment]"
  std::string principal_arn;   // the verified caller; empty: unauthenticated (auth off)
  std::string source_address;  // "ip:port" of the client
};

// What Prepare resolved, for the 101's headers; owns the started agent until Run or destruction
// (which ends the agent: the client never got its tunnel).
class PreparedTunnel {
 public:
  PreparedTunnel(PreparedTunnel&&) noexcept;
  PreparedTunnel& operator=(PreparedTunnel&&) = delete;
  ~PreparedTunnel();
  const std::string& canonical_target() const;
  const std::string& connection_id() const;

 private:
  friend class TunnelService;
  struct State;
  explicit PreparedTunnel(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

class TunnelService {
 public:
  // InvalidArgument when a required dependency or the agent command is missing.
  static Result<std::unique_ptr<TunnelService>> Create(TunnelServiceOptions options, TunnelServiceDeps deps);
  ~TunnelService();  // Stop()
  TunnelService(const TunnelService&) = delete;
  TunnelService& operator=(const TunnelService&) = delete;

  // Starts the watcher thread.
  void Start();
  // Refuses new tunnels, closes every open one ("server stopping") and joins their threads and
  // the watcher's. Idempotent.
  void Stop();

  // The operator switch at run time (tests, a future config reload).
  void SetEnabled(bool enabled);

  // The connect route up to the upgrade (see the file comment). Blocks until the agent answers
  // with its SSH banner or fails (at most banner_timeout). Errors as in the file comment; an agent
  // that cannot enter the instance is FailedPrecondition (or what the resource's state now says)
  // with the agent's reason.
  Result<PreparedTunnel> Prepare(const ConnectRequest& request);
  // Takes over the upgraded client socket (`buffered`: bytes the client sent after the request
  // head) and splices it to the prepared agent on a thread of its own until either side ends or
  // the tunnel is closed. Writes the audit row and the `[kiln] ... opened` line first.
  void Run(PreparedTunnel tunnel, UniqueFd client_fd, std::string buffered);

  // POST /_kiln/remote/release?target=T (`kiln release`): ends the target's hold — before start
  // (the program starts) or after exit (the post-mortem instance exits) — with SIGUSR1 to the
  // instance's PID 1. Checked as a connect is (operator switch, principal, the resource's access);
  // FailedPrecondition (409) when the target is not held. Answers {"Target", "InstanceId",
  // "Released": "hold before start" | "hold after exit"}.
  Result<nlohmann::json> Release(const ConnectRequest& request);

  // GET /_kiln/remote/targets: the design page's JSON. `resource` as ParseResource takes it.
  Result<nlohmann::json> Targets(const std::string& resource);
  // GET /_kiln/remote/connections: {"Connections": [...]} newest first, at most `max_results`
  // (1..1000); `resource` empty: every resource's. `connection_id` set: that connection only
  // (NotFound when unknown), e.g. for a client asking why its tunnel ended: the reason and
  // EndTime are recorded before the client's socket is closed.
  Result<nlohmann::json> Connections(const std::string& resource, int max_results,
                                     const std::string& connection_id = "");

  // Tunnels running now (tests, /metrics).
  size_t open_tunnels() const;

 private:
  friend class PreparedTunnel;
  struct Tunnel;
  struct Resolution;
  struct StartFailure;
  TunnelService(TunnelServiceOptions options, TunnelServiceDeps deps);
  // Resolves `target` against the store and runtime; an error is what a connect answers. Does
  // not look at the principal.
  Result<Resolution> Resolve(const Target& target) EXCLUDES(mutex_);
  Result<Resolution> ResolveEndpoint(const Target& target) EXCLUDES(mutex_);
  // Targets() of an endpoint: its instances, each with its variant and whether access is on.
  Result<nlohmann::json> EndpointTargets(const std::string& name);
  Status Authorize(const ConnectRequest& request, const Resolution& resolution) const EXCLUDES(mutex_);
  // The operator switch, a stopping server and the allowed principals.
  Status CheckCaller(const ConnectRequest& request) const EXCLUDES(mutex_);
  // The tunnel's thread: StartAgent, then (once Run attached the client) Splice and Finish.
  void Lifecycle(const std::shared_ptr<Tunnel>& tunnel);
  // Spawns the agent and waits for its banner; nullopt on success, else why not (reaped).
  std::optional<StartFailure> StartAgent(Tunnel& tunnel);
  void Splice(const std::shared_ptr<Tunnel>& tunnel);
  void Finish(const std::shared_ptr<Tunnel>& tunnel);
  // Completes the tunnel's audit row with what is known now; returns the row written.
  store::RemoteConnectionRecord WriteAudit(Tunnel& tunnel);
  void Watch() EXCLUDES(mutex_);
  // Why `tunnel`'s resource no longer allows it ("access disabled", "job ended", "instance gone"),
  // or "" while it does (or when the store cannot tell now).
  std::string ResourceCloseReason(const Tunnel& tunnel) EXCLUDES(mutex_);
  void WriteLogLine(const std::string& group, const std::string& stream, const std::string& message);

  const TunnelServiceOptions options_;
  const TunnelServiceDeps deps_;
  mutable Mutex mutex_;
  CondVar wake_;
  bool enabled_ GUARDED_BY(mutex_);
  bool stopping_ GUARDED_BY(mutex_) = false;
  bool started_ GUARDED_BY(mutex_) = false;
  std::vector<std::shared_ptr<Tunnel>> tunnels_ GUARDED_BY(mutex_);
  std::thread watcher_;
};

}  // namespace kiln::access
