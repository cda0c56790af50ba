#include "store/endpoint_state.h"

#include <gtest/gtest.h>

#include "store/endpoint_repository.h"
#include "store/test_util/temp_database.h"

namespace kiln::store {
namespace {

using nlohmann::json;

TEST(EndpointStatusTest, EveryWordRoundTrips) {
  for (EndpointStatus s : {EndpointStatus::kOutOfService, EndpointStatus::kCreating, EndpointStatus::kUpdating,
                           EndpointStatus::kSystemUpdating, EndpointStatus::kRollingBack, EndpointStatus::kInService,
                           EndpointStatus::kDeleting, EndpointStatus::kFailed, EndpointStatus::kUpdateRollbackFailed}) {
    auto parsed = ParseEndpointStatus(ToString(s));
    ASSERT_TRUE(parsed.ok()) << ToString(s);
    EXPECT_EQ(*parsed, s);
  }
  EXPECT_EQ(ToString(EndpointStatus::kInService), "InService");
  EXPECT_EQ(ToString(EndpointStatus::kSystemUpdating), "SystemUpdating");
  auto bad = ParseEndpointStatus("inservice");  // the words are case-sensitive, like AWS's
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "'inservice' is not an EndpointStatus");
}

// The documents exactly as the API and controller wrote them before they were typed.
const json kDeployment = json::parse(R"({
  "EndpointConfigName": "cfg",
  "EndpointConfig": {"EndpointConfigName": "cfg", "ProductionVariants": [
    {"VariantName": "A", "ModelName": "m1", "InstanceType": "ml.m5.large", "InitialInstanceCount": 2,
     "InitialVariantWeight": 0.7},
    {"VariantName": "B", "ModelName": "m2", "RoutingConfig": {"RoutingStrategy": "RANDOM"}}]},
  "Models": {"m1": {"ModelName": "m1", "PrimaryContainer": {"Image": "local:/bin/one"}},
             "m2": {"ModelName": "m2", "PrimaryContainer": {"Image": "local:/bin/two"}}},
  "DeployedMillis": 1714557600000})");
const json kDesired = json::parse(R"({"A": {"DesiredWeight": 0.7, "DesiredInstanceCount": 2},
                                      "B": {"DesiredWeight": 1.0}})");
const json kState = json::parse(R"({
  "ProductionVariants": [
    {"VariantName": "A", "CurrentWeight": 0.7, "DesiredWeight": 0.7, "CurrentInstanceCount": 1,
     "DesiredInstanceCount": 2,
     "DeployedImages": [{"SpecifiedImage": "local:/bin/one", "ResolvedImage": "local:/bin/one",
                         "ResolutionTime": 1714557600.0}],
     "VariantStatus": [{"Status": "Creating", "StatusMessage": "Starting and health-checking instances.",
                        "StartTime": 1714557600.5}]},
    {"VariantName": "B", "CurrentWeight": 1.0, "DesiredWeight": 1.0, "CurrentInstanceCount": 0,
     "DesiredInstanceCount": 1, "VariantStatus": [], "RoutingConfig": {"RoutingStrategy": "RANDOM"}}],
  "Instances": [
    {"InstanceId": "i-0123456789abcdef0", "RuntimeId": "endpoint-ep-i-0123456789abcdef0", "VariantName": "A",
     "ModelName": "m1", "InstanceType": "ml.m5.large", "Generation": 1714557600000, "PortBase": 20000,
     "LaunchedMillis": 1714557601000, "Reserved": true,
     "Allocation": {"cpus": [0, 1], "memory_bytes": 8589934592, "gpus": [], "gpu_uuids": [], "note": ""}},
    {"InstanceId": "i-00000000000000001", "RuntimeId": "endpoint-ep-i-00000000000000001", "VariantName": "B",
     "ModelName": "m2", "InstanceType": "ml.m5.large", "Generation": 1714557600000, "PortBase": 20100,
     "LaunchedMillis": 1714557602000, "Reserved": false}],
  "Credentials": {"AccessKeyId": "ASIAEXAMPLE", "SecretAccessKey": "s", "SessionToken": "t"}})");

