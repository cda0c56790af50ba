#include "control/autoscaler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "runtime/test_util/fake_clock.h"
#include "store/autoscaling_repository.h"
#include "store/endpoint_repository.h"
#include "store/test_util/temp_database.h"

namespace kiln::control {
namespace {

using nlohmann::json;
using store::AutoscalingKind;
using store::AutoscalingRecord;

constexpr char kResource[] = "endpoint/ep/variant/v";
constexpr char kHigh[] = "TargetTracking-endpoint/ep/variant/v-AlarmHigh-1";
constexpr char kLow[] = "TargetTracking-endpoint/ep/variant/v-AlarmLow-1";

class CountingNotifier : public EndpointNotifier {
 public:
  void EndpointChanged(const std::string&) override { ++calls; }
  std::atomic<int> calls{0};
};

class AutoscalerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    metrics_ = std::make_unique<observe::MetricStore>(db_.get());
    store::EndpointRecord endpoint;
    endpoint.name = "ep";
    endpoint.arn = "arn:aws:sagemaker:us-east-1:000000000000:endpoint/ep";
    endpoint.config_name = "cfg";
    endpoint.status = store::EndpointStatus::kInService;
    endpoint.request = json::object();
    endpoint.deployment.config_name = "cfg";
    endpoint.deployment.endpoint_config = {
        {"EndpointConfigName", "cfg"},
        {"ProductionVariants", {{{"VariantName", "v"}, {"ModelName", "m"}, {"InitialInstanceCount", 1}}}}};
    endpoint.desired["v"].instance_count = 1;
    ASSERT_TRUE(store::EndpointRepository(db_.get()).Insert(endpoint).ok());
    options_.period_seconds = 1;
    options_.settle_millis = 0;
    options_.clock = &clock_;
    scaler_ = std::make_unique<Autoscaler>(options_, AutoscalerDeps{db_.get(), metrics_.get(), &notifier_});
  }

  void Register(int64_t min, int64_t max, json suspended = json::object()) {
    AutoscalingRecord target;
    target.service_namespace = "sagemaker";
    target.resource_id = kResource;
    target.scalable_dimension = "sagemaker:variant:DesiredInstanceCount";
    target.creation_millis = clock_.NowMillis();
    target.doc = {{"MinCapacity", min}, {"MaxCapacity", max}, {"SuspendedState", suspended}};
    ASSERT_TRUE(repo().Put(target).ok());
  }

  void Policy(json config) {
    AutoscalingRecord policy;
    policy.kind = AutoscalingKind::kPolicy;
    policy.service_namespace = "sagemaker";
    policy.resource_id = kResource;
    policy.scalable_dimension = "sagemaker:variant:DesiredInstanceCount";
    policy.name = "tt";
    policy.creation_millis = clock_.NowMillis();
    policy.doc = {{"PolicyName", "tt"},
                  {"PolicyARN", "arn:policy"},
                  {"PolicyType", "TargetTrackingScaling"},
                  {"TargetTrackingScalingPolicyConfiguration", config},
                  {"Alarms", {{{"AlarmName", kHigh}}, {{"AlarmName", kLow}}}}};
    ASSERT_TRUE(repo().Put(policy).ok());
  }

  static json Tracking(double target, int out_cooldown, int in_cooldown) {
    return {{"TargetValue", target},
            {"PredefinedMetricSpecification", {{"PredefinedMetricType", "SageMakerVariantInvocationsPerInstance"}}},
            {"ScaleOutCooldown", out_cooldown},
            {"ScaleInCooldown", in_cooldown}};
  }

  // One second of invocations per instance (in the second before now), then an evaluation at
  // the start of the next second.
  void Second(double invocations_per_instance) {
    const int64_t start = clock_.NowMillis() / 1000 * 1000;
    if (invocations_per_instance > 0) {
      ASSERT_TRUE(metrics_
                      ->Put("AWS/SageMaker", "InvocationsPerInstance", {{"EndpointName", "ep"}, {"VariantName", "v"}},
                            start + 100, invocations_per_instance)
                      .ok());
    }
    clock_.Set(start + 1000);
    scaler_->RunOnce();
  }

