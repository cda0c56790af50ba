#include "control/instance_catalog.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

namespace kiln::control {

std::string_view BuiltInInstanceTypesJson();  // instance_catalog_data.cc

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

const std::set<std::string, std::less<>> kKnownFields = {
    "type",         "vcpus",      "memory_gib", "gpus",    "gpu_model", "gpu_memory_gib", "accelerators",
    "interconnect", "local_nvme", "training",   "hosting", "transform", "processing"};

Status FieldError(const std::string& where, std::string_view field, std::string_view what) {
  return Status::InvalidArgument(where + "." + std::string(field) + ": " + std::string(what));
}

Result<int> IntField(const nlohmann::json& row, const std::string& where, std::string_view field, int min) {
  const nlohmann::json& v = row.at(std::string(field));
  if (!v.is_number_integer()) return FieldError(where, field, "must be an integer");
  int64_t n = v.get<int64_t>();
  if (n < min || n > 1'000'000) {
    return FieldError(where, field, "must be at least " + std::to_string(min));
  }
  return static_cast<int>(n);
}

// Applies the fields present in `row` to `shape`.
Status ApplyRow(const nlohmann::json& row, const std::string& where, InstanceShape* shape) {
  for (auto it = row.begin(); it != row.end(); ++it) {
    if (!it.key().empty() && it.key()[0] == '_') continue;
    if (kKnownFields.count(it.key()) == 0) {
      return Status::InvalidArgument(where + ": unknown field \"" + it.key() + "\"");
    }
  }
  if (row.contains("vcpus")) {
    ASSIGN_OR_RETURN(shape->vcpus, IntField(row, where, "vcpus", 1));
  }
  if (row.contains("memory_gib")) {
    const nlohmann::json& v = row["memory_gib"];
    if (!v.is_number() || v.get<double>() <= 0) return FieldError(where, "memory_gib", "must be a positive number");
    shape->memory_gib = v.get<double>();
  }
  if (row.contains("gpus")) {
    ASSIGN_OR_RETURN(shape->gpus, IntField(row, where, "gpus", 0));
  }
  if (row.contains("gpu_memory_gib")) {
    ASSIGN_OR_RETURN(shape->gpu_memory_gib, IntField(row, where, "gpu_memory_gib", 0));
  }
  for (auto [field, out] :
       {std::pair<const char*, std::string*>{"gpu_model", &shape->gpu_model}, {"accelerators", &shape->accelerators}}) {
    if (!row.contains(field)) continue;
    if (!row[field].is_string()) return FieldError(where, field, "must be a string");
    *out = row[field].get<std::string>();
  }
  if (row.contains("interconnect")) {
    const nlohmann::json& v = row["interconnect"];
    if (!v.is_array()) return FieldError(where, "interconnect", "must be a list of strings");
    shape->interconnect.clear();
    for (const auto& item : v) {
      if (!item.is_string()) return FieldError(where, "interconnect", "must be a list of strings");
      shape->interconnect.push_back(item.get<std::string>());
    }
  }
  if (row.contains("local_nvme")) {
    const nlohmann::json& v = row["local_nvme"];
    if (v.is_null()) {
      shape->nvme_disks = shape->nvme_disk_gb = 0;
    } else if (v.is_object() && v.contains("disks") && v.contains("disk_gb")) {
      ASSIGN_OR_RETURN(shape->nvme_disks, IntField(v, where + ".local_nvme", "disks", 0));
      ASSIGN_OR_RETURN(shape->nvme_disk_gb, IntField(v, where + ".local_nvme", "disk_gb", 0));
    } else {
      return FieldError(where, "local_nvme", "must be {\"disks\": N, \"disk_gb\": N} or null");
    }
  }
  for (auto [field, out] : {std::pair<const char*, bool*>{"training", &shape->training},
                            {"hosting", &shape->hosting},
                            {"transform", &shape->transform},
                            {"processing", &shape->processing}}) {
    if (!row.contains(field)) continue;
    if (!row[field].is_boolean()) return FieldError(where, field, "must be true or false");
    *out = row[field].get<bool>();
  }
  return Status::Ok();
}

}  // namespace

uint64_t InstanceShape::memory_bytes() const { return static_cast<uint64_t>(std::llround(memory_gib * kGiB)); }

