#include "control/archive_caps.h"

#include <string>

namespace kiln::control {

namespace {

using nlohmann::json;

constexpr uint64_t kGiB = 1ull << 30;

// A positive integer member, or 0.
uint64_t PositiveInt(const json& j, const char* name) {
  if (!j.is_object()) return 0;
  auto it = j.find(name);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) return 0;
  return static_cast<uint64_t>(it->get<int64_t>());
}

std::string StringMember(const json& j, const char* name) {
  if (!j.is_object()) return "";
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// Total local NVMe storage of `type` in GB (0: none, or a type Kiln does not know).
uint64_t NvmeGb(const std::string& type, const ArchiveCapOptions& options) {
  const InstanceCatalog& catalog = options.catalog != nullptr ? *options.catalog : InstanceCatalog::BuiltIn();
  const InstanceShape* shape = catalog.Find(type);
  if (shape == nullptr || shape->nvme_disks <= 0 || shape->nvme_disk_gb <= 0) return 0;
  return static_cast<uint64_t>(shape->nvme_disks) * static_cast<uint64_t>(shape->nvme_disk_gb);
}

agent::UnpackCap Base(const ArchiveCapOptions& options) {
  agent::UnpackCap cap;
  cap.max_entries = options.max_entries;
  cap.entries_origin =
      "(Kiln's cap on archive members; the Kiln operator sets it with archives.max_entries in the "
      "server config)";
  return cap;
}

// The operator's cap, when set, replaces the derived one.
bool ApplyOperatorCap(const ArchiveCapOptions& options, agent::UnpackCap* cap) {
  if (options.max_unpacked_bytes == 0) return false;
  cap->max_bytes = options.max_unpacked_bytes;
  cap->bytes_origin =
      "(the cap set by the Kiln operator with archives.max_unpacked_mib in the server config); "
      "please make the archive smaller or ask the operator to raise the cap";
  return true;
}

std::string Gb(uint64_t gb) { return std::to_string(gb); }

}  // namespace

agent::UnpackCap SourceDirCap(const json& request, const ArchiveCapOptions& options) {
  agent::UnpackCap cap = Base(options);
  if (ApplyOperatorCap(options, &cap)) return cap;
  json resources = request.is_object() ? request.value("ResourceConfig", json::object()) : json::object();
  std::string type = StringMember(resources, "InstanceType");
  if (type.empty() && resources.contains("InstanceGroups") && resources["InstanceGroups"].is_array() &&
      !resources["InstanceGroups"].empty()) {
    type = StringMember(resources["InstanceGroups"][0], "InstanceType");
  }
  if (uint64_t nvme = NvmeGb(type, options); nvme > 0) {
    cap.max_bytes = nvme * kGiB;
    cap.bytes_origin = "(the cap from the " + Gb(nvme) + " GB of local NVMe storage of " + type +
                       ", which SageMaker uses instead of VolumeSizeInGB); please make the source directory smaller";
    return cap;
  }
  uint64_t volume = PositiveInt(resources, "VolumeSizeInGB");
  if (volume == 0) return cap;  // the API requires it; nothing to derive from otherwise
  cap.max_bytes = volume * kGiB;
  cap.bytes_origin = "(the cap from ResourceConfig.VolumeSizeInGB " + Gb(volume) +
                     "); please raise VolumeSizeInGB or make the source directory smaller";
  return cap;
}

agent::UnpackCap ModelDataCap(const json& variant, const ArchiveCapOptions& options) {
  agent::UnpackCap cap = Base(options);
  if (ApplyOperatorCap(options, &cap)) return cap;
  std::string name = StringMember(variant, "VariantName");
  std::string type = StringMember(variant, "InstanceType");
  if (uint64_t volume = PositiveInt(variant, "VolumeSizeInGB"); volume > 0) {
    cap.max_bytes = volume * kGiB;
    cap.bytes_origin = "(the cap from the variant's VolumeSizeInGB " + Gb(volume) +
                       "); please raise VolumeSizeInGB of production variant " + name +
                       " (at most 512) or make the model archive smaller";
    return cap;
  }
  if (uint64_t nvme = NvmeGb(type, options); nvme > 0) {
    cap.max_bytes = nvme * kGiB;
    cap.bytes_origin = "(the cap from the " + Gb(nvme) + " GB of local NVMe storage of " + type +
                       "); please make the model archive smaller or choose an instance type with more storage";
    return cap;
  }
  uint64_t fallback = options.default_endpoint_volume_gib > 0 ? options.default_endpoint_volume_gib : 30;
  cap.max_bytes = fallback * kGiB;
  cap.bytes_origin = "(Kiln's default cap for production variant " + name + " on " + type +
                     " without VolumeSizeInGB, " + Gb(fallback) +
                     " GB); please set VolumeSizeInGB on the production variant (at most 512) or make the model "
                     "archive smaller";
  return cap;
}

}  // namespace kiln::control