  int64_t Desired() { return *store::EndpointRepository(db_.get()).Get("ep")->desired["v"].instance_count; }
  store::EndpointStatus Status() { return store::EndpointRepository(db_.get()).Get("ep")->status; }
  void BackInService() {
    ASSERT_TRUE(store::EndpointRepository(db_.get())
                    .Mutate("ep",
                            [](store::EndpointRecord& r) {
                              r.status = store::EndpointStatus::kInService;
                              return kiln::Status::Ok();
                            })
                    .ok());
  }
  std::vector<AutoscalingRecord> Activities() { return *repo().ListAll(AutoscalingKind::kActivity); }
  store::AutoscalingRepository repo() { return store::AutoscalingRepository(db_.get()); }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<observe::MetricStore> metrics_;
  runtime::testing::FakeClock clock_{1'700'000'000'000};
  CountingNotifier notifier_;
  AutoscalerOptions options_;
  std::unique_ptr<Autoscaler> scaler_;
};

TEST_F(AutoscalerTest, TargetTrackingScalesOutAfterThreePeriodsAndInAfterFifteen) {
  Register(1, 3);
  Policy(Tracking(10, 0, 2));
  Second(25);
  Second(25);
  EXPECT_EQ(Desired(), 1);  // two periods above target: not yet
  Second(25);
  EXPECT_EQ(Desired(), 3);  // ceil(1 × 25 / 10)
  EXPECT_EQ(Status(), store::EndpointStatus::kUpdating);
  EXPECT_EQ(notifier_.calls.load(), 1);
  auto activities = Activities();
  ASSERT_EQ(activities.size(), 1u);
  EXPECT_EQ(activities[0].doc["StatusCode"], "InProgress");
  EXPECT_EQ(activities[0].doc["Description"], "Setting desired instance count to 3.");
  EXPECT_EQ(activities[0].doc["Cause"], std::string("monitor alarm ") + kHigh + " in state ALARM triggered policy tt");
  BackInService();
  Second(5);
  activities = Activities();
  EXPECT_EQ(activities[0].doc["StatusCode"], "Successful");
  EXPECT_TRUE(activities[0].doc.contains("EndMillis"));

  // Idle: 15 periods under 0.9 × target, then one instance per step (max(1, floor(0.3))),
  // ScaleInCooldown (2 s) apart.
  for (int i = 0; i < 13; ++i) Second(0);  // with Second(5): 14 low periods
  EXPECT_EQ(Desired(), 3);
  Second(0);
  EXPECT_EQ(Desired(), 2);
  BackInService();
  Second(0);
  EXPECT_EQ(Desired(), 2);  // cooldown
  Second(0);
  EXPECT_EQ(Desired(), 1);
  BackInService();
  for (int i = 0; i < 5; ++i) Second(0);
  EXPECT_EQ(Desired(), 1);  // the minimum
  EXPECT_EQ(Activities().size(), 3u);

  auto alarms = ListScalingAlarms(db_.get(), 1);
  ASSERT_TRUE(alarms.ok());
  ASSERT_EQ(alarms->size(), 2u);
  EXPECT_EQ((*alarms)[0].name, kHigh);
  EXPECT_EQ((*alarms)[0].state, "OK");
  EXPECT_EQ((*alarms)[0].comparison, "GreaterThanThreshold");
  EXPECT_EQ((*alarms)[0].evaluation_periods, 3);
  EXPECT_EQ((*alarms)[1].state, "ALARM");
  EXPECT_DOUBLE_EQ((*alarms)[1].threshold, 9);
  EXPECT_EQ((*alarms)[1].metric_name, "InvocationsPerInstance");
  EXPECT_EQ((*alarms)[1].dimensions.at("VariantName"), "v");
}

