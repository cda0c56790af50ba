#include "serving/router.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <thread>
#include <nlohmann/json.hpp>

#include "net/event_loop.h"

#include "net/test_util/fake_response_writer.h"
#include "serving/test_util/fake_container.h"

namespace kiln::serving {
namespace {

using testing::FakeContainer;

std::shared_ptr<InstanceTarget> Instance(std::string id, uint16_t port, int64_t outstanding = 0) {
  auto instance = std::make_shared<InstanceTarget>();
  instance->instance_id = std::move(id);
  instance->port = port;
  instance->outstanding = outstanding;
  return instance;
}

VariantRoute Variant(std::string name, double weight, std::vector<std::shared_ptr<const InstanceTarget>> instances) {
  VariantRoute variant;
  variant.name = std::move(name);
  variant.weight = weight;
  variant.instances = std::move(instances);
  return variant;
}

// ---- Selection (no network).

TEST(PickVariantTest, WeightedSplitIsWithinTolerance) {
  EndpointRoute route;
  route.variants = {Variant("A", 0.7, {}), Variant("B", 0.3, {})};
  SeedThreadRandomForTest(42);
  std::map<std::string, int> counts;
  constexpr int kPicks = 100000;
  for (int i = 0; i < kPicks; ++i) counts[Router::PickVariant(route, "", ThreadUniform())->name]++;
  // Binomial sd = sqrt(n p (1-p)) ≈ 145; allow 5 sd.
  EXPECT_NEAR(counts["A"], 70000, 725);
  EXPECT_NEAR(counts["B"], 30000, 725);
}

TEST(PickVariantTest, WeightsNeedNotSumToOneAndZeroIsNeverPicked) {
  EndpointRoute route;
  route.variants = {Variant("A", 2, {}), Variant("Z", 0, {}), Variant("B", 6, {})};
  EXPECT_EQ(Router::PickVariant(route, "", 0.0)->name, "A");
  EXPECT_EQ(Router::PickVariant(route, "", 0.2499)->name, "A");
  EXPECT_EQ(Router::PickVariant(route, "", 0.2501)->name, "B");
  EXPECT_EQ(Router::PickVariant(route, "", 0.999999)->name, "B");
}

// A traffic shift (DeploymentConfig): the fleet first by new_fleet_fraction, then the variant;
// a TargetVariant found in either fleet.
TEST(PickVariantTest, ShiftPicksTheFleetByItsFraction) {
  EndpointRoute route;
  route.variants = {Variant("AllTraffic", 1, {}), Variant("OldOnly", 0, {})};
  route.new_variants = {Variant("AllTraffic", 1, {}), Variant("NewOnly", 0, {})};
  SeedThreadRandomForTest(7);
  // No shift yet: the old fleet only.
  EXPECT_EQ(Router::PickFleetVariant(route, "", 0.0, 0.5), &route.variants[0]);
  route.new_fleet_fraction = 0.25;
  EXPECT_EQ(Router::PickFleetVariant(route, "", 0.2499, 0.5), &route.new_variants[0]);
  EXPECT_EQ(Router::PickFleetVariant(route, "", 0.25, 0.5), &route.variants[0]);
  EXPECT_EQ(Router::PickFleetVariant(route, "AllTraffic", 0.1, 0.5), &route.new_variants[0]);
  EXPECT_EQ(Router::PickFleetVariant(route, "AllTraffic", 0.9, 0.5), &route.variants[0]);
  EXPECT_EQ(Router::PickFleetVariant(route, "NewOnly", 0.9, 0.5), &route.new_variants[1]);
  EXPECT_EQ(Router::PickFleetVariant(route, "OldOnly", 0.1, 0.5), &route.variants[1]);
  EXPECT_EQ(Router::PickFleetVariant(route, "nope", 0.1, 0.5), nullptr);
  route.new_fleet_fraction = 1.0;
  int to_new = 0;
  for (int i = 0; i < 1000; ++i)
    to_new += Router::PickFleetVariant(route, "", ThreadUniform(), 0.5) == &route.new_variants[0];
  EXPECT_EQ(to_new, 1000);
  route.new_fleet_fraction = 0.3;
  to_new = 0;
  for (int i = 0; i < 10000; ++i)
    to_new += Router::PickFleetVariant(route, "", ThreadUniform(), 0.5) == &route.new_variants[0];
  EXPECT_NEAR(to_new / 10000.0, 0.3, 0.03);
}

TEST(PickVariantTest, TargetVariantBypassesWeights) {
  EndpointRoute route;
  route.variants = {Variant("A", 1, {}), Variant("Z", 0, {})};
  EXPECT_EQ(Router::PickVariant(route, "Z", 0.1)->name, "Z");
  EXPECT_EQ(Router::PickVariant(route, "nope", 0.1), nullptr);
  route.variants[0].weight = 0;
  EXPECT_EQ(Router::PickVariant(route, "", 0.1), nullptr);
  EXPECT_EQ(Router::PickVariant(route, "A", 0.1)->name, "A");
}

TEST(PickInstanceTest, LeastOutstandingWithRandomTies) {
  auto a = Instance("a", 1, 3), b = Instance("b", 2, 1), c = Instance("c", 3, 1), d = Instance("d", 4, 2);
  VariantRoute variant = Variant("V", 1, {a, b, c, d});
  SeedThreadRandomForTest(7);
  std::map<std::string, int> counts;
  for (int i = 0; i < 10000; ++i) counts[Router::PickInstance(variant, nullptr)->instance_id]++;
  EXPECT_EQ(counts["a"], 0);
  EXPECT_EQ(counts["d"], 0);
  EXPECT_NEAR(counts["b"], 5000, 300);
  EXPECT_NEAR(counts["c"], 5000, 300);
  // Excluded instance is skipped even when it is the least busy.
  EXPECT_EQ(Router::PickInstance(variant, b.get())->instance_id, "c");
  b->outstanding = 0;
  EXPECT_EQ(Router::PickInstance(variant, nullptr)->instance_id, "b");
}

TEST(PickInstanceTest, RandomStrategyAndEmpty) {
  auto a = Instance("a", 1, 100), b = Instance("b", 2, 0);
  VariantRoute variant = Variant("V", 1, {a, b});
  variant.strategy = RoutingStrategy::kRandom;
  std::map<std::string, int> counts;
  for (int i = 0; i < 10000; ++i) counts[Router::PickInstance(variant, nullptr)->instance_id]++;
  EXPECT_NEAR(counts["a"], 5000, 300);  // outstanding ignored
  EXPECT_EQ(Router::PickInstance(variant, a.get())->instance_id, "b");
  VariantRoute single = Variant("S", 1, {a});
  EXPECT_EQ(Router::PickInstance(single, a.get()), nullptr);
  EXPECT_EQ(Router::PickInstance(Variant("E", 1, {}), nullptr), nullptr);
}

// ---- Invoke against fake containers.

class RouterTest : public ::testing::Test {
 protected:
  RouterTest() : metrics_({}, nullptr) {
    RouterOptions options;
    options.invocation_timeout_ms = 500;
    router_ = std::make_unique<Router>(options, &routes_, &client_, &metrics_);
  }

