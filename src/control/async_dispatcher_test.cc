#include "control/async_dispatcher.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "base/time.h"
#include "objects/fs_object_store.h"
#include "serving/test_util/fake_container.h"
#include "store/database.h"
#include "store/test_util/temp_database.h"

namespace kiln::control {
namespace {

using serving::testing::FakeContainer;

class AsyncDispatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = std::move(store::Database::Open(dir_.path() + "/kiln.db", {})).value();
    objects_ =
        std::move(objects::FsObjectStore::Open({.root = dir_.path() + "/objects", .database = db_.get()})).value();
    ASSERT_TRUE(objects_->CreateBucket("bkt", "us-east-1").ok());
    metrics_ = std::make_unique<observe::MetricStore>(db_.get());
    queue_ = std::move(serving::AsyncQueue::Open({.dir = dir_.path() + "/async"})).value();
  }
  void TearDown() override {
    if (dispatcher_) dispatcher_->Stop();
  }

  void Put(const std::string& key, const std::string& body, const std::string& type = "text/csv") {
    StringByteSource source(body);
    objects::PutOptions options;
    options.headers["Content-Type"] = type;
    ASSERT_TRUE(objects_->PutObject("bkt", key, source, options).ok());
  }
  std::optional<std::string> Get(const std::string& key, std::string* type = nullptr) {
    auto reader = objects_->GetObject("bkt", key, std::nullopt);
    if (!reader.ok()) return std::nullopt;
    if (type) *type = (*reader)->info().headers.at("Content-Type");
    return std::move(ReadAll(**reader, 1 << 20)).value();
  }

  // One async endpoint "ep" with `instances` instances of the fake container.
  void Publish(int instances, const std::string& config = R"({"OutputConfig":{"S3OutputPath":"s3://bkt/out"}})") {
    auto route = std::make_shared<serving::EndpointRoute>();
    route->name = "ep";
    route->status = "InService";
    route->async = true;
    route->async_config = config;
    serving::VariantRoute variant;
    variant.name = "AllTraffic";
    for (int i = 0; i < instances; ++i) {
      if (!target_) {
        auto target = std::make_shared<serving::InstanceTarget>();
        target->instance_id = "i-0";
        target->port = container_.port();
        target_ = target;
      }
      variant.instances.push_back(target_);
    }
    route->variants.push_back(variant);
    routes_.Publish(route);
  }

  serving::AsyncRequest Enqueue(const std::string& id, bool failure_path = true) {
    serving::AsyncRequest r;
    r.endpoint = "ep";
    r.inference_id = id;
    r.input_location = "s3://bkt/in.csv";
    r.accept = "application/json";
    r.output_location = "s3://bkt/out/" + id + ".out";
    if (failure_path) r.failure_location = "s3://bkt/err/" + id + "-error.out";
    r.received_millis = NowMillis();
    EXPECT_TRUE(queue_->Enqueue(r).ok());
    return r;
  }

  void Start() {
    AsyncDispatcherOptions options;
    options.metrics_interval = std::chrono::milliseconds(100);
    dispatcher_ = std::make_unique<AsyncDispatcher>(
        options, AsyncDispatcherDeps{
                     .queue = queue_.get(), .routes = &routes_, .objects = objects_.get(), .metrics = metrics_.get()});
    dispatcher_->Start();
  }

  bool WaitFinished(int64_t n) {
    for (int i = 0; i < 500 && dispatcher_->TEST_Finished() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return dispatcher_->TEST_Finished() >= n;
  }

  double LastMetric(const std::string& name, const observe::Dimensions& dims) {
    auto last = metrics_->Last("AWS/SageMaker", name, dims);
    return last.ok() && last->has_value() ? (*last)->value : -1;
  }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<objects::FsObjectStore> objects_;
  std::unique_ptr<observe::MetricStore> metrics_;
  std::unique_ptr<serving::AsyncQueue> queue_;
  serving::RoutingTable routes_;
  FakeContainer container_;
  std::shared_ptr<serving::InstanceTarget> target_;
  std::unique_ptr<AsyncDispatcher> dispatcher_;
};

TEST_F(AsyncDispatcherTest, WritesTheOutputWithTheResponseContentType) {
  Put("in.csv", "1,2,3");
  container_.Respond(200, "{\"y\":1}", "Content-Type: application/x-out\r\n");
  Publish(1);
  Enqueue("a");
  Start();
  ASSERT_TRUE(WaitFinished(1));
  std::string type;
  EXPECT_EQ(Get("out/a.out", &type), "{\"y\":1}");
  EXPECT_EQ(type, "application/x-out");
  EXPECT_FALSE(Get("err/a-error.out").has_value());
  auto received = container_.received();
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].body, "1,2,3");
  EXPECT_NE(received[0].head.find("POST /invocations"), std::string::npos);
  EXPECT_NE(received[0].head.find("Content-Type: text/csv"), std::string::npos);  // the object's type
  EXPECT_NE(received[0].head.find("Accept: application/json"), std::string::npos);
  EXPECT_NE(received[0].head.find("X-Amzn-SageMaker-Inference-Id: a"), std::string::npos);
  EXPECT_TRUE(queue_->Backlogs()["ep"].waiting == 0 && queue_->Backlogs()["ep"].in_flight == 0);
}

