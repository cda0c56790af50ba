#include "api/front_door.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <time.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "net/test_util/fake_response_writer.h"
#include "aws/cbor.h"
#include "store/test_util/temp_database.h"
#include "aws/sigv4.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/time.h"
#include "net/event_loop.h"
#include "serving/test_util/fake_container.h"

namespace kiln::api {
namespace {

class FixedCredentials final : public aws::CredentialProvider {
 public:
  std::optional<aws::Credential> Lookup(std::string_view id) const override {
    if (id != "AKIATESTKEY000000001") return std::nullopt;
    aws::Credential c;
    c.access_key_id = "AKIATESTKEY000000001";
    c.secret_access_key = "testsecrettestsecrettestsecret0123456789";
    c.account_id = "123456789012";
    c.principal_arn = "arn:aws:iam::123456789012:user/tester";
    c.user_id = "AIDATESTER";
    return c;
  }
};

class FrontDoorTest : public ::testing::Test {
 protected:
  FrontDoorTest() {
    FrontDoorOptions options;
    options.account_id = "123456789012";
    options.version = "test";
    door_ = std::make_unique<FrontDoor>(options, &credentials_, nullptr);
    auto sagemaker = std::make_unique<JsonService>("SageMaker", "sagemaker", aws::Protocol::kJson11);
    sagemaker->Register("Echo", [](const aws::RequestContext&, const nlohmann::json& input) -> JsonOutcome {
      return nlohmann::json{{"Echoed", input}};
    });
    door_->AddJsonService(std::move(sagemaker));
  }

  // Sends a request through the front door, signed with `secret` unless it is empty.
  net::FakeResponseWriter Send(std::string method, std::string path, std::string query, HeaderMap headers,
                               std::string body, const std::string& service, const std::string& key_id,
                               const std::string& secret, int64_t time_millis = 0) {
    headers.emplace("Host", "127.0.0.1:5456");
    if (!secret.empty()) {
      aws::OwnedSignable signable{method, path, query, headers};
      aws::SignOptions sign;
      sign.access_key_id = key_id;
      sign.secret_access_key = secret;
      sign.service = service;
      sign.payload_hash = Sha256Hex(body);
      sign.time_millis = time_millis;
      aws::SignRequest(signable, sign);
      headers = signable.headers;
    }
    StringByteSource source(body);
    net::HttpRequest request;
    request.method = method;
    request.raw_path = path;
    request.raw_query = query;
    request.target = query.empty() ? path : path + "?" + query;
    request.headers = headers;
    request.body = &source;
    net::FakeResponseWriter writer;
    door_->Handle(request, writer);
    return writer;
  }

  net::FakeResponseWriter SendJson(const std::string& target, const std::string& body, const std::string& secret,
                                   const std::string& key_id = "AKIATESTKEY000000001", int64_t time_millis = 0) {
    return Send("POST", "/", "", {{"X-Amz-Target", target}, {"Content-Type", "application/x-amz-json-1.1"}}, body,
                "sagemaker", key_id, secret, time_millis);
  }

  static std::string ErrorType(const net::FakeResponseWriter& w) {
    auto j = nlohmann::json::parse(w.body(), nullptr, false);
    return j.is_object() ? j.value("__type", "") : "";
  }

