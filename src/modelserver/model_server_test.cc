#include "modelserver/model_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/strings.h"
#include "net/http_client.h"

namespace kiln::modelserver {
namespace {

using namespace std::chrono_literals;

// ---- a fake backend: echoes what it was given, scripted loads, memory and failures ----

struct FakeConfig {
  Status start_error;      // Start() returns it
  Status load_error;       // the load ends with it (kFailed)
  bool hold_load = false;  // stays kLoading until FakeCore::Release()
  bool answer_inline = false;
  uint64_t memory = 0;
  int workers = 2;
  std::chrono::milliseconds invoke_delay{0};  // the worker thread waits this long per answer
};

// The state a test keeps after the server owns the backend.
struct FakeCore {
  std::string name;
  std::string dir;
  FakeConfig config;
  std::mutex mu;
  std::condition_variable cv;
  BackendState state = BackendState::kLoading;
  std::deque<std::pair<InferenceRequest, InferenceCallback>> queue;
  bool stop_worker = false;
  std::atomic<int> invocations{0};
  std::atomic<int> stops{0};

  void Release() {
    std::lock_guard lock(mu);
    if (state == BackendState::kLoading) {
      state = config.load_error.ok() ? BackendState::kReady : BackendState::kFailed;
    }
    cv.notify_all();
  }
};

// The echo answer: every field the front end forwarded, as JSON; a body "status:<n>" answers <n>.
InferenceResponse Echo(const FakeCore& core, const InferenceRequest& request) {
  InferenceResponse response;
  if (StartsWith(request.body, "status:")) response.status = std::stoi(request.body.substr(7));
  response.content_type = "application/x-echo";
  response.custom_attributes = request.custom_attributes.empty() ? "" : "echo " + request.custom_attributes;
  response.body = nlohmann::json{
      {"model", core.name},
      {"content_type", request.content_type},
      {"accept", request.accept},
      {"custom_attributes", request.custom_attributes},
      {"inference_id", request.inference_id},
      {"target_model", request.target_model},
      {"body",
       request.body}}.dump();
  return response;
}

class FakeBackend final : public InferenceBackend {
 public:
  explicit FakeBackend(std::shared_ptr<FakeCore> core) : core_(std::move(core)) {}
  ~FakeBackend() override { Stop(0ms); }

  Status Start() override {
    if (!core_->config.start_error.ok()) return core_->config.start_error;
    if (!core_->config.hold_load) core_->Release();
    worker_ = std::thread([this] { Work(); });
    return Status::Ok();
  }

  Status WaitUntilLoaded(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(core_->mu);
    core_->cv.wait_for(lock, timeout, [&] { return core_->state != BackendState::kLoading; });
    switch (core_->state) {
      case BackendState::kReady: return Status::Ok();
      case BackendState::kLoading: return Status::DeadlineExceeded("still loading");
      case BackendState::kFailed: return core_->config.load_error;
      case BackendState::kStopped: return Status::Unavailable("stopped");
    }
    return Status::Internal("unreachable");
  }

  void Invoke(InferenceRequest request, InferenceCallback done) override {
    std::unique_lock lock(core_->mu);
    ++core_->invocations;
    if (core_->state != BackendState::kReady) {
      lock.unlock();
      done(ErrorResponse(503, "ServiceUnavailable", "the model is not ready"));
      return;
    }
    if (core_->config.answer_inline) {
      InferenceResponse response = Echo(*core_, request);
      lock.unlock();
      done(std::move(response));
      return;
    }
    core_->queue.emplace_back(std::move(request), std::move(done));
    core_->cv.notify_all();
  }

  BackendState state() const override {
    std::lock_guard lock(core_->mu);
    return core_->state;
  }
  Status load_error() const override {
    std::lock_guard lock(core_->mu);
    return core_->state == BackendState::kFailed ? core_->config.load_error : Status::Ok();
  }
  uint64_t MemoryBytes() const override { return core_->config.memory; }
  int workers() const override { return core_->config.workers; }

