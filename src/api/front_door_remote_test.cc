// The front door's /_kiln/remote/* routes (issue 16): SigV4, the JSON 1.1 error shapes of the
// TunnelService's refusals, and the upgrade of a connect; and /_kiln/training/interrupt (issue 18),
// signed and answered the same way; and /_kiln/node/ (issue 21), handed on unsigned.
#include <poll.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "access/tunnel_service.h"
#include "api/front_door.h"
#include "aws/sigv4.h"
#include "base/hash.h"
#include "net/test_util/fake_response_writer.h"
#include "runtime/test_util/fake_runtime.h"
#include "store/test_util/temp_database.h"
#include "store/training_job_repository.h"

namespace kiln::api {
namespace {

constexpr char kKeyId[] = "AKIAREMOTEKEY0000001";
constexpr char kSecret[] = "remotesecretremotesecret0123456789";
constexpr char kPublicKey[] = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKnEr6PSCbvMBCb1611/xbrSDUqTUUVMOTw/1NmnKQCX k";

class OneKey final : public aws::CredentialProvider {
 public:
  std::optional<aws::Credential> Lookup(std::string_view id) const override {
    if (id != kKeyId) return std::nullopt;
    aws::Credential c;
    c.access_key_id = kKeyId;
    c.secret_access_key = kSecret;
    c.account_id = "123456789012";
    c.principal_arn = "arn:aws:iam::123456789012:user/alice";
    c.user_id = "AIDAALICE";
    return c;
  }
};

class FrontDoorRemoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FrontDoorOptions options;
    options.account_id = "123456789012";
    door_ = std::make_unique<FrontDoor>(options, &credentials_, nullptr);
    db_ = store::testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    runtime_ = std::make_unique<runtime::testing::FakeRuntime>(dir_.path() + "/instances");
  }
  void TearDown() override {
    if (tunnels_) tunnels_->Stop();
  }

  // The tunnel service behind the routes; its agent sends a banner and echoes.
  void WithTunnels() {
    access::TunnelServiceOptions options;
    options.agent_command = {"/bin/sh", "-c", "printf 'SSH-2.0-fake\\r\\n' >&3; exec cat <&3 >&3", "agent"};
    options.allowed_principals = {"arn:aws:iam::*:user/alice"};
    auto made = access::TunnelService::Create(options, {db_.get(), runtime_.get(), nullptr});
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    tunnels_ = std::move(made).value();
    door_->SetRemoteAccess(tunnels_.get());
  }

  void AddJob(const std::string& name, bool enabled) {
    store::TrainingJobRecord r;
    r.name = name;
    r.arn = "arn:aws:sagemaker:us-east-1:123456789012:training-job/" + name;
    r.request = {{"ResourceConfig", {{"InstanceCount", 1}}}, {"RemoteDebugConfig", {{"EnableRemoteDebug", enabled}}}};
    r.secondary_status = store::SecondaryStatus::kTraining;
    store::TrainingHostState host;
    host.host = "algo-1";
    host.instance_id = "training-" + name + "-algo-1";
    r.state.hosts.push_back(host);
    runtime::InstanceSpec spec;
    spec.instance_id = "training-" + name + "-algo-1";
    spec.argv = {"/bin/true"};
    ASSERT_TRUE(runtime_->Launch(spec).ok());
    ASSERT_TRUE(store::TrainingJobRepository(db_.get()).Insert(r).ok());
  }

  // GET `path`?`query` signed for `service` (unsigned when `service` is empty).
  net::FakeResponseWriter Get(const std::string& path, const std::string& query, HeaderMap headers,
                              const std::string& service = "sagemaker") {
    return Send("GET", path, query, std::move(headers), service);
  }
  // The same with another method (and no body, as the clients send).
  net::FakeResponseWriter Send(const std::string& method, const std::string& path, const std::string& query,
                               HeaderMap headers, const std::string& service = "sagemaker") {
    headers.emplace("Host", "127.0.0.1:5456");
    if (!service.empty()) {
      aws::OwnedSignable signable{method, path, query, headers};
      aws::SignOptions sign;
      sign.access_key_id = kKeyId;
      sign.secret_access_key = kSecret;
      sign.service = service;
      sign.payload_hash = Sha256Hex("");
      aws::SignRequest(signable, sign);
      headers = signable.headers;
    }
    StringByteSource source("");
    net::HttpRequest request;
    request.method = method;
    request.raw_path = path;
    request.raw_query = query;
    request.target = query.empty() ? path : path + "?" + query;
    request.headers = headers;
    request.remote_address = "127.0.0.1:50000";
    request.body = &source;
    net::FakeResponseWriter writer;
    door_->Handle(request, writer);
    return writer;
  }