// A serverless variant's ProvisionedConcurrency (serving-contract.md §12): tracked on
// ServerlessProvisionedConcurrencyUtilization (Average) and written as the desired override,
// never above the variant's MaxConcurrency.
TEST_F(AutoscalerTest, ProvisionedConcurrencyTracksUtilization) {
  ASSERT_TRUE(store::EndpointRepository(db_.get())
                  .Mutate("ep",
                          [](store::EndpointRecord& r) {
                            r.deployment.endpoint_config["ProductionVariants"][0] = {
                                {"VariantName", "v"},
                                {"ModelName", "m"},
                                {"ServerlessConfig",
                                 {{"MemorySizeInMB", 1024}, {"MaxConcurrency", 3}, {"ProvisionedConcurrency", 1}}}};
                            return kiln::Status::Ok();
                          })
                  .ok());
  const std::string dimension = "sagemaker:variant:DesiredProvisionedConcurrency";
  AutoscalingRecord target;
  target.service_namespace = "sagemaker";
  target.resource_id = kResource;
  target.scalable_dimension = dimension;
  target.creation_millis = clock_.NowMillis();
  target.doc = {{"MinCapacity", 1}, {"MaxCapacity", 8}};
  ASSERT_TRUE(repo().Put(target).ok());
  AutoscalingRecord policy;
  policy.kind = AutoscalingKind::kPolicy;
  policy.service_namespace = "sagemaker";
  policy.resource_id = kResource;
  policy.scalable_dimension = dimension;
  policy.name = "pc";
  policy.creation_millis = clock_.NowMillis();
  policy.doc = {{"PolicyName", "pc"},
                {"PolicyType", "TargetTrackingScaling"},
                {"TargetTrackingScalingPolicyConfiguration",
                 {{"TargetValue", 0.5},
                  {"PredefinedMetricSpecification",
                   {{"PredefinedMetricType", "SageMakerVariantProvisionedConcurrencyUtilization"}}},
                  {"ScaleOutCooldown", 0}}}};
  ASSERT_TRUE(repo().Put(policy).ok());
  auto utilization = [&](double value) {
    const int64_t start = clock_.NowMillis() / 1000 * 1000;
    ASSERT_TRUE(metrics_
                    ->Put("AWS/SageMaker", "ServerlessProvisionedConcurrencyUtilization",
                          {{"EndpointName", "ep"}, {"VariantName", "v"}}, start + 100, value)
                    .ok());
    clock_.Set(start + 1000);
    scaler_->RunOnce();
  };
  auto provisioned = [&]() {
    return store::EndpointRepository(db_.get()).Get("ep")->desired["v"].serverless_provisioned_concurrency;
  };
  for (int i = 0; i < 3; ++i) utilization(1.0);
  EXPECT_EQ(provisioned(), 2);  // ceil(1 × 1.0 / 0.5)
  EXPECT_EQ(Desired(), 1);      // the pool's count is the serverless scaler's, untouched
  auto activities = Activities();
  ASSERT_EQ(activities.size(), 1u);
  EXPECT_EQ(activities[0].doc["Description"], "Setting desired provisioned concurrency to 2.");
  BackInService();
  // ceil(2 × 1.0 / 0.5) = 4 is over MaxConcurrency 3: the activity fails, nothing is written.
  for (int i = 0; i < 3; ++i) utilization(1.0);
  EXPECT_EQ(provisioned(), 2);
  activities = Activities();
  ASSERT_GE(activities.size(), 2u);
  bool refused = false;
  for (const AutoscalingRecord& a : activities) {
    if (a.doc["StatusCode"] == "Failed" && a.doc["StatusMessage"].get<std::string>().find(
                                               "would exceed the variant's MaxConcurrency") != std::string::npos) {
      refused = true;
    }
  }
  EXPECT_TRUE(refused);
}

TEST_F(AutoscalerTest, ScaleOutCooldownAllowsOnlyALargerScaleOut) {
  Register(1, 10);
  Policy(Tracking(10, 300, 300));
  for (int i = 0; i < 3; ++i) Second(20);
  EXPECT_EQ(Desired(), 2);
  BackInService();
  Second(20);  // finishes the activity; 2 × 20 / 10 = 4 > 2: a larger scale-out goes at once
  Second(20);
  EXPECT_EQ(Desired(), 4);
  BackInService();
  Second(12);  // 4 × 12 / 10 → 5, larger than 4
  Second(12);
  EXPECT_EQ(Desired(), 5);
  BackInService();
  Second(10.5);  // 5 × 10.5 / 10 → 6 > 5: larger again; still allowed
  Second(10.5);
  EXPECT_EQ(Desired(), 6);
}

