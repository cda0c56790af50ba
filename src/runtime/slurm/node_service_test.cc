#include "runtime/slurm/node_service.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "base/fs.h"
#include "net/test_util/fake_response_writer.h"
#include "runtime/slurm/test_util/fake_slurm_client.h"

namespace kiln::runtime::slurm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class NodeServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("kiln-node-svc-" + std::to_string(getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "opt_ml" / "input" / "config");
    ASSERT_TRUE(
        WriteFileAtomic((root_ / "opt_ml" / "input" / "config" / "hyperparameters.json").string(), R"({"epochs":"1"})")
            .ok());
    fake_ = std::make_shared<FakeSlurmClient>();
    SlurmRuntimeOptions o;
    o.state_dir = (root_ / "state").string();
    o.client = fake_;
    o.server_url = "http://127.0.0.1:1";
    o.start_poller = false;
    runtime_ = std::move(OpenSlurmRuntime(std::move(o))).value();
    InstanceSpec spec;
    spec.instance_id = "i-1";
    spec.opt_ml_dir = (root_ / "opt_ml").string();
    spec.argv = {"/bin/true"};
    spec.hostname = "algo-1";
    ASSERT_TRUE(runtime_->Launch(spec).ok());
    token_ = fake_->submitted().at(0).env.at("KILN_NODE_TOKEN");
    service_ = std::make_unique<NodeService>(runtime_.get());
  }
  void TearDown() override {
    service_.reset();
    runtime_.reset();
    fs::remove_all(root_);
  }
  // Sends one request; `token` "" sends none.
  net::FakeResponseWriter Call(const std::string& method, const std::string& target, const std::string& body = "",
                               const std::optional<std::string>& token = std::nullopt) {
    net::HttpRequest request;
    request.method = method;
    request.target = target;
    size_t q = target.find('?');
    request.raw_path = target.substr(0, q);
    request.raw_query = q == std::string::npos ? "" : target.substr(q + 1);
    const std::string t = token.value_or(token_);
    if (!t.empty()) request.headers.emplace("Authorization", "Bearer " + t);
    StringByteSource source(body);
    request.body = &source;
    net::FakeResponseWriter response;
    service_->Handle(request, response);
    return response;
  }

  fs::path root_;
  std::shared_ptr<FakeSlurmClient> fake_;
  std::unique_ptr<SlurmRuntime> runtime_;
  std::unique_ptr<NodeService> service_;
  std::string token_;
};

TEST_F(NodeServiceTest, TokenIsRequired) {
  EXPECT_EQ(Call("GET", "/_kiln/node/v1/instances/i-1/spec", "", std::string()).status(), 401);
  EXPECT_EQ(Call("GET", "/_kiln/node/v1/instances/i-1/spec", "", std::string("wrong")).status(), 401);
  EXPECT_EQ(Call("GET", "/_kiln/node/v1/instances/nope/spec").status(), 404);
  EXPECT_EQ(Call("GET", "/_kiln/node/v1/instances/i-1/bogus").status(), 404);
  EXPECT_EQ(Call("GET", "/_kiln/node/v2/x").status(), 404);
  // The other header form.
  net::HttpRequest request;
  request.method = "GET";
  request.raw_path = "/_kiln/node/v1/instances/i-1/spec";
  request.headers.emplace("X-Kiln-Node-Token", token_);
  StringByteSource none("");
  request.body = &none;
  net::FakeResponseWriter response;
  service_->Handle(request, response);
  EXPECT_EQ(response.status(), 200);
}

TEST_F(NodeServiceTest, SpecIsTheLaunchedOne) {
  net::FakeResponseWriter r = Call("GET", "/_kiln/node/v1/instances/i-1/spec");
  ASSERT_EQ(r.status(), 200) << r.body();
  Result<InstanceSpec> spec = DecodeSpec(r.body());
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->hostname, "algo-1");
  EXPECT_EQ(spec->argv, std::vector<std::string>{"/bin/true"});
}

