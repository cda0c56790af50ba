#pragma once
// Test-only: drives the inference operations (models, endpoint configs, endpoints) through a
// real JsonService with the SageMaker model set, over a temporary database, a fake notifier and a
// small instance catalog (ml.m5.large and ml.t2.medium only), with a settable clock.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/endpoints.h"
#include "api/json_service.h"
#include "api/service_model.h"
#include "api/training_jobs.h"
#include "base/mutex.h"
#include "store/test_util/temp_database.h"

namespace kiln::api::testing {

class FakeNotifier : public control::EndpointNotifier {
 public:
  void EndpointChanged(const std::string& endpoint_name) override {
    MutexLock lock(mutex_);
    calls_.push_back(endpoint_name);
  }
  std::vector<std::string> calls() {
    MutexLock lock(mutex_);
    return calls_;
  }

 private:
  Mutex mutex_;
  std::vector<std::string> calls_ GUARDED_BY(mutex_);
};

class FakeClock : public Clock {
 public:
  int64_t NowMillis() const override { return now; }
  int64_t now = 1714557600000;
};

struct Answer {
  int status = 0;
  nlohmann::json body;
  std::string type() const { return body.value("__type", ""); }
  std::string message() const { return body.value("message", ""); }
};

class InferenceApiTest : public ::testing::Test {
 protected:
  static constexpr const char* kArnPrefix = "arn:aws:sagemaker:us-east-1:123456789012:";
  static constexpr const char* kRole = "arn:aws:iam::123456789012:role/kiln";

  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    auto catalog = control::InstanceCatalog::FromJson(nlohmann::json::parse(R"([
      {"type": "ml.m5.large", "vcpus": 2, "memory_gib": 8, "hosting": true},
      {"type": "ml.t2.medium", "vcpus": 2, "memory_gib": 4, "hosting": true}])"));
    ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
    catalog_ = std::move(catalog).value();
    service_.SetModel(ServiceModel::SageMaker());
    EndpointsContext ctx;
    ctx.database = db_.get();
    ctx.notifier = &notifier_;
    ctx.catalog = &catalog_;
    ctx.account_id = "123456789012";
    ctx.region = "us-east-1";
    ctx.clock = &clock_;
    RegisterInferenceOperations(&service_, ctx);
    TrainingJobsContext training;
    training.database = db_.get();
    training.account_id = "123456789012";
    training.region = "us-east-1";
    training.clock = &clock_;
    RegisterTrainingJobOperations(&service_, training);
  }

  Answer Call(const std::string& operation, const nlohmann::json& input) {
    aws::RequestContext context;
    context.request_id = "req";
    auto response = service_.Handle(context, operation, input.dump());
    Answer a;
    a.status = response.status;
    a.body = response.body.empty() ? nlohmann::json::object() : nlohmann::json::parse(response.body);
    return a;
  }
  // Calls and expects success.
  nlohmann::json Ok(const std::string& operation, const nlohmann::json& input) {
    Answer a = Call(operation, input);
    EXPECT_EQ(a.status, 200) << operation << ": " << a.body.dump();
    return a.body;
  }
  // Calls and expects a ValidationException; returns its message.
  std::string Invalid(const std::string& operation, const nlohmann::json& input) {
    Answer a = Call(operation, input);
    EXPECT_EQ(a.status, 400) << operation << ": " << a.body.dump();
    EXPECT_EQ(a.type(), "ValidationException") << a.body.dump();
    return a.message();
  }

  void CreateModel(const std::string& name, const std::string& image = "local:/bin/serve") {
    Ok("CreateModel", {{"ModelName", name},
                       {"ExecutionRoleArn", kRole},
                       {"PrimaryContainer", {{"Image", image}, {"ModelDataUrl", "s3://b/model.tar.gz"}}}});
  }
  static nlohmann::json Variant(const std::string& name, const std::string& model, int count = 1) {
    return {
        {"VariantName", name}, {"ModelName", model}, {"InstanceType", "ml.m5.large"}, {"InitialInstanceCount", count}};
  }
  void CreateConfig(const std::string& name, const nlohmann::json& variants) {
    Ok("CreateEndpointConfig", {{"EndpointConfigName", name}, {"ProductionVariants", variants}});
  }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  control::InstanceCatalog catalog_;
  FakeNotifier notifier_;
  FakeClock clock_;
  JsonService service_{"SageMaker", "sagemaker", aws::Protocol::kJson11};
};

}  // namespace kiln::api::testing
