#pragma once
// SageMaker processing-job operations (spec/control-plane-api.md §8.2, §9.3; training-contract.md
// §17): CreateProcessingJob, DescribeProcessingJob, ListProcessingJobs, StopProcessingJob and
// DeleteProcessingJob. (AddTags/ListTags/DeleteTags resolve processing-job ARNs in
// training_jobs.cc, with every other kind.)
//
// The service model checks shapes before a handler runs (ProcessingJobName pattern and length,
// ≤ 10 inputs and outputs, the enums, InstanceCount 1–100, VolumeSizeInGB 1–16384,
// MaxRuntimeInSeconds 1–777600, Environment ≤ 100 entries of ≤ 256 characters, RoleArn present);
// Create adds the cross-member rules and Kiln's own: unique InputName/OutputName, exactly one of
// S3Input/DatasetDefinition per input (DatasetDefinition refused: Kiln has no Athena or Redshift),
// S3Output on every output (FeatureStoreOutput refused), AppManaged inputs/outputs refused,
// LocalPath under /opt/ml/processing/ without "..", distinct input LocalPaths, s3:// URIs, Gzip
// only with Pipe (AWS's rule), an instance type the catalog offers for processing, and capacity.
//
// The row it inserts is InProgress with an empty state; the stored request is the validated input
// with null members dropped, Tags removed (kept in the tag table) and AWS's defaults filled in, so
// the processing controller reads one form: every input has AppManaged (false) and its S3Input
// S3InputMode ("File"), S3DataDistributionType ("FullyReplicated") and S3CompressionType
// ("None"); every output has AppManaged (false). StoppingCondition stays absent when not given.
//
// Errors: a missing job is ValidationException "Could not find requested job with name <name>"
// for Describe and Stop (§7); DeleteProcessingJob answers ResourceNotFound (same message) and
// ResourceInUse for a job that has not ended, the two errors its API reference lists. A taken
// name is ResourceInUse; a shape the node can never hold is ResourceLimitExceeded; everything else
// ValidationException.
//
// Thread-safety: handlers only use the thread-safe repositories and the context's callbacks.

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "api/json_service.h"
#include "base/status.h"
#include "base/time.h"
#include "control/instance_catalog.h"
#include "store/database.h"
#include "store/processing_job_repository.h"

namespace kiln::api {

struct ProcessingJobsContext {
  store::Database* database = nullptr;
  // The processing controller: called after the row is inserted (Submit) / marked Stopping
  // (RequestStop). Either may be empty (tests).
  std::function<void(const std::string&name)> on_created, on_stop_requested;
  std::string account_id, region;
  const Clock* clock = nullptr;  // nullptr: the system clock
  // Instance types (the `processing` flag of a row); nullptr: the built-in catalog.
  const control::InstanceCatalog* catalog = nullptr;
  // Could InstanceCount instances of InstanceType ever run here (e.g. the training controller's
  // or the scheduler's CheckFeasible)? A ResourceExhausted answer is CreateProcessingJob's
  // ResourceLimitExceeded, with the largest count that fits; empty: not checked.
  std::function<Status(const std::string& instance_type, int instance_count)> check_feasible;
};

// Registers the five operations on `service` (the SageMaker JsonService). `context` members must
// outlive the service.
void RegisterProcessingJobOperations(JsonService* service, const ProcessingJobsContext& context);

// "arn:aws:sagemaker:<region>:<account>:processing-job/<name>" (name as given).
std::string ProcessingJobArn(const std::string& region, const std::string& account_id, const std::string& name);

// DescribeProcessingJob's output for `record`: the stored request's members that Describe returns,
// ProcessingJobArn, ProcessingJobStatus, CreationTime, LastModifiedTime, and — only when set —
// ExitMessage, FailureReason, ProcessingStartTime, ProcessingEndTime. Exposed for tests and for
// Search later.
nlohmann::json RenderProcessingJob(const store::ProcessingJobRecord& record);

}  // namespace kiln::api