  net::FakeResponseWriter Connect(const std::string& target, bool upgrade = true) {
    HeaderMap headers = {{"X-Kiln-Ssh-Public-Key", kPublicKey}, {"Connection", "Upgrade"}};
    if (upgrade) headers.emplace("Upgrade", "kiln-ssh");
    return Get("/_kiln/remote/connect", "target=" + target, headers);
  }

  static std::string ErrorType(const net::FakeResponseWriter& w) {
    auto j = nlohmann::json::parse(w.body(), nullptr, false);
    return j.is_object() ? j.value("__type", "") : "";
  }

  store::testing::TempDir dir_;
  OneKey credentials_;
  std::unique_ptr<FrontDoor> door_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<runtime::testing::FakeRuntime> runtime_;
  std::unique_ptr<access::TunnelService> tunnels_;
};

TEST_F(FrontDoorRemoteTest, RoutesNeedSigV4AndAService) {
  net::FakeResponseWriter unsigned_request = Get("/_kiln/remote/targets", "resource=j", {}, "");
  EXPECT_EQ(unsigned_request.status(), 400);
  EXPECT_EQ(ErrorType(unsigned_request), "MissingAuthenticationTokenException");
  net::FakeResponseWriter no_service = Get("/_kiln/remote/targets", "resource=j", {});
  EXPECT_EQ(no_service.status(), 404);
  EXPECT_EQ(ErrorType(no_service), "UnknownOperationException");
  WithTunnels();
  net::FakeResponseWriter unknown_route = Get("/_kiln/remote/nothing", "", {});
  EXPECT_EQ(unknown_route.status(), 404);
  EXPECT_EQ(ErrorType(unknown_route), "UnknownOperationException");
}

TEST_F(FrontDoorRemoteTest, RefusalsAreAwsShapedJson) {
  WithTunnels();
  AddJob("j", true);
  AddJob("off", false);
  net::FakeResponseWriter missing = Connect("training-job%2Fnope%2Falgo-1");
  EXPECT_EQ(missing.status(), 404);
  EXPECT_EQ(ErrorType(missing), "ResourceNotFound");
  EXPECT_EQ(missing.header("x-amzn-ErrorType").substr(0, 16), "ResourceNotFound");
  EXPECT_EQ(missing.header("Content-Type"), "application/x-amz-json-1.1");
  net::FakeResponseWriter off = Connect("off");
  EXPECT_EQ(off.status(), 403);
  EXPECT_EQ(ErrorType(off), "AccessDeniedException");
  net::FakeResponseWriter bad = Connect("training-job%2Fj%2Fhost-1");
  EXPECT_EQ(bad.status(), 400);
  EXPECT_EQ(ErrorType(bad), "ValidationException");
  net::FakeResponseWriter no_upgrade = Connect("j", /*upgrade=*/false);
  EXPECT_EQ(no_upgrade.status(), 400);
  EXPECT_NE(no_upgrade.body().find("Upgrade: kiln-ssh"), std::string::npos);
  ASSERT_TRUE(runtime_->Exit("training-j-algo-1", 0).ok());
  net::FakeResponseWriter pending = Connect("j");
  EXPECT_EQ(pending.status(), 409);
  EXPECT_EQ(ErrorType(pending), "ConflictException");
}

