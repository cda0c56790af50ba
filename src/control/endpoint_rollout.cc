#include "control/endpoint_rollout.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace kiln::control {

namespace {

using json = nlohmann::json;
using store::RolloutState;
using Phase = RolloutState::Phase;
using Kind = RolloutDecision::Kind;

bool Has(const json& obj, const char* key) { return obj.is_object() && obj.contains(key) && !obj[key].is_null(); }

int64_t IntOf(const json& obj, const char* key, int64_t fallback) {
  return Has(obj, key) && obj[key].is_number_integer() ? obj[key].get<int64_t>() : fallback;
}

Result<CapacitySize> ParseCapacity(const json& j, const std::string& where) {
  CapacitySize size;
  const std::string type = j.is_object() ? j.value("Type", "") : "";
  if (type == "INSTANCE_COUNT") {
    size.type = CapacitySize::Type::kInstanceCount;
  } else if (type == "CAPACITY_PERCENT") {
    size.type = CapacitySize::Type::kCapacityPercent;
  } else {
    return Status::InvalidArgument(where + ".Type must be INSTANCE_COUNT or CAPACITY_PERCENT.");
  }
  size.value = IntOf(j, "Value", 0);
  if (size.value < 1) return Status::InvalidArgument(where + ".Value must be at least 1.");
  if (size.type == CapacitySize::Type::kCapacityPercent && size.value > 100) {
    return Status::InvalidArgument(where + ".Value " + std::to_string(size.value) +
                                   " is above 100 for CAPACITY_PERCENT; give a percentage from 1 to 100.");
  }
  return size;
}

std::string Name(const char* policy, const char* member) { return std::string(policy) + "." + member; }

// "1 instance (50% of 2)" / "25%": how a size reads in a message.
std::string Describe(const CapacitySize& size, int64_t capacity) {
  char percent[32];
  std::snprintf(percent, sizeof percent, "%.4g%%", size.Percent(capacity));
  if (size.type == CapacitySize::Type::kCapacityPercent) return percent;
  return std::to_string(size.value) + (size.value == 1 ? " instance (" : " instances (") + percent + " of " +
         std::to_string(capacity) + ")";
}

RolloutDecision Decision(Kind kind) {
  RolloutDecision d;
  d.kind = kind;
  return d;
}

RolloutDecision RollBack(std::string reason) {
  RolloutDecision d = Decision(Kind::kRollBack);
  d.reason = std::move(reason);
  return d;
}

// When a bake or wait ending at `until` is looked at again: its end, or sooner to poll the alarms.
int64_t NextLook(const RolloutInput& in, int64_t until) {
  int64_t at = until;
  if (!in.policy->alarms.empty()) at = std::min(at, in.now + in.alarm_poll_millis);
  return at;
}

RolloutDecision Hold(const RolloutInput& in, const RolloutState& state) {
  RolloutDecision d = Decision(Kind::kHold);
  d.state = state;
  d.retry_at = NextLook(in, state.until_millis);
  return d;
}

RolloutDecision Shift(const RolloutInput& in, RolloutState state) {
  RolloutDecision d = Decision(Kind::kShift);
  if (state.started_millis == 0) state.started_millis = in.now;
  d.state = state;
  d.retry_at = NextLook(in, state.until_millis);
  return d;
}

RolloutDecision DecideRolling(const RolloutInput& in, std::optional<RolloutState> state) {
  const DeploymentPolicy& policy = *in.policy;
  const int64_t steps = StepsOfRolling(policy, in.capacity, in.old_count);
  RolloutState cur =
      state.value_or(RolloutState{.generation = in.generation, .phase = Phase::kProvisioning, .step = 1});
  const bool shifted = state.has_value() && (cur.phase != Phase::kProvisioning || cur.step > 1);
  if (shifted && !in.alarm.empty()) return RollBack(AlarmRollbackReason(in.alarm));
  if (cur.phase == Phase::kProvisioning) {
    const RollingTargets at = RollingTargetsAt(policy, cur.step, in.capacity, in.old_count);
    if (in.new_healthy < at.new_instances) {
      RolloutDecision d = Decision(Kind::kProvision);
      d.state = cur;
      if (shifted && !policy.alarms.empty()) d.retry_at = in.now + in.alarm_poll_millis;
      return d;
    }
    const int64_t total = at.new_instances + at.old_instances;
    return Shift(in, RolloutState{.generation = in.generation,
                                  .phase = Phase::kBaking,
                                  .step = cur.step,
                                  .fraction = total > 0 ? static_cast<double>(at.new_instances) / total : 1.0,
                                  .until_millis = in.now + policy.wait_seconds * 1000,
                                  .started_millis = cur.started_millis});
  }
  if (in.now < cur.until_millis) return Hold(in, cur);
  if (cur.step >= steps) return Decision(Kind::kComplete);
  RolloutState next = cur;
  next.phase = Phase::kProvisioning;
  next.step = cur.step + 1;
  next.until_millis = 0;
  RolloutDecision d = Decision(Kind::kShift);
  d.state = next;
  return d;
}

}  // namespace

