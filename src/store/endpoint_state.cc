#include "store/endpoint_state.h"

#include <array>
#include <utility>

#include "store/json_member.h"

namespace kiln::store {
namespace {

using json = nlohmann::json;

constexpr std::array<std::pair<EndpointStatus, std::string_view>, 9> kStatusWords{{
    {EndpointStatus::kOutOfService, "OutOfService"},
    {EndpointStatus::kCreating, "Creating"},
    {EndpointStatus::kUpdating, "Updating"},
    {EndpointStatus::kSystemUpdating, "SystemUpdating"},
    {EndpointStatus::kRollingBack, "RollingBack"},
    {EndpointStatus::kInService, "InService"},
    {EndpointStatus::kDeleting, "Deleting"},
    {EndpointStatus::kFailed, "Failed"},
    {EndpointStatus::kUpdateRollbackFailed, "UpdateRollbackFailed"},
}};

// The wording of this document's errors: "<path> is not <expected>".
Status WrongType(std::string_view path, std::string_view expected) {
  return Status::InvalidArgument(std::string(path) + " is not " + std::string(expected));
}

}  // namespace

std::string_view ToString(EndpointStatus status) {
  for (const auto& [s, word] : kStatusWords) {
    if (s == status) return word;
  }
  return "Unknown";
}

Result<EndpointStatus> ParseEndpointStatus(std::string_view text) {
  for (const auto& [s, word] : kStatusWords) {
    if (word == text) return s;
  }
  return Status::InvalidArgument("'" + std::string(text) + "' is not an EndpointStatus");
}

// ---- Deployment

const json* Deployment::FindVariant(const std::string& variant) const {
  if (!endpoint_config.is_object()) return nullptr;
  for (const char* list : {"ProductionVariants", "ShadowProductionVariants"}) {
    auto variants = endpoint_config.find(list);
    if (variants == endpoint_config.end() || !variants->is_array()) continue;
    for (const json& v : *variants) {
      if (v.is_object() && v.value("VariantName", "") == variant) return &v;
    }
  }
  return nullptr;
}

std::vector<std::string> Deployment::ShadowVariantNames() const {
  std::vector<std::string> names;
  if (!endpoint_config.is_object()) return names;
  auto variants = endpoint_config.find("ShadowProductionVariants");
  if (variants == endpoint_config.end() || !variants->is_array()) return names;
  for (const json& v : *variants) names.push_back(v.is_object() ? v.value("VariantName", "") : "");
  return names;
}

std::vector<std::string> Deployment::AllVariantNames() const {
  std::vector<std::string> names = VariantNames();
  for (std::string& shadow : ShadowVariantNames()) names.push_back(std::move(shadow));
  return names;
}

std::vector<std::string> Deployment::VariantNames() const {
  std::vector<std::string> names;
  if (!endpoint_config.is_object()) return names;
  auto variants = endpoint_config.find("ProductionVariants");
  if (variants == endpoint_config.end() || !variants->is_array()) return names;
  for (const json& v : *variants) names.push_back(v.is_object() ? v.value("VariantName", "") : "");
  return names;
}

json Deployment::Model(const std::string& model_name) const {
  if (!models.is_object()) return json::object();
  auto it = models.find(model_name);
  return it == models.end() ? json::object() : *it;
}

json ToJson(const Deployment& d) {
  return {{"EndpointConfigName", d.config_name},
          {"EndpointConfig", d.endpoint_config},
          {"Models", d.models},
          {"DeployedMillis", d.deployed_millis}};
}

Result<Deployment> DeploymentFromJson(const json& j) {
  RETURN_IF_ERROR(json_member::RequireObject(j, "deployment", WrongType));
  Deployment d;
  RETURN_IF_ERROR(json_member::ReadString(j, "EndpointConfigName", "deployment.", WrongType, d.config_name));
  if (auto it = j.find("EndpointConfig"); it != j.end()) d.endpoint_config = *it;
  if (auto it = j.find("Models"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return WrongType("deployment.Models", "an object");
    d.models = *it;
  }
  RETURN_IF_ERROR(json_member::ReadInt64(j, "DeployedMillis", "deployment.", WrongType, d.deployed_millis));
  return d;
}

// ---- Desired

json EffectiveServerlessConfig(const json& variant, const VariantDesired* desired) {
  if (!variant.is_object() || !variant.contains("ServerlessConfig") || !variant["ServerlessConfig"].is_object()) {
    return nullptr;
  }
  json out = variant["ServerlessConfig"];
  if (desired != nullptr && desired->serverless_max_concurrency) {
    out["MaxConcurrency"] = *desired->serverless_max_concurrency;
  }
  if (desired != nullptr && desired->serverless_provisioned_concurrency) {
    out["ProvisionedConcurrency"] = *desired->serverless_provisioned_concurrency;
  }
  return out;
}

json ToJson(const DesiredVariants& d) {
  json out = json::object();
  for (const auto& [name, v] : d) {
    json entry = json::object();
    if (v.weight) entry["DesiredWeight"] = *v.weight;
    if (v.instance_count) entry["DesiredInstanceCount"] = *v.instance_count;
    if (v.serverless_max_concurrency || v.serverless_provisioned_concurrency) {
      json serverless = json::object();
      if (v.serverless_max_concurrency) serverless["MaxConcurrency"] = *v.serverless_max_concurrency;
      if (v.serverless_provisioned_concurrency) {
        serverless["ProvisionedConcurrency"] = *v.serverless_provisioned_concurrency;
      }
      entry["DesiredServerlessConfig"] = std::move(serverless);
    }
    out[name] = std::move(entry);
  }
  return out;
}

Result<DesiredVariants> DesiredVariantsFromJson(const json& j) {
  RETURN_IF_ERROR(json_member::RequireObject(j, "desired state", WrongType));
  DesiredVariants out;
  for (const auto& [name, entry] : j.items()) {
    const std::string where = "desired." + name;
    RETURN_IF_ERROR(json_member::RequireObject(entry, where, WrongType));
    VariantDesired v;
    RETURN_IF_ERROR(json_member::ReadOptional(entry, "DesiredWeight", where + ".", WrongType, v.weight));
    RETURN_IF_ERROR(json_member::ReadOptional(entry, "DesiredInstanceCount", where + ".", WrongType, v.instance_count));
    if (entry.contains("DesiredServerlessConfig")) {
      const json& serverless = entry["DesiredServerlessConfig"];
      const std::string inner = where + ".DesiredServerlessConfig";
      RETURN_IF_ERROR(json_member::RequireObject(serverless, inner, WrongType));
      RETURN_IF_ERROR(json_member::ReadOptional(serverless, "MaxConcurrency", inner + ".", WrongType,
                                                v.serverless_max_concurrency));
      RETURN_IF_ERROR(json_member::ReadOptional(serverless, "ProvisionedConcurrency", inner + ".", WrongType,
                                                v.serverless_provisioned_concurrency));
    }
    out[name] = v;
  }
  return out;
}

// ---- Observed state

json ToJson(const VariantSummary& v) {
  json out = {{"VariantName", v.variant_name},
              {"CurrentWeight", v.current_weight},
              {"DesiredWeight", v.desired_weight},
              {"CurrentInstanceCount", v.current_instance_count},
              {"DesiredInstanceCount", v.desired_instance_count}};
  if (!v.deployed_images.empty()) {
    json images = json::array();
    for (const DeployedImage& i : v.deployed_images) {
      images.push_back({{"SpecifiedImage", i.specified_image},
                        {"ResolvedImage", i.resolved_image},
                        {"ResolutionTime", i.resolution_time}});
    }
    out["DeployedImages"] = std::move(images);
  }
  json statuses = json::array();
  for (const VariantStatusEntry& s : v.variant_status) {
    statuses.push_back({{"Status", s.status}, {"StatusMessage", s.status_message}, {"StartTime", s.start_time}});
  }
  out["VariantStatus"] = std::move(statuses);
  if (!v.routing_config.is_null()) out["RoutingConfig"] = v.routing_config;
  return out;
}

Result<VariantSummary> VariantSummaryFromJson(const json& j) {
  constexpr std::string_view kWhere = "ProductionVariants[]";
  constexpr std::string_view kPrefix = "ProductionVariants[].";
  RETURN_IF_ERROR(json_member::RequireObject(j, kWhere, WrongType));
  VariantSummary v;
  RETURN_IF_ERROR(json_member::RequirePresent(j, "VariantName", kWhere));
  RETURN_IF_ERROR(json_member::ReadString(j, "VariantName", kPrefix, WrongType, v.variant_name));
  RETURN_IF_ERROR(json_member::ReadDouble(j, "CurrentWeight", kPrefix, WrongType, v.current_weight));
  RETURN_IF_ERROR(json_member::ReadDouble(j, "DesiredWeight", kPrefix, WrongType, v.desired_weight));
  RETURN_IF_ERROR(json_member::ReadInt64(j, "CurrentInstanceCount", kPrefix, WrongType, v.current_instance_count));
  RETURN_IF_ERROR(json_member::ReadInt64(j, "DesiredInstanceCount", kPrefix, WrongType, v.desired_instance_count));
  ASSIGN_OR_RETURN(const json* images, json_member::ArrayMember(j, "DeployedImages", kPrefix, WrongType));
  for (const json& i : *images) {
    RETURN_IF_ERROR(json_member::RequireObject(i, "DeployedImages[]", WrongType));
    DeployedImage image;
    RETURN_IF_ERROR(
        json_member::ReadString(i, "SpecifiedImage", "DeployedImages[].", WrongType, image.specified_image));
    RETURN_IF_ERROR(json_member::ReadString(i, "ResolvedImage", "DeployedImages[].", WrongType, image.resolved_image));
    RETURN_IF_ERROR(
        json_member::ReadDouble(i, "ResolutionTime", "DeployedImages[].", WrongType, image.resolution_time));
    v.deployed_images.push_back(std::move(image));
  }
  ASSIGN_OR_RETURN(const json* statuses, json_member::ArrayMember(j, "VariantStatus", kPrefix, WrongType));
  for (const json& s : *statuses) {
    RETURN_IF_ERROR(json_member::RequireObject(s, "VariantStatus[]", WrongType));
    VariantStatusEntry entry;
    RETURN_IF_ERROR(json_member::ReadString(s, "Status", "VariantStatus[].", WrongType, entry.status));
    RETURN_IF_ERROR(json_member::ReadString(s, "StatusMessage", "VariantStatus[].", WrongType, entry.status_message));
    RETURN_IF_ERROR(json_member::ReadDouble(s, "StartTime", "VariantStatus[].", WrongType, entry.start_time));
    v.variant_status.push_back(std::move(entry));
  }
  if (auto it = j.find("RoutingConfig"); it != j.end()) v.routing_config = *it;
  return v;
}

json ToJson(const InstanceRecord& r) {
  json out = {{"InstanceId", r.instance_id}, {"RuntimeId", r.runtime_id},           {"VariantName", r.variant},
              {"ModelName", r.model_name},   {"InstanceType", r.instance_type},     {"Generation", r.generation},
              {"PortBase", r.port_base},     {"LaunchedMillis", r.launched_millis}, {"Reserved", r.reserved}};
  if (!r.allocation.is_null()) out["Allocation"] = r.allocation;
  return out;
}

Result<InstanceRecord> InstanceRecordFromJson(const json& j) {
  constexpr std::string_view kWhere = "Instances[]";
  constexpr std::string_view kPrefix = "Instances[].";
  RETURN_IF_ERROR(json_member::RequireObject(j, kWhere, WrongType));
  InstanceRecord r;
  RETURN_IF_ERROR(json_member::RequirePresent(j, "InstanceId", kWhere));
  RETURN_IF_ERROR(json_member::ReadString(j, "InstanceId", kPrefix, WrongType, r.instance_id));
  RETURN_IF_ERROR(json_member::RequirePresent(j, "RuntimeId", kWhere));
  RETURN_IF_ERROR(json_member::ReadString(j, "RuntimeId", kPrefix, WrongType, r.runtime_id));
  RETURN_IF_ERROR(json_member::RequirePresent(j, "VariantName", kWhere));
  RETURN_IF_ERROR(json_member::ReadString(j, "VariantName", kPrefix, WrongType, r.variant));
  RETURN_IF_ERROR(json_member::ReadString(j, "ModelName", kPrefix, WrongType, r.model_name));
  RETURN_IF_ERROR(json_member::ReadString(j, "InstanceType", kPrefix, WrongType, r.instance_type));
  RETURN_IF_ERROR(json_member::ReadInt64(j, "Generation", kPrefix, WrongType, r.generation));
  RETURN_IF_ERROR(json_member::ReadInt64(j, "PortBase", kPrefix, WrongType, r.port_base));
  RETURN_IF_ERROR(json_member::ReadInt64(j, "LaunchedMillis", kPrefix, WrongType, r.launched_millis));
  RETURN_IF_ERROR(json_member::ReadBool(j, "Reserved", kPrefix, WrongType, r.reserved));
  if (auto it = j.find("Allocation"); it != j.end()) r.allocation = *it;
  return r;
}

std::string_view ToString(RolloutState::Phase phase) {
  switch (phase) {
    case RolloutState::Phase::kBaking: return "Baking";
    case RolloutState::Phase::kTerminationWait: return "TerminationWait";
    case RolloutState::Phase::kProvisioning: return "Provisioning";
  }
  return "Unknown";
}

json ToJson(const RolloutState& r) {
  return {{"Generation", r.generation}, {"Phase", ToString(r.phase)},    {"Step", r.step},
          {"Fraction", r.fraction},     {"UntilMillis", r.until_millis}, {"StartedMillis", r.started_millis}};
}

Result<RolloutState> RolloutStateFromJson(const json& j) {
  constexpr std::string_view kPrefix = "Rollout.";
  RETURN_IF_ERROR(json_member::RequireObject(j, "Rollout", WrongType));
  RolloutState r;
  RETURN_IF_ERROR(json_member::ReadInt64(j, "Generation", kPrefix, WrongType, r.generation));
  std::string phase = "Baking";
  RETURN_IF_ERROR(json_member::ReadString(j, "Phase", kPrefix, WrongType, phase));
  if (phase == "Baking") {
    r.phase = RolloutState::Phase::kBaking;
  } else if (phase == "TerminationWait") {
    r.phase = RolloutState::Phase::kTerminationWait;
  } else if (phase == "Provisioning") {
    r.phase = RolloutState::Phase::kProvisioning;
  } else {
    return Status::InvalidArgument("Rollout.Phase '" + phase + "' is not Baking, TerminationWait or Provisioning");
  }
  RETURN_IF_ERROR(json_member::ReadInt64(j, "Step", kPrefix, WrongType, r.step));
  RETURN_IF_ERROR(json_member::ReadDouble(j, "Fraction", kPrefix, WrongType, r.fraction));
  RETURN_IF_ERROR(json_member::ReadInt64(j, "UntilMillis", kPrefix, WrongType, r.until_millis));
  RETURN_IF_ERROR(json_member::ReadInt64(j, "StartedMillis", kPrefix, WrongType, r.started_millis));
  return r;
}

json ToJson(const EndpointObservedState& s) {
  json variants = json::array();
  for (const VariantSummary& v : s.production_variants) variants.push_back(ToJson(v));
  json instances = json::array();
  for (const InstanceRecord& r : s.instances) instances.push_back(ToJson(r));
  json out = {{"ProductionVariants", std::move(variants)}, {"Instances", std::move(instances)}};
  if (!s.credentials.is_null()) out["Credentials"] = s.credentials;
  if (s.rollout) out["Rollout"] = ToJson(*s.rollout);
  return out;
}

Result<EndpointObservedState> ObservedStateFromJson(const json& j) {
  EndpointObservedState s;
  if (j.is_null()) return s;
  RETURN_IF_ERROR(json_member::RequireObject(j, "observed state", WrongType));
  ASSIGN_OR_RETURN(const json* variants, json_member::ArrayMember(j, "ProductionVariants", "state.", WrongType));
  for (const json& v : *variants) {
    ASSIGN_OR_RETURN(auto summary, VariantSummaryFromJson(v));
    s.production_variants.push_back(std::move(summary));
  }
  ASSIGN_OR_RETURN(const json* instances, json_member::ArrayMember(j, "Instances", "state.", WrongType));
  for (const json& r : *instances) {
    ASSIGN_OR_RETURN(auto record, InstanceRecordFromJson(r));
    s.instances.push_back(std::move(record));
  }
  if (auto it = j.find("Credentials"); it != j.end()) s.credentials = *it;
  if (auto it = j.find("Rollout"); it != j.end() && !it->is_null()) {
    ASSIGN_OR_RETURN(auto rollout, RolloutStateFromJson(*it));
    s.rollout = rollout;
  }
  return s;
}

}  // namespace kiln::store