TEST_F(FrontDoorRemoteTest, ConnectUpgradesAndTheStreamReachesTheAgent) {
  WithTunnels();
  AddJob("j", true);
  net::FakeResponseWriter w = Connect("sagemaker-training-job%3Aj_algo-1");
  ASSERT_EQ(w.status(), 101) << w.body();
  EXPECT_EQ(w.header("Upgrade"), "kiln-ssh");
  EXPECT_EQ(w.header("X-Kiln-Target"), "training-job/j/algo-1");
  EXPECT_EQ(w.header("X-Kiln-Connection-Id").substr(0, 3), "rc-");
  int fd = w.peer().get();
  ASSERT_EQ(::write(fd, "ping", 4), 4);
  std::string got;
  while (got.size() < 18) {
    pollfd p{fd, POLLIN, 0};
    ASSERT_GT(::poll(&p, 1, 5000), 0) << got;
    char buffer[64];
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    ASSERT_GT(n, 0);
    got.append(buffer, static_cast<size_t>(n));
  }
  EXPECT_EQ(got, "SSH-2.0-fake\r\nping");

  net::FakeResponseWriter targets = Get("/_kiln/remote/targets", "resource=j", {});
  ASSERT_EQ(targets.status(), 200) << targets.body();
  auto doc = nlohmann::json::parse(targets.body());
  EXPECT_EQ(doc["Targets"][0]["State"], "Ready");
  net::FakeResponseWriter connections = Get("/_kiln/remote/connections", "resource=j&max-results=5", {});
  ASSERT_EQ(connections.status(), 200) << connections.body();
  doc = nlohmann::json::parse(connections.body());
  ASSERT_EQ(doc["Connections"].size(), 1u);
  EXPECT_EQ(doc["Connections"][0]["Principal"], "arn:aws:iam::123456789012:user/alice");
  EXPECT_EQ(doc["Connections"][0]["SourceAddress"], "127.0.0.1:50000");
  EXPECT_FALSE(doc["Connections"][0].contains("EndTime"));
  net::FakeResponseWriter bad_max = Get("/_kiln/remote/connections", "max-results=x", {});
  EXPECT_EQ(bad_max.status(), 400);
}

// POST /_kiln/training/interrupt (issue 18, `kiln interrupt`): signed like the remote routes, its
// refusals in the same JSON 1.1 shapes.
TEST_F(FrontDoorRemoteTest, TrainingInterruptNeedsSigV4AnInterrupterAndAJob) {
  net::FakeResponseWriter unsigned_request = Send("POST", "/_kiln/training/interrupt", "job=j", {}, "");
  EXPECT_EQ(unsigned_request.status(), 400);
  EXPECT_EQ(ErrorType(unsigned_request), "MissingAuthenticationTokenException");
  net::FakeResponseWriter no_interrupter = Send("POST", "/_kiln/training/interrupt", "job=j", {});
  EXPECT_EQ(no_interrupter.status(), 404);
  EXPECT_EQ(ErrorType(no_interrupter), "UnknownOperationException");

  std::vector<std::string> asked;
  door_->SetTrainingInterrupter([&asked](const std::string& job) {
    asked.push_back(job);
    return Status::Ok();
  });
  net::FakeResponseWriter wrong_service = Send("POST", "/_kiln/training/interrupt", "job=j", {}, "s3");
  EXPECT_EQ(wrong_service.status(), 400);
  EXPECT_NE(ErrorType(wrong_service).find("Exception"), std::string::npos) << wrong_service.body();
  net::FakeResponseWriter get = Send("GET", "/_kiln/training/interrupt", "job=j", {});
  EXPECT_EQ(get.status(), 404);
  EXPECT_EQ(ErrorType(get), "UnknownOperationException");
  EXPECT_NE(get.body().find("POST /_kiln/training/interrupt?job="), std::string::npos) << get.body();
  net::FakeResponseWriter unknown_route = Send("POST", "/_kiln/training/resume", "job=j", {});
  EXPECT_EQ(unknown_route.status(), 404);
  EXPECT_EQ(ErrorType(unknown_route), "UnknownOperationException");
  net::FakeResponseWriter no_job = Send("POST", "/_kiln/training/interrupt", "", {});
  EXPECT_EQ(no_job.status(), 400);
  EXPECT_EQ(ErrorType(no_job), "ValidationException");
  EXPECT_NE(no_job.body().find("job is required (?job=<training job name>)"), std::string::npos) << no_job.body();
  EXPECT_EQ(Send("POST", "/_kiln/training/interrupt", "job=", {}).status(), 400);
  EXPECT_TRUE(asked.empty());
}

