#include "control/endpoint_plan.h"

#include <gtest/gtest.h>

#include "control/endpoint_rollout.h"

namespace kiln::control {
namespace {

using nlohmann::json;
using store::EndpointStatus;
using Kind = EndpointAction::Kind;

constexpr int64_t kGen1 = 1000;  // the deployment
constexpr int64_t kGen2 = 2000;  // an update's pending deployment
constexpr int64_t kNow = 50000;

store::Deployment Deployment(int64_t generation, int count, const std::vector<std::string>& variants = {"main"}) {
  store::Deployment d;
  d.config_name = "cfg" + std::to_string(generation);
  json list = json::array();
  for (const auto& v : variants) list.push_back({{"VariantName", v}, {"InitialInstanceCount", count}});
  d.endpoint_config = {{"ProductionVariants", list}};
  d.deployed_millis = generation;
  return d;
}

store::EndpointRecord Record(EndpointStatus status, int desired, bool pending = false) {
  store::EndpointRecord r;
  r.name = "ep";
  r.status = status;
  r.deployment = Deployment(kGen1, desired);
  if (pending) r.pending = Deployment(kGen2, desired);
  r.desired["main"] = {.weight = 1.0, .instance_count = desired};
  return r;
}

ObservedInstance Healthy(const std::string& id, int64_t generation = kGen1, int64_t launched = 1) {
  ObservedInstance i;
  i.instance_id = id;
  i.variant = "main";
  i.generation = generation;
  i.healthy = true;
  i.launched_millis = launched;
  return i;
}
ObservedInstance Starting(const std::string& id, int64_t generation = kGen1) {
  ObservedInstance i = Healthy(id, generation);
  i.healthy = false;
  return i;
}
ObservedInstance Failed(const std::string& id, int64_t generation = kGen1, std::string reason = "exited") {
  ObservedInstance i = Starting(id, generation);
  i.failed = true;
  i.failure_reason = std::move(reason);
  return i;
}

// Compact text of a plan: "Kind(arg)" joined by spaces, for readable tables.
std::string Text(const std::vector<EndpointAction>& actions) {
  std::string out;
  for (const auto& a : actions) {
    if (!out.empty()) out += " ";
    out += std::string(ToString(a.kind));
    switch (a.kind) {
      case Kind::kHandleFailure:
      case Kind::kStopInstance: out += "(" + a.instance_id + ")"; break;
      case Kind::kSetBackoff:
        out += "(" + a.variant + "," + std::to_string(a.backoff.delay.count()) + "ms,@" +
               std::to_string(a.backoff.not_before) + ")";
        break;
      case Kind::kClearBackoff: out += "(" + a.variant + ")"; break;
      case Kind::kLaunch: out += "(" + a.variant + "x" + std::to_string(a.count) + ")"; break;
      case Kind::kRetryAt: out += "(@" + std::to_string(a.when) + ")"; break;
      case Kind::kFailEndpoint:
      case Kind::kRollBack: out += "(" + a.reason + ")"; break;
      case Kind::kComplete: out += a.promote_pending ? "(promote)" : "()"; break;
      case Kind::kPublish: break;
      case Kind::kShift:
        out += "(" + std::string(store::ToString(a.rollout.phase)) + "," + std::to_string(a.rollout.step) + "," +
               std::to_string(static_cast<int>(a.rollout.fraction * 100)) + "%,@" +
               std::to_string(a.rollout.until_millis) + ")";
        break;
      case Kind::kRollbackFailed: out += "(" + a.reason + ")"; break;
    }
  }
  return out;
}

struct Case {
  const char* name;
  store::EndpointRecord record;
  std::vector<ObservedInstance> instances;
  std::map<std::string, ReplacementBackoff> backoff;
  std::string plan;
};

TEST(EndpointPlanTest, Table) {
  const ReplacementBackoff waiting{std::chrono::milliseconds(1000), kNow + 500};
  const ReplacementBackoff over{std::chrono::milliseconds(1000), kNow - 1};
  const std::vector<Case> cases = {
      // Scale to zero (asynchronous endpoints, serving-contract.md §11.5): the instance goes, then
      // the endpoint is InService with none; requests wait in the async queue meanwhile.
      {"desired 0 stops the last instance",
       Record(EndpointStatus::kUpdating, 0),
       {Healthy("a")},
       {},
       "StopInstance(a) Publish"},
      {"desired 0 with no instance left completes", Record(EndpointStatus::kUpdating, 0), {}, {}, "Complete()"},
      {"InService at 0 stays as it is", Record(EndpointStatus::kInService, 0), {}, {}, "Publish"},
      {"from 0 back to 1 launches", Record(EndpointStatus::kUpdating, 1), {}, {}, "Launch(mainx1) Publish"},
      // Create.
      {"create launches the desired count", Record(EndpointStatus::kCreating, 2), {}, {}, "Launch(mainx2) Publish"},
      {"create waits for the ping gate",
       Record(EndpointStatus::kCreating, 2),
       {Healthy("a"), Starting("b")},
       {},
       "Publish"},
      {"create completes when all are healthy",
       Record(EndpointStatus::kCreating, 2),
       {Healthy("a"), Healthy("b")},
       {},
       "Complete()"},
      {"a failure while creating fails the endpoint",
       Record(EndpointStatus::kCreating, 2),
       {Healthy("a"), Failed("b", kGen1, "no ping")},
       {},
       "HandleFailure(b) SetBackoff(main,1000ms,@51000) StopInstance(b) FailEndpoint(no ping)"},
      // Health replacement with backoff (InService).
      {"an in-service failure is replaced after the backoff",
       Record(EndpointStatus::kInService, 2),
       {Healthy("a"), Failed("b")},
       {},
       "HandleFailure(b) SetBackoff(main,1000ms,@51000) StopInstance(b) RetryAt(@51000) Publish"},
      {"a second failure doubles the backoff",
       Record(EndpointStatus::kInService, 2),
       {Healthy("a"), Failed("c")},
       {{"main", over}},
       "HandleFailure(c) SetBackoff(main,2000ms,@52000) StopInstance(c) RetryAt(@52000) Publish"},
      {"the backoff is capped at 60 s",
       Record(EndpointStatus::kInService, 1),
       {Failed("c")},
       {{"main", {std::chrono::milliseconds(40000), kNow - 1}}},
       "HandleFailure(c) SetBackoff(main,60000ms,@110000) StopInstance(c) RetryAt(@110000) Publish"},
      {"while the backoff runs nothing launches",
       Record(EndpointStatus::kInService, 2),
       {Healthy("a")},
       {{"main", waiting}},
       "RetryAt(@50500) Publish"},
      {"after the backoff the replacement launches",
       Record(EndpointStatus::kInService, 2),
       {Healthy("a")},
       {{"main", over}},
       "Launch(mainx1) Publish"},
      {"a healthy variant clears its backoff",
       Record(EndpointStatus::kInService, 1),
       {Healthy("a")},
       {{"main", over}},
       "ClearBackoff(main) Publish"},
      {"a handled failure is not acted on again",
       Record(EndpointStatus::kInService, 1),
       {Healthy("a"),
        [] {
          auto f = Failed("b");
          f.failure_handled = true;
          f.stop_requested = true;
          return f;
        }()},
       {},
       "Publish"},
      // Weight and count changes (UpdateEndpointWeightsAndCapacities: Updating, no pending).
      {"scale out launches the difference",
       Record(EndpointStatus::kUpdating, 3),
       {Healthy("a")},
       {},
       "Launch(mainx2) Publish"},
      {"scale in stops the newest healthy one",
       Record(EndpointStatus::kUpdating, 1),
       {Healthy("old", kGen1, 10), Healthy("new", kGen1, 20)},
       {},
       "StopInstance(new) Publish"},
      {"scale in stops a starting one first, then the newest",
       Record(EndpointStatus::kUpdating, 1),
       {Healthy("old", kGen1, 10), Starting("s"), Healthy("new", kGen1, 20)},
       {},
       "StopInstance(s) StopInstance(new) Publish"},
      {"scale in completes once the surplus is stopping",
       Record(EndpointStatus::kUpdating, 1),
       {Healthy("old"),
        [] {
          auto s = Healthy("new");
          s.stop_requested = true;
          return s;
        }()},
       {},
       "Complete()"},
      {"a weight change alone completes", Record(EndpointStatus::kUpdating, 1), {Healthy("a")}, {}, "Complete()"},
      // Blue/green update and rollback (UpdateEndpoint: Updating with pending).
      {"an update launches the new fleet beside the old",
       Record(EndpointStatus::kUpdating, 1, true),
       {Healthy("old")},
       {},
       "Launch(mainx1) Publish"},
      {"the old fleet serves while the new one starts",
       Record(EndpointStatus::kUpdating, 1, true),
       {Healthy("old"), Starting("new", kGen2)},
       {},
       "Publish"},
      {"all new healthy: traffic switches",
       Record(EndpointStatus::kUpdating, 1, true),
       {Healthy("old"), Healthy("new", kGen2)},
       {},
       "Complete(promote)"},
      {"a new instance failing rolls back",
       Record(EndpointStatus::kUpdating, 1, true),
       {Healthy("old"), Failed("new", kGen2, "bad image")},
       {},
       "HandleFailure(new) SetBackoff(main,1000ms,@51000) StopInstance(new) RollBack(bad image)"},
      {"an old instance failing during an update does not roll back",
       Record(EndpointStatus::kUpdating, 1, true),
       {Failed("old"), Healthy("new", kGen2)},
       {},
       "HandleFailure(old) StopInstance(old) Complete(promote)"},
      // What no deployment wants goes.
      {"after a switch the old generation drains",
       Record(EndpointStatus::kInService, 1),
       {Healthy("old", 500), Healthy("new")},
       {},
       "StopInstance(old) Publish"},
      {"a variant the target dropped drains",
       Record(EndpointStatus::kInService, 1),
       {Healthy("a"),
        [] {
          auto x = Healthy("x");
          x.variant = "gone";
          return x;
        }()},
       {},
       "StopInstance(x) Publish"},
      {"SystemUpdating completes like an update",
       Record(EndpointStatus::kSystemUpdating, 1),
       {Healthy("a")},
       {},
       "Complete()"},
      {"InService with everything in place only publishes",
       Record(EndpointStatus::kInService, 1),
       {Healthy("a")},
       {},
       "Publish"},
  };
  for (const Case& c : cases) {
    PlanInput input;
    input.record = &c.record;
    input.instances = c.instances;
    input.backoff = c.backoff;
    input.now = kNow;
    input.replacement_backoff = std::chrono::milliseconds(1000);
    EXPECT_EQ(Text(PlanEndpoint(input)), c.plan) << c.name;
  }
}

// Guarded updates (DeploymentConfig): the plan asks DecideRollout once the new fleet is up, and
// acts on its move; rolling updates size the batches; RollingBack ends when the old fleet is back.
TEST(EndpointPlanTest, GuardedUpdates) {
  constexpr int64_t kWall = 5'000'000;  // wall clock (the pending generation kGen2 is its start)
  auto guarded = [](const char* config, int count = 1) {
    store::EndpointRecord r = Record(EndpointStatus::kUpdating, count, /*pending=*/true);
    r.request["DeploymentConfig"] = json::parse(config);
    return r;
  };
  const char* canary = R"({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "CANARY",
      "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 25}, "WaitIntervalInSeconds": 4}},
      "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "errors"}]}})";
  const char* rolling = R"({"RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1},
      "WaitIntervalInSeconds": 1}})";
  struct GuardedCase {
    const char* name;
    store::EndpointRecord record;
    std::vector<ObservedInstance> instances;
    std::string alarm;
    std::string plan;
  };
  store::EndpointRecord baking = guarded(canary);
  baking.state.rollout = store::RolloutState{.generation = kGen2,
                                             .phase = store::RolloutState::Phase::kBaking,
                                             .step = 1,
                                             .fraction = 0.25,
                                             .until_millis = kWall + 3000,
                                             .started_millis = kWall - 1000};
  store::EndpointRecord rolling_baking = guarded(rolling, 2);
  rolling_baking.state.rollout = store::RolloutState{.generation = kGen2,
                                                     .phase = store::RolloutState::Phase::kBaking,
                                                     .step = 1,
                                                     .fraction = 0.5,
                                                     .until_millis = kWall + 1000,
                                                     .started_millis = kWall};
  store::EndpointRecord rolled_back = Record(EndpointStatus::kRollingBack, 2);
  rolled_back.state.rollout = rolling_baking.state.rollout;
  store::EndpointRecord rolled_back_in_batches = rolled_back;
  rolled_back_in_batches.request["DeploymentConfig"] = json::parse(R"({"RollingUpdatePolicy": {"MaximumBatchSize":
      {"Type": "INSTANCE_COUNT", "Value": 1}, "WaitIntervalInSeconds": 1,
      "RollbackMaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1}}})");
  const std::vector<GuardedCase> cases = {
      {"canary: the new fleet comes up first",
       guarded(canary),
       {Healthy("old"), Starting("new", kGen2)},
       "",
       "Publish"},
      {"canary: ready, the canary's share, alarms polled",
       guarded(canary),
       {Healthy("old"), Healthy("new", kGen2)},
       "",
       "RetryAt(@50500) Shift(Baking,1,25%,@5004000)"},
      {"canary: baking holds and polls",
       baking,
       {Healthy("old"), Healthy("new", kGen2)},
       "",
       "RetryAt(@50500) Publish"},
      {"canary: an alarm rolls back",
       baking,
       {Healthy("old"), Healthy("new", kGen2)},
       "errors",
       "RollBack(" + AlarmRollbackReason("errors") + ")"},
      {"rolling: batch 1 beside both old instances",
       guarded(rolling, 2),
       {Healthy("o1"), Healthy("o2")},
       "",
       "Launch(mainx1) Publish"},
      {"rolling: batch 1 healthy: bake, one old goes",
       guarded(rolling, 2),
       {Healthy("o1", kGen1, 1), Healthy("o2", kGen1, 2), Healthy("n1", kGen2)},
       "",
       "RetryAt(@51000) Shift(Baking,1,50%,@5001000)"},
      {"rolling: batch 1 baking: one old goes (newest first)",
       rolling_baking,
       {Healthy("o1", kGen1, 1), Healthy("o2", kGen1, 2), Healthy("n1", kGen2)},
       "",
       "StopInstance(o2) RetryAt(@51000) Publish"},
      {"rolling: baking keeps one old",
       rolling_baking,
       {Healthy("o1"), Healthy("n1", kGen2)},
       "",
       "RetryAt(@51000) Publish"},
      {"RollingBack keeps the new fleet until the old is back",
       rolled_back,
       {Healthy("o1"), Healthy("n1", kGen2)},
       "",
       "Launch(mainx1) Publish"},
      {"RollingBack: the old fleet back RollbackMaximumBatchSize (1) at a time",
       rolled_back_in_batches,
       {Healthy("n1", kGen2), Healthy("n2", kGen2)},
       "",
       "Launch(mainx1) Publish"},
      {"RollingBack: the next batch once the last is healthy",
       rolled_back_in_batches,
       {Starting("o1"), Healthy("n1", kGen2), Healthy("n2", kGen2)},
       "",
       "Publish"},
      {"RollingBack: the old fleet back, the new goes",
       rolled_back,
       {Healthy("o1"), Healthy("o2"), Healthy("n1", kGen2)},
       "",
       "StopInstance(n1) Publish"},
      {"RollingBack: nothing else left: InService", rolled_back, {Healthy("o1"), Healthy("o2")}, "", "Complete()"},
      {"RollingBack: the old fleet fails",
       rolled_back,
       {Healthy("o1"), Failed("o2", kGen1, "no ping"), Healthy("n1", kGen2)},
       "",
       "HandleFailure(o2) SetBackoff(main,1000ms,@51000) StopInstance(o2) RollbackFailed(no ping)"},
  };
  for (const GuardedCase& c : cases) {
    PlanInput input;
    input.record = &c.record;
    input.instances = c.instances;
    input.now = kNow;
    input.wall_now = kWall;
    input.alarm = c.alarm;
    EXPECT_EQ(Text(PlanEndpoint(input)), c.plan) << c.name;
  }
}

