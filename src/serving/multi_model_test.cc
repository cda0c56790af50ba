#include "serving/multi_model.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "net/http_server.h"
#include "net/test_util/fake_response_writer.h"
#include "serving/router.h"
#include "store/test_util/temp_database.h"

namespace kiln::serving {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

// A container in multi-model mode (serving-contract.md §7.2) that holds at most `capacity` models:
// POST /models answers 507 when full, 409 when loaded; invoke answers which model served.
class FakeMultiModelContainer {
 public:
  explicit FakeMultiModelContainer(size_t capacity) : capacity_(capacity) {
    net::HttpServerOptions options;
    options.listen = "127.0.0.1:0";
    options.event_loops = 1;
    options.worker_threads = 32;
    auto server = net::HttpServer::Create(
        options, [this](net::HttpRequest& request, net::ResponseWriter& response) { Serve(request, response); });
    EXPECT_TRUE(server.ok());
    server_ = std::move(server).value();
    EXPECT_TRUE(server_->Start().ok());
  }
  ~FakeMultiModelContainer() { server_->Stop(1); }

  uint16_t port() const { return server_->port(); }
  void SetLoadDelay(std::chrono::milliseconds delay) { load_delay_ms_ = static_cast<int>(delay.count()); }
  int loads() const { return loads_.load(); }
  std::vector<std::string> unloads() const {
    MutexLock lock(mu_);
    return unloads_;
  }
  std::set<std::string> loaded() const {
    MutexLock lock(mu_);
    return loaded_;
  }
  std::map<std::string, std::string> urls() const {
    MutexLock lock(mu_);
    return urls_;
  }
  // Loads a model behind Kiln's back (as before a server restart).
  void Preload(const std::string& name) {
    MutexLock lock(mu_);
    loaded_.insert(name);
    urls_[name] = "/opt/ml/models/" + name + "/model";
  }
  // Forgets a model as a restarted container would.
  void Forget(const std::string& name) {
    MutexLock lock(mu_);
    loaded_.erase(name);
  }

 private:
  void Serve(net::HttpRequest& request, net::ResponseWriter& response) {
    auto body = ReadAll(*request.body, 1 << 20);
    const HeaderMap json_type{{"Content-Type", "application/json"}};
    auto answer = [&](int status, json j) { (void)response.Send(status, json_type, j.dump()); };
    const std::string& path = request.raw_path;
    if (request.method == "POST" && path == "/models") {
      json in = json::parse(*body);
      const std::string name = in["model_name"];
      {
        MutexLock lock(mu_);
        if (loaded_.contains(name)) return answer(409, {{"message", "loaded"}});
        if (loaded_.size() >= capacity_) return answer(507, {{"message", "Memory exhausted"}});
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(load_delay_ms_.load()));
      ++loads_;
      MutexLock lock(mu_);
      loaded_.insert(name);
      urls_[name] = in["url"];
      return answer(200, {{"status", "loaded"}});
    }
    if (request.method == "GET" && path == "/models") {
      json models = json::array();
      MutexLock lock(mu_);
      for (const std::string& name : loaded_) models.push_back({{"modelName", name}, {"modelUrl", urls_[name]}});
      return answer(200, {{"models", models}});
    }
    if (path.rfind("/models/", 0) == 0) {
      std::string rest = path.substr(8);
      const bool invoke = rest.size() > 7 && rest.substr(rest.size() - 7) == "/invoke";
      const std::string name = invoke ? rest.substr(0, rest.size() - 7) : rest;
      MutexLock lock(mu_);
      if (!loaded_.contains(name)) return answer(404, {{"message", "not loaded"}});
      if (request.method == "DELETE") {
        loaded_.erase(name);
        unloads_.push_back(name);
        return answer(200, {{"status", "unloaded"}});
      }
      if (request.method == "GET") return answer(200, {{"modelName", name}});
      const std::string* target = FindHeader(request.headers, "X-Amzn-SageMaker-Target-Model");
      return answer(200, {{"model", name}, {"target", target ? *target : ""}, {"port", port()}});
    }
    answer(404, {{"message", "no route"}});
  }

