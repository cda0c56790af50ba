#include "api/autoscaling.h"

#include <gtest/gtest.h>

#include "api/inference_test_fixture.h"

namespace kiln::api {
namespace {

using nlohmann::json;

constexpr char kResource[] = "endpoint/ep/variant/v";
constexpr char kDimension[] = "sagemaker:variant:DesiredInstanceCount";

class AutoscalingApiTest : public testing::InferenceApiTest {
 protected:
  void SetUp() override {
    InferenceApiTest::SetUp();
    AutoscalingContext ctx;
    ctx.database = db_.get();
    ctx.account_id = "123456789012";
    ctx.region = "us-east-1";
    ctx.clock = &clock_;
    RegisterAutoscalingOperations(&scaling_, ctx);
    CreateModel("m");
    CreateConfig("cfg", json::array({Variant("v", "m")}));
    Ok("CreateEndpoint", {{"EndpointName", "ep"}, {"EndpointConfigName", "cfg"}});
  }

  testing::Answer Scale(const std::string& operation, const json& input) {
    aws::RequestContext context;
    context.request_id = "req";
    auto response = scaling_.Handle(context, operation, input.dump());
    testing::Answer a;
    a.status = response.status;
    a.body = response.body.empty() ? json::object() : json::parse(response.body);
    return a;
  }
  json ScaleOk(const std::string& operation, const json& input) {
    testing::Answer a = Scale(operation, input);
    EXPECT_EQ(a.status, 200) << operation << ": " << a.body.dump();
    return a.body;
  }
  std::string ScaleError(const std::string& operation, const json& input, const std::string& type) {
    testing::Answer a = Scale(operation, input);
    EXPECT_EQ(a.status, 400) << operation << ": " << a.body.dump();
    EXPECT_EQ(a.type(), type) << a.body.dump();
    return a.message();
  }
  static json Key(const std::string& resource = kResource) {
    return {{"ServiceNamespace", "sagemaker"}, {"ResourceId", resource}, {"ScalableDimension", kDimension}};
  }
  static json With(json base, const json& more) {
    base.update(more);
    return base;
  }
  static json TrackingPolicy(const std::string& name) {
    return With(
        Key(),
        {{"PolicyName", name},
         {"PolicyType", "TargetTrackingScaling"},
         {"TargetTrackingScalingPolicyConfiguration",
          {{"TargetValue", 70.0},
           {"PredefinedMetricSpecification", {{"PredefinedMetricType", "SageMakerVariantInvocationsPerInstance"}}}}}});
  }

