#include "control/endpoint_plan.h"

#include <algorithm>
#include <set>

#include "control/endpoint_rollout.h"

namespace kiln::control {

namespace {

using store::EndpointStatus;
using Kind = EndpointAction::Kind;

constexpr std::chrono::milliseconds kMaxBackoff{60000};

double NumberOr(const nlohmann::json& obj, const char* key, double fallback) {
  if (!obj.is_object()) return fallback;
  auto it = obj.find(key);
  return it != obj.end() && it->is_number() ? it->get<double>() : fallback;
}

EndpointAction Action(Kind kind) {
  EndpointAction a;
  a.kind = kind;
  return a;
}

// A rolling update's old instance count of `variant`: what the endpoint ran before the update
// (its recorded summary), else the configuration's.
int64_t OldCount(const store::EndpointRecord& record, const std::string& variant) {
  for (const store::VariantSummary& v : record.state.production_variants) {
    if (v.variant_name == variant) return v.desired_instance_count;
  }
  const nlohmann::json* v = record.deployment.FindVariant(variant);
  return v ? v->value("InitialInstanceCount", int64_t{1}) : 0;
}

}  // namespace

std::string_view ToString(EndpointAction::Kind kind) {
  switch (kind) {
    case Kind::kHandleFailure: return "HandleFailure";
    case Kind::kSetBackoff: return "SetBackoff";
    case Kind::kClearBackoff: return "ClearBackoff";
    case Kind::kStopInstance: return "StopInstance";
    case Kind::kLaunch: return "Launch";
    case Kind::kRetryAt: return "RetryAt";
    case Kind::kFailEndpoint: return "FailEndpoint";
    case Kind::kRollBack: return "RollBack";
    case Kind::kComplete: return "Complete";
    case Kind::kPublish: return "Publish";
    case Kind::kShift: return "Shift";
    case Kind::kRollbackFailed: return "RollbackFailed";
  }
  return "Unknown";
}

int DesiredCount(const store::EndpointRecord& record, const store::Deployment& deployment, const std::string& variant) {
  if (auto it = record.desired.find(variant); it != record.desired.end() && it->second.instance_count) {
    return static_cast<int>(*it->second.instance_count);
  }
  const nlohmann::json* v = deployment.FindVariant(variant);
  return v ? v->value("InitialInstanceCount", 1) : 0;
}

double DesiredWeight(const store::EndpointRecord& record, const store::Deployment& deployment,
                     const std::string& variant) {
  if (auto it = record.desired.find(variant); it != record.desired.end()) return it->second.weight.value_or(1.0);
  const nlohmann::json* v = deployment.FindVariant(variant);
  return v ? NumberOr(*v, "InitialVariantWeight", 1.0) : 1.0;
}

double CurrentWeight(const store::EndpointRecord& record, const store::Deployment& routed, const std::string& variant) {
  if (!record.pending) return DesiredWeight(record, routed, variant);
  for (const store::VariantSummary& v : record.state.production_variants) {
    if (v.variant_name == variant) return v.current_weight;
  }
  const nlohmann::json* v = routed.FindVariant(variant);
  return v ? NumberOr(*v, "InitialVariantWeight", 1.0) : 1.0;
}

std::vector<EndpointAction> PlanEndpoint(const PlanInput& input) {
  const store::EndpointRecord& record = *input.record;
  std::vector<EndpointAction> actions;
  // What this pass has decided so far, as the executor will have made it when it gets there.
  std::set<std::string> stopping;
  std::set<std::string> handled;
  std::map<std::string, ReplacementBackoff> backoff = input.backoff;
  auto stop = [&](const ObservedInstance& instance) {
    if (instance.stop_requested || !stopping.insert(instance.instance_id).second) return;
    EndpointAction a = Action(Kind::kStopInstance);
    a.instance_id = instance.instance_id;
    actions.push_back(std::move(a));
  };

  const store::Deployment& deployment = record.deployment;
  const store::Deployment& target = record.pending ? *record.pending : record.deployment;
  const int64_t gen_current = deployment.deployed_millis;
  const int64_t gen_target = target.deployed_millis;
  // Shadow variants (§9) are launched, replaced and awaited like production ones; only the
  // routing differs (the controller publishes them apart).
  const std::vector<std::string> target_variants = target.AllVariantNames();
  auto in_target = [&](const std::string& v) {
    return std::find(target_variants.begin(), target_variants.end(), v) != target_variants.end();
  };

  // A guarded update (control/endpoint_rollout.h); the API validated the DeploymentConfig, so a
  // parse error means none.
  DeploymentPolicy policy;
  if ((record.pending || record.status == EndpointStatus::kRollingBack) && record.request.is_object() &&
      record.request.contains("DeploymentConfig")) {
    if (auto parsed = ParseDeploymentConfig(record.request["DeploymentConfig"]); parsed.ok()) policy = *parsed;
  }
  const bool rolling = record.pending && policy.given && policy.kind == DeploymentPolicy::Kind::kRolling;
  const std::string rolling_variant = rolling && !target.VariantNames().empty() ? target.VariantNames()[0] : "";
  RollingTargets rolling_counts;
  if (rolling) {
    rolling_counts = RollingCounts(policy, record.state.rollout, gen_target,
                                   DesiredCount(record, target, rolling_variant), OldCount(record, rolling_variant));
  }
  // RollingBack: the fleet rolled back from stays until the current one is ready (see below).
  const bool rolling_back = record.status == EndpointStatus::kRollingBack && !record.pending;
  const int64_t gen_rolled_back = rolling_back && record.state.rollout ? record.state.rollout->generation : -1;

  // Instances of neither deployment, or of variants the target no longer has, go.
  for (const ObservedInstance& instance : input.instances) {
    bool keep = instance.generation == gen_target ? in_target(instance.variant)
                                                  : (instance.generation == gen_current && record.pending.has_value());
    if (instance.generation == gen_rolled_back && instance.generation != gen_target) keep = true;
    if (!keep) stop(instance);
  }
  // Rolling: the old instances beyond what the current batch keeps go (not-yet-healthy, then the
  // newest first).
  if (rolling) {
    std::vector<const ObservedInstance*> old;
    for (const ObservedInstance& instance : input.instances) {
      if (instance.generation != gen_current || instance.generation == gen_target) continue;
      if (instance.stop_requested || stopping.count(instance.instance_id) || instance.failed) continue;
      old.push_back(&instance);
    }
    std::stable_sort(old.begin(), old.end(), [](const ObservedInstance* a, const ObservedInstance* b) {
      if (a->healthy != b->healthy) return !a->healthy;
      return a->launched_millis > b->launched_millis;
    });
    for (int64_t i = 0; i < static_cast<int64_t>(old.size()) - rolling_counts.old_instances; ++i) {
      stop(*old[static_cast<size_t>(i)]);
    }
  }

  // Failures. The backoff is set before the stop, so whoever sees the instance stopped sees it too.
  std::string failure;
  for (const ObservedInstance& instance : input.instances) {
    if (!instance.failed || instance.failure_handled) continue;
    EndpointAction handle = Action(Kind::kHandleFailure);
    handle.instance_id = instance.instance_id;
    actions.push_back(std::move(handle));
    handled.insert(instance.instance_id);
    if (instance.generation == gen_target) {
      if (failure.empty()) failure = instance.failure_reason;
      ReplacementBackoff& b = backoff[instance.variant];
      b.delay = b.delay.count() == 0 ? input.replacement_backoff : std::min(b.delay * 2, kMaxBackoff);
      b.not_before = input.now + b.delay.count();
      EndpointAction set = Action(Kind::kSetBackoff);
      set.variant = instance.variant;
      set.backoff = b;
      actions.push_back(std::move(set));
    }
    stop(instance);
  }
  if (!failure.empty()) {
    if (rolling_back) {
      EndpointAction end = Action(Kind::kRollbackFailed);
      end.reason = failure;
      actions.push_back(std::move(end));
      return actions;
    }
    if (record.status == EndpointStatus::kCreating || record.pending) {
      EndpointAction end = Action(record.status == EndpointStatus::kCreating ? Kind::kFailEndpoint : Kind::kRollBack);
      end.reason = failure;
      actions.push_back(std::move(end));
      return actions;
    }
  }

  // Counts.
  bool all_ready = true;
  bool extra = false;
  const std::vector<std::string> production = target.VariantNames();
  int64_t capacity = 0;     // the target's production instances (a rollout's traffic steps)
  int64_t new_healthy = 0;  // of them healthy now
  for (const std::string& variant : target_variants) {
    const int desired = variant == rolling_variant ? static_cast<int>(rolling_counts.new_instances)
                                                   : DesiredCount(record, target, variant);
    std::vector<const ObservedInstance*> live;
    int healthy = 0;
    for (const ObservedInstance& instance : input.instances) {
      if (instance.generation != gen_target || instance.variant != variant) continue;
      if (instance.stop_requested || stopping.count(instance.instance_id) || instance.failed) continue;
      live.push_back(&instance);
      if (instance.healthy) ++healthy;
    }
    const int count = static_cast<int>(live.size());
    if (count < desired) {
      auto b = backoff.find(variant);
      if (b == backoff.end() || input.now >= b->second.not_before) {
        EndpointAction launch = Action(Kind::kLaunch);
        launch.variant = variant;
        launch.count = desired - count;
        // A rolling update's rollback brings the old fleet back RollbackMaximumBatchSize at a time
        // (AWS: all of it at once when not given).
        if (rolling_back && policy.kind == DeploymentPolicy::Kind::kRolling && policy.rollback_batch) {
          launch.count = std::min<int>(
              launch.count, static_cast<int>(policy.rollback_batch->Instances(DesiredCount(record, target, variant))) -
                                (count - healthy));
        }
        if (launch.count > 0) actions.push_back(std::move(launch));
      } else {
        EndpointAction retry = Action(Kind::kRetryAt);
        retry.when = b->second.not_before;
        actions.push_back(std::move(retry));
      }
    } else if (count > desired) {
      // Scale in: not-yet-healthy ones first, then the newest.
      std::stable_sort(live.begin(), live.end(), [](const ObservedInstance* a, const ObservedInstance* b) {
        if (a->healthy != b->healthy) return !a->healthy;
        return a->launched_millis > b->launched_millis;
      });
      for (int i = 0; i < count - desired; ++i) stop(*live[static_cast<size_t>(i)]);
      extra = true;
    }
    if (std::find(production.begin(), production.end(), variant) != production.end()) {
      capacity += DesiredCount(record, target, variant);
      new_healthy += healthy;
    }
    if (healthy < desired) all_ready = false;
    if (healthy >= desired && backoff.erase(variant) > 0) {
      EndpointAction clear = Action(Kind::kClearBackoff);
      clear.variant = variant;
      actions.push_back(std::move(clear));
    }
  }

  // RollingBack: once the current deployment is ready the rolled-back fleet goes; InService when
  // nothing else is left.
  if (rolling_back) {
    bool others_left = false;
    for (const ObservedInstance& instance : input.instances) {
      if (instance.generation == gen_target) continue;
      others_left = true;
      if (all_ready && !extra) stop(instance);
    }
    if (all_ready && !extra && !others_left) {
      actions.push_back(Action(Kind::kComplete));
      return actions;
    }
    actions.push_back(Action(Kind::kPublish));
    return actions;
  }

  // Status transitions.
  const bool updating = record.status == EndpointStatus::kUpdating;
  if (updating && record.pending) {
    // The new fleet's traffic: one swap once every new instance is healthy (no DeploymentConfig
    // policy), or the rollout's next move.
    RolloutInput rollout{.policy = &policy,
                         .state = record.state.rollout,
                         .generation = gen_target,
                         .capacity = std::max<int64_t>(1, capacity),
                         .new_fleet_ready = all_ready && !extra,
                         .old_count = rolling ? OldCount(record, rolling_variant) : 0,
                         .new_healthy = new_healthy,
                         .alarm = input.alarm,
                         .now = input.wall_now,
                         .alarm_poll_millis = input.alarm_poll_millis};
    const RolloutDecision decision = DecideRollout(rollout);
    // Wall-clock waits as the run's deadline clock sees them.
    auto retry_at = [&](int64_t wall) {
      EndpointAction retry = Action(Kind::kRetryAt);
      retry.when = input.now + std::max<int64_t>(0, wall - input.wall_now);
      actions.push_back(std::move(retry));
    };
    switch (decision.kind) {
      case RolloutDecision::Kind::kProvision:
      case RolloutDecision::Kind::kHold:
        if (decision.retry_at > 0) retry_at(decision.retry_at);
        break;
      case RolloutDecision::Kind::kShift: {
        if (decision.retry_at > 0) retry_at(decision.retry_at);
        EndpointAction shift = Action(Kind::kShift);
        shift.rollout = decision.state;
        actions.push_back(std::move(shift));
        return actions;
      }
      case RolloutDecision::Kind::kComplete: {
        // Move what traffic is left in one snapshot, then drain the old fleet.
        EndpointAction complete = Action(Kind::kComplete);
        complete.promote_pending = true;
        actions.push_back(std::move(complete));
        return actions;
      }
      case RolloutDecision::Kind::kRollBack: {
        EndpointAction end = Action(Kind::kRollBack);
        end.reason = decision.reason;
        actions.push_back(std::move(end));
        return actions;
      }
    }
  } else if (all_ready && !extra) {
    if (record.status == EndpointStatus::kCreating || updating || record.status == EndpointStatus::kSystemUpdating) {
      actions.push_back(Action(Kind::kComplete));
      return actions;
    }
  }
  actions.push_back(Action(Kind::kPublish));
  return actions;
}

}  // namespace kiln::control
