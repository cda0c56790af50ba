// CreateModel, DescribeModel, ListModels, DeleteModel (spec/control-plane-api.md §8.3).
#include <memory>
#include <set>
#include <string>

#include "api/definition_operations.h"
#include "api/endpoints.h"
#include "api/inference_common.h"
#include "base/strings.h"

namespace kiln::api {
namespace {

using nlohmann::json;
using namespace inference;

// ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$ (ContainerHostname).
bool IsContainerHostname(const std::string& v) {
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); };
  if (v.empty() || v.size() > 63 || !alnum(v.front()) || !alnum(v.back())) return false;
  for (char c : v) {
    if (!alnum(c) && c != '-') return false;
  }
  return true;
}

// Multi-container models (serving-contract.md §8): InferenceExecutionConfig.Mode Direct needs a
// ContainerHostname on every container; in both modes names are unique, and Serial names all
// containers or none.
std::optional<aws::AwsError> CheckContainerHostnames(const json& in, const json& containers) {
  std::string mode = "Serial";
  if (Has(in, "InferenceExecutionConfig")) {
    const json& config = in["InferenceExecutionConfig"];
    mode = config.is_object() ? StringMember(config, "Mode", "") : "";
    if (mode != "Serial" && mode != "Direct") {
      return Validation("1 validation error detected: Value '" + mode +
                        "' at 'inferenceExecutionConfig.mode' failed to satisfy constraint: Member must satisfy enum "
                        "value set: [Serial, Direct]");
    }
    if (!Has(in, "Containers")) {
      return Validation(
          "InferenceExecutionConfig applies to models with Containers; remove it or list the "
          "containers in Containers.");
    }
  }
  std::set<std::string> names;
  size_t named = 0;
  for (const json& container : containers) {
    if (!Has(container, "ContainerHostname")) {
      if (mode == "Direct") {
        return Validation(
            "Every container of a model with InferenceExecutionConfig Mode Direct needs a "
            "ContainerHostname: requests name it in TargetContainerHostname.");
      }
      continue;
    }
    const std::string name = container["ContainerHostname"].get<std::string>();
    if (!IsContainerHostname(name)) {
      return Validation("1 validation error detected: Value '" + name +
                        "' at 'containers.member.containerHostname' failed to satisfy constraint: Member must "
                        "satisfy regular expression pattern: ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}");
    }
    if (!names.insert(name).second) {
      return Validation("ContainerHostname " + name +
                        " is used by more than one container: give each container "
                        "of the model a unique ContainerHostname.");
    }
    ++named;
  }
  if (named != 0 && named != containers.size()) {
    return Validation("Either all containers of the inference pipeline have a ContainerHostname or none does (" +
                      std::to_string(named) + " of " + std::to_string(containers.size()) + " have one).");
  }
  return std::nullopt;
}

// The checks the service model cannot express. Returns the first failure.
std::optional<aws::AwsError> CheckCreateModel(const json& in) {
  const bool primary = Has(in, "PrimaryContainer");
  const bool list = Has(in, "Containers");
  if (primary == list) {
    return Validation(primary ? "Give either PrimaryContainer or Containers, not both."
                              : "A model needs a container: give PrimaryContainer or Containers.");
  }
  if (list && (in["Containers"].empty() || in["Containers"].size() > 15)) {
    return Validation("Containers must list at least one container and at most 15 (it lists " +
                      std::to_string(in["Containers"].size()) + ").");
  }
  const json containers = primary ? json::array({in["PrimaryContainer"]}) : in["Containers"];
  bool has_model_data = false;
  for (const json& container : containers) {
    if (Has(container, "ModelPackageName") || Has(container, "InferenceSpecificationName")) {
      return Validation(
          "ModelPackageName is not supported by Kiln yet: give the container's Image (and ModelDataUrl).");
    }
    if (Has(container, "AdditionalModelDataSources")) {
      return Validation("AdditionalModelDataSources is not supported by Kiln yet.");
    }
    if (!Has(container, "Image") || container["Image"].get<std::string>().empty()) {
      return Validation("Every container needs an Image (Kiln does not resolve containers from model packages yet).");
    }
    if (Has(container, "ModelDataUrl") || Has(container, "ModelDataSource")) has_model_data = true;
  }
  if (auto error = CheckContainerHostnames(in, containers)) return error;
  // Kiln (§8.3): the role stands for the credentials an instance downloads its model data with.
  if (has_model_data && !Has(in, "ExecutionRoleArn")) {
    return Validation("ExecutionRoleArn is required when a container has ModelDataUrl or ModelDataSource.");
  }
  return std::nullopt;
}

json WithContainerDefaults(json container) {
  // AWS echoes these two for every container (DescribeModel of a model created without them).
  if (!Has(container, "Mode")) container["Mode"] = "SingleModel";
  if (!Has(container, "Environment")) container["Environment"] = json::object();
  return container;
}

}  // namespace

json RenderModel(const store::DefinitionRecord& record) {
  json out = record.request;
  out.erase("Tags");
  out["ModelName"] = record.name;
  out["ModelArn"] = record.arn;
  out["CreationTime"] = Seconds(record.creation_millis);
  if (Has(out, "PrimaryContainer")) out["PrimaryContainer"] = WithContainerDefaults(out["PrimaryContainer"]);
  if (Has(out, "Containers")) {
    for (json& container : out["Containers"]) container = WithContainerDefaults(container);
  }
  // AWS shows the mode of a model with Containers even when it was not given (Serial, §8).
  if (Has(out, "Containers") && !Has(out, "InferenceExecutionConfig")) {
    out["InferenceExecutionConfig"] = {{"Mode", "Serial"}};
  }
  if (!Has(out, "EnableNetworkIsolation")) out["EnableNetworkIsolation"] = false;
  return out;
}

void RegisterModelOperations(JsonService* service, const EndpointsContext& context) {
  static constexpr DefinitionKind kModels{store::DefinitionRepository::Kind::kModel,
                                          "Model",
                                          "ModelName",
                                          "ModelArn",
                                          "Models",
                                          "model",
                                          ModelArn,
                                          ModelNotFound,
                                          RenderModel};
  RegisterDefinitionOperations(service, context, kModels, CheckCreateModel);
}

}  // namespace kiln::api
