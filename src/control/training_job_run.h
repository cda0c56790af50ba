#pragma once
// TrainingJobRun: one training job from its grant (or its adoption after a restart) to its
// terminal status, on a thread of its own (training_controller.h says who creates and joins it).
//
//   granted:  Prepare (host directories, layout) → Stage (image check, a container image's pull,
//             channels, code, checkpoints restore, pipe feeders) → Launch (one instance per host, credentials,
//             log pumps) → Monitor → Finish (drain logs, final syncs, model/output upload,
//             terminal status) — or Fail / a retry (RetryStrategy) at any step.
//   adopted:  Adopt (pumps resumed at their persisted offsets, feeders and syncs restarted) →
//             Monitor (a running job) → Finish; a finishing job goes straight to Finish.
//
// Threads: Run() executes on the run's own thread (Start()); each host has a log pump thread and
// the agent's sync/feeder workers. RequestStop() and Shutdown() may be called from any thread:
// they set atomics and cancel the staging transfers; the monitor sees them within one runtime
// Wait (250 ms). The run writes its job's row only through TrainingJobRepository::Mutate (one
// transaction each), so the API's concurrent stop request is never lost.
//
// A run ends by calling Context::on_finished (its grant is released there), then, when the job
// is to be retried, Context::resubmit. A shutting-down run leaves its instances running and
// writes nothing more: the next server adopts them.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/transfer.h"
#include "base/mutex.h"
#include "base/status.h"
#include "control/scheduler.h"
#include "control/training_controller.h"
#include "control/training_plan.h"
#include "observe/metric_extractor.h"
#include "store/training_job_repository.h"

namespace kiln::agent {
class CheckpointSync;
}  // namespace kiln::agent

namespace kiln::control {

class TrainingJobRun {
 public:
  struct Context {
    const TrainingControllerOptions* options = nullptr;  // outlive the run
    const TrainingControllerDeps* deps = nullptr;
    store::TrainingJobRepository* jobs = nullptr;
    // Called on the run's thread as its last step but one: release the grant, mark the run joinable.
    std::function<void(const std::string& name)> on_finished;
    // Called after on_finished when the job is to be retried: queue it again.
    std::function<void(const std::string& name)> resubmit;
  };

  // `adopt`: the job was running (or finishing) under a previous server. `grant_written`: whether
  // the scheduling pass persisted the grant (an error fails the job in Prepare, as a failed write
  // of its own would).
  TrainingJobRun(Context context, std::string name, std::vector<Allocation> allocations, bool adopt,
                 Status grant_written);
  // Join() must have returned (or Start() never been called) before destruction.
  ~TrainingJobRun();
  TrainingJobRun(const TrainingJobRun&) = delete;
  TrainingJobRun& operator=(const TrainingJobRun&) = delete;

  void Start();
  // The job's row says Stopping: stop the hosts (or abandon staging) and end Stopped.
  void RequestStop();
  // Managed spot: the row records interrupt_requested (the controller wrote it): stop the hosts
  // (or abandon staging) as a spot reclaim does, sync the checkpoints and queue the job again.
  void RequestInterrupt();
  // The server is going: leave the instances running, write nothing more, return soon.
  void Shutdown();
  void Join();
  const std::string& name() const { return name_; }

 private:
  struct Host;

  const TrainingControllerOptions& options() const { return *context_.options; }
  const TrainingControllerDeps& deps() const { return *context_.deps; }
  int64_t Now() const;
  Result<store::TrainingJobRecord> Update(const std::function<void(store::TrainingJobRecord&)>& fn);
  void SetSecondary(store::SecondaryStatus secondary, const std::string& message);