const InstanceCatalog& InstanceCatalog::BuiltIn() {
  static const InstanceCatalog catalog = [] {
    nlohmann::json doc = nlohmann::json::parse(BuiltInInstanceTypesJson(), nullptr, /*allow_exceptions=*/false);
    Result<InstanceCatalog> parsed = FromJson(doc);
    if (!parsed.ok()) {
      // The data is part of the build; instance_catalog_test parses it. Reaching this is a bug.
      std::fprintf(stderr, "built-in instance catalog is invalid: %s\n", parsed.status().ToString().c_str());
      std::abort();
    }
    return std::move(parsed).value();
  }();
  return catalog;
}

Result<InstanceCatalog> InstanceCatalog::FromJson(const nlohmann::json& doc, const InstanceCatalog* base) {
  const nlohmann::json* rows = &doc;
  if (doc.is_object()) {
    auto it = doc.find("instance_types");
    if (it == doc.end()) {
      return Status::InvalidArgument("instance catalog: expected {\"instance_types\": [...]}");
    }
    for (auto f = doc.begin(); f != doc.end(); ++f) {
      if (f.key() != "instance_types" && (f.key().empty() || f.key()[0] != '_')) {
        return Status::InvalidArgument("instance catalog: unknown field \"" + f.key() + "\"");
      }
    }
    rows = &*it;
  }
  if (!rows->is_array()) {
    return Status::InvalidArgument("instance catalog: instance_types must be a list of rows");
  }
  InstanceCatalog catalog;
  if (base != nullptr) catalog = *base;
  std::set<std::string> seen;
  for (size_t i = 0; i < rows->size(); ++i) {
    const nlohmann::json& row = (*rows)[i];
    std::string where = "instance_types[" + std::to_string(i) + "]";
    if (!row.is_object()) return Status::InvalidArgument(where + ": must be an object");
    auto type_it = row.find("type");
    if (type_it == row.end() || !type_it->is_string() || type_it->get<std::string>().empty()) {
      return FieldError(where, "type", "must be a non-empty string such as \"ml.m5.large\"");
    }
    std::string type = type_it->get<std::string>();
    where += " (" + type + ")";
    if (!seen.insert(type).second) return Status::InvalidArgument(where + ": duplicate type");
    auto existing = catalog.by_type_.find(type);
    if (existing != catalog.by_type_.end()) {
      RETURN_IF_ERROR(ApplyRow(row, where, &catalog.shapes_[existing->second]));
      continue;
    }
    InstanceShape shape;
    shape.type = type;
    shape.training = shape.hosting = shape.transform = shape.processing = true;
    if (!row.contains("vcpus")) return FieldError(where, "vcpus", "is required for a new type");
    if (!row.contains("memory_gib")) return FieldError(where, "memory_gib", "is required for a new type");
    RETURN_IF_ERROR(ApplyRow(row, where, &shape));
    catalog.by_type_.emplace(type, catalog.shapes_.size());
    catalog.shapes_.push_back(std::move(shape));
  }
  return catalog;
}

std::string ServerlessInstanceType(int64_t memory_mb) { return "ml.serverless." + std::to_string(memory_mb); }

const InstanceShape* InstanceCatalog::Find(std::string_view type) const {
  auto it = by_type_.find(type);
  if (it != by_type_.end()) return &shapes_[it->second];
  // The serverless shapes: 1-6 vCPUs with 1-6 GiB, hosting only.
  static const std::vector<InstanceShape> serverless = [] {
    std::vector<InstanceShape> shapes;
    for (int gib = 1; gib <= 6; ++gib) {
      InstanceShape shape;
      shape.type = ServerlessInstanceType(gib * 1024);
      shape.vcpus = gib;
      shape.memory_gib = gib;
      shape.hosting = true;
      shapes.push_back(std::move(shape));
    }
    return shapes;
  }();
  for (const InstanceShape& shape : serverless) {
    if (shape.type == type) return &shape;
  }
  return nullptr;
}

std::string FormatGiB(uint64_t bytes) {
  double gib = static_cast<double>(bytes) / kGiB;
  double rounded = std::round(gib * 10) / 10;
  char buf[64];
  if (std::fabs(rounded - std::round(rounded)) < 1e-9) {
    std::snprintf(buf, sizeof(buf), "%.0f GiB", rounded);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f GiB", rounded);
  }
  return buf;
}

std::string DescribeResources(int vcpus, uint64_t memory_bytes, int gpus, bool always_gpus) {
  std::string s = std::to_string(vcpus) + (vcpus == 1 ? " vCPU, " : " vCPUs, ") + FormatGiB(memory_bytes);
  if (gpus > 0 || always_gpus) s += ", " + std::to_string(gpus) + (gpus == 1 ? " GPU" : " GPUs");
  return s;
}

}  // namespace kiln::control
