// The node side against a fake server (a net::HttpServer speaking the node protocol), with real
// programs under the node's process runtime: these tests need root, like runtime_process_test,
// and run the shim built beside them (KILN_TEST_SHIM).
#include "runtime/slurm/node_agent.h"

#include <archive.h>
#include <archive_entry.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/tar_extract.h"
#include "base/fs.h"
#include "base/io.h"
#include "base/mutex.h"
#include "base/strings.h"
#include "net/http_server.h"
#include "runtime/slurm/spec_json.h"

namespace kiln::runtime::slurm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

const char* ShimPath() {
  const char* env = std::getenv("KILN_TEST_SHIM");
  return env != nullptr && *env != '\0' ? env : KILN_TEST_SHIM;
}

// A tar (in memory) of path -> content.
std::string MakeTar(const std::map<std::string, std::string>& files) {
  std::string out;
  out.resize(1 << 20);
  size_t used = 0;
  struct archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  archive_write_open_memory(a, out.data(), out.size(), &used);
  for (const auto& [path, content] : files) {
    struct archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, path.c_str());
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, static_cast<la_int64_t>(content.size()));
    archive_write_header(a, e);
    archive_write_data(a, content.data(), content.size());
    archive_entry_free(e);
  }
  archive_write_close(a);
  archive_write_free(a);
  out.resize(used);
  return out;
}

// Members of a tar (in memory): path -> content.
std::map<std::string, std::string> ReadTar(const std::string& tar) {
  std::map<std::string, std::string> out;
  struct archive* a = archive_read_new();
  archive_read_support_format_tar(a);
  archive_read_open_memory(a, tar.data(), tar.size());
  struct archive_entry* e;
  while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
    std::string content(static_cast<size_t>(archive_entry_size(e)), '\0');
    if (!content.empty()) archive_read_data(a, content.data(), content.size());
    out[archive_entry_pathname(e)] = content;
  }
  archive_read_free(a);
  return out;
}