  JsonService scaling_{"AnyScaleFrontendService", "application-autoscaling", aws::Protocol::kJson11};
};

TEST_F(AutoscalingApiTest, RegisterDescribeAndUpdateATarget) {
  json out = ScaleOk("RegisterScalableTarget", With(Key(), {{"MinCapacity", 1}, {"MaxCapacity", 4}}));
  EXPECT_EQ(out["ScalableTargetARN"].get<std::string>().rfind(
                "arn:aws:application-autoscaling:us-east-1:123456789012:scalable-target/", 0),
            0u);
  // Re-registering changes only what is given.
  ScaleOk("RegisterScalableTarget",
          With(Key(), {{"MaxCapacity", 6}, {"SuspendedState", {{"DynamicScalingInSuspended", true}}}}));
  json described = ScaleOk("DescribeScalableTargets", {{"ServiceNamespace", "sagemaker"}});
  ASSERT_EQ(described["ScalableTargets"].size(), 1u);
  const json& t = described["ScalableTargets"][0];
  EXPECT_EQ(t["MinCapacity"], 1);
  EXPECT_EQ(t["MaxCapacity"], 6);
  EXPECT_EQ(t["SuspendedState"]["DynamicScalingInSuspended"], true);
  EXPECT_EQ(t["SuspendedState"]["ScheduledScalingSuspended"], false);
  EXPECT_EQ(t["ScalableTargetARN"], out["ScalableTargetARN"]);
  EXPECT_TRUE(t["CreationTime"].is_number());
  EXPECT_TRUE(
      ScaleOk("DescribeScalableTargets", {{"ServiceNamespace", "sagemaker"}, {"ResourceIds", {"x"}}})["ScalableTargets"]
          .empty());
}

TEST_F(AutoscalingApiTest, RegisterRefusesWhatAwsRefuses) {
  EXPECT_NE(
      ScaleError("RegisterScalableTarget",
                 With(Key("endpoint/nope/variant/v"), {{"MinCapacity", 1}, {"MaxCapacity", 2}}), "ValidationException")
          .find("Endpoint nope does not exist"),
      std::string::npos);
  ScaleError("RegisterScalableTarget", With(Key("endpoint/ep/variant/w"), {{"MinCapacity", 1}, {"MaxCapacity", 2}}),
             "ValidationException");
  ScaleError("RegisterScalableTarget", With(Key(), {{"MinCapacity", 0}, {"MaxCapacity", 2}}), "ValidationException");
  EXPECT_EQ(ScaleError("RegisterScalableTarget", With(Key(), {{"MinCapacity", 3}, {"MaxCapacity", 2}}),
                       "ValidationException"),
            "Maximum capacity cannot be less than minimum capacity (MinCapacity 3, MaxCapacity 2).");
  ScaleError("RegisterScalableTarget", With(Key(), {{"MinCapacity", 1}}), "ValidationException");
  ScaleError(
      "RegisterScalableTarget",
      {{"ServiceNamespace", "ecs"}, {"ResourceId", "service/c/s"}, {"ScalableDimension", "ecs:service:DesiredCount"}},
      "ValidationException");
  ScaleError("RegisterScalableTarget", With(Key("inference-component/ic"), {{"MinCapacity", 1}, {"MaxCapacity", 2}}),
             "ValidationException");
  // The model's own checks run first (enum of ServiceNamespace).
  EXPECT_NE(ScaleError("RegisterScalableTarget",
                       {{"ServiceNamespace", "nope"}, {"ResourceId", kResource}, {"ScalableDimension", kDimension}},
                       "ValidationException")
                .find("Member must satisfy enum value set"),
            std::string::npos);
  EXPECT_EQ(ScaleError("DeregisterScalableTarget", Key(), "ObjectNotFoundException"),
            "No scalable target found for service namespace: sagemaker, resource ID: endpoint/ep/variant/v, scalable "
            "dimension: sagemaker:variant:DesiredInstanceCount");
}

TEST_F(AutoscalingApiTest, AsyncEndpointsMayScaleToZero) {
  CreateConfig("async-cfg", json::array({Variant("v", "m")}));
  // The config is stored as given; make it asynchronous by writing the member directly.
  ASSERT_TRUE(db_->Exec("UPDATE endpoint_configs SET request_json = json_set(request_json, '$.AsyncInferenceConfig', "
                        "json('{\"OutputConfig\": {\"S3OutputPath\": \"s3://b/out\"}}')) WHERE name = 'async-cfg'")
                  .ok());
  Ok("CreateEndpoint", {{"EndpointName", "aep"}, {"EndpointConfigName", "async-cfg"}});
  ScaleOk("RegisterScalableTarget", With(Key("endpoint/aep/variant/v"), {{"MinCapacity", 0}, {"MaxCapacity", 2}}));
}

// Serverless variants scale their ProvisionedConcurrency (serving-contract.md §12), tracked on
// SageMakerVariantProvisionedConcurrencyUtilization; their instance count is not a target.
TEST_F(AutoscalingApiTest, ServerlessVariantsScaleProvisionedConcurrency) {
  auto serverless = [](json config) {
    return json::array({json{{"VariantName", "v"}, {"ModelName", "m"}, {"ServerlessConfig", std::move(config)}}});
  };
  CreateConfig("sls", serverless({{"MemorySizeInMB", 1024}, {"MaxConcurrency", 10}, {"ProvisionedConcurrency", 1}}));
  CreateConfig("bare", serverless({{"MemorySizeInMB", 1024}, {"MaxConcurrency", 10}}));
  Ok("CreateEndpoint", {{"EndpointName", "sep"}, {"EndpointConfigName", "sls"}});
  Ok("CreateEndpoint", {{"EndpointName", "bep"}, {"EndpointConfigName", "bare"}});
  const json provisioned = {{"ServiceNamespace", "sagemaker"},
                            {"ResourceId", "endpoint/sep/variant/v"},
                            {"ScalableDimension", "sagemaker:variant:DesiredProvisionedConcurrency"}};
  EXPECT_NE(
      ScaleError("RegisterScalableTarget",
                 With(Key("endpoint/sep/variant/v"), {{"MinCapacity", 1}, {"MaxCapacity", 2}}), "ValidationException")
          .find("scale its provisioned concurrency"),
      std::string::npos);
  EXPECT_NE(
      ScaleError("RegisterScalableTarget",
                 With(provisioned, {{"ResourceId", "endpoint/bep/variant/v"}, {"MinCapacity", 1}, {"MaxCapacity", 2}}),
                 "ValidationException")
          .find("has no provisioned concurrency"),
      std::string::npos);
  EXPECT_NE(ScaleError("RegisterScalableTarget",
                       With(provisioned, {{"ResourceId", kResource}, {"MinCapacity", 1}, {"MaxCapacity", 2}}),
                       "ValidationException")
                .find("has no provisioned concurrency"),
            std::string::npos);
  ScaleError("RegisterScalableTarget", With(provisioned, {{"MinCapacity", 1}, {"MaxCapacity", 201}}),
             "ValidationException");
  ScaleOk("RegisterScalableTarget", With(provisioned, {{"MinCapacity", 1}, {"MaxCapacity", 8}}));
  auto policy = [&](const std::string& metric) {
    return With(provisioned,
                {{"PolicyName", "p"},
                 {"PolicyType", "TargetTrackingScaling"},
                 {"TargetTrackingScalingPolicyConfiguration",
                  {{"TargetValue", 0.5}, {"PredefinedMetricSpecification", {{"PredefinedMetricType", metric}}}}}});
  };
  EXPECT_NE(ScaleError("PutScalingPolicy", policy("SageMakerVariantInvocationsPerInstance"), "ValidationException")
                .find("does not apply to sagemaker:variant:DesiredProvisionedConcurrency"),
            std::string::npos);
  ScaleOk("PutScalingPolicy", policy("SageMakerVariantProvisionedConcurrencyUtilization"));
  // And the other way round on an instance-count target.
  ScaleOk("RegisterScalableTarget", With(Key(), {{"MinCapacity", 1}, {"MaxCapacity", 2}}));
  json on_instances = policy("SageMakerVariantProvisionedConcurrencyUtilization");
  on_instances.update(Key());
  EXPECT_NE(ScaleError("PutScalingPolicy", on_instances, "ValidationException")
                .find("does not apply to sagemaker:variant:DesiredInstanceCount"),
            std::string::npos);
}

TEST_F(AutoscalingApiTest, PoliciesPutDescribePageAndDelete) {
  ScaleError("PutScalingPolicy", TrackingPolicy("p1"), "ObjectNotFoundException");
  ScaleOk("RegisterScalableTarget", With(Key(), {{"MinCapacity", 1}, {"MaxCapacity", 4}}));
  json out = ScaleOk("PutScalingPolicy", TrackingPolicy("p1"));
  ASSERT_EQ(out["Alarms"].size(), 2u);
  const std::string high = out["Alarms"][0]["AlarmName"];
  EXPECT_EQ(high.rfind("TargetTracking-endpoint/ep/variant/v-AlarmHigh-", 0), 0u);
  EXPECT_EQ(out["Alarms"][1]["AlarmName"].get<std::string>().rfind("TargetTracking-endpoint/ep/variant/v-AlarmLow-", 0),
            0u);
  EXPECT_EQ(out["Alarms"][0]["AlarmARN"], "arn:aws:cloudwatch:us-east-1:123456789012:alarm:" + high);
  EXPECT_NE(out["PolicyARN"].get<std::string>().find(":resource/sagemaker/endpoint/ep/variant/v:policyName/p1"),
            std::string::npos);
  // The same name replaces the policy, keeping its ARN and alarms.
  json again = ScaleOk("PutScalingPolicy", TrackingPolicy("p1"));
  EXPECT_EQ(again["PolicyARN"], out["PolicyARN"]);
  EXPECT_EQ(again["Alarms"], out["Alarms"]);
  ScaleOk("PutScalingPolicy", TrackingPolicy("p2"));
  json step = json::parse(R"({"PolicyName": "step", "PolicyType": "StepScaling",
      "StepScalingPolicyConfiguration": {"AdjustmentType": "ChangeInCapacity",
        "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]}})");
  ScaleOk("PutScalingPolicy", With(Key(), step));
  json page = ScaleOk("DescribeScalingPolicies", {{"ServiceNamespace", "sagemaker"}, {"MaxResults", 2}});
  ASSERT_EQ(page["ScalingPolicies"].size(), 2u);
  EXPECT_EQ(page["ScalingPolicies"][0]["PolicyName"], "p1");
  EXPECT_EQ(page["ScalingPolicies"][0]["TargetTrackingScalingPolicyConfiguration"]["TargetValue"], 70.0);
  ASSERT_TRUE(page.contains("NextToken"));
  json rest = ScaleOk("DescribeScalingPolicies",
                      {{"ServiceNamespace", "sagemaker"}, {"MaxResults", 2}, {"NextToken", page["NextToken"]}});
  ASSERT_EQ(rest["ScalingPolicies"].size(), 1u);
  EXPECT_EQ(rest["ScalingPolicies"][0]["PolicyName"], "step");
  EXPECT_FALSE(rest["ScalingPolicies"][0].contains("Alarms"));
  EXPECT_FALSE(rest.contains("NextToken"));
  ScaleError("DescribeScalingPolicies", {{"ServiceNamespace", "sagemaker"}, {"NextToken", "garbage"}},
             "InvalidNextTokenException");
  json named = ScaleOk("DescribeScalingPolicies", {{"ServiceNamespace", "sagemaker"}, {"PolicyNames", {"p2"}}});
  ASSERT_EQ(named["ScalingPolicies"].size(), 1u);

  ScaleOk("DeleteScalingPolicy", With(Key(), {{"PolicyName", "p2"}}));
  EXPECT_EQ(ScaleError("DeleteScalingPolicy", With(Key(), {{"PolicyName", "p2"}}), "ObjectNotFoundException"),
            "No scaling policy found for service namespace: sagemaker, resource ID: endpoint/ep/variant/v, scalable "
            "dimension: sagemaker:variant:DesiredInstanceCount, policy name: p2");
  ScaleOk("DeregisterScalableTarget", Key());
  EXPECT_TRUE(ScaleOk("DescribeScalingPolicies", {{"ServiceNamespace", "sagemaker"}})["ScalingPolicies"].empty());
}

TEST_F(AutoscalingApiTest, PolicyConfigurationsAreChecked) {
  ScaleOk("RegisterScalableTarget", With(Key(), {{"MinCapacity", 1}, {"MaxCapacity", 4}}));
  json p = TrackingPolicy("p");
  p["PolicyType"] = "PredictiveScaling";
  p.erase("TargetTrackingScalingPolicyConfiguration");
  ScaleError("PutScalingPolicy", p, "ValidationException");
  p = TrackingPolicy("p");
  p["TargetTrackingScalingPolicyConfiguration"]["PredefinedMetricSpecification"]["PredefinedMetricType"] =
      "ECSServiceAverageCPUUtilization";
  ScaleError("PutScalingPolicy", p, "ValidationException");
  p = TrackingPolicy("p");
  p["TargetTrackingScalingPolicyConfiguration"]["CustomizedMetricSpecification"] = {
      {"MetricName", "CPUUtilization"}, {"Namespace", "/aws/sagemaker/Endpoints"}, {"Statistic", "Average"}};
  ScaleError("PutScalingPolicy", p, "ValidationException");  // both specifications
  p["TargetTrackingScalingPolicyConfiguration"].erase("PredefinedMetricSpecification");
  ScaleOk("PutScalingPolicy", p);
  p = TrackingPolicy("p");
  p["TargetTrackingScalingPolicyConfiguration"]["TargetValue"] = 0;
  ScaleError("PutScalingPolicy", p, "ValidationException");
  p = TrackingPolicy("p");
  p.erase("TargetTrackingScalingPolicyConfiguration");
  ScaleError("PutScalingPolicy", p, "ValidationException");
  // Model check: PolicyName longer than 256.
  ScaleError("PutScalingPolicy", TrackingPolicy(std::string(257, 'a')), "ValidationException");
}

TEST_F(AutoscalingApiTest, ScheduledActions) {
  json action = With(Key(), {{"ScheduledActionName", "nightly"},
                             {"Schedule", "cron(0 22 * * ? *)"},
                             {"ScalableTargetAction", {{"MinCapacity", 1}, {"MaxCapacity", 1}}}});
  ScaleError("PutScheduledAction", action, "ObjectNotFoundException");
  ScaleOk("RegisterScalableTarget", With(Key(), {{"MinCapacity", 1}, {"MaxCapacity", 4}}));
  ScaleOk("PutScheduledAction", action);
  ScaleError("PutScheduledAction", With(action, {{"Schedule", "sometimes"}}), "ValidationException");
  ScaleError("PutScheduledAction", With(action, {{"Timezone", "Europe/Paris"}}), "ValidationException");
  ScaleOk("PutScheduledAction", With(action, {{"ScheduledActionName", "burst"}, {"Schedule", "rate(1 hour)"}}));
  json described = ScaleOk("DescribeScheduledActions", {{"ServiceNamespace", "sagemaker"}});
  ASSERT_EQ(described["ScheduledActions"].size(), 2u);
  EXPECT_EQ(described["ScheduledActions"][0]["Schedule"], "cron(0 22 * * ? *)");
  EXPECT_NE(
      described["ScheduledActions"][0]["ScheduledActionARN"].get<std::string>().find(":scheduledActionName/nightly"),
      std::string::npos);
  ScaleOk("DeleteScheduledAction", With(Key(), {{"ScheduledActionName", "nightly"}}));
  ScaleError("DeleteScheduledAction", With(Key(), {{"ScheduledActionName", "nightly"}}), "ObjectNotFoundException");
  EXPECT_EQ(ScaleOk("DescribeScheduledActions", {{"ServiceNamespace", "sagemaker"}})["ScheduledActions"].size(), 1u);
}

TEST_F(AutoscalingApiTest, ActivitiesAreListedNewestFirst) {
  json out = ScaleOk("DescribeScalingActivities", {{"ServiceNamespace", "sagemaker"}, {"ResourceId", kResource}});
  EXPECT_TRUE(out["ScalingActivities"].empty());
}

}  // namespace
}  // namespace kiln::api
