#include "control/endpoint_rollout.h"

#include <gtest/gtest.h>

namespace kiln::control {
namespace {

using json = nlohmann::json;
using store::RolloutState;
using Phase = RolloutState::Phase;
using Kind = RolloutDecision::Kind;

DeploymentPolicy Parsed(const char* text) {
  auto policy = ParseDeploymentConfig(json::parse(text));
  EXPECT_TRUE(policy.ok()) << text << ": " << policy.status().ToString();
  return policy.ok() ? *policy : DeploymentPolicy{};
}

TEST(DeploymentConfigTest, ParsesEachPolicy) {
  DeploymentPolicy none = Parsed("{}");
  EXPECT_FALSE(none.given);
  EXPECT_TRUE(ParseDeploymentConfig(nullptr).ok());

  DeploymentPolicy canary = Parsed(R"({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "CANARY",
      "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 25}, "WaitIntervalInSeconds": 30},
      "TerminationWaitInSeconds": 10, "MaximumExecutionTimeoutInSeconds": 900},
      "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "a"}, {"AlarmName": "b"}]}})");
  EXPECT_TRUE(canary.given);
  EXPECT_EQ(canary.kind, DeploymentPolicy::Kind::kBlueGreen);
  EXPECT_EQ(canary.traffic, DeploymentPolicy::Traffic::kCanary);
  EXPECT_EQ(canary.step, (CapacitySize{CapacitySize::Type::kCapacityPercent, 25}));
  EXPECT_EQ(canary.wait_seconds, 30);
  EXPECT_EQ(canary.termination_wait_seconds, 10);
  EXPECT_EQ(canary.max_execution_seconds, 900);
  EXPECT_EQ(canary.alarms, (std::vector<std::string>{"a", "b"}));

  DeploymentPolicy rolling = Parsed(R"({"RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT",
      "Value": 1}, "WaitIntervalInSeconds": 2, "RollbackMaximumBatchSize": {"Type": "CAPACITY_PERCENT", "Value": 100}}})");
  EXPECT_EQ(rolling.kind, DeploymentPolicy::Kind::kRolling);
  EXPECT_EQ(rolling.step, (CapacitySize{CapacitySize::Type::kInstanceCount, 1}));
  ASSERT_TRUE(rolling.rollback_batch.has_value());
  EXPECT_EQ(rolling.rollback_batch->value, 100);
}

TEST(DeploymentConfigTest, RefusesWhatAwsRefusesBeyondTheShape) {
  struct Case {
    const char* config;
    const char* message;
  };
  const Case cases[] = {
      {R"({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 0}},
          "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1}, "WaitIntervalInSeconds": 0}})",
       "DeploymentConfig may have a BlueGreenUpdatePolicy or a RollingUpdatePolicy, not both; remove one."},
      {R"({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "CANARY", "WaitIntervalInSeconds": 0}}})",
       "Traffic routing type CANARY needs BlueGreenUpdatePolicy.TrafficRoutingConfiguration.CanarySize."},
      {R"({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "LINEAR", "WaitIntervalInSeconds": 0}}})",
       "Traffic routing type LINEAR needs BlueGreenUpdatePolicy.TrafficRoutingConfiguration.LinearStepSize."},
      {R"({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 0,
          "CanarySize": {"Type": "INSTANCE_COUNT", "Value": 1}}}})",
       "CanarySize cannot be given with traffic routing type ALL_AT_ONCE; remove it or use CANARY."},
      {R"({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "CANARY", "WaitIntervalInSeconds": 0,
          "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 150}}}})",
       "BlueGreenUpdatePolicy.TrafficRoutingConfiguration.CanarySize.Value 150 is above 100 for CAPACITY_PERCENT; give "
       "a percentage from 1 to 100."},
      {R"({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 600},
          "TerminationWaitInSeconds": 60, "MaximumExecutionTimeoutInSeconds": 600}})",
       "MaximumExecutionTimeoutInSeconds 600 must be larger than the waiting time it has to hold "
       "(WaitIntervalInSeconds "
       "+ TerminationWaitInSeconds = 660)."},
      {R"({"AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "a"}, {"AlarmName": "a"}]}})",
       "Alarm a is named more than once in AutoRollbackConfiguration.Alarms; name each alarm once."},
  };
  for (const Case& c : cases) {
    auto policy = ParseDeploymentConfig(json::parse(c.config));
    ASSERT_FALSE(policy.ok()) << c.config;
    EXPECT_EQ(policy.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(policy.status().message(), c.message);
  }
}

