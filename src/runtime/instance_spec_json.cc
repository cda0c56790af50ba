#include "runtime/instance_spec_json.h"

#include "base/json_parse.h"

namespace kiln::runtime {

using json = nlohmann::json;

namespace {

// Reads optional member `name` into `out` when present and not null; nlohmann's type errors
// (json::exception) are caught by the callers' try blocks.
template <typename T>
void Optional(const json& j, const char* name, T& out) {
  if (auto it = j.find(name); it != j.end() && !it->is_null()) out = it->get<T>();
}

}  // namespace

json SpecToJson(const InstanceSpec& spec) {
  json mounts = json::array();
  for (const BindMount& m : spec.extra_mounts) {
    mounts.push_back({{"host_path", m.host_path}, {"sandbox_path", m.sandbox_path}, {"read_only", m.read_only}});
  }
  json j = {
      {"instance_id", spec.instance_id},
      {"opt_ml_dir", spec.opt_ml_dir},
      {"extra_mounts", mounts},
      {"hostname", spec.hostname},
      {"hosts_file_lines", spec.hosts_file_lines},
      {"argv", spec.argv},
      {"env", spec.env},
      {"working_dir", spec.working_dir},
      {"cpus", spec.cpus},
      {"memory_limit_bytes", spec.memory_limit_bytes},
      {"gpus", spec.gpus},
      {"network_namespace", spec.network_namespace},
      {"group", spec.group},
      {"group_size", spec.group_size},
      {"group_index", spec.group_index},
      {"shape_vcpus", spec.shape_vcpus},
      {"shape_memory_bytes", spec.shape_memory_bytes},
      {"shape_gpus", spec.shape_gpus},
      {"instance_type", spec.instance_type},
      {"time_limit_seconds", spec.time_limit_seconds},
      {"placement", spec.placement},
      {"network", nullptr},
      {"container", nullptr},
  };
  if (spec.network) {
    const NetworkAttachment& n = *spec.network;
    j["network"] = {{"network", n.network},
                    {"bridge", n.bridge},
                    {"host_veth", n.host_veth},
                    {"address", n.address},
                    {"prefix_length", n.prefix_length},
                    {"gateway", n.gateway},
                    {"isolated", n.isolated},
                    {"interface_name", n.interface_name},
                    {"loopback_forwards", n.loopback_forwards}};
  }
  if (spec.container) {
    const ContainerImage& c = *spec.container;
    j["container"] = {{"requested", c.requested}, {"reference", c.reference}, {"entrypoint", nullptr}};
    if (c.entrypoint) j["container"]["entrypoint"] = *c.entrypoint;
  }
  return j;
}

Result<InstanceSpec> SpecFromJson(const json& j) {
  if (!j.is_object()) return Status::InvalidArgument("bad instance spec: not a JSON object");
  if (!j.contains("instance_id")) return Status::InvalidArgument("bad instance spec: no instance_id");
  if (!j.contains("argv")) return Status::InvalidArgument("bad instance spec: no argv");
  try {
    InstanceSpec spec;
    spec.instance_id = j.at("instance_id").get<std::string>();
    spec.argv = j.at("argv").get<std::vector<std::string>>();
    Optional(j, "opt_ml_dir", spec.opt_ml_dir);
    if (auto it = j.find("extra_mounts"); it != j.end() && it->is_array()) {
      for (const json& m : *it) {
        BindMount b;
        b.host_path = m.at("host_path").get<std::string>();
        b.sandbox_path = m.at("sandbox_path").get<std::string>();
        Optional(m, "read_only", b.read_only);
        spec.extra_mounts.push_back(std::move(b));
      }
    }
    Optional(j, "hostname", spec.hostname);
    Optional(j, "hosts_file_lines", spec.hosts_file_lines);
    Optional(j, "env", spec.env);
    Optional(j, "working_dir", spec.working_dir);
    Optional(j, "cpus", spec.cpus);
    Optional(j, "memory_limit_bytes", spec.memory_limit_bytes);
    Optional(j, "gpus", spec.gpus);
    Optional(j, "network_namespace", spec.network_namespace);
    Optional(j, "group", spec.group);
    Optional(j, "group_size", spec.group_size);
    Optional(j, "group_index", spec.group_index);
    Optional(j, "shape_vcpus", spec.shape_vcpus);
    Optional(j, "shape_memory_bytes", spec.shape_memory_bytes);
    Optional(j, "shape_gpus", spec.shape_gpus);
    Optional(j, "instance_type", spec.instance_type);
    Optional(j, "time_limit_seconds", spec.time_limit_seconds);
    Optional(j, "placement", spec.placement);
    if (auto it = j.find("network"); it != j.end() && it->is_object()) {
      // Every member required: a torn attachment is a bad spec, not "no network".
      const json& n = *it;
      NetworkAttachment a;
      a.network = n.at("network").get<decltype(a.network)>();
      a.bridge = n.at("bridge").get<decltype(a.bridge)>();
      a.host_veth = n.at("host_veth").get<decltype(a.host_veth)>();
      a.address = n.at("address").get<decltype(a.address)>();
      a.prefix_length = n.at("prefix_length").get<decltype(a.prefix_length)>();
      a.gateway = n.at("gateway").get<decltype(a.gateway)>();
      a.isolated = n.at("isolated").get<decltype(a.isolated)>();
      a.interface_name = n.at("interface_name").get<decltype(a.interface_name)>();
      a.loopback_forwards = n.at("loopback_forwards").get<decltype(a.loopback_forwards)>();
      spec.network = std::move(a);
    }
    if (auto it = j.find("container"); it != j.end() && it->is_object()) {
      const json& c = *it;
      ContainerImage image;
      Optional(c, "requested", image.requested);
      Optional(c, "reference", image.reference);
      if (auto e = c.find("entrypoint"); e != c.end() && !e->is_null()) {
        image.entrypoint = e->get<std::vector<std::string>>();
      }
      spec.container = std::move(image);
    }
    if (spec.group_size < 1 || spec.group_index < 0 || spec.group_index >= spec.group_size) {
      return Status::InvalidArgument("bad instance spec: group_index " + std::to_string(spec.group_index) +
                                     " outside a group of " + std::to_string(spec.group_size));
    }
    return spec;
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("bad instance spec: ") + e.what());
  }
}

std::string EncodeSpec(const InstanceSpec& spec) { return SpecToJson(spec).dump(); }

Result<InstanceSpec> DecodeSpec(std::string_view text) {
  Result<json> j = ParseJsonBounded(text);
  if (!j.ok()) return Status::InvalidArgument("bad instance spec: " + j.status().message());
  return SpecFromJson(*j);
}

}  // namespace kiln::runtime