  const size_t capacity_;
  std::unique_ptr<net::HttpServer> server_;
  std::atomic<int> load_delay_ms_{0};
  std::atomic<int> loads_{0};
  mutable Mutex mu_;
  std::set<std::string> loaded_ GUARDED_BY(mu_);
  std::vector<std::string> unloads_ GUARDED_BY(mu_);
  std::map<std::string, std::string> urls_ GUARDED_BY(mu_);
};

// Writes <dir>/model.txt holding the URI; keys containing "missing" do not exist.
class FakeFetcher : public ModelArtifactFetcher {
 public:
  Status Fetch(const std::string& s3_uri, const std::string& dir) override {
    ++fetches_;
    std::this_thread::sleep_for(delay_);
    if (s3_uri.find("missing") != std::string::npos) return Status::NotFound("no object " + s3_uri);
    RETURN_IF_ERROR(MakeDirs(dir));
    return WriteFileAtomic(dir + "/model.txt", s3_uri);
  }
  std::atomic<int> fetches_{0};
  std::chrono::milliseconds delay_{0};
};

class MultiModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    metric_store_ = std::make_unique<observe::MetricStore>(db_.get());
    Make(MultiModelOptions());
  }

  void Make(MultiModelOptions options) {
    options.flush_interval = 1h;  // tests flush themselves
    manager_.reset();
    manager_ = std::make_unique<MultiModelManager>(options, &fetcher_, &client_, metric_store_.get(), &routes_);
  }

  // Endpoint "ep", variant "AllTraffic" (ModelDataUrl s3://b/models/) over the given containers.
  std::shared_ptr<const EndpointRoute> Publish(std::vector<uint16_t> ports, bool cache = true, int vcpus = 2) {
    auto route = std::make_shared<EndpointRoute>();
    route->name = "ep";
    route->status = "InService";
    route->multi_model = true;
    route->log_group_arn = "arn:aws:logs:us-east-1:123456789012:log-group:/aws/sagemaker/Endpoints/ep";
    VariantRoute variant;
    variant.name = "AllTraffic";
    variant.model_data_url = "s3://b/models/";
    variant.model_cache_enabled = cache;
    for (size_t i = 0; i < ports.size(); ++i) {
      auto instance = std::make_shared<InstanceTarget>();
      instance->instance_id = "i-" + std::to_string(i);
      instance->port = ports[i];
      instance->models_dir = dir_.path() + "/" + instance->instance_id + "/models";
      instance->vcpus = vcpus;
      EXPECT_TRUE(MakeDirs(instance->models_dir).ok());
      variant.instances.push_back(instance);
    }
    route->variants.push_back(variant);
    routes_.Publish(route);
    return route;
  }

  // Acquire + Release of one request; the lease, or the error.
  std::variant<ModelLease, aws::AwsError> Use(const EndpointRoute& route, std::string target) {
    auto got = manager_->Acquire(route, route.variants[0], target, 0);
    if (auto* lease = std::get_if<ModelLease>(&got)) manager_->Release(route, route.variants[0], *lease, false);
    return got;
  }

  static const ModelLease& Lease(const std::variant<ModelLease, aws::AwsError>& got) {
    if (auto* error = std::get_if<aws::AwsError>(&got)) ADD_FAILURE() << error->code << ": " << error->message;
    static const ModelLease kNone;
    return std::holds_alternative<ModelLease>(got) ? std::get<ModelLease>(got) : kNone;
  }

  // The Sum and SampleCount of a metric over everything written.
  observe::StatisticSet Stats(std::string_view ns, std::string_view name, observe::Dimensions dims) {
    manager_->FlushForTest();
    auto periods = metric_store_->Aggregate({.ns = std::string(ns),
                                             .name = std::string(name),
                                             .dimensions = std::move(dims),
                                             .start_millis = 0,
                                             .end_millis = INT64_MAX / 2,
                                             .period_seconds = int64_t{86400} * 365 * 100});
    observe::StatisticSet total;
    if (!periods.ok()) return total;
    for (const auto& p : *periods) {
      total.sum += p.stats.sum;
      total.sample_count += p.stats.sample_count;
      total.maximum = std::max(total.maximum, p.stats.maximum);
    }
    return total;
  }
  observe::StatisticSet Invocation(std::string_view name) {
    return Stats("AWS/SageMaker", name, {{"EndpointName", "ep"}, {"VariantName", "AllTraffic"}});
  }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<observe::MetricStore> metric_store_;
  RoutingTable routes_;
  net::HttpClient client_;
  FakeFetcher fetcher_;
  std::unique_ptr<MultiModelManager> manager_;
};

