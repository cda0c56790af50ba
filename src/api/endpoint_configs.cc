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
constexpr const char* kUnsupportedConfigMembers[] = {"ExplainerConfig"};
constexpr const char* kUnsupportedVariantMembers[] = {
    "ManagedInstanceScaling", "InstancePools", "CapacityReservationConfig", "InferenceAmiVersion", "AcceleratorType"};

// A serverless variant (serving-contract.md §12): ServerlessConfig instead of InstanceType and
// InitialInstanceCount, the only variant of its configuration, and a model AWS can run serverless
// (no VPC, no network isolation; multi-model is refused for every variant below).
std::optional<aws::AwsError> CheckServerlessVariant(const json& variant, const json& model) {
  const std::string name = variant["VariantName"].get<std::string>();
  for (const char* member : {"InstanceType", "InitialInstanceCount"}) {
    if (Has(variant, member)) {
      return Validation("Production variant " + name + " has both ServerlessConfig and " + member +
                        ": a serverless variant is sized by its ServerlessConfig only; remove " + member + ".");
    }
  }
  const json& config = variant["ServerlessConfig"];
  const int64_t memory = config.value("MemorySizeInMB", int64_t{0});
  if (memory < 1024 || memory > 6144 || memory % 1024 != 0) {
    return Validation("Invalid MemorySizeInMB " + std::to_string(memory) + " for production variant " + name +
                      ". Valid values are 1024, 2048, 3072, 4096, 5120 and 6144.");
  }
  const int64_t max_concurrency = config.value("MaxConcurrency", int64_t{0});
  if (max_concurrency < 1 || max_concurrency > 200) {
    return Validation("Invalid MaxConcurrency " + std::to_string(max_concurrency) + " for production variant " + name +
                      ". It must be between 1 and 200.");
  }
  if (Has(config, "ProvisionedConcurrency")) {
    const int64_t provisioned = config["ProvisionedConcurrency"].get<int64_t>();
    if (provisioned < 1 || provisioned > 200) {
      return Validation("Invalid ProvisionedConcurrency " + std::to_string(provisioned) + " for production variant " +
                        name + ". It must be between 1 and 200.");
    }
    if (provisioned > max_concurrency) {
      return Validation("ProvisionedConcurrency (" + std::to_string(provisioned) +
                        ") must be less than or equal to MaxConcurrency (" + std::to_string(max_concurrency) +
                        ") for production variant " + name + ".");
    }
  }
  const std::string model_name = StringMember(variant, "ModelName", "");
  if (Has(model, "VpcConfig")) {
    return Validation("Model \"" + model_name +
                      "\" has a VpcConfig: serverless endpoints do not support VPC configurations.");
  }
  if (model.value("EnableNetworkIsolation", false)) {
    return Validation("Model \"" + model_name +
                      "\" has EnableNetworkIsolation: serverless endpoints do not support network isolation.");
  }
  return std::nullopt;
}

bool IsS3Uri(const std::string& uri);  // below

// True when `variant`'s model exists and has several containers (serving-contract.md §8).
bool IsMultiContainerVariant(store::DefinitionRepository& models, const json& variant) {
  if (!Has(variant, "ModelName")) return false;
  auto model = models.Get(variant["ModelName"].get<std::string>());
  return model.ok() && Has(model->request, "Containers") && model->request["Containers"].size() > 1;
}

// True when `variant`'s model exists and its container has Mode MultiModel.
bool IsMultiModelVariant(store::DefinitionRepository& models, const json& variant) {
  if (!Has(variant, "ModelName")) return false;
  auto model = models.Get(variant["ModelName"].get<std::string>());
  if (!model.ok()) return false;
  const json& request = model->request;
  const json container = Has(request, "PrimaryContainer") ? request["PrimaryContainer"]
                         : Has(request, "Containers")     ? request["Containers"][0]
                                                          : json::object();
  return StringMember(container, "Mode", "SingleModel") == "MultiModel";
}

