#pragma once
// EndpointController: realises real-time endpoints (spec/serving-contract.md §1–§3) on this node.
//
// One EndpointRun per endpoint (a thread with a level-triggered reconcile loop: read the row,
// PlanEndpoint (control/endpoint_plan.h), execute the actions) and one EndpointInstance per
// serving instance (control/endpoint_instance.h: a thread that provisions the instance, gates it
// on /ping, watches its health and finally drains and stops it). Status changes follow
// control/endpoint_states.h. The database row (store/
// endpoint_repository.h) is the desired state: the API writes the deployment, the pending
// deployment of an UpdateEndpoint, the desired weights and counts, and the Deleting status; the
// controller writes the observed state (ProductionVariants summaries, the instances it runs,
// status, FailureReason) and publishes a routing snapshot (serving/routing.h) whenever the set of
// routable instances or the weights change.
//
// Instance life: resolve the image (one Kiln cannot run fails the instance before anything
// else) → reserve resources (Scheduler::AllocateNow; when the host is full under the `shrink`
// policy the instance runs unreserved, said in its log; under `strict` it waits, saying why in
// the variant's VariantStatus, for at most VariantInstanceProvisionTimeoutInSeconds, then fails
// with AWS's capacity reason; a type that can never fit here fails at once) → model data into <instance>/opt_ml/model
// (agent/model_data.h; ModelDataDownloadTimeout) →
// `<image> serve` under the runtime: with deps.networks, in a network namespace of its own on the
// endpoint's network `endpoint-<name>`, listening on 8080 at its own address; in host mode
// (no networks) on the node's network with its own port in SAGEMAKER_BIND_TO_PORT (each instance
// gets a block of 100 ports: the bind port and SAGEMAKER_SAFE_PORT_RANGE) → GET /ping (2 s per
// attempt) until 200 within ContainerStartupHealthCheckTimeoutInSeconds (default 240 s) →
// routable → pinged every 5 s; 3 failures in a row, or the process exiting, remove it from
// routing and it is replaced; the requests in flight to a failed instance are cut at once
// (InstanceTarget::failure → ModelError). Stopping: removed from the snapshot, drained (no
// request holds it any more: the snapshot's InstanceTarget is referenced only by its
// InstanceRun; requests still in flight when the drain time ends are cut), SIGTERM, SIGKILL
// after 30 s.
//
// Endpoint statuses: Creating → InService when every variant has its desired instances
// routable; a Creating endpoint whose instance fails → Failed with the reason (instances
// stopped; its variants then list no VariantStatus entry, endpoint_status.h). UpdateEndpoint (Updating): the new
// deployment's instances come up beside the old ones; only when all are healthy does one snapshot swap move all
// traffic, then the old fleet drains; a failure rolls back (new instances stopped, old fleet kept, InService with
// FailureReason). UpdateEndpointWeightsAndCapacities (Updating): weights take effect in the next
// snapshot, counts by launching or draining, InService when reached. DeleteEndpoint (Deleting):
// everything drained and stopped, then the row is removed.
//
// Restart: Start() adopts the instances recorded in each endpoint's state whose shim still
// runs (they are pinged, not restarted, and routed again as soon as they answer); instances that
// are gone are replaced; runtime instances of endpoints that no longer exist are stopped.
//
// Thread model (control/README.md, "Endpoint controller", has the whole of it):
//   - callers of EndpointChanged / Wake (API threads, tests): set a flag and notify, or start a run;
//   - an EndpointRun thread per endpoint: the only reader of its instances' state and the only
//     writer of the row's observed state (version-checked Mutate: a pass that lost a race drops
//     its write and runs again); it publishes routes;
//   - an EndpointInstance thread per instance (plus a watchdog while model data downloads).
// Locks: mutex_ (a kiln::Mutex) guards runs_, finished_, used_port_blocks_ and the
// started/shutting-down flags (GUARDED_BY, checked by clang's -Wthread-safety), and is never held across a store,
// runtime, scheduler or ping call or a join (Wake holds it while it wakes each run: mutex_ → the run's lock, never the
// reverse). A restart re-creates the runs, the adopted instances with their reservations and port blocks, and the
// instances' credentials from the rows; backoffs and capacity-wait deadlines start afresh.
//
// Thread-safety: EndpointChanged and Wake may be called from any thread; Start/Shutdown from the
// owner.

