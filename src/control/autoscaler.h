#pragma once
// Autoscaler: Application Auto Scaling for endpoint variants (spec serving-contract.md §10,
// control-plane-api.md §12). The API (api/autoscaling.cc) stores scalable targets, policies and
// scheduled actions (store/autoscaling_repository.h); this loop evaluates them once per
// `period_seconds` (AWS: 60) over observe::MetricStore and writes a variant's desired instance
// count into the endpoint row exactly as UpdateEndpointWeightsAndCapacities does (Mutate, status
// Updating, EndpointNotifier::EndpointChanged; last writer wins with the manual API).
//
// Target tracking (per policy, two alarms named TargetTracking-<ResourceId>-AlarmHigh-<uuid> and
// -AlarmLow-<uuid>; their state is the policy row's `state`):
//  * each completed period yields one value of the policy's metric: the predefined
//    SageMakerVariantInvocationsPerInstance is the Sum of InvocationsPerInstance (AWS/SageMaker,
//    {EndpointName, VariantName}) over the period, 0 when the variant served nothing (Kiln: an
//    idle variant is a measured 0, so it scales in); a customized metric is its Statistic over
//    the period, and a period without points leaves both alarms INSUFFICIENT_DATA (no action);
//  * AlarmHigh is ALARM after 3 consecutive periods > target: scale out to ceil(current × value /
//    target) clamped to [Min, Max], at most once per ScaleOutCooldown (default 300 s) unless the
//    new count is larger than the last scale-out's;
//  * AlarmLow is ALARM after 15 consecutive periods < 0.9 × target: scale in towards ceil(current
//    × value / target) clamped, removing at most max(1, floor(0.1 × current)) instances per step,
//    no earlier than ScaleInCooldown (default 300 s) after the target's last scaling activity;
//    DisableScaleIn suppresses it. With several policies, any scale-out wins; scale-in needs
//    every target-tracking policy of the target to ask for it (the largest count is taken).
//  * SuspendedState.DynamicScalingOutSuspended / DynamicScalingInSuspended pause them.
// Step scaling: CloudWatch metric alarms (PutMetricAlarm, stored as kind alarm) are evaluated every
// settled Period of theirs (Statistic over the period; DatapointsToAlarm of EvaluationPeriods
// breaching → ALARM; TreatMissingData breaching/notBreaching/ignore/missing); while one is in
// ALARM, each StepScaling policy its AlarmActions name applies the step adjustment the breach
// (value − threshold) falls in — ChangeInCapacity, PercentChangeInCapacity (MinAdjustmentMagnitude)
// or ExactCapacity — clamped, at most once per the policy's Cooldown (default 300 s). A step
// scale-out competes with target tracking's (the larger wins); a step scale-in needs no
// target-tracking consent. This is how an asynchronous endpoint leaves 0 instances
// (HasBacklogWithoutCapacity ≥ 1 → +1).
// Scheduled actions: at(yyyy-mm-ddThh:mm:ss), rate(N minute[s]|hour[s]|day[s]) and
// cron(minutes hours day-of-month month day-of-week year) in UTC (Timezone other than UTC is
// refused by the API), within StartTime/EndTime, set the target's Min/Max (unless
// ScheduledScalingSuspended); the loop then moves the count into the new bounds.
// Whenever the count is outside [Min, Max] (a target registered or changed), it is clamped.
// Every change is an activity (InProgress, then Successful once the endpoint is InService again,
// Failed when the endpoint failed or is gone); the endpoint must be InService to be scaled.
//
// Thread-safety: RunOnce is serialised internally; Start/Stop are the owner's.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/mutex.h"
#include "base/status.h"
#include "base/time.h"
#include "control/endpoint_notifier.h"
#include "observe/metric_store.h"
#include "store/autoscaling_repository.h"
#include "store/database.h"