TEST_F(AutoscalerTest, DisableScaleInAndSuspendedScaleOut) {
  Register(1, 4, {{"DynamicScalingOutSuspended", true}});
  json config = Tracking(10, 0, 0);
  config["DisableScaleIn"] = true;
  Policy(config);
  for (int i = 0; i < 5; ++i) Second(50);
  EXPECT_EQ(Desired(), 1);
  EXPECT_TRUE(Activities().empty());
}

TEST_F(AutoscalerTest, CountOutsideBoundsIsClamped) {
  Register(2, 4);
  Second(0);
  EXPECT_EQ(Desired(), 2);
  auto activities = Activities();
  ASSERT_EQ(activities.size(), 1u);
  EXPECT_EQ(activities[0].doc["Description"], "Setting desired instance count to 2.");
}

TEST_F(AutoscalerTest, NoScalingWhileTheEndpointIsUpdating) {
  Register(1, 4);
  Policy(Tracking(10, 0, 0));
  ASSERT_TRUE(store::EndpointRepository(db_.get())
                  .Mutate("ep",
                          [](store::EndpointRecord& r) {
                            r.status = store::EndpointStatus::kUpdating;
                            return kiln::Status::Ok();
                          })
                  .ok());
  for (int i = 0; i < 4; ++i) Second(40);
  EXPECT_EQ(Desired(), 1);
  BackInService();
  Second(40);  // AlarmHigh is still ALARM: scales at once
  EXPECT_EQ(Desired(), 4);
}

TEST_F(AutoscalerTest, ScheduledActionSetsBounds) {
  Register(1, 4);
  AutoscalingRecord action;
  action.kind = AutoscalingKind::kScheduledAction;
  action.service_namespace = "sagemaker";
  action.resource_id = kResource;
  action.scalable_dimension = "sagemaker:variant:DesiredInstanceCount";
  action.name = "morning";
  action.creation_millis = clock_.NowMillis();
  action.doc = {{"Schedule", "at(2023-11-14T22:13:22)"},
                {"ScalableTargetAction", {{"MinCapacity", 3}, {"MaxCapacity", 5}}}};
  ASSERT_TRUE(repo().Put(action).ok());
  Second(0);  // 1'700'000'000 s is 2023-11-14T22:13:20Z: not yet
  EXPECT_EQ(Desired(), 1);
  Second(0);
  Second(0);
  EXPECT_EQ(Desired(), 3);
  auto target =
      repo().Get(AutoscalingKind::kTarget, "sagemaker", kResource, "sagemaker:variant:DesiredInstanceCount", "");
  EXPECT_EQ(target->doc["MinCapacity"], 3);
  EXPECT_EQ(target->doc["MaxCapacity"], 5);
  auto activities = Activities();
  ASSERT_EQ(activities.size(), 2u);
  EXPECT_EQ(activities[0].doc["Description"], "Setting min capacity to 3 and max capacity to 5");
  EXPECT_EQ(activities[0].doc["Cause"], "scheduled action name morning was triggered");
}

