#include "control/endpoint_plan.h"

#include <algorithm>
#include <set>

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

  // Instances of neither deployment, or of variants the target no longer has, go.
  for (const ObservedInstance& instance : input.instances) {
    bool keep = instance.generation == gen_target ? in_target(instance.variant)
                                                  : (instance.generation == gen_current && record.pending.has_value());
    if (!keep) stop(instance);
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
  for (const std::string& variant : target_variants) {
    const int desired = DesiredCount(record, target, variant);
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
        actions.push_back(std::move(launch));
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
    if (healthy < desired) all_ready = false;
    if (healthy >= desired && backoff.erase(variant) > 0) {
      EndpointAction clear = Action(Kind::kClearBackoff);
      clear.variant = variant;
      actions.push_back(std::move(clear));
    }
  }

  // Status transitions.
  if (all_ready && !extra) {
    const bool updating = record.status == EndpointStatus::kUpdating;
    if (record.status == EndpointStatus::kCreating || (updating && !record.pending) ||
        record.status == EndpointStatus::kSystemUpdating) {
      actions.push_back(Action(Kind::kComplete));
      return actions;
    }
    if (updating && record.pending) {
      // Every new instance is healthy: move all traffic in one snapshot, then drain the old.
      EndpointAction complete = Action(Kind::kComplete);
      complete.promote_pending = true;
      actions.push_back(std::move(complete));
      return actions;
    }
  }
  actions.push_back(Action(Kind::kPublish));
  return actions;
}

}  // namespace kiln::control