TEST(DeploymentConfigTest, SizesAreCheckedAgainstTheNewFleet) {
  const std::vector<std::string> one = {"AllTraffic"};
  DeploymentPolicy canary = Parsed(R"({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "CANARY",
      "CanarySize": {"Type": "INSTANCE_COUNT", "Value": 2}, "WaitIntervalInSeconds": 0}}})");
  EXPECT_EQ(CheckPolicyFits(canary, 4, one, one, false), "");
  EXPECT_EQ(CheckPolicyFits(canary, 3, one, one, false),
            "CanarySize 2 instances (66.67% of 3) must be at most 50% of the new fleet's instance count (3).");
  DeploymentPolicy linear = Parsed(R"({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "LINEAR",
      "LinearStepSize": {"Type": "CAPACITY_PERCENT", "Value": 5}, "WaitIntervalInSeconds": 0}}})");
  EXPECT_EQ(CheckPolicyFits(linear, 1, one, one, false),
            "LinearStepSize 5% must be between 10% and 50% of the new fleet's instance count (1).");
  DeploymentPolicy rolling = Parsed(R"({"RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT",
      "Value": 1}, "WaitIntervalInSeconds": 0}})");
  EXPECT_EQ(CheckPolicyFits(rolling, 2, one, one, false), "");
  EXPECT_EQ(CheckPolicyFits(rolling, 1, one, one, false),
            "RollingUpdatePolicy.MaximumBatchSize 1 instance (100% of 1) must be between 5% and 50% of the variant's "
            "instance count (1).");
  EXPECT_EQ(CheckPolicyFits(rolling, 2, {"A", "B"}, {"A", "B"}, false),
            "RollingUpdatePolicy needs an endpoint with a single production variant, before and after the update; use "
            "a BlueGreenUpdatePolicy for endpoints with several variants.");
  EXPECT_EQ(CheckPolicyFits(rolling, 2, {"A"}, {"B"}, false),
            "RollingUpdatePolicy needs the new endpoint configuration to keep the variant name A (it has B).");
  EXPECT_EQ(CheckPolicyFits(rolling, 2, one, one, true),
            "RollingUpdatePolicy is not supported for serverless variants.");
  DeploymentPolicy slow = Parsed(R"({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "LINEAR",
      "LinearStepSize": {"Type": "CAPACITY_PERCENT", "Value": 25}, "WaitIntervalInSeconds": 200},
      "MaximumExecutionTimeoutInSeconds": 700}})");
  EXPECT_EQ(CheckPolicyFits(slow, 4, one, one, false),
            "MaximumExecutionTimeoutInSeconds 700 must be larger than the waiting time of the deployment (4 steps of "
            "WaitIntervalInSeconds plus TerminationWaitInSeconds = 800 s).");
}

TEST(DeploymentConfigTest, TrafficSteps) {
  struct Case {
    const char* routing;
    int64_t capacity;
    std::vector<double> steps;
  };
  const Case cases[] = {
      {R"({"Type": "ALL_AT_ONCE"})", 4, {1.0}},
      {R"({"Type": "CANARY", "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 25}})", 1, {0.25, 1.0}},
      {R"({"Type": "CANARY", "CanarySize": {"Type": "INSTANCE_COUNT", "Value": 1}})", 4, {0.25, 1.0}},
      {R"({"Type": "LINEAR", "LinearStepSize": {"Type": "CAPACITY_PERCENT", "Value": 50}})", 1, {0.5, 1.0}},
      {R"({"Type": "LINEAR", "LinearStepSize": {"Type": "CAPACITY_PERCENT", "Value": 30}})", 1, {0.3, 0.6, 0.9, 1.0}},
      {R"({"Type": "LINEAR", "LinearStepSize": {"Type": "INSTANCE_COUNT", "Value": 1}})", 3, {1.0 / 3, 2.0 / 3, 1.0}},
      {R"({"Type": "CANARY", "CanarySize": {"Type": "INSTANCE_COUNT", "Value": 2}})", 2, {1.0}},
  };
  for (const Case& c : cases) {
    json config = {{"BlueGreenUpdatePolicy", {{"TrafficRoutingConfiguration", json::parse(c.routing)}}}};
    config["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"]["WaitIntervalInSeconds"] = 0;
    auto policy = ParseDeploymentConfig(config);
    ASSERT_TRUE(policy.ok()) << c.routing;
    std::vector<double> steps = TrafficSteps(*policy, c.capacity);
    ASSERT_EQ(steps.size(), c.steps.size()) << c.routing;
    for (size_t i = 0; i < steps.size(); ++i) EXPECT_NEAR(steps[i], c.steps[i], 1e-9) << c.routing << " step " << i;
  }
}