TEST(EndpointStateTest, DeploymentReadsTodaysShapeAndWritesItBack) {
  auto d = DeploymentFromJson(kDeployment);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->config_name, "cfg");
  EXPECT_EQ(d->deployed_millis, 1714557600000);
  EXPECT_EQ(d->VariantNames(), (std::vector<std::string>{"A", "B"}));
  ASSERT_NE(d->FindVariant("B"), nullptr);
  EXPECT_EQ((*d->FindVariant("B"))["ModelName"], "m2");
  EXPECT_EQ(d->FindVariant("C"), nullptr);
  EXPECT_EQ(d->Model("m1")["PrimaryContainer"]["Image"], "local:/bin/one");
  EXPECT_EQ(d->Model("nope"), json::object());
  EXPECT_EQ(ToJson(*d), kDeployment);
  // An empty deployment (a Failed endpoint routes none) has no variants.
  EXPECT_TRUE(Deployment{}.VariantNames().empty());
  EXPECT_EQ(Deployment{}.FindVariant("A"), nullptr);
}

TEST(EndpointStateTest, DesiredReadsTodaysShapeAndWritesItBack) {
  auto d = DesiredVariantsFromJson(kDesired);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ(d->size(), 2u);
  EXPECT_EQ(d->at("A").weight, 0.7);
  EXPECT_EQ(d->at("A").instance_count, 2);
  EXPECT_EQ(d->at("B").weight, 1.0);
  EXPECT_FALSE(d->at("B").instance_count.has_value());
  EXPECT_EQ(ToJson(*d), kDesired);
  // Integers the API copied from a request (DesiredInstanceCount) stay integers.
  EXPECT_TRUE(ToJson(*d)["A"]["DesiredInstanceCount"].is_number_integer());
}

TEST(EndpointStateTest, DesiredServerlessConfigOverridesTheConfigurationsMembers) {
  const json desired_json =
      json::parse(R"({"S": {"DesiredServerlessConfig": {"MaxConcurrency": 8, "ProvisionedConcurrency": 3}},
                      "T": {"DesiredServerlessConfig": {"ProvisionedConcurrency": 2}}})");
  auto d = DesiredVariantsFromJson(desired_json);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->at("S").serverless_max_concurrency, 8);
  EXPECT_EQ(d->at("S").serverless_provisioned_concurrency, 3);
  EXPECT_FALSE(d->at("T").serverless_max_concurrency.has_value());
  EXPECT_EQ(ToJson(*d), desired_json);

  const json variant =
      json::parse(R"({"VariantName": "S", "ServerlessConfig": {"MemorySizeInMB": 2048, "MaxConcurrency": 4}})");
  EXPECT_EQ(EffectiveServerlessConfig(variant, nullptr), variant["ServerlessConfig"]);
  EXPECT_EQ(EffectiveServerlessConfig(variant, &d->at("S")),
            json::parse(R"({"MemorySizeInMB": 2048, "MaxConcurrency": 8, "ProvisionedConcurrency": 3})"));
  EXPECT_EQ(EffectiveServerlessConfig(variant, &d->at("T")),
            json::parse(R"({"MemorySizeInMB": 2048, "MaxConcurrency": 4, "ProvisionedConcurrency": 2})"));
  EXPECT_TRUE(
      EffectiveServerlessConfig(json::parse(R"({"VariantName": "A", "InstanceType": "ml.m5.large"})"), &d->at("S"))
          .is_null());
  EXPECT_EQ(DesiredVariantsFromJson(json::parse(R"({"A": {"DesiredServerlessConfig": 3}})")).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(EndpointStateTest, ObservedStateReadsTodaysShapeAndWritesItBack) {
  auto s = ObservedStateFromJson(kState);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->production_variants.size(), 2u);
  const VariantSummary& a = s->production_variants[0];
  EXPECT_EQ(a.variant_name, "A");
  EXPECT_EQ(a.current_instance_count, 1);
  EXPECT_EQ(a.desired_instance_count, 2);
  ASSERT_EQ(a.deployed_images.size(), 1u);
  EXPECT_EQ(a.deployed_images[0].resolved_image, "local:/bin/one");
  ASSERT_EQ(a.variant_status.size(), 1u);
  EXPECT_EQ(a.variant_status[0].status, "Creating");
  EXPECT_DOUBLE_EQ(a.variant_status[0].start_time, 1714557600.5);
  EXPECT_TRUE(a.routing_config.is_null());
  EXPECT_EQ(s->production_variants[1].routing_config["RoutingStrategy"], "RANDOM");
  ASSERT_EQ(s->instances.size(), 2u);
  const InstanceRecord& i = s->instances[0];
  EXPECT_EQ(i.instance_id, "i-0123456789abcdef0");
  EXPECT_EQ(i.runtime_id, "endpoint-ep-i-0123456789abcdef0");
  EXPECT_EQ(i.generation, 1714557600000);
  EXPECT_EQ(i.port_base, 20000);
  EXPECT_TRUE(i.reserved);
  EXPECT_EQ(i.allocation["memory_bytes"], 8589934592);
  EXPECT_FALSE(s->instances[1].reserved);
  EXPECT_TRUE(s->instances[1].allocation.is_null());
  EXPECT_EQ(s->credentials["AccessKeyId"], "ASIAEXAMPLE");
  EXPECT_EQ(ToJson(*s), kState);
}