TEST(ContainerModelNameTest, IsTheFirst32HexCharactersOfSha256) {
  // sha256("a.tar.gz") = 0x4b3b...; the name is stable and path-safe.
  EXPECT_EQ(ContainerModelName("a.tar.gz").size(), 32u);
  EXPECT_EQ(ContainerModelName("a.tar.gz"), ContainerModelName("a.tar.gz"));
  EXPECT_NE(ContainerModelName("a.tar.gz"), ContainerModelName("b.tar.gz"));
  EXPECT_EQ(ContainerModelName("x").find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST_F(MultiModelTest, FirstRequestDownloadsAndLoadsTheNextIsACacheHit) {
  FakeMultiModelContainer container(4);
  auto route = Publish({container.port()});
  const ModelLease first = Lease(Use(*route, "team-a/m1.tar.gz"));
  EXPECT_FALSE(first.cache_hit);
  EXPECT_EQ(first.model_name, ContainerModelName("team-a/m1.tar.gz"));
  // Unpacked into the instance's models directory; the container got its in-instance path.
  auto file = ReadFile(dir_.path() + "/i-0/models/" + first.model_name + "/model/model.txt");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(*file, "s3://b/models/team-a/m1.tar.gz");
  EXPECT_EQ(container.urls()[first.model_name], "/opt/ml/models/" + first.model_name + "/model");
  const ModelLease second = Lease(Use(*route, "team-a/m1.tar.gz"));
  EXPECT_TRUE(second.cache_hit);
  EXPECT_EQ(fetcher_.fetches_.load(), 1);
  EXPECT_EQ(container.loads(), 1);
  EXPECT_EQ(manager_->LoadedModelsForTest("i-0"), std::vector<std::string>{first.model_name});

  auto hit = Invocation("ModelCacheHit");
  EXPECT_EQ(hit.sample_count, 2);
  EXPECT_EQ(hit.sum, 1);
  EXPECT_EQ(Invocation("ModelDownloadingTime").sample_count, 1);
  EXPECT_EQ(Invocation("ModelLoadingTime").sample_count, 1);
  EXPECT_EQ(Invocation("ModelLoadingWaitTime").sample_count, 1);
  auto count = Stats("/aws/sagemaker/Endpoints", "LoadedModelCount",
                     {{"EndpointName", "ep"}, {"VariantName", "AllTraffic"}, {"Host", "ep/AllTraffic/i-0"}});
  EXPECT_EQ(count.maximum, 1);
}

TEST_F(MultiModelTest, A507UnloadsTheLeastRecentlyUsedModelAndRetries) {
  FakeMultiModelContainer container(2);
  auto route = Publish({container.port()});
  const std::string a = Lease(Use(*route, "a.tar.gz")).model_name;
  std::this_thread::sleep_for(2ms);
  const std::string b = Lease(Use(*route, "b.tar.gz")).model_name;
  std::this_thread::sleep_for(2ms);
  EXPECT_TRUE(Lease(Use(*route, "a.tar.gz")).cache_hit);  // a is now the most recently used
  std::this_thread::sleep_for(2ms);
  const std::string c = Lease(Use(*route, "c.tar.gz")).model_name;
  EXPECT_EQ(container.unloads(), std::vector<std::string>{b});
  EXPECT_EQ(container.loaded(), (std::set<std::string>{a, c}));
  EXPECT_EQ(manager_->LoadedModelsForTest("i-0"), (std::vector<std::string>{a, c}));
  // b's files stay on disk: loading it again needs no download.
  EXPECT_TRUE(PathExists(dir_.path() + "/i-0/models/" + b + "/model/model.txt"));
  EXPECT_FALSE(Lease(Use(*route, "b.tar.gz")).cache_hit);
  EXPECT_EQ(fetcher_.fetches_.load(), 3);
  EXPECT_EQ(container.unloads(), (std::vector<std::string>{b, a}));
  EXPECT_EQ(Invocation("ModelUnloadingTime").sample_count, 2);
}

TEST_F(MultiModelTest, AModelInUseIsNotEvictedAndNothingToUnloadIsAModelError) {
  FakeMultiModelContainer container(1);
  auto route = Publish({container.port()});
  auto held = manager_->Acquire(*route, route->variants[0], "a.tar.gz", 0);
  ASSERT_TRUE(std::holds_alternative<ModelLease>(held));
  auto refused = Use(*route, "b.tar.gz");
  ASSERT_TRUE(std::holds_alternative<aws::AwsError>(refused));
  const aws::AwsError& error = std::get<aws::AwsError>(refused);
  EXPECT_EQ(error.code, "ModelError");
  EXPECT_EQ(error.http_status, 424);
  EXPECT_NE(error.message.find("(507)"), std::string::npos) << error.message;
  EXPECT_NE(error.message.find("Memory exhausted"), std::string::npos) << error.message;
  manager_->Release(*route, route->variants[0], std::get<ModelLease>(held), false);
  EXPECT_FALSE(Lease(Use(*route, "b.tar.gz")).cache_hit);  // a is free now: evicted
  EXPECT_EQ(container.unloads().size(), 1u);
}

TEST_F(MultiModelTest, ModelsLoadedBeforeARestartAreUnloadedFirstFromTheContainersList) {
  FakeMultiModelContainer container(2);
  container.Preload("old1");
  container.Preload("old2");
  auto route = Publish({container.port()});
  const std::string a = Lease(Use(*route, "a.tar.gz")).model_name;
  EXPECT_EQ(container.unloads().size(), 1u);
  EXPECT_EQ(container.loaded().count(a), 1u);
  const std::string b = Lease(Use(*route, "b.tar.gz")).model_name;
  EXPECT_EQ(container.unloads().size(), 2u);
  EXPECT_EQ(container.loaded(), (std::set<std::string>{a, b}));
}

TEST_F(MultiModelTest, ConcurrentRequestsShareOneDownloadAndOneLoad) {
  FakeMultiModelContainer container(4);
  container.SetLoadDelay(100ms);
  fetcher_.delay_ = 100ms;
  auto route = Publish({container.port()});
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      if (std::holds_alternative<ModelLease>(Use(*route, "shared.tar.gz"))) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 8);
  EXPECT_EQ(fetcher_.fetches_.load(), 1);
  EXPECT_EQ(container.loads(), 1);
}

TEST_F(MultiModelTest, AMissingObjectIsAValidationErrorAndIsTriedAgainByTheNextRequest) {
  FakeMultiModelContainer container(4);
  auto route = Publish({container.port()});
  auto got = Use(*route, "missing.tar.gz");
  ASSERT_TRUE(std::holds_alternative<aws::AwsError>(got));
  const aws::AwsError& error = std::get<aws::AwsError>(got);
  EXPECT_EQ(error.code, "ValidationError");
  EXPECT_EQ(error.http_status, 400);
  EXPECT_EQ(error.message,
            "Failed to download model data(bucket: b, key: models/missing.tar.gz). Please ensure that there is an "
            "object located at the URL and that the role passed to CreateModel has permissions to download the "
            "model.");
  EXPECT_FALSE(PathExists(dir_.path() + "/i-0/models/" + ContainerModelName("missing.tar.gz")));
  EXPECT_TRUE(std::holds_alternative<aws::AwsError>(Use(*route, "missing.tar.gz")));
  EXPECT_EQ(fetcher_.fetches_.load(), 2);
  EXPECT_EQ(container.loads(), 0);
}

TEST_F(MultiModelTest, PastTheWaitModelNotReadyWhileTheLoadGoesOn) {
  MultiModelOptions options;
  options.load_wait = 200ms;
  Make(options);
  FakeMultiModelContainer container(4);
  container.SetLoadDelay(600ms);
  auto route = Publish({container.port()});
  const auto start = std::chrono::steady_clock::now();
  auto got = Use(*route, "slow.tar.gz");
  ASSERT_TRUE(std::holds_alternative<aws::AwsError>(got));
  EXPECT_EQ(std::get<aws::AwsError>(got).code, "ModelNotReadyException");
  EXPECT_EQ(std::get<aws::AwsError>(got).http_status, 429);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 500ms);
  // The load finished in the background: a later request finds it loaded.
  for (int i = 0; i < 100 && container.loads() == 0; ++i) std::this_thread::sleep_for(20ms);
  std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(Lease(Use(*route, "slow.tar.gz")).cache_hit);
  EXPECT_EQ(container.loads(), 1);
}