  // Publishes endpoint "ep" with one variant "AllTraffic" over the given ports (instances "i-0",
  // "i-1", ...); returns the instances (the controller's handles on them).
  std::vector<std::shared_ptr<InstanceTarget>> PublishEndpoint(std::vector<uint16_t> ports,
                                                               std::string status = "InService") {
    auto route = std::make_shared<EndpointRoute>();
    route->name = "ep";
    route->status = std::move(status);
    route->log_group_arn = "arn:aws:logs:us-east-1:123456789012:log-group:/aws/sagemaker/Endpoints/ep";
    VariantRoute variant = Variant("AllTraffic", 1, {});
    std::vector<std::shared_ptr<InstanceTarget>> instances;
    int i = 0;
    for (uint16_t port : ports) instances.push_back(Instance("i-" + std::to_string(i++), port));
    variant.instances.assign(instances.begin(), instances.end());
    route->variants.push_back(variant);
    routes_.Publish(route);
    return instances;
  }

  // Replaces the router by one whose invocation timeout is `timeout_ms`.
  void SetInvocationTimeout(int timeout_ms) {
    RouterOptions options;
    options.invocation_timeout_ms = timeout_ms;
    router_ = std::make_unique<Router>(options, &routes_, &client_, &metrics_);
  }

  net::FakeResponseWriter Invoke(HeaderMap headers, std::string body = "1,2,3", std::string endpoint = "ep") {
    InvokeRequest request;
    request.endpoint_name = endpoint;
    request.headers = &headers;
    request.body = body;
    request.request_id = "req-1";
    request.account_id = "123456789012";
    request.start_steady_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
    net::FakeResponseWriter writer;
    router_->Invoke(request, writer);
    return writer;
  }

  static nlohmann::json Body(const net::FakeResponseWriter& w) { return nlohmann::json::parse(w.body()); }

  InvocationCounts Totals(std::string variant = "AllTraffic") { return metrics_.Totals()[{"ep", variant}]; }

