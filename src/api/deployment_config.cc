#include "api/deployment_config.h"

#include <vector>

#include "api/inference_common.h"
#include "control/endpoint_rollout.h"
#include "store/autoscaling_repository.h"

namespace kiln::api {

namespace {

using nlohmann::json;
using namespace inference;

// The named alarms that are not CloudWatch metric alarms Kiln holds, comma-separated ("" when all
// exist).
Result<std::string> MissingAlarms(const std::vector<std::string>& names, store::Database* database) {
  std::string missing;
  store::AutoscalingRepository alarms(database);
  for (const std::string& name : names) {
    auto alarm = alarms.Get(store::AutoscalingKind::kAlarm, "cloudwatch", "", "", name);
    if (alarm.ok()) continue;
    if (!alarm.status().IsNotFound()) return alarm.status();
    missing += (missing.empty() ? "" : ", ") + name;
  }
  return missing;
}

std::optional<aws::AwsError> CheckPolicy(const json& config, store::Database* database,
                                         control::DeploymentPolicy& policy) {
  auto parsed = control::ParseDeploymentConfig(config);
  if (!parsed.ok()) return Validation(parsed.status().message());
  policy = *parsed;
  if (database == nullptr || policy.alarms.empty()) return std::nullopt;
  auto missing = MissingAlarms(policy.alarms, database);
  if (!missing.ok()) return Internal(missing.status());
  if (!missing->empty()) {
    return Validation("The CloudWatch alarm(s) [" + *missing +
                      "] in AutoRollbackConfiguration do not exist. Create them with PutMetricAlarm, or remove them "
                      "from DeploymentConfig.AutoRollbackConfiguration.Alarms.");
  }
  return std::nullopt;
}

}  // namespace

std::optional<aws::AwsError> CheckDeploymentConfig(const json& config, store::Database* database) {
  control::DeploymentPolicy policy;
  return CheckPolicy(config, database, policy);
}

std::optional<aws::AwsError> CheckDeploymentConfigForUpdate(const json& config, const store::Deployment& current,
                                                            const store::Deployment& next,
                                                            const store::DesiredVariants& desired,
                                                            store::Database* database) {
  control::DeploymentPolicy policy;
  if (auto error = CheckPolicy(config, database, policy)) return error;
  int64_t capacity = 0;
  bool serverless = false;
  for (const std::string& variant : next.VariantNames()) {
    const json* v = next.FindVariant(variant);
    serverless = serverless || (v != nullptr && v->contains("ServerlessConfig"));
    auto it = desired.find(variant);
    if (it != desired.end() && it->second.instance_count) {
      capacity += *it->second.instance_count;
    } else if (v != nullptr) {
      capacity += v->value("InitialInstanceCount", int64_t{1});
    }
  }
  std::string message = control::CheckPolicyFits(policy, std::max<int64_t>(1, capacity), current.VariantNames(),
                                                 next.VariantNames(), serverless);
  if (!message.empty()) return Validation(message);
  return std::nullopt;
}

}  // namespace kiln::api