#include <chrono>
#include <map>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/time.h"
#include "control/endpoint_notifier.h"
#include "control/archive_caps.h"
#include "control/instance_credentials.h"
#include "control/instance_metrics.h"
#include "control/scheduler.h"
#include "net/http_client.h"
#include "objects/object_store.h"
#include "observe/log_store.h"
#include "runtime/environments.h"
#include "runtime/networks.h"
#include "runtime/runtime.h"
#include "serving/routing.h"
#include "store/database.h"
#include "store/endpoint_repository.h"

namespace kiln::control {

struct EndpointControllerOptions {
  std::string work_dir;         // instance directories: <work_dir>/<endpoint>/<instance-id>/
  std::string model_cache_dir;  // model archives by ETag (empty: no cache)
  std::string region = "us-east-1";
  std::string account_id = "000000000000";
  std::string endpoint_url;  // Kiln as instances reach it (AWS_ENDPOINT_URL)
  // Framework images are served by Kiln's model server (src/modelserver): the kiln-model-server
  // program and its Python worker (python/kiln_toolkit/serve_worker.py).
  std::string model_server;
  std::string serve_worker;
  // Instance ports: blocks of 100 inside [port_range_begin, port_range_end). Below Linux's
  // ephemeral range (32768+), so that an outgoing connection cannot take a port between its
  // reservation and the container binding it.
  int port_range_begin = 20000;
  int port_range_end = 30000;
  std::chrono::seconds stop_grace{30};                  // SIGTERM → SIGKILL (AWS behaviour)
  std::chrono::milliseconds health_interval{5000};      // pings of a routable instance
  int unhealthy_threshold = 3;                          // consecutive failed pings
  std::chrono::milliseconds ping_timeout{2000};         // per attempt (AWS behaviour)
  std::chrono::seconds default_startup_timeout{240};    // ContainerStartupHealthCheckTimeoutInSeconds
  std::chrono::seconds default_download_timeout{3600};  // ModelDataDownloadTimeoutInSeconds
  // VariantInstanceProvisionTimeoutInSeconds of variants that do not set it (the API model's
  // maximum; AWS documents no default): how long an instance waits for capacity under `strict`.
  std::chrono::seconds default_provision_timeout{3600};
  std::chrono::seconds drain_timeout{65};  // the invocation budget plus a margin
  // A replacement that failed waits this long (doubling up to 60 s) before the next try.
  std::chrono::milliseconds replacement_backoff{1000};
  ArchiveCapOptions archive_caps;  // bounds model.tar.gz (archive_caps.h)
  // The runtime places instances on other machines (the Slurm runtime, issue 21): an instance is
  // pinged (and routed) at InstanceStatus::address once the runtime reports it, and the time it
  // waits for the backend to start it (InstanceStatus::waiting_reason, shown as the variant's
  // status message) does not count against its startup health-check budget.
  bool remote_instances = false;
};

struct EndpointControllerDeps {
  store::Database* database = nullptr;
  objects::ObjectStore* object_store = nullptr;
  runtime::Runtime* runtime = nullptr;
  Scheduler* scheduler = nullptr;
  const runtime::EnvironmentTable* environments = nullptr;
  InstanceCredentials* credentials = nullptr;
  observe::LogStore* log_store = nullptr;
  serving::RoutingTable* routes = nullptr;
  // The invoke path's pooled client (may be null): a stopped instance's idle connections are
  // dropped from it, so its pool holds sockets only to live instances.
  net::HttpClient* invoke_client = nullptr;
  // The same for the event loops' upstream pools (HttpServer::ForgetUpstream; may be empty).
  std::function<void(const std::string& host, uint16_t port)> forget_upstream;
  // Samples the instances' CPU/memory/disk/GPU metrics (may be null: none).
  InstanceMetrics* instance_metrics = nullptr;
  // Time for the controller's own decisions: the wall-clock stamps it writes and the deadlines
  // of replacement backoff and the capacity wait. nullptr: the system clock for stamps and
  // std::chrono::steady_clock for deadlines (a stepped wall clock never stretches or cuts a
  // wait). A clock given here serves both (a test's fake clock moves only forward); after
  // advancing it, call EndpointController::Wake(). Startup, drain and stop budgets stay in real
  // time: they bound real processes and pings.
  const Clock* clock = nullptr;
  // Per-endpoint networks (runtime/networks.h; DESIGN.md §6). Set: each instance gets a network
  // namespace of its own on network `endpoint-<EndpointName>` and listens on 8080 at its address.
  // nullptr: host mode, every instance on the node's network with a port block of its own.
  runtime::InstanceNetworks* networks = nullptr;
};

struct EndpointInstanceEnv;  // control/endpoint_instance.h
class StandaloneInstances;   // control/transform_instances.h: serving instances outside any endpoint

class EndpointController final : public EndpointNotifier {
 public:
  EndpointController(EndpointControllerOptions options, EndpointControllerDeps deps);
  ~EndpointController() override;  // Shutdown()
  EndpointController(const EndpointController&) = delete;
  EndpointController& operator=(const EndpointController&) = delete;