// The server end of the node protocol for one instance, recording what the node sends.
class FakeServer {
 public:
  explicit FakeServer(InstanceSpec spec, std::map<std::string, std::string> opt_ml = {})
      : spec_(std::move(spec)), opt_ml_tar_(MakeTar(opt_ml)) {
    net::HttpServerOptions o;
    o.listen = "127.0.0.1:0";
    o.event_loops = 1;
    auto server =
        net::HttpServer::Create(o, [this](net::HttpRequest& req, net::ResponseWriter& out) { Serve(req, out); });
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    EXPECT_TRUE(server_->Start().ok());
  }
  ~FakeServer() { server_->Stop(1); }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }

  // Hooks, set before the node runs: answer a call with (status, body) instead of the default
  // when they return a status > 0. `what` is "spec", "opt-ml", "output", "files" or "report".
  std::function<std::pair<int, std::string>(const std::string& what, int nth)> override_answer;
  // The answer to "running" reports.
  std::function<NodeReportAnswer(int nth)> report_answer;

  std::string output() {
    MutexLock lock(mu_);
    return output_;
  }
  // Forgets the tail of the mirror (a server restarted from an older copy).
  void TruncateOutput(size_t size) {
    MutexLock lock(mu_);
    output_.resize(std::min(size, output_.size()));
  }
  std::map<std::string, std::string> files() {
    MutexLock lock(mu_);
    return files_;
  }
  std::vector<NodeReport> reports() {
    MutexLock lock(mu_);
    return reports_;
  }
  // The calls in order ("spec", "output", ...), and how many 409s were sent.
  std::vector<std::string> calls() {
    MutexLock lock(mu_);
    return calls_;
  }
  int conflicts() {
    MutexLock lock(mu_);
    return conflicts_;
  }
  std::vector<std::string> auth() {
    MutexLock lock(mu_);
    return auth_;
  }

 private:
  static void Reply(net::ResponseWriter& out, int status, const HeaderMap& headers, std::string_view body) {
    EXPECT_TRUE(out.Send(status, headers, body).ok());
  }

  void Serve(net::HttpRequest& req, net::ResponseWriter& out) {
    auto body = ReadAll(*req.body, 64 << 20);
    const std::string prefix = "/_kiln/node/v1/instances/" + spec_.instance_id + "/";
    if (!StartsWith(req.raw_path, prefix)) {
      Reply(out, 404, {{"Content-Type", "application/json"}}, R"({"error":"NotFound","message":"no such instance"})");
      return;
    }
    std::string what = req.raw_path.substr(prefix.size());
    int nth;
    {
      MutexLock lock(mu_);
      calls_.push_back(what);
      nth = ++counts_[what];
      auth_.push_back(req.HeaderOr("Authorization", ""));
    }
    if (override_answer) {
      auto [status, text] = override_answer(what, nth);
      if (status > 0) {
        Reply(out, status, {{"Content-Type", "application/json"}}, text);
        return;
      }
    }
    if (what == "spec") {
      Reply(out, 200, {{"Content-Type", "application/json"}}, EncodeSpec(spec_));
    } else if (what == "opt-ml") {
      Reply(out, 200, {{"Content-Type", "application/x-tar"}}, opt_ml_tar_);
    } else if (what == "output") {
      uint64_t offset = ParseUint64(req.raw_query.substr(req.raw_query.find('=') + 1)).value_or(0);
      MutexLock lock(mu_);
      if (offset != output_.size()) {
        ++conflicts_;
        Reply(out, 409, {{"Content-Type", "application/json"}},
              json{{"error", "Conflict"}, {"size", output_.size()}}.dump());
        return;
      }
      output_ += body.value_or("");
      Reply(out, 200, {{"Content-Type", "application/json"}}, "{}");
    } else if (what == "files") {
      auto members = ReadTar(body.value_or(""));
      MutexLock lock(mu_);
      for (auto& [path, content] : members) files_[path] = content;
      Reply(out, 200, {{"Content-Type", "application/json"}}, "{}");
    } else if (what == "report") {
      auto report = ReportFromJson(json::parse(body.value_or("{}")));
      EXPECT_TRUE(report.ok()) << report.status().ToString();
      int running = 0;
      {
        MutexLock lock(mu_);
        if (report.ok()) reports_.push_back(*report);
        if (report.ok() && report->state == "running") running = ++running_reports_;
      }
      NodeReportAnswer answer;
      if (running > 0 && report_answer) answer = report_answer(running);
      Reply(out, 200, {{"Content-Type", "application/json"}}, AnswerToJson(answer).dump());
    } else {
      Reply(out, 404, {{"Content-Type", "application/json"}}, R"({"error":"NotFound","message":"no such call"})");
    }
  }

  InstanceSpec spec_;
  std::string opt_ml_tar_;
  std::unique_ptr<net::HttpServer> server_;
  Mutex mu_;
  std::string output_ GUARDED_BY(mu_);
  std::map<std::string, std::string> files_ GUARDED_BY(mu_);
  std::vector<NodeReport> reports_ GUARDED_BY(mu_);
  std::vector<std::string> calls_ GUARDED_BY(mu_);
  std::vector<std::string> auth_ GUARDED_BY(mu_);
  std::map<std::string, int> counts_ GUARDED_BY(mu_);
  int conflicts_ GUARDED_BY(mu_) = 0;
  int running_reports_ GUARDED_BY(mu_) = 0;
};

InstanceSpec ShellSpec(const std::string& id, const std::string& script) {
  InstanceSpec spec;
  spec.instance_id = id;
  spec.opt_ml_dir = "/server/side/path/that/does/not/exist";
  spec.hostname = "algo-1";
  spec.argv = {"/bin/sh", "-c", script};
  spec.env = {{"PATH", "/usr/local/bin:/usr/bin:/bin"}};
  spec.cpus = {0};
  spec.memory_limit_bytes = 1ull << 30;
  return spec;
}

class NodeAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (the node's process runtime builds sandboxes)";
    char tmpl[] = "/tmp/kiln-node-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    scratch_ = tmpl;
  }
  void TearDown() override {
    if (!scratch_.empty()) RemoveAll(scratch_).ok();
  }

  NodeAgentOptions Options(const FakeServer& server, const std::string& id) {
    NodeAgentOptions o;
    o.server_url = server.url();
    o.token = "secret-token";
    o.instance_ids = {id};
    o.node_addresses = {"127.0.0.1"};
    o.node_name = "kn-test";
    o.job_id = "42";
    o.scratch_dir = scratch_;
    o.shim_command = {ShimPath()};
    o.tick = std::chrono::milliseconds(100);
    o.backoff_min = std::chrono::milliseconds(20);
    o.backoff_max = std::chrono::milliseconds(100);
    o.give_up_after = std::chrono::seconds(5);
    return o;
  }

  std::string scratch_;
};

TEST(NodeHostsLinesTest, MovesAlgoNamesToTheirNodes) {
  std::vector<std::string> spec = {"127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback",
                                   "127.0.0.1 algo-1 algo-2 other"};
  EXPECT_THAT(NodeHostsLines(spec, "algo-2", 2, {"10.77.0.11", "10.77.0.12"}),
              ElementsAre("127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback", "127.0.0.1 other",
                          "10.77.0.11 algo-1", "10.77.0.12 algo-2"));
}

TEST(NodeHostsLinesTest, LoneInstanceKeepsLoopback) {
  EXPECT_THAT(NodeHostsLines({"127.0.0.1 localhost", "127.0.0.1 ep-1"}, "ep-1", 1, {"10.77.0.11"}),
              ElementsAre("127.0.0.1 localhost", "127.0.0.1 ep-1"));
  EXPECT_THAT(NodeHostsLines({}, "ep-1", 1, {"10.77.0.11"}),
              ElementsAre("127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback", "127.0.0.1 ep-1"));
}

TEST(NodeSpecTest, SlurmsResourcesReplaceTheServers) {
  InstanceSpec server = ShellSpec("i-1", "true");
  server.env["CUDA_VISIBLE_DEVICES"] = "0";
  server.env["NVIDIA_VISIBLE_DEVICES"] = "0";
  server.extra_mounts = {{"/definitely/not/here", "/x", true}, {"/bin", "/y", true}};
  server.network = NetworkAttachment{};
  NodeAgentOptions options;
  options.instance_ids = {"i-1"};
  options.gpus = {2, 3};
  options.cuda_visible_devices = "0,1";
  std::vector<std::string> dropped;
  InstanceSpec spec = NodeSpec(server, options, "/scratch/opt_ml", &dropped);
  EXPECT_EQ(spec.opt_ml_dir, "/scratch/opt_ml");
  EXPECT_TRUE(spec.cpus.empty());
  EXPECT_EQ(spec.memory_limit_bytes, 0u);
  EXPECT_FALSE(spec.network.has_value());
  EXPECT_THAT(spec.gpus, ElementsAre(2, 3));
  EXPECT_EQ(spec.env["CUDA_VISIBLE_DEVICES"], "0,1");
  EXPECT_EQ(spec.env["NVIDIA_VISIBLE_DEVICES"], "2,3");
  ASSERT_EQ(spec.extra_mounts.size(), 1u);
  EXPECT_EQ(spec.extra_mounts[0].host_path, "/bin");
  EXPECT_THAT(dropped, ElementsAre("/definitely/not/here"));

  options.gpus.clear();
  spec = NodeSpec(server, options, "/scratch/opt_ml", nullptr);
  EXPECT_EQ(spec.env.count("CUDA_VISIBLE_DEVICES"), 0u);
  EXPECT_EQ(spec.env["NVIDIA_VISIBLE_DEVICES"], "void");
}

