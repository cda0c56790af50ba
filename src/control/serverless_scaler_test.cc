#include "control/serverless_scaler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>

#include "store/endpoint_repository.h"
#include "store/test_util/temp_database.h"

namespace kiln::control {
namespace {

using nlohmann::json;

class CountingNotifier : public EndpointNotifier {
 public:
  void EndpointChanged(const std::string&) override { ++calls; }
  std::atomic<int> calls{0};
};

class ServerlessScalerTest : public ::testing::Test {
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
        {"ProductionVariants",
         {{{"VariantName", "v"},
           {"ModelName", "m"},
           {"ServerlessConfig", {{"MemorySizeInMB", 1024}, {"MaxConcurrency", 3}, {"ProvisionedConcurrency", 1}}}}}}};
    endpoint.desired["v"].instance_count = 1;
    ASSERT_TRUE(store::EndpointRepository(db_.get()).Insert(endpoint).ok());
    auto route = std::make_shared<serving::EndpointRoute>();
    route->name = "ep";
    route->status = "InService";
    route->serverless_max_concurrency = 3;
    route->serverless_provisioned = 1;
    serving::VariantRoute variant;
    variant.name = "v";
    route->variants.push_back(variant);
    route_ = route;
    routes_.Publish(route);
    ServerlessScalerOptions options;
    options.idle = std::chrono::milliseconds(300);
    scaler_ = std::make_unique<ServerlessScaler>(
        options, ServerlessScalerDeps{
                     .database = db_.get(), .metrics = metrics_.get(), .notifier = &notifier_, .routes = &routes_});
  }

  int64_t DesiredCount() {
    auto record = store::EndpointRepository(db_.get()).Get("ep");
    EXPECT_TRUE(record.ok());
    return record->desired["v"].instance_count.value_or(-1);
  }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<observe::MetricStore> metrics_;
  serving::RoutingTable routes_;
  std::shared_ptr<const serving::EndpointRoute> route_;
  CountingNotifier notifier_;
  std::unique_ptr<ServerlessScaler> scaler_;
};

