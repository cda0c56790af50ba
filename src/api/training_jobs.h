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

#include <string>

#include <nlohmann/json.hpp>

#include "api/json_service.h"
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
};

// Registers the operations on `service` (the SageMaker JsonService). `context` members must
// outlive the service.
void RegisterTrainingJobOperations(JsonService* service, const TrainingJobsContext& context);

// DescribeTrainingJob's output for `record` (exposed for tests and for Search later). While the
// job is Pending, the StatusMessage of its last transition is `queue`'s live message (what it
// waits for and its place in line) when `queue` is given and still has the job queued.
nlohmann::json RenderTrainingJob(const store::TrainingJobRecord& record,
                                 const control::TrainingQueueView* queue = nullptr);

}  // namespace kiln::api
