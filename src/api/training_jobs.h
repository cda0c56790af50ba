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
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "api/json_service.h"
#include "aws/errors.h"
#include "control/instance_catalog.h"
#include "control/training_controller.h"
#include "control/training_queue_view.h"
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

}  // namespace kiln::api