  void Stop(std::chrono::milliseconds) override {
    {
      std::lock_guard lock(core_->mu);
      if (core_->stop_worker) return;
      core_->stop_worker = true;
      core_->state = BackendState::kStopped;
      core_->cv.notify_all();
    }
    ++core_->stops;
    if (worker_.joinable()) worker_.join();
  }

 private:
  // Answers from its own thread, as WorkerPool does; finishes the queue before it stops.
  void Work() {
    std::unique_lock lock(core_->mu);
    while (true) {
      core_->cv.wait(lock, [&] { return core_->stop_worker || !core_->queue.empty(); });
      if (core_->queue.empty()) return;
      auto [request, done] = std::move(core_->queue.front());
      core_->queue.pop_front();
      if (core_->config.invoke_delay.count() > 0) {
        lock.unlock();
        std::this_thread::sleep_for(core_->config.invoke_delay);
        lock.lock();
      }
      InferenceResponse response = Echo(*core_, request);
      lock.unlock();
      done(std::move(response));
      lock.lock();
    }
  }

  std::shared_ptr<FakeCore> core_;
  std::thread worker_;
};

// Makes FakeBackends from per-name configs and keeps every core it made.
struct FakeFactory {
  std::mutex mu;
  std::map<std::string, FakeConfig> configs;
  std::vector<std::shared_ptr<FakeCore>> cores;
  std::vector<ModelSpec> specs;
  Status factory_error;

  BackendFactory Get() {
    return [this](const ModelSpec& spec) -> Result<std::unique_ptr<InferenceBackend>> {
      std::lock_guard lock(mu);
      specs.push_back(spec);
      if (!factory_error.ok()) return factory_error;
      auto core = std::make_shared<FakeCore>();
      core->name = spec.name;
      core->dir = spec.dir;
      if (auto it = configs.find(spec.name); it != configs.end()) core->config = it->second;
      cores.push_back(core);
      return std::unique_ptr<InferenceBackend>(new FakeBackend(core));
    };
  }

  std::shared_ptr<FakeCore> Core(size_t i) {
    std::lock_guard lock(mu);
    return i < cores.size() ? cores[i] : nullptr;
  }
  size_t made() {
    std::lock_guard lock(mu);
    return specs.size();
  }
};

// ---- HTTP helpers ----

struct Answer {
  int status = 0;
  HeaderMap headers;
  std::string body;
  nlohmann::json json() const { return nlohmann::json::parse(body, nullptr, false); }
  std::string header(std::string_view name) const {
    const std::string* v = FindHeader(headers, name);
    return v ? *v : "";
  }
};

class ModelServerTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (server_) server_->Stop(1s);
  }

  ModelServerOptions Options(bool multi_model) {
    ModelServerOptions options;
    options.multi_model = multi_model;
    options.workers = multi_model ? 1 : 3;
    options.base_dir = dir_;
    options.memory_limit_bytes = 1000;
    return options;
  }

  void StartServer(
      ModelServerOptions options, std::function<uint64_t()> server_memory = [] { return 0; }) {
    ModelServerParams params;
    params.options = std::move(options);
    params.backend_factory = factory_.Get();
    params.listen = "127.0.0.1:0";
    params.event_loops = 2;
    params.load_timeout = 5s;
    params.server_memory_bytes = std::move(server_memory);
    auto server = ModelServer::Create(std::move(params));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started.ToString();
  }

  Answer Send(std::string_view method, std::string_view target, std::string_view body = "",
              const HeaderMap& headers = {}) {
    net::ClientRequest request;
    request.method = method;
    request.target = target;
    request.headers = &headers;
    request.body = body;
    auto response = client_.Send("127.0.0.1", server_->port(), request, {.connect_ms = 2000, .response_ms = 10000});
    EXPECT_TRUE(response.ok()) << response.status().ToString();
    if (!response.ok()) return {};
    return Answer{response->status, std::move(response->headers), std::move(response->body)};
  }

