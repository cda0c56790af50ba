#include "api/async_invocations.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "objects/fs_object_store.h"
#include "store/database.h"
#include "store/test_util/temp_database.h"

namespace kiln::api {
namespace {

class AsyncInvokerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = std::move(store::Database::Open(dir_.path() + "/kiln.db", {})).value();
    objects_ =
        std::move(objects::FsObjectStore::Open({.root = dir_.path() + "/objects", .database = db_.get()})).value();
    ASSERT_TRUE(objects_->CreateBucket("bkt", "us-east-1").ok());
    StringByteSource source("1,2");
    ASSERT_TRUE(objects_->PutObject("bkt", "in.csv", source, {}).ok());
    queue_ = std::move(serving::AsyncQueue::Open({.dir = dir_.path() + "/async", .max_per_endpoint = 2})).value();
    Route("ep", true);
    Route("sync", false);
    context_.request_id = "req-1";
    context_.account_id = "123456789012";
  }

  void Route(const std::string& name, bool async) {
    auto route = std::make_shared<serving::EndpointRoute>();
    route->name = name;
    route->status = "InService";
    route->async = async;
    if (async) {
      route->async_config = R"({"OutputConfig":{"S3OutputPath":"s3://bkt/out/","S3FailurePath":"s3://bkt/err"}})";
    }
    routes_.Publish(route);
  }

  aws::WireResponse Invoke(const std::string& endpoint, HeaderMap headers) {
    net::HttpRequest request;
    request.method = "POST";
    request.headers = std::move(headers);
    AsyncInvoker invoker({.routes = &routes_, .objects = objects_.get(), .queue = queue_.get()});
    return invoker.Invoke(endpoint, request, context_);
  }

  static std::string Header(const aws::WireResponse& r, const std::string& name) {
    const std::string* v = FindHeader(r.headers, name);
    return v ? *v : "";
  }
  static std::string ErrorType(const aws::WireResponse& r) { return Header(r, "x-amzn-ErrorType"); }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<objects::FsObjectStore> objects_;
  std::unique_ptr<serving::AsyncQueue> queue_;
  serving::RoutingTable routes_;
  aws::RequestContext context_;
};

TEST_F(AsyncInvokerTest, QueuesAndAnswers202WithTheLocations) {
  auto r = Invoke("ep", {{"X-Amzn-SageMaker-InputLocation", "s3://bkt/in.csv"},
                         {"X-Amzn-SageMaker-Content-Type", "text/csv"},
                         {"X-Amzn-SageMaker-Inference-Id", "id-1"}});
  ASSERT_EQ(r.status, 202) << r.body;
  EXPECT_EQ(nlohmann::json::parse(r.body), (nlohmann::json{{"InferenceId", "id-1"}}));
  EXPECT_EQ(Header(r, "X-Amzn-SageMaker-OutputLocation"), "s3://bkt/out/id-1.out");
  EXPECT_EQ(Header(r, "X-Amzn-SageMaker-FailureLocation"), "s3://bkt/err/id-1-error.out");
  auto queued = queue_->Take("ep");
  ASSERT_TRUE(queued.has_value());
  EXPECT_EQ(queued->content_type, "text/csv");
  EXPECT_EQ(queued->ttl_seconds, 21600);
  EXPECT_EQ(queued->invocation_timeout_seconds, 900);

  r = Invoke("ep", {{"X-Amzn-SageMaker-InputLocation", "s3://bkt/in.csv"},
                    {"X-Amzn-SageMaker-S3OutputPathExtension", "a/b"},
                    {"X-Amzn-SageMaker-Filename", "x.json"}});
  ASSERT_EQ(r.status, 202) << r.body;
  const std::string id = nlohmann::json::parse(r.body)["InferenceId"];
  EXPECT_EQ(id.size(), 36u);  // a UUID
  EXPECT_EQ(Header(r, "X-Amzn-SageMaker-OutputLocation"), "s3://bkt/out/a/b/x.json");
  EXPECT_EQ(Header(r, "X-Amzn-SageMaker-FailureLocation"), "s3://bkt/err/a/b/" + id + "-error.out");
}

TEST_F(AsyncInvokerTest, RefusesBadHeadersEndpointsAndInputs) {
  EXPECT_TRUE(ErrorType(Invoke("ep", {})).starts_with("ValidationError"));
  for (HeaderMap bad : std::vector<HeaderMap>{
           {{"X-Amzn-SageMaker-InputLocation", "ftp://bkt/in.csv"}},
           {{"X-Amzn-SageMaker-InputLocation", "https://bkt.example.com/in.csv"}},
           {{"X-Amzn-SageMaker-InputLocation", "s3://bkt/in.csv"}, {"X-Amzn-SageMaker-RequestTTLSeconds", "59"}},
           {{"X-Amzn-SageMaker-InputLocation", "s3://bkt/in.csv"},
            {"X-Amzn-SageMaker-InvocationTimeoutSeconds", "3601"}},
           {{"X-Amzn-SageMaker-InputLocation", "s3://bkt/in.csv"}, {"X-Amzn-SageMaker-Filename", "a.b.c"}},
           {{"X-Amzn-SageMaker-InputLocation", "s3://bkt/in.csv"}, {"X-Amzn-SageMaker-S3OutputPathExtension", "s3:x"}},
           {{"X-Amzn-SageMaker-InputLocation", "s3://bkt/in.csv"},
            {"X-Amzn-SageMaker-Inference-Id", std::string(65, 'x')}},
           {{"X-Amzn-SageMaker-InputLocation", "s3://bkt/missing.csv"}},
       }) {
    auto r = Invoke("ep", bad);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_TRUE(ErrorType(r).starts_with("ValidationError")) << r.body;
  }
  auto r = Invoke("nope", {{"X-Amzn-SageMaker-InputLocation", "s3://bkt/in.csv"}});
  EXPECT_NE(r.body.find("Endpoint nope of account 123456789012 not found."), std::string::npos) << r.body;
  r = Invoke("sync", {{"X-Amzn-SageMaker-InputLocation", "s3://bkt/in.csv"}});
  EXPECT_NE(r.body.find("not configured for asynchronous inference"), std::string::npos) << r.body;
  EXPECT_TRUE(queue_->Backlogs().empty() || queue_->Backlogs()["ep"].waiting == 0);
}

TEST_F(AsyncInvokerTest, FullQueueIsServiceUnavailable) {
  HeaderMap ok = {{"X-Amzn-SageMaker-InputLocation", "s3://bkt/in.csv"}};
  EXPECT_EQ(Invoke("ep", ok).status, 202);
  EXPECT_EQ(Invoke("ep", ok).status, 202);
  auto r = Invoke("ep", ok);
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_TRUE(ErrorType(r).starts_with("ServiceUnavailable"));
}

}  // namespace
}  // namespace kiln::api
