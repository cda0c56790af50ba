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
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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

// Multi-container instances (serving-contract.md §2, §8): container `index` (0-based) runs as
// runtime instance `<runtime_id>` (the first) or `<runtime_id>-c<index + 1>`, so a restarted
// server finds every container of an adopted instance from the instance's runtime id.
inline std::string MultiContainerRuntimeId(const std::string& runtime_id, size_t index) {
  return index == 0 ? runtime_id : runtime_id + "-c" + std::to_string(index + 1);
}
// Container `index`'s SAGEMAKER_BIND_TO_PORT: the first port of its own block of
// kInstancePortBlock ports, from `first` (the instance's port base in host mode, where the
// instance holds one block per container; 8080 in its namespace).
inline int MultiContainerPort(int first, size_t index) { return first + static_cast<int>(index) * 100; }
// The name of container `index` in logs, metrics and TargetContainerHostname: its
// ContainerHostname, else "container-<index + 1>" (AWS's names for an unnamed pipeline's).
std::string ContainerHostnameOf(const nlohmann::json& container, size_t index);

// What an instance uses of its controller. Pointers outlive every instance.
struct EndpointInstanceEnv {
  const EndpointControllerOptions* options = nullptr;
  const EndpointControllerDeps* deps = nullptr;
  net::HttpClient* ping_client = nullptr;
  std::function<int64_t()> wall_millis;         // stamps (deps->clock or the system clock)
  std::function<int64_t()> deadline_millis;     // capacity-wait deadlines (see EndpointControllerDeps::clock)
  std::function<void(int, int)> release_ports;  // hands the port blocks (base, count) back when stopped
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
    // Multi-container models (serving-contract.md §8): every ContainerDefinition in the model's
    // order (`container` is then the first). Each runs on this instance under its own runtime id
    // (MultiContainerRuntimeId), port block (MultiContainerPort), /opt/ml (<dir>/c<n>/opt_ml for
    // the second on) and log stream, sharing the first's network namespace in namespaced mode.
    // Empty: the one `container`.
    std::vector<nlohmann::json> containers;
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
    // InstanceSpec::placement for backends that allocate elsewhere (the endpoint's kiln:slurm-*
    // tags, instance_placement.h); empty otherwise.
    std::map<std::string, std::string> placement;
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

  // One container of the instance (one for single-container models).
  struct ContainerRun {
    std::string hostname;    // ContainerHostnameOf, "primary" for a single-container model
    std::string runtime_id;  // MultiContainerRuntimeId
    int port = 0;            // SAGEMAKER_BIND_TO_PORT (host mode: on the node; namespaced: in the instance's)
    std::string opt_ml;      // host directory bound at its /opt/ml
    std::string offset_path;
    std::string log_stream;
    nlohmann::json definition;  // its ContainerDefinition
    std::unique_ptr<LogPump> log_pump;
    std::string last_ping_error = "no answer";
  };

  // "The primary container" / "The container <hostname>" of the variant, for failure reasons.
  std::string ContainerPhrase(const ContainerRun& c) const;

  // Downloads a container's model data into <opt_ml>/model within ModelDataDownloadTimeout.
  // False when the instance failed or was stopped meanwhile.
  bool DownloadModelData(const ContainerRun& c);

  // Launches container `index` (its image resolved as `image`). False when it failed (the
  // instance failed) or the instance was stopped.
  bool LaunchContainer(size_t index, const runtime::ImageResolution& image);

  bool Ping(ContainerRun& c);

  // Exit status of the first container that is no longer running, and which.
  std::optional<std::pair<size_t, runtime::InstanceStatus>> Exited();

  std::string LastOutputLine(const ContainerRun& c) const;

  // Pings until the container answers 200 or the startup budget ends. True when healthy.
  bool HealthGate();
  // options().remote_instances: whether the first container runs where the runtime says
  // (InstanceStatus::address, then the target's host, and every container's, points there);
  // meanwhile its waiting reason is the instance's waiting_for(). False while it waits.
  bool RemoteStarted();

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
  std::vector<ContainerRun> containers_;  // fixed at construction
  size_t launched_containers_ = 0;        // how many of containers_ run (all when adopted); run thread
  std::string shared_note_;
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
