#pragma once
// `kiln server`: the composition root. Opens the state (SQLite), the object store backend and the
// credentials, the process runtime (and the container runtime when an engine is configured) and
// scheduler, the training and endpoint controllers, builds the front door with every service and
// the invoke path, and serves HTTP until Stop().

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "access/tunnel_service.h"
#include "api/credential_store.h"
#include "control/autoscaler.h"
#include "control/data_capture_uploader.h"
#include "control/async_dispatcher.h"
#include "control/endpoint_controller.h"
#include "control/instance_credentials.h"
#include "control/instance_metrics.h"
#include "control/multi_model_fetcher.h"
#include "control/processing_controller.h"
#include "control/transform_controller.h"
#include "control/scheduler.h"
#include "control/serverless_scaler.h"
#include "control/training_controller.h"
#include "observe/metric_store.h"
#include "runtime/docker/container_config.h"
#include "runtime/environments.h"
#include "runtime/networks.h"
#include "runtime/runtime.h"
#include "runtime/slurm/node_service.h"
#include "runtime/slurm/slurm_runtime.h"
#include "net/http_client.h"
#include "serving/data_capture.h"
#include "serving/invocation_metrics.h"
#include "serving/prometheus.h"
#include "serving/router.h"
#include "serving/routing.h"
#include "serving/shadow_variants.h"
#include "api/front_door.h"
#include "api/training_jobs.h"
#include "cli/config.h"
#include "net/http_server.h"
#include "objects/object_store.h"
#include "objects/s3api/s3_api.h"
#include "observe/log_store.h"
#include "store/database.h"

namespace kiln::cli {

class Server {
 public:
  // Creates the data dir, opens every component and binds the listen address. Errors name the
  // component that failed (bad data dir, database newer than this binary, address in use, ...).
  static Result<std::unique_ptr<Server>> Create(Config config);
  ~Server();

  // Starts the controllers (adopting instances that survived a previous server) and serving.
  Status Start();
  // Stops serving (in-flight requests get `grace_seconds` to finish), then shuts the controllers
  // and metric samplers down; instances keep running for the next server to adopt. Idempotent.
  void Stop(int grace_seconds = 10);
  uint16_t port() const { return http_->port(); }
  const Config& config() const { return config_; }

 private:
  explicit Server(Config config) : config_(std::move(config)) {}

  // The steps of Create, in the order it runs them (server.cc says what each builds). Each
  // fills members declared below; errors name the component that failed.
  Status OpenState();
  Status OpenRuntimeAndCapacity();
  // The container runtime over the configured engine (config "container_engine"), with its network
  // holders in network_holders_; starts whether or not the engine answers now.
  Result<std::unique_ptr<runtime::Runtime>> OpenContainerRuntime();
  // "runtime": "slurm": the Slurm runtime in runtime_ (and slurm_runtime_) and its node service.
  Status OpenSlurmRuntime();
  // The scheduler's capacity under Slurm: more than any request asks (Slurm's is the capacity).
  static control::HostCapacity SlurmCapacity();
  Status OpenNetworks();
  void BuildFrontDoor();
  // The log store and the training controller, which the front door's /_kiln/training/interrupt
  // (`kiln interrupt`) calls.
  Status OpenLogsAndTraining(control::TrainingControllerOptions training);
  void BuildEndpointController(const control::ArchiveCapOptions& archive_caps);
  void RegisterJsonServices();
  void BuildInvokePath();
  // The async queue (<data_dir>/async, recovered here), InvokeEndpointAsync and the dispatcher.
  Status BuildAsyncInference();
  // Remote access (config "remote_access"): the tunnel service behind /_kiln/remote/*.
  Status BuildRemoteAccess();
  Status BindHttp();

