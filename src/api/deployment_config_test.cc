// DeploymentConfig on CreateEndpoint / UpdateEndpoint (serving-contract.md §9): AWS's rules beyond
// the shape, alarms that must exist, sizes against the new fleet; what is accepted is stored
// (LastDeploymentConfig) and a refused update leaves the endpoint as it was.
#include "api/deployment_config.h"

#include <gtest/gtest.h>

#include "api/inference_test_fixture.h"
#include "store/autoscaling_repository.h"

namespace kiln::api {
namespace {

using nlohmann::json;

class DeploymentConfigApiTest : public testing::InferenceApiTest {
 protected:
  void SetUp() override {
    InferenceApiTest::SetUp();
    CreateModel("m1");
    CreateModel("m2");
    CreateConfig("cfg", json::array({Variant("AllTraffic", "m1", 2)}));
    CreateConfig("cfg2", json::array({Variant("AllTraffic", "m2", 2)}));
    CreateConfig("two", json::array({Variant("A", "m2", 1), Variant("B", "m2", 1)}));
    PutAlarm("errors");
  }
  void PutAlarm(const std::string& name) {
    store::AutoscalingRecord alarm;
    alarm.kind = store::AutoscalingKind::kAlarm;
    alarm.service_namespace = "cloudwatch";
    alarm.name = name;
    ASSERT_TRUE(store::AutoscalingRepository(db_.get()).Put(alarm).ok());
  }
  void InService(const std::string& name) {
    store::EndpointRepository repo(db_.get());
    ASSERT_TRUE(repo.Mutate(name,
                            [](store::EndpointRecord& r) {
                              r.status = store::EndpointStatus::kInService;
                              return Status::Ok();
                            })
                    .ok());
  }
  static json Canary(int64_t value, const char* type = "INSTANCE_COUNT") {
    return {
        {"BlueGreenUpdatePolicy",
         {{"TrafficRoutingConfiguration",
           {{"Type", "CANARY"}, {"WaitIntervalInSeconds", 5}, {"CanarySize", {{"Type", type}, {"Value", value}}}}}}},
        {"AutoRollbackConfiguration", {{"Alarms", json::array({{{"AlarmName", "errors"}}})}}}};
  }
  json Update(const std::string& config, const json& deployment) {
    return {{"EndpointName", "e"}, {"EndpointConfigName", config}, {"DeploymentConfig", deployment}};
  }
};

TEST_F(DeploymentConfigApiTest, UpdateChecksRulesAlarmsAndSizes) {
  Ok("CreateEndpoint", {{"EndpointName", "e"}, {"EndpointConfigName", "cfg"}});
  InService("e");
  json unknown_alarm = Canary(1);
  unknown_alarm["AutoRollbackConfiguration"]["Alarms"].push_back({{"AlarmName", "nope"}});
  EXPECT_EQ(Invalid("UpdateEndpoint", Update("cfg2", unknown_alarm)),
            "The CloudWatch alarm(s) [nope] in AutoRollbackConfiguration do not exist. Create them with "
            "PutMetricAlarm, or remove them from DeploymentConfig.AutoRollbackConfiguration.Alarms.");
  EXPECT_EQ(Invalid("UpdateEndpoint", Update("cfg2", Canary(2))),
            "CanarySize 2 instances (100% of 2) must be at most 50% of the new fleet's instance count (2).");
  json no_size = Canary(1);
  no_size["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"].erase("CanarySize");
  EXPECT_EQ(Invalid("UpdateEndpoint", Update("cfg2", no_size)),
            "Traffic routing type CANARY needs BlueGreenUpdatePolicy.TrafficRoutingConfiguration.CanarySize.");
  // The botocore shape: out-of-range waits are refused before any rule.
  json long_wait = Canary(1);
  long_wait["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"]["WaitIntervalInSeconds"] = 3601;
  EXPECT_EQ(Call("UpdateEndpoint", Update("cfg2", long_wait)).type(), "ValidationException");
  json rolling = {{"RollingUpdatePolicy",
                   {{"MaximumBatchSize", {{"Type", "INSTANCE_COUNT"}, {"Value", 1}}}, {"WaitIntervalInSeconds", 0}}}};
  EXPECT_EQ(Invalid("UpdateEndpoint", Update("two", rolling)),
            "RollingUpdatePolicy needs an endpoint with a single production variant, before and after the update; use "
            "a BlueGreenUpdatePolicy for endpoints with several variants.");
  EXPECT_EQ(Ok("DescribeEndpoint", {{"EndpointName", "e"}})["EndpointStatus"], "InService");  // nothing changed

  Ok("UpdateEndpoint", Update("cfg2", Canary(1)));
  json described = Ok("DescribeEndpoint", {{"EndpointName", "e"}});
  EXPECT_EQ(described["EndpointStatus"], "Updating");
  EXPECT_EQ(described["LastDeploymentConfig"], Canary(1));
}

TEST_F(DeploymentConfigApiTest, CreateStoresACheckedConfigForLaterUpdates) {
  json missing = Canary(1);
  missing["AutoRollbackConfiguration"]["Alarms"] = json::array({{{"AlarmName", "gone"}}});
  EXPECT_NE(
      Invalid("CreateEndpoint", {{"EndpointName", "e"}, {"EndpointConfigName", "cfg"}, {"DeploymentConfig", missing}})
          .find("[gone]"),
      std::string::npos);
  Ok("CreateEndpoint",
     {{"EndpointName", "e"}, {"EndpointConfigName", "cfg"}, {"DeploymentConfig", Canary(50, "CAPACITY_PERCENT")}});
  InService("e");
  // RetainDeploymentConfig: the stored one applies, and is checked against the new fleet.
  CreateConfig("one", json::array({Variant("AllTraffic", "m2", 1)}));
  Ok("UpdateEndpoint", {{"EndpointName", "e"}, {"EndpointConfigName", "one"}, {"RetainDeploymentConfig", true}});
  EXPECT_EQ(Ok("DescribeEndpoint", {{"EndpointName", "e"}})["LastDeploymentConfig"], Canary(50, "CAPACITY_PERCENT"));
}

}  // namespace
}  // namespace kiln::api
