#pragma once
// ProcessingController: runs SageMaker processing jobs on this node (training-contract.md §17,
// control-plane-api.md §8.2). The API validates CreateProcessingJob, inserts the row
// (InProgress) and calls Submit(); from then on the controller owns the job:
//
//   waiting ──capacity──► staging ──launch──► running ──every host exited──► outputs ──► terminal
//   (in submission      (host dirs, config    (logs, Continuous       (EndOfJob uploads,   Completed /
//    order)              files, File inputs,   outputs, stop,          final Continuous     Failed /
//                        Pipe FIFOs)           MaxRuntimeInSeconds)    pass, ExitMessage)   Stopped
//
// Each granted or adopted job is a ProcessingJobRun (processing_job_run.h) on a thread of its own.
// Every step a restart needs is written to the row first (store/processing_job_state.h): the
// grant (state.allocation_ids and extra.allocations), then per host its runtime instance and log
// stream once launched, so a restarted server (Start()) re-queues from the top the jobs that never
// launched — their staging is idempotent — and adopts the launched ones: resources re-reserved,
// log pumps resumed at their recorded offsets, Pipe feeders resumed, Continuous uploads restarted,
// MaxRuntimeInSeconds counted from the recorded start. A launched host whose instance is gone
// ends as lost ("InternalServerError: the instance algo-N was lost: Kiln restarted while the job
// ran and its instance is gone."), so such a job ends Failed (after its EndOfJob uploads).
// Shutdown() leaves every instance running for the next server.
//
// Capacity: the node's Scheduler is shared with the training controller, whose scheduling pass
// takes every grant Scheduler::Schedule() hands out; processing jobs therefore do not enter that
// queue but reserve through Scheduler::AllocateNow (as endpoint instances do), one job at a time in
// the order they were submitted (seq): the oldest waiting job that does not fit holds the ones
// behind it (head-of-line, as training). A waiting job is retried whenever one of this
// controller's runs ends and every `capacity_retry_interval` (capacity freed by training jobs and
// endpoints is noticed then: the scheduler's release listener belongs to the training controller).
// Grants are held under the id "processing-job/<name>" (ProcessingGrantId), so a processing job
// and a training job of the same name never collide. A type that can never fit fails the job at
// once ("ClientError: ..." with the scheduler's reason).
//
// Thread model: callers' threads (API handlers, the server's startup) call Submit / RequestStop;
// they read or write the job's row (one transaction each) and wake the dispatcher thread. The
// dispatcher thread (one, started by Start()) reserves capacity for waiting jobs, starts their
// runs and joins finished runs. One thread per run, plus its log pump threads and the agent's
// Pipe feeders and Continuous-output syncs. `mutex_` guards only the in-memory maps below and is
// never held across a database, scheduler or run call, or a join (every method that takes it is
// EXCLUDES(mutex_)). Rows change only through ProcessingJobRepository::Mutate transactions, so the
// API's stop request and a run's progress never overwrite each other.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/time.h"
#include "control/instance_credentials.h"
#include "control/instance_metrics.h"
#include "control/scheduler.h"
#include "objects/object_store.h"
#include "observe/log_store.h"
#include "runtime/environments.h"
#include "runtime/networks.h"
#include "runtime/runtime.h"
#include "store/database.h"
#include "store/processing_job_repository.h"