  const std::string secret_ = "testsecrettestsecrettestsecret0123456789";
  FixedCredentials credentials_;
  std::unique_ptr<FrontDoor> door_;
};

TEST_F(FrontDoorTest, HealthNeedsNoCredentials) {
  auto w = Send("GET", "/_kiln/health", "", {}, "", "", "", "");
  EXPECT_EQ(w.status(), 200);
  EXPECT_NE(w.body().find("\"ok\""), std::string::npos);
}

TEST_F(FrontDoorTest, SignedJsonOperationRuns) {
  auto w = SendJson("SageMaker.Echo", R"({"A": 1})", secret_);
  EXPECT_EQ(w.status(), 200) << w.body();
  EXPECT_EQ(nlohmann::json::parse(w.body())["Echoed"]["A"], 1);
  EXPECT_NE(FindHeader(w.headers(), "x-amzn-RequestId"), nullptr);
}

TEST_F(FrontDoorTest, UnknownOperationIsNamed) {
  auto w = SendJson("SageMaker.ListTrainingJobs", "{}", secret_);
  EXPECT_EQ(w.status(), 400);
  EXPECT_EQ(ErrorType(w), "UnknownOperationException");
  EXPECT_NE(w.body().find("ListTrainingJobs"), std::string::npos);
}

TEST_F(FrontDoorTest, MalformedJsonIsSerializationException) {
  for (const char* target : {"SageMaker.Echo", "SageMaker.ListTrainingJobs"}) {
    auto w = SendJson(target, "{not json", secret_);
    EXPECT_EQ(w.status(), 400);
    EXPECT_EQ(ErrorType(w), "SerializationException") << target;
  }
  EXPECT_EQ(ErrorType(SendJson("SageMaker.Echo", "[1, 2]", secret_)), "SerializationException");
}

TEST_F(FrontDoorTest, OversizedRpcBodyIsRefusedFromContentLength) {
  // A body source that declares 17 MiB but fails if read: the answer must not need it.
  class DeclaredOnly final : public ByteSource {
   public:
    Result<size_t> Read(char*, size_t) override {
      ADD_FAILURE() << "the body was read";
      return Status::Internal("read");
    }
    std::optional<uint64_t> size_hint() const override { return 17u << 20; }
  } source;
  net::HttpRequest request;
  request.method = "POST";
  request.raw_path = "/";
  request.target = "/";
  request.headers = {
      {"X-Amz-Target", "SageMaker.Echo"}, {"Content-Type", "application/x-amz-json-1.1"}, {"Host", "127.0.0.1:5456"}};
  request.body = &source;
  net::FakeResponseWriter writer;
  door_->Handle(request, writer);
  EXPECT_EQ(writer.status(), 413);
  EXPECT_EQ(ErrorType(writer), "SerializationException");
}

TEST(FrontDoorBudgetTest, LargeBodiesPastTheInFlightBudgetAreThrottled) {
  FixedCredentials credentials;
  FrontDoorOptions options;
  options.auth_enabled = false;
  options.large_rpc_body_bytes = 1 << 20;
  options.max_large_rpc_bytes_in_flight = 3 << 20;
  options.large_rpc_wait_millis = 1000;
  FrontDoor door(options, &credentials, nullptr);
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, release = false;
  auto service = std::make_unique<JsonService>("SageMaker", "sagemaker", aws::Protocol::kJson11);
  service->Register("Hold", [&](const aws::RequestContext&, const nlohmann::json&) -> JsonOutcome {
    std::unique_lock<std::mutex> lock(mu);
    entered = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
    return nlohmann::json::object();
  });
  service->Register("Echo", [](const aws::RequestContext&, const nlohmann::json&) -> JsonOutcome {
    return nlohmann::json::object();
  });
  door.AddJsonService(std::move(service));
  auto send = [&](const std::string& operation, size_t size) {
    std::string body = R"({"Pad": ")" + std::string(size, 'p') + R"("})";
    StringByteSource source(body);
    net::HttpRequest request;
    request.method = "POST";
    request.raw_path = "/";
    request.target = "/";
    request.headers = {{"X-Amz-Target", "SageMaker." + operation},
                       {"Content-Type", "application/x-amz-json-1.1"},
                       {"Host", "127.0.0.1:5456"}};
    request.body = &source;
    net::FakeResponseWriter writer;
    door.Handle(request, writer);
    return writer;
  };
  // One large request alone always fits, whatever the budget.
  EXPECT_EQ(send("Echo", 4 << 20).status(), 200);

  std::thread holder([&] { EXPECT_EQ(send("Hold", 2 << 20).status(), 200); });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return entered; });
  }
  auto throttled = send("Echo", 2 << 20);  // 2 + 2 MiB > 3 MiB, still so after the 1 s wait
  EXPECT_EQ(throttled.status(), 400);
  EXPECT_EQ(nlohmann::json::parse(throttled.body())["__type"], "ThrottlingException") << throttled.body();
  EXPECT_EQ(send("Echo", 512 << 10).status(), 200);  // small bodies are not counted
  // A request that waits gets in as soon as the holder is answered.
  std::thread waiter([&] { EXPECT_EQ(send("Echo", 2 << 20).status(), 200); });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  holder.join();
  waiter.join();
  EXPECT_EQ(send("Echo", 2 << 20).status(), 200);  // the budget was given back
}

TEST_F(FrontDoorTest, AuthenticationFailuresPerJsonProtocol) {
  EXPECT_EQ(ErrorType(SendJson("SageMaker.Echo", "{}", "")), "MissingAuthenticationTokenException");
  EXPECT_EQ(ErrorType(SendJson("SageMaker.Echo", "{}", secret_, "AKIAUNKNOWN000000000")),
            "UnrecognizedClientException");
  EXPECT_EQ(ErrorType(SendJson("SageMaker.Echo", "{}", "wrong-secret-wrong-secret-wrong-secret00")),
            "InvalidSignatureException");
  auto skewed = SendJson("SageMaker.Echo", "{}", secret_, "AKIATESTKEY000000001", NowMillis() - 20 * 60 * 1000);
  EXPECT_EQ(ErrorType(skewed), "InvalidSignatureException");
  EXPECT_NE(skewed.body().find("Signature expired"), std::string::npos);
  EXPECT_NE(FindHeader(skewed.headers(), "Date"), nullptr);
}

TEST_F(FrontDoorTest, StsGetCallerIdentity) {
  std::string body = "Action=GetCallerIdentity&Version=2011-06-15";
  auto w = Send("POST", "/", "", {{"Content-Type", "application/x-www-form-urlencoded; charset=utf-8"}}, body, "sts",
                "AKIATESTKEY000000001", secret_);
  EXPECT_EQ(w.status(), 200) << w.body();
  EXPECT_NE(w.body().find("<Account>123456789012</Account>"), std::string::npos);
  EXPECT_NE(w.body().find("<Arn>arn:aws:iam::123456789012:user/tester</Arn>"), std::string::npos);

  auto bad = Send("POST", "/", "", {{"Content-Type", "application/x-www-form-urlencoded"}}, body, "sts",
                  "AKIAUNKNOWN000000000", secret_);
  EXPECT_EQ(bad.status(), 403);
  EXPECT_NE(bad.body().find("<Code>InvalidClientTokenId</Code>"), std::string::npos);

  auto unknown = Send("POST", "/", "", {{"Content-Type", "application/x-www-form-urlencoded"}},
                      "Action=AssumeRoot&Version=2011-06-15", "sts", "AKIATESTKEY000000001", secret_);
  EXPECT_EQ(unknown.status(), 400);
  EXPECT_NE(unknown.body().find("<Code>InvalidAction</Code>"), std::string::npos);
}

