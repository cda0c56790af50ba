#include "control/serving_launch.h"

#include <algorithm>

#include "base/strings.h"
#include "control/training_launch.h"

namespace kiln::control {

using json = nlohmann::json;

std::vector<int> MultiContainerCpus(const std::vector<int>& cpus, size_t index, size_t count) {
  if (count <= 1 || cpus.size() < count || index >= count) return cpus;
  const size_t per = cpus.size() / count;
  const size_t extra = cpus.size() % count;
  const size_t begin = index * per + std::min(index, extra);
  const size_t length = per + (index < extra ? 1 : 0);
  return std::vector<int>(cpus.begin() + static_cast<std::ptrdiff_t>(begin),
                          cpus.begin() + static_cast<std::ptrdiff_t>(begin + length));
}

ServingLaunchPlan PlanServingLaunch(const json& container, const runtime::ImageResolution& image,
                                    const ServingLaunchContext& context) {
  ServingLaunchPlan plan;
  const bool local = image.kind == runtime::ImageResolution::Kind::kLocalExecutable;
  const bool engine = image.kind == runtime::ImageResolution::Kind::kContainerImage;
  if (engine) {
    // `docker run IMAGE serve`: the image answers /ping and /invocations itself.
    plan.container = runtime::ContainerImage{.requested = image.image, .reference = "", .entrypoint = std::nullopt};
    plan.argv = {"serve"};
  } else {
    plan.argv = {local ? image.executable : context.model_server, "serve"};
  }

  auto& env = plan.env;
  if (!engine) {
    // A container's PATH, HOME and LANG are its image's (InstanceSpec::env adds to them).
    env = {{"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
           {"HOME", "/root"},
           {"LANG", "C.UTF-8"}};
  }
  for (const auto& [k, v] : image.env) env[k] = v;
  if (!local && !engine) {
    env["KILN_MODEL_SERVER_PYTHON"] = image.interpreter;
    env["KILN_MODEL_SERVER_WORKER"] = context.serve_worker;
    env["KILN_MODEL_SERVER_FRAMEWORK"] = runtime::FrameworkOfImage(container.value("Image", ""));
    if (StartsWith(image.interpreter, "/usr/")) {
      // As for training (training_launch.cc): a distribution's interpreter refuses `pip install`
      // (PEP 668), so code/requirements.txt goes into the instance's volume, on the workers' path.
      env["KILN_PIP_TARGET"] = "/opt/ml/.kiln/site-packages";
    }
  }
  env["AWS_REGION"] = context.region;
  env["AWS_DEFAULT_REGION"] = context.region;
  env["SAGEMAKER_REGION"] = context.region;
  env["AWS_ENDPOINT_URL"] = context.endpoint_url;
  env["AWS_ENDPOINT_URL_S3"] = context.endpoint_url;
  env["S3_ENDPOINT_URL"] = context.endpoint_url;
  if (auto it = container.find("Environment"); it != container.end() && it->is_object()) {
    for (const auto& [k, v] : it->items()) {
      if (v.is_string()) env[k] = v.get<std::string>();
    }
  }
  if (!context.credential.access_key_id.empty()) {
    env["AWS_ACCESS_KEY_ID"] = context.credential.access_key_id;
    env["AWS_SECRET_ACCESS_KEY"] = context.credential.secret_access_key;
    env["AWS_SESSION_TOKEN"] = context.credential.session_token;
  }
  // Multi-model mode (serving-contract.md §4.1, §7): models under /opt/ml/models, loaded on demand.
  if (container.value("Mode", "") == "MultiModel") env["SAGEMAKER_MULTI_MODEL"] = "true";
  env["SAGEMAKER_BIND_TO_PORT"] = std::to_string(context.port);
  env["SAGEMAKER_SAFE_PORT_RANGE"] =
      std::to_string(context.port + 1) + "-" + std::to_string(context.port + context.port_block - 1);

  if (engine) {
    // Nothing of the host runs in it: no binds.
  } else if (local) {
    BindIfInTmp(image.executable, plan.binds);
  } else {
    for (const std::string* path : {&image.interpreter, &context.model_server, &context.serve_worker}) {
      BindIfInTmp(*path, plan.binds);
    }
  }
  return plan;
}

}  // namespace kiln::control
