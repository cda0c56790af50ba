#pragma once
// SageMaker training-job operations (spec/control-plane-api.md §8.1, training-contract.md):
// CreateTrainingJob, DescribeTrainingJob, ListTrainingJobs, StopTrainingJob, DeleteTrainingJob,
// UpdateTrainingJob, and the tag operations (AddTags, ListTags, DeleteTags) for every resource
// kind Kiln keeps.
//
// Shape validation (required members, patterns, lengths, ranges, enums) is done by the service
// model before a handler runs (JsonService::SetModel); the handlers add the checks the model
// cannot express (AWS's cross-member rules, Kiln's own requirements, capacity) and answer
// AWS's error codes and messages (§7). Describe renders every member AWS returns that Kiln
// knows, including AWS's defaults for members the request left out.
//
// Thread-safety: handlers only use the thread-safe repository and controller.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "api/json_service.h"
#include "aws/errors.h"
#include "control/instance_catalog.h"
#include "control/training_controller.h"
#include "control/training_queue_view.h"
#include "control/tuning_controller.h"
#include "store/database.h"
#include "store/training_job_repository.h"

namespace kiln::api {

struct TrainingJobsContext {
  store::Database* database = nullptr;
  control::TrainingController* controller = nullptr;
  // Where Describe reads a Pending job's place in line (never stored in its row); nullptr: the
  // controller.
  const control::TrainingQueueView* queue = nullptr;
  std::string account_id;
  std::string region;
  const Clock* clock = nullptr;  // nullptr: the system clock
  // Instance shapes for the distribution checks (vCPUs of a type); nullptr: the built-in catalog.
  const control::InstanceCatalog* catalog = nullptr;
};

// Registers the operations on `service` (the SageMaker JsonService). `context` members must
// outlive the service.
void RegisterTrainingJobOperations(JsonService* service, const TrainingJobsContext& context);

// CreateTrainingJob's checks of the hyperparameters the SDK sets for `distribution`
// (training-contract.md §4.1, §12.2), as a ValidationException that says what to change:
//   - a "sagemaker_*_enabled" key Kiln does not know (a distribution switch it would silently
//     ignore) names the key and the known ones;
//   - sagemaker_mpi_num_of_processes_per_host must be a positive integer, and on a CPU instance
//     type at most its vCPUs (on GPU types more than its GPUs is accepted; the job's Training
//     status message warns).
std::optional<aws::AwsError> CheckDistributionHyperParameters(const nlohmann::json& request,
                                                              const control::InstanceCatalog& catalog);

// CreateTrainingJob's ResourceLimitExceeded: `feasible(type, count)` (the controller's
// CheckFeasible) refuses the shape; for several instances the message also says how many would
// fit (lower ResourceConfig.InstanceCount), or that not even one does.
std::optional<aws::AwsError> CheckCapacity(const std::string& instance_type, int instance_count,
                                           const std::function<Status(const std::string&, int)>& feasible);

// DescribeTrainingJob's output for `record` (exposed for tests and for Search later). While the
// job is Pending, the StatusMessage of its last transition is `queue`'s live message (what it
// waits for and its place in line) when `queue` is given and still has the job queued.
nlohmann::json RenderTrainingJob(const store::TrainingJobRecord& record,
                                 const control::TrainingQueueView* queue = nullptr);

// CreateTrainingJob's checks beyond the service model (members Kiln does not support, the
// algorithm, resources, stopping condition, channels, metric definitions, distribution
// hyperparameters, capacity), in AWS's order, for requests Kiln builds itself: a tuning job's
// trials (TrialRequestFromDefinition). The first problem found is the answer.
std::optional<aws::AwsError> CheckTrainingJobRequest(const nlohmann::json& request, const TrainingJobsContext& context);

// The CreateTrainingJob request of a tuning job's trial (training-contract.md §18): the
// HyperParameterTrainingJobDefinition's members mapped to CreateTrainingJob's
// (HyperParameterTuningResourceConfig → ResourceConfig, its first InstanceConfigs entry when it
// lists several), HyperParameters = StaticHyperParameters + `tuned` + `_tuning_objective_metric`
// (when `objective_metric` is not empty), `TuningJobArn`, and the tuning job's `tags` (AWS adds a
// tuning job's tags to every training job it launches).
nlohmann::json TrialRequestFromDefinition(const nlohmann::json& definition, const std::string& trial_name,
                                          const std::string& tuning_arn,
                                          const std::map<std::string, std::string>& tuned,
                                          const std::string& objective_metric, const nlohmann::json& tags);

// The ResourceConfig a trial runs with, from a definition's HyperParameterTuningResourceConfig: its
// plain members, or its first InstanceConfigs entry (AllocationStrategy Prioritized: Kiln takes the
// first), with VolumeKmsKeyId. An empty object when it names no resources.
nlohmann::json ResourceConfigFromTuningResources(const nlohmann::json& tuning_resources);

// Creates a training job from a request as CreateTrainingJob does (CheckTrainingJobRequest, Kiln's
// tags, the row, the tags, Submit), without the service model's shape check: for requests Kiln
// built. Returns the job's ARN, or the AWS error CreateTrainingJob would answer.
Result<std::string> CreateTrainingJobFromRequest(const TrainingJobsContext& context, const nlohmann::json& request,
                                                 aws::AwsError* error);

// StopTrainingJob's effect (status Stopping, a user stop request, the controller told) for Kiln's
// own stops (a tuning job's early stopping). FailedPrecondition when the job is not InProgress,
// NotFound when there is none.
Status StopTrainingJobByName(const TrainingJobsContext& context, const std::string& name);

// A tuning job's trials as the API creates and stops training jobs (the three functions above).
class TrainingJobTrialLauncher : public control::TrialLauncher {
 public:
  explicit TrainingJobTrialLauncher(TrainingJobsContext context) : context_(std::move(context)) {}
  Status Create(const Trial& trial) override;
  Status Stop(const std::string& training_job_name) override;

 private:
  TrainingJobsContext context_;
};

}  // namespace kiln::api