// ---- CloudWatch: JSON 1.0, Query (by signing scope, or by Action when unsigned) and RPC v2 CBOR.

class FrontDoorCloudWatchTest : public FrontDoorTest {
 protected:
  FrontDoorCloudWatchTest() {
    db_ = store::testing::OpenTestDatabase(dir_.path(), false);
    metrics_ = std::make_unique<observe::MetricStore>(db_.get());
    CloudWatchOptions options;
    options.store = metrics_.get();
    cloudwatch_ = std::make_unique<CloudWatch>(options);
    door_->AddJsonService(cloudwatch_->MakeJsonService());
    door_->SetCloudWatch(cloudwatch_.get());
  }
  net::FakeResponseWriter Form(const std::string& body, const std::string& service, const std::string& secret) {
    return Send("POST", "/", "", {{"Content-Type", "application/x-www-form-urlencoded; charset=utf-8"}}, body, service,
                "AKIATESTKEY000000001", secret);
  }
  net::FakeResponseWriter Cbor(const std::string& op, const std::string& body, const std::string& secret) {
    return Send("POST", std::string(kCloudWatchCborPathPrefix) + op, "",
                {{"smithy-protocol", "rpc-v2-cbor"}, {"Content-Type", "application/cbor"}}, body, "monitoring",
                "AKIATESTKEY000000001", secret);
  }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<observe::MetricStore> metrics_;
  std::unique_ptr<CloudWatch> cloudwatch_;
};

TEST_F(FrontDoorCloudWatchTest, QueryIsRoutedByScopeOrAction) {
  const std::string put =
      "Action=PutMetricData&Version=2010-08-01&Namespace=App&MetricData.member.1.MetricName=m"
      "&MetricData.member.1.Value=1";
  auto signed_put = Form(put, "monitoring", secret_);
  EXPECT_EQ(signed_put.status(), 200) << signed_put.body();
  EXPECT_NE(signed_put.body().find("<PutMetricDataResponse"), std::string::npos);
  auto list = Form("Action=ListMetrics&Version=2010-08-01", "monitoring", secret_);
  EXPECT_NE(list.body().find("<MetricName>m</MetricName>"), std::string::npos) << list.body();
  // STS keeps its requests; a CloudWatch action signed for sts is STS's unknown action.
  auto sts = Form("Action=ListMetrics&Version=2010-08-01", "sts", secret_);
  EXPECT_NE(sts.body().find("<Code>InvalidAction</Code>"), std::string::npos);
  EXPECT_NE(sts.body().find("sts.amazonaws.com"), std::string::npos);
  // Bad percent-encoding is MalformedQueryString for CloudWatch; authentication errors are Query's.
  auto malformed = Form("Action=ListMetrics&Namespace=%zz", "monitoring", secret_);
  EXPECT_EQ(malformed.status(), 400);
  EXPECT_NE(malformed.body().find("<Code>MalformedQueryString</Code>"), std::string::npos);
  EXPECT_NE(malformed.body().find("monitoring.amazonaws.com"), std::string::npos);
  auto bad_key = Send("POST", "/", "", {{"Content-Type", "application/x-www-form-urlencoded"}}, "Action=ListMetrics",
                      "monitoring", "AKIAUNKNOWN000000000", secret_);
  EXPECT_EQ(bad_key.status(), 403);
  EXPECT_NE(bad_key.body().find("<Code>InvalidClientTokenId</Code>"), std::string::npos);
}

TEST_F(FrontDoorCloudWatchTest, UnsignedQueryGoesByActionWhenAuthIsOff) {
  FrontDoorOptions options;
  options.auth_enabled = false;
  door_ = std::make_unique<FrontDoor>(options, &credentials_, nullptr);
  door_->SetCloudWatch(cloudwatch_.get());
  auto list = Form("Action=ListMetrics&Version=2010-08-01", "", "");
  EXPECT_EQ(list.status(), 200) << list.body();
  EXPECT_NE(list.body().find("<ListMetricsResponse"), std::string::npos);
  auto sts = Form("Action=GetCallerIdentity&Version=2011-06-15", "", "");
  EXPECT_NE(sts.body().find("<GetCallerIdentityResponse"), std::string::npos);
}