  void Run();
  void RunSteps();
  Status Prepare(store::TrainingJobRecord& record);
  Status Stage(const store::TrainingJobRecord& record);
  // Container images: Runtime::PrepareImage, its progress in the Downloading status message;
  // errors as ImagePreparationError says (Aborted when the run is stopped meanwhile).
  Status PrepareImage(const std::string& image);
  Status Launch(store::TrainingJobRecord& record);
  void Adopt(const store::TrainingJobRecord& record) EXCLUDES(metrics_mutex_);
  void Monitor(const store::TrainingJobRecord& record);
  void ObserveHold();
  void StopIfIdle();
  void HoldAfterExit();
  // Inspects the hosts not known to have exited and records their exits.
  void ObserveHosts();
  // Carries out the monitor's plan: record MaxRuntime or MaxWaitTime (`record_stop`: the row
  // becomes Stopping with the reason as its stop request), stop the running hosts.
  void StopHosts(training::StopReason reason, bool record_stop);
  // The operator's interruption sources (SpotOptions: the schedule, the probability), checked on
  // every monitor pass of a running managed-spot job.
  void CheckSpotSources();
  // Records interrupt_requested (`why`) in the row and interrupts this run; false when the row
  // is no longer InProgress or an interruption is already recorded.
  bool InterruptSelf(const std::string& why);
  // The end of an interrupted attempt (its hosts exited, or staging was abandoned): final
  // checkpoint sync, the attempt's running time billed, SecondaryStatus Interrupted, the row
  // queued again. False when the row says Stopping meanwhile (a user's stop wins: the caller
  // finishes the job as a stop).
  bool FinishInterrupted(bool ran);
  // A [kiln] line in every launched host's log stream.
  void SayInLogs(const std::string& line);
  // Writes final_metrics_ to the row when they changed since the last flush; metrics_mutex_ is
  // held across the write.
  void FlushMetrics() EXCLUDES(metrics_mutex_);
  void Finish(bool ran) EXCLUDES(metrics_mutex_);
  void Fail(const training::JobFailure& failure);
  bool RetryIfAllowed(const training::JobFailure& failure);
  void StartPump(Host& host, const nlohmann::json& metric_definitions, int64_t offset);
  void RecordMetrics(const std::string& host, const std::vector<observe::MetricPoint>& points) EXCLUDES(metrics_mutex_);
  void StopPumps(bool drain);
  void StopAgents();
  Result<std::unique_ptr<agent::CheckpointSync>> MakeCheckpointSync(const Host& host);
  Result<std::vector<std::unique_ptr<agent::CheckpointSync>>> MakeOutputSyncs(const Host& host);
  training::JobFailure FailureReasonFromHosts();
  void Cleanup();
  // Moves the hosts' directories to keep_pool_dir_ and wipes all but what a pool keeps (the staged
  // input files with their manifest, and the persistent cache). A failure only costs the next job
  // its reuse of those files (it downloads them); the pool keeps its grant.
  void KeepHostDirectories();
  // The row's warm pool as the job ends (Finish, Fail): Available when the job ran and asks for a
  // keep-alive period (keep_pool_dir_ is then set), otherwise a pool it took is used up.
  void EndWarmPool(store::TrainingJobRecord& rec, bool ran, int64_t now);

  const Context context_;
  const std::string name_;
  const std::vector<Allocation> allocations_;
  const bool adopt_;
  const Status grant_written_;
  std::thread thread_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> interrupt_requested_{false};
  agent::CancelFlag cancel_;

  // Owned by the run's thread (set before it starts or only on it).
  nlohmann::json request_;
  std::string job_dir_;
  std::vector<std::unique_ptr<Host>> hosts_;
  training::StopReason stop_reason_ = training::StopReason::kNone;
  bool retrying_ = false;  // set by RetryIfAllowed: Run() queues the job again
  // Warm pools (warm_pools.h): the kept directories this job took (its row said InUse), and
  // where Cleanup keeps this job's own when Finish recorded it Available.
  std::string taken_pool_dir_;
  std::string keep_pool_dir_;
  std::string allocation_note_;        // "; <what the scheduler gave instead of the full shape>" or ""
  int64_t training_start_millis_ = 0;  // this attempt's start
  // Managed spot (from the row when the run begins): interruptions so far, running time of the
  // earlier attempts, creation time (MaxWaitTimeInSeconds counts from it), the next probability draw.
  int interruptions_ = 0;
  int64_t billable_before_ = 0;
  int64_t creation_millis_ = 0;
  int64_t last_spot_draw_millis_ = 0;
  uint64_t spot_random_state_ = 0;
  // Hosts were started behind the hold before start (training_hold.h) and not every one has
  // started its program yet (ObserveHold).
  bool holding_ = false;
  // The backend's waiting reason last shown as the Training status message (Slurm's pending
  // reason, ObserveHosts); "" when none is shown.
  std::string waiting_shown_;
  // kiln:remote-idle-stop-seconds (training_hold.h); 0: none.
  int idle_stop_seconds_ = 0;
  int hold_exit_seconds_ = 0;  // kiln:remote-hold-exit-seconds when it applies; 0: no hold
  std::string job_arn_;        // set by Launch or Adopt

  // Written by the log pumps' threads (RecordMetrics), read by the run's.
  Mutex metrics_mutex_;
  std::map<std::string, store::FinalMetric> final_metrics_ GUARDED_BY(metrics_mutex_);
  bool metrics_dirty_ GUARDED_BY(metrics_mutex_) = false;
};

}  // namespace kiln::control
