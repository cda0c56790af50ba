#include "api/transform_jobs.h"

#include <optional>
#include <variant>
#include <vector>

#include "api/errors.h"
#include "api/paging.h"
#include "base/json_parse.h"
#include "base/log.h"
#include "base/strings.h"
#include "serving/transform_records.h"
#include "store/endpoint_repository.h"
#include "store/training_job_repository.h"

namespace kiln::api {
namespace {

using nlohmann::json;

aws::AwsError Validation(std::string message) { return aws::AwsError("ValidationException", std::move(message)); }

aws::AwsError TransformJobNotFound(const std::string& name) {
  return Validation("Could not find requested job with name " + name);
}

json Seconds(int64_t millis) { return static_cast<double>(millis) / 1000.0; }

bool Has(const json& object, const char* member) {
  return object.is_object() && object.contains(member) && !object[member].is_null();
}

std::string StringOf(const json& object, const char* member) {
  return Has(object, member) && object[member].is_string() ? object[member].get<std::string>() : "";
}

int64_t IntOf(const json& object, const char* member, int64_t fallback) {
  return Has(object, member) && object[member].is_number_integer() ? object[member].get<int64_t>() : fallback;
}

struct Operations {
  explicit Operations(const TransformJobsContext& context)
      : ctx(context),
        jobs(context.database),
        models(context.database, store::DefinitionRepository::Kind::kModel),
        tags(context.database) {}
  int64_t Now() const { return ctx.clock ? ctx.clock->NowMillis() : Clock::System().NowMillis(); }
  const control::InstanceCatalog& Catalog() const {
    return ctx.catalog ? *ctx.catalog : control::InstanceCatalog::BuiltIn();
  }
  TransformJobsContext ctx;
  store::TransformJobRepository jobs;
  store::DefinitionRepository models;
  store::TagRepository tags;
};

std::optional<aws::AwsError> CheckS3Uri(const std::string& uri, const std::string& what) {
  if (!ToLower(uri).starts_with("s3://")) {
    return Validation(what + " '" + uri +
                      "' must be an s3:// URI: Kiln reads and writes transform data in its S3 "
                      "object store.");
  }
  return std::nullopt;
}

// The model the job runs: one container, or an inference pipeline (Serial, serving-contract.md
// §8.2: every record batch goes through all of its containers); single-model mode.
std::optional<aws::AwsError> CheckModel(const json& model, const std::string& name) {
  std::vector<const json*> containers;
  if (Has(model, "PrimaryContainer")) {
    containers.push_back(&model["PrimaryContainer"]);
  } else if (Has(model, "Containers") && model["Containers"].is_array()) {
    for (const json& c : model["Containers"]) containers.push_back(&c);
  }
  if (containers.size() > 1 && Has(model, "InferenceExecutionConfig") &&
      StringOf(model["InferenceExecutionConfig"], "Mode") == "Direct") {
    return Validation("Model " + name +
                      " is a multi-container model with InferenceExecutionConfig Mode Direct, which batch transform "
                      "cannot call (no request names a container); use a Serial inference pipeline or one "
                      "container.");
  }
  for (const json* container : containers) {
    if (StringOf(*container, "Mode") == "MultiModel") {
      return Validation("Model " + name +
                        " is a multi-model container (Mode MultiModel), which batch transform does not run; create "
                        "a model in SingleModel mode.");
    }
  }
  return std::nullopt;
}

std::optional<aws::AwsError> CheckCapacity(const Operations& ops, const std::string& type, int count) {
  if (!ops.ctx.check_feasible) return std::nullopt;
  Status status = ops.ctx.check_feasible(type, count);
  if (status.ok()) return std::nullopt;
  if (status.code() != StatusCode::kResourceExhausted) return AwsErrorFromStatus(status, ErrorService::kSageMaker);
  std::string message = status.message();
  if (count > 1) {
    int low = 0, high = count;
    while (high - low > 1) {
      const int mid = low + (high - low) / 2;
      (ops.ctx.check_feasible(type, mid).ok() ? low : high) = mid;
    }
    message += low > 0 ? "; or lower TransformResources.InstanceCount to at most " + std::to_string(low)
                       : "; not even one " + type + " fits on this node";
  }
  return aws::AwsError("ResourceLimitExceeded", message);
}

std::optional<aws::AwsError> CheckCreateRequest(Operations& ops, const json& in, json& model_out) {
  const std::string model_name = in["ModelName"].get<std::string>();
  auto model = ops.models.Get(model_name);
  if (model.status().IsNotFound()) {
    return Validation("Could not find model \"arn:aws:sagemaker:" + ops.ctx.region + ":" + ops.ctx.account_id +
                      ":model/" + model_name + "\".");
  }
  if (!model.ok()) return AwsErrorFromStatus(model.status(), ErrorService::kSageMaker);
  if (auto error = CheckModel(model->request, model->name)) return error;
  model_out = model->request;

  const json& input = in["TransformInput"];
  const json& s3 = input["DataSource"]["S3DataSource"];
  const std::string data_type = StringOf(s3, "S3DataType");
  if (data_type != "S3Prefix" && data_type != "ManifestFile") {
    return Validation("TransformInput.DataSource.S3DataSource.S3DataType " + data_type +
                      " is not supported for batch transform; use S3Prefix or ManifestFile.");
  }
  if (auto error = CheckS3Uri(StringOf(s3, "S3Uri"), "TransformInput.DataSource.S3DataSource.S3Uri")) return error;
  if (auto error = CheckS3Uri(StringOf(in["TransformOutput"], "S3OutputPath"), "TransformOutput.S3OutputPath")) {
    return error;
  }
  const std::string split = Has(input, "SplitType") ? StringOf(input, "SplitType") : "None";
  const int64_t payload = IntOf(in, "MaxPayloadInMB", 6);
  if (payload > 100) {
    return Validation("MaxPayloadInMB " + std::to_string(payload) + " is more than 100, the largest allowed.");
  }
  if (payload == 0 && split != "None") {
    return Validation(
        "MaxPayloadInMB 0 (stream the whole object) is only allowed with SplitType None; give a "
        "positive MaxPayloadInMB or set SplitType to None.");
  }
  if (Has(in, "MaxConcurrentTransforms") && Has(in, "MaxPayloadInMB")) {
    const int64_t concurrent = IntOf(in, "MaxConcurrentTransforms", 1);
    if (concurrent * payload > 100) {
      return Validation("MaxConcurrentTransforms (" + std::to_string(concurrent) + ") x MaxPayloadInMB (" +
                        std::to_string(payload) + ") must not exceed 100 MB; lower one of them.");
    }
  }
  if (Has(in, "BatchStrategy") && split == "None") {
    return Validation("BatchStrategy " + StringOf(in, "BatchStrategy") +
                      " requires a SplitType other than None (the object is sent whole); set "
                      "TransformInput.SplitType (for example Line) or leave BatchStrategy out.");
  }
  if (Has(in, "DataProcessing")) {
    for (const char* member : {"InputFilter", "OutputFilter"}) {
      if (!Has(in["DataProcessing"], member)) continue;
      auto parsed = serving::JsonPath::Parse(StringOf(in["DataProcessing"], member));
      if (!parsed.ok()) return Validation("DataProcessing." + std::string(member) + ": " + parsed.status().message());
    }
  }
  if (Has(in, "DataCaptureConfig")) {
    return Validation("DataCaptureConfig is not supported by Kiln for batch transform jobs; leave it out.");
  }
  const json& resources = in["TransformResources"];
  const std::string type = resources["InstanceType"].get<std::string>();
  const control::InstanceShape* shape = ops.Catalog().Find(type);
  if (shape == nullptr || !shape->transform) {
    return Validation("The instance type " + type +
                      " (TransformResources.InstanceType) is not offered for batch transform by this Kiln server (see "
                      "its instance catalog); choose another instance type.");
  }
  for (const json& tag : in.value("Tags", json::array())) {
    const std::string key = StringOf(tag, "Key");
    if (ToLower(key).starts_with("aws:")) {
      return Validation("Tag keys starting with 'aws:' are reserved for system use; rename the key '" + key + "'.");
    }
  }
  return CheckCapacity(ops, type, resources["InstanceCount"].get<int>());
}

JsonOutcome CreateTransformJob(Operations& ops, const json& request) {
  const json in = WithoutNulls(request);
  json model;
  if (auto error = CheckCreateRequest(ops, in, model)) return *error;
  const std::string name = in["TransformJobName"].get<std::string>();
  const int64_t now = ops.Now();
  store::TransformJobRecord record;
  record.name = name;
  record.arn = TransformJobArn(ops.ctx.region, ops.ctx.account_id, name);
  record.request = in;
  record.request.erase("Tags");
  record.creation_millis = now;
  record.last_modified_millis = now;
  record.state.model = std::move(model);
  Status inserted = ops.jobs.Insert(record);
  if (inserted.IsAlreadyExists()) {
    return aws::AwsError("ResourceInUse",
                         "Transform job names must be unique within an AWS account and region, and a transform job "
                         "with this name already exists (" +
                             inserted.message() + ")");
  }
  if (!inserted.ok()) return AwsErrorFromStatus(inserted, ErrorService::kSageMaker);
  if (Has(in, "Tags") && !in["Tags"].empty()) {
    std::vector<store::Tag> list;
    for (const json& t : in["Tags"]) list.push_back({StringOf(t, "Key"), StringOf(t, "Value")});
    Status tagged = ops.tags.Add(record.arn, list);
    if (!tagged.ok()) KLOG(warn, "tags not stored", {{"transform_job", record.name}, {"error", tagged.ToString()}});
  }
  if (ops.ctx.on_created) ops.ctx.on_created(record.name);
  return json{{"TransformJobArn", record.arn}};
}

JsonOutcome DescribeTransformJob(Operations& ops, const json& in) {
  const std::string name = in["TransformJobName"].get<std::string>();
  auto record = ops.jobs.Get(name);
  if (record.status().IsNotFound()) return TransformJobNotFound(name);
  if (!record.ok()) return AwsErrorFromStatus(record.status(), ErrorService::kSageMaker);
  return RenderTransformJob(*record);
}

JsonOutcome ListTransformJobs(Operations& ops, const json& in) {
  // AWS's defaults for this list: SortBy CreationTime, SortOrder Descending.
  const std::string sort_by = in.value("SortBy", "CreationTime");
  const store::ListSortKey sort_key = sort_by == "Name"     ? store::ListSortKey::kName
                                      : sort_by == "Status" ? store::ListSortKey::kStatus
                                                            : store::ListSortKey::kCreationTime;
  const bool descending = in.value("SortOrder", "Descending") == "Descending";
  const int64_t now = ops.Now();
  auto parsed = ParseListPaging(in, sort_key, descending, now);
  if (auto* error = std::get_if<aws::AwsError>(&parsed)) return *error;
  ListPaging& paging = std::get<ListPaging>(parsed);
  paging.query.filter = ListFilterFromRequest(in);
  auto listed = ops.jobs.ListPage(paging.query);
  if (!listed.ok()) return AwsErrorFromStatus(listed.status(), ErrorService::kSageMaker);
  std::vector<store::TransformJobSummaryRow> rows = std::move(listed).value();
  std::optional<std::string> next_token = CutPage(rows, paging, in, now);
  json summaries = json::array();
  for (const auto& r : rows) {
    json s = {{"TransformJobName", r.name},
              {"TransformJobArn", r.arn},
              {"CreationTime", Seconds(r.creation_millis)},
              {"LastModifiedTime", Seconds(r.last_modified_millis)},
              {"TransformJobStatus", r.status}};
    if (r.end_millis) s["TransformEndTime"] = Seconds(*r.end_millis);
    if (!r.failure_reason.empty()) s["FailureReason"] = r.failure_reason;
    summaries.push_back(std::move(s));
  }
  json out = {{"TransformJobSummaries", summaries}};
  if (next_token) out["NextToken"] = *next_token;
  return out;
}

JsonOutcome StopTransformJob(Operations& ops, const json& in) {
  const std::string name = in["TransformJobName"].get<std::string>();
  const int64_t now = ops.Now();
  std::string refused;
  bool already_stopping = false;
  auto updated = ops.jobs.Mutate(name, [&](store::TransformJobRecord& r) {
    if (r.status == store::TransformJobStatus::kStopping) {
      already_stopping = true;
      return Status::FailedPrecondition("already stopping");
    }
    if (r.status != store::TransformJobStatus::kInProgress) {
      refused = "The job status is " + std::string(store::TransformJobStatusName(r.status)) +
                "; only InProgress jobs can be stopped.";
      return Status::FailedPrecondition(refused);
    }
    r.status = store::TransformJobStatus::kStopping;
    r.state.stop_requested = true;
    r.last_modified_millis = now;
    return Status::Ok();
  });
  if (updated.status().IsNotFound()) return TransformJobNotFound(name);
  if (already_stopping) return json::object();
  if (!refused.empty()) return Validation(refused);
  if (!updated.ok()) return AwsErrorFromStatus(updated.status(), ErrorService::kSageMaker);
  if (ops.ctx.on_stop_requested) ops.ctx.on_stop_requested(updated->name);
  return json::object();
}

}  // namespace

std::string TransformJobArn(const std::string& region, const std::string& account_id, const std::string& name) {
  return "arn:aws:sagemaker:" + region + ":" + account_id + ":transform-job/" + name;
}

json RenderTransformJob(const store::TransformJobRecord& record) {
  const json& in = record.request;
  json out = json::object();
  for (const char* member : {"ModelName", "MaxConcurrentTransforms", "ModelClientConfig", "MaxPayloadInMB",
                             "BatchStrategy", "Environment", "TransformInput", "TransformOutput", "DataCaptureConfig",
                             "TransformResources", "DataProcessing", "ExperimentConfig"}) {
    if (Has(in, member)) out[member] = in[member];
  }
  out["TransformJobName"] = record.name;
  out["TransformJobArn"] = record.arn;
  out["TransformJobStatus"] = store::TransformJobStatusName(record.status);
  if (!record.state.failure_reason.empty()) out["FailureReason"] = record.state.failure_reason;
  out["CreationTime"] = Seconds(record.creation_millis);
  if (record.state.start_millis) out["TransformStartTime"] = Seconds(*record.state.start_millis);
  if (record.end_millis) out["TransformEndTime"] = Seconds(*record.end_millis);
  return out;
}

void RegisterTransformJobOperations(JsonService* service, const TransformJobsContext& context) {
  auto ops = std::make_shared<Operations>(context);
  using Operation = JsonOutcome (*)(Operations&, const json&);
  for (auto [name, op] : {std::pair<const char*, Operation>{"CreateTransformJob", CreateTransformJob},
                          {"DescribeTransformJob", DescribeTransformJob},
                          {"ListTransformJobs", ListTransformJobs},
                          {"StopTransformJob", StopTransformJob}}) {
    service->Register(
        name, [ops, op = op](const aws::RequestContext&, const json& in) -> JsonOutcome { return op(*ops, in); });
  }
}

}  // namespace kiln::api
