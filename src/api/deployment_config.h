#pragma once
// DeploymentConfig of CreateEndpoint and UpdateEndpoint (spec/serving-contract.md §9): the checks
// AWS makes beyond the botocore shape (which the API's validator has already applied: types,
// enums, the 0–3600 / 600–28800 ranges, at most 10 alarms). The rules themselves are
// control/endpoint_rollout.h's (ParseDeploymentConfig, CheckPolicyFits), shared with the
// controller that acts on the policy; this file adds what needs the store: the alarms must exist.
//
// Thread-safety: stateless; the database serialises its own access.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "aws/errors.h"
#include "store/database.h"
#include "store/endpoint_state.h"

namespace kiln::api {

// A DeploymentConfig as CreateEndpoint stores it for later updates: its rules
// (ParseDeploymentConfig) and its alarms, which must exist as CloudWatch metric alarms
// (PutMetricAlarm). ValidationException naming what to change; nullopt when acceptable.
std::optional<aws::AwsError> CheckDeploymentConfig(const nlohmann::json& config, store::Database* database);

// The same for the DeploymentConfig an UpdateEndpoint runs with (given, or retained), plus the
// sizes against the new deployment (`next`, with its desired counts `desired`; `current` the
// deployment it replaces).
std::optional<aws::AwsError> CheckDeploymentConfigForUpdate(const nlohmann::json& config,
                                                            const store::Deployment& current,
                                                            const store::Deployment& next,
                                                            const store::DesiredVariants& desired,
                                                            store::Database* database);

}  // namespace kiln::api