  // Sends raw bytes on a new connection (the request should say Connection: close) and returns all
  // that comes back until the server closes.
  std::string SendRaw(std::string_view bytes) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(server_->port());
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;  // the server may answer and close before reading everything
      sent += static_cast<size_t>(n);
    }
    std::string out;
    char buf[4096];
    while (true) {
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return out;
  }

  Answer Load(std::string_view name, std::string url = "") {
    if (url.empty()) url = dir_;
    return Send("POST", "/models", nlohmann::json{{"model_name", name}, {"url", url}}.dump());
  }

  std::string dir_ = ::testing::TempDir();
  FakeFactory factory_;
  std::unique_ptr<ModelServer> server_;
  net::HttpClient client_;
};

// ---- the route table ----

TEST(MatchRouteTest, PathsMethodsAndNames) {
  EXPECT_EQ(MatchRoute("GET", "/ping").route, Route::kPing);
  EXPECT_TRUE(MatchRoute("GET", "/ping").method_allowed);
  EXPECT_FALSE(MatchRoute("POST", "/ping").method_allowed);
  EXPECT_EQ(MatchRoute("POST", "/ping").allow, "GET");
  EXPECT_TRUE(MatchRoute("POST", "/invocations").method_allowed);
  EXPECT_FALSE(MatchRoute("GET", "/invocations").method_allowed);
  EXPECT_TRUE(MatchRoute("GET", "/execution-parameters").method_allowed);
  EXPECT_EQ(MatchRoute("GET", "/models").route, Route::kModels);
  EXPECT_TRUE(MatchRoute("POST", "/models").method_allowed);
  EXPECT_FALSE(MatchRoute("PUT", "/models").method_allowed);
  RouteMatch model = MatchRoute("DELETE", "/models/a%20b");
  EXPECT_EQ(model.route, Route::kModel);
  EXPECT_TRUE(model.method_allowed);
  EXPECT_EQ(model.raw_name, "a%20b");
  RouteMatch invoke = MatchRoute("POST", "/models/m1/invoke");
  EXPECT_EQ(invoke.route, Route::kModelInvoke);
  EXPECT_EQ(invoke.raw_name, "m1");
  EXPECT_FALSE(MatchRoute("GET", "/models/m1/invoke").method_allowed);
  EXPECT_EQ(MatchRoute("POST", "/models/m1/other").route, Route::kNone);
  EXPECT_EQ(MatchRoute("POST", "/models/m1/invoke/x").route, Route::kNone);
  EXPECT_EQ(MatchRoute("GET", "/ping/").route, Route::kNone);
  EXPECT_EQ(MatchRoute("GET", "/").route, Route::kNone);
  EXPECT_EQ(MatchRoute("GET", "/modelsx").route, Route::kNone);
}

TEST(MatchRouteTest, ModelNamesAreDecodedAndChecked) {
  EXPECT_EQ(*DecodeModelName("a%20b"), "a b");
  EXPECT_EQ(*DecodeModelName("0123abcd"), "0123abcd");
  EXPECT_FALSE(DecodeModelName("").ok());
  EXPECT_FALSE(DecodeModelName("..").ok());
  EXPECT_FALSE(DecodeModelName("%2E%2E").ok());
  EXPECT_FALSE(DecodeModelName(".").ok());
  EXPECT_FALSE(DecodeModelName("a%2Fb").ok());
  EXPECT_FALSE(DecodeModelName("a%00b").ok());
  EXPECT_FALSE(DecodeModelName("bad%zz").ok());
  EXPECT_FALSE(DecodeModelName(std::string(1025, 'x')).ok());
  EXPECT_TRUE(DecodeModelName(std::string(1024, 'x')).ok());
}

// ---- single-model mode ----

