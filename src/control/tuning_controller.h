#pragma once
// TuningController: runs hyperparameter tuning jobs (spec/control-plane-api.md §8.7, §9.3;
// training-contract.md §18). The API validates a CreateHyperParameterTuningJob request, inserts
// its row (InProgress, no trials) and calls Submit(); from then on this controller owns the job:
//
//   every wake (Submit, RequestStop, or at most `tick` apart), for each tuning job InProgress or
//   Stopping:
//     1. refresh its unfinished trials from their training-job rows (status, failure, final
//        objective) and the metric store (the objective's intermediate values, one per report);
//     2. judge the running trials: TrainingJobEarlyStoppingType Auto → the median rule, Hyperband →
//        its rungs (tuning_stopping.h); a trial judged poor is stopped like StopTrainingJob;
//     3. the completion criteria (TargetObjectiveMetricValue, BestObjectiveNotImproving,
//        ConvergenceDetected), MaxRuntimeInSeconds and a user's stop end the search: running
//        trials are stopped;
//     4. otherwise launch trials up to MaxParallelTrainingJobs running and MaxNumberOfTrainingJobs
//        created, each configuration chosen by the job's strategy (tuning_strategy.h) from every
//        observation so far (this job's trials, running ones as pending, and the warm-start
//        parents' trials);
//     5. when every trial has ended and nothing more will be launched, the job ends: Stopped (a
//        user's stop), Failed (no trial reported the objective and too many failed) or Completed.
//
// Trials are ordinary training jobs created through a TrialLauncher (the API layer's
// CreateTrainingJob path, so they are validated, scheduled, logged, tagged and reachable exactly
// like any other job). A trial is written into the tuning job's row BEFORE its training job is
// created, so a server that dies in between finds the name on restart and creates it then; every
// other fact is re-read from the rows, so a restarted server resumes every job where it was.
//
// Objectives are handled as losses (lower is better): Maximize values are negated before the
// strategy and the stopping rules see them; rows keep the metric's own values.
//
// Thread-safety: public methods may be called from any thread. One thread (started by Start())
// reconciles; `mutex_` guards only the wake flag and the per-job caches it alone touches are
// owned by that thread.

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/mutex.h"
#include "base/status.h"
#include "base/time.h"
#include "observe/metric_store.h"
#include "store/database.h"
#include "store/tuning_job_repository.h"

namespace kiln::control {

// What a tuning job asks of the training side. Implemented by the API layer
// (api/training_jobs.h: TrialRequestFromDefinition, CreateTrainingJobFromRequest,
// StopTrainingJobByName).
class TrialLauncher {
 public:
  struct Trial {
    nlohmann::json definition;  // the HyperParameterTrainingJobDefinition
    std::string name;           // <tuning>-NNN-xxxxxxxx
    std::string tuning_arn;
    std::map<std::string, std::string> tuned;
    std::string objective_metric;  // "" when the job has no objective
    nlohmann::json tags;           // the tuning job's tags (a list of {Key, Value})
  };
  virtual ~TrialLauncher() = default;
  // Creates the trial's training job. AlreadyExists when a job of that name exists; any other
  // error's message is what CreateTrainingJob would have answered.
  virtual Status Create(const Trial& trial) = 0;
  // Stops a running training job as StopTrainingJob does. FailedPrecondition when it is no longer
  // InProgress (it ended meanwhile), NotFound when there is none.
  virtual Status Stop(const std::string& training_job_name) = 0;
};

struct TuningControllerOptions {
  std::chrono::milliseconds tick{500};    // the longest wait between passes
  int max_number_of_training_jobs = 500;  // Kiln's cap: the default when ResourceLimits has none
  std::string region;
  std::string account_id;
};

struct TuningControllerDeps {
  store::Database* database = nullptr;
  observe::MetricStore* metric_store = nullptr;  // intermediate objective values (may be null)
  TrialLauncher* launcher = nullptr;
  const Clock* clock = nullptr;  // nullptr: the system clock
};

class TuningController {
 public:
  TuningController(TuningControllerOptions options, TuningControllerDeps deps);
  ~TuningController();
  TuningController(const TuningController&) = delete;
  TuningController& operator=(const TuningController&) = delete;

  // Starts the reconciling thread (it resumes every job InProgress or Stopping).
  Status Start() EXCLUDES(mutex_);
  // Stops the thread; trials keep running under the training controller.
  void Shutdown() EXCLUDES(mutex_);

  // A tuning job row was inserted / marked Stopping: reconcile soon.
  void Submit(const std::string& name) EXCLUDES(mutex_);
  void RequestStop(const std::string& name) EXCLUDES(mutex_);

  // One pass over every active tuning job (the thread's body; public for tests, which drive the
  // controller without its thread).
  void ReconcileAll();

  struct ParsedJob;  // the request, parsed once per job (tuning_controller.cc)

 private:
  void Run() EXCLUDES(mutex_);
  // Reconciles one job; an exception (a request no check foresaw) fails that job.
  void Reconcile(const store::TuningJobRecord& record);
  void ReconcileJob(const store::TuningJobRecord& record);
  int64_t NowMillis() const;

  TuningControllerOptions options_;
  TuningControllerDeps deps_;
  Mutex mutex_;
  CondVar wake_;
  bool wake_requested_ GUARDED_BY(mutex_) = false;
  bool stopping_ GUARDED_BY(mutex_) = false;
  std::thread thread_;
  // Owned by the reconciling thread (or a test's caller): parsed requests by "<name>@<creation>".
  std::map<std::string, std::shared_ptr<ParsedJob>> parsed_;
};

// The tuning job ARN: arn:aws:sagemaker:<region>:<account>:hyper-parameter-tuning-job/<name>, the
// name kept as created (control-plane-api.md §5: AWS has lower-cased some; Kiln never does).
std::string TuningJobArn(const std::string& region, const std::string& account_id, const std::string& name);

}  // namespace kiln::control
