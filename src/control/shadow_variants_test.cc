// Shadow variants and data capture on the control side (serving-contract.md §9, §14): the plan
// launches and awaits a shadow variant like a production one, and the endpoint controller routes
// it apart (EndpointRoute::shadow_variants) with the endpoint's parsed DataCaptureConfig, over
// the fake runtime of control/test_util (as endpoint_controller_test.cc does).
#include <gtest/gtest.h>
#include <unistd.h>

#include "base/time.h"
#include "control/endpoint_controller.h"
#include "control/endpoint_plan.h"
#include "control/test_util/controller_fixture.h"
#include "serving/data_capture.h"
#include "store/endpoint_repository.h"

namespace kiln::control {
namespace {

using nlohmann::json;
using store::EndpointStatus;

json Variant(const std::string& name, const std::string& model, int count) {
  return {
      {"VariantName", name}, {"ModelName", model}, {"InstanceType", "ml.m5.large"}, {"InitialInstanceCount", count}};
}

store::Deployment ShadowDeployment(int production_count, int shadow_count, bool capture) {
  store::Deployment d;
  d.config_name = "cfg";
  d.endpoint_config = {{"EndpointConfigName", "cfg"},
                       {"ProductionVariants", json::array({Variant("Prod", "m-prod", production_count)})},
                       {"ShadowProductionVariants", json::array({Variant("Shadow", "m-shadow", shadow_count)})}};
  if (capture) {
    d.endpoint_config["DataCaptureConfig"] = {{"InitialSamplingPercentage", 40},
                                              {"DestinationS3Uri", "s3://bkt/cap/"},
                                              {"CaptureOptions", json::array({json{{"CaptureMode", "Input"}}})}};
  }
  d.models = {{"m-prod", {{"ModelName", "m-prod"}, {"PrimaryContainer", {{"Image", "local:/bin/true"}}}}},
              {"m-shadow", {{"ModelName", "m-shadow"}, {"PrimaryContainer", {{"Image", "local:/bin/false"}}}}}};
  d.deployed_millis = 1000;
  return d;
}

ObservedInstance Instance(const std::string& id, const std::string& variant, bool healthy) {
  ObservedInstance i;
  i.instance_id = id;
  i.variant = variant;
  i.generation = 1000;
  i.healthy = healthy;
  i.launched_millis = 1;
  return i;
}

TEST(ShadowVariantPlanTest, ShadowIsLaunchedAndAwaitedLikeAProductionVariant) {
  store::EndpointRecord record;
  record.name = "ep";
  record.status = EndpointStatus::kCreating;
  record.deployment = ShadowDeployment(1, 2, false);
  record.desired["Prod"] = {.weight = 1.0, .instance_count = 1};
  PlanInput input;
  input.record = &record;
  input.now = 5000;
  auto plan = PlanEndpoint(input);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].kind, EndpointAction::Kind::kLaunch);
  EXPECT_EQ(plan[0].variant, "Prod");
  EXPECT_EQ(plan[0].count, 1);
  EXPECT_EQ(plan[1].kind, EndpointAction::Kind::kLaunch);
  EXPECT_EQ(plan[1].variant, "Shadow");
  EXPECT_EQ(plan[1].count, 2);  // its InitialInstanceCount
  EXPECT_EQ(plan[2].kind, EndpointAction::Kind::kPublish);
  // Production healthy, the shadow not yet: still Creating.
  input.instances = {Instance("p", "Prod", true), Instance("s1", "Shadow", true), Instance("s2", "Shadow", false)};
  EXPECT_EQ(PlanEndpoint(input).back().kind, EndpointAction::Kind::kPublish);
  input.instances[2].healthy = true;
  EXPECT_EQ(PlanEndpoint(input).back().kind, EndpointAction::Kind::kComplete);
}

class ShadowControllerTest : public testing::ControllerTest {
 protected:
  void SetUp() override {
    ControllerTest::SetUp();
    MakeScheduler(testing::SmallHost(4, 16));  // fits two ml.m5.large
    routes_ = std::make_unique<serving::RoutingTable>();
  }
  void TearDown() override { controller_.reset(); }

