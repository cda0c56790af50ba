// CreateEndpointConfig's DataCaptureConfig and ShadowProductionVariants (serving-contract.md §14,
// §9), and how CreateEndpoint / DescribeEndpoint carry them.
#include <gtest/gtest.h>

#include "api/inference_test_fixture.h"
#include "store/endpoint_repository.h"

namespace kiln::api {
namespace {

using nlohmann::json;

class ShadowAndCaptureApiTest : public testing::InferenceApiTest {
 protected:
  void SetUp() override {
    InferenceApiTest::SetUp();
    CreateModel("prod", "local:/bin/prod");
    CreateModel("shadow", "local:/bin/shadow");
  }
  static json Capture() {
    return {{"InitialSamplingPercentage", 25},
            {"DestinationS3Uri", "s3://bkt/capture"},
            {"CaptureOptions", json::array({json{{"CaptureMode", "Input"}}, json{{"CaptureMode", "Output"}}})},
            {"CaptureContentTypeHeader", {{"CsvContentTypes", json::array({"text/csv"})}}}};
  }
  json Config(json extra) {
    json in = {{"EndpointConfigName", "c"}, {"ProductionVariants", json::array({Variant("Prod", "prod")})}};
    in.update(extra);
    return in;
  }
  std::string Refused(const json& in) { return Invalid("CreateEndpointConfig", in); }
};

TEST_F(ShadowAndCaptureApiTest, DataCaptureConfigIsAcceptedAndChecked) {
  json created = Ok("CreateEndpointConfig", Config({{"DataCaptureConfig", Capture()}}));
  EXPECT_EQ(Ok("DescribeEndpointConfig", {{"EndpointConfigName", "c"}})["DataCaptureConfig"], Capture());

  json https = Capture();
  https["DestinationS3Uri"] = "https://example.com/capture";
  EXPECT_NE(Refused(Config({{"EndpointConfigName", "d"}, {"DataCaptureConfig", https}})).find("must be an S3 URI"),
            std::string::npos);
  json kms = Capture();
  kms["KmsKeyId"] = "alias/key";
  EXPECT_NE(Refused(Config({{"EndpointConfigName", "d"}, {"DataCaptureConfig", kms}})).find("KmsKeyId"),
            std::string::npos);
  json over = Capture();
  over["InitialSamplingPercentage"] = 101;  // the botocore model's range
  EXPECT_NE(Refused(Config({{"EndpointConfigName", "d"}, {"DataCaptureConfig", over}})).find("100"), std::string::npos);
  json no_options = Capture();
  no_options["CaptureOptions"] = json::array();
  Refused(Config({{"EndpointConfigName", "d"}, {"DataCaptureConfig", no_options}}));
  json async = Config({{"EndpointConfigName", "d"},
                       {"DataCaptureConfig", Capture()},
                       {"AsyncInferenceConfig", {{"OutputConfig", {{"S3OutputPath", "s3://b/o"}}}}}});
  EXPECT_NE(Refused(async).find("asynchronous inference endpoints"), std::string::npos);
}

TEST_F(ShadowAndCaptureApiTest, ShadowVariantsAreOneBesideOneProductionVariant) {
  Ok("CreateEndpointConfig", Config({{"ShadowProductionVariants", json::array({Variant("Shadow", "shadow")})}}));
  auto refused = [&](json in, const std::string& text) {
    const std::string message = Refused(in);
    EXPECT_NE(message.find(text), std::string::npos) << message;
  };
  json two =
      Config({{"EndpointConfigName", "d"}, {"ShadowProductionVariants", json::array({Variant("Shadow", "shadow")})}});
  two["ProductionVariants"].push_back(Variant("Other", "prod"));
  refused(two, "exactly one production variant and one shadow variant; 2 production and 1 shadow");
  refused(Config({{"EndpointConfigName", "d"},
                  {"ShadowProductionVariants", json::array({Variant("S1", "shadow"), Variant("S2", "shadow")})}}),
          "1 production and 2 shadow");
  refused(Config({{"EndpointConfigName", "d"}, {"ShadowProductionVariants", json::array({Variant("prod", "shadow")})}}),
          "unique");
  refused(Config({{"EndpointConfigName", "d"}, {"ShadowProductionVariants", json::array({Variant("S", "missing")})}}),
          "Could not find model");
  json odd_type = Variant("S", "shadow");
  odd_type["InstanceType"] = "ml.g5.xlarge";
  refused(Config({{"EndpointConfigName", "d"}, {"ShadowProductionVariants", json::array({odd_type})}}), "ml.g5.xlarge");
  refused(Config({{"EndpointConfigName", "d"},
                  {"ShadowProductionVariants", json::array({Variant("S", "shadow")})},
                  {"AsyncInferenceConfig", {{"OutputConfig", {{"S3OutputPath", "s3://b/o"}}}}}}),
          "do not support ShadowProductionVariants");
}

TEST_F(ShadowAndCaptureApiTest, EndpointCarriesTheShadowModelAndDescribesBoth) {
  Ok("CreateEndpointConfig", Config({{"ShadowProductionVariants", json::array({Variant("Shadow", "shadow", 2)})},
                                     {"DataCaptureConfig", Capture()}}));
  Ok("CreateEndpoint", {{"EndpointName", "ep"}, {"EndpointConfigName", "c"}});
  store::EndpointRepository repo(db_.get());
  auto row = repo.Get("ep");
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->deployment.VariantNames(), std::vector<std::string>{"Prod"});
  EXPECT_EQ(row->deployment.ShadowVariantNames(), std::vector<std::string>{"Shadow"});
  EXPECT_EQ(row->deployment.AllVariantNames(), (std::vector<std::string>{"Prod", "Shadow"}));
  ASSERT_NE(row->deployment.FindVariant("Shadow"), nullptr);
  EXPECT_EQ((*row->deployment.FindVariant("Shadow"))["InitialInstanceCount"], 2);
  EXPECT_EQ(row->deployment.Model("shadow")["PrimaryContainer"]["Image"], "local:/bin/shadow");