int64_t CapacitySize::Instances(int64_t capacity) const {
  int64_t n = type == Type::kInstanceCount ? value : (value * capacity + 99) / 100;
  if (capacity >= 1) n = std::min(n, capacity);
  return std::max<int64_t>(1, n);
}

double CapacitySize::Fraction(int64_t capacity) const {
  double f = type == Type::kInstanceCount ? (capacity > 0 ? static_cast<double>(value) / capacity : 1.0)
                                          : static_cast<double>(value) / 100.0;
  return std::clamp(f, 0.0, 1.0);
}

double CapacitySize::Percent(int64_t capacity) const {
  if (type == Type::kCapacityPercent) return static_cast<double>(value);
  return capacity > 0 ? 100.0 * static_cast<double>(value) / static_cast<double>(capacity) : 100.0;
}

std::string_view ToString(RolloutDecision::Kind kind) {
  switch (kind) {
    case Kind::kProvision: return "Provision";
    case Kind::kShift: return "Shift";
    case Kind::kHold: return "Hold";
    case Kind::kComplete: return "Complete";
    case Kind::kRollBack: return "RollBack";
  }
  return "Unknown";
}

std::string AlarmRollbackReason(const std::string& alarm) {
  return "CloudWatch alarm " + alarm +
         " went into ALARM while traffic was shifting to the new fleet (AutoRollbackConfiguration); all traffic "
         "is back on the previous fleet.";
}

std::string TimeoutRollbackReason(int64_t max_execution_seconds) {
  return "The deployment did not complete within MaximumExecutionTimeoutInSeconds (" +
         std::to_string(max_execution_seconds) + " s).";
}

Result<DeploymentPolicy> ParseDeploymentConfig(const json& config) {
  DeploymentPolicy policy;
  if (!config.is_object()) return policy;
  if (Has(config, "AutoRollbackConfiguration") && Has(config["AutoRollbackConfiguration"], "Alarms")) {
    std::set<std::string> seen;
    for (const json& alarm : config["AutoRollbackConfiguration"]["Alarms"]) {
      const std::string name = alarm.is_object() ? alarm.value("AlarmName", "") : "";
      if (!seen.insert(name).second) {
        return Status::InvalidArgument("Alarm " + name +
                                       " is named more than once in AutoRollbackConfiguration.Alarms; name each "
                                       "alarm once.");
      }
      policy.alarms.push_back(name);
    }
  }
  const bool blue_green = Has(config, "BlueGreenUpdatePolicy");
  const bool rolling = Has(config, "RollingUpdatePolicy");
  if (blue_green && rolling) {
    return Status::InvalidArgument(
        "DeploymentConfig may have a BlueGreenUpdatePolicy or a RollingUpdatePolicy, not both; remove one.");
  }
  if (blue_green) {
    constexpr const char* kTraffic = "BlueGreenUpdatePolicy.TrafficRoutingConfiguration";
    const json& bg = config["BlueGreenUpdatePolicy"];
    const json routing = Has(bg, "TrafficRoutingConfiguration") ? bg["TrafficRoutingConfiguration"] : json::object();
    policy.given = true;
    policy.kind = DeploymentPolicy::Kind::kBlueGreen;
    policy.wait_seconds = IntOf(routing, "WaitIntervalInSeconds", 0);
    policy.termination_wait_seconds = IntOf(bg, "TerminationWaitInSeconds", 0);
    policy.max_execution_seconds = IntOf(bg, "MaximumExecutionTimeoutInSeconds", 0);
    const std::string type = routing.value("Type", "");
    const bool canary_size = Has(routing, "CanarySize");
    const bool linear_size = Has(routing, "LinearStepSize");
    if (type == "ALL_AT_ONCE") {
      policy.traffic = DeploymentPolicy::Traffic::kAllAtOnce;
      if (canary_size || linear_size) {
        return Status::InvalidArgument(std::string(canary_size ? "CanarySize" : "LinearStepSize") +
                                       " cannot be given with traffic routing type ALL_AT_ONCE; remove it or use " +
                                       (canary_size ? "CANARY." : "LINEAR."));
      }
    } else if (type == "CANARY") {
      policy.traffic = DeploymentPolicy::Traffic::kCanary;
      if (!canary_size) {
        return Status::InvalidArgument("Traffic routing type CANARY needs " + Name(kTraffic, "CanarySize") + ".");
      }
      if (linear_size) {
        return Status::InvalidArgument("LinearStepSize cannot be given with traffic routing type CANARY.");
      }
      ASSIGN_OR_RETURN(policy.step, ParseCapacity(routing["CanarySize"], Name(kTraffic, "CanarySize")));
    } else if (type == "LINEAR") {
      policy.traffic = DeploymentPolicy::Traffic::kLinear;
      if (!linear_size) {
        return Status::InvalidArgument("Traffic routing type LINEAR needs " + Name(kTraffic, "LinearStepSize") + ".");
      }
      if (canary_size) return Status::InvalidArgument("CanarySize cannot be given with traffic routing type LINEAR.");
      ASSIGN_OR_RETURN(policy.step, ParseCapacity(routing["LinearStepSize"], Name(kTraffic, "LinearStepSize")));
    } else {
      return Status::InvalidArgument(Name(kTraffic, "Type") + " must be ALL_AT_ONCE, CANARY or LINEAR.");
    }
  } else if (rolling) {
    constexpr const char* kRolling = "RollingUpdatePolicy";
    const json& r = config["RollingUpdatePolicy"];
    policy.given = true;
    policy.kind = DeploymentPolicy::Kind::kRolling;
    policy.wait_seconds = IntOf(r, "WaitIntervalInSeconds", 0);
    policy.max_execution_seconds = IntOf(r, "MaximumExecutionTimeoutInSeconds", 0);
    if (!Has(r, "MaximumBatchSize")) {
      return Status::InvalidArgument(Name(kRolling, "MaximumBatchSize") + " is required.");
    }
    ASSIGN_OR_RETURN(policy.step, ParseCapacity(r["MaximumBatchSize"], Name(kRolling, "MaximumBatchSize")));
    if (Has(r, "RollbackMaximumBatchSize")) {
      ASSIGN_OR_RETURN(policy.rollback_batch,
                       ParseCapacity(r["RollbackMaximumBatchSize"], Name(kRolling, "RollbackMaximumBatchSize")));
    }
  }
  if (policy.given && policy.max_execution_seconds > 0) {
    // AWS: the timeout should be larger than the waits it has to hold (at least one bake and the
    // termination wait; the step count depends on the capacity, checked by CheckPolicyFits).
    const int64_t waits = policy.wait_seconds + policy.termination_wait_seconds;
    if (policy.max_execution_seconds <= waits) {
      return Status::InvalidArgument("MaximumExecutionTimeoutInSeconds " +
                                     std::to_string(policy.max_execution_seconds) +
                                     " must be larger than the waiting time it has to hold (WaitIntervalInSeconds + "
                                     "TerminationWaitInSeconds = " +
                                     std::to_string(waits) + ").");
    }
  }
  return policy;
}

