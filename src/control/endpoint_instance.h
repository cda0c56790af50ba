#pragma once
// EndpointInstance: one serving instance of an endpoint, on its own thread (the endpoint run,
// control/endpoint_controller.cc, owns it and reads its state; nothing else touches it).
//
// Life (its phase, control/endpoint_states.h): provisioning — resolve the image (one Kiln cannot
// run fails the instance before anything else; a container image is then made present in the
// engine, Runtime::PrepareImage, its pull's progress shown as waiting_for()), reserve resources
// (Scheduler::AllocateNow; when the host is full under `shrink` it runs unreserved, under
// `strict` it waits, saying why in waiting_for(), at most VariantInstanceProvisionTimeoutInSeconds,
// then fails with AWS's capacity reason; a type that can never fit fails at once), model data into
// <dir>/opt_ml/model (ModelDataDownloadTimeout), `<image> serve` under the runtime with its own
// port block (or on 8080 at its own address, namespaced) → starting — GET /ping (2 s per
// attempt) until 200 within the startup budget → in-service — routable, pinged every
// health_interval; `unhealthy_threshold` failures in a row or the process exiting fail it
// (requests in flight to it are cut at once) → draining — out of the snapshot; once no request
// holds its InstanceTarget (or the drain time ends and they are cut) SIGTERM, SIGKILL after
// stop_grace → stopped (resources, ports or network lease, and directory released).
// Detach (server shutdown) leaves a launched process running for the next server to adopt.
//
// Where it listens: host mode, 127.0.0.1:<its port block's first port>; namespaced mode
// (EndpointControllerDeps::networks), <its address on the endpoint's network>:8080 (Spec::network).
//
// Thread-safety: the public methods may be called from any thread; Spec and target() are
// immutable after construction; `failure_handled` belongs to the endpoint run's thread.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "agent/model_data.h"
#include "aws/credentials.h"
#include "base/mutex.h"
#include "control/endpoint_controller.h"
#include "control/endpoint_states.h"
#include "control/instance_metrics.h"
#include "control/log_pump.h"
#include "control/scheduler.h"
#include "net/http_client.h"
#include "serving/routing.h"
#include "store/endpoint_state.h"

namespace kiln::control {

// Host mode (no EndpointControllerDeps::networks): each instance gets a block of this many ports
// on the node's network: the first is SAGEMAKER_BIND_TO_PORT, the rest SAGEMAKER_SAFE_PORT_RANGE.
// Namespaced mode: the same shape inside the instance's own namespace, from 8080 (the port
// serving-contract.md §2 names), so every instance listens on 8080 at its own address.
inline constexpr int kInstancePortBlock = 100;
inline constexpr int kNamespacedServingPort = 8080;

// The InstanceNetworks name of an endpoint's network (DESIGN.md §6): "endpoint-<EndpointName>".
inline std::string EndpointNetworkName(const std::string& endpoint_name) { return "endpoint-" + endpoint_name; }

// What an instance uses of its controller. Pointers outlive every instance.
struct EndpointInstanceEnv {
  const EndpointControllerOptions* options = nullptr;
  const EndpointControllerDeps* deps = nullptr;
  net::HttpClient* ping_client = nullptr;
  std::function<int64_t()> wall_millis;      // stamps (deps->clock or the system clock)
  std::function<int64_t()> deadline_millis;  // capacity-wait deadlines (see EndpointControllerDeps::clock)
  std::function<void(int)> release_ports;    // hands the port block back when stopped
};

class EndpointInstance {
 public:
  struct Spec {
    std::string endpoint_name;
    std::string instance_id;
    std::string runtime_id;
    std::string variant;
    std::string model_name;
    std::string instance_type;
    // A serverless variant's instance (serving-contract.md §12): a request waits for its start,
    // so the health gate pings it every 100 ms at most rather than backing off to 500 ms.
    bool serverless = false;
    int64_t generation = 0;
    nlohmann::json container;
    std::chrono::seconds startup_timeout{240};
    std::chrono::seconds download_timeout{3600};
    std::chrono::seconds provision_timeout{3600};  // VariantInstanceProvisionTimeoutInSeconds
    agent::UnpackCap unpack_cap;                   // bounds the model archive (archive_caps.h)
    aws::Credential credential;
    std::string dir;  // <work>/<endpoint>/<instance-id>
    // Host mode: the first port of its block (> 0). 0: namespaced, on `network`.
    int port_base = 0;
    int64_t launched_millis = 0;
    // Namespaced mode: its lease on the endpoint's network (InstanceNetworks::Attach with the
    // runtime id as lease id), taken by the endpoint run before the instance exists — an adopted
    // instance gets the same address again; released (Detach) when it stops. Unset with
    // `network_error` set: the network could not be had; the instance fails with that reason.
    std::optional<runtime::NetworkAttachment> network;
    std::string network_error;
    // Batch transform instances (control/transform_job_run.h): the log group and stream of the
    // container's output and the namespace and dimensions of its metrics (serving-contract.md
    // §13.5). Empty / unset: the endpoint's ("/aws/sagemaker/Endpoints/<endpoint>",
    // "<variant>/<instance-id>", EndpointInstanceMetricsTarget).
    std::string log_group;
    std::string log_stream;
    std::optional<InstanceMetricsTarget> metrics;
  };