std::optional<aws::AwsError> CheckVariant(const EndpointsContext& ctx, store::DefinitionRepository& models,
                                          const json& variant) {
  const std::string name = variant["VariantName"].get<std::string>();
  for (const char* member : kUnsupportedVariantMembers) {
    if (Has(variant, member))
      return Validation(std::string(member) + " is not supported by Kiln (production variant " + name + ").");
  }
  if (!Has(variant, "ModelName")) return Validation("Production variant " + name + " needs a ModelName.");
  const bool serverless = Has(variant, "ServerlessConfig");
  if (!serverless) {
    if (!Has(variant, "InstanceType") || !Has(variant, "InitialInstanceCount")) {
      return Validation("Production variant " + name +
                        " needs InstanceType and InitialInstanceCount, or a ServerlessConfig.");
    }
    const std::string type = variant["InstanceType"].get<std::string>();
    const control::InstanceShape* shape = ctx.catalog ? ctx.catalog->Find(type) : nullptr;
    if (shape == nullptr || !shape->hosting) {
      return Validation("The instance type " + type + " of production variant " + name +
                        " is not offered for hosting by this Kiln server (see its instance catalog).");
    }
  }
  const std::string model_name = variant["ModelName"].get<std::string>();
  auto model = models.Get(model_name);
  if (model.status().IsNotFound()) return ModelNotFound(ctx, model_name);
  if (!model.ok()) return Internal(model.status());
  const json& request = model->request;
  if (serverless) {
    if (auto error = CheckServerlessVariant(variant, request)) return error;
  }
  if (Has(request, "Containers") && request["Containers"].size() > 1) {
    // Multi-container endpoints and inference pipelines (serving-contract.md §8): every container on
    // every instance. Serverless variants run one container (AWS refuses pipelines there too).
    if (serverless) {
      return Validation("Model \"" + model->name + "\" has " + std::to_string(request["Containers"].size()) +
                        " containers: serverless production variant " + name +
                        " does not support multi-container endpoints or inference pipelines; use InstanceType and "
                        "InitialInstanceCount.");
    }
    for (const json& container : request["Containers"]) {
      if (StringMember(container, "Mode", "SingleModel") == "MultiModel") {
        return Validation("Model \"" + model->name +
                          "\" has several containers, one of them with Mode MultiModel: Kiln does not serve "
                          "multi-model containers inside multi-container endpoints or inference pipelines yet.");
      }
    }
  }
  const json container = Has(request, "PrimaryContainer") ? request["PrimaryContainer"]
                         : Has(request, "Containers")     ? request["Containers"][0]
                                                          : json::object();
  if (StringMember(container, "Mode", "SingleModel") == "MultiModel") {
    // Multi-model (serving-contract.md §7): TargetModel is relative to an S3 prefix; serverless
    // variants load one model only (AWS refuses the pair too).
    if (serverless) {
      return Validation("Model \"" + model->name + "\" has Mode MultiModel: serverless production variant " + name +
                        " does not support multi-model endpoints; use InstanceType and InitialInstanceCount.");
    }
    if (!IsS3Uri(StringMember(container, "ModelDataUrl", ""))) {
      return Validation("Model \"" + model->name +
                        "\" has Mode MultiModel: its ModelDataUrl must be the S3 prefix (s3://bucket/prefix/) "
                        "that TargetModel is relative to.");
    }
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

// DataCaptureConfig (serving-contract.md §14; the botocore model checked the members' shapes,
// ranges and patterns): an S3 destination Kiln can write, no KMS key, real-time endpoints only.
std::optional<aws::AwsError> CheckDataCaptureConfig(const json& in) {
  const json& config = in["DataCaptureConfig"];
  const std::string uri = StringMember(config, "DestinationS3Uri", "");
  if (!IsS3Uri(uri)) {
    return Validation("DataCaptureConfig.DestinationS3Uri \"" + uri +
                      "\" must be an S3 URI (s3://bucket/prefix): Kiln writes capture files to its object store.");
  }
  if (Has(config, "KmsKeyId")) return Validation("DataCaptureConfig.KmsKeyId is not supported by Kiln.");
  if (Has(in, "AsyncInferenceConfig")) {
    return Validation(
        "DataCaptureConfig is not supported by Kiln for asynchronous inference endpoints; capture applies to "
        "real-time endpoints.");
  }
  return std::nullopt;
}

// ShadowProductionVariants (serving-contract.md §9): one shadow beside exactly one production
// variant, each checked as a production variant is, with names unique across both lists.
std::optional<aws::AwsError> CheckShadowVariants(const EndpointsContext& ctx, store::DefinitionRepository& models,
                                                 const json& in) {
  const json& shadows = in["ShadowProductionVariants"];
  if (shadows.size() != 1 || in["ProductionVariants"].size() != 1) {
    return Validation(
        "An endpoint configuration with ShadowProductionVariants must have exactly one production variant and "
        "one shadow variant; " +
        std::to_string(in["ProductionVariants"].size()) + " production and " + std::to_string(shadows.size()) +
        " shadow variants were given.");
  }
  std::set<std::string> names;
  for (const json& variant : in["ProductionVariants"]) names.insert(ToLower(variant["VariantName"].get<std::string>()));
  for (const json& shadow : shadows) {
    const std::string name = shadow["VariantName"].get<std::string>();
    if (!names.insert(ToLower(name)).second) {
      return Validation("Variant names must be unique within an endpoint configuration; \"" + name +
                        "\" is given more than once.");
    }
    if (Has(shadow, "ServerlessConfig")) {
      return Validation("Shadow variant " + name +
                        " has a ServerlessConfig: shadow variants need InstanceType and "
                        "InitialInstanceCount.");
    }
    if (auto error = CheckVariant(ctx, models, shadow)) return error;
    // Kiln copies a request to a shadow's instance address only (serving/shadow_variants.h).
    if (IsMultiContainerVariant(models, shadow)) {
      return Validation("Shadow variant " + name +
                        " serves a multi-container model: Kiln does not run multi-container endpoints or inference "
                        "pipelines as shadow variants yet.");
    }
  }
  return std::nullopt;
}

std::optional<aws::AwsError> CheckCreateEndpointConfig(const EndpointsContext& ctx, store::DefinitionRepository& models,
                                                       const json& in) {
  if (Has(in, "AsyncInferenceConfig") && Has(in, "ShadowProductionVariants")) {
    return Validation("Asynchronous inference endpoints do not support ShadowProductionVariants.");
  }
  // Serverless (§12): one variant, neither asynchronous inference nor shadows nor data capture
  // (AsyncInferenceConfig's own check below says so for async).
  bool serverless = false;
  for (const json& variant : in["ProductionVariants"]) serverless = serverless || Has(variant, "ServerlessConfig");
  if (serverless && !Has(in, "AsyncInferenceConfig")) {
    if (in["ProductionVariants"].size() > 1) {
      return Validation(
          "An endpoint configuration with a serverless production variant (ServerlessConfig) must have "
          "exactly one production variant; " +
          std::to_string(in["ProductionVariants"].size()) + " were given.");
    }
    for (const char* member : {"ShadowProductionVariants", "DataCaptureConfig"}) {
      if (Has(in, member)) {
        return Validation(std::string(member) + " is not supported for serverless endpoints.");
      }
    }
  }
  for (const char* member : kUnsupportedConfigMembers) {
    if (Has(in, member)) return Validation(std::string(member) + " is not supported by Kiln.");
  }
  if (Has(in, "DataCaptureConfig")) {
    if (auto error = CheckDataCaptureConfig(in)) return error;
  }
  if (Has(in, "ShadowProductionVariants")) {
    if (auto error = CheckShadowVariants(ctx, models, in)) return error;
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
    // Multi-model endpoints are real-time only (their requests are placed on the invoke path).
    if (Has(in, "AsyncInferenceConfig") && IsMultiModelVariant(models, variant)) {
      return Validation("Production variant " + variant["VariantName"].get<std::string>() +
                        " serves a multi-model model (Mode MultiModel): asynchronous inference endpoints do not "
                        "support multi-model endpoints.");
    }
    // The async dispatcher calls one container per request (control/async_dispatcher.cc).
    if (Has(in, "AsyncInferenceConfig") && IsMultiContainerVariant(models, variant)) {
      return Validation("Production variant " + variant["VariantName"].get<std::string>() +
                        " serves a multi-container model: Kiln does not run multi-container endpoints or inference "
                        "pipelines for asynchronous inference yet; use a real-time endpoint.");
    }
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