  // Adopts running instances, starts a run for every endpoint row, stops orphans.
  Status Start() EXCLUDES(mutex_);
  // Ends every run without stopping instances (the next server adopts them). Idempotent.
  void Shutdown() EXCLUDES(mutex_);

  void EndpointChanged(const std::string& endpoint_name) override EXCLUDES(mutex_);

  // Re-evaluates every time-based wait now (backoffs, capacity waits): for a test that advanced
  // deps.clock. Waits end on their own when the clock is the system's.
  void Wake() EXCLUDES(mutex_);

  class EndpointRun;

 private:
  friend class EndpointRun;
  friend class StandaloneInstances;  // uses instance_env_ and the port blocks

  void StartRun(const std::string& name) EXCLUDES(mutex_);
  void OnRunFinished(const std::string& name) EXCLUDES(mutex_);
  // `blocks` free consecutive blocks of 100 ports (one per container of a multi-container
  // model); the first port, or 0 when none. Released with ReleasePorts.
  int ReservePorts(int blocks = 1) EXCLUDES(mutex_);
  void MarkPortsUsed(int base, int blocks = 1) EXCLUDES(mutex_);
  void ReleasePorts(int base, int blocks = 1) EXCLUDES(mutex_);
  // deps_.clock's wall time, and the milliseconds that deadlines are measured in (see deps).
  int64_t WallMillis() const;
  int64_t DeadlineMillis() const;

  EndpointControllerOptions options_;
  EndpointControllerDeps deps_;
  store::EndpointRepository endpoints_;
  net::HttpClient ping_client_;
  std::unique_ptr<EndpointInstanceEnv> instance_env_;  // what instances use of this controller

  Mutex mutex_;
  std::map<std::string, std::shared_ptr<EndpointRun>> runs_ GUARDED_BY(mutex_);  // by lower-case name
  std::vector<std::shared_ptr<EndpointRun>> finished_ GUARDED_BY(mutex_);        // to join
  std::set<int> used_port_blocks_ GUARDED_BY(mutex_);
  bool started_ GUARDED_BY(mutex_) = false;
  bool shutting_down_ GUARDED_BY(mutex_) = false;
};

}  // namespace kiln::control