TEST(EndpointStateTest, EmptyStateIsTheRowOfANewEndpoint) {
  auto s = ObservedStateFromJson(json::object());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, EndpointObservedState{});
  EXPECT_EQ(ToJson(*s), json::parse(R"({"ProductionVariants": [], "Instances": []})"));
  auto back = ObservedStateFromJson(ToJson(*s));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *s);
}

TEST(EndpointStateTest, WrongTypesAndMissingIdsAreErrorsThatNameTheMember) {
  struct Case {
    const char* state;
    const char* message;
  };
  const Case cases[] = {
      {R"([])", "observed state is not an object"},
      {R"({"ProductionVariants": {}})", "state.ProductionVariants is not an array"},
      {R"({"ProductionVariants": [{"CurrentWeight": 1}]})", "ProductionVariants[] has no VariantName"},
      {R"({"ProductionVariants": [{"VariantName": "A", "CurrentWeight": "x"}]})",
       "ProductionVariants[].CurrentWeight is not a number"},
      {R"({"ProductionVariants": [{"VariantName": "A", "CurrentInstanceCount": 1.5}]})",
       "ProductionVariants[].CurrentInstanceCount is not an integer"},
      {R"({"Instances": [{"RuntimeId": "r", "VariantName": "A"}]})", "Instances[] has no InstanceId"},
      {R"({"Instances": [{"InstanceId": "i", "RuntimeId": "r", "VariantName": "A", "Reserved": 1}]})",
       "Instances[].Reserved is not a boolean"},
  };
  for (const Case& c : cases) {
    auto s = ObservedStateFromJson(json::parse(c.state));
    ASSERT_FALSE(s.ok()) << c.state;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.status().message(), c.message) << c.state;
  }
  EXPECT_EQ(DesiredVariantsFromJson(json::parse(R"({"A": {"DesiredInstanceCount": "2"}})")).status().message(),
            "desired.A.DesiredInstanceCount is not an integer");
  EXPECT_EQ(DeploymentFromJson(json::parse(R"({"DeployedMillis": "x"})")).status().message(),
            "deployment.DeployedMillis is not an integer");
}