// The whole sequence: spec, /opt/ml from the server, the program, output and files mirrored,
// the exit report last, the scratch gone, the program's exit status returned.
TEST_F(NodeAgentTest, RunsTheProgramAndMirrorsEverythingBeforeTheExitReport) {
  FakeServer server(ShellSpec("job-a-1", R"sh(
    cat /opt/ml/input/config/hyperparameters.json
    echo "host $(hostname)"
    echo oops >&2
    mkdir -p /opt/ml/model /opt/ml/output/data
    echo weights > /opt/ml/model/model.bin
    echo ckpt > /opt/ml/checkpoints/step-1
    echo failure reason > /opt/ml/output/failure
    mkdir -p /opt/ml/processing/out && echo result > /opt/ml/processing/out/part-0
    exit 3)sh"),
                    {{"input/config/hyperparameters.json", "{\"epochs\": \"2\"}\n"},
                     {"checkpoints/restored", "from s3"},
                     {"processing/input/data.csv", "a,b\n"}});
  auto agent = NodeAgent::Create(Options(server, "job-a-1"));
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  EXPECT_EQ((*agent)->Run(), 3);

  std::string output = server.output();
  EXPECT_THAT(output, HasSubstr(" o {\"epochs\": \"2\"}\n"));
  EXPECT_THAT(output, HasSubstr(" o host algo-1\n"));
  EXPECT_THAT(output, HasSubstr(" e oops\n"));
  auto files = server.files();
  EXPECT_EQ(files["model/model.bin"], "weights\n");
  EXPECT_EQ(files["checkpoints/step-1"], "ckpt\n");
  EXPECT_EQ(files["output/failure"], "failure reason\n");
  // What came from the server is not sent back.
  EXPECT_EQ(files["processing/out/part-0"], "result\n");
  EXPECT_EQ(files.count("checkpoints/restored"), 0u);
  EXPECT_EQ(files.count("processing/input/data.csv"), 0u);
  EXPECT_EQ(files.count("input/config/hyperparameters.json"), 0u);

  auto reports = server.reports();
  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports.front().state, "starting");
  const NodeReport& last = reports.back();
  EXPECT_EQ(last.state, "exited");
  EXPECT_EQ(last.exit_code, 3);
  EXPECT_EQ(last.term_signal, 0);
  EXPECT_EQ(last.node, "kn-test");
  EXPECT_EQ(last.address, "127.0.0.1");
  EXPECT_GT(last.started_millis, 0);
  EXPECT_GE(last.finished_millis, last.started_millis);
  EXPECT_TRUE(last.error.empty()) << last.error;
  // The exit report is the last call: output and files were complete when the server saw it.
  auto calls = server.calls();
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back(), "report");
  EXPECT_EQ(calls.front(), "spec");
  for (const std::string& a : server.auth()) EXPECT_EQ(a, "Bearer secret-token");
  EXPECT_FALSE(PathExists(scratch_ + "/kiln-42"));
}

// The server's answer to a running report stops the program with its grace (SIGTERM first).
TEST_F(NodeAgentTest, StopFromTheServerAnswer) {
  FakeServer server(ShellSpec("job-b-1", R"(
    trap 'echo got-term; exit 7' TERM
    echo ready
    while true; do sleep 0.05; done)"));
  server.report_answer = [](int nth) {
    NodeReportAnswer a;
    if (nth >= 2) a.stop_grace_seconds = 10;
    return a;
  };
  auto agent = NodeAgent::Create(Options(server, "job-b-1"));
  ASSERT_TRUE(agent.ok());
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ((*agent)->Run(), 7);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(8));
  EXPECT_THAT(server.output(), HasSubstr(" o got-term\n"));
  EXPECT_EQ(server.reports().back().exit_code, 7);
}