TEST_F(ModelServerTest, PingIsUnhealthyUntilTheModelLoads) {
  factory_.configs["model"].hold_load = true;
  StartServer(Options(false));
  ASSERT_EQ(factory_.made(), 1u);
  EXPECT_EQ(factory_.specs[0].name, "model");
  EXPECT_EQ(factory_.specs[0].dir, dir_ + "/model");
  EXPECT_EQ(factory_.specs[0].workers, 3);
  EXPECT_EQ(server_->model_state(), BackendState::kLoading);
  Answer loading = Send("GET", "/ping");
  EXPECT_EQ(loading.status, 503);
  EXPECT_EQ(loading.json()["status"], "Unhealthy");
  EXPECT_EQ(Send("POST", "/invocations", "x").status, 503);

  factory_.Core(0)->Release();
  Answer ready = Send("GET", "/ping");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.header("Content-Type"), "application/json");
  EXPECT_EQ(ready.json(), nlohmann::json({{"status", "Healthy"}}));
  EXPECT_EQ(server_->model_state(), BackendState::kReady);
}

TEST_F(ModelServerTest, InvocationsForwardHeadersAndAnswerWithTheBackendsStatus) {
  StartServer(Options(false));
  HeaderMap headers = {{"Content-Type", "text/csv"},
                       {"Accept", "application/json"},
                       {"X-Amzn-SageMaker-Custom-Attributes", "trace=1"},
                       {"X-Amzn-SageMaker-Inference-Id", "inf-7"},
                       {"X-Amzn-SageMaker-Target-Model", "a.tar.gz"},
                       {"Authorization", "secret"}};
  Answer answer = Send("POST", "/invocations", "1,2,3", headers);
  ASSERT_EQ(answer.status, 200);
  EXPECT_EQ(answer.header("Content-Type"), "application/x-echo");
  EXPECT_EQ(answer.header("X-Amzn-SageMaker-Custom-Attributes"), "echo trace=1");
  nlohmann::json echo = answer.json();
  EXPECT_EQ(echo["content_type"], "text/csv");
  EXPECT_EQ(echo["accept"], "application/json");
  EXPECT_EQ(echo["custom_attributes"], "trace=1");
  EXPECT_EQ(echo["inference_id"], "inf-7");
  EXPECT_EQ(echo["target_model"], "a.tar.gz");
  EXPECT_EQ(echo["body"], "1,2,3");

  Answer teapot = Send("POST", "/invocations", "status:418");
  EXPECT_EQ(teapot.status, 418);
  EXPECT_EQ(teapot.header("X-Amzn-SageMaker-Custom-Attributes"), "");
  EXPECT_EQ(teapot.json()["content_type"], "");
  EXPECT_EQ(factory_.Core(0)->invocations.load(), 2);
}

TEST_F(ModelServerTest, BackendsThatAnswerInlineAreServedToo) {
  factory_.configs["model"].answer_inline = true;
  StartServer(Options(false));
  for (int i = 0; i < 20; ++i) {
    Answer answer = Send("POST", "/invocations", "n" + std::to_string(i));
    ASSERT_EQ(answer.status, 200);
    EXPECT_EQ(answer.json()["body"], "n" + std::to_string(i));
  }
}