// One decision: the input (policy, recorded state, readiness, alarm, now) and what must follow.
struct DecisionCase {
  const char* name;
  const char* config;
  std::optional<RolloutState> state;
  bool ready;
  std::string alarm;
  int64_t now;
  Kind kind;
  std::optional<RolloutState> next;  // kShift / kHold: the state
  int64_t retry_at = 0;
  std::string reason = "";
};

constexpr int64_t kGen = 1'000'000;  // the update started at 1000 s
constexpr const char* kCanary =
    R"({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "CANARY", "WaitIntervalInSeconds": 10,
        "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 20}}, "TerminationWaitInSeconds": 5,
        "MaximumExecutionTimeoutInSeconds": 600}, "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "errors"}]}})";
constexpr const char* kAllAtOnce =
    R"({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 3}}})";
constexpr const char* kLinear =
    R"({"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "LINEAR", "WaitIntervalInSeconds": 2,
        "LinearStepSize": {"Type": "CAPACITY_PERCENT", "Value": 50}}}})";

RolloutState At(Phase phase, int64_t step, double fraction, int64_t until, int64_t started = kGen + 5000) {
  return {.generation = kGen,
          .phase = phase,
          .step = step,
          .fraction = fraction,
          .until_millis = until,
          .started_millis = started};
}