TEST_F(ServerlessScalerTest, AdmitsUpToMaxConcurrencyAndSizesThePool) {
  scaler_->RunOnce();
  EXPECT_EQ(scaler_->WrittenSize("ep"), 1);  // ProvisionedConcurrency (already the row's count)
  EXPECT_EQ(notifier_.calls, 0);
  EXPECT_TRUE(scaler_->Admit(*route_));
  EXPECT_TRUE(scaler_->Admit(*route_));
  EXPECT_TRUE(scaler_->Admit(*route_));
  EXPECT_FALSE(scaler_->Admit(*route_));  // MaxConcurrency 3 in flight
  scaler_->RunOnce();
  EXPECT_EQ(DesiredCount(), 3);
  EXPECT_EQ(notifier_.calls, 1);
  scaler_->Leave(*route_);
  EXPECT_TRUE(scaler_->Admit(*route_));
  for (int i = 0; i < 3; ++i) scaler_->Leave(*route_);
  // Idle for less than `idle`: the pool stays.
  scaler_->RunOnce();
  EXPECT_EQ(DesiredCount(), 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  scaler_->RunOnce();
  EXPECT_EQ(DesiredCount(), 1);  // back to ProvisionedConcurrency
  EXPECT_EQ(notifier_.calls, 2);
}

// A restarted server finds a pool of 3 routable instances: they count as used now, so the pool
// shrinks only after `idle`.
TEST_F(ServerlessScalerTest, AdoptedInstancesAreKeptForTheIdleSpan) {
  ASSERT_TRUE(store::EndpointRepository(db_.get())
                  .Mutate("ep",
                          [](store::EndpointRecord& r) {
                            r.desired["v"].instance_count = 3;
                            return Status::Ok();
                          })
                  .ok());
  auto route = std::make_shared<serving::EndpointRoute>(*route_);
  for (int i = 0; i < 3; ++i) {
    auto instance = std::make_shared<serving::InstanceTarget>();
    instance->instance_id = "i-" + std::to_string(i);
    route->variants[0].instances.push_back(instance);
  }
  routes_.Publish(route);
  scaler_->RunOnce();
  EXPECT_EQ(DesiredCount(), 3);
  EXPECT_EQ(notifier_.calls, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  scaler_->RunOnce();
  EXPECT_EQ(DesiredCount(), 1);
  EXPECT_EQ(notifier_.calls, 1);
}

TEST_F(ServerlessScalerTest, RecordsModelSetupTime) {
  scaler_->ColdStart(*route_, "v", 1500000);
  scaler_->RunOnce();
  auto series = metrics_->ListSeries("AWS/SageMaker", "ModelSetupTime", {{"EndpointName", "ep"}, {"VariantName", "v"}});
  ASSERT_TRUE(series.ok());
  ASSERT_EQ(series->size(), 1u);
}

// AWS's regional quota: requests in flight over all serverless endpoints, whatever each
// endpoint's own MaxConcurrency.
TEST_F(ServerlessScalerTest, RefusesBeyondTheAccountWideConcurrency) {
  ServerlessScalerOptions options;
  options.account_max_concurrency = 2;
  ServerlessScaler scaler(options, ServerlessScalerDeps{.database = db_.get(), .routes = &routes_});
  auto other = std::make_shared<serving::EndpointRoute>(*route_);
  other->name = "ep2";
  EXPECT_TRUE(scaler.Admit(*route_));
  EXPECT_TRUE(scaler.Admit(*other));
  EXPECT_FALSE(scaler.Admit(*route_));  // ep has 1 of its 3, but the account has 2 of 2
  EXPECT_FALSE(scaler.Admit(*other));
  scaler.Leave(*other);
  EXPECT_TRUE(scaler.Admit(*route_));
}

// ServerlessProvisionedConcurrencyExecutions/Utilization each pass: the most requests in flight
// since the last pass, capped at ProvisionedConcurrency, and that over ProvisionedConcurrency.
TEST_F(ServerlessScalerTest, PublishesProvisionedConcurrencyUtilization) {
  const observe::Dimensions dims = {{"EndpointName", "ep"}, {"VariantName", "v"}};
  auto last = [&](const char* name) {
    auto point = metrics_->Last("AWS/SageMaker", name, dims);
    EXPECT_TRUE(point.ok());
    return point.ok() && point->has_value() ? (*point)->value : -1.0;
  };
  scaler_->RunOnce();
  EXPECT_EQ(last("ServerlessProvisionedConcurrencyUtilization"), 0.0);
  EXPECT_TRUE(scaler_->Admit(*route_));
  EXPECT_TRUE(scaler_->Admit(*route_));
  scaler_->Leave(*route_);
  scaler_->Leave(*route_);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a later point than the first pass's
  scaler_->RunOnce();
  EXPECT_EQ(last("ServerlessProvisionedConcurrencyExecutions"), 1.0);  // 2 in flight, 1 provisioned
  EXPECT_EQ(last("ServerlessProvisionedConcurrencyUtilization"), 1.0);
}

TEST_F(ServerlessScalerTest, LeavesEndpointsThatAreNotServingAlone) {
  ASSERT_TRUE(store::EndpointRepository(db_.get())
                  .Mutate("ep",
                          [](store::EndpointRecord& r) {
                            r.status = store::EndpointStatus::kDeleting;
                            return Status::Ok();
                          })
                  .ok());
  EXPECT_TRUE(scaler_->Admit(*route_));
  EXPECT_TRUE(scaler_->Admit(*route_));
  scaler_->RunOnce();
  EXPECT_EQ(DesiredCount(), 1);
  EXPECT_EQ(notifier_.calls, 0);
}

}  // namespace
}  // namespace kiln::control
