#pragma once
// TrainingController: runs SageMaker training jobs on this node (DESIGN.md §5–6,
// spec/training-contract.md). The API layer validates a request, inserts the job row
// (InProgress / Starting) and calls Submit(); from then on the controller owns the job's progress:
//
//   queued ──grant──► staging ──launch──► running ──all hosts exited──► finishing ──► terminal
//   (Pending while     (Starting,          (Training:            (Uploading: checkpoints,
//    capacity waits)    Downloading)        logs, metrics,         model.tar.gz, output.tar.gz)
//                                           checkpoints, stop,
//                                           MaxRuntimeInSeconds)
//
// Every step is written to the job row (store::TrainingJobRepository) before the next begins, so
// a restarted server picks the job up where it was (Start()): queued and staging jobs are queued
// again in submission order (staging is idempotent: the host directories are rebuilt); running
// jobs are adopted — their shims still run them — with their resources re-reserved, their log
// pumps resumed at the persisted offsets and their deadlines kept; finishing jobs redo the
// upload. A server shutting down (Shutdown()) leaves every instance running.
//
// The job's state is typed (store/training_job_state.h: TrainingPhase, TrainingJobStatus,
// SecondaryStatus, TrainingJobState and its JSON mapping). Only this controller changes the
// phase; the API inserts a job in the default phase (queued) and records a stop as a request
// (state.stop_requested = kUser, status Stopping).
//
// Thread-safety: public methods may be called from any thread.
//
// Units: this class is the queue and the bookkeeping (Start, Submit, RequestStop, the scheduling
// pass, MaxPendingTime); each granted or adopted job is a TrainingJobRun (training_job_run.h);
// the decisions a run takes while it monitors and finishes are pure functions
// (training_plan.h: PlanMonitor, PlanOutcome, RetryAllowed); the legal phase and status changes
// are one table (training_states.h).
//
// Thread model:
//   - Callers' threads (API handlers, the server's startup): Submit, RequestStop, CheckFeasible,
//     PendingMessage. Submit and RequestStop write the job's row where they change it (one
//     transaction each) and wake the scheduler thread; RequestStop forwards to the job's run
//     when it has one.
//   - The scheduler thread (one, started by Start()): sleeps on `wake_` (at most 5 s), joins
//     finished runs, expires MaxPendingTime deadlines, and runs a pass (Scheduler::Schedule,
//     grants written in one transaction, a TrainingJobRun started per grant, Pending recorded).
//   - One thread per TrainingJobRun (granted or adopted job) from Prepare to its terminal
//     write; it calls OnRunFinished (releases the grant, hands itself to the scheduler thread to
//     be joined) and, for a retry, Submit. Each host of a running job adds a log pump thread and
//     the agent's checkpoint/output-sync and Pipe feeder workers, owned by the run.
//   - The scheduler's release listener (capacity freed by an endpoint) runs on the releasing
//     thread and only sets `schedule_needed_`.
// Locks: `mutex_` (a kiln::Mutex; `wake_` is its CondVar) guards the members marked GUARDED_BY
// below and is never held while calling the database, the scheduler or a run, nor while joining
// one (so a run's OnRunFinished or retry Submit cannot deadlock with a pass or a shutdown): every
// method that takes it is declared EXCLUDES(mutex_), which clang's -Wthread-safety checks. The
// Scheduler and the Database have their own locks; a run's `metrics_mutex_` guards only its
// final metrics. Rows are the shared truth: every change is a TrainingJobRepository::Mutate
// transaction, so the API's stop request and the run's progress never overwrite each other.
// What a restart re-creates: the scheduler's queue (queued and staging jobs re-submitted in
// submission order), reservations and runs of running/finishing jobs (adopted; instances kept
// running by their shims), MaxPendingTime deadlines (from creation time); nothing else is kept in
// memory that a row does not also hold.
//
// Scheduling writes (issue 11): the scheduler thread runs a pass whenever something was
// submitted, stopped or released. A pass writes only the jobs whose own state changes, each group
// in one transaction: the jobs it granted (phase staging, allocations, Starting message) and the
// jobs that newly entered the queue and still wait (SecondaryStatus Pending, once, with what they
// wait for). Nothing is written for the jobs that merely moved up in line: their place is read
// live (TrainingQueueView::PendingMessage) when Describe renders them. MaxPendingTimeInSeconds is
// kept as in-memory deadlines checked on every wake (at least every 5 s), not by reading rows.

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/mutex.h"
#include "base/status.h"
#include "base/time.h"
#include "control/archive_caps.h"
#include "control/instance_credentials.h"
#include "control/instance_metrics.h"
#include "control/scheduler.h"
#include "control/training_queue_view.h"
#include "objects/object_store.h"
#include "observe/log_store.h"
#include "observe/metric_extractor.h"
#include "observe/metric_store.h"
#include "runtime/environments.h"
#include "runtime/networks.h"
#include "runtime/runtime.h"
#include "store/database.h"
#include "store/training_job_repository.h"

