#pragma once
// Application Auto Scaling (service AnyScaleFrontendService, JSON 1.1; spec control-plane-api.md
// §12, serving-contract.md §10) for SageMaker endpoint variants:
//   RegisterScalableTarget, DescribeScalableTargets, DeregisterScalableTarget,
//   PutScalingPolicy, DescribeScalingPolicies, DeleteScalingPolicy, DescribeScalingActivities,
//   PutScheduledAction, DescribeScheduledActions, DeleteScheduledAction.
//
// Requests are validated against the embedded botocore model (src/api/models/autoscaling.json,
// trimmed to these operations) before a handler runs; handlers add the rules AWS applies
// server-side (namespace sagemaker, resource id endpoint/<ep>/variant/<v> of an existing
// endpoint and variant, dimension sagemaker:variant:DesiredInstanceCount, capacities: Min ≥ 1,
// or ≥ 0 for an asynchronous endpoint, Max ≥ Min; policy configurations; schedules) and answer
// ValidationException / ObjectNotFoundException (400) as AWS does. The handlers only store
// (store/autoscaling_repository.h); control/autoscaler.h acts on what is stored. Describe* page
// with NextToken (api/paging.h, bound to the request) and MaxResults (default 50).
//
// Thread-safety: handlers use only the thread-safe repositories.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/json_service.h"
#include "api/service_model.h"
#include "base/status.h"
#include "base/time.h"
#include "store/database.h"

namespace kiln::api {

struct AutoscalingContext {
  store::Database* database = nullptr;
  std::string account_id;
  std::string region;
  const Clock* clock = nullptr;  // nullptr: the system clock
};

// Registers the operations on `service` (the AnyScaleFrontendService JsonService) and sets its
// model. `context.database` must outlive the service.
void RegisterAutoscalingOperations(JsonService* service, const AutoscalingContext& context);

// The scaling alarms of every target-tracking policy as CloudWatch MetricAlarm structures
// (control::ListScalingAlarms, evaluated every `period_seconds`), for CloudWatchOptions::alarms.
std::function<Result<std::vector<nlohmann::json>>()> ScalingAlarmSource(store::Database* database, int period_seconds);

// The embedded Application Auto Scaling model (never null; a parse failure aborts).
std::shared_ptr<const ServiceModel> AutoscalingModel();
std::string_view EmbeddedAutoscalingModelJson();

}  // namespace kiln::api
