#pragma once
// Guarded UpdateEndpoint rollouts (DeploymentConfig; spec/serving-contract.md §9): what a
// DeploymentConfig asks for, the traffic steps it makes, and the next move of a rollout in
// progress. Pure (no clock, no store, no threads): endpoint_rollout_test.cc tables every decision;
// the endpoint run (control/endpoint_controller.cc) reads the alarms and executes the moves, and
// PlanEndpoint (control/endpoint_plan.h) calls DecideRollout once the new fleet is ready.
//
// A blue/green rollout, once every new instance is healthy:
//
//   step 1 .. n   the new fleet gets TrafficSteps()[k] of the traffic (ALL_AT_ONCE: 1; CANARY:
//                 the canary's share, then 1; LINEAR: s, 2s, ..., 1), each followed by a bake of
//                 WaitIntervalInSeconds                                           (phase Baking)
//   then          TerminationWaitInSeconds with all traffic on the new fleet and the old one kept
//                                                                          (phase TerminationWait)
//   then          Complete: the pending deployment becomes the deployment, the old fleet drains.
//
// While any step bakes and during the termination wait the AutoRollbackConfiguration alarms are
// watched: one in ALARM rolls the update back (traffic returns to the old fleet at once). The
// MaximumExecutionTimeoutInSeconds, counted from the UpdateEndpoint, rolls it back too, at any
// point before Complete. Without a DeploymentConfig policy (none given) the update is Kiln's
// plain blue/green: one swap once the new fleet is ready, no bake.
//
// A rolling update (RollingUpdatePolicy) replaces a single variant's instances in batches of
// MaximumBatchSize: RollingTargets() says how many new and old instances step k keeps; the new
// fleet's traffic share is its share of the routable instances.
//
// Thread-safety: pure functions over values.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "store/endpoint_state.h"

namespace kiln::control {

// AWS's CapacitySize: {"Type": "INSTANCE_COUNT" | "CAPACITY_PERCENT", "Value": n ≥ 1}.
struct CapacitySize {
  enum class Type { kInstanceCount, kCapacityPercent };
  Type type = Type::kCapacityPercent;
  int64_t value = 100;

