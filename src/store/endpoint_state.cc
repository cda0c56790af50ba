#include "store/endpoint_state.h"

#include <array>
#include <utility>

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

Status WrongType(std::string_view where, std::string_view member, std::string_view want) {
  return Status::InvalidArgument(std::string(where) + "." + std::string(member) + " is not " + std::string(want));
}

// Reads j[member] into *out when present and not null; InvalidArgument when of another type.
Status ReadString(const json& j, const char* member, std::string_view where, std::string* out) {
  auto it = j.find(member);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_string()) return WrongType(where, member, "a string");
  *out = it->get<std::string>();
  return Status::Ok();
}

Status ReadInt(const json& j, const char* member, std::string_view where, int64_t* out) {
  auto it = j.find(member);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number_integer()) return WrongType(where, member, "an integer");
  *out = it->get<int64_t>();
  return Status::Ok();
}

Status ReadDouble(const json& j, const char* member, std::string_view where, double* out) {
  auto it = j.find(member);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number()) return WrongType(where, member, "a number");
  *out = it->get<double>();
  return Status::Ok();
}

Status ReadBool(const json& j, const char* member, std::string_view where, bool* out) {
  auto it = j.find(member);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return WrongType(where, member, "a boolean");
  *out = it->get<bool>();
  return Status::Ok();
}

Status RequireString(const json& j, const char* member, std::string_view where, std::string* out) {
  if (!j.contains(member)) return Status::InvalidArgument(std::string(where) + " has no " + member);
  return ReadString(j, member, where, out);
}

// The array at j[member] (absent or null: empty); InvalidArgument when not an array.
Result<const json*> ArrayMember(const json& j, const char* member, std::string_view where) {
  static const json kEmpty = json::array();
  auto it = j.find(member);
  if (it == j.end() || it->is_null()) return &kEmpty;
  if (!it->is_array()) return WrongType(where, member, "an array");
  return &*it;
}

