#include <gtest/gtest.h>

#include "api/inference_test_fixture.h"

namespace kiln::api {
namespace {

using nlohmann::json;
using EndpointConfigsApiTest = testing::InferenceApiTest;

TEST_F(EndpointConfigsApiTest, CreateDescribeFillsAwsDefaults) {
  CreateModel("m");
  json v = Variant("AllTraffic", "m", 2);
  v["RoutingConfig"] = {{"RoutingStrategy", "LEAST_OUTSTANDING_REQUESTS"}};
  json created = Ok("CreateEndpointConfig", {{"EndpointConfigName", "Cfg"},
                                             {"ProductionVariants", json::array({v})},
                                             {"Tags", {{{"Key", "a"}, {"Value", "b"}}}}});
  EXPECT_EQ(created["EndpointConfigArn"], std::string(kArnPrefix) + "endpoint-config/Cfg");
  json out = Ok("DescribeEndpointConfig", {{"EndpointConfigName", "cfg"}});
  EXPECT_EQ(out["EndpointConfigName"], "Cfg");
  EXPECT_EQ(out["EndpointConfigArn"], created["EndpointConfigArn"]);
  EXPECT_DOUBLE_EQ(out["CreationTime"].get<double>(), 1714557600.0);
  ASSERT_EQ(out["ProductionVariants"].size(), 1u);
  const json& variant = out["ProductionVariants"][0];
  EXPECT_DOUBLE_EQ(variant["InitialVariantWeight"].get<double>(), 1.0);
  EXPECT_EQ(variant["InitialInstanceCount"], 2);
  EXPECT_EQ(variant["RoutingConfig"]["RoutingStrategy"], "LEAST_OUTSTANDING_REQUESTS");
  EXPECT_FALSE(out.contains("Tags"));
  EXPECT_EQ(Ok("ListTags", {{"ResourceArn", created["EndpointConfigArn"]}})["Tags"].size(), 1u);
}

TEST_F(EndpointConfigsApiTest, RefusesWhatKilnCannotRun) {
  CreateModel("m");
  EXPECT_EQ(Invalid("CreateEndpointConfig",
                    {{"EndpointConfigName", "c"}, {"ProductionVariants", json::array({Variant("v", "missing")})}}),
            "Could not find model \"" + std::string(kArnPrefix) + "model/missing\".");
  json async = {{"EndpointConfigName", "c"},
                {"ProductionVariants", json::array({Variant("v", "m")})},
                {"AsyncInferenceConfig", {{"OutputConfig", {{"S3FailurePath", "s3://b/o"}}}}}};
  EXPECT_NE(Invalid("CreateEndpointConfig", async).find("S3OutputPath is required"), std::string::npos);
  async["AsyncInferenceConfig"]["OutputConfig"]["S3OutputPath"] = "https://example.com/b/o";
  EXPECT_NE(Invalid("CreateEndpointConfig", async).find("must be an S3 URI"), std::string::npos);
  json no_type = {{"VariantName", "v"}, {"ModelName", "m"}, {"InitialInstanceCount", 1}};
  EXPECT_NE(
      Invalid("CreateEndpointConfig", {{"EndpointConfigName", "c"}, {"ProductionVariants", json::array({no_type})}})
          .find("needs InstanceType and InitialInstanceCount, or a ServerlessConfig"),
      std::string::npos);
  json gpu = Variant("v", "m");
  gpu["InstanceType"] = "ml.g5.xlarge";  // valid for AWS, not in this server's catalog
  EXPECT_NE(Invalid("CreateEndpointConfig", {{"EndpointConfigName", "c"}, {"ProductionVariants", json::array({gpu})}})
                .find("ml.g5.xlarge"),
            std::string::npos);
  EXPECT_NE(
      Invalid("CreateEndpointConfig", {{"EndpointConfigName", "c"},
                                       {"ProductionVariants", json::array({Variant("v", "m"), Variant("V", "m")})}})
          .find("unique"),
      std::string::npos);
  Ok("CreateModel",
     {{"ModelName", "multi"}, {"Containers", json::array({json{{"Image", "x"}}, json{{"Image", "y"}}})}});
  // Multi-container models (serving-contract.md §8) run on instances; serverless variants and
  // multi-model containers inside them are refused.
  Ok("CreateEndpointConfig",
     {{"EndpointConfigName", "multi-ok"}, {"ProductionVariants", json::array({Variant("v", "multi")})}});
  Ok("DeleteEndpointConfig", {{"EndpointConfigName", "multi-ok"}});
  json serverless_multi = {{"VariantName", "v"},
                           {"ModelName", "multi"},
                           {"ServerlessConfig", {{"MemorySizeInMB", 1024}, {"MaxConcurrency", 1}}}};
  EXPECT_NE(Invalid("CreateEndpointConfig",
                    {{"EndpointConfigName", "c"}, {"ProductionVariants", json::array({serverless_multi})}})
                .find("does not support multi-container endpoints or inference pipelines"),
            std::string::npos);
  json async_multi = {{"EndpointConfigName", "c"},
                      {"ProductionVariants", json::array({Variant("v", "multi")})},
                      {"AsyncInferenceConfig", {{"OutputConfig", {{"S3OutputPath", "s3://b/o"}}}}}};
  EXPECT_NE(Invalid("CreateEndpointConfig", async_multi).find("for asynchronous inference yet"), std::string::npos);
  json shadow_multi = {{"EndpointConfigName", "c"},
                       {"ProductionVariants", json::array({Variant("v", "m")})},
                       {"ShadowProductionVariants", json::array({Variant("s", "multi")})}};
  EXPECT_NE(Invalid("CreateEndpointConfig", shadow_multi).find("as shadow variants yet"), std::string::npos);
  Ok("CreateModel",
     {{"ModelName", "multi-mme"},
      {"Containers", json::array({json{{"Image", "x"}, {"Mode", "MultiModel"}}, json{{"Image", "y"}}})}});
  EXPECT_NE(Invalid("CreateEndpointConfig",
                    {{"EndpointConfigName", "c"}, {"ProductionVariants", json::array({Variant("v", "multi-mme")})}})
                .find("one of them with Mode MultiModel"),
            std::string::npos);
  // Multi-model (serving-contract.md §7): ModelDataUrl is the prefix TargetModel is relative to;
  // real-time only.
  Ok("CreateModel", {{"ModelName", "mme"}, {"PrimaryContainer", {{"Image", "x"}, {"Mode", "MultiModel"}}}});
  EXPECT_NE(Invalid("CreateEndpointConfig",
                    {{"EndpointConfigName", "c"}, {"ProductionVariants", json::array({Variant("v", "mme")})}})
                .find("its ModelDataUrl must be the S3 prefix"),
            std::string::npos);
  Ok("CreateModel", {{"ModelName", "mme2"},
                     {"ExecutionRoleArn", "arn:aws:iam::123456789012:role/r"},
                     {"PrimaryContainer",
                      {{"Image", "x"},
                       {"Mode", "MultiModel"},
                       {"ModelDataUrl", "s3://b/models/"},
                       {"MultiModelConfig", {{"ModelCacheSetting", "Disabled"}}}}}});
  EXPECT_NE(Invalid("CreateEndpointConfig",
                    {{"EndpointConfigName", "c"},
                     {"ProductionVariants",
                      json::array({json{{"VariantName", "v"},
                                        {"ModelName", "mme2"},
                                        {"ServerlessConfig", {{"MemorySizeInMB", 1024}, {"MaxConcurrency", 1}}}}})}})
                .find("does not support multi-model endpoints"),
            std::string::npos);
  EXPECT_NE(
      Invalid("CreateEndpointConfig", {{"EndpointConfigName", "c"},
                                       {"ProductionVariants", json::array({Variant("v", "mme2")})},
                                       {"AsyncInferenceConfig", {{"OutputConfig", {{"S3OutputPath", "s3://b/out/"}}}}}})
          .find("asynchronous inference endpoints do not support multi-model endpoints"),
      std::string::npos);
  // Nothing was created by the refused requests.
  EXPECT_TRUE(Ok("ListEndpointConfigs", json::object())["EndpointConfigs"].empty());
  Ok("CreateEndpointConfig",
     {{"EndpointConfigName", "mme-ok"}, {"ProductionVariants", json::array({Variant("v", "mme2")})}});
}

// serving-contract.md §12: ServerlessConfig instead of InstanceType/InitialInstanceCount, alone
// in its configuration, on a model without VPC or network isolation.
TEST_F(EndpointConfigsApiTest, ServerlessVariants) {
  CreateModel("m");
  auto serverless = [](json config) {
    return json{{"VariantName", "v"}, {"ModelName", "m"}, {"ServerlessConfig", std::move(config)}};
  };
  auto create = [](json variants, json extra = json::object()) {
    json in = {{"EndpointConfigName", "c"}, {"ProductionVariants", std::move(variants)}};
    in.update(extra);
    return in;
  };
  auto refused = [&](const json& in, const std::string& text) {
    const std::string message = Invalid("CreateEndpointConfig", in);
    EXPECT_NE(message.find(text), std::string::npos) << message;
  };
  refused(create(json::array({serverless({{"MemorySizeInMB", 1500}, {"MaxConcurrency", 1}})})),
          "Invalid MemorySizeInMB 1500 for production variant v. Valid values are 1024, 2048");
  refused(create(json::array(
              {serverless({{"MemorySizeInMB", 2048}, {"MaxConcurrency", 2}, {"ProvisionedConcurrency", 3}})})),
          "ProvisionedConcurrency (3) must be less than or equal to MaxConcurrency (2)");
  json typed = serverless({{"MemorySizeInMB", 2048}, {"MaxConcurrency", 2}});
  typed["InstanceType"] = "ml.m5.large";
  refused(create(json::array({typed})), "has both ServerlessConfig and InstanceType");
  json good = serverless({{"MemorySizeInMB", 2048}, {"MaxConcurrency", 2}});
  refused(create(json::array({good, Variant("w", "m")})), "must have exactly one production variant; 2 were given");
  refused(create(json::array({good}), {{"DataCaptureConfig",
                                        {{"InitialSamplingPercentage", 10},
                                         {"DestinationS3Uri", "s3://b/c"},
                                         {"CaptureOptions", json::array({json{{"CaptureMode", "Input"}}})}}}}),
          "DataCaptureConfig is not supported for serverless endpoints");
  refused(create(json::array({good}), {{"AsyncInferenceConfig", {{"OutputConfig", {{"S3OutputPath", "s3://b/o"}}}}}}),
          "Asynchronous inference is not supported with serverless production variants");
  Ok("CreateModel", {{"ModelName", "isolated"},
                     {"ExecutionRoleArn", kRole},
                     {"EnableNetworkIsolation", true},
                     {"PrimaryContainer", {{"Image", "x"}}}});
  json isolated = good;
  isolated["ModelName"] = "isolated";
  refused(create(json::array({isolated})), "serverless endpoints do not support network isolation");
  Ok("CreateModel",
     {{"ModelName", "vpc"},
      {"ExecutionRoleArn", kRole},
      {"VpcConfig", {{"SecurityGroupIds", json::array({"sg-1"})}, {"Subnets", json::array({"subnet-1"})}}},
      {"PrimaryContainer", {{"Image", "x"}}}});
  json vpc = good;
  vpc["ModelName"] = "vpc";
  refused(create(json::array({vpc})), "serverless endpoints do not support VPC configurations");
  EXPECT_TRUE(Ok("ListEndpointConfigs", json::object())["EndpointConfigs"].empty());

  json provisioned = serverless({{"MemorySizeInMB", 1024}, {"MaxConcurrency", 5}, {"ProvisionedConcurrency", 1}});
  Ok("CreateEndpointConfig", create(json::array({provisioned})));
  json out = Ok("DescribeEndpointConfig", {{"EndpointConfigName", "c"}});
  EXPECT_EQ(out["ProductionVariants"][0]["ServerlessConfig"]["MaxConcurrency"], 5);
  EXPECT_FALSE(out["ProductionVariants"][0].contains("InstanceType"));
}

TEST_F(EndpointConfigsApiTest, AsyncInferenceConfigIsKeptAndEchoed) {
  CreateModel("m");
  json config = {{"ClientConfig", {{"MaxConcurrentInvocationsPerInstance", 2}}},
                 {"OutputConfig",
                  {{"S3OutputPath", "s3://b/async/out"},
                   {"S3FailurePath", "s3://b/async/err/"},
                   {"NotificationConfig",
                    {{"SuccessTopic", "arn:aws:sns:us-east-1:123456789012:ok"},
                     {"IncludeInferenceResponseIn", json::array({"SUCCESS_NOTIFICATION_TOPIC"})}}}}}};
  Ok("CreateEndpointConfig", {{"EndpointConfigName", "async"},
                              {"ProductionVariants", json::array({Variant("v", "m")})},
                              {"AsyncInferenceConfig", config}});
  EXPECT_EQ(Ok("DescribeEndpointConfig", {{"EndpointConfigName", "async"}})["AsyncInferenceConfig"], config);
  json too_many = config;
  too_many["ClientConfig"]["MaxConcurrentInvocationsPerInstance"] = 1001;
  EXPECT_FALSE(Invalid("CreateEndpointConfig", {{"EndpointConfigName", "async2"},
                                                {"ProductionVariants", json::array({Variant("v", "m")})},
                                                {"AsyncInferenceConfig", too_many}})
                   .empty());
}

TEST_F(EndpointConfigsApiTest, DuplicateAndNotFoundTexts) {
  CreateModel("m");
  CreateConfig("c1", json::array({Variant("v", "m")}));
  EXPECT_EQ(
      Invalid("CreateEndpointConfig",
              {{"EndpointConfigName", "C1"}, {"ProductionVariants", json::array({Variant("v", "m")})}}),
      "Cannot create already existing endpoint configuration \"" + std::string(kArnPrefix) + "endpoint-config/c1\".");
  const std::string missing =
      "Could not find endpoint configuration \"" + std::string(kArnPrefix) + "endpoint-config/x\".";
  EXPECT_EQ(Invalid("DescribeEndpointConfig", {{"EndpointConfigName", "x"}}), missing);
  EXPECT_EQ(Invalid("DeleteEndpointConfig", {{"EndpointConfigName", "x"}}), missing);
  // Deleting the model does not change the configuration (deployments copy what they use).
  Ok("DeleteModel", {{"ModelName", "m"}});
  Ok("DescribeEndpointConfig", {{"EndpointConfigName", "c1"}});
  Ok("DeleteEndpointConfig", {{"EndpointConfigName", "C1"}});
  EXPECT_EQ(Invalid("DescribeEndpointConfig", {{"EndpointConfigName", "c1"}}),
            "Could not find endpoint configuration \"" + std::string(kArnPrefix) + "endpoint-config/c1\".");
}

TEST_F(EndpointConfigsApiTest, ListSortsAndPages) {
  CreateModel("m");
  for (const char* name : {"beta", "alpha", "gamma"}) {
    CreateConfig(name, json::array({Variant("v", "m")}));
    clock_.now += 10;
  }
  json all = Ok("ListEndpointConfigs", json::object());
  ASSERT_EQ(all["EndpointConfigs"].size(), 3u);
  EXPECT_EQ(all["EndpointConfigs"][0]["EndpointConfigName"], "gamma");  // newest first
  json page = Ok("ListEndpointConfigs", {{"SortBy", "Name"}, {"SortOrder", "Ascending"}, {"MaxResults", 1}});
  EXPECT_EQ(page["EndpointConfigs"][0]["EndpointConfigName"], "alpha");
  std::vector<std::string> names;
  json request = {{"SortBy", "Name"}, {"SortOrder", "Ascending"}, {"MaxResults", 1}};
  while (true) {
    json out = Ok("ListEndpointConfigs", request);
    for (const json& c : out["EndpointConfigs"]) names.push_back(c["EndpointConfigName"]);
    if (!out.contains("NextToken")) break;
    request["NextToken"] = out["NextToken"];
  }
  EXPECT_EQ(names, (std::vector<std::string>{"alpha", "beta", "gamma"}));
}

}  // namespace
}  // namespace kiln::api
