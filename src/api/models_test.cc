#include <gtest/gtest.h>

#include "api/inference_test_fixture.h"

namespace kiln::api {
namespace {

using nlohmann::json;
using ModelsApiTest = testing::InferenceApiTest;

TEST_F(ModelsApiTest, CreateDescribeEchoesWithAwsDefaults) {
  json created =
      Ok("CreateModel", {{"ModelName", "My-Model"},
                         {"ExecutionRoleArn", kRole},
                         {"PrimaryContainer", {{"Image", "local:/bin/serve"}, {"ModelDataUrl", "s3://b/m.tar.gz"}}},
                         {"Tags", {{{"Key", "team"}, {"Value", "ml"}}}}});
  EXPECT_EQ(created["ModelArn"], std::string(kArnPrefix) + "model/My-Model");
  json out = Ok("DescribeModel", {{"ModelName", "my-model"}});
  EXPECT_EQ(out["ModelName"], "My-Model");
  EXPECT_EQ(out["ModelArn"], std::string(kArnPrefix) + "model/My-Model");
  EXPECT_DOUBLE_EQ(out["CreationTime"].get<double>(), 1714557600.0);
  EXPECT_EQ(out["ExecutionRoleArn"], kRole);
  EXPECT_EQ(out["EnableNetworkIsolation"], false);
  EXPECT_EQ(out["PrimaryContainer"]["Image"], "local:/bin/serve");
  EXPECT_EQ(out["PrimaryContainer"]["Mode"], "SingleModel");
  EXPECT_EQ(out["PrimaryContainer"]["Environment"], json::object());
  EXPECT_FALSE(out.contains("Tags"));
  EXPECT_FALSE(out.contains("DeploymentRecommendation"));
  json tags = Ok("ListTags", {{"ResourceArn", created["ModelArn"]}});
  ASSERT_EQ(tags["Tags"].size(), 1u);
  EXPECT_EQ(tags["Tags"][0]["Key"], "team");
}

TEST_F(ModelsApiTest, DuplicateNameInAnyCaseIsAwsText) {
  CreateModel("m1");
  EXPECT_EQ(Invalid("CreateModel", {{"ModelName", "M1"}, {"PrimaryContainer", {{"Image", "x"}}}}),
            "Cannot create already existing model \"" + std::string(kArnPrefix) + "model/m1\".");
}

TEST_F(ModelsApiTest, ContainerRules) {
  EXPECT_NE(Invalid("CreateModel", {{"ModelName", "a"}}).find("PrimaryContainer or Containers"), std::string::npos);
  EXPECT_NE(Invalid("CreateModel", {{"ModelName", "a"},
                                    {"PrimaryContainer", {{"Image", "x"}}},
                                    {"Containers", json::array({json{{"Image", "y"}}})}})
                .find("not both"),
            std::string::npos);
  EXPECT_NE(Invalid("CreateModel", {{"ModelName", "a"}, {"Containers", json::array()}}).find("at least one"),
            std::string::npos);
  // Model data needs the role the instance downloads it with (Kiln, §8.3).
  EXPECT_NE(
      Invalid("CreateModel", {{"ModelName", "a"}, {"PrimaryContainer", {{"Image", "x"}, {"ModelDataUrl", "s3://b/k"}}}})
          .find("ExecutionRoleArn is required"),
      std::string::npos);
  EXPECT_NE(Invalid("CreateModel", {{"ModelName", "a"}, {"PrimaryContainer", {{"ModelPackageName", "pkg"}}}})
                .find("ModelPackageName is not supported by Kiln"),
            std::string::npos);
  // No model data: no role needed.
  Ok("CreateModel", {{"ModelName", "a"}, {"PrimaryContainer", {{"Image", "x"}}}});
  Ok("CreateModel",
     {{"ModelName", "b"},
      {"Containers", json::array({json{{"Image", "x"}}, json{{"Image", "y"}, {"Mode", "SingleModel"}}})}});
  json out = Ok("DescribeModel", {{"ModelName", "b"}});
  ASSERT_EQ(out["Containers"].size(), 2u);
  EXPECT_EQ(out["Containers"][1]["Mode"], "SingleModel");
  EXPECT_FALSE(out.contains("PrimaryContainer"));
}

TEST_F(ModelsApiTest, NotFoundTexts) {
  const std::string expected = "Could not find model \"" + std::string(kArnPrefix) + "model/nope\".";
  EXPECT_EQ(Invalid("DescribeModel", {{"ModelName", "nope"}}), expected);
  EXPECT_EQ(Invalid("DeleteModel", {{"ModelName", "nope"}}), expected);
}

TEST_F(ModelsApiTest, DeleteRemovesModelAndTags) {
  CreateModel("gone");
  const std::string arn = std::string(kArnPrefix) + "model/gone";
  Ok("AddTags", {{"ResourceArn", arn}, {"Tags", {{{"Key", "k"}, {"Value", "v"}}}}});
  Ok("DeleteModel", {{"ModelName", "GONE"}});
  Invalid("DescribeModel", {{"ModelName", "gone"}});
  // Tag operations on a deleted model's ARN: not found.
  EXPECT_NE(Invalid("ListTags", {{"ResourceArn", arn}}).find("Could not find resource"), std::string::npos);
  CreateModel("gone");
  EXPECT_TRUE(Ok("ListTags", {{"ResourceArn", arn}})["Tags"].empty());
}

TEST_F(ModelsApiTest, ListSortsFiltersAndPages) {
  for (const char* name : {"b-model", "a-model", "c-other"}) {
    CreateModel(name);
    clock_.now += 1000;
  }
  // Default: CreationTime, Descending.
  json all = Ok("ListModels", json::object());
  ASSERT_EQ(all["Models"].size(), 3u);
  EXPECT_EQ(all["Models"][0]["ModelName"], "c-other");
  EXPECT_EQ(all["Models"][2]["ModelName"], "b-model");
  EXPECT_FALSE(all.contains("NextToken"));
  json by_name = Ok("ListModels", {{"SortBy", "Name"}, {"SortOrder", "Ascending"}});
  EXPECT_EQ(by_name["Models"][0]["ModelName"], "a-model");
  json named = Ok("ListModels", {{"NameContains", "MODEL"}});
  EXPECT_EQ(named["Models"].size(), 2u);
  json times = Ok("ListModels", {{"CreationTimeAfter", 1714557600.5}, {"CreationTimeBefore", 1714557602.0}});
  ASSERT_EQ(times["Models"].size(), 1u);
  EXPECT_EQ(times["Models"][0]["ModelName"], "a-model");

  json first = Ok("ListModels", {{"MaxResults", 2}, {"SortBy", "Name"}});
  ASSERT_EQ(first["Models"].size(), 2u);
  EXPECT_EQ(first["Models"][0]["ModelName"], "c-other");
  ASSERT_TRUE(first.contains("NextToken"));
  json second = Ok("ListModels", {{"MaxResults", 2}, {"SortBy", "Name"}, {"NextToken", first["NextToken"]}});
  ASSERT_EQ(second["Models"].size(), 1u);
  EXPECT_EQ(second["Models"][0]["ModelName"], "a-model");
  EXPECT_FALSE(second.contains("NextToken"));
  // A token reused with other filters is refused.
  EXPECT_EQ(Invalid("ListModels", {{"SortBy", "CreationTime"}, {"NextToken", first["NextToken"]}}),
            "The provided NextToken is invalid.");
}

// Multi-container models (serving-contract.md §8): Direct needs unique hostnames on every
// container, Serial all or none; DescribeModel shows the mode (Serial when not given).
TEST_F(ModelsApiTest, MultiContainerRules) {
  auto containers = [](std::vector<std::string> names) {
    json list = json::array();
    for (const std::string& n : names) {
      json c = {{"Image", "x"}};
      if (!n.empty()) c["ContainerHostname"] = n;
      list.push_back(c);
    }
    return list;
  };
  const json direct = {{"Mode", "Direct"}};
  EXPECT_NE(Invalid("CreateModel",
                    {{"ModelName", "a"}, {"Containers", containers({"one", ""})}, {"InferenceExecutionConfig", direct}})
                .find("Mode Direct needs a ContainerHostname"),
            std::string::npos);
  EXPECT_NE(
      Invalid("CreateModel",
              {{"ModelName", "a"}, {"Containers", containers({"one", "one"})}, {"InferenceExecutionConfig", direct}})
          .find("ContainerHostname one is used by more than one container"),
      std::string::npos);
  EXPECT_NE(Invalid("CreateModel", {{"ModelName", "a"}, {"Containers", containers({"one", ""})}})
                .find("all containers of the inference pipeline have a ContainerHostname or none"),
            std::string::npos);
  EXPECT_NE(Invalid("CreateModel", {{"ModelName", "a"}, {"Containers", containers({"bad_name", "b"})}})
                .find("containerHostname"),
            std::string::npos);
  EXPECT_NE(Invalid("CreateModel",
                    {{"ModelName", "a"}, {"PrimaryContainer", {{"Image", "x"}}}, {"InferenceExecutionConfig", direct}})
                .find("InferenceExecutionConfig applies to models with Containers"),
            std::string::npos);
  std::vector<std::string> sixteen(16, "");
  EXPECT_NE(Invalid("CreateModel", {{"ModelName", "a"}, {"Containers", containers(sixteen)}}).find("15"),
            std::string::npos);
  Ok("CreateModel",
     {{"ModelName", "d"}, {"Containers", containers({"pre", "model"})}, {"InferenceExecutionConfig", direct}});
  Ok("CreateModel", {{"ModelName", "s"}, {"Containers", containers({"", ""})}});
  json d = Ok("DescribeModel", {{"ModelName", "d"}});
  EXPECT_EQ(d["InferenceExecutionConfig"]["Mode"], "Direct");
  ASSERT_EQ(d["Containers"].size(), 2u);
  EXPECT_EQ(d["Containers"][1]["ContainerHostname"], "model");
  EXPECT_EQ(d["Containers"][1]["Mode"], "SingleModel");
  EXPECT_EQ(Ok("DescribeModel", {{"ModelName", "s"}})["InferenceExecutionConfig"]["Mode"], "Serial");
}

}  // namespace

}  // namespace kiln::api