  Config config_;
  // Declared in dependency order: destroyed in reverse.
  std::unique_ptr<store::Database> database_;
  std::unique_ptr<objects::ObjectStore> object_store_;
  std::unique_ptr<observe::LogStore> log_store_;
  std::unique_ptr<api::CredentialStore> credentials_;
  std::unique_ptr<control::InstanceCredentials> instance_credentials_;
  std::unique_ptr<control::ChainedCredentialProvider> all_credentials_;
  std::unique_ptr<observe::MetricStore> metric_store_;
  // With a container engine configured: the process runtime running the network holders of
  // containers (runtime/docker/docker_runtime.h), over <data_dir>/container-networks; the
  // container runtime in runtime_ points at it, so it is declared (and outlives it) before.
  std::unique_ptr<runtime::Runtime> network_holders_;
  // The container engine's name when it is not Podman (Docker Engine cannot join a container to a
  // network namespace it did not make): network.mode auto then keeps every instance on the node's
  // network. Empty for Podman, no engine, or an engine that did not answer at start.
  std::string container_engine_cannot_join_namespaces_;
  // The process runtime, or (with a container engine) the routed runtime over the process and
  // container runtimes.
  std::unique_ptr<runtime::Runtime> runtime_;
  // With "runtime": "slurm": runtime_ is the Slurm runtime, this is the same object (for the node
  // service), and the node service the front door hands /_kiln/node/ to. Null otherwise.
  runtime::slurm::SlurmRuntime* slurm_runtime_ = nullptr;
  std::unique_ptr<runtime::slurm::NodeService> node_service_;
  // Before the controllers (which untrack instances while they shut down), after the runtime and
  // the metric store it reads and writes.
  std::unique_ptr<control::InstanceMetrics> instance_metrics_;
  std::unique_ptr<control::InstanceCatalog> catalog_;
  std::unique_ptr<control::Scheduler> scheduler_;
  std::unique_ptr<runtime::EnvironmentTable> environments_;
  // Per-instance networks (config "network"); null: instances share the node's network. Before
  // the controllers, which use it until they are gone.
  std::unique_ptr<runtime::InstanceNetworks> networks_;
  std::unique_ptr<control::TrainingController> training_;
  std::unique_ptr<control::ProcessingController> processing_;
  // Tuning jobs launch and stop their trials through the training API's own paths.
  std::unique_ptr<api::TrainingJobTrialLauncher> trial_launcher_;
  std::unique_ptr<control::TuningController> tuning_;
  std::unique_ptr<serving::RoutingTable> routes_;
  std::unique_ptr<control::EndpointController> endpoints_;
  // Batch transform (§13): launches its instances through endpoints_ (after it, gone before it).
  std::unique_ptr<control::TransformController> transform_;
  // Application Auto Scaling's loop: writes endpoint rows and tells endpoints_ (after it).
  std::unique_ptr<control::Autoscaler> autoscaler_;
  // Sizes serverless pools (writes endpoint rows, tells endpoints_) and admits their requests
  // (the router's ServerlessGate, so it outlives router_).
  std::unique_ptr<control::ServerlessScaler> serverless_scaler_;
  std::unique_ptr<net::HttpClient> invoke_client_;
  std::unique_ptr<serving::InvocationMetrics> invocation_metrics_;
  // Data capture and shadow copies (§14, §9): the router's InvocationObserver, which hands
  // shadow copies on; stopped with the HTTP server, before router_ goes.
  std::unique_ptr<control::ObjectStoreCaptureUploader> capture_uploader_;
  std::unique_ptr<serving::DataCapture> data_capture_;
  std::unique_ptr<serving::ShadowVariants> shadow_variants_;
  // Multi-model endpoints (§7): the disk tier's object-store source and the placement the router
  // asks (so both outlive router_).
  std::unique_ptr<control::MultiModelFetcher> multi_model_fetcher_;
  std::unique_ptr<serving::MultiModelManager> multi_model_;
  std::unique_ptr<serving::Router> router_;
  std::unique_ptr<serving::PrometheusExporter> prometheus_;
  // Open tunnels use the database, runtime and log store; the front door points at it.
  std::unique_ptr<access::TunnelService> tunnels_;
  std::unique_ptr<objects::S3Api> s3_;
  std::unique_ptr<api::CloudWatch> cloudwatch_;  // the front door points at it
  // Asynchronous inference: the durable queue InvokeEndpointAsync fills and the dispatcher that
  // runs it (built by BuildAsyncInference; the front door points at the invoker).
  std::unique_ptr<serving::AsyncQueue> async_queue_;
  std::unique_ptr<api::AsyncInvoker> async_invoker_;
  std::unique_ptr<control::AsyncDispatcher> async_dispatcher_;
  // The web console's files and sign-in sessions (issue 22; null when "console.enabled" is
  // false); the front door points at it.
  std::unique_ptr<api::Console> console_;
  std::unique_ptr<api::FrontDoor> front_door_;
  std::unique_ptr<net::HttpServer> http_;
};

// The label on this server's containers (kiln.server; their names kiln-<label>-<id>): the first 8
// hex digits of the SHA-256 of the data dir's canonical path (the path as given when it does not
// exist), so that two servers on one node never adopt or sweep each other's containers, and one
// data dir named two ways is one server.
std::string ContainerServerLabel(const std::string& data_dir);

// The ulimits every container gets: the server's own (DefaultUlimits: nofile, nproc, memlock,
// stack), each lowered to the engine's hard limit of that name when `engine_hard_limits` has one
// (-1: unlimited), then replaced by a configured limit of the same name (kept as configured), other
// configured ones added. The engine always gets the whole list, since Podman drops its defaults for
// whatever list a container asks for; and its runtime (crun, a child of the engine) cannot raise a
// hard limit above its own without CAP_SYS_RESOURCE, which a containerised node lacks: a Podman
// service started from a shell with a lower nproc than the server's failed every container with
// "setrlimit RLIMIT_NPROC: Operation not permitted".
std::vector<runtime::docker::Ulimit> ContainerUlimits(const ContainerEngineConfig& config,
                                                      const std::map<std::string, int64_t>& engine_hard_limits = {});

// The hard limits of the process serving the engine's Unix socket (`socket`: "unix:///path" or a
// path): the peer of a connection (SO_PEERCRED) and its /proc/<pid>/limits, by ulimit name
// (nofile, nproc, memlock, stack, core, ...; -1: unlimited). Empty when the socket does not answer
// or the process cannot be read (another pid namespace, another user).
std::map<std::string, int64_t> EngineHardLimits(const std::string& socket);

// /proc/<pid>/limits text → hard limit by ulimit name (as above).
std::map<std::string, int64_t> ParseProcLimits(const std::string& text);

// Builds the configured ObjectStore backend (fs under <data-dir>/objects, or s3).
Result<std::unique_ptr<objects::ObjectStore>> OpenObjectStore(const Config& config, store::Database* database);

}  // namespace kiln::cli
