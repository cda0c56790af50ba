#include "api/autoscaling.h"

#include <cstdlib>
#include <optional>
#include <set>
#include <variant>
#include <vector>

#include "api/inference_common.h"
#include "api/paging.h"
#include "base/ids.h"
#include "base/log.h"
#include "control/autoscaler.h"
#include "store/autoscaling_repository.h"
#include "store/endpoint_repository.h"

namespace kiln::api {
namespace {

using nlohmann::json;
using store::AutoscalingKind;
using store::AutoscalingRecord;

constexpr size_t kDefaultMaxResults = 50;

aws::AwsError Validation(std::string message) { return aws::AwsError("ValidationException", std::move(message)); }
aws::AwsError NotFound(std::string message) { return aws::AwsError("ObjectNotFoundException", std::move(message)); }
aws::AwsError Internal(const Status& status) {
  aws::AwsError error("InternalServiceException", "Internal error: " + status.message(), 500);
  error.sender_fault = false;
  return error;
}

bool Has(const json& in, const char* member) { return in.is_object() && in.contains(member) && !in[member].is_null(); }
std::string StringOf(const json& in, const char* member) {
  return Has(in, member) && in[member].is_string() ? in[member].get<std::string>() : "";
}
json Seconds(int64_t millis) { return static_cast<double>(millis) / 1000.0; }

// The (namespace, resource, dimension) a request names.
struct Key {
  std::string service_namespace;
  std::string resource_id;
  std::string dimension;
};

Key KeyOf(const json& in) {
  return {StringOf(in, "ServiceNamespace"), StringOf(in, "ResourceId"), StringOf(in, "ScalableDimension")};
}

std::string Describe(const Key& key) {
  return "service namespace: " + key.service_namespace + ", resource ID: " + key.resource_id +
         ", scalable dimension: " + key.dimension;
}

struct Operations {
  explicit Operations(const AutoscalingContext& context)
      : ctx(context), repo(context.database), endpoints(context.database) {}
  int64_t Now() const { return ctx.clock ? ctx.clock->NowMillis() : Clock::System().NowMillis(); }
  AutoscalingContext ctx;
  store::AutoscalingRepository repo;
  store::EndpointRepository endpoints;
};

// Kiln scales endpoint variants' instance counts only (serving-contract.md §10).
std::optional<aws::AwsError> CheckKey(const Key& key) {
  if (key.service_namespace != control::kAutoscalingNamespace) {
    return Validation(
        "Unsupported service namespace, resource type or scalable dimension: Kiln scales SageMaker "
        "endpoint variants only (ServiceNamespace sagemaker).");
  }
  if (key.resource_id.rfind("inference-component/", 0) == 0 ||
      key.dimension == "sagemaker:inference-component:DesiredCopyCount") {
    return Validation(
        "Inference components are not supported by Kiln; scale endpoint variants "
        "(ResourceId endpoint/<EndpointName>/variant/<VariantName>).");
  }
  if (!control::ParseVariantResourceId(key.resource_id)) {
    return Validation("Unsupported service namespace, resource type or scalable dimension: ResourceId " +
                      key.resource_id + " is not of the form endpoint/<EndpointName>/variant/<VariantName>.");
  }
  if (key.dimension != control::kVariantInstanceDimension &&
      key.dimension != control::kProvisionedConcurrencyDimension) {
    return Validation("Unsupported service namespace, resource type or scalable dimension: " + key.dimension +
                      " is not a dimension of a SageMaker endpoint variant (use "
                      "sagemaker:variant:DesiredInstanceCount, or sagemaker:variant:DesiredProvisionedConcurrency "
                      "for a serverless variant).");
  }
  return std::nullopt;
}

// The target a request names, or ObjectNotFoundException as AWS words it for policies.
std::variant<AutoscalingRecord, aws::AwsError> RegisteredTarget(Operations& ops, const Key& key) {
  auto target = ops.repo.Get(AutoscalingKind::kTarget, key.service_namespace, key.resource_id, key.dimension, "");
  if (target.status().IsNotFound()) return NotFound("No scalable target registered for " + Describe(key));
  if (!target.ok()) return Internal(target.status());
  return std::move(target).value();
}

// ---- paging ----

struct Page {
  std::vector<AutoscalingRecord> rows;
  std::optional<std::string> next_token;
};

std::variant<Page, aws::AwsError> ReadPage(Operations& ops, store::AutoscalingQuery query, const json& in) {
  const int64_t now = ops.Now();
  size_t max_results = kDefaultMaxResults;
  if (Has(in, "MaxResults") && in["MaxResults"].is_number_integer()) {
    max_results = static_cast<size_t>(std::max<int64_t>(1, in["MaxResults"].get<int64_t>()));
  }
  if (Has(in, "NextToken")) {
    auto cursor = DecodeNextToken(StringOf(in, "NextToken"), in, now);
    if (!cursor || !cursor->is_object() || !(*cursor)["s"].is_number_integer()) {
      return aws::AwsError("InvalidNextTokenException",
                           "The NextToken is invalid: pass the NextToken of the "
                           "previous response to the same request.");
    }
    query.after_seq = (*cursor)["s"].get<int64_t>();
  }
  query.limit = max_results + 1;
  auto rows = ops.repo.List(query);
  if (!rows.ok()) return Internal(rows.status());
  Page page;
  page.rows = std::move(rows).value();
  if (page.rows.size() > max_results) {
    page.rows.resize(max_results);
    page.next_token = EncodeNextToken(json{{"s", page.rows.back().seq}}, in, now);
  }
  return page;
}

store::AutoscalingQuery QueryOf(AutoscalingKind kind, const json& in) {
  store::AutoscalingQuery query;
  query.kind = kind;
  query.service_namespace = StringOf(in, "ServiceNamespace");
  query.scalable_dimension = StringOf(in, "ScalableDimension");
  if (Has(in, "ResourceId")) query.resource_ids.insert(StringOf(in, "ResourceId"));
  return query;
}

// ---- scalable targets ----

std::string DefaultRole(const Operations& ops) {
  return "arn:aws:iam::" + ops.ctx.account_id +
         ":role/aws-service-role/sagemaker.application-autoscaling.amazonaws.com/"
         "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint";
}

std::string IdWithoutDashes() {
  std::string id;
  for (char c : NewUuid())
    if (c != '-') id += c;
  return id;
}

JsonOutcome RegisterScalableTarget(Operations& ops, const json& in) {
  const Key key = KeyOf(in);
  if (auto error = CheckKey(key)) return *error;
  const auto resource = *control::ParseVariantResourceId(key.resource_id);
  auto endpoint = ops.endpoints.Get(resource.endpoint);
  if (endpoint.status().IsNotFound()) {
    return Validation("Endpoint " + resource.endpoint + " does not exist (ResourceId " + key.resource_id +
                      "); create the endpoint before registering its variant.");
  }
  if (!endpoint.ok()) return Internal(endpoint.status());
  const store::Deployment& deployment = endpoint->pending ? *endpoint->pending : endpoint->deployment;
  if (!deployment.FindVariant(resource.variant)) {
    return Validation("The variant " + resource.variant + " does not exist in endpoint " + resource.endpoint +
                      " (ResourceId " + key.resource_id + ").");
  }
  // A serverless variant's pool follows its requests (control/serverless_scaler.h); a count
  // written here would fight it. What scales there is its ProvisionedConcurrency, which AWS lets
  // be registered only where the variant was configured with one.
  const json& config_variant = *deployment.FindVariant(resource.variant);
  const bool serverless = Has(config_variant, "ServerlessConfig");
  if (serverless && key.dimension == control::kVariantInstanceDimension) {
    return Validation("The variant " + resource.variant + " of endpoint " + resource.endpoint +
                      " is serverless: its capacity follows its requests up to ServerlessConfig.MaxConcurrency; "
                      "scale its provisioned concurrency (sagemaker:variant:DesiredProvisionedConcurrency) instead.");
  }
  if (key.dimension == control::kProvisionedConcurrencyDimension &&
      (!serverless || !Has(config_variant["ServerlessConfig"], "ProvisionedConcurrency"))) {
    return Validation("The variant " + resource.variant + " of endpoint " + resource.endpoint +
                      " has no provisioned concurrency: sagemaker:variant:DesiredProvisionedConcurrency applies "
                      "only to serverless variants whose ServerlessConfig sets ProvisionedConcurrency.");
  }
  const bool async = deployment.endpoint_config.is_object() && Has(deployment.endpoint_config, "AsyncInferenceConfig");
  auto existing = ops.repo.Get(AutoscalingKind::kTarget, key.service_namespace, key.resource_id, key.dimension, "");
  if (!existing.ok() && !existing.status().IsNotFound()) return Internal(existing.status());
  AutoscalingRecord target;
  if (existing.ok()) {
    target = std::move(existing).value();
  } else {
    if (!Has(in, "MinCapacity") || !Has(in, "MaxCapacity")) {
      return Validation("MinCapacity and MaxCapacity are required to register a new scalable target (" +
                        key.resource_id + ").");
    }
    target.kind = AutoscalingKind::kTarget;
    target.service_namespace = key.service_namespace;
    target.resource_id = key.resource_id;
    target.scalable_dimension = key.dimension;
    target.creation_millis = ops.Now();
    target.doc = {{"ServiceNamespace", key.service_namespace},
                  {"ResourceId", key.resource_id},
                  {"ScalableDimension", key.dimension},
                  {"RoleARN", DefaultRole(ops)},
                  {"SuspendedState",
                   {{"DynamicScalingInSuspended", false},
                    {"DynamicScalingOutSuspended", false},
                    {"ScheduledScalingSuspended", false}}},
                  {"ScalableTargetARN", "arn:aws:application-autoscaling:" + ops.ctx.region + ":" + ops.ctx.account_id +
                                            ":scalable-target/sm" + IdWithoutDashes()}};
  }
  if (Has(in, "MinCapacity")) target.doc["MinCapacity"] = in["MinCapacity"].get<int64_t>();
  if (Has(in, "MaxCapacity")) target.doc["MaxCapacity"] = in["MaxCapacity"].get<int64_t>();
  if (Has(in, "RoleARN")) target.doc["RoleARN"] = in["RoleARN"];
  if (Has(in, "SuspendedState")) {
    for (const char* flag : {"DynamicScalingInSuspended", "DynamicScalingOutSuspended", "ScheduledScalingSuspended"}) {
      if (Has(in["SuspendedState"], flag)) target.doc["SuspendedState"][flag] = in["SuspendedState"][flag];
    }
  }
  const int64_t min = target.doc["MinCapacity"].get<int64_t>();
  const int64_t max = target.doc["MaxCapacity"].get<int64_t>();
  const int64_t floor = async ? 0 : 1;
  if (key.dimension == control::kProvisionedConcurrencyDimension && max > 200) {
    return Validation("MaxCapacity " + std::to_string(max) +
                      " exceeds 200, the most ProvisionedConcurrency a "
                      "serverless variant may have.");
  }
  if (min < floor) {
    return Validation("MinCapacity " + std::to_string(min) + " is below " + std::to_string(floor) + " for " +
                      key.resource_id +
                      (async ? "." : ": only asynchronous endpoints (AsyncInferenceConfig) may scale to 0."));
  }
  if (max < min) {
    return Validation("Maximum capacity cannot be less than minimum capacity (MinCapacity " + std::to_string(min) +
                      ", MaxCapacity " + std::to_string(max) + ").");
  }
  auto stored = ops.repo.Put(target);
  if (!stored.ok()) return Internal(stored.status());
  return json{{"ScalableTargetARN", stored->doc["ScalableTargetARN"]}};
}

json RenderTarget(const AutoscalingRecord& r) {
  json out = r.doc;
  out["CreationTime"] = Seconds(r.creation_millis);
  return out;
}

JsonOutcome DescribeScalableTargets(Operations& ops, const json& in) {
  store::AutoscalingQuery query = QueryOf(AutoscalingKind::kTarget, in);
  query.resource_ids.clear();
  if (Has(in, "ResourceIds")) {
    for (const json& id : in["ResourceIds"]) query.resource_ids.insert(id.get<std::string>());
  }
  auto page = ReadPage(ops, query, in);
  if (auto* error = std::get_if<aws::AwsError>(&page)) return *error;
  json targets = json::array();
  for (const auto& r : std::get<Page>(page).rows) targets.push_back(RenderTarget(r));
  json out = {{"ScalableTargets", targets}};
  if (auto& token = std::get<Page>(page).next_token) out["NextToken"] = *token;
  return out;
}

JsonOutcome DeregisterScalableTarget(Operations& ops, const json& in) {
  const Key key = KeyOf(in);
  if (auto error = CheckKey(key)) return *error;
  Status deleted = ops.repo.DeleteTarget(key.service_namespace, key.resource_id, key.dimension);
  if (deleted.IsNotFound()) return NotFound("No scalable target found for " + Describe(key));
  if (!deleted.ok()) return Internal(deleted);
  return json::object();
}

// ---- scaling policies ----

std::optional<aws::AwsError> CheckTargetTracking(const json& config, const std::string& dimension) {
  const bool predefined = Has(config, "PredefinedMetricSpecification");
  const bool customized = Has(config, "CustomizedMetricSpecification");
  if (predefined == customized) {
    return Validation(
        "Give exactly one of PredefinedMetricSpecification and CustomizedMetricSpecification in "
        "TargetTrackingScalingPolicyConfiguration.");
  }
  if (!(config["TargetValue"].get<double>() > 0)) {
    return Validation("TargetValue must be greater than 0.");
  }
  for (const char* cooldown : {"ScaleOutCooldown", "ScaleInCooldown"}) {
    if (Has(config, cooldown) && config[cooldown].get<int64_t>() < 0) {
      return Validation(std::string(cooldown) + " must be 0 or more seconds.");
    }
  }
  if (predefined) {
    const std::string type = StringOf(config["PredefinedMetricSpecification"], "PredefinedMetricType");
    // Each predefined metric belongs to one dimension (AWS refuses the other pairings).
    const bool provisioned = dimension == control::kProvisionedConcurrencyDimension;
    const std::string_view expected =
        provisioned ? control::kProvisionedConcurrencyMetric : control::kInvocationsPerInstanceMetric;
    if (type == expected) return std::nullopt;
    if (type == control::kInvocationsPerInstanceMetric || type == control::kProvisionedConcurrencyMetric) {
      return Validation("PredefinedMetricType " + type + " does not apply to " + dimension + "; use " +
                        std::string(expected) + ".");
    }
    if (type.rfind("SageMaker", 0) == 0) {
      return Validation("PredefinedMetricType " + type + " is not supported by Kiln; use " + std::string(expected) +
                        " or a CustomizedMetricSpecification.");
    }
    return Validation("PredefinedMetricType " + type + " is not valid for a SageMaker endpoint variant; use " +
                      std::string(expected) + ".");
  }
  const json& spec = config["CustomizedMetricSpecification"];
  if (Has(spec, "Metrics")) {
    return Validation(
        "CustomizedMetricSpecification.Metrics (metric math) is not supported by Kiln; give "
        "MetricName, Namespace, Dimensions and Statistic.");
  }
  if (!Has(spec, "MetricName") || !Has(spec, "Namespace") || !Has(spec, "Statistic")) {
    return Validation("CustomizedMetricSpecification needs MetricName, Namespace and Statistic.");
  }
  return std::nullopt;
}

std::optional<aws::AwsError> CheckStepScaling(const json& config) {
  if (!Has(config, "AdjustmentType")) return Validation("StepScalingPolicyConfiguration needs an AdjustmentType.");
  if (!Has(config, "StepAdjustments") || config["StepAdjustments"].empty()) {
    return Validation("StepScalingPolicyConfiguration needs at least one StepAdjustment.");
  }
  for (const json& step : config["StepAdjustments"]) {
    if (!Has(step, "MetricIntervalLowerBound") && !Has(step, "MetricIntervalUpperBound")) {
      return Validation("A StepAdjustment needs MetricIntervalLowerBound, MetricIntervalUpperBound or both.");
    }
    if (Has(step, "MetricIntervalLowerBound") && Has(step, "MetricIntervalUpperBound") &&
        step["MetricIntervalLowerBound"].get<double>() >= step["MetricIntervalUpperBound"].get<double>()) {
      return Validation("A StepAdjustment's MetricIntervalLowerBound must be less than its MetricIntervalUpperBound.");
    }
  }
  return std::nullopt;
}

json AlarmOf(const Operations& ops, const std::string& name) {
  return {{"AlarmName", name},
          {"AlarmARN", "arn:aws:cloudwatch:" + ops.ctx.region + ":" + ops.ctx.account_id + ":alarm:" + name}};
}

JsonOutcome PutScalingPolicy(Operations& ops, const json& in) {
  const Key key = KeyOf(in);
  if (auto error = CheckKey(key)) return *error;
  const std::string name = StringOf(in, "PolicyName");
  const std::string type = Has(in, "PolicyType") ? StringOf(in, "PolicyType") : "StepScaling";
  if (type == "PredictiveScaling") {
    return Validation(
        "PredictiveScaling policies are not supported by Kiln; use TargetTrackingScaling or "
        "StepScaling.");
  }
  const char* config_member =
      type == "TargetTrackingScaling" ? "TargetTrackingScalingPolicyConfiguration" : "StepScalingPolicyConfiguration";
  const char* other_member =
      type == "TargetTrackingScaling" ? "StepScalingPolicyConfiguration" : "TargetTrackingScalingPolicyConfiguration";
  if (!Has(in, config_member)) {
    return Validation(std::string(config_member) + " is required for a " + type + " policy.");
  }
  if (Has(in, other_member) || Has(in, "PredictiveScalingPolicyConfiguration")) {
    return Validation("Only " + std::string(config_member) + " may be given for a " + type + " policy.");
  }
  const json& config = in[config_member];
  if (auto error =
          type == "TargetTrackingScaling" ? CheckTargetTracking(config, key.dimension) : CheckStepScaling(config)) {
    return *error;
  }
  auto target = RegisteredTarget(ops, key);
  if (auto* error = std::get_if<aws::AwsError>(&target)) return *error;
  auto existing = ops.repo.Get(AutoscalingKind::kPolicy, key.service_namespace, key.resource_id, key.dimension, name);
  if (!existing.ok() && !existing.status().IsNotFound()) return Internal(existing.status());
  AutoscalingRecord policy;
  policy.kind = AutoscalingKind::kPolicy;
  policy.service_namespace = key.service_namespace;
  policy.resource_id = key.resource_id;
  policy.scalable_dimension = key.dimension;
  policy.name = name;
  policy.creation_millis = ops.Now();
  std::string arn = "arn:aws:autoscaling:" + ops.ctx.region + ":" + ops.ctx.account_id + ":scalingPolicy:" + NewUuid() +
                    ":resource/" + key.service_namespace + "/" + key.resource_id + ":policyName/" + name;
  json alarms = json::array();
  if (existing.ok()) {
    arn = StringOf(existing->doc, "PolicyARN");
    if (StringOf(existing->doc, "PolicyType") == type && Has(existing->doc, "Alarms")) alarms = existing->doc["Alarms"];
  }
  if (type == "TargetTrackingScaling" && alarms.empty()) {
    const std::string prefix = "TargetTracking-" + key.resource_id;
    alarms.push_back(AlarmOf(ops, prefix + "-AlarmHigh-" + NewUuid()));
    alarms.push_back(AlarmOf(ops, prefix + "-AlarmLow-" + NewUuid()));
  }
  policy.doc = {{"PolicyARN", arn},
                {"PolicyName", name},
                {"ServiceNamespace", key.service_namespace},
                {"ResourceId", key.resource_id},
                {"ScalableDimension", key.dimension},
                {"PolicyType", type},
                {config_member, config},
                {"Alarms", alarms},
                {"UpdatedMillis", ops.Now()}};
  auto stored = ops.repo.Put(policy);
  if (!stored.ok()) return Internal(stored.status());
  // A replaced policy starts its alarms afresh.
  if (existing.ok()) (void)ops.repo.SetState(*stored, json::object());
  json out = {{"PolicyARN", arn}};
  if (type == "TargetTrackingScaling") out["Alarms"] = alarms;
  return out;
}

json RenderPolicy(const AutoscalingRecord& r) {
  json out = r.doc;
  out.erase("UpdatedMillis");
  if (out["Alarms"].empty()) out.erase("Alarms");
  out["CreationTime"] = Seconds(r.creation_millis);
  return out;
}

JsonOutcome DescribeScalingPolicies(Operations& ops, const json& in) {
  store::AutoscalingQuery query = QueryOf(AutoscalingKind::kPolicy, in);
  if (Has(in, "PolicyNames")) {
    for (const json& n : in["PolicyNames"]) query.names.insert(n.get<std::string>());
  }
  auto page = ReadPage(ops, query, in);
  if (auto* error = std::get_if<aws::AwsError>(&page)) return *error;
  json policies = json::array();
  for (const auto& r : std::get<Page>(page).rows) policies.push_back(RenderPolicy(r));
  json out = {{"ScalingPolicies", policies}};
  if (auto& token = std::get<Page>(page).next_token) out["NextToken"] = *token;
  return out;
}

JsonOutcome DeleteScalingPolicy(Operations& ops, const json& in) {
  const Key key = KeyOf(in);
  if (auto error = CheckKey(key)) return *error;
  const std::string name = StringOf(in, "PolicyName");
  Status deleted =
      ops.repo.Delete(AutoscalingKind::kPolicy, key.service_namespace, key.resource_id, key.dimension, name);
  if (deleted.IsNotFound()) return NotFound("No scaling policy found for " + Describe(key) + ", policy name: " + name);
  if (!deleted.ok()) return Internal(deleted);
  return json::object();
}

// ---- activities ----

JsonOutcome DescribeScalingActivities(Operations& ops, const json& in) {
  store::AutoscalingQuery query = QueryOf(AutoscalingKind::kActivity, in);
  query.descending = true;
  auto page = ReadPage(ops, query, in);
  if (auto* error = std::get_if<aws::AwsError>(&page)) return *error;
  json activities = json::array();
  for (const auto& r : std::get<Page>(page).rows) {
    json a = {{"ActivityId", r.name},
              {"ServiceNamespace", r.service_namespace},
              {"ResourceId", r.resource_id},
              {"ScalableDimension", r.scalable_dimension},
              {"Description", StringOf(r.doc, "Description")},
              {"Cause", StringOf(r.doc, "Cause")},
              {"StartTime", Seconds(r.creation_millis)},
              {"StatusCode", StringOf(r.doc, "StatusCode")}};
    if (Has(r.doc, "EndMillis")) a["EndTime"] = Seconds(r.doc["EndMillis"].get<int64_t>());
    if (Has(r.doc, "StatusMessage")) a["StatusMessage"] = r.doc["StatusMessage"];
    activities.push_back(std::move(a));
  }
  json out = {{"ScalingActivities", activities}};
  if (auto& token = std::get<Page>(page).next_token) out["NextToken"] = *token;
  return out;
}

// ---- scheduled actions ----

JsonOutcome PutScheduledAction(Operations& ops, const json& in) {
  const Key key = KeyOf(in);
  if (auto error = CheckKey(key)) return *error;
  const std::string name = StringOf(in, "ScheduledActionName");
  auto target = RegisteredTarget(ops, key);
  if (auto* error = std::get_if<aws::AwsError>(&target)) return *error;
  auto existing =
      ops.repo.Get(AutoscalingKind::kScheduledAction, key.service_namespace, key.resource_id, key.dimension, name);
  if (!existing.ok() && !existing.status().IsNotFound()) return Internal(existing.status());
  AutoscalingRecord action;
  if (existing.ok()) {
    action = std::move(existing).value();
  } else {
    if (!Has(in, "Schedule")) return Validation("Schedule is required for a new scheduled action (" + name + ").");
    action.kind = AutoscalingKind::kScheduledAction;
    action.service_namespace = key.service_namespace;
    action.resource_id = key.resource_id;
    action.scalable_dimension = key.dimension;
    action.name = name;
    action.creation_millis = ops.Now();
    action.doc = {{"ScheduledActionName", name},
                  {"ScheduledActionARN", "arn:aws:autoscaling:" + ops.ctx.region + ":" + ops.ctx.account_id +
                                             ":scheduledAction:" + NewUuid() + ":resource/" + key.service_namespace +
                                             "/" + key.resource_id + ":scheduledActionName/" + name},
                  {"ServiceNamespace", key.service_namespace},
                  {"ResourceId", key.resource_id},
                  {"ScalableDimension", key.dimension}};
  }
  if (Has(in, "Schedule")) {
    auto schedule = control::ParseScalingSchedule(StringOf(in, "Schedule"));
    if (!schedule.ok())
      return Validation("Invalid Schedule " + StringOf(in, "Schedule") + ": " + schedule.status().message());
    action.doc["Schedule"] = in["Schedule"];
  }
  if (Has(in, "Timezone")) {
    const std::string zone = StringOf(in, "Timezone");
    if (zone != "UTC" && zone != "Etc/UTC" && zone != "GMT") {
      return Validation("Timezone " + zone + " is not supported by Kiln: schedules run in UTC (give UTC or omit it).");
    }
    action.doc["Timezone"] = zone;
  }
  for (auto [member, stored] : {std::pair{"StartTime", "StartMillis"}, std::pair{"EndTime", "EndMillis"}}) {
    if (!Has(in, member)) continue;
    auto millis = inference::TimestampMember(in, member);
    if (!millis) return Validation(std::string(member) + " is not a timestamp.");
    action.doc[stored] = *millis;
  }
  if (Has(action.doc, "StartMillis") && Has(action.doc, "EndMillis") &&
      action.doc["StartMillis"].get<int64_t>() > action.doc["EndMillis"].get<int64_t>()) {
    return Validation("StartTime must be before EndTime.");
  }
  if (Has(in, "ScalableTargetAction")) {
    const json& bounds = in["ScalableTargetAction"];
    if (Has(bounds, "MinCapacity") && Has(bounds, "MaxCapacity") &&
        bounds["MinCapacity"].get<int64_t>() > bounds["MaxCapacity"].get<int64_t>()) {
      return Validation("ScalableTargetAction: Maximum capacity cannot be less than minimum capacity.");
    }
    if (!Has(bounds, "MinCapacity") && !Has(bounds, "MaxCapacity")) {
      return Validation("ScalableTargetAction needs MinCapacity, MaxCapacity or both.");
    }
    action.doc["ScalableTargetAction"] = bounds;
  }
  action.state = json::object();  // the next run is computed afresh
  auto stored = ops.repo.Put(action);
  if (!stored.ok()) return Internal(stored.status());
  return json::object();
}

JsonOutcome DescribeScheduledActions(Operations& ops, const json& in) {
  store::AutoscalingQuery query = QueryOf(AutoscalingKind::kScheduledAction, in);
  if (Has(in, "ScheduledActionNames")) {
    for (const json& n : in["ScheduledActionNames"]) query.names.insert(n.get<std::string>());
  }
  auto page = ReadPage(ops, query, in);
  if (auto* error = std::get_if<aws::AwsError>(&page)) return *error;
  json actions = json::array();
  for (const auto& r : std::get<Page>(page).rows) {
    json a = r.doc;
    a.erase("StartMillis");
    a.erase("EndMillis");
    if (Has(r.doc, "StartMillis")) a["StartTime"] = Seconds(r.doc["StartMillis"].get<int64_t>());
    if (Has(r.doc, "EndMillis")) a["EndTime"] = Seconds(r.doc["EndMillis"].get<int64_t>());
    a["CreationTime"] = Seconds(r.creation_millis);
    actions.push_back(std::move(a));
  }
  json out = {{"ScheduledActions", actions}};
  if (auto& token = std::get<Page>(page).next_token) out["NextToken"] = *token;
  return out;
}

JsonOutcome DeleteScheduledAction(Operations& ops, const json& in) {
  const Key key = KeyOf(in);
  if (auto error = CheckKey(key)) return *error;
  const std::string name = StringOf(in, "ScheduledActionName");
  Status deleted =
      ops.repo.Delete(AutoscalingKind::kScheduledAction, key.service_namespace, key.resource_id, key.dimension, name);
  if (deleted.IsNotFound()) {
    return NotFound("No scheduled action found for " + Describe(key) + ", scheduled action name: " + name);
  }
  if (!deleted.ok()) return Internal(deleted);
  return json::object();
}

}  // namespace

std::shared_ptr<const ServiceModel> AutoscalingModel() {
  static const std::shared_ptr<const ServiceModel> model = [] {
    auto parsed = ServiceModel::Parse(EmbeddedAutoscalingModelJson());
    if (!parsed.ok()) {
      KLOG(error, "embedded Application Auto Scaling model does not parse", {{"error", parsed.status().message()}});
      std::abort();
    }
    return std::move(parsed).value();
  }();
  return model;
}

std::function<Result<std::vector<json>>()> ScalingAlarmSource(store::Database* database, int period_seconds) {
  return [database, period_seconds]() -> Result<std::vector<json>> {
    ASSIGN_OR_RETURN(auto alarms, control::ListScalingAlarms(database, period_seconds));
    std::vector<json> out;
    for (const control::ScalingAlarm& a : alarms) {
      json dimensions = json::array();
      for (const auto& [name, value] : a.dimensions) dimensions.push_back({{"Name", name}, {"Value", value}});
      json alarm = {
          {"AlarmName", a.name},
          {"AlarmArn", a.arn},
          {"AlarmDescription", "DO NOT EDIT OR DELETE. For TargetTrackingScaling policy " + a.policy_arn + "."},
          {"AlarmConfigurationUpdatedTimestamp", Seconds(a.configuration_updated_millis)},
          {"ActionsEnabled", true},
          {"OKActions", json::array()},
          {"AlarmActions", json::array({a.policy_arn})},
          {"InsufficientDataActions", json::array()},
          {"StateValue", a.state},
          {"StateReason", a.state_reason},
          {"StateUpdatedTimestamp", Seconds(a.state_updated_millis)},
          {"StateTransitionedTimestamp", Seconds(a.state_updated_millis)},
          {"MetricName", a.metric_name},
          {"Namespace", a.ns},
          {"Statistic", a.statistic},
          {"Dimensions", dimensions},
          {"Period", a.period_seconds},
          {"EvaluationPeriods", a.evaluation_periods},
          {"DatapointsToAlarm", a.evaluation_periods},
          {"Threshold", a.threshold},
          {"ComparisonOperator", a.comparison}};
      if (!a.unit.empty()) alarm["Unit"] = a.unit;
      out.push_back(std::move(alarm));
    }
    return out;
  };
}

void RegisterAutoscalingOperations(JsonService* service, const AutoscalingContext& context) {
  service->SetModel(AutoscalingModel());
  auto ops = std::make_shared<Operations>(context);
  using Operation = JsonOutcome (*)(Operations&, const json&);
  for (auto [name, op] : {std::pair<const char*, Operation>{"RegisterScalableTarget", RegisterScalableTarget},
                          {"DescribeScalableTargets", DescribeScalableTargets},
                          {"DeregisterScalableTarget", DeregisterScalableTarget},
                          {"PutScalingPolicy", PutScalingPolicy},
                          {"DescribeScalingPolicies", DescribeScalingPolicies},
                          {"DeleteScalingPolicy", DeleteScalingPolicy},
                          {"DescribeScalingActivities", DescribeScalingActivities},
                          {"PutScheduledAction", PutScheduledAction},
                          {"DescribeScheduledActions", DescribeScheduledActions},
                          {"DeleteScheduledAction", DeleteScheduledAction}}) {
    service->Register(
        name, [ops, op = op](const aws::RequestContext&, const json& in) -> JsonOutcome { return op(*ops, in); });
  }
}

}  // namespace kiln::api
