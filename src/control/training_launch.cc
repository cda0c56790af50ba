#include "control/training_launch.h"

#include <optional>

#include "base/encoding.h"
#include "base/hash.h"
#include "base/strings.h"

namespace kiln::control {

using nlohmann::json;

namespace {

std::vector<std::string> StringList(const json& algorithm, const char* member) {
  std::vector<std::string> out;
  if (!algorithm.contains(member) || !algorithm[member].is_array()) return out;
  for (const json& v : algorithm[member]) {
    if (v.is_string()) out.push_back(v.get<std::string>());
  }
  return out;
}

}  // namespace

void BindIfInTmp(const std::string& path, std::vector<runtime::BindMount>& binds) {
  if (!StartsWith(path, "/tmp/")) return;
  size_t end = path.find('/', 5);
  std::string top = path.substr(0, end == std::string::npos ? path.size() : end);
  for (const auto& b : binds) {
    if (b.host_path == top) return;
  }
  binds.push_back({top, top, /*read_only=*/true});
}

TrainingLaunchPlan PlanTrainingLaunch(const json& request, const runtime::ImageResolution& image,
                                      const TrainingLaunchContext& context) {
  TrainingLaunchPlan plan;
  const json algorithm = request.value("AlgorithmSpecification", json::object());
  const std::vector<std::string> entrypoint = StringList(algorithm, "ContainerEntrypoint");
  const std::vector<std::string> arguments = StringList(algorithm, "ContainerArguments");
  const bool local = image.kind == runtime::ImageResolution::Kind::kLocalExecutable;
  const bool container = image.kind == runtime::ImageResolution::Kind::kContainerImage;
  if (container) {
    // `docker run [--entrypoint E] IMAGE [train | arguments]`: an entrypoint of the request's own
    // runs with its arguments only (§2).
    plan.container = runtime::ContainerImage{
        .requested = image.image,
        .reference = "",
        .entrypoint = entrypoint.empty() ? std::nullopt : std::optional<std::vector<std::string>>(entrypoint)};
    if (!arguments.empty()) {
      plan.argv = arguments;
    } else if (entrypoint.empty()) {
      plan.argv = {"train"};
    }
  } else if (!entrypoint.empty()) {
    plan.argv = entrypoint;
    plan.argv.insert(plan.argv.end(), arguments.begin(), arguments.end());
  } else if (local) {
    plan.argv = {image.executable};
    if (arguments.empty()) {
      plan.argv.push_back("train");
    } else {
      plan.argv.insert(plan.argv.end(), arguments.begin(), arguments.end());
    }
  } else if (!arguments.empty()) {
    plan.argv = arguments;
  } else {
    plan.argv = {image.interpreter, context.toolkit_script};
  }
  plan.working_dir = container ? "" : local ? "/" : "/opt/ml/code";

  auto& env = plan.env;
  if (!container) {
    // A container's PATH, HOME and LANG are its image's (InstanceSpec::env adds to them).
    env = {{"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
           {"HOME", "/root"},
           {"LANG", "C.UTF-8"}};
  }
  if (!local && !container && StartsWith(image.interpreter, "/usr/")) {
    // A distribution's interpreter refuses `pip install` (PEP 668, EXTERNALLY-MANAGED): the
    // toolkit installs requirements.txt into the job's volume instead and puts it on PYTHONPATH.
    // An environment entry may override this (e.g. a venv that takes packages itself).
    env["KILN_PIP_TARGET"] = "/opt/ml/.kiln/site-packages";
  }
  for (const auto& [k, v] : image.env) env[k] = v;
  env["AWS_REGION"] = context.region;
  env["AWS_DEFAULT_REGION"] = context.region;
  env["AWS_ENDPOINT_URL"] = context.endpoint_url;
  env["AWS_ENDPOINT_URL_S3"] = context.endpoint_url;
  env["S3_ENDPOINT_URL"] = context.endpoint_url;
  if (request.contains("Environment") && request["Environment"].is_object()) {
    for (const auto& [k, v] : request["Environment"].items()) {
      if (v.is_string()) env[k] = v.get<std::string>();
    }
  }
  // Credentials and TRAINING_JOB_* win over the request's Environment (§5.1).
  env["AWS_ACCESS_KEY_ID"] = context.credential.access_key_id;
  env["AWS_SECRET_ACCESS_KEY"] = context.credential.secret_access_key;
  env["AWS_SESSION_TOKEN"] = context.credential.session_token;
  env["TRAINING_JOB_NAME"] = context.job_name;
  env["TRAINING_JOB_ARN"] = context.job_arn;
  env["KILN_RSH_TOKEN"] = RshToken(context.credential);

  if (container) return plan;  // nothing of the host runs in it: no binds
  BindIfInTmp(image.executable, plan.binds);
  BindIfInTmp(image.interpreter, plan.binds);
  for (size_t i = 0; i < plan.argv.size() && i < 2; ++i) BindIfInTmp(plan.argv[i], plan.binds);
  return plan;
}

std::string RshToken(const aws::Credential& credential) {
  return HexEncode(HmacSha256(credential.secret_access_key, "kiln-rsh"));
}

void AddGpuEnvironment(const Allocation& allocation, std::map<std::string, std::string>& env) {
  if (allocation.gpus.empty()) {
    env["NVIDIA_VISIBLE_DEVICES"] = "void";
    env.erase("CUDA_VISIBLE_DEVICES");
    return;
  }
  std::vector<std::string> indices;
  for (int g : allocation.gpus) indices.push_back(std::to_string(g));
  env["CUDA_VISIBLE_DEVICES"] = Join(indices, ",");
  env["NVIDIA_VISIBLE_DEVICES"] = allocation.gpu_uuids.empty() ? Join(indices, ",") : Join(allocation.gpu_uuids, ",");
}

std::vector<std::string> HostsFileLines(const std::vector<std::string>& hosts) {
  std::vector<std::string> lines = {"127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"};
  std::string line = "127.0.0.1";
  for (const auto& h : hosts) line += " " + h;
  lines.push_back(line);
  return lines;
}

std::vector<std::string> NamespacedHostsFileLines(
    const std::vector<std::pair<std::string, std::string>>& names_and_addresses) {
  std::vector<std::string> lines = {"127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"};
  for (const auto& [name, address] : names_and_addresses) lines.push_back(address + " " + name);
  return lines;
}

std::vector<int> LoopbackForwards(const std::string& endpoint_url) {
  // scheme://host[:port][/...]; IPv6 hosts are bracketed.
  std::string rest = endpoint_url;
  const size_t scheme = rest.find("://");
  const bool https = StartsWith(rest, "https://");
  if (scheme != std::string::npos) rest = rest.substr(scheme + 3);
  rest = rest.substr(0, rest.find('/'));
  std::string host = rest, port_text;
  if (StartsWith(rest, "[")) {
    const size_t close = rest.find(']');
    if (close == std::string::npos) return {};
    host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':') port_text = rest.substr(close + 2);
  } else if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    host = rest.substr(0, colon);
    port_text = rest.substr(colon + 1);
  }
  if (host != "127.0.0.1" && host != "localhost" && host != "::1") return {};
  int port = https ? 443 : 80;
  if (!port_text.empty()) {
    std::optional<int64_t> parsed = ParseInt64(port_text);
    if (!parsed || *parsed < 1 || *parsed > 65535) return {};
    port = static_cast<int>(*parsed);
  }
  return {port};
}

}  // namespace kiln::control