// SIGTERM to `kiln node` (scancel): the program is stopped and the exit sequence still runs.
TEST_F(NodeAgentTest, RequestStopEndsTheProgramAndReportsTheExit) {
  FakeServer server(ShellSpec("job-c-1", "echo ready; while true; do sleep 0.05; done"));
  NodeAgentOptions o = Options(server, "job-c-1");
  o.default_stop_grace = std::chrono::seconds(1);
  auto agent = NodeAgent::Create(o);
  ASSERT_TRUE(agent.ok());
  NodeAgent* raw = agent->get();
  std::thread stopper([&] {
    for (int i = 0; i < 100 && server.output().find("ready") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    raw->RequestStop();
  });
  // sh as PID 1 of its namespace ignores SIGTERM without a trap: the grace's SIGKILL ends it.
  EXPECT_EQ(raw->Run(), 128 + SIGKILL);
  stopper.join();
  const NodeReport& last = server.reports().back();
  EXPECT_EQ(last.state, "exited");
  EXPECT_EQ(last.term_signal, SIGKILL);
}

// A server that restarts from an older copy of the output: 409 {"size": m} and the node resends
// from m, so the mirror ends byte-identical to the node's file. Unavailable answers are retried.
TEST_F(NodeAgentTest, OutputResyncsAfterConflictAndRetriesErrors) {
  FakeServer server(ShellSpec("job-d-1", R"(
    for i in 1 2 3 4 5 6 7 8; do echo line-$i; sleep 0.15; done)"));
  server.override_answer = [&server](const std::string& what, int nth) -> std::pair<int, std::string> {
    if (what == "spec" && nth <= 2) return {503, R"({"error":"Unavailable","message":"restarting"})"};
    if (what == "output" && nth == 4) server.TruncateOutput(0);
    if (what == "report" && nth == 3) return {500, R"({"error":"Internal","message":"boom"})"};
    return {0, ""};
  };
  NodeAgentOptions o = Options(server, "job-d-1");
  o.keep_scratch = true;
  auto agent = NodeAgent::Create(o);
  ASSERT_TRUE(agent.ok());
  EXPECT_EQ((*agent)->Run(), 0);
  auto local = ReadFile(scratch_ + "/kiln-42/job-d-1/state/job-d-1/output");
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  EXPECT_EQ(server.output(), *local);
  EXPECT_THAT(server.output(), HasSubstr(" o line-8\n"));
  EXPECT_GE(server.conflicts(), 1);
}

// The server does not know the instance: give up at once.
TEST_F(NodeAgentTest, UnknownInstanceGivesUp) {
  FakeServer server(ShellSpec("job-e-1", "true"));
  auto agent = NodeAgent::Create(Options(server, "someone-else"));
  ASSERT_TRUE(agent.ok());
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ((*agent)->Run(), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

// A program that cannot start: the exited report carries Launch's words.
TEST_F(NodeAgentTest, LaunchFailureIsReported) {
  InstanceSpec spec = ShellSpec("job-f-1", "");
  spec.argv = {"/usr/bin/definitely-not-a-program"};
  FakeServer server(spec);
  auto agent = NodeAgent::Create(Options(server, "job-f-1"));
  ASSERT_TRUE(agent.ok());
  EXPECT_EQ((*agent)->Run(), 1);
  const NodeReport& last = server.reports().back();
  EXPECT_EQ(last.state, "exited");
  EXPECT_THAT(last.error, HasSubstr("definitely-not-a-program"));
}

TEST(NodeAgentCreateTest, RejectsMissingOptions) {
  NodeAgentOptions o;
  EXPECT_FALSE(NodeAgent::Create(o).ok());
  o.server_url = "http://127.0.0.1:1";
  o.token = "t";
  o.instance_ids = {"a"};
  o.shim_command = {"/bin/true"};
  o.task_index = 1;
  auto r = NodeAgent::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("one task per instance"));
  o.task_index = 0;
  EXPECT_TRUE(NodeAgent::Create(o).ok());
}

}  // namespace
}  // namespace kiln::runtime::slurm
