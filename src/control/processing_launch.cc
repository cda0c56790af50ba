#include "control/processing_launch.h"

#include <optional>

#include "agent/errors.h"
#include "agent/processing_layout.h"

namespace kiln::control {

using nlohmann::json;

namespace {

std::vector<std::string> StringList(const json& app, const char* member) {
  std::vector<std::string> out;
  if (!app.is_object() || !app.contains(member) || !app[member].is_array()) return out;
  for (const json& v : app[member]) {
    if (v.is_string()) out.push_back(v.get<std::string>());
  }
  return out;
}

}  // namespace

Result<ProcessingLaunchPlan> PlanProcessingLaunch(const json& request, const runtime::ImageResolution& image,
                                                  const ProcessingLaunchContext& context) {
  ProcessingLaunchPlan plan;
  const json app = request.value("AppSpecification", json::object());
  const std::vector<std::string> entrypoint = StringList(app, "ContainerEntrypoint");
  const std::vector<std::string> arguments = StringList(app, "ContainerArguments");
  using Kind = runtime::ImageResolution::Kind;
  if (image.kind == Kind::kContainerImage) {
    plan.container = runtime::ContainerImage{
        .requested = image.image,
        .reference = "",
        .entrypoint = entrypoint.empty() ? std::nullopt : std::optional<std::vector<std::string>>(entrypoint)};
    plan.argv = arguments;  // empty: the image's CMD (or none, under an entrypoint of the request's)
  } else if (!entrypoint.empty()) {
    plan.argv = entrypoint;
    plan.argv.insert(plan.argv.end(), arguments.begin(), arguments.end());
    if (image.kind == Kind::kScriptMode && (plan.argv[0] == "python3" || plan.argv[0] == "python")) {
      plan.argv[0] = image.interpreter;
    }
  } else if (image.kind == Kind::kLocalExecutable) {
    plan.argv = {image.executable};
    plan.argv.insert(plan.argv.end(), arguments.begin(), arguments.end());
  } else if (!arguments.empty()) {
    plan.argv = arguments;
  } else {
    return agent::ClientError("AppSpecification names no ContainerEntrypoint for the image " +
                              request.value("AppSpecification", json::object()).value("ImageUri", std::string()) +
                              ", which Kiln runs with the interpreter of its environment \"" + image.environment_name +
                              "\" (the image's own entrypoint is not available without a container engine). "
                              "Please set ContainerEntrypoint, e.g. [\"python3\", "
                              "\"/opt/ml/processing/input/code/script.py\"].");
  }
  const bool container = plan.container.has_value();
  plan.working_dir = container ? "" : "/";

  auto& env = plan.env;
  if (!container) {
    env = {{"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
           {"HOME", "/root"},
           {"LANG", "C.UTF-8"}};
  }
  if (image.kind == Kind::kScriptMode) {
    // `python`, `python3` and `pip` are the environment's, as they are the framework image's
    // (the run writes them: agent::WriteInterpreterShims).
    env["PATH"] = std::string(agent::kProcessingShimDir) + ":" + env["PATH"];
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
  // The credentials win over the request's Environment (§5.1).
  env["AWS_ACCESS_KEY_ID"] = context.credential.access_key_id;
  env["AWS_SECRET_ACCESS_KEY"] = context.credential.secret_access_key;
  env["AWS_SESSION_TOKEN"] = context.credential.session_token;

  if (container) return plan;
  BindIfInTmp(image.executable, plan.binds);
  BindIfInTmp(image.interpreter, plan.binds);
  for (size_t i = 0; i < plan.argv.size() && i < 2; ++i) BindIfInTmp(plan.argv[i], plan.binds);
  return plan;
}

}  // namespace kiln::control