// A metric alarm (CloudWatch PutMetricAlarm) naming a step-scaling policy: scale from 0, as an
// asynchronous endpoint does on HasBacklogWithoutCapacity.
TEST_F(AutoscalerTest, StepScalingFromAnAlarmScalesFromZero) {
  ASSERT_TRUE(store::EndpointRepository(db_.get())
                  .Mutate("ep",
                          [](store::EndpointRecord& r) {
                            r.desired["v"].instance_count = 0;
                            return kiln::Status::Ok();
                          })
                  .ok());
  Register(0, 3);
  AutoscalingRecord policy;
  policy.kind = AutoscalingKind::kPolicy;
  policy.service_namespace = "sagemaker";
  policy.resource_id = kResource;
  policy.scalable_dimension = "sagemaker:variant:DesiredInstanceCount";
  policy.name = "from-zero";
  policy.creation_millis = clock_.NowMillis();
  policy.doc = json::parse(R"({"PolicyName": "from-zero", "PolicyARN": "arn:step", "PolicyType": "StepScaling",
      "StepScalingPolicyConfiguration": {"AdjustmentType": "ChangeInCapacity", "Cooldown": 2,
        "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]}})");
  ASSERT_TRUE(repo().Put(policy).ok());
  AutoscalingRecord alarm;
  alarm.kind = AutoscalingKind::kAlarm;
  alarm.service_namespace = "cloudwatch";
  alarm.name = "backlog";
  alarm.creation_millis = clock_.NowMillis();
  alarm.doc = json::parse(R"({"AlarmName": "backlog", "Namespace": "AWS/SageMaker",
      "MetricName": "HasBacklogWithoutCapacity", "Dimensions": [{"Name": "EndpointName", "Value": "ep"}],
      "Statistic": "Average", "Period": 1, "EvaluationPeriods": 2, "Threshold": 1,
      "ComparisonOperator": "GreaterThanOrEqualToThreshold", "TreatMissingData": "missing",
      "AlarmActions": ["arn:step"]})");
  ASSERT_TRUE(repo().Put(alarm).ok());
  auto backlog = [&](double value) {
    const int64_t start = clock_.NowMillis() / 1000 * 1000;
    ASSERT_TRUE(
        metrics_->Put("AWS/SageMaker", "HasBacklogWithoutCapacity", {{"EndpointName", "ep"}}, start + 100, value).ok());
    clock_.Set(start + 1000);
    scaler_->RunOnce();
  };
  backlog(0);
  backlog(1);
  EXPECT_EQ(Desired(), 0);  // one of two datapoints
  backlog(1);
  EXPECT_EQ(Desired(), 1);
  auto activities = Activities();
  ASSERT_EQ(activities.size(), 1u);
  EXPECT_EQ(activities[0].doc["Cause"], "monitor alarm backlog in state ALARM triggered policy from-zero");
  auto stored = repo().Get(AutoscalingKind::kAlarm, "cloudwatch", "", "", "backlog");
  EXPECT_EQ(stored->state["state"], "ALARM");
  BackInService();
  backlog(1);  // cooldown (2 s) since the step
  EXPECT_EQ(Desired(), 1);
  backlog(1);
  EXPECT_EQ(Desired(), 2);
  BackInService();
  backlog(0);
  backlog(0);
  EXPECT_EQ(repo().Get(AutoscalingKind::kAlarm, "cloudwatch", "", "", "backlog")->state["state"], "OK");
  EXPECT_EQ(Desired(), 2);
}

TEST(AutoscalerSchedule, ParsesAtRateAndCron) {
  auto at = ParseScalingSchedule("at(2023-11-14T22:13:22)");
  ASSERT_TRUE(at.ok());
  EXPECT_EQ(at->at_millis, 1'700'000'002'000);
  auto rate = ParseScalingSchedule("rate(5 minutes)");
  ASSERT_TRUE(rate.ok());
  EXPECT_EQ(rate->rate_millis, 300'000);
  EXPECT_FALSE(ParseScalingSchedule("rate(0 minutes)").ok());
  EXPECT_FALSE(ParseScalingSchedule("rate(5 fortnights)").ok());
  EXPECT_FALSE(ParseScalingSchedule("every day").ok());
  EXPECT_FALSE(ParseScalingSchedule("cron(0 9 * * ?)").ok());
  EXPECT_FALSE(ParseScalingSchedule("cron(0 9 L * ? *)").ok());
  auto cron = ParseScalingSchedule("cron(30 9 ? * MON-FRI *)");
  ASSERT_TRUE(cron.ok());
  // 2023-11-14 (a Tuesday) 22:13 → Wednesday 2023-11-15 09:30 UTC.
  EXPECT_EQ(NextCronMillis(*cron, 1'700'000'000'000), int64_t{1'700'040'600'000});
  auto every = ParseScalingSchedule("cron(*/15 * * * ? *)");
  ASSERT_TRUE(every.ok());
  EXPECT_EQ(NextCronMillis(*every, 1'700'000'000'000), int64_t{1'700'000'100'000});  // 22:15
}

TEST(AutoscalerResource, ParsesVariantResourceIds) {
  auto r = ParseVariantResourceId("endpoint/ep/variant/AllTraffic");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->endpoint, "ep");
  EXPECT_EQ(r->variant, "AllTraffic");
  EXPECT_FALSE(ParseVariantResourceId("endpoint/ep"));
  EXPECT_FALSE(ParseVariantResourceId("inference-component/x"));
  EXPECT_FALSE(ParseVariantResourceId("endpoint//variant/v"));
}

}  // namespace
}  // namespace kiln::control
