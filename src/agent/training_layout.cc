#include "agent/training_layout.h"

#include <algorithm>

#include "agent/errors.h"
#include "base/fs.h"
#include "base/strings.h"

namespace kiln::agent {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

const json* Member(const json& j, std::string_view name) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(std::string(name));
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string StringMember(const json& j, std::string_view name, std::string fallback) {
  const json* m = Member(j, name);
  return (m != nullptr && m->is_string()) ? m->get<std::string>() : fallback;
}

std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::string Dump(const ordered_json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

int HostLayout::ShardIndex() const {
  auto sorted = Sorted(hosts);
  auto it = std::find(sorted.begin(), sorted.end(), current_host);
  return it == sorted.end() ? -1 : static_cast<int>(it - sorted.begin());
}

std::vector<HostLayout> HostLayoutsForRequest(const json& request) {
  std::vector<HostLayout> out;
  const json* rc = Member(request, "ResourceConfig");
  if (rc == nullptr) return out;
  std::vector<InstanceGroupLayout> groups;
  const json* ig = Member(*rc, "InstanceGroups");
  int next = 1;
  if (ig != nullptr && ig->is_array() && !ig->empty()) {
    for (const json& g : *ig) {
      InstanceGroupLayout layout;
      layout.name = StringMember(g, "InstanceGroupName", "");
      layout.instance_type = StringMember(g, "InstanceType", "");
      int count = g.value("InstanceCount", 1);
      for (int i = 0; i < count; ++i) layout.hosts.push_back("algo-" + std::to_string(next++));
      groups.push_back(std::move(layout));
    }
  } else {
    InstanceGroupLayout layout;
    layout.name = std::string(kHomogeneousCluster);
    layout.instance_type = StringMember(*rc, "InstanceType", "");
    int count = rc->value("InstanceCount", 1);
    for (int i = 0; i < count; ++i) layout.hosts.push_back("algo-" + std::to_string(next++));
    groups.push_back(std::move(layout));
  }
  std::vector<std::string> all;
  for (const auto& g : groups) all.insert(all.end(), g.hosts.begin(), g.hosts.end());
  for (const auto& g : groups) {
    for (const auto& h : g.hosts) {
      HostLayout host;
      host.current_host = h;
      host.hosts = all;
      host.instance_type = g.instance_type;
      host.current_group_name = g.name;
      host.instance_groups = groups;
      out.push_back(std::move(host));
    }
  }
  return out;
}

std::string HyperparametersJson(const json& request) {
  ordered_json out = ordered_json::object();
  if (const json* hp = Member(request, "HyperParameters"); hp != nullptr && hp->is_object()) {
    for (auto it = hp->begin(); it != hp->end(); ++it) {
      // Values are strings by the API model; anything else is written as its JSON text so the
      // file still maps string to string.
      out[it.key()] = it->is_string() ? it->get<std::string>() : it->dump();
    }
  }
  return Dump(out);
}

std::string ChannelInputMode(const json& request, const json& channel) {
  std::string mode = StringMember(channel, "InputMode", "");
  if (!mode.empty()) return mode;
  if (const json* alg = Member(request, "AlgorithmSpecification"); alg != nullptr) {
    return StringMember(*alg, "TrainingInputMode", "File");
  }
  return "File";
}

std::string InputDataConfigJson(const json& request) {
  ordered_json out = ordered_json::object();
  const json* channels = Member(request, "InputDataConfig");
  if (channels != nullptr && channels->is_array()) {
    for (const json& ch : *channels) {
      ordered_json entry = ordered_json::object();
      if (const json* ct = Member(ch, "ContentType"); ct != nullptr && ct->is_string()) entry["ContentType"] = *ct;
      entry["TrainingInputMode"] = ChannelInputMode(request, ch);
      std::string distribution = "FullyReplicated";
      const json* ds = Member(ch, "DataSource");
      if (ds != nullptr) {
        if (const json* s3 = Member(*ds, "S3DataSource"); s3 != nullptr) {
          distribution = StringMember(*s3, "S3DataDistributionType", "FullyReplicated");
        }
      }
      entry["S3DistributionType"] = distribution;
      entry["RecordWrapperType"] = StringMember(ch, "RecordWrapperType", "None");
      std::string compression = StringMember(ch, "CompressionType", "None");
      if (compression != "None") entry["CompressionType"] = compression;
      if (const json* sc = Member(ch, "ShuffleConfig"); sc != nullptr) {
        if (const json* seed = Member(*sc, "Seed"); seed != nullptr) {
          ordered_json shuffle = ordered_json::object();
          shuffle["Seed"] = *seed;
          entry["ShuffleConfig"] = shuffle;
        }
      }
      out[StringMember(ch, "ChannelName", "")] = entry;
    }
  }
  return Dump(out);
}

std::string ResourceConfigJson(const HostLayout& host) {
  ordered_json out = ordered_json::object();
  out["current_host"] = host.current_host;
  out["hosts"] = Sorted(host.hosts);
  out["network_interface_name"] = "eth0";
  out["current_instance_type"] = host.instance_type;
  out["current_group_name"] = host.current_group_name;
  ordered_json groups = ordered_json::array();
  if (host.instance_groups.empty()) {
    ordered_json g = ordered_json::object();
    g["instance_group_name"] = std::string(kHomogeneousCluster);
    g["instance_type"] = host.instance_type;
    g["hosts"] = Sorted(host.hosts);
    groups.push_back(g);
  } else {
    for (const auto& group : host.instance_groups) {
      ordered_json g = ordered_json::object();
      g["instance_group_name"] = group.name;
      g["instance_type"] = group.instance_type;
      g["hosts"] = Sorted(group.hosts);
      groups.push_back(g);
    }
  }
  out["instance_groups"] = groups;
  return Dump(out);
}

Result<std::string> SandboxPathToHost(const std::string& opt_ml, std::string_view sandbox_path) {
  auto outside = [&] {
    return ClientError("the local path \"" + std::string(sandbox_path) +
                       "\" is not under /opt/ml. Please choose an absolute path under /opt/ml (for "
                       "example /opt/ml/checkpoints).");
  };
  if (sandbox_path.empty() || sandbox_path.front() != '/') return outside();
  std::vector<std::string> parts;
  for (std::string_view p : Split(sandbox_path, '/')) {
    if (p.empty() || p == ".") continue;
    if (p == "..") {
      if (parts.empty()) return outside();
      parts.pop_back();
      continue;
    }
    parts.emplace_back(p);
  }
  if (parts.size() < 2 || parts[0] != "opt" || parts[1] != "ml") return outside();
  std::string out = opt_ml;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  for (size_t i = 2; i < parts.size(); ++i) out += "/" + parts[i];
  return out;
}

std::string CheckpointLocalPath(const json& request) {
  if (const json* cc = Member(request, "CheckpointConfig"); cc != nullptr) {
    return StringMember(*cc, "LocalPath", "/opt/ml/checkpoints");
  }
  return "/opt/ml/checkpoints";
}

Status WriteTrainingLayout(const std::string& opt_ml, const json& request, const HostLayout& host) {
  for (const char* dir : {"input/config", "input/data", "code", "model", "output/data", "checkpoints"}) {
    RETURN_IF_ERROR(MakeDirs(opt_ml + "/" + dir));
  }
  if (Member(request, "CheckpointConfig") != nullptr) {
    ASSIGN_OR_RETURN(std::string local, SandboxPathToHost(opt_ml, CheckpointLocalPath(request)));
    RETURN_IF_ERROR(MakeDirs(local));
  }
  const std::string config = opt_ml + "/input/config/";
  RETURN_IF_ERROR(WriteFileAtomic(config + "hyperparameters.json", HyperparametersJson(request), 0444));
  RETURN_IF_ERROR(WriteFileAtomic(config + "inputdataconfig.json", InputDataConfigJson(request), 0444));
  RETURN_IF_ERROR(WriteFileAtomic(config + "resourceconfig.json", ResourceConfigJson(host), 0444));
  struct Optional {
    const char* member;
    const char* file;
    const char* default_local_path;
  };
  for (const Optional& o :
       {Optional{"DebugHookConfig", "debughookconfig.json", "/opt/ml/output/tensors"},
        Optional{"TensorBoardOutputConfig", "tensorboardoutputconfig.json", "/opt/ml/output/tensorboard"},
        Optional{"ProfilerConfig", "profilerconfig.json", "/opt/ml/output/profiler"}}) {
    const json* m = Member(request, o.member);
    if (m == nullptr || !m->is_object()) continue;
    json copy = *m;
    if (!copy.contains("LocalPath") || copy["LocalPath"].is_null()) copy["LocalPath"] = o.default_local_path;
    RETURN_IF_ERROR(WriteFileAtomic(config + o.file, copy.dump(-1, ' ', false, json::error_handler_t::replace), 0444));
  }
  return Status::Ok();
}

}  // namespace kiln::agent