namespace kiln::control {

inline constexpr char kTrainingLogGroup[] = "/aws/sagemaker/TrainingJobs";

// Managed spot (training-contract.md §9; issue 18): where interruptions come from besides
// `kiln interrupt` and on-demand jobs that need the node (the scheduler's Preemptions()).
struct SpotOptions {
  // The n-th attempt (0-based) of every managed-spot job is interrupted once it has trained
  // interrupt_after_seconds[n] seconds; attempts beyond the list run on. Empty: no schedule.
  std::vector<double> interrupt_after_seconds;
  // Each running spot job is interrupted with this probability per hour of training (a Poisson
  // process, drawn about once a second). 0: never.
  double interrupt_probability_per_hour = 0;
  // How long an interrupted job waits before it is queued again ("until capacity returns").
  std::chrono::milliseconds restart_delay{0};
  uint64_t seed = 0;  // the probability draws' seed; 0: from the clock
};

struct TrainingControllerOptions {
  std::string work_dir;        // host directories: <work_dir>/<job>/algo-<n>/opt_ml
  std::string region;          // AWS_REGION inside instances
  std::string endpoint_url;    // how instances reach Kiln (AWS_ENDPOINT_URL, S3_ENDPOINT_URL)
  std::string toolkit_script;  // python/kiln_toolkit/train.py: the `train` of script-mode images
  // The kiln binary, for the hold before start (training_hold.h); empty: holds are refused.
  std::string kiln_binary;
  std::chrono::seconds stop_grace{120};  // SIGTERM → SIGKILL (training-contract.md §11)
  std::chrono::milliseconds checkpoint_scan_interval{10000};
  std::chrono::milliseconds checkpoint_quiet_period{2000};
  int staging_parallelism = 8;
  bool keep_host_dirs = false;     // keep <work_dir>/<job> after the job ends (debugging)
  ArchiveCapOptions archive_caps;  // bounds sourcedir.tar.gz (archive_caps.h)
  SpotOptions spot;
  // The runtime places instances on other machines (the Slurm runtime, issue 21): Pipe input mode
  // is refused (its FIFOs cannot cross machines), and the hold before start is not offered.
  bool remote_instances = false;
};

struct TrainingControllerDeps {
  store::Database* database = nullptr;
  objects::ObjectStore* object_store = nullptr;
  observe::LogStore* log_store = nullptr;
  observe::MetricStore* metric_store = nullptr;
  runtime::Runtime* runtime = nullptr;
  Scheduler* scheduler = nullptr;
  const runtime::EnvironmentTable* environments = nullptr;
  InstanceCredentials* credentials = nullptr;
  const Clock* clock = nullptr;                 // nullptr: the system clock
  InstanceMetrics* instance_metrics = nullptr;  // samples the hosts' CPU/memory/disk/GPU (may be null)
  // Per-job networks (runtime/networks.h; DESIGN.md §6). Set: each job gets network
  // "training-<job>" (isolated under EnableNetworkIsolation), each host a namespace and an address
  // on it, and /etc/hosts maps every algo-N to its host's address; the network is removed when
  // the job ends (or is retried). Null: the hosts share the node's network (algo-N = 127.0.0.1).
  runtime::InstanceNetworks* networks = nullptr;
  // Called (on the run's thread, no lock held) when a job's run has ended: its terminal state is
  // written, or it was handed back to the queue for a retry. The tuning controller wakes on it so
  // that the next trial starts without waiting for its tick. May be empty.
  std::function<void(const std::string& job)> on_run_finished;
};

class TrainingJobRun;  // control/training_job_run.h

class TrainingController : public TrainingQueueView {
 public:
  TrainingController(TrainingControllerOptions options, TrainingControllerDeps deps);
  ~TrainingController() override;
  TrainingController(const TrainingController&) = delete;
  TrainingController& operator=(const TrainingController&) = delete;