TEST_F(FrontDoorCloudWatchTest, Json10AndCbor) {
  auto json10 = Send("POST", "/", "",
                     {{"X-Amz-Target", "GraniteServiceVersion20100801.ListMetrics"},
                      {"Content-Type", "application/x-amz-json-1.0"},
                      {"x-amzn-query-mode", "true"}},
                     "{}", "monitoring", "AKIATESTKEY000000001", secret_);
  EXPECT_EQ(json10.status(), 200) << json10.body();
  EXPECT_EQ(nlohmann::json::parse(json10.body())["Metrics"], nlohmann::json::array());

  auto cbor = Cbor("ListMetrics", "", secret_);
  EXPECT_EQ(cbor.status(), 200) << cbor.body();
  auto decoded = aws::DecodeCbor(cbor.body());
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ((*decoded)["Metrics"], nlohmann::json::array());

  auto bad = Cbor("ListMetrics", std::string("\xbf\x61", 2), secret_);
  EXPECT_EQ(bad.status(), 400);
  EXPECT_EQ(*FindHeader(bad.headers(), "x-amzn-query-error"), "SerializationException;Sender");
  auto unknown = Cbor("ListMetrics/extra", "", secret_);
  EXPECT_EQ(unknown.status(), 404);
  // A wrong signature answers a CBOR error the client can read.
  auto unsigned_cbor = Cbor("ListMetrics", "", "wrong-secret");
  EXPECT_EQ(unsigned_cbor.status(), 400);
  auto error = aws::DecodeCbor(unsigned_cbor.body());
  ASSERT_TRUE(error.ok());
  EXPECT_EQ((*error)["__type"], "InvalidSignatureException");
}

// ---- The runtime route (InvokeEndpoint) and /metrics.

class FrontDoorRuntimeTest : public FrontDoorTest {
 protected:
  FrontDoorRuntimeTest()
      : metrics_({}, nullptr),
        router_(serving::RouterOptions{}, &routes_, &client_, &metrics_),
        exporter_(&metrics_, &routes_, &client_) {
    auto route = std::make_shared<serving::EndpointRoute>();
    route->name = "churn-ep";
    route->status = "InService";
    route->log_group_arn = "arn:aws:logs:us-east-1:123456789012:log-group:/aws/sagemaker/Endpoints/churn-ep";
    serving::VariantRoute variant;
    variant.name = "AllTraffic";
    auto instance = std::make_shared<serving::InstanceTarget>();
    instance->instance_id = "i-1";
    instance->port = container_.port();
    variant.instances.push_back(instance);
    route->variants.push_back(variant);
    routes_.Publish(route);
    container_.Respond(200, "{\"predictions\":[0.02]}");
  }

  net::FakeResponseWriter Invoke(std::string path, std::string body, HeaderMap headers = {{"Content-Type", "text/csv"}},
                                 const std::string& secret = "testsecrettestsecrettestsecret0123456789") {
    return Send("POST", path, "", headers, body, "sagemaker", "AKIATESTKEY000000001", secret);
  }
  static std::string Type(const net::FakeResponseWriter& w) { return w.header("x-amzn-ErrorType"); }
  static std::string Message(const net::FakeResponseWriter& w) {
    auto j = nlohmann::json::parse(w.body(), nullptr, false);
    return j.is_object() ? j.value("Message", "") : "";
  }

  serving::testing::FakeContainer container_;
  serving::RoutingTable routes_;
  net::HttpClient client_;
  serving::InvocationMetrics metrics_;
  serving::Router router_;
  serving::PrometheusExporter exporter_;
};

TEST_F(FrontDoorRuntimeTest, WithoutRouterTheRuntimeIsUnknown) {
  auto w = Invoke("/endpoints/churn-ep/invocations", "1,2");
  EXPECT_EQ(w.status(), 404);
  EXPECT_EQ(Type(w), "UnknownOperationException");
}

TEST_F(FrontDoorRuntimeTest, SignedInvokeReachesTheContainer) {
  door_->SetRuntime(&router_);
  auto w = Invoke("/endpoints/churn-ep/invocations", "69,0,153.7",
                  {{"Content-Type", "text/csv"}, {"Accept", "application/json"}});
  ASSERT_EQ(w.status(), 200) << w.body();
  EXPECT_EQ(w.body(), "{\"predictions\":[0.02]}");
  EXPECT_EQ(w.header("x-Amzn-Invoked-Production-Variant"), "AllTraffic");
  EXPECT_EQ(w.header("Content-Type"), "application/json");
  EXPECT_FALSE(w.header("x-amzn-RequestId").empty());
  auto received = container_.received();
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].body, "69,0,153.7");
  EXPECT_EQ(received[0].head.find("Authorization"), std::string::npos);
  EXPECT_NE(received[0].head.find("X-Amzn-RequestId: " + w.header("x-amzn-RequestId")), std::string::npos);
  // The request is still intact for the access log and later handlers (lent, not moved away).
  EXPECT_EQ((metrics_.Totals()[{"churn-ep", "AllTraffic"}].invocations), 1u);
}

TEST_F(FrontDoorRuntimeTest, AuthenticationIsRequired) {
  door_->SetRuntime(&router_);
  auto w = Invoke("/endpoints/churn-ep/invocations", "1", {{"Content-Type", "text/csv"}}, "");
  EXPECT_EQ(w.status(), 403);
  EXPECT_EQ(Type(w), "MissingAuthenticationTokenException");
  w = Invoke("/endpoints/churn-ep/invocations", "1", {{"Content-Type", "text/csv"}},
             "wrong-secret-wrong-secret-wrong-secret00");
  EXPECT_EQ(w.status(), 403);
  EXPECT_EQ(Type(w), "InvalidSignatureException");
  EXPECT_EQ(container_.requests(), 0u);
}