TEST_F(NodeServiceTest, OptMlIsATarOfTheDirectory) {
  net::FakeResponseWriter r = Call("GET", "/_kiln/node/v1/instances/i-1/opt-ml");
  ASSERT_EQ(r.status(), 200) << r.body();
  EXPECT_TRUE(r.finished());
  EXPECT_EQ(r.header("Content-Type"), "application/x-tar");
  struct archive* a = archive_read_new();
  archive_read_support_format_tar(a);
  ASSERT_EQ(archive_read_open_memory(a, r.body().data(), r.body().size()), ARCHIVE_OK);
  std::map<std::string, std::string> files;
  archive_entry* e = nullptr;
  while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
    std::string content(static_cast<size_t>(archive_entry_size(e)), '\0');
    if (!content.empty()) archive_read_data(a, content.data(), content.size());
    files[archive_entry_pathname(e)] = content;
  }
  archive_read_free(a);
  EXPECT_EQ(files["input/config/hyperparameters.json"], R"({"epochs":"1"})");
  EXPECT_EQ(files.count("input") + files.count("input/"), 1u);
}

TEST_F(NodeServiceTest, OutputAppendsAtTheServersSize) {
  net::FakeResponseWriter r = Call("POST", "/_kiln/node/v1/instances/i-1/output?offset=0", "1 o a\n");
  ASSERT_EQ(r.status(), 200) << r.body();
  EXPECT_EQ(json::parse(r.body())["size"], 6);
  r = Call("POST", "/_kiln/node/v1/instances/i-1/output?offset=0", "1 o a\n");
  ASSERT_EQ(r.status(), 409);
  EXPECT_EQ(json::parse(r.body())["size"], 6);
  r = Call("POST", "/_kiln/node/v1/instances/i-1/output?offset=6", "2 e b\n");
  ASSERT_EQ(r.status(), 200);
  EXPECT_EQ(*ReadFile(runtime_->OutputPath("i-1")), "1 o a\n2 e b\n");
  EXPECT_EQ(Call("POST", "/_kiln/node/v1/instances/i-1/output", "x").status(), 400);
}

TEST_F(NodeServiceTest, ReportAnswersTheStop) {
  NodeReport report;
  report.state = "running";
  report.node = "kn1";
  report.address = "10.77.0.11";
  json running = ReportToJson(report);
  net::FakeResponseWriter r = Call("POST", "/_kiln/node/v1/instances/i-1/report", running.dump());
  ASSERT_EQ(r.status(), 200) << r.body();
  EXPECT_TRUE(json::parse(r.body())["stop_grace_seconds"].is_null());
  ASSERT_TRUE(runtime_->Stop("i-1", std::chrono::seconds(7)).ok());
  r = Call("POST", "/_kiln/node/v1/instances/i-1/report", running.dump());
  EXPECT_EQ(json::parse(r.body())["stop_grace_seconds"], 7);
  EXPECT_EQ(Call("POST", "/_kiln/node/v1/instances/i-1/report", "{").status(), 400);
  EXPECT_EQ(Call("POST", "/_kiln/node/v1/instances/i-1/report", R"({"state":"odd"})").status(), 400);
  NodeReport exit_report;
  exit_report.state = "exited";
  exit_report.exit_code = 0;
  json exited = ReportToJson(exit_report);
  ASSERT_EQ(Call("POST", "/_kiln/node/v1/instances/i-1/report", exited.dump()).status(), 200);
  EXPECT_EQ(runtime_->Inspect("i-1")->state, InstanceState::kExited);
  // Written off already: the node is told to stop (grace 0), not an error it would retry.
  r = Call("POST", "/_kiln/node/v1/instances/i-1/report", running.dump());
  ASSERT_EQ(r.status(), 200);
  EXPECT_EQ(json::parse(r.body())["stop_grace_seconds"], 0);
}

TEST_F(NodeServiceTest, FilesRefusedOutsideResults) {
  // Not a tar at all.
  net::FakeResponseWriter r = Call("POST", "/_kiln/node/v1/instances/i-1/files", std::string(1024, 'x'));
  EXPECT_EQ(r.status(), 400) << r.body();
}

}  // namespace
}  // namespace kiln::runtime::slurm