TEST(EndpointPlanTest, WeightsAndCounts) {
  store::EndpointRecord r = Record(EndpointStatus::kInService, 2);
  r.deployment.endpoint_config["ProductionVariants"][0]["InitialVariantWeight"] = 0.3;
  EXPECT_EQ(DesiredCount(r, r.deployment, "main"), 2);
  EXPECT_EQ(DesiredCount(r, r.deployment, "other"), 0);
  EXPECT_EQ(DesiredWeight(r, r.deployment, "main"), 1.0);  // the desired entry wins
  r.desired.clear();
  EXPECT_EQ(DesiredCount(r, r.deployment, "main"), 2);     // InitialInstanceCount
  EXPECT_EQ(DesiredWeight(r, r.deployment, "main"), 0.3);  // InitialVariantWeight
  r.desired["main"] = {.weight = std::nullopt, .instance_count = std::nullopt};
  EXPECT_EQ(DesiredWeight(r, r.deployment, "main"), 1.0);  // an entry without weight: 1
  // During an update the serving deployment keeps the weight it had.
  r.pending = Deployment(kGen2, 1);
  r.desired["main"].weight = 0.9;
  r.state.production_variants.emplace_back();
  r.state.production_variants[0].variant_name = "main";
  r.state.production_variants[0].current_weight = 0.4;
  EXPECT_EQ(CurrentWeight(r, r.deployment, "main"), 0.4);
  r.pending.reset();
  EXPECT_EQ(CurrentWeight(r, r.deployment, "main"), 0.9);
}

}  // namespace
}  // namespace kiln::control
