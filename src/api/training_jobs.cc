#include "api/training_jobs.h"

#include "agent/artifacts.h"
#include "api/errors.h"
#include "api/paging.h"

#include <algorithm>
#include <set>

#include "base/encoding.h"
#include "base/hash.h"
#include "base/json_parse.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/time.h"
#include "observe/metric_extractor.h"
#include "control/training_hold.h"
#include "control/training_plan.h"
#include "control/training_states.h"
#include "control/warm_pools.h"
#include "store/endpoint_repository.h"
#include "store/processing_job_repository.h"
#include "store/transform_job_repository.h"
#include "store/tuning_job_repository.h"

namespace kiln::api {
namespace {

using nlohmann::json;

constexpr size_t kMaxTagsPerResource = 50;

aws::AwsError Validation(std::string message) { return aws::AwsError("ValidationException", std::move(message)); }

json Seconds(int64_t millis) { return static_cast<double>(millis) / 1000.0; }

// A duration in whole seconds, rounded up, at least 1.
int64_t WholeSecondsUp(int64_t millis) { return std::max<int64_t>(1, (millis + 999) / 1000); }

int64_t NowOf(const TrainingJobsContext& c) { return c.clock ? c.clock->NowMillis() : Clock::System().NowMillis(); }

std::string TrainingJobArn(const TrainingJobsContext& c, const std::string& name) {
  return "arn:aws:sagemaker:" + c.region + ":" + c.account_id + ":training-job/" + name;
}

// ModelArtifacts.S3ModelArtifacts is known from creation (§8).
std::string ModelArtifactsUri(const json& request) {
  return agent::ModelArtifactsUri(request.value("OutputDataConfig", json::object()),
                                  request.value("TrainingJobName", ""));
}

// Members AWS accepts for features Kiln does not offer (§8 of the control-plane spec).
constexpr const char* kUnsupportedMembers[] = {"ServerlessJobConfig", "MlflowConfig", "SessionChainingConfig"};

// AlgorithmSpecification: an image to run (Kiln registers no algorithms) and its input mode.
std::optional<aws::AwsError> CheckAlgorithm(const json& algorithm) {
  if (!algorithm.is_object()) {
    return Validation(
        "AlgorithmSpecification is required: Kiln runs training images, so give "
        "AlgorithmSpecification.TrainingImage and AlgorithmSpecification.TrainingInputMode.");
  }
  if (algorithm.contains("AlgorithmName") && !algorithm["AlgorithmName"].is_null()) {
    return Validation(
        "AlgorithmSpecification.AlgorithmName is not supported by Kiln (no algorithms are registered); "
        "give AlgorithmSpecification.TrainingImage instead.");
  }
  if (!algorithm.contains("TrainingImage") || !algorithm["TrainingImage"].is_string() ||
      algorithm["TrainingImage"].get<std::string>().empty()) {
    return Validation("AlgorithmSpecification.TrainingImage is required: Kiln runs training images.");
  }
  if (!algorithm.contains("TrainingInputMode")) {
    return Validation("AlgorithmSpecification.TrainingInputMode is required (File, Pipe or FastFile).");
  }
  return std::nullopt;
}

// ResourceConfig: one homogeneous cluster of at least one instance with a volume.
std::optional<aws::AwsError> CheckResourceConfig(const json& rc) {
  if (!rc.is_object()) {
    return Validation(
        "ResourceConfig is required: give ResourceConfig.InstanceType, InstanceCount and VolumeSizeInGB.");
  }
  if (rc.contains("InstanceGroups") && !rc["InstanceGroups"].is_null()) {
    return Validation(
        "ResourceConfig.InstanceGroups (heterogeneous clusters) is not supported by Kiln yet; give "
        "ResourceConfig.InstanceType and InstanceCount.");
  }
  for (const char* member : {"InstanceType", "InstanceCount", "VolumeSizeInGB"}) {
    if (!rc.contains(member) || rc[member].is_null()) {
      return Validation(std::string("ResourceConfig.") + member + " is required.");
    }
  }
  // The model relaxed these minimums to 0 for serverless jobs, which Kiln does not offer; a
  // training cluster needs at least one instance with a volume.
  if (rc["InstanceCount"].get<int64_t>() < 1) {
    return Validation("1 validation error detected: Value '" + rc["InstanceCount"].dump() +
                      "' at 'resourceConfig.instanceCount' failed to satisfy constraint: Member must have value "
                      "greater than or equal to 1");
  }
  if (rc["VolumeSizeInGB"].get<int64_t>() < 1) {
    return Validation("1 validation error detected: Value '" + rc["VolumeSizeInGB"].dump() +
                      "' at 'resourceConfig.volumeSizeInGB' failed to satisfy constraint: Member must have value "
                      "greater than or equal to 1");
  }
  return std::nullopt;
}

// A boolean member of a request; absent, null (or not a boolean) reads as false.
bool FlagOf(const json& in, const char* member) {
  auto it = in.find(member);
  return it != in.end() && it->is_boolean() && it->get<bool>();
}

// An integer member of StoppingCondition; absent or null reads as `absent` (the model has checked
// the type and range).
int64_t SecondsOf(const json& sc, const char* member, int64_t absent) {
  auto it = sc.find(member);
  return it != sc.end() && it->is_number() ? it->get<int64_t>() : absent;
}

// Stopping conditions (training-contract.md §9, §10): MaxWaitTimeInSeconds goes with managed spot
// training, and is at least MaxRuntimeInSeconds. The range (>= 1) is the service model's check,
// answered before this one. The wording is AWS's where it is known ("only supported when ...",
// as AWS answers it, without a final period) and in the same form where it is not.
std::optional<aws::AwsError> CheckStoppingCondition(const json& in) {
  json sc = in.value("StoppingCondition", json::object());
  if (!sc.is_object()) sc = json::object();
  const bool spot = FlagOf(in, "EnableManagedSpotTraining");
  const bool has_wait = sc.contains("MaxWaitTimeInSeconds") && !sc["MaxWaitTimeInSeconds"].is_null();
  if (has_wait && !spot) {
    return Validation(
        "Invalid MaxWaitTimeInSeconds. It is only supported when EnableManagedSpotTraining is set to true");
  }
  if (spot && !has_wait) {
    return Validation("Invalid MaxWaitTimeInSeconds. It must be present when EnableManagedSpotTraining is set to true");
  }
  if (has_wait && SecondsOf(sc, "MaxWaitTimeInSeconds", 0) < SecondsOf(sc, "MaxRuntimeInSeconds", 86400)) {
    return Validation("Invalid MaxWaitTimeInSeconds. It must be greater than or equal to MaxRuntimeInSeconds");
  }
  return std::nullopt;
}

// Warm pools (training-contract.md §19) are for on-demand, homogeneous clusters, as on AWS: a
// keep-alive period with managed spot or with instance groups is refused.
std::optional<aws::AwsError> CheckKeepAlive(const json& in) {
  if (control::KeepAliveSeconds(in) <= 0) return std::nullopt;
  if (FlagOf(in, "EnableManagedSpotTraining")) {
    return Validation(
        "Invalid KeepAlivePeriodInSeconds. Warm pools are not supported with managed spot training; remove "
        "ResourceConfig.KeepAlivePeriodInSeconds or set EnableManagedSpotTraining to false");
  }
  const json rc = in.value("ResourceConfig", json::object());
  if (rc.is_object() && rc.contains("InstanceGroups") && !rc["InstanceGroups"].is_null()) {
    return Validation(
        "Invalid KeepAlivePeriodInSeconds. Warm pools are not supported for heterogeneous clusters "
        "(ResourceConfig.InstanceGroups); use InstanceType and InstanceCount, or remove KeepAlivePeriodInSeconds");
  }
  return std::nullopt;
}

// WarmPoolStatus of Describe and of a List summary; null when the job has no warm pool.
json WarmPoolStatusJson(const std::string& status, int64_t retained_millis, const std::string& reused_by_job) {
  if (status.empty()) return json();
  json out = {{"Status", status}};
  // The billable retained time once the pool is over (Reused or Terminated), in whole seconds.
  if (status == "Reused" || status == "Terminated")
    out["ResourceRetainedBillableTimeInSeconds"] = retained_millis / 1000;
  if (!reused_by_job.empty()) out["ReusedByJob"] = reused_by_job;
  return out;
}

// Channels: unique names, mode/source combinations AWS refuses, sources Kiln does not read yet.
// `default_mode` is AlgorithmSpecification.TrainingInputMode.
std::optional<aws::AwsError> CheckChannels(const json& in, const std::string& default_mode) {
  std::set<std::string> names;
  for (const json& channel : in.value("InputDataConfig", json::array())) {
    std::string name = channel.value("ChannelName", "");
    if (!names.insert(name).second) {
      return Validation("Channel names must be unique. Channel '" + name + "' is given more than once.");
    }
    std::string mode = channel.value("InputMode", default_mode);
    const json ds = channel.value("DataSource", json::object());
    if (ds.contains("FileSystemDataSource") && mode != "File") {
      return Validation("Channel '" + name + "': FileSystemDataSource requires InputMode File.");
    }
    if (ds.contains("FileSystemDataSource")) {
      return Validation("Channel '" + name + "': FileSystemDataSource (EFS/FSx) is not supported by Kiln yet.");
    }
    const json s3 = ds.value("S3DataSource", json::object());
    const std::string type = s3.value("S3DataType", "");
    if (mode == "FastFile" && type != "S3Prefix") {
      return Validation("Channel '" + name + "': FastFile input mode requires S3DataType S3Prefix.");
    }
    if (type == "AugmentedManifestFile" && mode != "Pipe") {
      return Validation("Channel '" + name + "': AugmentedManifestFile requires InputMode Pipe.");
    }
    if (type == "AugmentedManifestFile") {
      return Validation("Channel '" + name + "': AugmentedManifestFile is not supported by Kiln yet.");
    }
    std::string compression = channel.value("CompressionType", "None");
    if (compression != "None" && mode != "Pipe") {
      return Validation("Channel '" + name + "': CompressionType " + compression +
                        " is only supported in Pipe input mode; use CompressionType None.");
    }
  }
  return std::nullopt;
}

// The distribution switches the SageMaker Python SDK sets (training-contract.md §4.1, §12.2;
// estimator.py, pytorch/estimator.py), and the Training Compiler's, which is no distribution but
// has the same form.
constexpr const char* kKnownEnabledSwitches[] = {
    "sagemaker_distributed_dataparallel_enabled",
    "sagemaker_mpi_enabled",
    "sagemaker_multi_worker_mirrored_strategy_enabled",
    "sagemaker_parameter_server_enabled",
    "sagemaker_pytorch_ddp_enabled",
    "sagemaker_pytorch_xla_multi_worker_enabled",
    "sagemaker_torch_distributed_enabled",
    "sagemaker_training_compiler_enabled",
};

}  // namespace

std::optional<aws::AwsError> CheckDistributionHyperParameters(const json& in, const control::InstanceCatalog& catalog) {
  const json hps = in.value("HyperParameters", json::object());
  if (!hps.is_object()) return std::nullopt;
  for (auto it = hps.begin(); it != hps.end(); ++it) {
    const std::string& key = it.key();
    if (!key.starts_with("sagemaker_") || !key.ends_with("_enabled")) continue;
    if (std::find_if(std::begin(kKnownEnabledSwitches), std::end(kKnownEnabledSwitches),
                     [&](const char* known) { return key == known; }) != std::end(kKnownEnabledSwitches)) {
      continue;
    }
    std::vector<std::string> known(std::begin(kKnownEnabledSwitches), std::end(kKnownEnabledSwitches));
    return Validation("HyperParameters." + key +
                      " is not a distribution Kiln knows, so it would be ignored. Remove it, or use one of: " +
                      Join(known, ", ") + " (set by the SageMaker Python SDK's distribution argument).");
  }
  const std::string ppn_key = control::training::kMpiProcessesPerHost;
  if (!hps.contains(ppn_key)) return std::nullopt;
  const std::optional<int64_t> processes = control::training::MpiProcessesPerHost(in);
  if (!processes) {
    return Validation("HyperParameters." + ppn_key + " must be a positive integer (processes per host of the MPI " +
                      "launch), got " + hps[ppn_key].dump() + ".");
  }
  const std::string type = in.value("ResourceConfig", json::object()).value("InstanceType", "");
  const control::InstanceShape* shape = catalog.Find(type);
  if (shape != nullptr && shape->gpus == 0 && shape->vcpus > 0 && *processes > shape->vcpus) {
    return Validation("HyperParameters." + ppn_key + " is " + std::to_string(*processes) + " but " + type + " has " +
                      std::to_string(shape->vcpus) + " vCPUs: set it to at most " + std::to_string(shape->vcpus) +
                      ", or choose a larger ResourceConfig.InstanceType.");
  }
  return std::nullopt;
}

std::optional<aws::AwsError> CheckCapacity(const std::string& instance_type, int instance_count,
                                           const std::function<Status(const std::string&, int)>& feasible) {
  Status status = feasible(instance_type, instance_count);
  if (status.ok()) return std::nullopt;
  std::string message = status.message();
  if (instance_count > 1 && status.code() == StatusCode::kResourceExhausted) {
    // The largest count that fits (feasibility is monotonic in the count): bisect [0, count).
    int low = 0, high = instance_count;  // low fits (0 trivially), high does not
    while (high - low > 1) {
      const int mid = low + (high - low) / 2;
      (feasible(instance_type, mid).ok() ? low : high) = mid;
    }
    message += low > 0 ? "; or lower ResourceConfig.InstanceCount to at most " + std::to_string(low) + " (" +
                             std::to_string(low) + " x " + instance_type + " fit on this node)"
                       : "; ResourceConfig.InstanceCount " + std::to_string(instance_count) +
                             " cannot run here: not even one " + instance_type + " fits on this node";
  }
  return aws::AwsError("ResourceLimitExceeded", message);
}

namespace {

// The checks of CreateTrainingJob the service model cannot express, in AWS's order; the first
// problem found is the answer.
std::optional<aws::AwsError> CheckCreateRequest(const json& in, control::TrainingController* controller,
                                                const control::InstanceCatalog& catalog) {
  for (const char* member : kUnsupportedMembers) {
    if (in.contains(member) && !in[member].is_null())
      return Validation(std::string(member) + " is not supported by Kiln.");
  }
  const json algorithm = in.value("AlgorithmSpecification", json());
  if (auto error = CheckAlgorithm(algorithm)) return error;
  const json rc = in.value("ResourceConfig", json());
  if (auto error = CheckResourceConfig(rc)) return error;
  if (auto error = CheckStoppingCondition(in)) return error;
  if (auto error = CheckKeepAlive(in)) return error;
  if (auto error = CheckChannels(in, algorithm.value("TrainingInputMode", "File"))) return error;
  if (algorithm.contains("MetricDefinitions")) {
    auto extractor =
        observe::MetricExtractor::Create(control::MetricDefinitionsFromJson(algorithm["MetricDefinitions"]));
    if (!extractor.ok()) return Validation(extractor.status().message());
  }
  if (auto error = CheckDistributionHyperParameters(in, catalog)) return error;
  return CheckCapacity(
      rc["InstanceType"].get<std::string>(), rc["InstanceCount"].get<int>(),
      [controller](const std::string& type, int count) { return controller->CheckFeasible(type, count); });
}

// AWS fills these defaults into what Describe returns.
json WithChannelDefaults(json channels) {
  for (json& channel : channels) {
    if (!channel.contains("CompressionType")) channel["CompressionType"] = "None";
    if (!channel.contains("RecordWrapperType")) channel["RecordWrapperType"] = "None";
    if (channel.contains("DataSource") && channel["DataSource"].contains("S3DataSource")) {
      json& s3 = channel["DataSource"]["S3DataSource"];
      if (!s3.contains("S3DataDistributionType")) s3["S3DataDistributionType"] = "FullyReplicated";
    }
  }
  return channels;
}

}  // namespace

json RenderTrainingJob(const store::TrainingJobRecord& record, const control::TrainingQueueView* queue) {
  const json& in = record.request;
  const store::TrainingJobState& state = record.state;
  json out = json::object();
  out["TrainingJobName"] = record.name;
  out["TrainingJobArn"] = record.arn;
  if (in.contains("TuningJobArn")) out["TuningJobArn"] = in["TuningJobArn"];
  out["ModelArtifacts"] = {{"S3ModelArtifacts", ModelArtifactsUri(in)}};
  out["TrainingJobStatus"] = store::ToString(record.status);
  out["SecondaryStatus"] = store::ToString(record.secondary_status);
  if (state.failure_reason) out["FailureReason"] = *state.failure_reason;
  out["HyperParameters"] = in.value("HyperParameters", json::object());
  json algorithm = in.value("AlgorithmSpecification", json::object());
  if (!algorithm.contains("EnableSageMakerMetricsTimeSeries")) algorithm["EnableSageMakerMetricsTimeSeries"] = false;
  out["AlgorithmSpecification"] = algorithm;
  if (in.contains("RoleArn")) out["RoleArn"] = in["RoleArn"];
  if (in.contains("InputDataConfig")) out["InputDataConfig"] = WithChannelDefaults(in["InputDataConfig"]);
  json output_config = in.value("OutputDataConfig", json::object());
  if (!output_config.contains("CompressionType")) output_config["CompressionType"] = "GZIP";
  // AWS always answers KmsKeyId ("" when none was given); the SageMaker Python SDK's
  // Estimator.attach reads it without a default and fails with KeyError when it is missing.
  if (!output_config.contains("KmsKeyId")) output_config["KmsKeyId"] = "";
  out["OutputDataConfig"] = output_config;
  out["ResourceConfig"] = in.value("ResourceConfig", json::object());
  json stopping = in.value("StoppingCondition", json::object());
  if (!stopping.contains("MaxRuntimeInSeconds")) stopping["MaxRuntimeInSeconds"] = 86400;
  out["StoppingCondition"] = stopping;
  out["CreationTime"] = Seconds(record.creation_millis);
  if (state.training_start_millis) out["TrainingStartTime"] = Seconds(*state.training_start_millis);
  if (record.training_end_millis) out["TrainingEndTime"] = Seconds(*record.training_end_millis);
  out["LastModifiedTime"] = Seconds(record.last_modified_millis);
  json transitions = json::array();
  for (const store::SecondaryStatusTransition& t : state.transitions) {
    json entry = {
        {"Status", store::ToString(t.status)}, {"StartTime", Seconds(t.start_millis)}, {"StatusMessage", t.message}};
    if (t.end_millis) entry["EndTime"] = Seconds(*t.end_millis);
    transitions.push_back(entry);
  }
  // The place in line changes with every grant and is not in the row: read it from the queue.
  if (queue != nullptr && record.secondary_status == store::SecondaryStatus::kPending && !state.transitions.empty() &&
      state.transitions.back().status == store::SecondaryStatus::kPending) {
    if (std::string live = queue->PendingMessage(record.name); !live.empty()) {
      transitions.back()["StatusMessage"] = std::move(live);
    }
  }
  out["SecondaryStatusTransitions"] = transitions;
  json metrics = json::array();
  for (const auto& [name, point] : state.final_metrics) {
    metrics.push_back({{"MetricName", name}, {"Value", point.value}, {"Timestamp", Seconds(point.timestamp_millis)}});
  }
  out["FinalMetricDataList"] = metrics;
  for (const char* flag :
       {"EnableNetworkIsolation", "EnableInterContainerTrafficEncryption", "EnableManagedSpotTraining"}) {
    out[flag] = FlagOf(in, flag);
  }
  // Once the job has ended: TrainingTimeInSeconds is the wall time from the first start to the end;
  // BillableTimeInSeconds is the same for an on-demand job and, for a managed-spot job, the
  // running time of all its attempts (state.billable_millis; training-contract.md §9). Both are
  // whole seconds rounded up, as AWS bills (a job that ran at all ran at least 1 s). A spot job's
  // row written before billable_millis existed shows its training time as billable.
  if (state.training_start_millis) {
    int64_t start = *state.training_start_millis;
    int64_t end = record.training_end_millis.value_or(0);
    if (end >= start && end > 0) {
      const int64_t seconds = WholeSecondsUp(end - start);
      out["TrainingTimeInSeconds"] = seconds;
      const bool spot = FlagOf(in, "EnableManagedSpotTraining");
      out["BillableTimeInSeconds"] =
          spot && state.billable_millis > 0 ? WholeSecondsUp(state.billable_millis) : seconds;
    }
  }
  const store::WarmPoolState& pool = state.warm_pool;
  if (json w = WarmPoolStatusJson(std::string(store::ToString(pool.status)), pool.retained_millis, pool.reused_by_job);
      !w.is_null()) {
    out["WarmPoolStatus"] = std::move(w);
  }
  for (const char* member :
       {"VpcConfig", "CheckpointConfig", "DebugHookConfig", "DebugRuleConfigurations", "TensorBoardOutputConfig",
        "ExperimentConfig", "ProfilerConfig", "ProfilerRuleConfigurations", "Environment", "RetryStrategy",
        "RemoteDebugConfig", "InfraCheckConfig"}) {
    if (in.contains(member) && !in[member].is_null()) out[member] = in[member];
  }
  return out;
}

namespace {

// "arn:aws:sagemaker:<r>:<a>:<kind>/<name>" → name (case kept) when the ARN is of `kind`
// ("training-job", "model", "endpoint-config", "endpoint"; matched case-insensitively).
std::optional<std::string> NameFromArn(const std::string& arn, const std::string& kind) {
  const std::string marker = ":" + kind + "/";
  std::string lower = ToLower(arn);
  if (!StartsWith(lower, "arn:aws:sagemaker:")) return std::nullopt;
  size_t at = lower.find(marker);
  if (at == std::string::npos) return std::nullopt;
  return arn.substr(at + marker.size());
}

// What the operations share: the context and the repositories they read and write.
struct Operations {
  explicit Operations(const TrainingJobsContext& context)
      : ctx(context),
        jobs(context.database),
        tags(context.database),
        models(context.database, store::DefinitionRepository::Kind::kModel),
        configs(context.database, store::DefinitionRepository::Kind::kEndpointConfig),
        endpoints(context.database) {
    if (ctx.queue == nullptr) ctx.queue = ctx.controller;
  }
  TrainingJobsContext ctx;
  store::TrainingJobRepository jobs;
  store::TagRepository tags;
  store::DefinitionRepository models;
  store::DefinitionRepository configs;
  store::EndpointRepository endpoints;
};

// The row CreateTrainingJob inserts: queued (InProgress/Starting), the request without its Tags
// (kept in the tag table; Describe does not return them).
store::TrainingJobRecord NewJobRecord(const Operations& ops, const json& in, int64_t now) {
  const std::string name = in["TrainingJobName"].get<std::string>();
  store::TrainingJobRecord record;
  record.name = name;
  record.arn = TrainingJobArn(ops.ctx, name);
  record.request = in;
  record.request.erase("Tags");
  record.status = store::TrainingJobStatus::kInProgress;  // phase: queued (the default; the controller's)
  record.creation_millis = now;
  control::RecordSecondaryStatus(record, store::SecondaryStatus::kStarting, "Starting the training job", now);
  return record;
}

JsonOutcome CreateTrainingJob(Operations& ops, const json& in) {
  if (auto error = CheckCreateRequest(in, ops.ctx.controller,
                                      ops.ctx.catalog ? *ops.ctx.catalog : control::InstanceCatalog::BuiltIn())) {
    return *error;
  }
  if (in.contains("Tags") && in["Tags"].is_array()) {
    // Kiln's own tags are checked here, so that a bad value fails the create, not the job.
    std::vector<store::Tag> tags;
    for (const json& t : in["Tags"]) tags.push_back({t.value("Key", ""), t.value("Value", "")});
    if (auto hold = control::HoldStartSeconds(tags); !hold.ok()) return Validation(hold.status().message());
    if (auto idle = control::IdleStopSeconds(tags); !idle.ok()) return Validation(idle.status().message());
    if (auto hold = control::HoldExitSeconds(tags); !hold.ok()) return Validation(hold.status().message());
  }
  store::TrainingJobRecord record = NewJobRecord(ops, in, NowOf(ops.ctx));
  Status inserted = ops.jobs.Insert(record);
  if (inserted.IsAlreadyExists()) {
    return aws::AwsError("ResourceInUse",
                         "Training job names must be unique within an AWS account and region, and a training job "
                         "with this name already exists (" +
                             inserted.message() + ")");
  }
  if (!inserted.ok()) return AwsErrorFromStatus(inserted, ErrorService::kSageMaker);
  if (in.contains("Tags") && in["Tags"].is_array() && !in["Tags"].empty()) {
    std::vector<store::Tag> list;
    for (const json& t : in["Tags"]) list.push_back({t.value("Key", ""), t.value("Value", "")});
    Status tagged = ops.tags.Add(record.arn, list);
    if (!tagged.ok()) KLOG(warn, "tags not stored", {{"job", record.name}, {"error", tagged.ToString()}});
  }
  ops.ctx.controller->Submit(record.name);
  return json{{"TrainingJobArn", record.arn}};
}

JsonOutcome DescribeTrainingJob(Operations& ops, const json& in) {
  auto record = ops.jobs.Get(in["TrainingJobName"].get<std::string>());
  if (record.status().IsNotFound()) return Validation("Requested resource not found.");
  if (!record.ok()) return AwsErrorFromStatus(record.status(), ErrorService::kSageMaker);
  return RenderTrainingJob(*record, ops.ctx.queue);
}

json TrainingJobSummary(const store::TrainingJobSummaryRow& r) {
  json s = {{"TrainingJobName", r.name},
            {"TrainingJobArn", r.arn},
            {"CreationTime", Seconds(r.creation_millis)},
            {"LastModifiedTime", Seconds(r.last_modified_millis)},
            {"TrainingJobStatus", r.status},
            {"SecondaryStatus", r.secondary_status}};
  if (r.training_end_millis) s["TrainingEndTime"] = Seconds(*r.training_end_millis);
  if (json w = WarmPoolStatusJson(r.warm_pool_status, r.warm_pool_retained_millis, r.warm_pool_reused_by_job);
      !w.is_null()) {
    s["WarmPoolStatus"] = std::move(w);
  }
  return s;
}

JsonOutcome ListTrainingJobs(Operations& ops, const json& in) {
  store::ListFilter query = ListFilterFromRequest(in);
  const std::string sort_by = in.value("SortBy", "CreationTime");
  const store::ListSortKey sort_key = sort_by == "Name"     ? store::ListSortKey::kName
                                      : sort_by == "Status" ? store::ListSortKey::kStatus
                                                            : store::ListSortKey::kCreationTime;
  const bool descending = in.value("SortOrder", "Ascending") == "Descending";
  const int64_t now = NowOf(ops.ctx);
  auto parsed = ParseListPaging(in, sort_key, descending, now);
  if (auto* error = std::get_if<aws::AwsError>(&parsed)) return *error;
  ListPaging& paging = std::get<ListPaging>(parsed);
  paging.query.filter = std::move(query);
  if (in.contains("WarmPoolStatusEquals") && in["WarmPoolStatusEquals"].is_string()) {
    paging.query.filter.warm_pool_status_equals = in["WarmPoolStatusEquals"].get<std::string>();
  }
  auto listed = ops.jobs.ListPage(paging.query);
  if (!listed.ok()) return AwsErrorFromStatus(listed.status(), ErrorService::kSageMaker);
  std::vector<store::TrainingJobSummaryRow> rows = std::move(listed).value();
  std::optional<std::string> next_token = CutPage(rows, paging, in, now);
  json summaries = json::array();
  for (const auto& r : rows) summaries.push_back(TrainingJobSummary(r));
  json out = {{"TrainingJobSummaries", summaries}};
  if (next_token) out["NextToken"] = *next_token;
  return out;
}

JsonOutcome StopTrainingJob(Operations& ops, const json& in) {
  const std::string name = in["TrainingJobName"].get<std::string>();
  const int64_t now = NowOf(ops.ctx);
  std::string refused;
  auto updated = ops.jobs.Mutate(name, [&](store::TrainingJobRecord& r) {
    if (r.status != store::TrainingJobStatus::kInProgress) {
      refused =
          "The job status is " + std::string(store::ToString(r.status)) + "; only InProgress jobs can be stopped.";
      return Status::FailedPrecondition(refused);
    }
    // A request for the controller to carry out (RequestStop below); the phase stays its own.
    control::SetStatus(r, store::TrainingJobStatus::kStopping);
    r.state.stop_requested = store::StopRequest::kUser;
    control::RecordSecondaryStatus(r, store::SecondaryStatus::kStopping, "Stopping the training job", now);
    return Status::Ok();
  });
  if (updated.status().IsNotFound()) return Validation("Requested resource not found.");
  if (!refused.empty()) return Validation(refused);
  if (!updated.ok()) return AwsErrorFromStatus(updated.status(), ErrorService::kSageMaker);
  ops.ctx.controller->RequestStop(updated->name);
  return json::object();
}

JsonOutcome DeleteTrainingJob(Operations& ops, const json& in) {
  const std::string name = in["TrainingJobName"].get<std::string>();
  auto record = ops.jobs.Get(name);
  if (record.status().IsNotFound()) return Validation("Requested resource not found.");
  if (!record.ok()) return AwsErrorFromStatus(record.status(), ErrorService::kSageMaker);
  if (store::IsActive(record->status)) {
    return Validation("The training job " + record->name + " is " + std::string(store::ToString(record->status)) +
                      ". Only jobs in a terminal state (Completed, Failed, Stopped) can be deleted; stop it first.");
  }
  if (record->state.warm_pool.status == store::WarmPoolStatus::kAvailable) {
    return Validation("The training job " + record->name +
                      " keeps a warm pool (WarmPoolStatus Available). End it first with UpdateTrainingJob "
                      "ResourceConfig.KeepAlivePeriodInSeconds=0, then delete the job.");
  }
  Status deleted = ops.jobs.Delete(record->name);
  if (!deleted.ok() && !deleted.IsNotFound()) return AwsErrorFromStatus(deleted, ErrorService::kSageMaker);
  return json::object();
}

JsonOutcome UpdateTrainingJob(Operations& ops, const json& in) {
  const std::string name = in["TrainingJobName"].get<std::string>();
  const bool keep_alive_change = in.contains("ResourceConfig") && in["ResourceConfig"].is_object() &&
                                 in["ResourceConfig"].contains("KeepAlivePeriodInSeconds") &&
                                 !in["ResourceConfig"]["KeepAlivePeriodInSeconds"].is_null();
  std::string refused;
  bool pool_available = false;
  auto updated = ops.jobs.Mutate(name, [&](store::TrainingJobRecord& r) {
    // control-plane-api.md §8.1: ResourceConfig while InProgress or while the job's warm pool is
    // Available (how a pool is extended or, with 0, terminated); the rest only while InProgress.
    pool_available = r.state.warm_pool.status == store::WarmPoolStatus::kAvailable;
    if (r.status != store::TrainingJobStatus::kInProgress) {
      bool only_keep_alive = keep_alive_change;
      for (const char* member : {"ProfilerConfig", "ProfilerRuleConfigurations", "RemoteDebugConfig"}) {
        only_keep_alive &= !in.contains(member) || in[member].is_null();
      }
      if (!(only_keep_alive && pool_available)) {
        refused = "The training job " + r.name + " is " + std::string(store::ToString(r.status)) +
                  (pool_available ? "; only its warm pool's ResourceConfig.KeepAlivePeriodInSeconds can be updated."
                                  : "; only InProgress jobs (or the KeepAlivePeriodInSeconds of an Available warm "
                                    "pool) can be updated.");
        return Status::FailedPrecondition(refused);
      }
    }
    if (keep_alive_change) {
      json candidate = r.request;
      candidate["ResourceConfig"]["KeepAlivePeriodInSeconds"] = in["ResourceConfig"]["KeepAlivePeriodInSeconds"];
      if (auto error = CheckKeepAlive(candidate)) {
        refused = error->message;
        return Status::FailedPrecondition(refused);
      }
      r.request = std::move(candidate);
    }
    // The members Kiln keeps: they are echoed by Describe. Profiler settings have no effect on
    // the process runtime.
    for (const char* member : {"ProfilerConfig", "ProfilerRuleConfigurations", "RemoteDebugConfig"}) {
      if (in.contains(member) && !in[member].is_null()) r.request[member] = in[member];
    }
    r.last_modified_millis = NowOf(ops.ctx);
    return Status::Ok();
  });
  if (updated.status().IsNotFound()) return Validation("Requested resource not found.");
  if (!refused.empty()) return Validation(refused);
  if (!updated.ok()) return AwsErrorFromStatus(updated.status(), ErrorService::kSageMaker);
  // A kept pool ends at its new time (or now, for 0); a running job reads its period as it ends.
  if (keep_alive_change && pool_available && ops.ctx.controller != nullptr) {
    ops.ctx.controller->WarmPoolChanged(updated->name);
  }
  return json{{"TrainingJobArn", updated->arn}};
}

// Tags. Resources of kinds Kiln does not keep yet are accepted by ARN as they are added by
// later resource families; an ARN of a kind Kiln keeps (training, tuning, processing and transform job, model,
// endpoint configuration, endpoint) must name an existing resource, resolved case-insensitively (§5).
std::optional<aws::AwsError> CheckTaggedResource(Operations& ops, const std::string& arn) {
  if (!StartsWith(ToLower(arn), "arn:aws:sagemaker:")) {
    return Validation("Invalid ResourceArn: " + arn + " is not a SageMaker resource ARN.");
  }
  bool found = true;
  if (auto name = NameFromArn(arn, "training-job")) {
    found = ops.jobs.Get(*name).ok();
  } else if (auto model = NameFromArn(arn, "model")) {
    found = ops.models.Get(*model).ok();
  } else if (auto config = NameFromArn(arn, "endpoint-config")) {
    found = ops.configs.Get(*config).ok();
  } else if (auto endpoint = NameFromArn(arn, "endpoint")) {
    found = ops.endpoints.Get(*endpoint).ok();
  } else if (auto tuning = NameFromArn(arn, "hyper-parameter-tuning-job")) {
    found = store::TuningJobRepository(ops.ctx.database).Get(*tuning).ok();
  } else if (auto processing = NameFromArn(arn, "processing-job")) {
    found = store::ProcessingJobRepository(ops.ctx.database).Get(*processing).ok();
  } else if (auto transform = NameFromArn(arn, "transform-job")) {
    found = store::TransformJobRepository(ops.ctx.database).Get(*transform).ok();
  }
  if (!found) return Validation("Could not find resource \"" + arn + "\".");
  return std::nullopt;
}

JsonOutcome AddTags(Operations& ops, const json& in) {
  const std::string arn = in["ResourceArn"].get<std::string>();
  if (auto error = CheckTaggedResource(ops, arn)) return *error;
  std::vector<store::Tag> list;
  for (const json& t : in["Tags"]) {
    std::string key = t.value("Key", "");
    if (StartsWith(ToLower(key), "aws:")) {
      return Validation("Tag keys starting with 'aws:' are reserved for system use; rename the key '" + key + "'.");
    }
    list.push_back({key, t.value("Value", "")});
  }
  auto existing = ops.tags.List(arn);
  if (!existing.ok()) return AwsErrorFromStatus(existing.status(), ErrorService::kSageMaker);
  std::set<std::string> keys;
  for (const auto& t : *existing) keys.insert(t.key);
  for (const auto& t : list) keys.insert(t.key);
  if (keys.size() > kMaxTagsPerResource) {
    return aws::AwsError("ResourceLimitExceeded", "A resource can have at most 50 tags; this request would give " +
                                                      arn + " " + std::to_string(keys.size()) + ".");
  }
  Status added = ops.tags.Add(arn, list);
  if (!added.ok()) return AwsErrorFromStatus(added, ErrorService::kSageMaker);
  json out_tags = json::array();
  for (const json& t : in["Tags"]) out_tags.push_back(t);
  return json{{"Tags", out_tags}};
}

JsonOutcome ListTags(Operations& ops, const json& in) {
  const std::string arn = in["ResourceArn"].get<std::string>();
  if (auto error = CheckTaggedResource(ops, arn)) return *error;
  auto list = ops.tags.List(arn);
  if (!list.ok()) return AwsErrorFromStatus(list.status(), ErrorService::kSageMaker);
  const size_t max_results = static_cast<size_t>(in.value("MaxResults", 50));
  const int64_t now = NowOf(ops.ctx);
  size_t start = 0;
  if (in.contains("NextToken") && in["NextToken"].is_string()) {
    auto cursor = DecodeNextToken(in["NextToken"].get<std::string>(), in, now);
    if (!cursor || !cursor->is_number_unsigned()) return InvalidNextToken();
    start = cursor->get<size_t>();
  }
  json out_tags = json::array();
  size_t end = std::min(list->size(), start + max_results);
  for (size_t i = start; i < end; ++i) out_tags.push_back({{"Key", (*list)[i].key}, {"Value", (*list)[i].value}});
  json out = {{"Tags", out_tags}};
  if (end < list->size()) out["NextToken"] = EncodeNextToken(end, in, now);
  return out;
}

JsonOutcome DeleteTags(Operations& ops, const json& in) {
  const std::string arn = in["ResourceArn"].get<std::string>();
  if (auto error = CheckTaggedResource(ops, arn)) return *error;
  Status removed = ops.tags.Remove(arn, in["TagKeys"].get<std::vector<std::string>>());
  if (!removed.ok()) return AwsErrorFromStatus(removed, ErrorService::kSageMaker);
  return json::object();
}

}  // namespace

void RegisterTrainingJobOperations(JsonService* service, const TrainingJobsContext& context) {
  auto ops = std::make_shared<Operations>(context);
  using Operation = JsonOutcome (*)(Operations&, const json&);
  for (auto [name, op] : {std::pair<const char*, Operation>{"CreateTrainingJob", CreateTrainingJob},
                          {"DescribeTrainingJob", DescribeTrainingJob},
                          {"ListTrainingJobs", ListTrainingJobs},
                          {"StopTrainingJob", StopTrainingJob},
                          {"DeleteTrainingJob", DeleteTrainingJob},
                          {"UpdateTrainingJob", UpdateTrainingJob},
                          {"AddTags", AddTags},
                          {"ListTags", ListTags},
                          {"DeleteTags", DeleteTags}}) {
    // `op = op`: clang before 16 cannot capture a structured binding by name.
    service->Register(
        name, [ops, op = op](const aws::RequestContext&, const json& in) -> JsonOutcome { return op(*ops, in); });
  }
}

std::optional<aws::AwsError> CheckTrainingJobRequest(const json& request, const TrainingJobsContext& context) {
  return CheckCreateRequest(request, context.controller,
                            context.catalog ? *context.catalog : control::InstanceCatalog::BuiltIn());
}

json ResourceConfigFromTuningResources(const json& tuning) {
  json rc = json::object();
  if (!tuning.is_object()) return rc;
  if (tuning.contains("InstanceConfigs") && tuning["InstanceConfigs"].is_array() &&
      !tuning["InstanceConfigs"].empty()) {
    rc = tuning["InstanceConfigs"][0];
  } else {
    for (const char* member : {"InstanceType", "InstanceCount", "VolumeSizeInGB"}) {
      if (tuning.contains(member)) rc[member] = tuning[member];
    }
  }
  if (tuning.contains("VolumeKmsKeyId")) rc["VolumeKmsKeyId"] = tuning["VolumeKmsKeyId"];
  return rc;
}

json TrialRequestFromDefinition(const json& definition, const std::string& trial_name, const std::string& tuning_arn,
                                const std::map<std::string, std::string>& tuned, const std::string& objective_metric,
                                const json& tags) {
  json request = json::object();
  request["TrainingJobName"] = trial_name;
  for (const char* member : {"RoleArn", "InputDataConfig", "VpcConfig", "OutputDataConfig", "ResourceConfig",
                             "StoppingCondition", "EnableNetworkIsolation", "EnableInterContainerTrafficEncryption",
                             "EnableManagedSpotTraining", "CheckpointConfig", "RetryStrategy", "Environment"}) {
    if (definition.contains(member) && !definition[member].is_null()) request[member] = definition[member];
  }
  // HyperParameterAlgorithmSpecification has CreateTrainingJob's members of the same names.
  json algorithm = json::object();
  const json spec = definition.value("AlgorithmSpecification", json::object());
  for (const char* member : {"TrainingImage", "AlgorithmName", "TrainingInputMode", "MetricDefinitions"}) {
    if (spec.contains(member) && !spec[member].is_null()) algorithm[member] = spec[member];
  }
  request["AlgorithmSpecification"] = algorithm;
  if (!request.contains("ResourceConfig") && definition.contains("HyperParameterTuningResourceConfig")) {
    request["ResourceConfig"] = ResourceConfigFromTuningResources(definition["HyperParameterTuningResourceConfig"]);
  }
  json hyperparameters = definition.value("StaticHyperParameters", json::object());
  if (!hyperparameters.is_object()) hyperparameters = json::object();
  for (const auto& [key, value] : tuned) hyperparameters[key] = value;
  if (!objective_metric.empty()) hyperparameters["_tuning_objective_metric"] = objective_metric;
  request["HyperParameters"] = hyperparameters;
  request["TuningJobArn"] = tuning_arn;
  if (tags.is_array() && !tags.empty()) request["Tags"] = tags;
  return request;
}

Result<std::string> CreateTrainingJobFromRequest(const TrainingJobsContext& context, const json& request,
                                                 aws::AwsError* error) {
  Operations ops(context);
  JsonOutcome outcome = CreateTrainingJob(ops, request);
  if (const aws::AwsError* failed = std::get_if<aws::AwsError>(&outcome)) {
    if (error != nullptr) *error = *failed;
    if (failed->code == "ResourceInUse") return Status::AlreadyExists(failed->message);
    if (failed->code == "ResourceLimitExceeded") return Status::ResourceExhausted(failed->message);
    // Kiln's own trouble (the database busy or failing) is worth another try; the request is not.
    if (failed->http_status >= 500) return Status::Unavailable(failed->message);
    return Status::InvalidArgument(failed->message);
  }
  return std::get<json>(outcome)["TrainingJobArn"].get<std::string>();
}

Status StopTrainingJobByName(const TrainingJobsContext& context, const std::string& name) {
  Operations ops(context);
  JsonOutcome outcome = StopTrainingJob(ops, json{{"TrainingJobName", name}});
  if (const aws::AwsError* failed = std::get_if<aws::AwsError>(&outcome)) {
    if (failed->message == "Requested resource not found.") return Status::NotFound(failed->message);
    // The refusal of a job that is no longer InProgress; anything else (the database) may pass.
    if (failed->code == "ValidationException") return Status::FailedPrecondition(failed->message);
    return Status::Unavailable(failed->message);
  }
  return Status::Ok();
}

Status TrainingJobTrialLauncher::Create(const Trial& trial) {
  json request = TrialRequestFromDefinition(trial.definition, trial.name, trial.tuning_arn, trial.tuned,
                                            trial.objective_metric, trial.tags);
  auto created = CreateTrainingJobFromRequest(context_, request, nullptr);
  return created.ok() ? Status::Ok() : created.status();
}

Status TrainingJobTrialLauncher::Stop(const std::string& training_job_name) {
  return StopTrainingJobByName(context_, training_job_name);
}

}  // namespace kiln::api