TEST(DecideRolloutTest, BlueGreenTable) {
  const int64_t t = kGen + 5000;  // the new fleet is ready 5 s into the update
  const DecisionCase cases[] = {
      {"no policy: one swap once ready", "{}", std::nullopt, true, "", t, Kind::kComplete, std::nullopt},
      {"no policy: not ready", "{}", std::nullopt, false, "", t, Kind::kProvision, std::nullopt},
      {"not ready: provision until the timeout", kCanary, std::nullopt, false, "", t, Kind::kProvision, RolloutState{},
       kGen + 600'000},
      {"an alarm before any shift is not watched", kCanary, std::nullopt, false, "errors", t, Kind::kProvision,
       RolloutState{}, kGen + 600'000},
      {"ready: the canary's share, bake 10 s, alarms polled", kCanary, std::nullopt, true, "", t, Kind::kShift,
       At(Phase::kBaking, 1, 0.2, t + 10'000), t + 500},
      {"baking: hold, poll the alarm", kCanary, At(Phase::kBaking, 1, 0.2, t + 10'000), true, "", t + 4000, Kind::kHold,
       At(Phase::kBaking, 1, 0.2, t + 10'000), t + 4500},
      {"alarm while baking: roll back", kCanary, At(Phase::kBaking, 1, 0.2, t + 10'000), true, "errors", t + 4000,
       Kind::kRollBack, std::nullopt, 0, AlarmRollbackReason("errors")},
      {"canary baked: the rest, bake again", kCanary, At(Phase::kBaking, 1, 0.2, t + 10'000), true, "", t + 10'000,
       Kind::kShift, At(Phase::kBaking, 2, 1.0, t + 20'000), t + 10'500},
      {"final bake over: termination wait", kCanary, At(Phase::kBaking, 2, 1.0, t + 20'000), true, "", t + 20'100,
       Kind::kShift, At(Phase::kTerminationWait, 2, 1.0, t + 25'100), t + 20'600},
      {"alarm in the termination wait: roll back", kCanary, At(Phase::kTerminationWait, 2, 1.0, t + 25'100), true,
       "errors", t + 21'000, Kind::kRollBack, std::nullopt, 0, AlarmRollbackReason("errors")},
      {"termination wait over: complete", kCanary, At(Phase::kTerminationWait, 2, 1.0, t + 25'100), true, "",
       t + 25'100, Kind::kComplete, std::nullopt},
      {"timeout: roll back wherever it is", kCanary, At(Phase::kBaking, 1, 0.2, kGen + 700'000), true, "",
       kGen + 600'000, Kind::kRollBack, std::nullopt, 0, TimeoutRollbackReason(600)},
      {"a bake never outlasts the timeout", kCanary, At(Phase::kBaking, 1, 0.2, kGen + 700'000), true, "",
       kGen + 599'800, Kind::kHold, At(Phase::kBaking, 1, 0.2, kGen + 700'000), kGen + 600'000},
      {"a state of another update is ignored", kAllAtOnce,
       RolloutState{.generation = 7, .phase = Phase::kTerminationWait, .step = 1, .fraction = 1, .until_millis = 1},
       true, "", t, Kind::kShift, At(Phase::kBaking, 1, 1.0, t + 3000), t + 3000},
      {"all at once: bake without alarms waits to its end", kAllAtOnce, At(Phase::kBaking, 1, 1.0, t + 3000), true, "",
       t + 1000, Kind::kHold, At(Phase::kBaking, 1, 1.0, t + 3000), t + 3000},
      {"all at once baked, no termination wait: complete", kAllAtOnce, At(Phase::kBaking, 1, 1.0, t + 3000), true, "",
       t + 3000, Kind::kComplete, std::nullopt},
      {"linear: second step", kLinear, At(Phase::kBaking, 1, 0.5, t + 2000), true, "", t + 2000, Kind::kShift,
       At(Phase::kBaking, 2, 1.0, t + 4000), t + 4000},
      {"linear: last step baked", kLinear, At(Phase::kBaking, 2, 1.0, t + 4000), true, "", t + 4000, Kind::kComplete,
       std::nullopt},
  };
  for (const DecisionCase& c : cases) {
    SCOPED_TRACE(c.name);
    DeploymentPolicy policy = Parsed(c.config);
    RolloutInput in{.policy = &policy,
                    .state = c.state,
                    .generation = kGen,
                    .capacity = 1,
                    .new_fleet_ready = c.ready,
                    .alarm = c.alarm,
                    .now = c.now};
    RolloutDecision d = DecideRollout(in);
    EXPECT_EQ(ToString(d.kind), ToString(c.kind));
    if (c.next && (c.kind == Kind::kShift || c.kind == Kind::kHold)) {
      EXPECT_EQ(ToJson(d.state), ToJson(*c.next));
    }
    EXPECT_EQ(d.retry_at, c.retry_at);
    EXPECT_EQ(d.reason, c.reason);
  }
}

TEST(DecideRolloutTest, RollingBatches) {
  DeploymentPolicy policy = Parsed(R"({"RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT",
      "Value": 1}, "WaitIntervalInSeconds": 2}, "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "e"}]}})");
  EXPECT_EQ(StepsOfRolling(policy, 2, 2), 2);
  EXPECT_EQ(RollingTargetsAt(policy, 1, 2, 2), (RollingTargets{1, 1}));
  EXPECT_EQ(RollingTargetsAt(policy, 2, 2, 2), (RollingTargets{2, 0}));
  EXPECT_EQ(RollingTargetsAt(policy, 2, 3, 2), (RollingTargets{2, 0}));
  EXPECT_EQ(StepsOfRolling(policy, 3, 2), 3);
  // Before anything: batch 1 comes up beside every old instance.
  EXPECT_EQ(RollingCounts(policy, std::nullopt, kGen, 2, 2), (RollingTargets{1, 2}));

  const int64_t t = kGen + 5000;
  RolloutInput in{.policy = &policy, .generation = kGen, .capacity = 2, .old_count = 2, .now = t};
  in.new_healthy = 0;
  EXPECT_EQ(DecideRollout(in).kind, Kind::kProvision);
  in.new_healthy = 1;  // batch 1 healthy: route it, one old instance goes, bake
  RolloutDecision d = DecideRollout(in);
  ASSERT_EQ(d.kind, Kind::kShift);
  EXPECT_EQ(ToJson(d.state), ToJson(At(Phase::kBaking, 1, 0.5, t + 2000, t)));
  EXPECT_EQ(RollingCounts(policy, d.state, kGen, 2, 2), (RollingTargets{1, 1}));
  in.state = d.state;
  in.now = t + 2000;  // baked: batch 2 comes up
  d = DecideRollout(in);
  ASSERT_EQ(d.kind, Kind::kShift);
  EXPECT_EQ(d.state.phase, Phase::kProvisioning);
  EXPECT_EQ(d.state.step, 2);
  EXPECT_EQ(RollingCounts(policy, d.state, kGen, 2, 2), (RollingTargets{2, 1}));
  in.state = d.state;
  in.alarm = "e";  // traffic is on the new fleet already: the alarm rolls back
  EXPECT_EQ(DecideRollout(in).kind, Kind::kRollBack);
  in.alarm = "";
  EXPECT_EQ(DecideRollout(in).kind, Kind::kProvision);
  in.new_healthy = 2;
  d = DecideRollout(in);
  ASSERT_EQ(d.kind, Kind::kShift);
  EXPECT_EQ(d.state.phase, Phase::kBaking);
  EXPECT_EQ(d.state.fraction, 1.0);
  EXPECT_EQ(RollingCounts(policy, d.state, kGen, 2, 2), (RollingTargets{2, 0}));
  in.state = d.state;
  in.now = d.state.until_millis;
  EXPECT_EQ(DecideRollout(in).kind, Kind::kComplete);
}

}  // namespace
}  // namespace kiln::control
