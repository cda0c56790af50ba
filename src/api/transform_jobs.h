#pragma once
// SageMaker batch transform operations (spec/control-plane-api.md §8.6, §9.3; serving-contract.md
// §13): CreateTransformJob, DescribeTransformJob, ListTransformJobs and StopTransformJob (the API
// has no DeleteTransformJob).
//
// The service model checks shapes before a handler runs (TransformJobName pattern and length,
// the enums, InstanceCount ≥ 1, Environment ≤ 16 entries, JsonPath ≤ 63 characters,
// InvocationsTimeoutInSeconds 1–3600, InvocationsMaxRetries 0–3); Create adds AWS's cross-member
// rules and Kiln's own, the first problem found being the answer:
//   - the model exists ("Could not find model \"<arn>\"."), has one container (PrimaryContainer or
//     one of Containers: inference pipelines are not supported yet) in SingleModel mode;
//   - MaxPayloadInMB 0–100, MaxConcurrentTransforms × MaxPayloadInMB ≤ 100 (AWS's limits), and
//     MaxPayloadInMB 0 only with SplitType None;
//   - BatchStrategy only with a SplitType other than None;
//   - S3DataType S3Prefix or ManifestFile (AugmentedManifestFile is not allowed for transform),
//     s3:// URIs for the input and S3OutputPath;
//   - InputFilter and OutputFilter parse as the JSONPath subset of serving/transform_records.h;
//   - DataCaptureConfig refused ("not supported by Kiln");
//   - an instance type the catalog offers for transform, InstanceCount instances that can ever run
//     here (ResourceLimitExceeded otherwise), tag keys not starting with "aws:".
//
// The row is InProgress with the model's CreateModel request as its state's snapshot; the stored
// request is the validated input with nulls dropped and Tags removed. Describe echoes it with
// TransformJobArn, TransformJobStatus, FailureReason, CreationTime, TransformStartTime and
// TransformEndTime. Errors: a missing job is ValidationException "Could not find requested job with
// name <name>" (Describe and Stop, §7); a taken name ResourceInUse; stopping a job that ended is
// ValidationException (a second stop of a Stopping job is accepted).
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
#include "store/transform_job_repository.h"

namespace kiln::api {

struct TransformJobsContext {
  store::Database* database = nullptr;
  // The transform controller: called after the row is inserted / marked Stopping. May be empty.
  std::function<void(const std::string&name)> on_created, on_stop_requested;
  std::string account_id, region;
  const Clock* clock = nullptr;                       // nullptr: the system clock
  const control::InstanceCatalog* catalog = nullptr;  // nullptr: the built-in catalog
  // Could InstanceCount instances of InstanceType ever run here? ResourceExhausted → the
  // ResourceLimitExceeded answer. Empty: not checked.
  std::function<Status(const std::string& instance_type, int instance_count)> check_feasible;
};

// Registers the four operations on `service` (the SageMaker JsonService).
void RegisterTransformJobOperations(JsonService* service, const TransformJobsContext& context);

// "arn:aws:sagemaker:<region>:<account>:transform-job/<name>" (name as given).
std::string TransformJobArn(const std::string& region, const std::string& account_id, const std::string& name);

// DescribeTransformJob's output for `record`.
nlohmann::json RenderTransformJob(const store::TransformJobRecord& record);

}  // namespace kiln::api