  // `adopted`: the instance was launched by an earlier server (Start pings it, never launches
  // it); `allocation`: its adopted reservation. `on_change` is called (from the instance's
  // thread) whenever what the endpoint run reads of it changes.
  EndpointInstance(const EndpointInstanceEnv& env, Spec spec, bool adopted, std::optional<Allocation> allocation,
                   std::function<void()> on_change);
  ~EndpointInstance() { Join(); }

  // Starts the instance's thread: provision (unless adopted), /ping gate, health watch, and at the
  // end drain and stop (or leave running after Detach).
  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

  // Drain, then stop the instance (idempotent).
  void RequestStop() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (stop_requested_) return;
    stop_requested_ = true;
    cancel_.Cancel();
    cv_.NotifyAll();
  }
  // Server shutdown: leave a launched instance running for the next server.
  void Detach() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    detach_ = true;
    stop_requested_ = true;
    cancel_.Cancel();
    cv_.NotifyAll();
  }

  const Spec& spec() const { return spec_; }
  std::shared_ptr<const serving::InstanceTarget> target() const { return target_; }
  bool stop_requested() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return stop_requested_;
  }
  bool healthy() const { return healthy_.load(); }
  bool failed() const { return failed_.load(); }
  bool stopped() const { return stopped_.load(); }
  bool launched() const { return launched_.load(); }
  InstancePhase phase() const { return phase_.load(); }
  std::string failure_reason() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return failure_reason_;
  }
  // While it waits for capacity (CapacityWaitMessage) or for its container image
  // ("Downloading the image ...: <progress>"): what for; empty otherwise.
  std::string waiting_for() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return waiting_for_;
  }
  // Re-evaluates a capacity wait now (EndpointController::Wake). Sticky until the wait sees it.
  void Wake() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    wake_ = true;
    cv_.NotifyAll();
  }
  // Set by the endpoint run once it acted on failed().
  bool failure_handled = false;

  store::InstanceRecord Record() const;

 private:
  const EndpointControllerOptions& options() const { return *env_.options; }
  const EndpointControllerDeps& deps() const { return *env_.deps; }

  // Sleeps up to `d`; true when a stop was requested meanwhile.
  bool SleepFor(std::chrono::milliseconds d) EXCLUDES(mu_);

  // Like SleepFor, but Wake() also ends it (the capacity wait re-reads the controller's clock).
  bool NapFor(std::chrono::milliseconds d) EXCLUDES(mu_);

  // Moves to `to` (the run thread is the only writer), checked against endpoint_states.h.
  void SetPhase(InstancePhase to);

  void Fail(std::string reason) EXCLUDES(mu_);

  void Run();

  void Provision() EXCLUDES(mu_);

  // Reserves the instance's resources (Scheduler::AllocateNow: endpoints do not queue behind
  // training jobs). A type that can never run here fails at once; under `strict` one that does
  // not fit now waits, saying so in waiting_for(), for at most the provision budget and then
  // fails with AWS's capacity reason; under `shrink` it runs unreserved. False when the instance
  // failed or was stopped meanwhile.
  bool Reserve();

  // Container images: Runtime::PrepareImage, its progress in waiting_for(). False when the
  // instance failed ("ClientError: Image <uri> of model <m>: <the runtime's message>", or
  // InternalServerError when the engine is unreachable) or was stopped meanwhile.
  bool PrepareImage(const std::string& image);

  // Records what the instance waits for; the endpoint run rewrites VariantStatus when it changes.
  void SetWaiting(std::string message) EXCLUDES(mu_);

  void StartLogPump();

  bool Ping();

  // Exit status if the program is no longer running.
  std::optional<runtime::InstanceStatus> Exited();

  std::string LastOutputLine() const;

  // Pings until the container answers 200 or the startup budget ends. True when healthy.
  bool HealthGate();

  void Monitor();

  bool detached() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return detach_;
  }

  void Finish();

  // Namespaced mode: gives the instance's address back (InstanceNetworks::Detach) once it ended.
  void ReleaseNetwork();

  const EndpointInstanceEnv env_;
  Spec spec_;
  const bool adopted_;
  std::atomic<bool> launched_;
  std::optional<Allocation> allocation_;
  bool reserved_;
  std::function<void()> on_change_;
  std::shared_ptr<serving::InstanceTarget> target_;
  std::unique_ptr<LogPump> log_pump_;
  std::string shared_note_;
  std::string last_ping_error_ = "no answer";
  agent::CancelFlag cancel_;
  std::thread thread_;

  mutable Mutex mu_;
  CondVar cv_;
  bool stop_requested_ GUARDED_BY(mu_) = false;
  bool detach_ GUARDED_BY(mu_) = false;
  std::string failure_reason_ GUARDED_BY(mu_);
  std::string waiting_for_ GUARDED_BY(mu_);
  bool wake_ GUARDED_BY(mu_) = false;                               // Wake() until NapFor sees it
  std::atomic<InstancePhase> phase_{InstancePhase::kProvisioning};  // written by the run thread only (SetPhase)
  std::atomic<bool> healthy_{false};
  std::atomic<bool> failed_{false};
  std::atomic<bool> stopped_{false};
};

}  // namespace kiln::control
