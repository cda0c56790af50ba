// CreateEndpointConfig, DescribeEndpointConfig, ListEndpointConfigs, DeleteEndpointConfig
// (spec/control-plane-api.md §8.4, serving-contract.md §9).
#include <memory>
#include <set>

#include "api/definition_operations.h"
#include "api/endpoints.h"
#include "api/inference_common.h"
#include "base/strings.h"

namespace kiln::api {
namespace {

using nlohmann::json;
using namespace inference;

// Members for features Kiln does not offer in this release (§8: rejected, never silently
// ignored, so that a client never believes it has e.g. an async endpoint).
constexpr const char* kUnsupportedConfigMembers[] = {"ShadowProductionVariants", "ExplainerConfig",
                                                     "DataCaptureConfig"};
constexpr const char* kUnsupportedVariantMembers[] = {"ServerlessConfig",    "ManagedInstanceScaling",
                                                      "InstancePools",       "CapacityReservationConfig",
                                                      "InferenceAmiVersion", "AcceleratorType"};

std::optional<aws::AwsError> CheckVariant(const EndpointsContext& ctx, store::DefinitionRepository& models,
                                          const json& variant) {
  const std::string name = variant["VariantName"].get<std::string>();
  for (const char* member : kUnsupportedVariantMembers) {
    if (Has(variant, member))
      return Validation(std::string(member) + " is not supported by Kiln (production variant " + name + ").");
  }
  if (!Has(variant, "ModelName")) return Validation("Production variant " + name + " needs a ModelName.");
  if (!Has(variant, "InstanceType") || !Has(variant, "InitialInstanceCount")) {
    return Validation("Production variant " + name + " needs InstanceType and InitialInstanceCount.");
  }
  const std::string type = variant["InstanceType"].get<std::string>();
  const control::InstanceShape* shape = ctx.catalog ? ctx.catalog->Find(type) : nullptr;
  if (shape == nullptr || !shape->hosting) {
    return Validation("The instance type " + type + " of production variant " + name +
                      " is not offered for hosting by this Kiln server (see its instance catalog).");
  }
  const std::string model_name = variant["ModelName"].get<std::string>();
  auto model = models.Get(model_name);
  if (model.status().IsNotFound()) return ModelNotFound(ctx, model_name);
  if (!model.ok()) return Internal(model.status());
  const json& request = model->request;
  if (Has(request, "Containers") && request["Containers"].size() > 1) {
    return Validation("Model \"" + model->name + "\" has " + std::to_string(request["Containers"].size()) +
                      " containers: multi-container endpoints and inference pipelines are not supported by Kiln yet.");
  }
  const json container = Has(request, "PrimaryContainer") ? request["PrimaryContainer"]
                         : Has(request, "Containers")     ? request["Containers"][0]
                                                          : json::object();
  if (StringMember(container, "Mode", "SingleModel") == "MultiModel") {
    return Validation("Model \"" + model->name +
                      "\" has Mode MultiModel: multi-model endpoints are not supported by Kiln yet.");
  }
  return std::nullopt;
}

// "s3://bucket[/prefix]" (the model's pattern also admits https://, which Kiln cannot write to).
bool IsS3Uri(const std::string& uri) { return uri.size() > 5 && uri.rfind("s3://", 0) == 0 && uri[5] != '/'; }

// AsyncInferenceConfig (serving-contract.md §11.1): where outputs and failures go, the per-instance
// concurrency, and the notification topics.
std::optional<aws::AwsError> CheckAsyncInferenceConfig(const json& in) {
  const json& config = in["AsyncInferenceConfig"];
  if (Has(config, "ClientConfig") && Has(config["ClientConfig"], "MaxConcurrentInvocationsPerInstance")) {
    const int64_t n = config["ClientConfig"]["MaxConcurrentInvocationsPerInstance"].get<int64_t>();
    if (n < 1 || n > 1000) {
      return Validation(
          "AsyncInferenceConfig.ClientConfig.MaxConcurrentInvocationsPerInstance must be between 1 "
          "and 1000; " +
          std::to_string(n) + " was given.");
    }
  }
  const json output = Has(config, "OutputConfig") ? config["OutputConfig"] : json::object();
  if (!Has(output, "S3OutputPath")) {
    return Validation(
        "AsyncInferenceConfig.OutputConfig.S3OutputPath is required: the S3 location outputs are "
        "written to (s3://bucket/prefix).");
  }
  for (const char* member : {"S3OutputPath", "S3FailurePath"}) {
    if (Has(output, member) && !IsS3Uri(output[member].get<std::string>())) {
      return Validation("AsyncInferenceConfig.OutputConfig." + std::string(member) + " \"" +
                        output[member].get<std::string>() + "\" must be an S3 URI (s3://bucket/prefix).");
    }
  }
  if (Has(output, "KmsKeyId"))
    return Validation("AsyncInferenceConfig.OutputConfig.KmsKeyId is not supported by Kiln.");
  for (const json& variant : in["ProductionVariants"]) {
    if (Has(variant, "ServerlessConfig")) {
      return Validation("Asynchronous inference is not supported with serverless production variants.");
    }
  }
  return std::nullopt;
}

std::optional<aws::AwsError> CheckCreateEndpointConfig(const EndpointsContext& ctx, store::DefinitionRepository& models,
                                                       const json& in) {
  if (Has(in, "AsyncInferenceConfig") && Has(in, "ShadowProductionVariants")) {
    return Validation("Asynchronous inference endpoints do not support ShadowProductionVariants.");
  }
  for (const char* member : kUnsupportedConfigMembers) {
    if (Has(in, member)) return Validation(std::string(member) + " is not supported by Kiln.");
  }
  if (Has(in, "AsyncInferenceConfig")) {
    if (auto error = CheckAsyncInferenceConfig(in)) return error;
  }
  std::set<std::string> names;
  for (const json& variant : in["ProductionVariants"]) {
    const std::string name = variant["VariantName"].get<std::string>();
    // Variant names are compared case-insensitively: the target-variant header is matched the same way.
    if (!names.insert(ToLower(name)).second) {
      return Validation("Variant names must be unique within an endpoint configuration; \"" + name +
                        "\" is given more than once.");
    }
  }
  for (const json& variant : in["ProductionVariants"]) {
    if (auto error = CheckVariant(ctx, models, variant)) return error;
  }
  return std::nullopt;
}

}  // namespace

json RenderEndpointConfig(const store::DefinitionRecord& record) {
  json out = record.request;
  out.erase("Tags");
  out["EndpointConfigName"] = record.name;
  out["EndpointConfigArn"] = record.arn;
  out["CreationTime"] = Seconds(record.creation_millis);
  for (json& variant : out["ProductionVariants"]) {
    if (!Has(variant, "InitialVariantWeight")) variant["InitialVariantWeight"] = 1.0;  // AWS's default, echoed
  }
  return out;
}

void RegisterEndpointConfigOperations(JsonService* service, const EndpointsContext& context) {
  static constexpr DefinitionKind kEndpointConfigs{store::DefinitionRepository::Kind::kEndpointConfig,
                                                   "EndpointConfig",
                                                   "EndpointConfigName",
                                                   "EndpointConfigArn",
                                                   "EndpointConfigs",
                                                   "endpoint configuration",
                                                   EndpointConfigArn,
                                                   EndpointConfigNotFound,
                                                   RenderEndpointConfig};
  // Its check reads the models the variants name.
  auto models =
      std::make_shared<store::DefinitionRepository>(context.database, store::DefinitionRepository::Kind::kModel);
  RegisterDefinitionOperations(service, context, kEndpointConfigs, [context, models](const json& in) {
    return CheckCreateEndpointConfig(context, *models, in);
  });
}

}  // namespace kiln::api