  // What the controller writes once both variants run: Describe shows the shadow apart.
  ASSERT_TRUE(repo.Mutate("ep",
                          [](store::EndpointRecord& e) {
                            e.status = store::EndpointStatus::kInService;
                            for (const std::string& v : e.deployment.AllVariantNames()) {
                              store::VariantSummary& summary = e.state.production_variants.emplace_back();
                              summary.variant_name = v;
                              summary.current_weight = summary.desired_weight = 1;
                              summary.current_instance_count = summary.desired_instance_count = v == "Shadow" ? 2 : 1;
                            }
                            return Status::Ok();
                          })
                  .ok());
  json out = Ok("DescribeEndpoint", {{"EndpointName", "ep"}});
  ASSERT_EQ(out["ProductionVariants"].size(), 1u);
  EXPECT_EQ(out["ProductionVariants"][0]["VariantName"], "Prod");
  ASSERT_EQ(out["ShadowProductionVariants"].size(), 1u);
  EXPECT_EQ(out["ShadowProductionVariants"][0]["VariantName"], "Shadow");
  EXPECT_EQ(out["ShadowProductionVariants"][0]["CurrentInstanceCount"], 2);
  EXPECT_EQ(out["DataCaptureConfig"], json({{"EnableCapture", true},
                                            {"CaptureStatus", "Started"},
                                            {"CurrentSamplingPercentage", 25},
                                            {"DestinationS3Uri", "s3://bkt/capture"}}));
  // The shadow is not a production variant for UpdateEndpointWeightsAndCapacities.
  EXPECT_NE(
      Invalid("UpdateEndpointWeightsAndCapacities",
              {{"EndpointName", "ep"},
               {"DesiredWeightsAndCapacities", json::array({json{{"VariantName", "Shadow"}, {"DesiredWeight", 1}}})}})
          .find("no production variant named Shadow"),
      std::string::npos);
}

TEST_F(ShadowAndCaptureApiTest, DisabledCaptureIsStopped) {
  json capture = Capture();
  capture["EnableCapture"] = false;
  Ok("CreateEndpointConfig", Config({{"DataCaptureConfig", capture}}));
  Ok("CreateEndpoint", {{"EndpointName", "ep"}, {"EndpointConfigName", "c"}});
  json summary = Ok("DescribeEndpoint", {{"EndpointName", "ep"}})["DataCaptureConfig"];
  EXPECT_EQ(summary["EnableCapture"], false);
  EXPECT_EQ(summary["CaptureStatus"], "Stopped");
}

}  // namespace
}  // namespace kiln::api