Status RequireObject(const json& j, std::string_view what) {
  if (!j.is_object()) return Status::InvalidArgument(std::string(what) + " is not an object");
  return Status::Ok();
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
  auto variants = endpoint_config.find("ProductionVariants");
  if (variants == endpoint_config.end() || !variants->is_array()) return nullptr;
  for (const json& v : *variants) {
    if (v.is_object() && v.value("VariantName", "") == variant) return &v;
  }
  return nullptr;
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
  RETURN_IF_ERROR(RequireObject(j, "deployment"));
  Deployment d;
  RETURN_IF_ERROR(ReadString(j, "EndpointConfigName", "deployment", &d.config_name));
  if (auto it = j.find("EndpointConfig"); it != j.end()) d.endpoint_config = *it;
  if (auto it = j.find("Models"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return WrongType("deployment", "Models", "an object");
    d.models = *it;
  }
  RETURN_IF_ERROR(ReadInt(j, "DeployedMillis", "deployment", &d.deployed_millis));
  return d;
}

// ---- Desired

json ToJson(const DesiredVariants& d) {
  json out = json::object();
  for (const auto& [name, v] : d) {
    json entry = json::object();
    if (v.weight) entry["DesiredWeight"] = *v.weight;
    if (v.instance_count) entry["DesiredInstanceCount"] = *v.instance_count;
    out[name] = std::move(entry);
  }
  return out;
}

Result<DesiredVariants> DesiredVariantsFromJson(const json& j) {
  RETURN_IF_ERROR(RequireObject(j, "desired state"));
  DesiredVariants out;
  for (const auto& [name, entry] : j.items()) {
    const std::string where = "desired." + name;
    RETURN_IF_ERROR(RequireObject(entry, where));
    VariantDesired v;
    if (entry.contains("DesiredWeight") && !entry["DesiredWeight"].is_null()) {
      double w = 0;
      RETURN_IF_ERROR(ReadDouble(entry, "DesiredWeight", where, &w));
      v.weight = w;
    }
    if (entry.contains("DesiredInstanceCount") && !entry["DesiredInstanceCount"].is_null()) {
      int64_t n = 0;
      RETURN_IF_ERROR(ReadInt(entry, "DesiredInstanceCount", where, &n));
      v.instance_count = n;
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
  RETURN_IF_ERROR(RequireObject(j, kWhere));
  VariantSummary v;
  RETURN_IF_ERROR(RequireString(j, "VariantName", kWhere, &v.variant_name));
  RETURN_IF_ERROR(ReadDouble(j, "CurrentWeight", kWhere, &v.current_weight));
  RETURN_IF_ERROR(ReadDouble(j, "DesiredWeight", kWhere, &v.desired_weight));
  RETURN_IF_ERROR(ReadInt(j, "CurrentInstanceCount", kWhere, &v.current_instance_count));
  RETURN_IF_ERROR(ReadInt(j, "DesiredInstanceCount", kWhere, &v.desired_instance_count));
  ASSIGN_OR_RETURN(const json* images, ArrayMember(j, "DeployedImages", kWhere));
  for (const json& i : *images) {
    RETURN_IF_ERROR(RequireObject(i, "DeployedImages[]"));
    DeployedImage image;
    RETURN_IF_ERROR(ReadString(i, "SpecifiedImage", "DeployedImages[]", &image.specified_image));
    RETURN_IF_ERROR(ReadString(i, "ResolvedImage", "DeployedImages[]", &image.resolved_image));
    RETURN_IF_ERROR(ReadDouble(i, "ResolutionTime", "DeployedImages[]", &image.resolution_time));
    v.deployed_images.push_back(std::move(image));
  }
  ASSIGN_OR_RETURN(const json* statuses, ArrayMember(j, "VariantStatus", kWhere));
  for (const json& s : *statuses) {
    RETURN_IF_ERROR(RequireObject(s, "VariantStatus[]"));
    VariantStatusEntry entry;
    RETURN_IF_ERROR(ReadString(s, "Status", "VariantStatus[]", &entry.status));
    RETURN_IF_ERROR(ReadString(s, "StatusMessage", "VariantStatus[]", &entry.status_message));
    RETURN_IF_ERROR(ReadDouble(s, "StartTime", "VariantStatus[]", &entry.start_time));
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
  RETURN_IF_ERROR(RequireObject(j, kWhere));
  InstanceRecord r;
  RETURN_IF_ERROR(RequireString(j, "InstanceId", kWhere, &r.instance_id));
  RETURN_IF_ERROR(RequireString(j, "RuntimeId", kWhere, &r.runtime_id));
  RETURN_IF_ERROR(RequireString(j, "VariantName", kWhere, &r.variant));
  RETURN_IF_ERROR(ReadString(j, "ModelName", kWhere, &r.model_name));
  RETURN_IF_ERROR(ReadString(j, "InstanceType", kWhere, &r.instance_type));
  RETURN_IF_ERROR(ReadInt(j, "Generation", kWhere, &r.generation));
  RETURN_IF_ERROR(ReadInt(j, "PortBase", kWhere, &r.port_base));
  RETURN_IF_ERROR(ReadInt(j, "LaunchedMillis", kWhere, &r.launched_millis));
  RETURN_IF_ERROR(ReadBool(j, "Reserved", kWhere, &r.reserved));
  if (auto it = j.find("Allocation"); it != j.end()) r.allocation = *it;
  return r;
}

json ToJson(const EndpointObservedState& s) {
  json variants = json::array();
  for (const VariantSummary& v : s.production_variants) variants.push_back(ToJson(v));
  json instances = json::array();
  for (const InstanceRecord& r : s.instances) instances.push_back(ToJson(r));
  json out = {{"ProductionVariants", std::move(variants)}, {"Instances", std::move(instances)}};
  if (!s.credentials.is_null()) out["Credentials"] = s.credentials;
  return out;
}

Result<EndpointObservedState> ObservedStateFromJson(const json& j) {
  EndpointObservedState s;
  if (j.is_null()) return s;
  RETURN_IF_ERROR(RequireObject(j, "observed state"));
  ASSIGN_OR_RETURN(const json* variants, ArrayMember(j, "ProductionVariants", "state"));
  for (const json& v : *variants) {
    ASSIGN_OR_RETURN(auto summary, VariantSummaryFromJson(v));
    s.production_variants.push_back(std::move(summary));
  }
  ASSIGN_OR_RETURN(const json* instances, ArrayMember(j, "Instances", "state"));
  for (const json& r : *instances) {
    ASSIGN_OR_RETURN(auto record, InstanceRecordFromJson(r));
    s.instances.push_back(std::move(record));
  }
  if (auto it = j.find("Credentials"); it != j.end()) s.credentials = *it;
  return s;
}

}  // namespace kiln::store