  // Adopts running jobs and queues the others (see above). Call once, before serving requests.
  Status Start() EXCLUDES(mutex_);
  // Stops the controller's threads; instances keep running for the next server to adopt.
  void Shutdown() EXCLUDES(mutex_);

  // A job row was inserted (InProgress / Starting): schedule it.
  void Submit(const std::string& name) EXCLUDES(mutex_);
  // The API marked the job Stopping (state.stop_requested = kUser): carry the stop out.
  void RequestStop(const std::string& name) EXCLUDES(mutex_);

  // Reclaims a managed-spot job's instances as a spot reclaim does (training-contract.md §9): the
  // stop procedure, a final checkpoint sync, SecondaryStatus Interrupted, then the job queues
  // again (after SpotOptions::restart_delay) and resumes from its checkpoints. `reason` goes to the
  // job's log streams. NotFound: no such job; FailedPrecondition: not a managed-spot job, not
  // InProgress, or not started (a job waiting for capacity holds nothing to reclaim), or an
  // interruption is already under way.
  Status Interrupt(const std::string& name, const std::string& reason) EXCLUDES(mutex_);

  // UpdateTrainingJob changed ResourceConfig.KeepAlivePeriodInSeconds of `name`. A pool it keeps
  // (Available) now ends that many seconds from now, or at once for 0 (Terminated); a running job
  // keeps the new period when it ends (the row is read then).
  void WarmPoolChanged(const std::string& name) EXCLUDES(mutex_);

  // Could a job of this shape ever run here? (For CreateTrainingJob's ResourceLimitExceeded.)
  Status CheckFeasible(const std::string& instance_type, int instance_count) const;

  // TrainingQueueView: the live waiting message of a queued job (the scheduler's).
  std::string PendingMessage(const std::string& job_name) const override;

 private:
  void RunScheduler() EXCLUDES(mutex_);
  // `grant_written`: the pass's write of the grant (an error fails the run in its first step).
  void StartRun(const std::string& name, std::vector<Allocation> allocations, bool adopt,
                Status grant_written = Status::Ok()) EXCLUDES(mutex_);
  void OnRunFinished(const std::string& name) EXCLUDES(mutex_);
  // A job that never ran ends Stopped (a user's stop, or MaxPendingTimeInSeconds when `max_pending`).
  Status FinishWithoutRunning(const std::string& name, bool max_pending) EXCLUDES(mutex_);
  // One pass: grant what fits (persisting the grants together), start their runs, and record
  // Pending for the jobs that entered the queue since the last pass and still wait.
  void RunPass() EXCLUDES(mutex_);
  // Stops the queued jobs whose MaxPendingTimeInSeconds has passed; true if any was.
  bool ExpirePendingDeadlines() EXCLUDES(mutex_);
  // Managed spot: stops the jobs waiting for capacity (queued, or interrupted and not yet due)
  // whose MaxWaitTimeInSeconds has passed; submits the interrupted jobs now due. True if any
  // changed the queue.
  bool ExpireWaitDeadlines() EXCLUDES(mutex_);
  // Interrupts the spot grants the scheduler names for a queued on-demand job.
  void PreemptForOnDemand() EXCLUDES(mutex_);
  // A job that never ran (or waits to resume) ends Stopped / MaxWaitTimeExceeded.
  Status FinishMaxWait(const std::string& name) EXCLUDES(mutex_);