std::string CheckPolicyFits(const DeploymentPolicy& policy, int64_t capacity,
                            const std::vector<std::string>& old_variants, const std::vector<std::string>& new_variants,
                            bool serverless) {
  if (!policy.given) return "";
  if (policy.kind == DeploymentPolicy::Kind::kRolling) {
    if (old_variants.size() != 1 || new_variants.size() != 1) {
      return "RollingUpdatePolicy needs an endpoint with a single production variant, before and after the update; "
             "use a BlueGreenUpdatePolicy for endpoints with several variants.";
    }
    if (old_variants != new_variants) {
      return "RollingUpdatePolicy needs the new endpoint configuration to keep the variant name " + old_variants[0] +
             " (it has " + new_variants[0] + ").";
    }
    if (serverless) return "RollingUpdatePolicy is not supported for serverless variants.";
    const double percent = policy.step.Percent(capacity);
    if (percent < 5 || percent > 50) {
      return "RollingUpdatePolicy.MaximumBatchSize " + Describe(policy.step, capacity) +
             " must be between 5% and 50% of the variant's instance count (" + std::to_string(capacity) + ").";
    }
    return "";
  }
  if (policy.traffic == DeploymentPolicy::Traffic::kCanary && policy.step.Percent(capacity) > 50) {
    return "CanarySize " + Describe(policy.step, capacity) +
           " must be at most 50% of the new fleet's instance count (" + std::to_string(capacity) + ").";
  }
  if (policy.traffic == DeploymentPolicy::Traffic::kLinear) {
    const double percent = policy.step.Percent(capacity);
    if (percent < 10 || percent > 50) {
      return "LinearStepSize " + Describe(policy.step, capacity) +
             " must be between 10% and 50% of the new fleet's instance count (" + std::to_string(capacity) + ").";
    }
  }
  if (policy.max_execution_seconds > 0) {
    const int64_t steps = static_cast<int64_t>(TrafficSteps(policy, capacity).size());
    const int64_t waits = steps * policy.wait_seconds + policy.termination_wait_seconds;
    if (policy.max_execution_seconds <= waits) {
      return "MaximumExecutionTimeoutInSeconds " + std::to_string(policy.max_execution_seconds) +
             " must be larger than the waiting time of the deployment (" + std::to_string(steps) +
             " steps of WaitIntervalInSeconds plus TerminationWaitInSeconds = " + std::to_string(waits) + " s).";
    }
  }
  return "";
}