// A traffic shift (DeploymentConfig): with all of it on the new fleet, requests go to the new
// fleet's instance, never to the old one's (which nothing answers here).
TEST_F(AsyncDispatcherTest, AShiftSendsRequestsToTheNewFleetByItsShare) {
  Put("in.csv", "1");
  container_.Respond(200, "{\"y\":2}", "Content-Type: application/json\r\n");
  Publish(1);
  auto shifted = std::make_shared<serving::EndpointRoute>(*routes_.Find("ep"));
  auto old_target = std::make_shared<serving::InstanceTarget>();
  old_target->instance_id = "i-old";
  old_target->port = 1;  // nothing listens
  shifted->new_variants = shifted->variants;
  shifted->variants[0].instances = {old_target};
  shifted->new_fleet_fraction = 1.0;
  routes_.Publish(shifted);
  for (const char* id : {"a", "b", "c"}) Enqueue(id);
  Start();
  ASSERT_TRUE(WaitFinished(3));
  for (const char* id : {"a", "b", "c"}) EXPECT_EQ(Get(std::string("out/") + id + ".out"), "{\"y\":2}") << id;
  EXPECT_EQ(container_.received().size(), 3u);
}

TEST_F(AsyncDispatcherTest, ModelErrorWritesTheFailureObject) {
  Put("in.csv", "x");
  container_.Respond(500, "bad input", "Content-Type: text/plain\r\n");
  Publish(1);
  Enqueue("a");
  Start();
  ASSERT_TRUE(WaitFinished(1));
  EXPECT_FALSE(Get("out/a.out").has_value());
  EXPECT_EQ(Get("err/a-error.out"), "bad input");
  EXPECT_EQ(container_.requests(), 1u);  // model errors are not retried
}

TEST_F(AsyncDispatcherTest, MissingInputIsAFailureDocument) {
  Publish(1);
  Enqueue("a");
  Start();
  ASSERT_TRUE(WaitFinished(1));
  auto doc = nlohmann::json::parse(Get("err/a-error.out").value_or("{}"));
  EXPECT_NE(doc.value("errorMessage", "").find("could not be read"), std::string::npos);
  EXPECT_EQ(container_.requests(), 0u);
}

TEST_F(AsyncDispatcherTest, RecoveredRequestWithAnOutputIsNotRunAgain) {
  Put("in.csv", "x");
  Enqueue("done");
  Enqueue("todo");
  Put("out/done.out", "from before the restart");
  queue_.reset();
  queue_ = std::move(serving::AsyncQueue::Open({.dir = dir_.path() + "/async"})).value();
  container_.Respond(200, "new");
  Publish(1);
  Start();
  ASSERT_TRUE(WaitFinished(2));
  EXPECT_EQ(Get("out/done.out"), "from before the restart");
  EXPECT_EQ(Get("out/todo.out"), "new");
  EXPECT_EQ(container_.requests(), 1u);
}

TEST_F(AsyncDispatcherTest, ExpiredRequestsAreNotRun) {
  Put("in.csv", "x");
  serving::AsyncRequest r;
  r.endpoint = "ep";
  r.inference_id = "old";
  r.input_location = "s3://bkt/in.csv";
  r.output_location = "s3://bkt/out/old.out";
  r.failure_location = "s3://bkt/err/old-error.out";
  r.received_millis = NowMillis() - 120000;
  r.ttl_seconds = 60;
  ASSERT_TRUE(queue_->Enqueue(r).ok());
  Publish(1);
  Start();
  ASSERT_TRUE(WaitFinished(1));
  EXPECT_EQ(container_.requests(), 0u);
  EXPECT_NE(Get("err/old-error.out").value_or("").find("expired"), std::string::npos);
}

TEST_F(AsyncDispatcherTest, ConcurrencyPerInstanceIsBounded) {
  Put("in.csv", "x");
  container_.Respond(200, "ok");
  container_.SetDelay(std::chrono::milliseconds(300));
  Publish(
      1,
      R"({"ClientConfig":{"MaxConcurrentInvocationsPerInstance":2},"OutputConfig":{"S3OutputPath":"s3://bkt/out"}})");
  for (int i = 0; i < 5; ++i) Enqueue("r" + std::to_string(i));
  Start();
  int64_t most = 0;
  for (int i = 0; i < 150 && dispatcher_->TEST_Finished() < 5; ++i) {
    most = std::max(most, target_->outstanding.load());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(WaitFinished(5));
  EXPECT_EQ(most, 2);
}

TEST_F(AsyncDispatcherTest, NoInstanceKeepsRequestsQueuedAndReportsBacklogWithoutCapacity) {
  Put("in.csv", "x");
  container_.Respond(200, "ok");
  Publish(0);
  Enqueue("a");
  Start();
  const observe::Dimensions dims = {{"EndpointName", "ep"}};
  for (int i = 0; i < 100 && LastMetric("HasBacklogWithoutCapacity", dims) != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(LastMetric("HasBacklogWithoutCapacity", dims), 1);
  EXPECT_EQ(LastMetric("ApproximateBacklogSize", dims), 1);
  EXPECT_EQ(container_.requests(), 0u);
  Publish(1);  // scaled up: the queued request runs
  queue_->Wake();
  ASSERT_TRUE(WaitFinished(1));
  EXPECT_EQ(Get("out/a.out"), "ok");
  for (int i = 0;
       i < 100 && LastMetric("InvocationsProcesssed", {{"EndpointName", "ep"}, {"VariantName", "AllTraffic"}}) != 1;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(LastMetric("InvocationsProcesssed", {{"EndpointName", "ep"}, {"VariantName", "AllTraffic"}}), 1);
}

}  // namespace
}  // namespace kiln::control