namespace kiln::control {

inline constexpr std::string_view kAutoscalingNamespace = "sagemaker";
inline constexpr std::string_view kVariantInstanceDimension = "sagemaker:variant:DesiredInstanceCount";
inline constexpr std::string_view kInvocationsPerInstanceMetric = "SageMakerVariantInvocationsPerInstance";
// A serverless variant's ProvisionedConcurrency (serving-contract.md §12), tracked on the
// utilization the serverless scaler publishes (control/serverless_scaler.h).
inline constexpr std::string_view kProvisionedConcurrencyDimension = "sagemaker:variant:DesiredProvisionedConcurrency";
inline constexpr std::string_view kProvisionedConcurrencyMetric = "SageMakerVariantProvisionedConcurrencyUtilization";
inline constexpr int64_t kDefaultCooldownSeconds = 300;
inline constexpr int kHighEvaluationPeriods = 3;
inline constexpr int kLowEvaluationPeriods = 15;
inline constexpr double kLowThresholdFraction = 0.9;

struct VariantResource {
  std::string endpoint;
  std::string variant;
};
// "endpoint/<EndpointName>/variant/<VariantName>" → its names; nullopt for anything else.
std::optional<VariantResource> ParseVariantResourceId(std::string_view resource_id);

struct ScalingSchedule {
  enum class Kind { kAt, kRate, kCron } kind = Kind::kAt;
  int64_t at_millis = 0;                   // kAt
  int64_t rate_millis = 0;                 // kRate
  std::vector<std::string> cron_fields{};  // kCron: minutes hours dom month dow year
};
// Parses a Schedule; InvalidArgument with a message saying what is wrong.
Result<ScalingSchedule> ParseScalingSchedule(std::string_view text);
// The first time > `after_millis` (minute resolution) the cron schedule fires; nullopt when none
// within ~5 years.
std::optional<int64_t> NextCronMillis(const ScalingSchedule& schedule, int64_t after_millis);

// One CloudWatch alarm of a target-tracking policy (DescribeAlarms).
struct ScalingAlarm {
  std::string name{};
  std::string arn{};
  std::string policy_arn{};
  std::string state = "INSUFFICIENT_DATA";  // OK | ALARM | INSUFFICIENT_DATA
  std::string state_reason{};
  int64_t state_updated_millis = 0;
  int64_t configuration_updated_millis = 0;
  std::string metric_name{};
  std::string ns{};
  observe::Dimensions dimensions{};
  std::string statistic = "Sum";
  std::string unit{};
  double threshold = 0;
  std::string comparison{};  // GreaterThanThreshold | LessThanThreshold
  int evaluation_periods = 0;
  int period_seconds = 60;
};
// The alarms of every target-tracking policy stored, in policy order (High before Low).
Result<std::vector<ScalingAlarm>> ListScalingAlarms(store::Database* database, int period_seconds);

// The metric a target-tracking policy follows (from its TargetTrackingScalingPolicyConfiguration).
struct TrackedMetric {
  std::string ns{};
  std::string name{};
  observe::Dimensions dimensions{};
  std::string statistic = "Sum";  // Average | Minimum | Maximum | SampleCount | Sum
  std::string unit{};
  bool missing_is_zero = false;  // the predefined invocation metric: no points = 0
};
std::optional<TrackedMetric> TrackedMetricOf(const nlohmann::json& configuration, const VariantResource& resource);

struct AutoscalerOptions {
  int period_seconds = 60;
  // Points reach the store up to ~1 s after their second (serving/invocation_metrics.h): a period
  // is evaluated once it ended this long ago.
  int64_t settle_millis = 1500;
  // Activities kept per resource.
  int64_t max_activities = 1000;
  const Clock* clock = nullptr;  // nullptr: the system clock
};

struct AutoscalerDeps {
  store::Database* database = nullptr;
  observe::MetricStore* metrics = nullptr;
  EndpointNotifier* notifier = nullptr;  // may be null (tests)
};

class Autoscaler {
 public:
  Autoscaler(AutoscalerOptions options, AutoscalerDeps deps);
  ~Autoscaler();
  Autoscaler(const Autoscaler&) = delete;
  Autoscaler& operator=(const Autoscaler&) = delete;

  // Runs RunOnce on a thread, twice per period (so that a period is evaluated soon after it
  // settles). Stop joins it.
  void Start();
  void Stop();

  // Evaluates every target at the clock's now: completed periods not evaluated yet, scheduled
  // actions due, bounds, and the activities in progress. Errors are logged.
  void RunOnce();

 private:
  int64_t Now() const { return options_.clock ? options_.clock->NowMillis() : Clock::System().NowMillis(); }
  void Run();

  const AutoscalerOptions options_;
  const AutoscalerDeps deps_;
  Mutex run_mutex_;  // one RunOnce at a time
  Mutex mutex_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace kiln::control
