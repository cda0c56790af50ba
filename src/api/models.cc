// CreateModel, DescribeModel, ListModels, DeleteModel (spec/control-plane-api.md §8.3).
#include <memory>

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
      return Validation("ModelPackageName is not supported by Kiln yet: give the container's Image (and ModelDataUrl).");
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
  auto ctx = std::make_shared<EndpointsContext>(context);
  auto models = std::make_shared<store::DefinitionRepository>(context.database, store::DefinitionRepository::Kind::kModel);
  auto tags = std::make_shared<store::TagRepository>(context.database);

  service->Register("CreateModel", [ctx, models, tags](const aws::RequestContext&, const json& in) -> JsonOutcome {
    if (auto error = CheckCreateModel(in)) return *error;
    store::DefinitionRecord record;
    record.name = in["ModelName"].get<std::string>();
    record.arn = ModelArn(*ctx, record.name);
    record.request = in;
    record.request.erase("Tags");  // kept in the tag table
    record.creation_millis = NowMillis(*ctx);
    Status inserted = models->Insert(record);
    if (inserted.IsAlreadyExists()) {
      // The SageMaker SDK tests for this text and reuses the model (§7).
      return Validation("Cannot create already existing model \"" + inserted.message() + "\".");
    }
    if (!inserted.ok()) return Internal(inserted);
    StoreCreateTags(*tags, record.arn, in);
    return json{{"ModelArn", record.arn}};
  });

  service->Register("DescribeModel", [ctx, models](const aws::RequestContext&, const json& in) -> JsonOutcome {
    const std::string name = in["ModelName"].get<std::string>();
    auto record = models->Get(name);
    if (record.status().IsNotFound()) return ModelNotFound(*ctx, name);
    if (!record.ok()) return Internal(record.status());
    return RenderModel(*record);
  });

  service->Register("ListModels", [ctx, models](const aws::RequestContext&, const json& in) -> JsonOutcome {
    auto listed = ListDefinitions(*models, *ctx, in, "Models", "ModelName", "ModelArn");
    if (auto* error = std::get_if<aws::AwsError>(&listed)) return *error;
    return std::get<json>(std::move(listed));
  });

  // Allowed while endpoints use the model: their deployments hold a copy (§8.3).
  service->Register("DeleteModel", [ctx, models](const aws::RequestContext&, const json& in) -> JsonOutcome {
    const std::string name = in["ModelName"].get<std::string>();
    Status deleted = models->Delete(name);
    if (deleted.IsNotFound()) return ModelNotFound(*ctx, name);
    if (!deleted.ok()) return Internal(deleted);
    return json::object();
  });
}

}  // namespace kiln::api