TEST_F(FrontDoorRuntimeTest, BodyOverTheLimitIs413WithoutErrorType) {
  door_->SetRuntime(&router_);
  auto w = Invoke("/endpoints/churn-ep/invocations", std::string(6291457, 'a'));
  EXPECT_EQ(w.status(), 413);
  EXPECT_EQ(w.body(), "{\"message\":\"HTTP content length exceeded 6291456 bytes.\"}");
  EXPECT_FALSE(w.has_header("x-amzn-ErrorType"));
  EXPECT_TRUE(w.close());
  // Exactly at the limit is served.
  w = Invoke("/endpoints/churn-ep/invocations", std::string(6291456, 'a'));
  EXPECT_EQ(w.status(), 200) << w.body().substr(0, 200);
  EXPECT_EQ(container_.requests(), 1u);
}

TEST_F(FrontDoorRuntimeTest, PathAndEndpointErrors) {
  door_->SetRuntime(&router_);
  auto w = Invoke("/endpoints/nope/invocations", "1");
  EXPECT_EQ(w.status(), 400);
  EXPECT_EQ(Type(w), "ValidationError");
  EXPECT_EQ(Message(w), "Endpoint nope of account 123456789012 not found.");
  w = Invoke("/endpoints/bad_name/invocations", "1");
  EXPECT_EQ(Type(w), "ValidationError");
  EXPECT_NE(Message(w).find("endpointName"), std::string::npos);
  w = Invoke("/endpoints/churn-ep/async-invocations", "");
  EXPECT_EQ(Type(w), "ValidationError");
  EXPECT_NE(Message(w).find("InvokeEndpointAsync"), std::string::npos);
  w = Invoke("/endpoints/churn-ep/other", "1");
  EXPECT_EQ(w.status(), 404);
  EXPECT_EQ(Type(w), "UnknownOperationException");
  EXPECT_EQ(container_.requests(), 0u);
}

TEST_F(FrontDoorRuntimeTest, MetricsRoute) {
  door_->SetRuntime(&router_);
  door_->SetMetricsExporter(&exporter_);
  ASSERT_EQ(Invoke("/endpoints/churn-ep/invocations", "1").status(), 200);
  auto w = Send("GET", "/metrics", "", {}, "", "", "", "");
  ASSERT_EQ(w.status(), 200);
  EXPECT_EQ(w.header("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(w.body().find("kiln_invocations_total{endpoint=\"churn-ep\",variant=\"AllTraffic\"} 1\n"),
            std::string::npos)
      << w.body();
  EXPECT_NE(w.body().find("kiln_routable_instances{endpoint=\"churn-ep\",variant=\"AllTraffic\"} 1\n"),
            std::string::npos);
}

// ---- The invoke path on an event loop (net::AsyncService).

// An exchange as the server would give Serve(): the request and its whole body, the loop, and
// what Respond() got.
class FakeExchange final : public net::AsyncExchange {
 public:
  FakeExchange(net::HttpRequest request, std::string body, net::EventLoop* loop)
      : request_(std::move(request)), body_(std::move(body)), loop_(loop) {}
  const net::HttpRequest& request() const override { return request_; }
  std::string_view body() const override { return body_; }
  net::EventLoop& loop() override { return *loop_; }
  int64_t start_steady_ns() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(start_.time_since_epoch()).count();
  }
  void Respond(int status, const HeaderMap& headers, std::string body) override {
    EXPECT_TRUE(loop_->InLoopThread());
    if (++responds_ > 1) ADD_FAILURE() << "Respond called twice";
    answer_.status = status;
    answer_.headers = headers;
    answer_.body = std::move(body);
    answered_.set_value();
  }
  void CloseAfterResponse() override { close_ = true; }

  // Waits for Respond (at most 20 s).
  const aws::WireResponse& Answer() {
    if (answered_.get_future().wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      ADD_FAILURE() << "no answer within 20 s";
      std::abort();  // the loop still references this exchange
    }
    return answer_;
  }
  bool close() const { return close_; }

 private:
  net::HttpRequest request_;
  std::string body_;
  net::EventLoop* loop_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::promise<void> answered_;
  aws::WireResponse answer_;
  int responds_ = 0;
  bool close_ = false;
};

class FrontDoorAsyncTest : public FrontDoorRuntimeTest {
 protected:
  FrontDoorAsyncTest() : loop_(0, net::HttpClientOptions{}), thread_([this] { loop_.Run(); }) {}
  ~FrontDoorAsyncTest() override {
    loop_.Stop();
    thread_.join();
  }

  // The request header as the server parses it, signed with `secret` for `service` unless empty.
  static net::HttpRequest Head(std::string method, std::string path, HeaderMap headers, const std::string& body,
                               const std::string& secret, const std::string& service = "sagemaker") {
    headers.emplace("Host", "127.0.0.1:5456");
    if (!secret.empty()) {
      aws::OwnedSignable signable{method, path, "", headers};
      aws::SignOptions sign;
      sign.access_key_id = "AKIATESTKEY000000001";
      sign.secret_access_key = secret;
      sign.service = service;
      sign.payload_hash = Sha256Hex(body);
      aws::SignRequest(signable, sign);
      headers = signable.headers;
    }
    net::HttpRequest request;
    request.method = std::move(method);
    request.raw_path = path;
    request.target = std::move(path);
    request.headers = std::move(headers);
    request.remote_address = "127.0.0.1:40000";
    return request;
  }

