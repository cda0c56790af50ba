// CreateModel, DescribeModel, ListModels, DeleteModel (spec/control-plane-api.md §8.3).
#include <memory>

#include "api/definition_operations.h"
#include "api/endpoints.h"
#include "api/inference_common.h"
#include "base/strings.h"

namespace kiln::api {
namespace {

using nlohmann::json;
using namespace inference;

// The checks the service model cannot express. Returns the first failure.
std::optional<aws::AwsError> CheckCreateModel(const json& in) {
  const bool primary = Has(in, "PrimaryContainer");
  const bool list = Has(in, "Containers");
  if (primary == list) {
    return Validation(primary ? "Give either PrimaryContainer or Containers, not both."
                              : "A model needs a container: give PrimaryContainer or Containers.");
  }
  if (list && in["Containers"].empty()) {
    return Validation("Containers must list at least one container (at most 15).");
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
