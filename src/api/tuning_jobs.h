#pragma once
// SageMaker hyperparameter tuning operations (spec/control-plane-api.md §8.7, §9.3;
// training-contract.md §18): CreateHyperParameterTuningJob, DescribeHyperParameterTuningJob,
// ListHyperParameterTuningJobs, StopHyperParameterTuningJob, DeleteHyperParameterTuningJob and
// ListTrainingJobsForHyperParameterTuningJob.
//
// The service model checks shapes before a handler runs; Create adds AWS's cross-member rules
// and Kiln's own (one of TrainingJobDefinition/TrainingJobDefinitions, parameter ranges that
// parse, an objective defined by the algorithm's MetricDefinitions, Grid and Hyperband rules,
// Kiln's caps, warm-start parents) and checks each definition as CreateTrainingJob would check
// the trials it becomes, so that a bad definition fails the create rather than every trial.
// The row it inserts is InProgress with an empty state; the tuning controller (the lead's
// control/tuning_controller) launches the trials and writes their progress into the row's
// state, from which Describe and the lists compute counters, the best trial and summaries.
//
// The stored request is the validated input with AWS's defaults filled in, so the controller
// reads one form: HyperParameterTuningJobConfig.ResourceLimits.MaxNumberOfTrainingJobs (Grid:
// the number of grid points) and TrainingJobEarlyStoppingType ("Off"). Its Tags are kept in the
// tag table (store::TagRepository, keyed by the ARN), not in the request, as for training jobs.
//
// Errors: a missing tuning job is ResourceNotFound "Amazon SageMaker can't find a tuning job
// with name <name>" (§7) for Describe, Stop, Delete and ListTrainingJobsFor...; a taken name is
// ResourceInUse; Kiln's caps are ResourceLimitExceeded; everything else ValidationException.
//
// Thread-safety: handlers only use the thread-safe repositories and the context's callbacks.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/json_service.h"
#include "api/training_jobs.h"
#include "aws/errors.h"
#include "base/time.h"
#include "control/instance_catalog.h"
#include "control/training_controller.h"
#include "store/database.h"
#include "store/tuning_job_repository.h"

namespace kiln::api {

struct TuningJobsContext {
  store::Database* database = nullptr;
  // What CreateTrainingJob's checks of each definition need (CheckTrainingJobRequest): the
  // training controller's CheckFeasible for capacity, the catalog. Its database, account, region
  // and clock are taken from the members below when unset.
  TrainingJobsContext training_context;
  // The training controller (capacity); copied into training_context.controller when that is unset.
  control::TrainingController* training = nullptr;
  // The tuning controller: called after the row is inserted / marked Stopping. Either may be empty
  // (tests).
  std::function<void(const std::string&name)> on_created, on_stop_requested;
  std::string account_id, region;
  const Clock* clock = nullptr;  // nullptr: the system clock
  // Kiln's caps (spec/limits.md, configurable): larger ResourceLimits are ResourceLimitExceeded.
  int max_parallel_training_jobs = 100;
  int max_number_of_training_jobs = 500;
  // Copied into training_context.catalog when that is unset; nullptr: the built-in catalog.
  const control::InstanceCatalog* catalog = nullptr;
};

// Registers the six operations on `service` (the SageMaker JsonService). `context` members must
// outlive the service.
void RegisterTuningJobOperations(JsonService* service, const TuningJobsContext& context);

// DescribeHyperParameterTuningJob's output for `record`. `parents`: the warm-start parents'
// records that still exist (OverallBestTrainingJob looks at their trials too); `region` and
// `account_id` make the trials' ARNs; `now_millis` is the end of a running job's
// ConsumedResources.RuntimeInSeconds. Exposed for tests and for Search later.
nlohmann::json RenderTuningJob(const store::TuningJobRecord& record, const std::vector<store::TuningJobRecord>& parents,
                               const std::string& region, const std::string& account_id, int64_t now_millis);

// The HyperParameterTrainingJobSummary of trial `trial` of `record` (ListTrainingJobsFor...,
// BestTrainingJob): ObjectiveStatus Pending while the trial runs (InProgress, Stopping),
// Succeeded when it ended Completed or Stopped with an objective value (a tuning job without an
// objective: Completed), Failed otherwise.
nlohmann::json RenderTrialSummary(const store::TuningJobRecord& record, const store::TuningTrial& trial,
                                  const std::string& region, const std::string& account_id);

}  // namespace kiln::api