  // Serve() on the loop, as the server calls it; returns the answer.
  aws::WireResponse Serve(std::string path, std::string body, const std::string& secret,
                          HeaderMap headers = {{"Content-Type", "text/csv"}}) {
    net::HttpRequest head = Head("POST", path, std::move(headers), body, secret);
    EXPECT_TRUE(door_->Claims(head)) << path;
    FakeExchange exchange(std::move(head), std::move(body), &loop_);
    loop_.Post([&] { door_->Serve(exchange); });
    return exchange.Answer();
  }
  static std::string Header(const aws::WireResponse& wire, std::string_view name) {
    const std::string* value = FindHeader(wire.headers, name);
    return value != nullptr ? *value : std::string();
  }
  static std::string Message(const aws::WireResponse& wire) {
    auto j = nlohmann::json::parse(wire.body, nullptr, false);
    return j.is_object() ? j.value("Message", "") : "";
  }

  net::EventLoop loop_;
  std::thread thread_;
};

TEST_F(FrontDoorAsyncTest, ClaimsExactlyWhatHandleRoutesToTheInvokePath) {
  const std::string secret = "testsecrettestsecrettestsecret0123456789";
  const std::string invocations = "/endpoints/churn-ep/invocations";
  // Without a Router nothing is claimed (Handle answers UnknownOperationException).
  EXPECT_FALSE(door_->Claims(Head("POST", invocations, {}, "1", secret)));
  EXPECT_EQ(door_->max_body_bytes(), 0u);
  door_->SetRuntime(&router_);
  EXPECT_EQ(door_->max_body_bytes(), 6291456u);
  EXPECT_TRUE(door_->Claims(Head("POST", invocations, {}, "1", secret)));
  EXPECT_TRUE(door_->Claims(Head("POST", invocations, {}, "1", "")));  // unsigned: Serve answers 403
  EXPECT_TRUE(door_->Claims(Head("POST", "/endpoints/bad_name/invocations", {}, "1", secret)));
  // Not the synchronous invocation, or not the runtime at all.
  EXPECT_FALSE(door_->Claims(Head("GET", invocations, {}, "", secret)));
  EXPECT_FALSE(door_->Claims(Head("POST", "/endpoints/churn-ep/async-invocations", {}, "1", secret)));
  EXPECT_FALSE(door_->Claims(Head("POST", "/endpoints/churn-ep/invocations-response-stream", {}, "1", secret)));
  EXPECT_FALSE(door_->Claims(Head("POST", "/endpoints/churn-ep", {}, "1", secret)));
  EXPECT_FALSE(door_->Claims(Head("POST", "/endpoints/a/b/invocations", {}, "1", secret)));
  EXPECT_FALSE(door_->Claims(Head("POST", invocations, {{"X-Amz-Target", "SageMaker.Echo"}}, "1", secret)));
  EXPECT_FALSE(door_->Claims(Head("POST", invocations, {}, "1", secret, "s3")));   // an S3 key
  EXPECT_FALSE(door_->Claims(Head("POST", invocations, {}, "1", secret, "sts")));  // STS's
}

TEST_F(FrontDoorAsyncTest, SignedInvokeIsServedOnTheLoopAsHandleServesIt) {
  door_->SetRuntime(&router_);
  aws::WireResponse wire = Serve("/endpoints/churn-ep/invocations", "69,0,153.7", secret_,
                                 {{"Content-Type", "text/csv"}, {"Accept", "application/json"}});
  ASSERT_EQ(wire.status, 200) << wire.body;
  EXPECT_EQ(wire.body, "{\"predictions\":[0.02]}");
  EXPECT_EQ(Header(wire, "x-Amzn-Invoked-Production-Variant"), "AllTraffic");
  EXPECT_EQ(Header(wire, "Content-Type"), "application/json");
  ASSERT_FALSE(Header(wire, "x-amzn-RequestId").empty());
  auto received = container_.received();
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].body, "69,0,153.7");
  EXPECT_EQ(received[0].head.find("Authorization"), std::string::npos);
  EXPECT_NE(received[0].head.find("X-Amzn-RequestId: " + Header(wire, "x-amzn-RequestId")), std::string::npos);
  EXPECT_EQ((metrics_.Totals()[{"churn-ep", "AllTraffic"}].invocations), 1u);
  // The blocking path's answer has the same headers and body.
  auto w = Invoke("/endpoints/churn-ep/invocations", "69,0,153.7",
                  {{"Content-Type", "text/csv"}, {"Accept", "application/json"}});
  EXPECT_EQ(w.status(), 200);
  EXPECT_EQ(w.body(), wire.body);
  HeaderMap sync_headers = w.headers(), async_headers = wire.headers;
  sync_headers.erase("x-amzn-RequestId");
  async_headers.erase("x-amzn-RequestId");
  EXPECT_EQ(sync_headers, async_headers);
}