TEST_F(FrontDoorRemoteTest, TrainingInterruptAnswersTheInterruptersOutcome) {
  std::vector<std::string> asked;
  door_->SetTrainingInterrupter([&asked](const std::string& job) {
    asked.push_back(job);
    if (job == "nope") return Status::NotFound("Training job nope does not exist.");
    if (job == "on-demand") return Status::FailedPrecondition("on-demand is not a managed spot training job.");
    if (job == "bad") return Status::InvalidArgument("bad is bad.");
    if (job == "broken") return Status::Internal("disk on fire");
    return Status::Ok();
  });
  net::FakeResponseWriter ok = Send("POST", "/_kiln/training/interrupt", "job=spot%2D1", {});
  ASSERT_EQ(ok.status(), 200) << ok.body();
  EXPECT_EQ(ok.header("Content-Type"), "application/x-amz-json-1.1");
  auto doc = nlohmann::json::parse(ok.body());
  EXPECT_EQ(doc["TrainingJobName"], "spot-1");
  EXPECT_EQ(doc["Interrupted"], true);
  EXPECT_EQ(asked, std::vector<std::string>{"spot-1"});

  net::FakeResponseWriter missing = Send("POST", "/_kiln/training/interrupt", "job=nope", {});
  EXPECT_EQ(missing.status(), 404);
  EXPECT_EQ(ErrorType(missing), "ResourceNotFound");
  EXPECT_NE(missing.body().find("does not exist"), std::string::npos);
  net::FakeResponseWriter on_demand = Send("POST", "/_kiln/training/interrupt", "job=on-demand", {});
  EXPECT_EQ(on_demand.status(), 400);
  EXPECT_EQ(ErrorType(on_demand), "ValidationException");
  EXPECT_NE(on_demand.body().find("not a managed spot training job"), std::string::npos) << on_demand.body();
  net::FakeResponseWriter bad = Send("POST", "/_kiln/training/interrupt", "job=bad", {});
  EXPECT_EQ(bad.status(), 400);
  EXPECT_EQ(ErrorType(bad), "ValidationException");
  net::FakeResponseWriter broken = Send("POST", "/_kiln/training/interrupt", "job=broken", {});
  EXPECT_EQ(broken.status(), 500);
  EXPECT_EQ(ErrorType(broken), "InternalFailure");
}

// /_kiln/node/ (issue 21): never SigV4-checked (the node service checks its own token); without a
// node service, a JSON 404.
TEST_F(FrontDoorRemoteTest, NodeRoutesGoToTheNodeServiceUnsigned) {
  net::FakeResponseWriter none = Send("GET", "/_kiln/node/v1/instances/i/spec", "", {}, "");
  EXPECT_EQ(none.status(), 404);
  EXPECT_NE(none.body().find("runs no Slurm runtime"), std::string::npos) << none.body();
  std::vector<std::string> seen;
  door_->SetNodeService([&seen](net::HttpRequest& request, net::ResponseWriter& response) {
    seen.push_back(request.method + " " + request.raw_path + "?" + request.raw_query);
    (void)response.Send(200, {{"Content-Type", "application/json"}}, "{}");
  });
  net::FakeResponseWriter ok = Send("POST", "/_kiln/node/v1/instances/i/output", "offset=0", {}, "");
  EXPECT_EQ(ok.status(), 200);
  // A signature does not matter either way (a node never signs).
  EXPECT_EQ(Send("GET", "/_kiln/node/v1/instances/i/spec", "", {}).status(), 200);
  EXPECT_EQ(seen, (std::vector<std::string>{"POST /_kiln/node/v1/instances/i/output?offset=0",
                                            "GET /_kiln/node/v1/instances/i/spec?"}));
}

}  // namespace
}  // namespace kiln::api
