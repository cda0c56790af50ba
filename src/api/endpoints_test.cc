#include <gtest/gtest.h>

#include "api/inference_test_fixture.h"
#include "store/endpoint_repository.h"

namespace kiln::api {
namespace {

using nlohmann::json;

class EndpointsApiTest : public testing::InferenceApiTest {
 protected:
  void SetUp() override {
    InferenceApiTest::SetUp();
    CreateModel("m1", "local:/bin/one");
    CreateModel("m2", "local:/bin/two");
    json a = Variant("A", "m1", 2);
    a["InitialVariantWeight"] = 0.7;
    json b = Variant("B", "m2", 1);
    b["InitialVariantWeight"] = 0.3;
    CreateConfig("cfg", json::array({a, b}));
    json a2 = Variant("A", "m2", 3);
    a2["InitialVariantWeight"] = 0.5;
    CreateConfig("cfg2", json::array({a2, Variant("C", "m1", 1)}));
  }
  // What the controller does when the fleet is healthy: status InService and AWS-shaped variants.
  void MarkInService(const std::string& name) {
    store::EndpointRepository repo(db_.get());
    auto r = repo.Mutate(name, [](store::EndpointRecord& e) {
      e.status = store::EndpointStatus::kInService;
      if (e.pending) {
        e.deployment = *e.pending;
        e.pending.reset();
        e.config_name = e.deployment.config_name;
      }
      e.state.production_variants.clear();
      for (const std::string& v : e.deployment.VariantNames()) {
        store::VariantSummary& summary = e.state.production_variants.emplace_back();
        summary.variant_name = v;
        summary.current_weight = summary.desired_weight = 0.1;
        summary.current_instance_count = summary.desired_instance_count = 9;
      }
      return Status::Ok();
    });
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  // A row's documents as JSON (store::ToJson), the form these tests state expectations in.
  struct RowView {
    std::string status;
    std::string config_name;
    int64_t last_modified_millis = 0;
    json request, deployment, pending, desired;
  };
  RowView Row(const std::string& name) {
    store::EndpointRepository repo(db_.get());
    auto r = repo.Get(name);
    EXPECT_TRUE(r.ok());
    if (!r.ok()) return {};
    return {.status = std::string(store::ToString(r->status)),
            .config_name = r->config_name,
            .last_modified_millis = r->last_modified_millis,
            .request = r->request,
            .deployment = store::ToJson(r->deployment),
            .pending = r->pending ? store::ToJson(*r->pending) : json(),
            .desired = store::ToJson(r->desired)};
  }
  std::string EndpointArn(const std::string& name) { return std::string(kArnPrefix) + "endpoint/" + name; }
};

TEST_F(EndpointsApiTest, CreateWritesTheDeploymentAndNotifies) {
  json created =
      Ok("CreateEndpoint",
         {{"EndpointName", "Ep"}, {"EndpointConfigName", "CFG"}, {"Tags", {{{"Key", "k"}, {"Value", "v"}}}}});
  EXPECT_EQ(created["EndpointArn"], EndpointArn("Ep"));
  EXPECT_EQ(notifier_.calls(), std::vector<std::string>{"Ep"});
  RowView row = Row("ep");
  EXPECT_EQ(row.status, "Creating");
  EXPECT_EQ(row.config_name, "cfg");
  EXPECT_EQ(row.deployment["EndpointConfigName"], "cfg");
  EXPECT_EQ(row.deployment["EndpointConfig"]["ProductionVariants"].size(), 2u);
  EXPECT_EQ(row.deployment["Models"]["m1"]["PrimaryContainer"]["Image"], "local:/bin/one");
  EXPECT_EQ(row.deployment["Models"]["m2"]["PrimaryContainer"]["Image"], "local:/bin/two");
  EXPECT_EQ(row.deployment["DeployedMillis"], clock_.now);
  EXPECT_DOUBLE_EQ(row.desired["A"]["DesiredWeight"].get<double>(), 0.7);
  EXPECT_EQ(row.desired["A"]["DesiredInstanceCount"], 2);
  EXPECT_EQ(row.desired["B"]["DesiredInstanceCount"], 1);
  EXPECT_TRUE(row.pending.is_null());
  EXPECT_FALSE(row.request.contains("Tags"));
  EXPECT_EQ(Ok("ListTags", {{"ResourceArn", EndpointArn("ep")}})["Tags"].size(), 1u);

  // Describe while Creating: no ProductionVariants yet (AWS omits them).
  json out = Ok("DescribeEndpoint", {{"EndpointName", "EP"}});
  EXPECT_EQ(out["EndpointName"], "Ep");
  EXPECT_EQ(out["EndpointStatus"], "Creating");
  EXPECT_EQ(out["EndpointConfigName"], "cfg");
  EXPECT_FALSE(out.contains("ProductionVariants"));
  EXPECT_FALSE(out.contains("FailureReason"));
  EXPECT_FALSE(out.contains("PendingDeploymentSummary"));
  EXPECT_DOUBLE_EQ(out["LastModifiedTime"].get<double>(), 1714557600.0);
}

TEST_F(EndpointsApiTest, CreateErrorsAreAwsTexts) {
  EXPECT_EQ(Invalid("CreateEndpoint", {{"EndpointName", "e"}, {"EndpointConfigName", "nope"}}),
            "Could not find endpoint configuration \"" + std::string(kArnPrefix) + "endpoint-config/nope\".");
  Ok("CreateEndpoint", {{"EndpointName", "e"}, {"EndpointConfigName", "cfg"}});
  EXPECT_EQ(Invalid("CreateEndpoint", {{"EndpointName", "E"}, {"EndpointConfigName", "cfg"}}),
            "Cannot create already existing endpoint \"" + EndpointArn("e") + "\".");
  // A model deleted after the configuration was created.
  Ok("DeleteModel", {{"ModelName", "m2"}});
  EXPECT_EQ(Invalid("CreateEndpoint", {{"EndpointName", "f"}, {"EndpointConfigName", "cfg"}}),
            "Could not find model \"" + std::string(kArnPrefix) + "model/m2\".");
  // The existing endpoint keeps its copy.
  EXPECT_EQ(Row("e").deployment["Models"]["m2"]["PrimaryContainer"]["Image"], "local:/bin/two");
  const std::string missing = "Could not find endpoint \"" + EndpointArn("zz") + "\".";
  EXPECT_EQ(Invalid("DescribeEndpoint", {{"EndpointName", "zz"}}), missing);
  EXPECT_EQ(Invalid("DeleteEndpoint", {{"EndpointName", "zz"}}), missing);
  EXPECT_EQ(Invalid("UpdateEndpoint", {{"EndpointName", "zz"}, {"EndpointConfigName", "cfg"}}), missing);
  EXPECT_EQ(Invalid("UpdateEndpointWeightsAndCapacities",
                    {{"EndpointName", "zz"},
                     {"DesiredWeightsAndCapacities", {{{"VariantName", "A"}, {"DesiredWeight", 1}}}}}),
            missing);
  EXPECT_EQ(notifier_.calls().size(), 1u);
}

TEST_F(EndpointsApiTest, UpdatesOnlyFromInService) {
  Ok("CreateEndpoint", {{"EndpointName", "e"}, {"EndpointConfigName", "cfg"}});
  const std::string busy = "Cannot update in-progress endpoint \"" + EndpointArn("e") + "\".";
  EXPECT_EQ(Invalid("UpdateEndpoint", {{"EndpointName", "e"}, {"EndpointConfigName", "cfg2"}}), busy);
  EXPECT_EQ(
      Invalid("UpdateEndpointWeightsAndCapacities",
              {{"EndpointName", "e"}, {"DesiredWeightsAndCapacities", {{{"VariantName", "A"}, {"DesiredWeight", 1}}}}}),
      busy);
  store::EndpointRepository repo(db_.get());
  ASSERT_TRUE(repo.Mutate("e",
                          [](store::EndpointRecord& r) {
                            r.status = store::EndpointStatus::kFailed;
                            r.failure_reason = "boom";
                            return Status::Ok();
                          })
                  .ok());
  EXPECT_NE(Invalid("UpdateEndpoint", {{"EndpointName", "e"}, {"EndpointConfigName", "cfg2"}}).find("failed endpoint"),
            std::string::npos);
  EXPECT_EQ(Ok("DescribeEndpoint", {{"EndpointName", "e"}})["FailureReason"], "boom");
  EXPECT_EQ(notifier_.calls().size(), 1u);
}

TEST_F(EndpointsApiTest, UpdateEndpointSetsPendingAndDesired) {
  Ok("CreateEndpoint", {{"EndpointName", "e"}, {"EndpointConfigName", "cfg"}});
  MarkInService("e");
  EXPECT_EQ(Invalid("UpdateEndpoint", {{"EndpointName", "e"}, {"EndpointConfigName", "nope"}}),
            "Could not find endpoint configuration \"" + std::string(kArnPrefix) + "endpoint-config/nope\".");
  clock_.now += 5000;
  json updated = Ok("UpdateEndpoint", {{"EndpointName", "e"}, {"EndpointConfigName", "cfg2"}});
  EXPECT_EQ(updated["EndpointArn"], EndpointArn("e"));
  EXPECT_EQ(notifier_.calls(), (std::vector<std::string>{"e", "e"}));
  RowView row = Row("e");
  EXPECT_EQ(row.status, "Updating");
  EXPECT_EQ(row.config_name, "cfg");  // still the deployed one
  EXPECT_EQ(row.pending["EndpointConfigName"], "cfg2");
  EXPECT_DOUBLE_EQ(row.desired["A"]["DesiredWeight"].get<double>(), 0.5);
  EXPECT_EQ(row.desired["A"]["DesiredInstanceCount"], 3);
  EXPECT_FALSE(row.desired.contains("B"));
  EXPECT_DOUBLE_EQ(row.desired["C"]["DesiredWeight"].get<double>(), 1.0);

  json out = Ok("DescribeEndpoint", {{"EndpointName", "e"}});
  EXPECT_EQ(out["EndpointStatus"], "Updating");
  EXPECT_EQ(out["EndpointConfigName"], "cfg");
  const json& pending = out["PendingDeploymentSummary"];
  EXPECT_EQ(pending["EndpointConfigName"], "cfg2");
  EXPECT_DOUBLE_EQ(pending["StartTime"].get<double>(), 1714557605.0);
  ASSERT_EQ(pending["ProductionVariants"].size(), 2u);
  EXPECT_EQ(pending["ProductionVariants"][0]["VariantName"], "A");
  EXPECT_EQ(pending["ProductionVariants"][0]["DesiredInstanceCount"], 3);
  EXPECT_EQ(pending["ProductionVariants"][0]["InstanceType"], "ml.m5.large");
  // The current fleet's variants as the controller reports them.
  ASSERT_EQ(out["ProductionVariants"].size(), 2u);
  EXPECT_EQ(out["ProductionVariants"][0]["CurrentInstanceCount"], 9);
}

TEST_F(EndpointsApiTest, RetainAllVariantPropertiesKeepsCurrentValues) {
  Ok("CreateEndpoint", {{"EndpointName", "e"}, {"EndpointConfigName", "cfg"}});
  MarkInService("e");
  Ok("UpdateEndpoint", {{"EndpointName", "e"},
                        {"EndpointConfigName", "cfg2"},
                        {"RetainAllVariantProperties", true},
                        {"ExcludeRetainedVariantProperties", {{{"VariantPropertyType", "DesiredInstanceCount"}}}}});
  RowView row = Row("e");
  EXPECT_DOUBLE_EQ(row.desired["A"]["DesiredWeight"].get<double>(), 0.7);  // retained
  EXPECT_EQ(row.desired["A"]["DesiredInstanceCount"], 3);                  // excluded: the new config's
  EXPECT_EQ(row.desired["C"]["DesiredInstanceCount"], 1);                  // only in the new config
}

TEST_F(EndpointsApiTest, WeightsAndCapacities) {
  Ok("CreateEndpoint", {{"EndpointName", "e"}, {"EndpointConfigName", "cfg"}});
  MarkInService("e");
  EXPECT_NE(Invalid("UpdateEndpointWeightsAndCapacities",
                    {{"EndpointName", "e"},
                     {"DesiredWeightsAndCapacities",
                      {{{"VariantName", "A"}, {"DesiredWeight", 1}}, {{"VariantName", "Nope"}, {"DesiredWeight", 1}}}}})
                .find("Nope"),
            std::string::npos);
  EXPECT_NE(Invalid("UpdateEndpointWeightsAndCapacities",
                    {{"EndpointName", "e"},
                     {"DesiredWeightsAndCapacities", {{{"VariantName", "A"}, {"DesiredInstanceCount", 0}}}}})
                .find("DesiredInstanceCount 0"),
            std::string::npos);
  EXPECT_EQ(Row("e").status, "InService");  // refused requests change nothing
  clock_.now += 1000;
  Ok("UpdateEndpointWeightsAndCapacities",
     {{"EndpointName", "e"},
      {"DesiredWeightsAndCapacities",
       {{{"VariantName", "A"}, {"DesiredWeight", 0.2}}, {{"VariantName", "B"}, {"DesiredInstanceCount", 4}}}}});
  RowView row = Row("e");
  EXPECT_EQ(row.status, "Updating");
  EXPECT_EQ(row.last_modified_millis, clock_.now);
  EXPECT_DOUBLE_EQ(row.desired["A"]["DesiredWeight"].get<double>(), 0.2);
  EXPECT_EQ(row.desired["A"]["DesiredInstanceCount"], 2);  // untouched
  EXPECT_EQ(row.desired["B"]["DesiredInstanceCount"], 4);
  // Describe: the API's desired values win over the controller's copy.
  json out = Ok("DescribeEndpoint", {{"EndpointName", "e"}});
  EXPECT_DOUBLE_EQ(out["ProductionVariants"][0]["DesiredWeight"].get<double>(), 0.2);
  EXPECT_EQ(out["ProductionVariants"][1]["DesiredInstanceCount"], 4);
  EXPECT_EQ(out["ProductionVariants"][0]["CurrentInstanceCount"], 9);
  EXPECT_EQ(notifier_.calls().size(), 2u);
}

// serving-contract.md §12: ServerlessUpdateConfig changes a serverless variant's MaxConcurrency
// and ProvisionedConcurrency (overriding its configuration's), and nothing else's.
TEST_F(EndpointsApiTest, ServerlessUpdateConfig) {
  CreateConfig("sls",
               json::array({json{{"VariantName", "S"},
                                 {"ModelName", "m1"},
                                 {"ServerlessConfig",
                                  {{"MemorySizeInMB", 2048}, {"MaxConcurrency", 4}, {"ProvisionedConcurrency", 1}}}}}));
  Ok("CreateEndpoint", {{"EndpointName", "s"}, {"EndpointConfigName", "sls"}});
  Ok("CreateEndpoint", {{"EndpointName", "e"}, {"EndpointConfigName", "cfg"}});
  MarkInService("s");
  MarkInService("e");
  auto update = [](const std::string& endpoint, const std::string& variant, json config) {
    return json{
        {"EndpointName", endpoint},
        {"DesiredWeightsAndCapacities", {{{"VariantName", variant}, {"ServerlessUpdateConfig", std::move(config)}}}}};
  };
  EXPECT_NE(Invalid("UpdateEndpointWeightsAndCapacities", update("e", "A", {{"MaxConcurrency", 2}}))
                .find("Variant A is not serverless"),
            std::string::npos);
  EXPECT_NE(Invalid("UpdateEndpointWeightsAndCapacities", update("s", "S", {{"ProvisionedConcurrency", 5}}))
                .find("ProvisionedConcurrency 5 of variant S exceeds its MaxConcurrency 4"),
            std::string::npos);
  EXPECT_NE(Invalid("UpdateEndpointWeightsAndCapacities", update("s", "S", json::object()))
                .find("must give MaxConcurrency, ProvisionedConcurrency or both"),
            std::string::npos);
  EXPECT_EQ(Row("s").status, "InService");  // refused requests change nothing

  Ok("UpdateEndpointWeightsAndCapacities", update("s", "S", {{"MaxConcurrency", 8}, {"ProvisionedConcurrency", 3}}));
  EXPECT_EQ(Row("s").desired["S"]["DesiredServerlessConfig"],
            (json{{"MaxConcurrency", 8}, {"ProvisionedConcurrency", 3}}));
  MarkInService("s");
  json out = Ok("DescribeEndpoint", {{"EndpointName", "s"}});
  const json expected = {{"MemorySizeInMB", 2048}, {"MaxConcurrency", 8}, {"ProvisionedConcurrency", 3}};
  EXPECT_EQ(out["ProductionVariants"][0]["CurrentServerlessConfig"], expected);
  EXPECT_EQ(out["ProductionVariants"][0]["DesiredServerlessConfig"], expected);
  // Lowering MaxConcurrency below the ProvisionedConcurrency in force is refused too.
  EXPECT_NE(Invalid("UpdateEndpointWeightsAndCapacities", update("s", "S", {{"MaxConcurrency", 2}}))
                .find("ProvisionedConcurrency 3 of variant S exceeds its MaxConcurrency 2"),
            std::string::npos);
}

TEST_F(EndpointsApiTest, DeleteFromAnyStateButDeleting) {
  Ok("CreateEndpoint", {{"EndpointName", "e"}, {"EndpointConfigName", "cfg"}});
  Ok("AddTags", {{"ResourceArn", EndpointArn("e")}, {"Tags", {{{"Key", "k"}, {"Value", "v"}}}}});
  Ok("DeleteEndpoint", {{"EndpointName", "E"}});
  EXPECT_EQ(Row("e").status, "Deleting");
  EXPECT_EQ(notifier_.calls(), (std::vector<std::string>{"e", "e"}));
  EXPECT_EQ(Invalid("DeleteEndpoint", {{"EndpointName", "e"}}),
            "Cannot update in-progress endpoint \"" + EndpointArn("e") + "\".");
  // The controller removes the row once its instances are gone.
  store::EndpointRepository repo(db_.get());
  ASSERT_TRUE(repo.Delete("e").ok());
  EXPECT_EQ(Invalid("DescribeEndpoint", {{"EndpointName", "e"}}),
            "Could not find endpoint \"" + EndpointArn("e") + "\".");
  EXPECT_NE(Invalid("ListTags", {{"ResourceArn", EndpointArn("e")}}).find("Could not find resource"),
            std::string::npos);
}

TEST_F(EndpointsApiTest, ListFiltersSortsAndPages) {
  for (const char* name : {"b-ep", "a-ep", "c-other"}) {
    Ok("CreateEndpoint", {{"EndpointName", name}, {"EndpointConfigName", "cfg"}});
    clock_.now += 1000;
  }
  MarkInService("a-ep");
  json all = Ok("ListEndpoints", json::object());
  ASSERT_EQ(all["Endpoints"].size(), 3u);
  EXPECT_EQ(all["Endpoints"][0]["EndpointName"], "c-other");
  EXPECT_EQ(all["Endpoints"][0]["EndpointStatus"], "Creating");
  json in_service = Ok("ListEndpoints", {{"StatusEquals", "InService"}});
  ASSERT_EQ(in_service["Endpoints"].size(), 1u);
  EXPECT_EQ(in_service["Endpoints"][0]["EndpointName"], "a-ep");
  json by_status = Ok("ListEndpoints", {{"SortBy", "Status"}, {"SortOrder", "Ascending"}});
  EXPECT_EQ(by_status["Endpoints"][0]["EndpointStatus"], "Creating");
  EXPECT_EQ(by_status["Endpoints"][2]["EndpointStatus"], "InService");
  EXPECT_EQ(Ok("ListEndpoints", {{"NameContains", "EP"}})["Endpoints"].size(), 2u);
  json first = Ok("ListEndpoints", {{"SortBy", "Name"}, {"MaxResults", 2}});
  EXPECT_EQ(first["Endpoints"][0]["EndpointName"], "c-other");
  json second = Ok("ListEndpoints", {{"SortBy", "Name"}, {"MaxResults", 2}, {"NextToken", first["NextToken"]}});
  ASSERT_EQ(second["Endpoints"].size(), 1u);
  EXPECT_EQ(second["Endpoints"][0]["EndpointName"], "a-ep");
}

}  // namespace
}  // namespace kiln::api