namespace kiln::control {

inline constexpr char kProcessingLogGroup[] = "/aws/sagemaker/ProcessingJobs";

// The scheduler id of a processing job's grant.
std::string ProcessingGrantId(const std::string& job);

struct ProcessingControllerOptions {
  std::string work_dir;                  // host directories: <work_dir>/<job>/algo-<n>/opt_ml
  std::string region;                    // AWS_REGION inside instances
  std::string endpoint_url;              // how instances reach Kiln (AWS_ENDPOINT_URL, S3_ENDPOINT_URL)
  std::chrono::seconds stop_grace{120};  // SIGTERM → SIGKILL (§17 "Stop", §11)
  // Continuous outputs: how often LocalPath is scanned, and how long a file must be unchanged
  // before it is uploaded ("as it is closed": Kiln cannot see closes, so quiet files count).
  std::chrono::milliseconds continuous_scan_interval{5000};
  std::chrono::milliseconds continuous_quiet_period{2000};
  // How often a job waiting for capacity tries again (besides whenever one of our runs ends).
  std::chrono::milliseconds capacity_retry_interval{1000};
  int staging_parallelism = 8;
  bool keep_host_dirs = false;  // keep <work_dir>/<job> after the job ends (debugging)
};

// The training controller's dependencies that processing uses (the same objects may be shared).
struct ProcessingControllerDeps {
  store::Database* database = nullptr;
  objects::ObjectStore* object_store = nullptr;
  observe::LogStore* log_store = nullptr;
  runtime::Runtime* runtime = nullptr;
  Scheduler* scheduler = nullptr;
  const runtime::EnvironmentTable* environments = nullptr;
  InstanceCredentials* credentials = nullptr;
  const Clock* clock = nullptr;                 // nullptr: the system clock
  InstanceMetrics* instance_metrics = nullptr;  // may be null; hosts are published as Host=<job>/algo-N
  // Per-job networks (DESIGN.md §6), as training: network "processing-<job>" (isolated under
  // NetworkConfig.EnableNetworkIsolation), an address per host, /etc/hosts naming every algo-N.
  // Null: the hosts share the node's network (algo-N = 127.0.0.1).
  runtime::InstanceNetworks* networks = nullptr;
};

class ProcessingJobRun;  // control/processing_job_run.h

class ProcessingController {
 public:
  ProcessingController(ProcessingControllerOptions options, ProcessingControllerDeps deps);
  ~ProcessingController();  // Shutdown()
  ProcessingController(const ProcessingController&) = delete;
  ProcessingController& operator=(const ProcessingController&) = delete;

  // Adopts launched jobs, ends Stopping jobs that never launched (Stopped) and queues the others
  // (see above); starts the dispatcher thread. Call once, before serving requests.
  Status Start() EXCLUDES(mutex_);
  // Stops the controller's threads; instances keep running for the next server to adopt.
  void Shutdown() EXCLUDES(mutex_);

  // A job row was inserted (InProgress) or is to be run again: queue it for capacity. A job
  // whose type can never run here fails at once; a row that is not active is ignored.
  void Submit(const std::string& name) EXCLUDES(mutex_);
  // The API marked the job Stopping (StopProcessingJob): a waiting job ends Stopped at once; a
  // running one is stopped (SIGTERM, stop_grace, SIGKILL), its EndOfJob outputs uploaded, and
  // ends Stopped.
  void RequestStop(const std::string& name) EXCLUDES(mutex_);

 private:
  void RunDispatcher() EXCLUDES(mutex_);
  // Reserves capacity for the waiting jobs in order while they fit, starting their runs.
  void Dispatch() EXCLUDES(mutex_);
  void StartRun(const std::string& name, std::vector<Allocation> allocations, bool adopt) EXCLUDES(mutex_);
  void OnRunFinished(const std::string& name) EXCLUDES(mutex_);
  // A job that never launched ends Stopped (a stop while it waited).
  void FinishWithoutRunning(const std::string& name);
  // A job that cannot be run ends Failed with `reason` before it ran.
  void FailWithoutRunning(const std::string& name, const std::string& reason);
  int64_t Now() const;

  const ProcessingControllerOptions options_;
  const ProcessingControllerDeps deps_;
  store::ProcessingJobRepository jobs_;

  Mutex mutex_;
  CondVar wake_;  // over mutex_: shutting_down_, dispatch_needed_ or finished_runs_ changed
  bool shutting_down_ GUARDED_BY(mutex_) = false;
  bool dispatch_needed_ GUARDED_BY(mutex_) = false;
  std::map<int64_t, std::string> waiting_ GUARDED_BY(mutex_);  // seq -> job, submission order
  std::map<std::string, std::shared_ptr<ProcessingJobRun>> runs_ GUARDED_BY(mutex_);
  std::vector<std::shared_ptr<ProcessingJobRun>> finished_runs_ GUARDED_BY(mutex_);  // to join
  // Started by Start() and joined by Shutdown() (without mutex_), which the owner never calls
  // concurrently: not GUARDED_BY.
  std::thread dispatcher_;
};

}  // namespace kiln::control