std::vector<double> TrafficSteps(const DeploymentPolicy& policy, int64_t capacity) {
  if (!policy.given || policy.traffic == DeploymentPolicy::Traffic::kAllAtOnce) return {1.0};
  const double size = policy.step.Fraction(capacity);
  if (size <= 0 || size >= 1) return {1.0};
  if (policy.traffic == DeploymentPolicy::Traffic::kCanary) return {size, 1.0};
  std::vector<double> steps;
  for (int64_t k = 1;; ++k) {
    const double f = static_cast<double>(k) * size;
    if (f >= 1.0 - 1e-9) break;
    steps.push_back(f);
  }
  steps.push_back(1.0);
  return steps;
}

RollingTargets RollingTargetsAt(const DeploymentPolicy& policy, int64_t step, int64_t new_count, int64_t old_count) {
  const int64_t batch = policy.step.Instances(new_count);
  const int64_t moved = std::max<int64_t>(0, step) * batch;
  return {.new_instances = std::min(new_count, moved), .old_instances = std::max<int64_t>(0, old_count - moved)};
}

int64_t StepsOfRolling(const DeploymentPolicy& policy, int64_t new_count, int64_t old_count) {
  const int64_t batch = policy.step.Instances(new_count);
  const int64_t most = std::max(new_count, old_count);
  return std::max<int64_t>(1, (most + batch - 1) / batch);
}

RollingTargets RollingCounts(const DeploymentPolicy& policy, const std::optional<RolloutState>& state,
                             int64_t generation, int64_t new_count, int64_t old_count) {
  if (!state || state->generation != generation) {
    return {.new_instances = RollingTargetsAt(policy, 1, new_count, old_count).new_instances,
            .old_instances = old_count};
  }
  const RollingTargets now = RollingTargetsAt(policy, state->step, new_count, old_count);
  if (state->phase == Phase::kProvisioning) {
    return {.new_instances = now.new_instances,
            .old_instances = RollingTargetsAt(policy, state->step - 1, new_count, old_count).old_instances};
  }
  return now;
}

RolloutDecision DecideRollout(const RolloutInput& in) {
  const DeploymentPolicy& policy = *in.policy;
  std::optional<RolloutState> state = in.state;
  if (state && state->generation != in.generation) state.reset();
  const int64_t deadline =
      policy.given && policy.max_execution_seconds > 0 ? in.generation + policy.max_execution_seconds * 1000 : 0;
  if (deadline > 0 && in.now >= deadline) return RollBack(TimeoutRollbackReason(policy.max_execution_seconds));
  RolloutDecision d = [&] {
    if (policy.given && policy.kind == DeploymentPolicy::Kind::kRolling) return DecideRolling(in, state);
    if (!state) {
      if (!in.new_fleet_ready) return Decision(Kind::kProvision);
      if (!policy.given) return Decision(Kind::kComplete);
      const std::vector<double> steps = TrafficSteps(policy, in.capacity);
      return Shift(in, RolloutState{.generation = in.generation,
                                    .phase = Phase::kBaking,
                                    .step = 1,
                                    .fraction = steps.front(),
                                    .until_millis = in.now + policy.wait_seconds * 1000});
    }
    if (!in.alarm.empty()) return RollBack(AlarmRollbackReason(in.alarm));
    if (in.now < state->until_millis) return Hold(in, *state);
    if (state->phase == Phase::kBaking) {
      const std::vector<double> steps = TrafficSteps(policy, in.capacity);
      if (state->step < static_cast<int64_t>(steps.size())) {
        RolloutState next = *state;
        next.fraction = steps[static_cast<size_t>(state->step)];
        next.step = state->step + 1;
        next.until_millis = in.now + policy.wait_seconds * 1000;
        return Shift(in, next);
      }
      if (policy.termination_wait_seconds > 0) {
        RolloutState next = *state;
        next.phase = Phase::kTerminationWait;
        next.fraction = 1.0;
        next.until_millis = in.now + policy.termination_wait_seconds * 1000;
        return Shift(in, next);
      }
    }
    return Decision(Kind::kComplete);
  }();
  // A wait never outlasts the deadline: look again then.
  if (deadline > 0 && (d.kind == Kind::kProvision || d.kind == Kind::kHold || d.kind == Kind::kShift)) {
    d.retry_at = d.retry_at == 0 ? deadline : std::min(d.retry_at, deadline);
  }
  return d;
}

}  // namespace kiln::control
