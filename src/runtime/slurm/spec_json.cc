#include "runtime/slurm/spec_json.h"

#include "base/json_parse.h"

namespace kiln::runtime::slurm {

using json = nlohmann::json;

namespace {

// Reads optional member `name` into `out` when present and not null; nlohmann's type errors
// (json::exception) are caught by the callers' try blocks.
template <typename T>
void Optional(const json& j, const char* name, T& out) {
  if (auto it = j.find(name); it != j.end() && !it->is_null()) out = it->get<T>();
}

json UsageToJson(const InstanceUsage& u) {
  return {{"cpu_usec", u.cpu_usec},
          {"memory_bytes", u.memory_bytes},
          {"memory_limit_bytes", u.memory_limit_bytes},
          {"gpus", u.gpus},
          {"source", u.source},
          {"process_count", u.process_count}};
}

InstanceUsage UsageFromJson(const json& j) {
  InstanceUsage u;
  Optional(j, "cpu_usec", u.cpu_usec);
  Optional(j, "memory_bytes", u.memory_bytes);
  Optional(j, "memory_limit_bytes", u.memory_limit_bytes);
  Optional(j, "gpus", u.gpus);
  Optional(j, "source", u.source);
  Optional(j, "process_count", u.process_count);
  return u;
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
      const json& n = *it;
      NetworkAttachment a;
      Optional(n, "network", a.network);
      Optional(n, "bridge", a.bridge);
      Optional(n, "host_veth", a.host_veth);
      Optional(n, "address", a.address);
      Optional(n, "prefix_length", a.prefix_length);
      Optional(n, "gateway", a.gateway);
      Optional(n, "isolated", a.isolated);
      Optional(n, "interface_name", a.interface_name);
      Optional(n, "loopback_forwards", a.loopback_forwards);
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

json ReportToJson(const NodeReport& r) {
  json j = {{"state", r.state},
            {"node", r.node},
            {"address", r.address},
            {"started_millis", r.started_millis},
            {"finished_millis", r.finished_millis},
            {"exit_code", r.exit_code},
            {"term_signal", r.term_signal},
            {"oom_killed", r.oom_killed},
            {"usage", nullptr},
            {"error", r.error}};
  if (r.usage) j["usage"] = UsageToJson(*r.usage);
  return j;
}

Result<NodeReport> ReportFromJson(const json& j) {
  if (!j.is_object()) return Status::InvalidArgument("bad node report: not a JSON object");
  try {
    NodeReport r;
    Optional(j, "state", r.state);
    if (r.state != "starting" && r.state != "running" && r.state != "exited") {
      return Status::InvalidArgument("bad node report: state must be starting, running or exited, not \"" + r.state +
                                     "\"");
    }
    Optional(j, "node", r.node);
    Optional(j, "address", r.address);
    Optional(j, "started_millis", r.started_millis);
    Optional(j, "finished_millis", r.finished_millis);
    Optional(j, "exit_code", r.exit_code);
    Optional(j, "term_signal", r.term_signal);
    Optional(j, "oom_killed", r.oom_killed);
    Optional(j, "error", r.error);
    if (auto it = j.find("usage"); it != j.end() && it->is_object()) r.usage = UsageFromJson(*it);
    return r;
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("bad node report: ") + e.what());
  }
}

json AnswerToJson(const NodeReportAnswer& a) {
  json j = {{"stop_grace_seconds", nullptr}, {"signals", a.signals}};
  if (a.stop_grace_seconds) j["stop_grace_seconds"] = *a.stop_grace_seconds;
  return j;
}

Result<NodeReportAnswer> AnswerFromJson(const json& j) {
  if (!j.is_object()) return Status::InvalidArgument("bad report answer: not a JSON object");
  try {
    NodeReportAnswer a;
    if (auto it = j.find("stop_grace_seconds"); it != j.end() && !it->is_null()) {
      a.stop_grace_seconds = it->get<int64_t>();
    }
    Optional(j, "signals", a.signals);
    return a;
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("bad report answer: ") + e.what());
  }
}

}  // namespace kiln::runtime::slurm