  // Warm pools (warm_pools.h; training-contract.md §19). A pool is a finished job whose row says
  // Available: its grant is held under WarmPoolGrantId(job) (reclaimable: the scheduler names it
  // for a queued job that needs the capacity), its host directories under <work_dir>/.warm-pools.
  //
  // Takes an Available pool matching `record` (the oldest kept first): the kept job becomes
  // Reused, this one InUse, the grant moves to it and its run starts at once. False when none
  // matches (the job queues as usual).
  bool ClaimWarmPool(const store::TrainingJobRecord& record) EXCLUDES(mutex_);
  // A run ended with its row saying Available: its grant becomes the pool's. Otherwise the grant
  // is released. (OnRunFinished.)
  void KeepOrReleaseGrant(const std::string& name) EXCLUDES(mutex_);
  // Hands a pool just kept to the first queued job that matches it (ClaimWarmPool).
  void OfferPoolToQueue(const nlohmann::json& kept_request) EXCLUDES(mutex_);
  // Ends an Available pool (expiry, capacity, UpdateTrainingJob 0, restart past expiry):
  // Terminated with its retained time, grant released, directories removed. Acts only when it
  // takes the pool out of pools_ itself (or `claimed`: the caller holds a pool not in pools_);
  // otherwise a job is reusing it right now and nothing happens.
  void TerminateWarmPool(const std::string& name, const std::string& why, bool claimed = false) EXCLUDES(mutex_);
  // Terminates the pools whose time ran out; true if any was.
  bool ExpireWarmPools() EXCLUDES(mutex_);
  // Start(): re-reserves the grants of the pools kept under a previous server.
  // (Then removes the directories under <work_dir>/.warm-pools that no row refers to.)
  void AdoptWarmPools() EXCLUDES(mutex_);
  void SweepWarmPoolDirectories();

  struct KeptPool {
    nlohmann::json request;  // the kept job's request (WarmPoolMatches)
    int64_t expires_millis = 0;
    int64_t kept_millis = 0;  // when it became Available (the oldest is offered first)
  };

  TrainingControllerOptions options_;
  TrainingControllerDeps deps_;
  store::TrainingJobRepository jobs_;

  Mutex mutex_;
  CondVar wake_;  // over mutex_: shutting_down_, schedule_needed_ or finished_runs_ changed
  bool shutting_down_ GUARDED_BY(mutex_) = false;
  bool schedule_needed_ GUARDED_BY(mutex_) = false;
  std::map<std::string, std::shared_ptr<TrainingJobRun>> runs_ GUARDED_BY(mutex_);
  std::vector<std::shared_ptr<TrainingJobRun>> finished_runs_ GUARDED_BY(mutex_);  // to join
  std::vector<std::string> entering_pending_ GUARDED_BY(mutex_);                   // submitted since the last pass
  std::multimap<int64_t, std::string> pending_deadlines_ GUARDED_BY(mutex_);       // MaxPendingTime, millis -> job
  std::multimap<int64_t, std::string> wait_deadlines_ GUARDED_BY(mutex_);          // spot MaxWaitTime, millis -> job
  std::multimap<int64_t, std::string> resume_at_ GUARDED_BY(mutex_);  // interrupted jobs, due millis -> job
  std::map<std::string, KeptPool> pools_ GUARDED_BY(mutex_);          // Available warm pools by job
  std::set<std::string> pending_pool_changes_ GUARDED_BY(mutex_);     // WarmPoolChanged before registration
  // Started by Start() and joined by Shutdown() (without mutex_), which the owner never calls
  // concurrently: not GUARDED_BY.
  std::thread scheduler_thread_;
};

// Helpers shared with the API layer (api/training_jobs.cc renders Describe from these).

// Appends or updates SecondaryStatusTransitions in `state` per training-contract.md §14: a new
// entry only when the status changes (closing the previous one at `now`), otherwise the message
// of the last entry is replaced.
void RecordSecondaryStatus(store::TrainingJobRecord& record, store::SecondaryStatus secondary,
                           const std::string& message, int64_t now_millis);

// AlgorithmSpecification.MetricDefinitions ([{Name, Regex}]) as the extractor takes them.
std::vector<observe::MetricDefinition> MetricDefinitionsFromJson(const nlohmann::json& definitions);

}  // namespace kiln::control