  RoutingTable routes_;
  net::HttpClient client_;
  InvocationMetrics metrics_;
  std::unique_ptr<Router> router_;
};

TEST_F(RouterTest, ForwardsOnlyContractHeadersAndReturnsTheAnswer) {
  FakeContainer container;
  container.Respond(200, "{\"predictions\":[0.5]}",
                    "Content-Type: application/json\r\nX-Amzn-SageMaker-Custom-Attributes: c=1\r\n"
                    "X-Amzn-SageMaker-New-Session-Id: s-9\r\nX-Secret: no\r\n");
  PublishEndpoint({container.port()});
  auto w = Invoke({{"Content-Type", "text/csv"},
                   {"Accept", "application/json"},
                   {"X-Amzn-SageMaker-Custom-Attributes", "trace=1"},
                   {"X-Amzn-SageMaker-Inference-Id", "inf-1"},
                   {"X-Amzn-SageMaker-Session-Id", "NEW_SESSION"},
                   {"Authorization", "AWS4-HMAC-SHA256 Credential=..."},
                   {"X-Amz-Date", "20240501T100000Z"},
                   {"X-Amz-Security-Token", "tok"},
                   {"Cookie", "a=b"}});
  ASSERT_EQ(w.status(), 200) << w.body();
  EXPECT_EQ(w.body(), "{\"predictions\":[0.5]}");
  EXPECT_EQ(w.header("Content-Type"), "application/json");
  EXPECT_EQ(w.header("X-Amzn-SageMaker-Custom-Attributes"), "c=1");
  EXPECT_EQ(w.header("X-Amzn-SageMaker-New-Session-Id"), "s-9");
  EXPECT_EQ(w.header("x-Amzn-Invoked-Production-Variant"), "AllTraffic");
  EXPECT_EQ(w.header("x-amzn-RequestId"), "req-1");
  EXPECT_FALSE(w.has_header("X-Secret"));

  auto received = container.received();
  ASSERT_EQ(received.size(), 1u);
  std::string head = received[0].head;
  EXPECT_TRUE(head.starts_with("POST /invocations HTTP/1.1\r\n")) << head;
  EXPECT_EQ(received[0].body, "1,2,3");
  for (std::string_view want :
       {"Content-Type: text/csv\r\n", "Accept: application/json\r\n", "X-Amzn-SageMaker-Custom-Attributes: trace=1\r\n",
        "X-Amzn-SageMaker-Inference-Id: inf-1\r\n", "X-Amzn-SageMaker-Session-Id: NEW_SESSION\r\n",
        "X-Amzn-RequestId: req-1\r\n"}) {
    EXPECT_NE(head.find(want), std::string::npos) << want << " missing in\n" << head;
  }
  for (std::string_view banned : {"Authorization", "X-Amz-Date", "X-Amz-Security-Token", "Cookie"}) {
    EXPECT_EQ(head.find(banned), std::string::npos) << banned << " leaked in\n" << head;
  }
  EXPECT_EQ(Totals().invocations, 1u);
  EXPECT_EQ(Totals().model_errors, 0u);
}

TEST_F(RouterTest, DefaultContentTypeIsOctetStream) {
  FakeContainer container;
  container.Respond(200, "ok", "");
  PublishEndpoint({container.port()});
  auto w = Invoke({});
  ASSERT_EQ(w.status(), 200);
  EXPECT_NE(container.received()[0].head.find("Content-Type: application/octet-stream\r\n"), std::string::npos);
  EXPECT_EQ(container.received()[0].head.find("Accept:"), std::string::npos);
}

TEST_F(RouterTest, Container4xxAnd5xxAreModelErrors) {
  FakeContainer container;
  PublishEndpoint({container.port()});
  container.Respond(500, "boom");
  auto w = Invoke({});
  ASSERT_EQ(w.status(), 424);
  EXPECT_EQ(w.header("x-amzn-ErrorType"), "ModelError");
  EXPECT_EQ(w.header("x-amzn-RequestId"), "req-1");
  auto body = Body(w);
  EXPECT_EQ(body["OriginalStatusCode"], 500);
  EXPECT_EQ(body["OriginalMessage"], "boom");
  EXPECT_EQ(body["ErrorCode"], "SERVER_ERROR_FROM_MODEL");
  EXPECT_EQ(body["LogStreamArn"], "arn:aws:logs:us-east-1:123456789012:log-group:/aws/sagemaker/Endpoints/ep");
  EXPECT_EQ(body["Message"],
            "Received server error (500) from primary with message \"boom\". See the endpoint's log group for more "
            "information.");
  EXPECT_EQ(body["message"], body["Message"]);

  container.Respond(400, std::string(5000, 'e'));
  w = Invoke({});
  ASSERT_EQ(w.status(), 424);
  body = Body(w);
  EXPECT_EQ(body["OriginalStatusCode"], 400);
  EXPECT_EQ(body["ErrorCode"], "CLIENT_ERROR_FROM_MODEL");
  EXPECT_EQ(body["OriginalMessage"].get<std::string>().size(), 2048u);
  EXPECT_TRUE(body["Message"].get<std::string>().starts_with("Received client error (400) from primary"));

  auto totals = Totals();
  EXPECT_EQ(totals.invocations, 2u);
  EXPECT_EQ(totals.errors_5xx, 1u);
  EXPECT_EQ(totals.errors_4xx, 1u);
  EXPECT_EQ(totals.model_errors, 2u);
}

TEST_F(RouterTest, HangIsATimeoutModelError) {
  FakeContainer container;
  container.SetMode(FakeContainer::Mode::kHang);
  PublishEndpoint({container.port()});
  auto start = std::chrono::steady_clock::now();
  auto w = Invoke({});
  auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(w.status(), 424);
  auto body = Body(w);
  EXPECT_EQ(body["OriginalStatusCode"], 0);
  EXPECT_EQ(body["Message"],
            "Your invocation timed out while waiting for a response from container primary. Review the latency "
            "metrics for each container, resolve the issue, and try again.");
  EXPECT_LT(elapsed, std::chrono::seconds(3));
  EXPECT_GE(elapsed, std::chrono::milliseconds(450));
  EXPECT_EQ(Totals().model_errors, 1u);
  EXPECT_GE(Totals().model_latency.sum_micros, 450000);
}

TEST_F(RouterTest, ClosedConnectionAndGarbageAreModelErrorsWithStatusZero) {
  FakeContainer container;
  PublishEndpoint({container.port()});
  for (auto mode : {FakeContainer::Mode::kClose, FakeContainer::Mode::kGarbage}) {
    container.SetMode(mode);
    auto w = Invoke({});
    ASSERT_EQ(w.status(), 424) << w.body();
    auto body = Body(w);
    EXPECT_EQ(body["OriginalStatusCode"], 0);
    EXPECT_TRUE(
        body["Message"].get<std::string>().starts_with("Received server error (0) from primary with message \""))
        << body.dump();
  }
  // The server stays usable.
  container.Respond(200, "fine");
  EXPECT_EQ(Invoke({}).status(), 200);
}

TEST_F(RouterTest, BigResponseIsAModelError) {
  FakeContainer container;
  container.SetMode(FakeContainer::Mode::kBig);
  PublishEndpoint({container.port()});
  auto w = Invoke({});
  ASSERT_EQ(w.status(), 424) << w.body().substr(0, 200);
  EXPECT_EQ(Body(w)["OriginalStatusCode"], 0);
}

TEST_F(RouterTest, ConnectFailureIsRetriedOnAnotherInstance) {
  FakeContainer container;
  container.Respond(200, "ok");
  PublishEndpoint({FakeContainer::DeadPort(), container.port()});
  for (int i = 0; i < 10; ++i) {
    auto w = Invoke({});
    EXPECT_EQ(w.status(), 200) << w.body();
  }
  EXPECT_EQ(container.requests(), 10u);
  // Only a dead instance: ModelError with status 0.
  PublishEndpoint({FakeContainer::DeadPort()});
  auto w = Invoke({});
  EXPECT_EQ(w.status(), 424);
  EXPECT_EQ(Body(w)["OriginalStatusCode"], 0);
}

// ---- Instances declared failed (issue 9: requests stuck on a dead instance).

using Clock = std::chrono::steady_clock;

int64_t MillisSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

TEST_F(RouterTest, RequestInFlightToAnInstanceDeclaredFailedIsAnsweredAtOnce) {
  SetInvocationTimeout(30000);  // the cut, not the timeout, must end the request
  FakeContainer container;
  container.SetMode(FakeContainer::Mode::kHang);
  auto instances = PublishEndpoint({container.port()});
  net::FakeResponseWriter w;
  std::thread caller([&] { w = Invoke({}); });
  while (container.requests() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the call is waiting for its answer
  EXPECT_EQ(instances[0]->outstanding.load(), 1);
  auto declared = Clock::now();
  instances[0]->failure.Cancel("Instance i-0 failed 3 health checks in a row: GET /ping answered 500");
  caller.join();
  EXPECT_LT(MillisSince(declared), 1000);

  ASSERT_EQ(w.status(), 424) << w.body();
  EXPECT_EQ(w.header("x-amzn-ErrorType"), "ModelError");
  auto body = Body(w);
  std::string what =
      "The instance i-0 serving variant AllTraffic failed while the request was in flight: Instance i-0 failed 3 "
      "health checks in a row: GET /ping answered 500";
  EXPECT_EQ(body["Message"], "Received server error (0) from primary with message \"" + what +
                                 "\". See the endpoint's log group for more information.");
  EXPECT_EQ(body["OriginalMessage"], what);
  EXPECT_EQ(body["OriginalStatusCode"], 0);
  EXPECT_EQ(body["ErrorCode"], "SERVER_ERROR_FROM_MODEL");
  EXPECT_EQ(body["LogStreamArn"], "arn:aws:logs:us-east-1:123456789012:log-group:/aws/sagemaker/Endpoints/ep");
  // Delivered, so possibly processed: not resent; counted as every other instance failure.
  EXPECT_EQ(container.requests(), 1u);
  EXPECT_EQ(instances[0]->outstanding.load(), 0);
  auto totals = Totals();
  EXPECT_EQ(totals.invocations, 1u);
  EXPECT_EQ(totals.model_errors, 1u);
  EXPECT_EQ(totals.unavailable, 0u);
}

TEST_F(RouterTest, EveryRequestInFlightToTheFailedInstanceIsCutAndOnlyThose) {
  SetInvocationTimeout(30000);
  FakeContainer hung, healthy;
  hung.SetMode(FakeContainer::Mode::kHang);
  healthy.Respond(200, "ok");
  healthy.SetDelay(std::chrono::milliseconds(400));
  auto instances = PublishEndpoint({hung.port(), healthy.port()});
  constexpr int kCalls = 8;
  std::vector<net::FakeResponseWriter> answers(kCalls);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCalls; ++i) {
    callers.emplace_back([&, i] { answers[i] = Invoke({}); });
  }
  // Least outstanding requests spreads them over both instances.
  while (hung.requests() + healthy.requests() < kCalls) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  size_t on_hung = hung.requests();
  ASSERT_GT(on_hung, 0u);
  auto declared = Clock::now();
  instances[0]->failure.Cancel("gone");
  for (auto& t : callers) t.join();
  EXPECT_LT(MillisSince(declared), 1000);
  size_t cut = 0, served = 0;
  for (auto& w : answers) {
    if (w.status() == 200) {
      ++served;
    } else {
      EXPECT_EQ(w.status(), 424) << w.body();
      EXPECT_NE(w.body().find("The instance i-0 serving variant AllTraffic failed while"), std::string::npos);
      ++cut;
    }
  }
  EXPECT_EQ(cut, on_hung);
  EXPECT_EQ(served, kCalls - on_hung);
}

TEST_F(RouterTest, AFailedInstanceStillInTheSnapshotGetsNothing) {
  FakeContainer failed, healthy;
  healthy.Respond(200, "ok");
  auto instances = PublishEndpoint({failed.port(), healthy.port()});
  instances[0]->failure.Cancel("gone");
  // The snapshot still lists i-0 (the controller has not republished yet): requests picked for
  // it were never sent, so they go to i-1.
  for (int i = 0; i < 20; ++i) {
    auto w = Invoke({});
    EXPECT_EQ(w.status(), 200) << w.body();
  }
  EXPECT_EQ(failed.requests(), 0u);
  EXPECT_EQ(healthy.requests(), 20u);
  EXPECT_EQ(Totals().model_errors, 0u);

  // Only the failed instance: nothing was sent, so ServiceUnavailable (botocore retries it).
  PublishEndpoint({failed.port()})[0]->failure.Cancel("Instance i-0 failed 3 health checks in a row");
  auto w = Invoke({});
  EXPECT_EQ(w.status(), 503) << w.body();
  EXPECT_EQ(w.header("x-amzn-ErrorType"), "ServiceUnavailable");
  EXPECT_NE(Body(w)["Message"].get<std::string>().find("instance i-0 failed: Instance i-0 failed 3 health checks"),
            std::string::npos)
      << w.body();
  EXPECT_EQ(failed.requests(), 0u);
  EXPECT_EQ(Totals().unavailable, 1u);
}

TEST_F(RouterTest, ANormalDrainLetsRequestsInFlightFinish) {
  SetInvocationTimeout(30000);
  FakeContainer container;
  container.Respond(200, "done");
  container.SetDelay(std::chrono::milliseconds(300));
  auto instances = PublishEndpoint({container.port()});
  net::FakeResponseWriter w;
  std::thread caller([&] { w = Invoke({}); });
  while (container.requests() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  // Scale-in / update / delete: the controller republishes without the instance and waits; the
  // request in flight is not cut.
  PublishEndpoint({});
  caller.join();
  EXPECT_EQ(w.status(), 200) << w.body();
  EXPECT_EQ(w.body(), "done");
  EXPECT_EQ(instances[0]->outstanding.load(), 0);
}

TEST_F(RouterTest, EndpointErrors) {
  auto w = Invoke({}, "x", "missing");
  EXPECT_EQ(w.status(), 400);
  EXPECT_EQ(w.header("x-amzn-ErrorType"), "ValidationError");
  EXPECT_EQ(Body(w)["Message"], "Endpoint missing of account 123456789012 not found.");

  PublishEndpoint({1}, "Creating");
  w = Invoke({});
  EXPECT_EQ(w.status(), 400);
  EXPECT_EQ(Body(w)["Message"], "Endpoint ep is not in service.");

  PublishEndpoint({}, "InService");
  w = Invoke({});
  EXPECT_EQ(w.status(), 503);
  EXPECT_EQ(w.header("x-amzn-ErrorType"), "ServiceUnavailable");
  EXPECT_EQ(Totals().unavailable, 1u);
  EXPECT_EQ(Totals().invocations, 0u);

  auto async_route = std::make_shared<EndpointRoute>(*routes_.Find("ep"));
  async_route->async = true;
  routes_.Publish(async_route);
  w = Invoke({});
  EXPECT_EQ(w.status(), 400);
  EXPECT_EQ(w.header("x-amzn-ErrorType"), "ValidationError");
}

TEST_F(RouterTest, HeaderValidation) {
  FakeContainer container;
  PublishEndpoint({container.port()});
  struct Case {
    HeaderMap headers;
    std::string fragment;
  };
  std::vector<Case> cases = {
      {{{"X-Amzn-SageMaker-Target-Variant", "nope"}}, "does not have a production variant named nope"},
      {{{"X-Amzn-SageMaker-Target-Variant", "bad_name"}}, "targetVariant"},
      {{{"X-Amzn-SageMaker-Target-Variant", std::string(64, 'a')}}, "less than or equal to 63"},
      {{{"X-Amzn-SageMaker-Target-Model", "m.tar.gz"}}, "not a multi-model endpoint"},
      {{{"X-Amzn-SageMaker-Inference-Component", "ic"}}, "not supported"},
      {{{"Content-Type", std::string(1025, 'a')}}, "contentType"},
      {{{"X-Amzn-SageMaker-Custom-Attributes", std::string(1025, 'a')}}, "customAttributes"},
      {{{"X-Amzn-SageMaker-Inference-Id", std::string(65, 'a')}}, "inferenceId"},
      {{{"X-Amzn-SageMaker-Target-Container-Hostname", "c1"}}, "TargetContainerHostname"},
  };
  for (const Case& c : cases) {
    auto w = Invoke(c.headers);
    EXPECT_EQ(w.status(), 400) << c.fragment;
    EXPECT_EQ(w.header("x-amzn-ErrorType"), "ValidationError") << c.fragment;
    EXPECT_NE(Body(w)["Message"].get<std::string>().find(c.fragment), std::string::npos)
        << c.fragment << " vs " << w.body();
  }
  EXPECT_EQ(container.requests(), 0u);
  // Errors before variant selection are not counted.
  EXPECT_EQ(Totals().invocations, 0u);
  // A valid TargetVariant is served.
  EXPECT_EQ(Invoke({{"X-Amzn-SageMaker-Target-Variant", "AllTraffic"}}).status(), 200);
}

TEST_F(RouterTest, AllWeightsZeroWithoutTargetVariant) {
  FakeContainer container;
  PublishEndpoint({container.port()});
  auto route = std::make_shared<EndpointRoute>(*routes_.Find("ep"));
  route->variants[0].weight = 0;
  routes_.Publish(route);
  auto w = Invoke({});
  EXPECT_EQ(w.status(), 400);
  EXPECT_EQ(w.header("x-amzn-ErrorType"), "ValidationError");
  EXPECT_EQ(Invoke({{"X-Amzn-SageMaker-Target-Variant", "AllTraffic"}}).status(), 200);
}

TEST_F(RouterTest, OutstandingIsBalancedAfterEveryOutcome) {
  FakeContainer container;
  PublishEndpoint({container.port()});
  container.Respond(500, "x");
  Invoke({});
  container.SetMode(FakeContainer::Mode::kClose);
  Invoke({});
  auto route = routes_.Find("ep");
  EXPECT_EQ(route->variants[0].instances[0]->outstanding.load(), 0);
}

TEST_F(RouterTest, ContentLengthExceededShape) {
  auto wire = router_->ContentLengthExceeded("r");
  EXPECT_EQ(wire.status, 413);
  EXPECT_EQ(wire.body, "{\"message\":\"HTTP content length exceeded 6291456 bytes.\"}");
  EXPECT_EQ(FindHeader(wire.headers, "x-amzn-ErrorType"), nullptr);
}

// ---- InvokeAsync: the same steps on an event loop, over the loop's AsyncHttpClient.

class AsyncRouterTest : public RouterTest {
 protected:
  AsyncRouterTest() : loop_(0, net::HttpClientOptions{}), thread_([this] { loop_.Run(); }) {}
  ~AsyncRouterTest() override {
    loop_.Stop();
    thread_.join();
  }

  // Starts one InvokeAsync on the loop; the future gets its answer. `headers` and `body` must
  // outlive the answer (the router's contract), so the caller keeps them.
  std::future<aws::WireResponse> Start(const HeaderMap& headers, const std::string& body) {
    auto promise = std::make_shared<std::promise<aws::WireResponse>>();
    std::future<aws::WireResponse> answer = promise->get_future();
    loop_.Post([this, &headers, &body, promise] {
      InvokeRequest request;
      request.endpoint_name = "ep";
      request.headers = &headers;
      request.body = body;
      request.request_id = "req-1";
      request.account_id = "123456789012";
      request.start_steady_ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
              .count();
      router_->InvokeAsync(request, loop_.client(), [this, promise](aws::WireResponse wire) {
        EXPECT_TRUE(loop_.InLoopThread());
        promise->set_value(std::move(wire));
      });
    });
    return answer;
  }

  aws::WireResponse InvokeAsync(HeaderMap headers = {}, std::string body = "1,2,3") {
    std::future<aws::WireResponse> answer = Start(headers, body);
    if (answer.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      ADD_FAILURE() << "no answer within 20 s";
      std::abort();  // the loop still references this frame's headers and body
    }
    return answer.get();
  }

  static std::string Header(const aws::WireResponse& wire, std::string_view name) {
    const std::string* value = FindHeader(wire.headers, name);
    return value != nullptr ? *value : std::string();
  }
  static nlohmann::json Body(const aws::WireResponse& wire) { return nlohmann::json::parse(wire.body); }

  net::EventLoop loop_;
  std::thread thread_;
};

TEST_F(AsyncRouterTest, AnswersLikeInvoke) {
  FakeContainer container;
  container.Respond(200, "{\"predictions\":[0.5]}",
                    "Content-Type: application/json\r\nX-Amzn-SageMaker-New-Session-Id: s-9\r\nX-Secret: no\r\n");
  PublishEndpoint({container.port()});
  HeaderMap headers = {{"Content-Type", "text/csv"}, {"Authorization", "AWS4-HMAC-SHA256 Credential=..."}};
  aws::WireResponse wire = InvokeAsync(headers);
  ASSERT_EQ(wire.status, 200) << wire.body;
  EXPECT_EQ(wire.body, "{\"predictions\":[0.5]}");
  EXPECT_EQ(Header(wire, "Content-Type"), "application/json");
  EXPECT_EQ(Header(wire, "X-Amzn-SageMaker-New-Session-Id"), "s-9");
  EXPECT_EQ(Header(wire, "x-Amzn-Invoked-Production-Variant"), "AllTraffic");
  EXPECT_EQ(Header(wire, "x-amzn-RequestId"), "req-1");
  EXPECT_EQ(FindHeader(wire.headers, "X-Secret"), nullptr);
  // The sync path's answer is the same.
  auto w = Invoke(headers);
  EXPECT_EQ(w.status(), 200);
  EXPECT_EQ(w.body(), wire.body);
  EXPECT_EQ(w.headers(), wire.headers);

  auto received = container.received();
  ASSERT_EQ(received.size(), 2u);
  EXPECT_EQ(received[0].body, "1,2,3");
  EXPECT_NE(received[0].head.find("Content-Type: text/csv\r\n"), std::string::npos);
  EXPECT_NE(received[0].head.find("X-Amzn-RequestId: req-1\r\n"), std::string::npos);
  EXPECT_EQ(received[0].head.find("Authorization"), std::string::npos);
  EXPECT_EQ(Totals().invocations, 2u);
  EXPECT_EQ(routes_.Find("ep")->variants[0].instances[0]->outstanding.load(), 0);
}

TEST_F(AsyncRouterTest, ContainerErrorsAreModelErrors) {
  FakeContainer container;
  PublishEndpoint({container.port()});
  container.Respond(500, "boom");
  aws::WireResponse wire = InvokeAsync();
  ASSERT_EQ(wire.status, 424);
  EXPECT_EQ(Header(wire, "x-amzn-ErrorType"), "ModelError");
  auto body = Body(wire);
  EXPECT_EQ(body["OriginalStatusCode"], 500);
  EXPECT_EQ(body["ErrorCode"], "SERVER_ERROR_FROM_MODEL");
  EXPECT_EQ(body["Message"],
            "Received server error (500) from primary with message \"boom\". See the endpoint's log group for more "
            "information.");
  container.SetMode(FakeContainer::Mode::kClose);
  wire = InvokeAsync();
  ASSERT_EQ(wire.status, 424);
  EXPECT_EQ(Body(wire)["OriginalStatusCode"], 0);
  auto totals = Totals();
  EXPECT_EQ(totals.invocations, 2u);
  EXPECT_EQ(totals.model_errors, 2u);
  EXPECT_EQ(routes_.Find("ep")->variants[0].instances[0]->outstanding.load(), 0);
}

TEST_F(AsyncRouterTest, ConnectFailureIsRetriedOnAnotherInstanceOnce) {
  FakeContainer container;
  container.Respond(200, "ok");
  PublishEndpoint({FakeContainer::DeadPort(), container.port()});
  for (int i = 0; i < 10; ++i) EXPECT_EQ(InvokeAsync().status, 200);
  EXPECT_EQ(container.requests(), 10u);
  // Only dead instances: one retry, then ModelError with status 0 (no endless bouncing).
  PublishEndpoint({FakeContainer::DeadPort(), FakeContainer::DeadPort(), FakeContainer::DeadPort()});
  aws::WireResponse wire = InvokeAsync();
  EXPECT_EQ(wire.status, 424);
  EXPECT_EQ(Body(wire)["OriginalStatusCode"], 0);
}

TEST_F(AsyncRouterTest, NoInstanceIs503AndValidationErrorsAreInline) {
  PublishEndpoint({}, "InService");
  aws::WireResponse wire = InvokeAsync();
  EXPECT_EQ(wire.status, 503);
  EXPECT_EQ(Header(wire, "x-amzn-ErrorType"), "ServiceUnavailable");
  EXPECT_EQ(Totals().unavailable, 1u);
  wire = InvokeAsync({{"X-Amzn-SageMaker-Target-Variant", "nope"}});
  EXPECT_EQ(wire.status, 400);
  EXPECT_EQ(Header(wire, "x-amzn-ErrorType"), "ValidationError");
  wire = InvokeAsync({}, std::string(6291457, 'a'));
  EXPECT_EQ(wire.status, 413);
}

TEST_F(AsyncRouterTest, HangIsATimeoutModelError) {
  FakeContainer container;
  container.SetMode(FakeContainer::Mode::kHang);
  PublishEndpoint({container.port()});
  auto start = std::chrono::steady_clock::now();
  aws::WireResponse wire = InvokeAsync();
  auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(wire.status, 424) << wire.body;
  EXPECT_EQ(Body(wire)["Message"],
            "Your invocation timed out while waiting for a response from container primary. Review the latency "
            "metrics for each container, resolve the issue, and try again.");
  EXPECT_GE(elapsed, std::chrono::milliseconds(450));
  EXPECT_LT(elapsed, std::chrono::seconds(3));
  EXPECT_EQ(Totals().model_errors, 1u);
}

TEST_F(AsyncRouterTest, CallsInFlightOnTheLoopSpreadByOutstandingAndACutIsAnsweredAtOnce) {
  SetInvocationTimeout(30000);
  FakeContainer hung, healthy;
  hung.SetMode(FakeContainer::Mode::kHang);
  healthy.Respond(200, "ok");
  healthy.SetDelay(std::chrono::milliseconds(1500));  // still busy when the last call is picked
  auto instances = PublishEndpoint({hung.port(), healthy.port()});
  constexpr int kCalls = 8;
  HeaderMap headers;
  std::string body = "x";
  std::vector<std::future<aws::WireResponse>> answers;
  for (int i = 0; i < kCalls; ++i) answers.push_back(Start(headers, body));
  while (hung.requests() + healthy.requests() < kCalls) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  // One loop thread, all in flight at once: least outstanding split them evenly.
  EXPECT_EQ(hung.requests(), 4u);
  EXPECT_EQ(healthy.requests(), 4u);
  instances[0]->failure.Cancel("gone");
  size_t cut = 0, served = 0;
  for (auto& answer : answers) {
    ASSERT_EQ(answer.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    aws::WireResponse wire = answer.get();
    if (wire.status == 200) {
      ++served;
    } else {
      EXPECT_EQ(wire.status, 424) << wire.body;
      EXPECT_NE(wire.body.find("The instance i-0 serving variant AllTraffic failed while"), std::string::npos);
      ++cut;
    }
  }
  EXPECT_EQ(cut, 4u);
  EXPECT_EQ(served, 4u);
  EXPECT_EQ(instances[0]->outstanding.load(), 0);
  EXPECT_EQ(instances[1]->outstanding.load(), 0);
}

}  // namespace
}  // namespace kiln::serving

namespace kiln::serving {
namespace {

// A gate admitting up to `max` requests and recording cold starts.
// Direct multi-container calls on the event loop (FrontDoor::Claims leaves them there): the named
// container answers; a missing header is refused inline.
TEST_F(AsyncRouterTest, DirectMultiContainerCallsTheNamedContainer) {
  FakeContainer a, b;
  a.Respond(200, "from-a", "Content-Type: text/plain\r\n");
  b.Respond(200, "from-b", "Content-Type: text/plain\r\n");
  auto route = std::make_shared<EndpointRoute>();
  route->name = "ep";
  route->status = "InService";
  route->direct = true;
  auto instance = Instance("i-0", a.port());
  instance->containers = {{.hostname = "alpha", .host = "127.0.0.1", .port = a.port(), .log_stream = "v/i-0/alpha"},
                          {.hostname = "beta", .host = "127.0.0.1", .port = b.port(), .log_stream = "v/i-0/beta"}};
  VariantRoute variant = Variant("AllTraffic", 1, {instance});
  variant.container_mode = ContainerMode::kDirect;
  route->variants.push_back(variant);
  routes_.Publish(route);
  auto answer = InvokeAsync({{"X-Amzn-SageMaker-Target-Container-Hostname", "beta"}});
  ASSERT_EQ(answer.status, 200) << answer.body;
  EXPECT_EQ(answer.body, "from-b");
  EXPECT_EQ(a.requests(), 0u);
  EXPECT_EQ(InvokeAsync({}).status, 400);
  b.Respond(503, "busy", "Content-Type: text/plain\r\n");
  auto failed = InvokeAsync({{"X-Amzn-SageMaker-Target-Container-Hostname", "beta"}});
  EXPECT_EQ(failed.status, 424);
  EXPECT_NE(Body(failed)["message"].get<std::string>().find("from beta"), std::string::npos) << failed.body;
}

class FakeGate : public ServerlessGate {
 public:
  bool Admit(const EndpointRoute&) override {
    if (in_flight >= max) return false;
    ++in_flight;
    return true;
  }
  void Leave(const EndpointRoute&) override { --in_flight; }
  void ColdStart(const EndpointRoute&, const std::string& variant, int64_t micros) override {
    cold.emplace_back(variant, micros);
  }
  std::atomic<int> in_flight{0};
  int max = 1;
  std::vector<std::pair<std::string, int64_t>> cold;
};

class ServerlessRouterTest : public RouterTest {
 protected:
  // Endpoint "ep" as a serverless route (MaxConcurrency `max`) over `instances`.
  void PublishServerless(std::vector<std::shared_ptr<const InstanceTarget>> instances, int max = 1) {
    auto route = std::make_shared<EndpointRoute>();
    route->name = "ep";
    route->status = "InService";
    route->serverless_max_concurrency = max;
    route->variants.push_back(Variant("AllTraffic", 1, std::move(instances)));
    routes_.Publish(route);
  }
  FakeGate gate_;
};

TEST_F(ServerlessRouterTest, OverMaxConcurrencyIsThrottled) {
  router_->SetServerlessGate(&gate_);
  PublishServerless({});
  EXPECT_TRUE(router_->IsServerless("ep"));
  EXPECT_FALSE(router_->IsServerless("other"));
  gate_.in_flight = 1;  // MaxConcurrency 1 already in flight
  auto w = Invoke({});
  EXPECT_EQ(w.status(), 429);
  EXPECT_EQ(w.header("x-amzn-ErrorType"), "ThrottlingException") << w.body();
  EXPECT_NE(Body(w)["Message"].get<std::string>().find("MaxConcurrency (1)"), std::string::npos);
  EXPECT_EQ(gate_.in_flight, 1);
}

TEST_F(ServerlessRouterTest, NoInstanceWithinTheBudgetIsModelNotReady) {
  SetInvocationTimeout(200);
  router_->SetServerlessGate(&gate_);
  PublishServerless({});
  const auto start = std::chrono::steady_clock::now();
  auto w = Invoke({});
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(190));
  EXPECT_EQ(w.status(), 429);
  EXPECT_EQ(w.header("x-amzn-ErrorType"), "ModelNotReadyException") << w.body();
  EXPECT_EQ(gate_.in_flight, 0);  // left again
  EXPECT_TRUE(gate_.cold.empty());
}

TEST_F(ServerlessRouterTest, WaitsForAStartedInstanceAndReportsTheColdStart) {
  SetInvocationTimeout(5000);
  router_->SetServerlessGate(&gate_);
  FakeContainer container;
  container.Respond(200, "warm", "");
  PublishServerless({});
  std::thread start([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    PublishServerless({Instance("i-new", container.port())});
  });
  auto w = Invoke({});
  start.join();
  EXPECT_EQ(w.status(), 200) << w.body();
  ASSERT_EQ(gate_.cold.size(), 1u);
  EXPECT_EQ(gate_.cold[0].first, "AllTraffic");
  EXPECT_GE(gate_.cold[0].second, 100000);
  // Warm now: no second cold start.
  EXPECT_EQ(Invoke({}).status(), 200);
  EXPECT_EQ(gate_.cold.size(), 1u);
  EXPECT_EQ(gate_.in_flight, 0);
}

// ---- Multi-container endpoints (serving-contract.md §8).

class MultiContainerRouterTest : public RouterTest {
 protected:
  // Endpoint "mc": one instance whose containers listen on `ports` (hostnames `names`).
  std::shared_ptr<InstanceTarget> PublishMultiContainer(ContainerMode mode, std::vector<std::string> names,
                                                        std::vector<uint16_t> ports) {
    auto route = std::make_shared<EndpointRoute>();
    route->name = "mc";
    route->status = "InService";
    route->direct = mode == ContainerMode::kDirect;
    route->pipeline = mode == ContainerMode::kSerial;
    auto instance = Instance("i-0", ports[0]);
    for (size_t i = 0; i < ports.size(); ++i) {
      instance->containers.push_back(
          {.hostname = names[i], .host = "127.0.0.1", .port = ports[i], .log_stream = "AllTraffic/i-0/" + names[i]});
    }
    VariantRoute variant = Variant("AllTraffic", 1, {instance});
    variant.container_mode = mode;
    route->variants.push_back(variant);
    routes_.Publish(route);
    return instance;
  }
};

TEST_F(MultiContainerRouterTest, DirectCallsOnlyTheNamedContainer) {
  FakeContainer a, b;
  a.Respond(200, "from-a", "Content-Type: text/plain\r\n");
  b.Respond(200, "from-b", "Content-Type: text/plain\r\n");
  PublishMultiContainer(ContainerMode::kDirect, {"alpha", "beta"}, {a.port(), b.port()});
  EXPECT_FALSE(router_->IsPipeline("mc"));  // a Direct call may stay on the event loop
  auto w = Invoke({{"X-Amzn-SageMaker-Target-Container-Hostname", "beta"}}, "x", "mc");
  ASSERT_EQ(w.status(), 200) << w.body();
  EXPECT_EQ(w.body(), "from-b");
  EXPECT_EQ(a.requests(), 0u);
  EXPECT_EQ(b.requests(), 1u);
  // Missing and unknown names are ValidationErrors; nothing is sent.
  auto missing = Invoke({}, "x", "mc");
  EXPECT_EQ(missing.status(), 400);
  EXPECT_NE(Body(missing)["message"].get<std::string>().find("set TargetContainerHostname"), std::string::npos);
  auto unknown = Invoke({{"X-Amzn-SageMaker-Target-Container-Hostname", "gamma"}}, "x", "mc");
  EXPECT_EQ(unknown.status(), 400);
  EXPECT_NE(Body(unknown)["message"].get<std::string>().find("gamma does not exist"), std::string::npos);
  EXPECT_EQ(a.requests() + b.requests(), 1u);
  // A container error names that container.
  b.Respond(500, "boom", "Content-Type: text/plain\r\n");
  auto failed = Invoke({{"X-Amzn-SageMaker-Target-Container-Hostname", "beta"}}, "x", "mc");
  EXPECT_EQ(failed.status(), 424);
  EXPECT_NE(Body(failed)["message"].get<std::string>().find("Received server error (500) from beta"),
            std::string::npos);
}

TEST_F(MultiContainerRouterTest, TheHeaderIsRefusedOnOtherEndpoints) {
  FakeContainer a, b;
  a.Respond(200, "x");
  b.Respond(200, "y");
  PublishMultiContainer(ContainerMode::kSerial, {"container-1", "container-2"}, {a.port(), b.port()});
  auto w = Invoke({{"X-Amzn-SageMaker-Target-Container-Hostname", "container-1"}}, "x", "mc");
  EXPECT_EQ(w.status(), 400);
  EXPECT_NE(Body(w)["message"].get<std::string>().find("not a multi-container endpoint with Direct invocation"),
            std::string::npos);
  PublishEndpoint({a.port()});
  EXPECT_EQ(Invoke({{"X-Amzn-SageMaker-Target-Container-Hostname", "x"}}).status(), 400);
  EXPECT_EQ(a.requests() + b.requests(), 0u);
}

TEST_F(MultiContainerRouterTest, SerialChainsTheContainers) {
  FakeContainer pre, model;
  pre.Respond(200, "{\"features\":[1,2]}",
              "Content-Type: application/json\r\nX-Amzn-SageMaker-Custom-Attributes: pre=1\r\n");
  model.Respond(200, "0.5", "Content-Type: text/csv\r\nX-Amzn-SageMaker-Custom-Attributes: model=1\r\n");
  PublishMultiContainer(ContainerMode::kSerial, {"pre", "model"}, {pre.port(), model.port()});
  auto w = Invoke({{"Content-Type", "text/csv"}, {"Accept", "text/csv"}, {"X-Amzn-SageMaker-Custom-Attributes", "c=1"}},
                  "1,2", "mc");
  ASSERT_EQ(w.status(), 200) << w.body();
  EXPECT_EQ(w.body(), "0.5");
  EXPECT_EQ(w.header("Content-Type"), "text/csv");
  EXPECT_EQ(w.header("X-Amzn-SageMaker-Custom-Attributes"), "model=1");  // the last container's
  ASSERT_EQ(pre.requests(), 1u);
  ASSERT_EQ(model.requests(), 1u);
  const std::string first = pre.received()[0].head, second = model.received()[0].head;
  EXPECT_EQ(pre.received()[0].body, "1,2");
  EXPECT_NE(first.find("Content-Type: text/csv\r\n"), std::string::npos) << first;
  EXPECT_EQ(first.find("Accept:"), std::string::npos) << first;
  EXPECT_NE(first.find("X-Amzn-SageMaker-Custom-Attributes: c=1\r\n"), std::string::npos) << first;
  EXPECT_EQ(model.received()[0].body, "{\"features\":[1,2]}");
  EXPECT_NE(second.find("Content-Type: application/json\r\n"), std::string::npos) << second;
  EXPECT_NE(second.find("Accept: text/csv\r\n"), std::string::npos) << second;
  EXPECT_NE(second.find("X-Amzn-SageMaker-Custom-Attributes: c=1\r\n"), std::string::npos) << second;
  auto totals = metrics_.Totals()[std::make_pair(std::string("mc"), std::string("AllTraffic"))];
  EXPECT_EQ(totals.invocations, 1u);
  EXPECT_EQ(totals.model_errors, 0u);
}

TEST_F(MultiContainerRouterTest, AFailingPipelineContainerStopsTheChainNamingIt) {
  FakeContainer pre, model, post;
  pre.Respond(200, "ok", "Content-Type: text/plain\r\n");
  model.Respond(400, "bad features", "Content-Type: text/plain\r\n");
  post.Respond(200, "never");
  PublishMultiContainer(ContainerMode::kSerial, {"pre", "model", "post"}, {pre.port(), model.port(), post.port()});
  auto w = Invoke({}, "x", "mc");
  ASSERT_EQ(w.status(), 424) << w.body();
  auto body = Body(w);
  EXPECT_EQ(body["ErrorCode"], "CLIENT_ERROR_FROM_MODEL");
  EXPECT_EQ(body["OriginalStatusCode"], 400);
  EXPECT_NE(body["message"].get<std::string>().find("Received client error (400) from model"), std::string::npos);
  EXPECT_EQ(post.requests(), 0u);
  EXPECT_EQ((metrics_.Totals()[{"mc", "AllTraffic"}].model_errors), 1u);
  // A container that cannot be reached mid-chain: ModelError naming it (nothing is retried:
  // the first container already had the request).
  model.SetMode(FakeContainer::Mode::kClose);
  auto cut = Invoke({}, "x", "mc");
  EXPECT_EQ(cut.status(), 424);
  EXPECT_NE(Body(cut)["message"].get<std::string>().find("from model"), std::string::npos);
}

TEST_F(MultiContainerRouterTest, TheBudgetCoversTheWholeChain) {
  SetInvocationTimeout(400);
  FakeContainer pre, model;
  pre.Respond(200, "ok", "Content-Type: text/plain\r\n");
  pre.SetDelay(std::chrono::milliseconds(250));
  model.Respond(200, "late", "Content-Type: text/plain\r\n");
  model.SetDelay(std::chrono::milliseconds(250));  // each within 400 ms, the chain is not
  PublishMultiContainer(ContainerMode::kSerial, {"pre", "model"}, {pre.port(), model.port()});
  auto w = Invoke({}, "x", "mc");
  ASSERT_EQ(w.status(), 424) << w.body();
  EXPECT_NE(Body(w)["message"].get<std::string>().find("timed out while waiting for a response from container model"),
            std::string::npos)
      << w.body();
}

}  // namespace
}  // namespace kiln::serving
