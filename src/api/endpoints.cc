// CreateEndpoint, DescribeEndpoint, ListEndpoints, UpdateEndpoint,
// UpdateEndpointWeightsAndCapacities, DeleteEndpoint (spec/control-plane-api.md §8.5, §9.2;
// serving-contract.md §1, §9). The handlers write desired state (a deployment, the desired
// weights and counts, the status the request moves the endpoint to) and tell the controller;
// observed state (ProductionVariants, instances, InService/Failed) is the controller's.
#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "api/deployment_config.h"
#include "api/endpoints.h"
#include "api/inference_common.h"
#include "api/paging.h"
#include "base/strings.h"
#include "control/endpoint_states.h"

namespace kiln::api {
namespace {

using nlohmann::json;
using namespace inference;

using store::EndpointStatus;

// What an endpoint is to run: the configuration and every model it names, copied now, so that
// deleting either later never changes the endpoint (store/endpoint_state.h has the shape).
struct BuiltDeployment {
  store::Deployment document;      // its config_name is as stored (the case it was created with)
  store::DesiredVariants desired;  // per variant: InitialVariantWeight (default 1), InitialInstanceCount
};

std::variant<BuiltDeployment, aws::AwsError> BuildDeployment(const EndpointsContext& ctx,
                                                             store::DefinitionRepository& configs,
                                                             store::DefinitionRepository& models,
                                                             const std::string& config_name, int64_t now) {
  auto config = configs.Get(config_name);
  if (config.status().IsNotFound()) return EndpointConfigNotFound(ctx, config_name);
  if (!config.ok()) return Internal(config.status());
  BuiltDeployment out;
  json model_requests = json::object();
  // Shadow variants (§9) run their own model: copied as the production variants' are.
  if (Has(config->request, "ShadowProductionVariants")) {
    for (const json& shadow : config->request["ShadowProductionVariants"]) {
      const std::string model_name = StringMember(shadow, "ModelName", "");
      if (model_name.empty() || model_requests.contains(model_name)) continue;
      auto model = models.Get(model_name);
      if (model.status().IsNotFound()) return ModelNotFound(ctx, model_name);
      if (!model.ok()) return Internal(model.status());
      model_requests[model_name] = model->request;
    }
  }
  for (const json& variant : config->request["ProductionVariants"]) {
    const std::string variant_name = variant["VariantName"].get<std::string>();
    // A serverless variant (serving-contract.md §12) starts with its ProvisionedConcurrency warm
    // instances (none without it); the serverless scaler (control/serverless_scaler.h) moves the
    // count with demand.
    const int64_t count = Has(variant, "ServerlessConfig")
                              ? variant["ServerlessConfig"].value("ProvisionedConcurrency", int64_t{0})
                              : variant.value("InitialInstanceCount", int64_t{1});
    out.desired[variant_name] = {
        .weight = Has(variant, "InitialVariantWeight") ? variant["InitialVariantWeight"].get<double>() : 1.0,
        .instance_count = count};
    const std::string model_name = StringMember(variant, "ModelName", "");
    if (model_name.empty() || model_requests.contains(model_name)) continue;
    // The model may have been deleted after the configuration was created: AWS refuses then.
    auto model = models.Get(model_name);
    if (model.status().IsNotFound()) return ModelNotFound(ctx, model_name);
    if (!model.ok()) return Internal(model.status());
    model_requests[model_name] = model->request;
  }
  out.document = {.config_name = config->name,
                  .endpoint_config = config->request,
                  .models = std::move(model_requests),
                  .deployed_millis = now};
  return out;
}

// Only an InService endpoint may be updated (§8.5, §9.2). AWS documents DeleteEndpoint as "the
// only operation that can be performed on a failed endpoint" (EndpointSummary.EndpointStatus,
// API reference); its text for the in-progress states is AWS's (§7), the Failed one is Kiln's.
std::optional<aws::AwsError> CheckUpdatable(const store::EndpointRecord& record) {
  if (record.status == EndpointStatus::kInService) return std::nullopt;
  if (record.status == EndpointStatus::kFailed) {
    return Validation("Cannot update failed endpoint \"" + record.arn +
                      "\". DeleteEndpoint is the only operation allowed on a failed endpoint.");
  }
  return Validation("Cannot update in-progress endpoint \"" + record.arn + "\".");
}

void Notify(const EndpointsContext& ctx, const std::string& name) {
  if (ctx.notifier != nullptr) ctx.notifier->EndpointChanged(name);
}

// Sets the DesiredWeight / DesiredInstanceCount members of a summary that `desired` has.
void ApplyDesired(const store::DesiredVariants& desired, const std::string& variant, json& summary) {
  auto it = desired.find(variant);
  if (it == desired.end()) return;
  if (it->second.weight) summary["DesiredWeight"] = *it->second.weight;
  if (it->second.instance_count) summary["DesiredInstanceCount"] = *it->second.instance_count;
}

// The new deployment while an UpdateEndpoint rolls out: its variants as configured, with the
// desired weights and counts (which describe the pending deployment while it is set).
json PendingSummary(const store::EndpointRecord& record) {
  const store::Deployment& pending = *record.pending;
  json variants = json::array();
  for (const std::string& name : pending.VariantNames()) {
    const json& variant = *pending.FindVariant(name);
    json summary = {{"VariantName", name}};
    if (Has(variant, "InstanceType")) summary["InstanceType"] = variant["InstanceType"];
    if (Has(variant, "RoutingConfig")) summary["RoutingConfig"] = variant["RoutingConfig"];
    ApplyDesired(record.desired, name, summary);
    variants.push_back(summary);
  }
  return {{"EndpointConfigName", pending.config_name},
          {"ProductionVariants", variants},
          {"StartTime", Seconds(pending.deployed_millis)}};
}

}  // namespace

json RenderEndpoint(const store::EndpointRecord& record) {
  json out = {{"EndpointName", record.name},
              {"EndpointArn", record.arn},
              {"EndpointConfigName", record.config_name},
              {"EndpointStatus", store::ToString(record.status)},
              {"CreationTime", Seconds(record.creation_millis)},
              {"LastModifiedTime", Seconds(record.last_modified_millis)}};
  if (!record.failure_reason.empty()) out["FailureReason"] = record.failure_reason;
  const bool pending = record.pending.has_value();
  // The controller writes AWS-shaped summaries; AWS omits ProductionVariants until the endpoint
  // has some (while Creating). The API's latest desired values win over the controller's copy,
  // for the current deployment's variants (`desired` describes the pending one while it is set).
  if (!record.state.production_variants.empty()) {
    json variants = json::array();
    json shadows = json::array();
    const std::vector<std::string> shadow_names = record.deployment.ShadowVariantNames();
    for (const store::VariantSummary& summary : record.state.production_variants) {
      json v = store::ToJson(summary);
      if (std::find(shadow_names.begin(), shadow_names.end(), summary.variant_name) != shadow_names.end()) {
        shadows.push_back(std::move(v));  // ShadowProductionVariants (§9), summarised as AWS does
        continue;
      }
      if (!pending) ApplyDesired(record.desired, summary.variant_name, v);
      // Serverless variants (§12) show their ServerlessConfig instead of instance counts, as AWS's
      // do (the count is Kiln's pool size, which follows demand).
      // UpdateEndpointWeightsAndCapacities' ServerlessUpdateConfig takes effect with the next
      // routing snapshot (well under a second), so Current shows it as Desired does.
      const json* config_variant = record.deployment.FindVariant(summary.variant_name);
      if (config_variant != nullptr && Has(*config_variant, "ServerlessConfig")) {
        auto desired = record.desired.find(summary.variant_name);
        const json serverless = store::EffectiveServerlessConfig(
            *config_variant, !pending && desired != record.desired.end() ? &desired->second : nullptr);
        v["CurrentServerlessConfig"] = serverless;
        v["DesiredServerlessConfig"] = serverless;
        v.erase("CurrentInstanceCount");
        v.erase("DesiredInstanceCount");
      }
      variants.push_back(std::move(v));
    }
    out["ProductionVariants"] = variants;
    if (!shadows.empty()) out["ShadowProductionVariants"] = shadows;
  }
  // DataCaptureConfigSummary (§14).
  if (record.deployment.endpoint_config.is_object() &&
      record.deployment.endpoint_config.contains("DataCaptureConfig")) {
    const json& capture = record.deployment.endpoint_config["DataCaptureConfig"];
    const bool enabled = capture.value("EnableCapture", true);
    json summary = {{"EnableCapture", enabled},
                    {"CaptureStatus", enabled ? "Started" : "Stopped"},
                    {"CurrentSamplingPercentage", capture.value("InitialSamplingPercentage", 0)},
                    {"DestinationS3Uri", capture.value("DestinationS3Uri", "")}};
    if (Has(capture, "KmsKeyId")) summary["KmsKeyId"] = capture["KmsKeyId"];
    out["DataCaptureConfig"] = summary;
  }
  if (pending) out["PendingDeploymentSummary"] = PendingSummary(record);
  if (Has(record.request, "DeploymentConfig")) out["LastDeploymentConfig"] = record.request["DeploymentConfig"];
  if (record.deployment.endpoint_config.is_object() &&
      record.deployment.endpoint_config.contains("AsyncInferenceConfig")) {
    out["AsyncInferenceConfig"] = record.deployment.endpoint_config["AsyncInferenceConfig"];
  }
  return out;
}

namespace {

// What the endpoint operations share: the context and the repositories they read and write.
struct Operations {
  explicit Operations(const EndpointsContext& context)
      : ctx(context),
        models(context.database, store::DefinitionRepository::Kind::kModel),
        configs(context.database, store::DefinitionRepository::Kind::kEndpointConfig),
        endpoints(context.database),
        tags(context.database) {}
  EndpointsContext ctx;
  store::DefinitionRepository models;
  store::DefinitionRepository configs;
  store::EndpointRepository endpoints;
  store::TagRepository tags;
};

// The row CreateEndpoint inserts: Creating, running `deployment`, the request without its Tags.
store::EndpointRecord NewEndpointRecord(const Operations& ops, const json& in, BuiltDeployment deployment,
                                        int64_t now) {
  const std::string name = in["EndpointName"].get<std::string>();
  store::EndpointRecord record;
  record.name = name;
  record.arn = EndpointArn(ops.ctx, name);
  record.config_name = deployment.document.config_name;
  record.status = EndpointStatus::kCreating;
  record.creation_millis = now;
  record.last_modified_millis = now;
  record.request = in;
  record.request.erase("Tags");
  record.deployment = std::move(deployment.document);
  record.desired = std::move(deployment.desired);
  return record;
}

JsonOutcome CreateEndpoint(Operations& ops, const json& in) {
  const std::string name = in["EndpointName"].get<std::string>();
  // The name is checked first: an existing endpoint is the answer whatever the configuration.
  auto existing = ops.endpoints.Get(name);
  if (existing.ok()) return Validation("Cannot create already existing endpoint \"" + existing->arn + "\".");
  if (!existing.status().IsNotFound()) return Internal(existing.status());
  const int64_t now = NowMillis(ops.ctx);
  auto built = BuildDeployment(ops.ctx, ops.configs, ops.models, in["EndpointConfigName"].get<std::string>(), now);
  if (auto* error = std::get_if<aws::AwsError>(&built)) return *error;
  // Kept for later updates (RetainDeploymentConfig); checked now as AWS does.
  if (Has(in, "DeploymentConfig")) {
    if (auto error = CheckDeploymentConfig(in["DeploymentConfig"], ops.ctx.database)) return *error;
  }
  store::EndpointRecord record = NewEndpointRecord(ops, in, std::move(std::get<BuiltDeployment>(built)), now);
  Status inserted = ops.endpoints.Insert(record);
  if (inserted.IsAlreadyExists()) {
    return Validation("Cannot create already existing endpoint \"" + inserted.message() + "\".");
  }
  if (!inserted.ok()) return Internal(inserted);
  StoreCreateTags(ops.tags, record.arn, in);
  Notify(ops.ctx, record.name);
  return json{{"EndpointArn", record.arn}};
}

JsonOutcome DescribeEndpoint(Operations& ops, const json& in) {
  const std::string name = in["EndpointName"].get<std::string>();
  auto record = ops.endpoints.Get(name);
  if (record.status().IsNotFound()) return EndpointNotFound(ops.ctx, name);
  if (!record.ok()) return Internal(record.status());
  return RenderEndpoint(*record);
}

JsonOutcome ListEndpoints(Operations& ops, const json& in) {
  store::ListFilter query = ListFilterFromRequest(in);
  const std::string sort_by = StringMember(in, "SortBy", "CreationTime");
  const int64_t now = NowMillis(ops.ctx);
  auto parsed = ParseListPaging(in,
                                sort_by == "Name"     ? store::ListSortKey::kName
                                : sort_by == "Status" ? store::ListSortKey::kStatus
                                                      : store::ListSortKey::kCreationTime,
                                StringMember(in, "SortOrder", "Descending") == "Descending", now);
  if (auto* error = std::get_if<aws::AwsError>(&parsed)) return *error;
  ListPaging& paging = std::get<ListPaging>(parsed);
  paging.query.filter = std::move(query);
  auto rows = ops.endpoints.ListPage(paging.query);
  if (!rows.ok()) return Internal(rows.status());
  std::optional<std::string> next_token = CutPage(*rows, paging, in, now);
  json summaries = json::array();
  for (const auto& r : *rows) {
    summaries.push_back({{"EndpointName", r.name},
                         {"EndpointArn", r.arn},
                         {"CreationTime", Seconds(r.creation_millis)},
                         {"LastModifiedTime", Seconds(r.last_modified_millis)},
                         {"EndpointStatus", store::ToString(r.status)}});
  }
  json out = {{"Endpoints", summaries}};
  if (next_token) out["NextToken"] = *next_token;
  return out;
}

// What UpdateEndpoint keeps of the current variants (§9): with RetainAllVariantProperties, their
// weight and count, less the properties listed in ExcludeRetainedVariantProperties.
struct Retention {
  bool retain = false;
  std::set<std::string> excluded;
};

Retention RetentionOf(const json& in) {
  Retention out;
  if (Has(in, "ExcludeRetainedVariantProperties")) {
    for (const json& p : in["ExcludeRetainedVariantProperties"])
      out.excluded.insert(p.value("VariantPropertyType", ""));
  }
  out.retain = Has(in, "RetainAllVariantProperties") && in["RetainAllVariantProperties"].get<bool>();
  return out;
}

// The desired weights and counts after an UpdateEndpoint: the new configuration's, except that
// variants present in both configurations keep what `retention` retains of `current`.
store::DesiredVariants DesiredAfterUpdate(const Retention& retention, const store::DesiredVariants& configured,
                                          const store::DesiredVariants& current) {
  store::DesiredVariants desired = configured;
  if (!retention.retain) return desired;
  for (auto& [variant, values] : desired) {
    auto kept = current.find(variant);
    if (kept == current.end()) continue;
    if (!retention.excluded.count("DesiredWeight") && kept->second.weight) values.weight = kept->second.weight;
    if (!retention.excluded.count("DesiredInstanceCount") && kept->second.instance_count) {
      values.instance_count = kept->second.instance_count;
    }
  }
  return desired;
}

// The answer when a Mutate of the endpoint's row did not commit: its refusal, not found, or an
// internal error; nullopt when it committed.
std::optional<aws::AwsError> ChangeError(const Operations& ops, const std::string& name,
                                         const std::optional<aws::AwsError>& refused,
                                         const Result<store::EndpointRecord>& updated) {
  if (refused) return *refused;
  if (updated.status().IsNotFound()) return EndpointNotFound(ops.ctx, name);
  if (!updated.ok()) return Internal(updated.status());
  return std::nullopt;
}

JsonOutcome UpdateEndpoint(Operations& ops, const json& in) {
  const std::string name = in["EndpointName"].get<std::string>();
  auto current = ops.endpoints.Get(name);
  if (current.status().IsNotFound()) return EndpointNotFound(ops.ctx, name);
  if (!current.ok()) return Internal(current.status());
  if (auto error = CheckUpdatable(*current)) return *error;
  const int64_t now = NowMillis(ops.ctx);
  auto built = BuildDeployment(ops.ctx, ops.configs, ops.models, in["EndpointConfigName"].get<std::string>(), now);
  if (auto* error = std::get_if<aws::AwsError>(&built)) return *error;
  BuiltDeployment& deployment = std::get<BuiltDeployment>(built);
  const Retention retention = RetentionOf(in);
  // The DeploymentConfig this update runs with (given, or retained from the last one): its rules,
  // its alarms, and its sizes against the new deployment (serving-contract.md §9).
  const bool retain_config = Has(in, "RetainDeploymentConfig") && in["RetainDeploymentConfig"].get<bool>();
  const json* config = Has(in, "DeploymentConfig") ? &in["DeploymentConfig"]
                       : retain_config && Has(current->request, "DeploymentConfig")
                           ? &current->request["DeploymentConfig"]
                           : nullptr;
  if (config != nullptr) {
    if (auto error = CheckDeploymentConfigForUpdate(*config, current->deployment, deployment.document,
                                                    DesiredAfterUpdate(retention, deployment.desired, current->desired),
                                                    ops.ctx.database)) {
      return *error;
    }
  }
  std::optional<aws::AwsError> refused;
  auto updated = ops.endpoints.Mutate(name, [&](store::EndpointRecord& r) {
    // Checked again inside the transaction: the controller or another request may have moved it.
    if ((refused = CheckUpdatable(r))) return Status::FailedPrecondition("not updatable");
    store::DesiredVariants desired = DesiredAfterUpdate(retention, deployment.desired, r.desired);
    r.pending = deployment.document;
    r.desired = std::move(desired);
    control::SetStatus(r, EndpointStatus::kUpdating);
    r.failure_reason.clear();
    r.last_modified_millis = now;
    if (Has(in, "DeploymentConfig")) {
      r.request["DeploymentConfig"] = in["DeploymentConfig"];
    } else if (!(Has(in, "RetainDeploymentConfig") && in["RetainDeploymentConfig"].get<bool>())) {
      r.request.erase("DeploymentConfig");
    }
    return Status::Ok();
  });
  if (auto error = ChangeError(ops, name, refused, updated)) return *error;
  Notify(ops.ctx, updated->name);
  return json{{"EndpointArn", updated->arn}};
}

// Copies ServerlessUpdateConfig's members into the variant's desired values.
void ApplyServerlessUpdate(const json& update, store::VariantDesired& values) {
  if (Has(update, "MaxConcurrency")) values.serverless_max_concurrency = update["MaxConcurrency"].get<int64_t>();
  if (Has(update, "ProvisionedConcurrency")) {
    values.serverless_provisioned_concurrency = update["ProvisionedConcurrency"].get<int64_t>();
  }
}

// DesiredWeightsAndCapacities on its own: each variant once, with something to change, and no
// scale to zero.
std::optional<aws::AwsError> CheckDesiredWeightsAndCapacities(const json& in) {
  std::set<std::string> seen;
  for (const json& entry : in["DesiredWeightsAndCapacities"]) {
    const std::string variant = entry["VariantName"].get<std::string>();
    if (!seen.insert(variant).second) {
      return Validation("Variant " + variant + " is given more than once in DesiredWeightsAndCapacities.");
    }
    if (Has(entry, "ServerlessUpdateConfig") && !Has(entry["ServerlessUpdateConfig"], "MaxConcurrency") &&
        !Has(entry["ServerlessUpdateConfig"], "ProvisionedConcurrency")) {
      return Validation("ServerlessUpdateConfig for variant " + variant +
                        " must give MaxConcurrency, ProvisionedConcurrency or both.");
    }
    if (!Has(entry, "DesiredWeight") && !Has(entry, "DesiredInstanceCount") && !Has(entry, "ServerlessUpdateConfig")) {
      return Validation("Give DesiredWeight, DesiredInstanceCount or ServerlessUpdateConfig for variant " + variant +
                        ".");
    }
  }
  return std::nullopt;
}

// The model allows 0, but AWS accepts 0 instances only for variants that can scale to zero:
// those of asynchronous endpoints (requests wait in the queue, serving-contract.md §11.5) and
// ManagedInstanceScaling ones, which Kiln does not offer.
std::optional<aws::AwsError> CheckScaleToZero(const store::EndpointRecord& r, const json& in) {
  const store::Deployment& target = r.pending ? *r.pending : r.deployment;
  for (const json& entry : in["DesiredWeightsAndCapacities"]) {
    const json* variant = target.FindVariant(entry["VariantName"].get<std::string>());
    if (variant != nullptr && Has(*variant, "ServerlessConfig") && Has(entry, "DesiredInstanceCount")) {
      return Validation("Variant " + entry["VariantName"].get<std::string>() +
                        " is serverless: its capacity follows its ServerlessConfig, not DesiredInstanceCount.");
    }
  }
  const bool async = target.endpoint_config.is_object() && target.endpoint_config.contains("AsyncInferenceConfig");
  if (async) return std::nullopt;
  for (const json& entry : in["DesiredWeightsAndCapacities"]) {
    if (Has(entry, "DesiredInstanceCount") && entry["DesiredInstanceCount"].get<int64_t>() == 0) {
      return Validation("DesiredInstanceCount 0 for variant " + entry["VariantName"].get<std::string>() +
                        " needs scale to zero, which Kiln offers only for asynchronous endpoints "
                        "(AsyncInferenceConfig); give 1 or more.");
    }
  }
  return std::nullopt;
}

// ServerlessUpdateConfig (serving-contract.md §12) applies to serverless variants only, and the
// resulting ProvisionedConcurrency may not exceed the resulting MaxConcurrency.
std::optional<aws::AwsError> CheckServerlessUpdate(const store::EndpointRecord& r, const json& in) {
  const store::Deployment& target = r.pending ? *r.pending : r.deployment;
  for (const json& entry : in["DesiredWeightsAndCapacities"]) {
    if (!Has(entry, "ServerlessUpdateConfig")) continue;
    const std::string name = entry["VariantName"].get<std::string>();
    const json* variant = target.FindVariant(name);
    if (variant == nullptr || !Has(*variant, "ServerlessConfig")) {
      return Validation("Variant " + name +
                        " is not serverless: ServerlessUpdateConfig applies only to variants with a ServerlessConfig.");
    }
    store::VariantDesired values;
    if (auto it = r.desired.find(name); it != r.desired.end()) values = it->second;
    ApplyServerlessUpdate(entry["ServerlessUpdateConfig"], values);
    const json effective = store::EffectiveServerlessConfig(*variant, &values);
    const int64_t max = effective.value("MaxConcurrency", int64_t{1});
    if (Has(effective, "ProvisionedConcurrency") && effective["ProvisionedConcurrency"].get<int64_t>() > max) {
      return Validation("ProvisionedConcurrency " + std::to_string(effective["ProvisionedConcurrency"].get<int64_t>()) +
                        " of variant " + name + " exceeds its MaxConcurrency " + std::to_string(max) +
                        ": give a ProvisionedConcurrency at most MaxConcurrency.");
    }
  }
  return std::nullopt;
}

// The variants of DesiredWeightsAndCapacities that `record`'s deployment lacks, comma-separated
// ("" when it has them all).
std::string MissingVariants(const store::EndpointRecord& record, const json& in) {
  const auto names = record.deployment.VariantNames();
  std::string missing;
  for (const json& entry : in["DesiredWeightsAndCapacities"]) {
    const std::string variant = entry["VariantName"].get<std::string>();
    if (std::find(names.begin(), names.end(), variant) == names.end()) {
      missing += (missing.empty() ? "" : ", ") + variant;
    }
  }
  return missing;
}

JsonOutcome UpdateEndpointWeightsAndCapacities(Operations& ops, const json& in) {
  const std::string name = in["EndpointName"].get<std::string>();
  if (auto error = CheckDesiredWeightsAndCapacities(in)) return *error;
  std::optional<aws::AwsError> refused;
  auto updated = ops.endpoints.Mutate(name, [&](store::EndpointRecord& r) {
    if ((refused = CheckUpdatable(r))) return Status::FailedPrecondition("not updatable");
    if (std::string missing = MissingVariants(r, in); !missing.empty()) {
      refused = Validation("The endpoint \"" + r.arn + "\" has no production variant named " + missing + ".");
      return Status::FailedPrecondition("unknown variant");
    }
    if ((refused = CheckScaleToZero(r, in))) return Status::FailedPrecondition("scale to zero");
    if ((refused = CheckServerlessUpdate(r, in))) return Status::FailedPrecondition("serverless update");
    for (const json& entry : in["DesiredWeightsAndCapacities"]) {
      store::VariantDesired& values = r.desired[entry["VariantName"].get<std::string>()];
      if (Has(entry, "DesiredWeight")) values.weight = entry["DesiredWeight"].get<double>();
      if (Has(entry, "DesiredInstanceCount")) values.instance_count = entry["DesiredInstanceCount"].get<int64_t>();
      if (Has(entry, "ServerlessUpdateConfig")) ApplyServerlessUpdate(entry["ServerlessUpdateConfig"], values);
    }
    control::SetStatus(r, EndpointStatus::kUpdating);
    r.failure_reason.clear();
    r.last_modified_millis = NowMillis(ops.ctx);
    return Status::Ok();
  });
  if (auto error = ChangeError(ops, name, refused, updated)) return *error;
  Notify(ops.ctx, updated->name);
  return json{{"EndpointArn", updated->arn}};
}

// Any state but Deleting (§9.2: Kiln lets a Creating/Updating endpoint be deleted; AWS answers
// "Cannot update in-progress endpoint" then, and the same text when it is already Deleting,
// which is the one case Kiln refuses). The controller removes the row once its instances are
// gone; Describe then answers "Could not find endpoint" (the EndpointDeleted waiter).
JsonOutcome DeleteEndpoint(Operations& ops, const json& in) {
  const std::string name = in["EndpointName"].get<std::string>();
  std::optional<aws::AwsError> refused;
  auto updated = ops.endpoints.Mutate(name, [&](store::EndpointRecord& r) {
    if (r.status == EndpointStatus::kDeleting) {
      refused = Validation("Cannot update in-progress endpoint \"" + r.arn + "\".");
      return Status::FailedPrecondition("already deleting");
    }
    control::SetStatus(r, EndpointStatus::kDeleting);
    r.last_modified_millis = NowMillis(ops.ctx);
    return Status::Ok();
  });
  if (auto error = ChangeError(ops, name, refused, updated)) return *error;
  Notify(ops.ctx, updated->name);
  return json::object();
}

}  // namespace

void RegisterEndpointOperations(JsonService* service, const EndpointsContext& context) {
  auto ops = std::make_shared<Operations>(context);
  using Operation = JsonOutcome (*)(Operations&, const json&);
  for (auto [name, op] : {std::pair<const char*, Operation>{"CreateEndpoint", CreateEndpoint},
                          {"DescribeEndpoint", DescribeEndpoint},
                          {"ListEndpoints", ListEndpoints},
                          {"UpdateEndpoint", UpdateEndpoint},
                          {"UpdateEndpointWeightsAndCapacities", UpdateEndpointWeightsAndCapacities},
                          {"DeleteEndpoint", DeleteEndpoint}}) {
    // `op = op`: clang before 16 cannot capture a structured binding by name.
    service->Register(
        name, [ops, op = op](const aws::RequestContext&, const json& in) -> JsonOutcome { return op(*ops, in); });
  }
}

void RegisterInferenceOperations(JsonService* service, const EndpointsContext& context) {
  RegisterModelOperations(service, context);
  RegisterEndpointConfigOperations(service, context);
  RegisterEndpointOperations(service, context);
}

}  // namespace kiln::api