TEST_F(FrontDoorAsyncTest, AuthenticationAndPathErrorsAreTheBlockingPathsAnswers) {
  door_->SetRuntime(&router_);
  const std::string secret = "testsecrettestsecrettestsecret0123456789";
  struct Case {
    std::string path;
    std::string secret;
    int status;
    std::string type;
  };
  for (const Case& c : std::vector<Case>{
           {"/endpoints/churn-ep/invocations", "", 403, "MissingAuthenticationTokenException"},
           {"/endpoints/churn-ep/invocations", "wrong-secret-wrong-secret-wrong-secret00", 403,
            "InvalidSignatureException"},
           {"/endpoints/bad_name/invocations", secret, 400, "ValidationError"},
           {"/endpoints/nope/invocations", secret, 400, "ValidationError"},
       }) {
    aws::WireResponse wire = Serve(c.path, "1", c.secret);
    EXPECT_EQ(wire.status, c.status) << c.path << " " << wire.body;
    EXPECT_EQ(Header(wire, "x-amzn-ErrorType"), c.type) << c.path;
    auto w = Invoke(c.path, "1", {{"Content-Type", "text/csv"}}, c.secret);
    EXPECT_EQ(w.status(), wire.status) << c.path;
    EXPECT_EQ(Type(w), c.type) << c.path;
    EXPECT_EQ(FrontDoorRuntimeTest::Message(w), Message(wire)) << c.path;
  }
  EXPECT_EQ(container_.requests(), 0u);
}

// Per-request cost of the invoke path, in process (not run by default):
//   api_test --gtest_also_run_disabled_tests --gtest_filter='*InvokeCost*' 2>/dev/null
// Rows: the client alone against the fake container (the floor), Router::Invoke, and the whole
// FrontDoor::Handle with one pre-signed request replayed (SigV4 verify + body hash + access log),
// with the access log at info (written to /dev/null) and with it filtered out.
TEST_F(FrontDoorRuntimeTest, DISABLED_InvokeCost) {
  InitLogging("info");
  door_->SetRuntime(&router_);
  constexpr int kWarm = 200, kRuns = 5000;
  std::string payload = "69,0,153.7,109,3";
  auto micros = [](auto fn) {
    for (int i = 0; i < kWarm; ++i) fn();
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kRuns; ++i) fn();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / kRuns;
  };
  HeaderMap forward{{"Content-Type", "text/csv"}};
  net::ClientRequest call;
  call.target = "/invocations";
  call.headers = &forward;
  call.body = payload;
  double direct = micros([&] { ASSERT_TRUE(client_.Send("127.0.0.1", container_.port(), call, {}).ok()); });

  HeaderMap headers{{"Content-Type", "text/csv"}, {"Host", "127.0.0.1:5456"}};
  serving::InvokeRequest invoke;
  invoke.endpoint_name = "churn-ep";
  invoke.headers = &headers;
  invoke.body = payload;
  invoke.request_id = "r";
  invoke.account_id = "123456789012";
  double router = micros([&] {
    net::FakeResponseWriter w;
    router_.Invoke(invoke, w);
    ASSERT_EQ(w.status(), 200);
  });

  aws::OwnedSignable signable{"POST", "/endpoints/churn-ep/invocations", "", headers};
  aws::SignOptions sign;
  sign.access_key_id = "AKIATESTKEY000000001";
  sign.secret_access_key = secret_;
  sign.service = "sagemaker";
  sign.payload_hash = Sha256Hex(payload);
  aws::SignRequest(signable, sign);
  auto door = [&] {
    StringByteSource source(payload);
    net::HttpRequest request;
    request.method = "POST";
    request.raw_path = "/endpoints/churn-ep/invocations";
    request.target = request.raw_path;
    request.headers = signable.headers;
    request.body = &source;
    net::FakeResponseWriter w;
    door_->Handle(request, w);
    ASSERT_EQ(w.status(), 200) << w.body();
  };
  double with_log = micros(door);
  spdlog::set_level(spdlog::level::warn);
  double without_log = micros(door);
  spdlog::set_level(spdlog::level::info);
  std::printf(
      "invoke cost (us/request, c=1): client only %.1f | router %.1f (+%.1f) | front door with access log "
      "%.1f (+%.1f over router) | front door, log filtered %.1f (access log %.1f)\n",
      direct, router, router - direct, with_log, with_log - router, without_log, with_log - without_log);
}

TEST(AuthErrorForTest, S3Codes) {
  auto code = [](aws::AuthFailure f) { return AuthErrorFor(aws::Protocol::kRestXml, {f, "m", "", ""}); };
  EXPECT_EQ(code(aws::AuthFailure::kMissing).code, "AccessDenied");
  EXPECT_EQ(code(aws::AuthFailure::kMissing).http_status, 403);
  EXPECT_EQ(code(aws::AuthFailure::kMalformed).code, "AuthorizationHeaderMalformed");
  EXPECT_EQ(code(aws::AuthFailure::kMalformed).http_status, 400);
  EXPECT_EQ(code(aws::AuthFailure::kUnknownKey).code, "InvalidAccessKeyId");
  EXPECT_EQ(code(aws::AuthFailure::kBadSignature).code, "SignatureDoesNotMatch");
  EXPECT_EQ(code(aws::AuthFailure::kSkewed).code, "RequestTimeTooSkewed");
  EXPECT_EQ(code(aws::AuthFailure::kExpired).code, "AccessDenied");
  EXPECT_EQ(AuthErrorFor(aws::Protocol::kRestJson, {aws::AuthFailure::kBadSignature, "", "", ""}).http_status, 403);
  EXPECT_EQ(AuthErrorFor(aws::Protocol::kJson11, {aws::AuthFailure::kBadSignature, "", "", ""}).http_status, 400);
}