TEST_F(ModelServerTest, ManyConcurrentInvocationsAreEachAnsweredWithTheirOwnBody) {
  StartServer(Options(false));
  std::vector<std::thread> clients;
  std::atomic<int> good{0};
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&, c] {
      net::HttpClient client;
      for (int i = 0; i < 25; ++i) {
        std::string body = std::to_string(c) + "/" + std::to_string(i);
        net::ClientRequest request;
        request.target = "/invocations";
        request.body = body;
        auto response = client.Send("127.0.0.1", server_->port(), request, {.connect_ms = 2000, .response_ms = 10000});
        if (response.ok() && response->status == 200 &&
            nlohmann::json::parse(response->body, nullptr, false)["body"] == body) {
          ++good;
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(good.load(), 200);
}

TEST_F(ModelServerTest, ChunkedInvocationsGoThroughTheBlockingPath) {
  StartServer(Options(false));
  std::string raw = SendRaw(
      "POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nConnection: close\r\n"
      "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
  EXPECT_EQ(raw.substr(0, 12), "HTTP/1.1 200") << raw;
  EXPECT_NE(raw.find(R"("body":"hello world")"), std::string::npos) << raw;
  EXPECT_NE(raw.find(R"("content_type":"text/plain")"), std::string::npos) << raw;
}

TEST_F(ModelServerTest, BodiesOverThePayloadLimitAnswer413) {
  ModelServerOptions options = Options(false);
  options.max_payload_bytes = 1000;
  StartServer(options);
  EXPECT_EQ(Send("POST", "/invocations", std::string(1000, 'a')).status, 200);
  Answer big = Send("POST", "/invocations", std::string(1001, 'a'));
  EXPECT_EQ(big.status, 413);
  EXPECT_EQ(big.json()["code"], 413);
  EXPECT_NE(big.json()["message"].get<std::string>().find("SAGEMAKER_MAX_PAYLOAD_IN_MB"), std::string::npos);
  std::string chunk(600, 'b');
  std::string raw = SendRaw(
      "POST /invocations HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n258\r\n" +
      chunk + "\r\n258\r\n" + chunk + "\r\n0\r\n\r\n");
  EXPECT_EQ(raw.substr(0, 12), "HTTP/1.1 413") << raw;
  EXPECT_EQ(factory_.Core(0)->invocations.load(), 1);
  // The server still serves.
  EXPECT_EQ(Send("GET", "/ping").status, 200);
}

TEST_F(ModelServerTest, UnknownRoutesAnswer404AndWrongMethods405) {
  StartServer(Options(false));
  Answer missing = Send("GET", "/nope");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.json()["code"], 404);
  Answer get_invocations = Send("GET", "/invocations");
  EXPECT_EQ(get_invocations.status, 405);
  EXPECT_EQ(get_invocations.header("Allow"), "POST");
  EXPECT_EQ(Send("POST", "/ping").status, 405);
  EXPECT_EQ(Send("DELETE", "/execution-parameters").status, 405);
  // The multi-model API does not exist in single-model mode.
  EXPECT_EQ(Send("GET", "/models").status, 404);
  EXPECT_EQ(Load("m").status, 404);
  EXPECT_EQ(Send("POST", "/models/m/invoke", "x").status, 404);
  EXPECT_EQ(factory_.made(), 1u);
}

TEST_F(ModelServerTest, ExecutionParametersReportWorkersAndPayload) {
  StartServer(Options(false));
  Answer answer = Send("GET", "/execution-parameters");
  ASSERT_EQ(answer.status, 200);
  EXPECT_EQ(answer.json(), nlohmann::json({{"MaxConcurrentTransforms", 2},  // the backend's workers
                                           {"BatchStrategy", "MULTI_RECORD"},
                                           {"MaxPayloadInMB", 6}}));
}

TEST_F(ModelServerTest, AModelThatFailsToLoadKeepsPingUnhealthyAndSaysWhy) {
  factory_.configs["model"].load_error = Status::Internal("ModuleNotFoundError: No module named 'torchx'");
  StartServer(Options(false));
  EXPECT_EQ(server_->model_state(), BackendState::kFailed);
  EXPECT_NE(server_->model_load_error().message().find("torchx"), std::string::npos);
  Answer ping = Send("GET", "/ping");
  EXPECT_EQ(ping.status, 503);
  EXPECT_NE(ping.json()["message"].get<std::string>().find("torchx"), std::string::npos);
  EXPECT_EQ(Send("POST", "/invocations", "x").status, 503);
}

TEST_F(ModelServerTest, StartFailsWhenTheBackendCannotBeMade) {
  factory_.factory_error = Status::InvalidArgument("no model.pt in /opt/ml/model");
  ModelServerParams params;
  params.options = Options(false);
  params.backend_factory = factory_.Get();
  params.listen = "127.0.0.1:0";
  auto server = ModelServer::Create(std::move(params));
  ASSERT_TRUE(server.ok());
  Status started = (*server)->Start();
  EXPECT_FALSE(started.ok());
  EXPECT_NE(started.message().find("model.pt"), std::string::npos);
}

TEST_F(ModelServerTest, StopStopsTheBackendOnce) {
  StartServer(Options(false));
  EXPECT_EQ(Send("GET", "/ping").status, 200);
  server_->Stop(1s);
  EXPECT_EQ(factory_.Core(0)->stops.load(), 1);
  server_->Stop(1s);  // idempotent
  EXPECT_EQ(factory_.Core(0)->stops.load(), 1);
}

TEST_F(ModelServerTest, StopLetsRequestsInFlightFinishAndTheirAnswersGoOut) {
  factory_.configs["model"].invoke_delay = 300ms;
  StartServer(Options(false));
  Answer slow;
  std::thread client([&] { slow = Send("POST", "/invocations", "late"); });
  std::shared_ptr<FakeCore> core = factory_.Core(0);
  ASSERT_NE(core, nullptr);
  for (int i = 0; i < 500 && core->invocations.load() == 0; ++i) std::this_thread::sleep_for(5ms);
  server_->Stop(5s);
  client.join();
  EXPECT_EQ(slow.status, 200);
  EXPECT_EQ(slow.json()["body"], "late");
}

// ---- multi-model mode ----

TEST_F(ModelServerTest, MultiModelLoadListGetInvokeDelete) {
  StartServer(Options(true));
  EXPECT_EQ(Send("GET", "/ping").status, 200);  // healthy with no model
  EXPECT_EQ(factory_.made(), 0u);
  EXPECT_EQ(Send("GET", "/models").json(), nlohmann::json::parse(R"({"models": []})"));

  Answer loaded = Load("m1");
  ASSERT_EQ(loaded.status, 200) << loaded.body;
  ASSERT_EQ(factory_.made(), 1u);
  EXPECT_EQ(factory_.specs[0].name, "m1");
  EXPECT_EQ(factory_.specs[0].dir, dir_);
  EXPECT_EQ(factory_.specs[0].workers, 1);

  Answer again = Load("m1");
  EXPECT_EQ(again.status, 409);
  EXPECT_EQ(again.json()["code"], 409);

  Answer list = Send("GET", "/models");
  EXPECT_EQ(list.json(), nlohmann::json::parse(R"({"models": [{"modelName": "m1", "modelUrl": ")" + dir_ + R"("}]})"));

  Answer get = Send("GET", "/models/m1");
  ASSERT_EQ(get.status, 200);
  EXPECT_EQ(get.json()["modelName"], "m1");
  EXPECT_EQ(get.json()["modelUrl"], dir_);
  EXPECT_EQ(get.json()["workers"], 2);

  HeaderMap headers = {{"X-Amzn-SageMaker-Target-Model", "team/a.tar.gz"}, {"Content-Type", "application/json"}};
  Answer invoked = Send("POST", "/models/m1/invoke", "[1]", headers);
  ASSERT_EQ(invoked.status, 200);
  EXPECT_EQ(invoked.json()["model"], "m1");
  EXPECT_EQ(invoked.json()["target_model"], "team/a.tar.gz");
  EXPECT_EQ(invoked.json()["body"], "[1]");
  // /invocations is not the multi-model invoke.
  EXPECT_EQ(Send("POST", "/invocations", "[1]").status, 404);

  EXPECT_EQ(Send("DELETE", "/models/m1").status, 200);
  EXPECT_EQ(factory_.Core(0)->stops.load(), 1);
  EXPECT_EQ(Send("GET", "/models/m1").status, 404);
  EXPECT_EQ(Send("DELETE", "/models/m1").status, 404);
  EXPECT_EQ(Send("POST", "/models/m1/invoke", "[1]").status, 404);
  EXPECT_EQ(Send("GET", "/models").json()["models"].size(), 0u);
  // Loadable again after the unload.
  EXPECT_EQ(Load("m1").status, 200);
}

TEST_F(ModelServerTest, MultiModelNamesArePercentDecodedPathSegments) {
  StartServer(Options(true));
  ASSERT_EQ(Load("a b").status, 200);
  EXPECT_EQ(Send("GET", "/models/a%20b").json()["modelName"], "a b");
  EXPECT_EQ(Send("POST", "/models/a%20b/invoke", "x").status, 200);
  EXPECT_EQ(Send("GET", "/models/..").status, 400);
  EXPECT_EQ(Send("GET", "/models/a%2Fb").status, 400);
  EXPECT_EQ(Send("POST", "/models/%2E%2E/invoke", "x").status, 400);
}

TEST_F(ModelServerTest, MultiModelLoadRefusesBadRequests) {
  StartServer(Options(true));
  EXPECT_EQ(Send("POST", "/models", "{not json").status, 400);
  EXPECT_EQ(Send("POST", "/models", "[]").status, 400);
  EXPECT_EQ(Send("POST", "/models", R"({"model_name": "m"})").status, 400);
  EXPECT_EQ(Send("POST", "/models", R"({"url": "/tmp"})").status, 400);
  EXPECT_EQ(Send("POST", "/models", R"({"model_name": 5, "url": "/tmp"})").status, 400);
  Answer not_dir = Load("m", dir_ + "/no-such-dir");
  EXPECT_EQ(not_dir.status, 400);
  EXPECT_NE(not_dir.json()["message"].get<std::string>().find("not a directory"), std::string::npos);
  EXPECT_EQ(Load("..").status, 400);
  EXPECT_EQ(Load("a/b").status, 400);
  EXPECT_EQ(Load("").status, 400);
  EXPECT_EQ(Send("PUT", "/models").status, 405);
  EXPECT_EQ(factory_.made(), 0u);
}

TEST_F(ModelServerTest, MultiModelListPagesInNameOrder) {
  StartServer(Options(true));
  for (const char* name : {"m3", "m0", "m4", "m1", "m2"}) ASSERT_EQ(Load(name).status, 200);
  std::vector<std::string> seen;
  std::string target = "/models?limit=2";
  int pages = 0;
  while (true) {
    Answer page = Send("GET", target);
    ASSERT_EQ(page.status, 200) << page.body;
    ++pages;
    nlohmann::json json = page.json();
    EXPECT_LE(json["models"].size(), 2u);
    for (const auto& model : json["models"]) seen.push_back(model["modelName"]);
    if (!json.contains("nextPageToken")) break;
    target = "/models?limit=2&next_page_token=" + json["nextPageToken"].get<std::string>();
    ASSERT_LT(pages, 10);
  }
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, (std::vector<std::string>{"m0", "m1", "m2", "m3", "m4"}));
  // Exactly a page's worth: no token.
  Answer all = Send("GET", "/models?limit=5");
  EXPECT_EQ(all.json()["models"].size(), 5u);
  EXPECT_FALSE(all.json().contains("nextPageToken"));
  EXPECT_EQ(Send("GET", "/models").json()["models"].size(), 5u);  // default 100
  EXPECT_EQ(Send("GET", "/models?limit=0").status, 400);
  EXPECT_EQ(Send("GET", "/models?limit=1001").status, 400);
  EXPECT_EQ(Send("GET", "/models?limit=x").status, 400);
  EXPECT_EQ(Send("GET", "/models?next_page_token=zz").status, 400);
}

TEST_F(ModelServerTest, MultiModelAnswers507WhenMemoryIsShort) {
  std::atomic<uint64_t> server_memory{100};
  StartServer(Options(true), [&] { return server_memory.load(); });  // limit 1000 bytes
  factory_.configs["big"].memory = 850;
  factory_.configs["small"].memory = 10;
  factory_.configs["huge"].memory = 2000;
  ASSERT_EQ(Load("big").status, 200);  // 100 + 0 before: fine
  // 100 + 850 = 950 ≥ 900 before the load: refused without making a backend.
  Answer refused = Load("small");
  EXPECT_EQ(refused.status, 507);
  EXPECT_EQ(refused.json()["code"], 507);
  EXPECT_EQ(factory_.made(), 1u);
  ASSERT_EQ(Send("DELETE", "/models/big").status, 200);
  // A model that passes the limit once loaded is stopped again.
  Answer huge = Load("huge");
  EXPECT_EQ(huge.status, 507);
  ASSERT_EQ(factory_.made(), 2u);
  EXPECT_EQ(factory_.Core(1)->stops.load(), 1);
  EXPECT_EQ(Send("GET", "/models/huge").status, 404);
  // A backend that reports ResourceExhausted while loading.
  factory_.configs["oom"].load_error = Status::ResourceExhausted("CUDA out of memory");
  Answer oom = Load("oom");
  EXPECT_EQ(oom.status, 507);
  EXPECT_NE(oom.json()["message"].get<std::string>().find("CUDA out of memory"), std::string::npos);
  // The others: 500 with the message.
  factory_.configs["broken"].load_error = Status::Internal("model_fn raised ValueError");
  Answer broken = Load("broken");
  EXPECT_EQ(broken.status, 500);
  EXPECT_NE(broken.json()["message"].get<std::string>().find("ValueError"), std::string::npos);
  EXPECT_EQ(Send("GET", "/models").json()["models"].size(), 0u);
  ASSERT_EQ(Load("small").status, 200);
  // The server's own memory counts.
  server_memory = 950;
  EXPECT_EQ(Load("small2").status, 507);
}

TEST_F(ModelServerTest, ConcurrentLoadsOfOneNameLetOneWin) {
  factory_.configs["m"].hold_load = true;
  StartServer(Options(true));
  Answer first;
  std::thread loader([&] { first = Load("m"); });
  for (int i = 0; i < 500 && factory_.made() == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(factory_.made(), 1u);
  // While it loads: 409 for the same name, 503 for invocations, 404 for get, 409 for delete.
  Answer second = Load("m");
  EXPECT_EQ(second.status, 409);
  EXPECT_NE(second.json()["message"].get<std::string>().find("being loaded"), std::string::npos);
  EXPECT_EQ(Send("POST", "/models/m/invoke", "x").status, 503);
  EXPECT_EQ(Send("GET", "/models/m").status, 404);
  EXPECT_EQ(Send("DELETE", "/models/m").status, 409);
  EXPECT_EQ(Send("GET", "/models").json()["models"].size(), 0u);
  factory_.Core(0)->Release();
  loader.join();
  EXPECT_EQ(first.status, 200);
  EXPECT_EQ(Send("POST", "/models/m/invoke", "x").status, 200);

  // Many at once, none held: exactly one 200.
  std::vector<std::thread> racers;
  std::atomic<int> ok{0}, conflict{0};
  for (int i = 0; i < 6; ++i) {
    racers.emplace_back([&] {
      net::HttpClient client;
      std::string body = R"({"model_name": "race", "url": ")" + dir_ + R"("})";
      net::ClientRequest request;
      request.target = "/models";
      request.body = body;
      auto response = client.Send("127.0.0.1", server_->port(), request, {.connect_ms = 2000, .response_ms = 10000});
      if (response.ok() && response->status == 200) ++ok;
      if (response.ok() && response->status == 409) ++conflict;
    });
  }
  for (auto& t : racers) t.join();
  EXPECT_EQ(ok.load(), 1);
  EXPECT_EQ(conflict.load(), 5);
}

TEST_F(ModelServerTest, StopEndsAModelStillLoading) {
  factory_.configs["slow"].hold_load = true;
  StartServer(Options(true));
  Answer answer;
  std::thread loader([&] { answer = Load("slow"); });
  for (int i = 0; i < 500 && factory_.made() == 0; ++i) std::this_thread::sleep_for(10ms);
  // Let the loader reach WaitUntilLoaded (the factory has returned once the core exists).
  for (int i = 0; i < 500 && factory_.Core(0) == nullptr; ++i) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(50ms);
  server_->Stop(1s);
  loader.join();
  EXPECT_GE(factory_.Core(0)->stops.load(), 1);
}

}  // namespace
}  // namespace kiln::modelserver