// A guarded rollout's progress (Rollout) survives the row: read back equal, absent when none,
// and a phase no Kiln writes is an error naming it.
TEST(EndpointStateTest, RolloutProgressRoundTripsThroughTheObservedState) {
  EndpointObservedState state;
  EXPECT_FALSE(ToJson(state).contains("Rollout"));
  state.rollout = RolloutState{.generation = 1714557700000,
                               .phase = RolloutState::Phase::kTerminationWait,
                               .step = 3,
                               .fraction = 0.75,
                               .until_millis = 1714557760000,
                               .started_millis = 1714557710000};
  const json written = ToJson(state);
  EXPECT_EQ(written["Rollout"], json::parse(R"({"Generation": 1714557700000, "Phase": "TerminationWait", "Step": 3,
      "Fraction": 0.75, "UntilMillis": 1714557760000, "StartedMillis": 1714557710000})"));
  auto back = ObservedStateFromJson(written);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, state);

  auto baking = RolloutStateFromJson(json::parse(R"({"Generation": 5, "Phase": "Baking", "Fraction": 0.1})"));
  ASSERT_TRUE(baking.ok());
  EXPECT_EQ(baking->phase, RolloutState::Phase::kBaking);
  EXPECT_EQ(baking->fraction, 0.1);
  EXPECT_EQ(baking->step, 0);

  EXPECT_EQ(ObservedStateFromJson(json::parse(R"({"Rollout": {"Phase": "Shifting"}})")).status().message(),
            "Rollout.Phase 'Shifting' is not Baking, TerminationWait or Provisioning");
  EXPECT_EQ(ObservedStateFromJson(json::parse(R"({"Rollout": {"Fraction": "half"}})")).status().message(),
            "Rollout.Fraction is not a number");
  EXPECT_EQ(ObservedStateFromJson(json::parse(R"({"Rollout": []})")).status().message(), "Rollout is not an object");
}

// A row written by an earlier Kiln (raw SQL, today's column values) reads into the typed record
// and, written back unchanged, keeps its documents.
TEST(EndpointStateTest, RowInTodaysFormatReadsAndWritesBack) {
  testing::TempDir dir;
  auto db = testing::OpenTestDatabase(dir.path(), /*durable=*/false);
  {
    auto st = db->Prepare(
        "INSERT INTO endpoints(name, arn, config_name, status, failure_reason, creation_millis, "
        "last_modified_millis, request_json, deployment_json, pending_json, desired_json, state_json, version) "
        "VALUES ('ep', 'arn:aws:sagemaker:us-east-1:000000000000:endpoint/ep', 'cfg', 'Updating', '', 1000, 2000, "
        "?, ?, ?, ?, ?, 7)");
    ASSERT_TRUE(st.ok());
    json pending = kDeployment;
    pending["EndpointConfigName"] = "cfg2";
    pending["DeployedMillis"] = 1714557700000;
    st->BindText(1, R"({"EndpointName":"ep","EndpointConfigName":"cfg"})")
        .BindText(2, kDeployment.dump())
        .BindText(3, pending.dump())
        .BindText(4, kDesired.dump())
        .BindText(5, kState.dump());
    ASSERT_TRUE(st->Run().ok());
  }
  EndpointRepository repo(db.get());
  auto got = repo.Get("ep");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->status, EndpointStatus::kUpdating);
  EXPECT_EQ(got->deployment.config_name, "cfg");
  ASSERT_TRUE(got->pending.has_value());
  EXPECT_EQ(got->pending->config_name, "cfg2");
  EXPECT_EQ(got->pending->deployed_millis, 1714557700000);
  EXPECT_EQ(got->desired.at("A").instance_count, 2);
  EXPECT_EQ(got->state.instances.size(), 2u);
  EXPECT_EQ(got->version, 7);

  ASSERT_TRUE(repo.Mutate("ep", [](EndpointRecord&) { return Status::Ok(); }).ok());
  auto st = db->Prepare("SELECT status, deployment_json, desired_json, state_json FROM endpoints WHERE name = 'ep'");
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(*st->Step());
  EXPECT_EQ(st->ColumnText(0), "Updating");
  EXPECT_EQ(json::parse(st->ColumnText(1)), kDeployment);
  EXPECT_EQ(json::parse(st->ColumnText(2)), kDesired);
  EXPECT_EQ(json::parse(st->ColumnText(3)), kState);

  // A status word no Kiln writes is a corrupt row, not a guess.
  ASSERT_TRUE(db->Exec("UPDATE endpoints SET status = 'Bogus'").ok());
  auto corrupt = repo.Get("ep");
  EXPECT_EQ(corrupt.status().code(), StatusCode::kInternal);
  EXPECT_EQ(corrupt.status().message(), "endpoint 'ep' has a corrupt row ('Bogus' is not an EndpointStatus)");
}

}  // namespace
}  // namespace kiln::store