  // The instances this size is out of `capacity`: INSTANCE_COUNT as given, CAPACITY_PERCENT
  // rounded up; at least 1 and at most `capacity` (when capacity ≥ 1).
  int64_t Instances(int64_t capacity) const;
  // Its share of `capacity`: value / capacity, or value / 100; within [0, 1].
  double Fraction(int64_t capacity) const;
  // Its share in percent of `capacity` (INSTANCE_COUNT: 100 × value / capacity).
  double Percent(int64_t capacity) const;
  bool operator==(const CapacitySize&) const = default;
};

// What a DeploymentConfig asks for.
struct DeploymentPolicy {
  enum class Kind { kBlueGreen, kRolling };
  enum class Traffic { kAllAtOnce, kCanary, kLinear };
  // False when the update has no BlueGreenUpdatePolicy or RollingUpdatePolicy: Kiln's plain
  // blue/green (all traffic in one swap once the new fleet is ready, no bake, no alarms).
  bool given = false;
  Kind kind = Kind::kBlueGreen;
  Traffic traffic = Traffic::kAllAtOnce;
  CapacitySize step;                           // CanarySize, LinearStepSize or MaximumBatchSize
  std::optional<CapacitySize> rollback_batch;  // RollbackMaximumBatchSize (rolling)
  int64_t wait_seconds = 0;                    // WaitIntervalInSeconds: each bake
  int64_t termination_wait_seconds = 0;        // TerminationWaitInSeconds (blue/green)
  int64_t max_execution_seconds = 0;           // MaximumExecutionTimeoutInSeconds; 0: not given
  std::vector<std::string> alarms;             // AutoRollbackConfiguration.Alarms[].AlarmName
  bool operator==(const DeploymentPolicy&) const = default;
};

// The policy of a DeploymentConfig whose shape the API's botocore validator has checked (types,
// enums, ranges). Null or an object without a policy: `given` false (alarms still read).
// InvalidArgument, with a message saying what to change, for AWS's rules beyond the shape:
// BlueGreenUpdatePolicy and RollingUpdatePolicy together; CANARY without CanarySize or with
// LinearStepSize; LINEAR without LinearStepSize or with CanarySize; ALL_AT_ONCE with either;
// CAPACITY_PERCENT above 100; a MaximumExecutionTimeoutInSeconds not larger than the waits it
// must hold; an alarm named twice.
Result<DeploymentPolicy> ParseDeploymentConfig(const nlohmann::json& config);

// The rules that need the new deployment (AWS's, per variant capacity): CanarySize at most 50 %
// of the capacity; LinearStepSize 10–50 %; MaximumBatchSize 5–50 %; a rolling update only for an
// endpoint with a single variant, the same name before and after, and no serverless variant.
// `capacity` is the new deployment's instance count (the sum over its production variants).
// Returns "" when the policy fits, else the message.
std::string CheckPolicyFits(const DeploymentPolicy& policy, int64_t capacity,
                            const std::vector<std::string>& old_variants, const std::vector<std::string>& new_variants,
                            bool serverless);

// The new fleet's traffic share after each blue/green step, ending with 1.
std::vector<double> TrafficSteps(const DeploymentPolicy& policy, int64_t capacity);

// Rolling: after batch `step` (1-based; 0 = before the first), the new instances to have and the
// old ones to keep: new = min(new_count, step × batch), old = max(0, old_count − step × batch),
// batch = MaximumBatchSize's instances of new_count. The update is done once new = new_count and
// old = 0 (StepsOfRolling() steps).
struct RollingTargets {
  int64_t new_instances = 0;
  int64_t old_instances = 0;
  bool operator==(const RollingTargets&) const = default;
};
RollingTargets RollingTargetsAt(const DeploymentPolicy& policy, int64_t step, int64_t new_count, int64_t old_count);
int64_t StepsOfRolling(const DeploymentPolicy& policy, int64_t new_count, int64_t old_count);

// One pass's view of a rollout in progress.
struct RolloutInput {
  const DeploymentPolicy* policy = nullptr;
  // The recorded progress; ignored unless its generation is `generation` (nullopt: no shift yet).
  std::optional<store::RolloutState> state{};
  int64_t generation = 0;        // the pending deployment's deployed_millis (wall clock, the update's start)
  int64_t capacity = 1;          // the new deployment's instances (TrafficSteps)
  bool new_fleet_ready = false;  // every variant of the pending deployment has its desired healthy instances
  // Rolling only: the variant's instances before (old_count) and after (capacity) the update, and
  // the new ones healthy now.
  int64_t old_count = 0;
  int64_t new_healthy = 0;
  std::string alarm{};              // a watched alarm now in ALARM; "" when none
  int64_t now = 0;                  // wall-clock milliseconds
  int64_t alarm_poll_millis = 500;  // how often a bake re-reads the alarms
};

struct RolloutDecision {
  enum class Kind {
    kProvision,  // the new fleet is not ready: keep bringing it up (retry_at: the timeout, or 0)
    kShift,      // record `state` and route by it (a new step, or the termination wait)
    kHold,       // keep `state`; look again at retry_at (the bake's end, or the alarm poll)
    kComplete,   // done: promote the pending deployment, drain the old fleet
    kRollBack,   // `reason`: traffic back to the old fleet, the new one goes
  };
  Kind kind = Kind::kProvision;
  store::RolloutState state;
  int64_t retry_at = 0;
  std::string reason;
  bool operator==(const RolloutDecision&) const = default;
};

std::string_view ToString(RolloutDecision::Kind kind);

// The next move. Precondition: input.policy is set.
//   - past MaximumExecutionTimeoutInSeconds (from `generation`): kRollBack;
//   - blue/green: kProvision until new_fleet_ready; then kShift to step 1 (Baking until now +
//     wait); a watched alarm in ALARM while Baking or in TerminationWait: kRollBack; a bake not
//     over: kHold (retry at its end, or at the next alarm poll when alarms are watched); a bake
//     over: kShift to the next step, or to TerminationWait (when its wait is not 0), or kComplete;
//     TerminationWait over: kComplete. A policy not `given`: kComplete once the fleet is ready.
//   - rolling: batch k Provisioning until new_healthy reaches RollingTargetsAt(k).new_instances,
//     then kShift to Baking k (the old fleet shrinks to RollingTargetsAt(k).old_instances); a bake
//     over: Provisioning k + 1, or kComplete after the last batch. Alarms are watched from the
//     first batch's bake on (also while a later batch comes up).
RolloutDecision DecideRollout(const RolloutInput& input);

// Rolling: the new instances to have and the old ones to keep at the recorded progress (`state`,
// when of `generation`; none: batch 1 coming up).
RollingTargets RollingCounts(const DeploymentPolicy& policy, const std::optional<store::RolloutState>& state,
                             int64_t generation, int64_t new_count, int64_t old_count);

// The FailureReason texts of a rollback (after "UpdateEndpoint rolled back to <config>: ").
std::string AlarmRollbackReason(const std::string& alarm);
std::string TimeoutRollbackReason(int64_t max_execution_seconds);

}  // namespace kiln::control