// Issue 9: presigned-URL failures answer as S3 does.
TEST(AuthErrorForTest, S3PresignedForms) {
  aws::AuthError v4{aws::AuthFailure::kMalformed, "X-Amz-Expires must be non-negative", "", ""};
  v4.form = aws::AuthForm::kQueryV4;
  aws::AwsError e = AuthErrorFor(aws::Protocol::kRestXml, v4);
  EXPECT_EQ(e.code, "AuthorizationQueryParametersError");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.message, "X-Amz-Expires must be non-negative");
  aws::AuthError v2{aws::AuthFailure::kMalformed, "Invalid date (should be seconds since epoch): x", "", ""};
  v2.form = aws::AuthForm::kQueryV2;
  e = AuthErrorFor(aws::Protocol::kRestXml, v2);
  EXPECT_EQ(e.code, "AccessDenied");
  EXPECT_EQ(e.http_status, 403);
  aws::AuthError expired{aws::AuthFailure::kExpired, "Request has expired", "", ""};
  expired.form = aws::AuthForm::kQueryV4;
  expired.details = {
      {"X-Amz-Expires", "60"}, {"Expires", "2024-05-01T10:01:00Z"}, {"ServerTime", "2024-05-01T10:02:00Z"}};
  e = AuthErrorFor(aws::Protocol::kRestXml, expired);
  EXPECT_EQ(e.code, "AccessDenied");
  EXPECT_EQ(e.http_status, 403);
  EXPECT_EQ(e.message, "Request has expired");
  EXPECT_EQ(e.fields, expired.details);
  auto wire = aws::SerializeError(aws::Protocol::kRestXml, e, "REQ");
  EXPECT_NE(wire.body.find("<Message>Request has expired</Message><X-Amz-Expires>60</X-Amz-Expires>"
                           "<Expires>2024-05-01T10:01:00Z</Expires><ServerTime>2024-05-01T10:02:00Z</ServerTime>"),
            std::string::npos)
      << wire.body;
  // The header form keeps AuthorizationHeaderMalformed.
  EXPECT_EQ(AuthErrorFor(aws::Protocol::kRestXml, {aws::AuthFailure::kMalformed, "m", "", ""}).code,
            "AuthorizationHeaderMalformed");
}

// The event-loop invoke path's cost (not run by default):
//   api_test --gtest_also_run_disabled_tests --gtest_filter='*AsyncInvokeCost*' 2>/dev/null
// One pre-signed request served again and again on the loop, each answer starting the next one on
// the same loop (no thread hop in the measurement): wall time and the loop thread's CPU time per
// request (FrontDoor::Serve: SigV4 + body hash, path checks, Router::InvokeAsync, the upstream
// call over the loop's pooled connection, access log). The fake container's threads are not in
// the CPU column; the wall column includes them.
TEST_F(FrontDoorAsyncTest, DISABLED_AsyncInvokeCost) {
  InitLogging("info");
  door_->SetRuntime(&router_);
  const std::string payload = "69,0,153.7,109,3";
  const net::HttpRequest head =
      Head("POST", "/endpoints/churn-ep/invocations", {{"Content-Type", "text/csv"}}, payload, secret_);
  // An exchange that serves itself `left` times.
  struct Chain final : public net::AsyncExchange {
    const net::HttpRequest* head = nullptr;
    std::string_view payload;
    net::EventLoop* event_loop = nullptr;
    FrontDoor* door = nullptr;
    int left = 0;
    int failures = 0;
    std::promise<void> done;
    const net::HttpRequest& request() const override { return *head; }
    std::string_view body() const override { return payload; }
    net::EventLoop& loop() override { return *event_loop; }
    int64_t start_steady_ns() const override {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    }
    void Respond(int status, const HeaderMap&, std::string) override {
      if (status != 200) ++failures;
      if (--left == 0) {
        done.set_value();
      } else {
        event_loop->Post([this] { door->Serve(*this); });
      }
    }
    void CloseAfterResponse() override {}
  };
  clockid_t loop_clock;
  ASSERT_EQ(pthread_getcpuclockid(thread_.native_handle(), &loop_clock), 0);
  auto cpu_micros = [&] {
    timespec t{};
    clock_gettime(loop_clock, &t);
    return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
  };
  auto run = [&](int requests) {
    Chain chain;
    chain.head = &head;
    chain.payload = payload;
    chain.event_loop = &loop_;
    chain.door = door_.get();
    chain.left = requests;
    std::future<void> finished = chain.done.get_future();
    double cpu_start = cpu_micros();
    auto wall_start = std::chrono::steady_clock::now();
    loop_.Post([&] { door_->Serve(chain); });
    finished.wait();
    double wall = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - wall_start).count();
    double cpu = cpu_micros() - cpu_start;
    EXPECT_EQ(chain.failures, 0);
    return std::pair{wall / requests, cpu / requests};
  };
  run(500);  // warm: the pooled connection, the signing key, the allocator
  auto [wall_log, cpu_log] = run(5000);
  spdlog::set_level(spdlog::level::warn);
  auto [wall_quiet, cpu_quiet] = run(5000);
  spdlog::set_level(spdlog::level::info);
  std::printf(
      "async invoke cost (us/request, c=1): with access log: wall %.1f, loop CPU %.1f | log filtered: wall %.1f, "
      "loop CPU %.1f\n",
      wall_log, cpu_log, wall_quiet, cpu_quiet);
}

}  // namespace
}  // namespace kiln::api