  void StartController() {
    EndpointControllerOptions options;
    options.work_dir = work_dir();
    options.endpoint_url = "http://127.0.0.1:1";
    const uint32_t scatter = static_cast<uint32_t>(::getpid()) * 2654435761u;
    options.port_range_begin = 20000 + static_cast<int>((scatter >> 16) % 90) * 100 + 50;
    options.port_range_end = 30000;
    options.health_interval = std::chrono::milliseconds(20);
    options.default_startup_timeout = std::chrono::seconds(10);
    options.drain_timeout = std::chrono::seconds(2);
    EndpointControllerDeps deps;
    deps.database = db_.get();
    deps.object_store = object_store_.get();
    deps.runtime = runtime_.get();
    deps.scheduler = scheduler_.get();
    deps.environments = environments_.get();
    deps.credentials = credentials_.get();
    deps.log_store = log_store_.get();
    deps.routes = routes_.get();
    deps.clock = &clock_;
    controller_ = std::make_unique<EndpointController>(options, deps);
    ASSERT_TRUE(controller_->Start().ok());
  }

  void Create(const std::string& name, bool capture) {
    store::EndpointRecord record;
    record.name = name;
    record.arn = "arn:aws:sagemaker:us-east-1:000000000000:endpoint/" + name;
    record.config_name = "cfg";
    record.status = EndpointStatus::kCreating;
    record.creation_millis = NowMillis();
    record.last_modified_millis = record.creation_millis;
    record.request = {{"EndpointName", name}, {"EndpointConfigName", "cfg"}};
    record.deployment = ShadowDeployment(1, 1, capture);
    record.desired["Prod"] = {.weight = 1.0, .instance_count = 1};
    store::EndpointRepository endpoints(db_.get());
    ASSERT_TRUE(endpoints.Insert(record).ok());
    controller_->EndpointChanged(name);
  }

  store::EndpointRecord WaitInService(const std::string& name) {
    store::EndpointRecord last;
    store::EndpointRepository endpoints(db_.get());
    EXPECT_TRUE(WaitFor([&] {
      auto r = endpoints.Get(name);
      if (r.ok()) last = *r;
      return r.ok() && r->status == EndpointStatus::kInService;
    })) << store::ToString(last.status)
        << " " << last.failure_reason;
    return last;
  }

  std::unique_ptr<serving::RoutingTable> routes_;
  std::unique_ptr<EndpointController> controller_;
};

TEST_F(ShadowControllerTest, ShadowRunsBesideProductionAndIsRoutedApartWithCapture) {
  StartController();
  Create("ep", /*capture=*/true);
  store::EndpointRecord row = WaitInService("ep");
  EXPECT_EQ(runtime_->launches().size(), 2u);
  auto route = routes_->Find("ep");
  ASSERT_NE(route, nullptr);
  ASSERT_EQ(route->variants.size(), 1u);
  EXPECT_EQ(route->variants[0].name, "Prod");
  EXPECT_EQ(route->variants[0].instances.size(), 1u);
  ASSERT_EQ(route->shadow_variants.size(), 1u);
  EXPECT_EQ(route->shadow_variants[0].name, "Shadow");
  EXPECT_EQ(route->shadow_variants[0].weight, 0);
  ASSERT_EQ(route->shadow_variants[0].instances.size(), 1u);
  EXPECT_NE(route->shadow_variants[0].instances[0]->instance_id, route->variants[0].instances[0]->instance_id);
  ASSERT_NE(route->data_capture, nullptr);
  EXPECT_EQ(route->data_capture->sampling_percentage, 40);
  EXPECT_EQ(route->data_capture->bucket, "bkt");
  EXPECT_EQ(route->data_capture->prefix, "cap");
  EXPECT_TRUE(route->data_capture->capture_input);
  EXPECT_FALSE(route->data_capture->capture_output);
  // The shadow's instance runs the shadow model's image, and both variants are summarised.
  bool shadow_image = false;
  for (const std::string& id : runtime_->launches()) {
    auto spec = runtime_->spec(id);
    shadow_image = shadow_image || (spec && !spec->argv.empty() && spec->argv[0] == "/bin/false");
  }
  EXPECT_TRUE(shadow_image);
  ASSERT_EQ(row.state.production_variants.size(), 2u);
  EXPECT_EQ(row.state.production_variants[1].variant_name, "Shadow");
  EXPECT_EQ(row.state.production_variants[1].current_instance_count, 1);
  EXPECT_EQ(row.state.instances.size(), 2u);
}

TEST_F(ShadowControllerTest, NoCaptureConfigNoSettings) {
  StartController();
  Create("ep", /*capture=*/false);
  WaitInService("ep");
  auto route = routes_->Find("ep");
  ASSERT_NE(route, nullptr);
  EXPECT_EQ(route->data_capture, nullptr);
  EXPECT_EQ(route->shadow_variants.size(), 1u);
}

}  // namespace
}  // namespace kiln::control