TEST_F(MultiModelTest, CacheDisabledUnloadsAndDeletesAfterEachRequest) {
  FakeMultiModelContainer container(4);
  auto route = Publish({container.port()}, /*cache=*/false);
  const std::string name = Lease(Use(*route, "once.tar.gz")).model_name;
  for (int i = 0; i < 100 && PathExists(dir_.path() + "/i-0/models/" + name); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(PathExists(dir_.path() + "/i-0/models/" + name));
  EXPECT_EQ(container.unloads(), std::vector<std::string>{name});
  EXPECT_TRUE(manager_->LoadedModelsForTest("i-0").empty());
  EXPECT_FALSE(Lease(Use(*route, "once.tar.gz")).cache_hit);
  EXPECT_EQ(fetcher_.fetches_.load(), 2);
}

TEST_F(MultiModelTest, RequestsStickToTheHolderAndSpillOverWhenItIsSaturated) {
  FakeMultiModelContainer first(4), second(4);
  auto route = Publish({first.port(), second.port()}, true, /*vcpus=*/1);
  const ModelLease lease = Lease(Use(*route, "m.tar.gz"));
  const std::string holder = lease.instance->instance_id;
  for (int i = 0; i < 10; ++i) EXPECT_EQ(Lease(Use(*route, "m.tar.gz")).instance->instance_id, holder);
  // The holder has as many requests in flight as vCPUs: the next one goes to the other instance.
  lease.instance->outstanding.fetch_add(1);
  const ModelLease spilled = Lease(Use(*route, "m.tar.gz"));
  EXPECT_NE(spilled.instance->instance_id, holder);
  EXPECT_FALSE(spilled.cache_hit);
  lease.instance->outstanding.fetch_sub(1);
  EXPECT_EQ(first.loads() + second.loads(), 2);
}

TEST_F(MultiModelTest, TheRouterInvokesTheLoadedModelAndReloadsOneTheContainerLost) {
  FakeMultiModelContainer container(4);
  Publish({container.port()});
  RouterOptions options;
  Router router(options, &routes_, &client_, nullptr);
  router.SetMultiModel(manager_.get());
  EXPECT_TRUE(router.IsMultiModel("ep"));
  auto invoke = [&](HeaderMap headers) {
    InvokeRequest request;
    request.endpoint_name = "ep";
    request.headers = &headers;
    request.body = "{}";
    request.request_id = "req-1";
    request.account_id = "123456789012";
    net::FakeResponseWriter writer;
    router.Invoke(request, writer);
    return writer;
  };
  auto w = invoke({{"X-Amzn-SageMaker-Target-Model", "a.tar.gz"}});
  ASSERT_EQ(w.status(), 200) << w.body();
  EXPECT_EQ(json::parse(w.body())["model"], ContainerModelName("a.tar.gz"));
  EXPECT_EQ(json::parse(w.body())["target"], "a.tar.gz");
  container.Forget(ContainerModelName("a.tar.gz"));
  w = invoke({{"X-Amzn-SageMaker-Target-Model", "a.tar.gz"}});
  ASSERT_EQ(w.status(), 200) << w.body();
  EXPECT_EQ(container.loads(), 2);
  // No TargetModel on a multi-model endpoint.
  w = invoke({});
  EXPECT_EQ(w.status(), 400);
  EXPECT_NE(w.body().find("TargetModel"), std::string::npos);
  w = invoke({{"X-Amzn-SageMaker-Target-Model", "missing.tar.gz"}});
  EXPECT_EQ(w.status(), 400);
  EXPECT_NE(w.body().find("Failed to download model data"), std::string::npos);
}

}  // namespace
}  // namespace kiln::serving
