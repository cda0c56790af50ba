#include "api/processing_jobs.h"

#include <optional>
#include <set>
#include <variant>
#include <vector>

#include "api/errors.h"
#include "api/paging.h"
#include "base/json_parse.h"
#include "base/log.h"
#include "base/strings.h"
#include "store/training_job_repository.h"

namespace kiln::api {
namespace {

using nlohmann::json;

constexpr std::string_view kLocalPathPrefix = "/opt/ml/processing/";

aws::AwsError Validation(std::string message) { return aws::AwsError("ValidationException", std::move(message)); }

// §7: what DescribeProcessingJob answers for a job that does not exist (Stop answers the same).
aws::AwsError ProcessingJobNotFound(const std::string& name) {
  return Validation("Could not find requested job with name " + name);
}

json Seconds(int64_t millis) { return static_cast<double>(millis) / 1000.0; }

bool Has(const json& object, const char* member) {
  return object.is_object() && object.contains(member) && !object[member].is_null();
}

bool FlagOf(const json& object, const char* member) {
  return Has(object, member) && object[member].is_boolean() && object[member].get<bool>();
}

std::string StringOf(const json& object, const char* member) {
  return Has(object, member) && object[member].is_string() ? object[member].get<std::string>() : "";
}

// What the operations share: the context and the repositories they read and write.
struct Operations {
  explicit Operations(const ProcessingJobsContext& context)
      : ctx(context), jobs(context.database), tags(context.database) {}
  int64_t Now() const { return ctx.clock ? ctx.clock->NowMillis() : Clock::System().NowMillis(); }
  const control::InstanceCatalog& Catalog() const {
    return ctx.catalog ? *ctx.catalog : control::InstanceCatalog::BuiltIn();
  }
  ProcessingJobsContext ctx;
  store::ProcessingJobRepository jobs;
  store::TagRepository tags;
};

// ---- CreateProcessingJob's checks ----

// A container path Kiln creates and stages into (training-contract.md §17): under
// /opt/ml/processing/, naming something there, with no ".." segment that would leave it.
// `what` names the member in the message ("ProcessingInput 'raw': S3Input.LocalPath").
std::optional<aws::AwsError> CheckLocalPath(const std::string& path, const std::string& what) {
  if (!path.starts_with(kLocalPathPrefix) || path.size() == kLocalPathPrefix.size()) {
    return Validation(what + " '" + path + "' must be a path under " + std::string(kLocalPathPrefix) +
                      " (for example /opt/ml/processing/input).");
  }
  for (std::string_view segment : Split(path, '/')) {
    if (segment == "..") {
      return Validation(what + " '" + path + "' must not contain '..': give a path under " +
                        std::string(kLocalPathPrefix) + " without it.");
    }
  }
  return std::nullopt;
}

// "/opt/ml/processing/x/" and "/opt/ml/processing/x" are the same directory.
std::string WithoutTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::optional<aws::AwsError> CheckS3Uri(const std::string& uri, const std::string& what, const char* purpose) {
  if (!ToLower(uri).starts_with("s3://")) {
    return Validation(what + " '" + uri + "' must be an s3:// URI: Kiln " + purpose + " its S3 object store.");
  }
  return std::nullopt;
}

std::optional<aws::AwsError> CheckInputs(const json& inputs) {
  std::set<std::string> names;
  std::set<std::string> local_paths;
  for (const json& input : inputs) {
    const std::string name = StringOf(input, "InputName");
    const std::string where = "ProcessingInput '" + name + "'";
    if (!names.insert(name).second) {
      return Validation("InputName values must be unique within ProcessingInputs; '" + name +
                        "' is given more than once.");
    }
    const bool s3 = Has(input, "S3Input");
    const bool dataset = Has(input, "DatasetDefinition");
    if (s3 == dataset) {
      return Validation(where + " must specify exactly one of S3Input or DatasetDefinition; it gives " +
                        (s3 ? "both." : "neither."));
    }
    if (dataset) {
      return Validation(where +
                        ": DatasetDefinition (Athena and Redshift queries) is not supported by Kiln; stage the "
                        "data in S3 and give S3Input instead.");
    }
    if (FlagOf(input, "AppManaged")) {
      return Validation(where +
                        ": AppManaged true is not supported by Kiln, which stages every input itself; set "
                        "AppManaged to false and give S3Input.LocalPath.");
    }
    const json& s3_input = input["S3Input"];
    if (auto error = CheckS3Uri(StringOf(s3_input, "S3Uri"), where + ": S3Input.S3Uri", "reads inputs from"))
      return error;
    if (!Has(s3_input, "LocalPath")) {
      return Validation(where + ": S3Input.LocalPath is required (where the data appears in the container, under " +
                        std::string(kLocalPathPrefix) + ").");
    }
    const std::string local_path = StringOf(s3_input, "LocalPath");
    if (auto error = CheckLocalPath(local_path, where + ": S3Input.LocalPath")) return error;
    if (!local_paths.insert(WithoutTrailingSlashes(local_path)).second) {
      return Validation(where + ": S3Input.LocalPath '" + local_path +
                        "' is already the LocalPath of another input; give each input its own directory.");
    }
    // AWS's rule (ProcessingS3Input.S3CompressionType): Kiln would decompress either way, but a
    // request AWS refuses must not run here.
    const std::string mode = s3_input.value("S3InputMode", "File");
    if (s3_input.value("S3CompressionType", "None") == "Gzip" && mode != "Pipe") {
      return Validation(where + ": S3CompressionType Gzip can only be used when S3InputMode is Pipe; use " +
                        "S3InputMode Pipe or S3CompressionType None.");
    }
  }
  return std::nullopt;
}

std::optional<aws::AwsError> CheckOutputs(const json& outputs) {
  std::set<std::string> names;
  for (const json& output : outputs) {
    const std::string name = StringOf(output, "OutputName");
    const std::string where = "ProcessingOutput '" + name + "'";
    if (!names.insert(name).second) {
      return Validation("OutputName values must be unique within ProcessingOutputConfig.Outputs; '" + name +
                        "' is given more than once.");
    }
    if (Has(output, "FeatureStoreOutput")) {
      return Validation(where +
                        ": FeatureStoreOutput is not supported by Kiln (it has no Feature Store); give S3Output "
                        "instead.");
    }
    if (FlagOf(output, "AppManaged")) {
      return Validation(where +
                        ": AppManaged true is not supported by Kiln, which uploads every output itself; set "
                        "AppManaged to false and give S3Output.LocalPath.");
    }
    if (!Has(output, "S3Output")) {
      return Validation(where + ": S3Output is required (S3Uri, LocalPath and S3UploadMode).");
    }
    const json& s3_output = output["S3Output"];
    // The SageMaker Python SDK fills a default destination itself; Kiln requires one (§17).
    if (auto error = CheckS3Uri(StringOf(s3_output, "S3Uri"), where + ": S3Output.S3Uri", "uploads outputs to"))
      return error;
    if (!Has(s3_output, "LocalPath")) {
      return Validation(where + ": S3Output.LocalPath is required (the container directory to upload, under " +
                        std::string(kLocalPathPrefix) + ").");
    }
    if (auto error = CheckLocalPath(StringOf(s3_output, "LocalPath"), where + ": S3Output.LocalPath")) return error;
  }
  return std::nullopt;
}

// ResourceLimitExceeded when the node can never hold the cluster; for several instances the
// message also says how many would fit (feasibility is monotonic in the count: bisect).
std::optional<aws::AwsError> CheckCapacity(const Operations& ops, const std::string& type, int count) {
  if (!ops.ctx.check_feasible) return std::nullopt;
  Status status = ops.ctx.check_feasible(type, count);
  if (status.ok()) return std::nullopt;
  if (status.code() != StatusCode::kResourceExhausted) return AwsErrorFromStatus(status, ErrorService::kSageMaker);
  std::string message = status.message();
  if (count > 1) {
    int low = 0, high = count;  // low fits (0 trivially), high does not
    while (high - low > 1) {
      const int mid = low + (high - low) / 2;
      (ops.ctx.check_feasible(type, mid).ok() ? low : high) = mid;
    }
    message += low > 0 ? "; or lower ProcessingResources.ClusterConfig.InstanceCount to at most " +
                             std::to_string(low) + " (" + std::to_string(low) + " x " + type + " fit on this node)"
                       : "; not even one " + type + " fits on this node";
  }
  return aws::AwsError("ResourceLimitExceeded", message);
}

// The checks the service model cannot express, in the request's member order; the first problem
// found is the answer.
std::optional<aws::AwsError> CheckCreateRequest(const Operations& ops, const json& in) {
  if (auto error = CheckInputs(in.value("ProcessingInputs", json::array()))) return error;
  if (Has(in, "ProcessingOutputConfig")) {
    if (auto error = CheckOutputs(in["ProcessingOutputConfig"].value("Outputs", json::array()))) return error;
  }
  const json cluster = in["ProcessingResources"]["ClusterConfig"];
  const std::string type = cluster["InstanceType"].get<std::string>();
  const control::InstanceShape* shape = ops.Catalog().Find(type);
  if (shape == nullptr || !shape->processing) {
    return Validation("The instance type " + type +
                      " (ProcessingResources.ClusterConfig.InstanceType) is not offered for processing by this "
                      "Kiln server (see its instance catalog); choose another instance type.");
  }
  for (const json& tag : in.value("Tags", json::array())) {
    const std::string key = StringOf(tag, "Key");
    if (ToLower(key).starts_with("aws:")) {
      return Validation("Tag keys starting with 'aws:' are reserved for system use; rename the key '" + key + "'.");
    }
  }
  return CheckCapacity(ops, type, cluster["InstanceCount"].get<int>());
}

// The stored request: AWS's defaults filled in (what Describe returns and the controller reads).
json WithDefaults(json in) {
  if (Has(in, "ProcessingInputs")) {
    for (json& input : in["ProcessingInputs"]) {
      if (!input.contains("AppManaged")) input["AppManaged"] = false;
      json& s3 = input["S3Input"];
      if (!s3.contains("S3InputMode")) s3["S3InputMode"] = "File";
      if (!s3.contains("S3DataDistributionType")) s3["S3DataDistributionType"] = "FullyReplicated";
      if (!s3.contains("S3CompressionType")) s3["S3CompressionType"] = "None";
    }
  }
  if (Has(in, "ProcessingOutputConfig") && Has(in["ProcessingOutputConfig"], "Outputs")) {
    for (json& output : in["ProcessingOutputConfig"]["Outputs"]) {
      if (!output.contains("AppManaged")) output["AppManaged"] = false;
    }
  }
  return in;
}

// ---- the operations ----

JsonOutcome CreateProcessingJob(Operations& ops, const json& request) {
  // A null member is an absent one (the service model treats it so): drop them before anything
  // reads or stores the request.
  const json in = WithoutNulls(request);
  if (auto error = CheckCreateRequest(ops, in)) return *error;
  const std::string name = in["ProcessingJobName"].get<std::string>();
  const int64_t now = ops.Now();
  store::ProcessingJobRecord record;
  record.name = name;
  record.arn = ProcessingJobArn(ops.ctx.region, ops.ctx.account_id, name);
  record.request = WithDefaults(in);
  record.request.erase("Tags");  // kept in the tag table
  record.status = store::ProcessingJobStatus::kInProgress;
  record.creation_millis = now;
  record.last_modified_millis = now;
  Status inserted = ops.jobs.Insert(record);
  if (inserted.IsAlreadyExists()) {
    return aws::AwsError("ResourceInUse",
                         "Processing job names must be unique within an AWS account and region, and a processing job "
                         "with this name already exists (" +
                             inserted.message() + ")");
  }
  if (!inserted.ok()) return AwsErrorFromStatus(inserted, ErrorService::kSageMaker);
  if (Has(in, "Tags") && !in["Tags"].empty()) {
    std::vector<store::Tag> list;
    for (const json& t : in["Tags"]) list.push_back({StringOf(t, "Key"), StringOf(t, "Value")});
    Status tagged = ops.tags.Add(record.arn, list);
    if (!tagged.ok()) KLOG(warn, "tags not stored", {{"processing_job", record.name}, {"error", tagged.ToString()}});
  }
  if (ops.ctx.on_created) ops.ctx.on_created(record.name);
  return json{{"ProcessingJobArn", record.arn}};
}

JsonOutcome DescribeProcessingJob(Operations& ops, const json& in) {
  const std::string name = in["ProcessingJobName"].get<std::string>();
  auto record = ops.jobs.Get(name);
  if (record.status().IsNotFound()) return ProcessingJobNotFound(name);
  if (!record.ok()) return AwsErrorFromStatus(record.status(), ErrorService::kSageMaker);
  return RenderProcessingJob(*record);
}

json ProcessingJobSummary(const store::ProcessingJobSummaryRow& r) {
  json s = {{"ProcessingJobName", r.name},
            {"ProcessingJobArn", r.arn},
            {"CreationTime", Seconds(r.creation_millis)},
            {"LastModifiedTime", Seconds(r.last_modified_millis)},
            {"ProcessingJobStatus", r.status}};
  if (r.end_millis) s["ProcessingEndTime"] = Seconds(*r.end_millis);
  if (!r.failure_reason.empty()) s["FailureReason"] = r.failure_reason;
  if (!r.exit_message.empty()) s["ExitMessage"] = r.exit_message;
  return s;
}

JsonOutcome ListProcessingJobs(Operations& ops, const json& in) {
  // AWS's defaults for this list: SortBy CreationTime, SortOrder Ascending (the model's documentation).
  const std::string sort_by = in.value("SortBy", "CreationTime");
  const store::ListSortKey sort_key = sort_by == "Name"     ? store::ListSortKey::kName
                                      : sort_by == "Status" ? store::ListSortKey::kStatus
                                                            : store::ListSortKey::kCreationTime;
  const bool descending = in.value("SortOrder", "Ascending") == "Descending";
  const int64_t now = ops.Now();
  auto parsed = ParseListPaging(in, sort_key, descending, now);
  if (auto* error = std::get_if<aws::AwsError>(&parsed)) return *error;
  ListPaging& paging = std::get<ListPaging>(parsed);
  paging.query.filter = ListFilterFromRequest(in);
  auto listed = ops.jobs.ListPage(paging.query);
  if (!listed.ok()) return AwsErrorFromStatus(listed.status(), ErrorService::kSageMaker);
  std::vector<store::ProcessingJobSummaryRow> rows = std::move(listed).value();
  std::optional<std::string> next_token = CutPage(rows, paging, in, now);
  json summaries = json::array();
  for (const auto& r : rows) summaries.push_back(ProcessingJobSummary(r));
  json out = {{"ProcessingJobSummaries", summaries}};
  if (next_token) out["NextToken"] = *next_token;
  return out;
}

JsonOutcome StopProcessingJob(Operations& ops, const json& in) {
  const std::string name = in["ProcessingJobName"].get<std::string>();
  const int64_t now = ops.Now();
  std::string refused;
  bool already_stopping = false;
  auto updated = ops.jobs.Mutate(name, [&](store::ProcessingJobRecord& r) {
    if (r.status == store::ProcessingJobStatus::kStopping) {
      // A stop is already under way: nothing to write, nothing to tell the controller.
      already_stopping = true;
      return Status::FailedPrecondition("already stopping");
    }
    if (r.status != store::ProcessingJobStatus::kInProgress) {
      refused = "The job status is " + std::string(store::ProcessingJobStatusName(r.status)) +
                "; only InProgress jobs can be stopped.";
      return Status::FailedPrecondition(refused);
    }
    // A request for the controller to carry out (SIGTERM, grace, SIGKILL, then Stopped).
    r.status = store::ProcessingJobStatus::kStopping;
    r.state.stop_reason = std::string(store::kProcessingStopRequested);
    r.last_modified_millis = now;
    return Status::Ok();
  });
  if (updated.status().IsNotFound()) return ProcessingJobNotFound(name);
  if (already_stopping) return json::object();
  if (!refused.empty()) return Validation(refused);
  if (!updated.ok()) return AwsErrorFromStatus(updated.status(), ErrorService::kSageMaker);
  if (ops.ctx.on_stop_requested) ops.ctx.on_stop_requested(updated->name);
  return json::object();
}

JsonOutcome DeleteProcessingJob(Operations& ops, const json& in) {
  const std::string name = in["ProcessingJobName"].get<std::string>();
  auto record = ops.jobs.Get(name);
  if (record.status().IsNotFound()) {
    return aws::AwsError("ResourceNotFound", "Could not find requested job with name " + name);
  }
  if (!record.ok()) return AwsErrorFromStatus(record.status(), ErrorService::kSageMaker);
  if (!store::IsTerminal(record->status)) {
    return aws::AwsError("ResourceInUse", "The processing job " + record->name + " is " +
                                              std::string(store::ProcessingJobStatusName(record->status)) +
                                              ". Only processing jobs in a terminal state (Completed, Failed, "
                                              "Stopped) can be deleted; stop it and wait for it to end first.");
  }
  // Only the job's entry and tags go (AWS): its outputs in S3 and its logs stay.
  Status deleted = ops.jobs.Delete(record->name);
  if (!deleted.ok() && !deleted.IsNotFound()) return AwsErrorFromStatus(deleted, ErrorService::kSageMaker);
  return json::object();
}

}  // namespace

std::string ProcessingJobArn(const std::string& region, const std::string& account_id, const std::string& name) {
  return "arn:aws:sagemaker:" + region + ":" + account_id + ":processing-job/" + name;
}

json RenderProcessingJob(const store::ProcessingJobRecord& record) {
  const json& in = record.request;
  json out = json::object();
  // DescribeProcessingJobResponse's members that echo the request (unknown members a client sent
  // are stored but not returned).
  for (const char* member : {"ProcessingInputs", "ProcessingOutputConfig", "ProcessingResources", "StoppingCondition",
                             "AppSpecification", "Environment", "NetworkConfig", "RoleArn", "ExperimentConfig"}) {
    if (Has(in, member)) out[member] = in[member];
  }
  out["ProcessingJobName"] = record.name;
  out["ProcessingJobArn"] = record.arn;
  out["ProcessingJobStatus"] = store::ProcessingJobStatusName(record.status);
  if (!record.state.exit_message.empty()) out["ExitMessage"] = record.state.exit_message;
  if (!record.state.failure_reason.empty()) out["FailureReason"] = record.state.failure_reason;
  if (record.end_millis) out["ProcessingEndTime"] = Seconds(*record.end_millis);
  if (record.state.start_millis) out["ProcessingStartTime"] = Seconds(*record.state.start_millis);
  out["LastModifiedTime"] = Seconds(record.last_modified_millis);
  out["CreationTime"] = Seconds(record.creation_millis);
  return out;
}

void RegisterProcessingJobOperations(JsonService* service, const ProcessingJobsContext& context) {
  auto ops = std::make_shared<Operations>(context);
  using Operation = JsonOutcome (*)(Operations&, const json&);
  for (auto [name, op] : {std::pair<const char*, Operation>{"CreateProcessingJob", CreateProcessingJob},
                          {"DescribeProcessingJob", DescribeProcessingJob},
                          {"ListProcessingJobs", ListProcessingJobs},
                          {"StopProcessingJob", StopProcessingJob},
                          {"DeleteProcessingJob", DeleteProcessingJob}}) {
    // `op = op`: clang before 16 cannot capture a structured binding by name.
    service->Register(
        name, [ops, op = op](const aws::RequestContext&, const json& in) -> JsonOutcome { return op(*ops, in); });
  }
}

}  // namespace kiln::api
