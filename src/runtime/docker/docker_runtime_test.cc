// The container runtime against FakeEngine (test_util/fake_engine.h), and one live suite against
// Podman's socket when it is there (skipped otherwise).
#include "runtime/docker/docker_runtime.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/fs.h"
#include "base/mutex.h"
#include "base/strings.h"
#include "base/time.h"
#include "runtime/docker/test_util/fake_engine.h"
#include "runtime/process/netlink.h"
#include "runtime/process/process_runtime.h"
#include "runtime/process/state.h"

namespace kiln::runtime::docker {
namespace {

using ::testing::ElementsAre;
using testing::FakeEngine;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr char kLabel[] = "h3test01";
constexpr char kImage[] = "localhost/byo:1";
constexpr auto kTimeout = 10s;

struct Record {
  int64_t millis;
  char tag;
  std::string line;
};

std::vector<Record> ReadRecords(const std::string& path) {
  std::vector<Record> records;
  std::string text = ReadFile(path).value_or("");
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    EXPECT_NE(nl, std::string::npos) << "record without LF";
    if (nl == std::string::npos) break;
    std::string rec = text.substr(start, nl - start);
    start = nl + 1;
    size_t sp = rec.find(' ');
    EXPECT_NE(sp, std::string::npos) << rec;
    if (sp == std::string::npos || rec.size() < sp + 3) continue;
    EXPECT_EQ(rec[sp + 2], ' ') << rec;
    std::optional<int64_t> millis = ParseInt64(rec.substr(0, sp));
    EXPECT_TRUE(millis.has_value()) << rec;
    records.push_back({millis.value_or(0), rec[sp + 1], rec.substr(sp + 3)});
  }
  return records;
}

std::vector<std::string> Tagged(const std::vector<Record>& records) {
  std::vector<std::string> out;
  for (const Record& r : records) out.push_back(std::string(1, r.tag) + ":" + r.line);
  return out;
}

// The runtime owns its engine; the tests keep the fake across reopenings, so the runtime gets
// this forwarder.
class ForwardingEngine final : public Engine {
 public:
  explicit ForwardingEngine(Engine* target) : target_(target) {}
  std::string address() const override { return target_->address(); }
  Result<EngineVersion> Version() override { return target_->Version(); }
  Result<ImageInfo> InspectImage(const std::string& reference) override { return target_->InspectImage(reference); }
  Result<std::vector<ImageInfo>> ListImages() override { return target_->ListImages(); }
  Status PullImage(const std::string& reference, const std::string& registry_auth,
                   const std::function<void(const PullProgress&)>& on_progress,
                   const std::function<bool()>& cancelled) override {
    return target_->PullImage(reference, registry_auth, on_progress, cancelled);
  }
  Result<std::string> CreateContainer(const std::string& name, const nlohmann::json& body) override {
    return target_->CreateContainer(name, body);
  }
  Status StartContainer(const std::string& id) override { return target_->StartContainer(id); }
  Status KillContainer(const std::string& id, int signal) override { return target_->KillContainer(id, signal); }
  Result<ContainerState> InspectContainer(const std::string& id_or_name) override {
    return target_->InspectContainer(id_or_name);
  }
  Status RemoveContainer(const std::string& id) override { return target_->RemoveContainer(id); }
  Result<std::vector<ContainerSummary>> ListContainers(const std::string& label_filter) override {
    return target_->ListContainers(label_filter);
  }
  Status ContainerLogs(const std::string& id, bool follow, int64_t since_seconds,
                       const std::function<void(const LogLine&)>& on_line,
                       const std::function<bool()>& cancelled) override {
    return target_->ContainerLogs(id, follow, since_seconds, on_line, cancelled);
  }
  Result<ContainerStats> Stats(const std::string& id) override { return target_->Stats(id); }

 private:
  Engine* target_;
};

// The network holders' runtime: records what the container runtime asks and writes the
// started.json it reads (pid: this process, whose /proc/<pid>/ns/net exists).
class FakeHolders final : public Runtime {
 public:
  explicit FakeHolders(std::string state_dir) : state_dir_(std::move(state_dir)) {}

  Status Launch(const InstanceSpec& spec) override {
    MutexLock lock(mu_);
    if (running_.count(spec.instance_id) || exited_.count(spec.instance_id)) {
      return Status::AlreadyExists("instance " + spec.instance_id + " already exists");
    }
    launched_.push_back(spec);
    std::string dir = process_state::Join(state_dir_, spec.instance_id);
    EXPECT_TRUE(MakeDirs(dir).ok());
    process_state::StartedRecord started;
    started.shim_pid = getpid();
    started.pid = getpid();
    started.started_millis = NowMillis();
    EXPECT_TRUE(
        process_state::WriteFileRenamed(process_state::Join(dir, "started.json"), process_state::EncodeStarted(started))
            .ok());
    running_.insert(spec.instance_id);
    return Status::Ok();
  }
  Result<InstanceStatus> Inspect(const std::string& id) override {
    MutexLock lock(mu_);
    if (!running_.count(id) && !exited_.count(id)) return Status::NotFound("instance " + id + " not found");
    InstanceStatus s;
    s.instance_id = id;
    s.state = running_.count(id) ? InstanceState::kRunning : InstanceState::kExited;
    return s;
  }
  Status Signal(const std::string&, int) override { return Status::Ok(); }
  Status Stop(const std::string& id, std::chrono::seconds) override {
    MutexLock lock(mu_);
    if (!running_.count(id) && !exited_.count(id)) return Status::NotFound("instance " + id + " not found");
    stops_.push_back(id);
    if (running_.erase(id)) exited_.insert(id);
    return Status::Ok();
  }
  Result<InstanceStatus> Wait(const std::string& id, std::chrono::milliseconds) override { return Inspect(id); }
  std::string OutputPath(const std::string& id) const override { return state_dir_ + "/" + id + "/output"; }
  Result<std::vector<std::string>> List() override { return std::vector<std::string>{}; }
  Status Remove(const std::string& id) override {
    MutexLock lock(mu_);
    if (running_.count(id)) return Status::FailedPrecondition("instance " + id + " is still running");
    if (!exited_.erase(id)) return Status::NotFound("instance " + id + " not found");
    removes_.push_back(id);
    RemoveAll(process_state::Join(state_dir_, id)).ok();
    return Status::Ok();
  }

  std::vector<InstanceSpec> launched() const {
    MutexLock lock(mu_);
    return launched_;
  }
  std::vector<std::string> stops() const {
    MutexLock lock(mu_);
    return stops_;
  }
  std::vector<std::string> removes() const {
    MutexLock lock(mu_);
    return removes_;
  }
  bool running(const std::string& id) const {
    MutexLock lock(mu_);
    return running_.count(id) > 0;
  }

 private:
  const std::string state_dir_;
  mutable Mutex mu_;
  std::vector<InstanceSpec> launched_ GUARDED_BY(mu_);
  std::set<std::string> running_ GUARDED_BY(mu_);
  std::set<std::string> exited_ GUARDED_BY(mu_);
  std::vector<std::string> stops_ GUARDED_BY(mu_);
  std::vector<std::string> removes_ GUARDED_BY(mu_);
};

class DockerRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kiln-h3-docker-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    state_ = root_ + "/state";
    opt_ml_ = root_ + "/opt_ml";
    holders_state_ = root_ + "/holders";
    ASSERT_TRUE(MakeDirs(opt_ml_).ok());
    ASSERT_TRUE(MakeDirs(holders_state_).ok());
    holders_ = std::make_unique<FakeHolders>(holders_state_);
    engine_.AddImage(kImage);
    Open();
  }
  void TearDown() override {
    runtime_.reset();
    RemoveAll(root_).ok();
  }

  void Open() {
    runtime_.reset();
    DockerRuntimeOptions options;
    options.state_dir = state_;
    options.engine = std::make_unique<ForwardingEngine>(&engine_);
    options.container.server_label = kLabel;
    options.network_holders = holders_.get();
    options.network_holders_state_dir = holders_state_;
    options.engine_lost_after = std::chrono::seconds(1);
    Result<std::unique_ptr<Runtime>> opened = OpenDockerRuntime(std::move(options));
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    runtime_ = std::move(*opened);
  }

  InstanceSpec Spec(const std::string& id) {
    InstanceSpec spec;
    spec.instance_id = id;
    spec.opt_ml_dir = opt_ml_;
    spec.hostname = "algo-1";
    spec.argv = {"train"};
    spec.env = {{"SM_CURRENT_HOST", "algo-1"}};
    spec.container = ContainerImage{kImage, kImage, std::nullopt};
    return spec;
  }
  static std::string Name(const std::string& id) { return ContainerName(kLabel, id); }
  std::string Dir(const std::string& id) const { return state_ + "/" + id; }

  // Launches and waits until the fake runs it.
  void LaunchRunning(const InstanceSpec& spec) {
    Status s = runtime_->Launch(spec);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_TRUE(engine_.WaitRunning(Name(spec.instance_id), 1000ms));
  }
  InstanceStatus WaitEnded(const std::string& id) {
    Result<InstanceStatus> st = runtime_->Wait(id, kTimeout);
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_NE(st.value_or(InstanceStatus{}).state, InstanceState::kRunning);
    return st.value_or(InstanceStatus{});
  }
  bool HasSignal(const std::string& id, int signal) {
    std::vector<int> sent = engine_.signals(Name(id));
    return std::find(sent.begin(), sent.end(), signal) != sent.end();
  }

  std::string root_, state_, opt_ml_, holders_state_;
  FakeEngine engine_;
  std::unique_ptr<FakeHolders> holders_;
  std::unique_ptr<Runtime> runtime_;
};

TEST_F(DockerRuntimeTest, OpenRequiresOptions) {
  DockerRuntimeOptions options;
  options.engine = std::make_unique<ForwardingEngine>(&engine_);
  options.container.server_label = kLabel;
  EXPECT_EQ(OpenDockerRuntime(std::move(options)).status().code(), StatusCode::kInvalidArgument);  // no state_dir
  DockerRuntimeOptions no_label;
  no_label.state_dir = state_;
  no_label.engine = std::make_unique<ForwardingEngine>(&engine_);
  EXPECT_EQ(OpenDockerRuntime(std::move(no_label)).status().code(), StatusCode::kInvalidArgument);
  DockerRuntimeOptions no_engine;
  no_engine.state_dir = state_;
  no_engine.container.server_label = kLabel;
  EXPECT_EQ(OpenDockerRuntime(std::move(no_engine)).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(DockerRuntimeTest, LaunchRunsTheContainerAndReportsItsExitCode) {
  InstanceSpec spec = Spec("job-1");
  spec.hosts_file_lines = {"127.0.0.1 algo-1", "10.0.0.2 algo-2"};
  LaunchRunning(spec);
  std::optional<FakeEngine::Container> c = engine_.container(Name("job-1"));
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->labels["kiln.instance"], "job-1");
  EXPECT_EQ(c->labels["kiln.server"], kLabel);
  EXPECT_EQ(c->body["Image"], kImage);
  EXPECT_EQ(ReadFile(Dir("job-1") + "/hosts").value_or(""), "127.0.0.1 algo-1\n10.0.0.2 algo-2\n");
  EXPECT_THAT(c->body.dump(), HasSubstr(Dir("job-1") + "/hosts"));
  EXPECT_TRUE(PathExists(runtime_->OutputPath("job-1")));
  EXPECT_TRUE(PathExists(Dir("job-1") + "/container.json"));

  Result<InstanceStatus> running = runtime_->Inspect("job-1");
  ASSERT_TRUE(running.ok()) << running.status().ToString();
  EXPECT_EQ(running->state, InstanceState::kRunning);
  EXPECT_GT(running->started_millis, 0);
  EXPECT_THAT(runtime_->List().value_or(std::vector<std::string>{}), ElementsAre("job-1"));

  engine_.Exit(Name("job-1"), 3);
  InstanceStatus ended = WaitEnded("job-1");
  EXPECT_EQ(ended.state, InstanceState::kExited);
  EXPECT_EQ(ended.exit_code, 3);
  EXPECT_EQ(ended.term_signal, 0);
  EXPECT_FALSE(ended.oom_killed);
  EXPECT_FALSE(ended.stop_requested);
  EXPECT_GE(ended.finished_millis, ended.started_millis);
  EXPECT_TRUE(PathExists(Dir("job-1") + "/exit.json"));

  // The exit is remembered when the engine has forgotten the container (and after a restart).
  engine_.Vanish(Name("job-1"));
  Open();
  Result<InstanceStatus> again = runtime_->Inspect("job-1");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->state, InstanceState::kExited);
  EXPECT_EQ(again->exit_code, 3);
}

TEST_F(DockerRuntimeTest, EmptyReferenceIsDerivedFromTheRequestedImage) {
  InstanceSpec spec = Spec("derived");
  spec.container->reference = "";
  Result<std::string> reference = EngineReference(kImage, ImageSettings{});
  ASSERT_TRUE(reference.ok()) << reference.status().ToString();
  engine_.AddImage(*reference);
  LaunchRunning(spec);
  EXPECT_EQ(engine_.container(Name("derived"))->body["Image"], *reference);
}

TEST_F(DockerRuntimeTest, LaunchOfAnExistingIdIsAlreadyExists) {
  LaunchRunning(Spec("dup"));
  EXPECT_EQ(runtime_->Launch(Spec("dup")).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(engine_.container_names().size(), 1u);
}

TEST_F(DockerRuntimeTest, LaunchRefusesSpecsWithoutAnImageOrWithBadIds) {
  InstanceSpec no_image = Spec("plain");
  no_image.container.reset();
  EXPECT_EQ(runtime_->Launch(no_image).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_->Launch(Spec("../x")).code(), StatusCode::kInvalidArgument);
  InstanceSpec bad_dir = Spec("bad-dir");
  bad_dir.opt_ml_dir = root_ + "/missing";
  EXPECT_EQ(runtime_->Launch(bad_dir).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(engine_.container_names().empty());
}

TEST_F(DockerRuntimeTest, MissingImageFailsLaunchNamingItAndLeavesNothing) {
  InstanceSpec spec = Spec("noimage");
  spec.container->reference = "localhost/absent:1";
  Status s = runtime_->Launch(spec);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("localhost/absent:1"));
  EXPECT_FALSE(PathExists(Dir("noimage")));
}

TEST_F(DockerRuntimeTest, OutputIsRecordedWithStreamsInOrder) {
  FakeEngine::Behavior behavior;
  behavior.output = {LogLine{false, 0, "hello"}, LogLine{true, 0, "warning: x"}, LogLine{false, 0, ""}};
  engine_.Configure(Name("out"), behavior);
  LaunchRunning(Spec("out"));
  engine_.AppendLog(Name("out"), false, "line with spaces  and\ttabs");
  engine_.AppendLog(Name("out"), true, std::string(kMaxOutputLineBytes + 10, 'x'));
  engine_.Exit(Name("out"), 0);
  InstanceStatus ended = WaitEnded("out");
  EXPECT_EQ(ended.exit_code, 0);
  // Output is complete once the exit is visible.
  std::vector<Record> records = ReadRecords(runtime_->OutputPath("out"));
  ASSERT_EQ(records.size(), 6u);
  EXPECT_EQ(Tagged(records)[0], "o:hello");
  EXPECT_EQ(Tagged(records)[1], "e:warning: x");
  EXPECT_EQ(Tagged(records)[2], "o:");
  EXPECT_EQ(Tagged(records)[3], "o:line with spaces  and\ttabs");
  EXPECT_EQ(records[4].tag, 'e');
  EXPECT_EQ(records[4].line.size(), kMaxOutputLineBytes);
  EXPECT_EQ(records[5].line, std::string(10, 'x'));
  const int64_t now = NowMillis();
  for (const Record& r : records) {
    EXPECT_LE(r.millis, now);
    EXPECT_GT(r.millis, now - 60'000);
  }
}

TEST_F(DockerRuntimeTest, TheExitIsSeenWithoutWaitingForTheFollowStreamToClose) {
  // Podman closes a follow stream only ~0.5 s after the exit: seeing the exit, the follower leaves
  // the stream for a last plain read, so the output is complete and no stream is left open.
  engine_.SetLogsFollowPastExit(true);
  LaunchRunning(Spec("linger"));
  ASSERT_TRUE(engine_.WaitUntil([&] { return engine_.active_log_streams() == 1; }, 5000ms));
  engine_.AppendLog(Name("linger"), false, "last words");
  engine_.Exit(Name("linger"), 0);
  InstanceStatus ended = WaitEnded("linger");
  EXPECT_EQ(ended.exit_code, 0);
  EXPECT_EQ(engine_.active_log_streams(), 0);
  EXPECT_THAT(Tagged(ReadRecords(runtime_->OutputPath("linger"))), ElementsAre("o:last words"));
}

TEST_F(DockerRuntimeTest, OutputResumesAfterReopeningWithoutLossOrDuplicates) {
  // Podman gives whole seconds: several lines share one, across the restarts.
  const int64_t t = (NowMillis() / 1000 - 100) * 1000;
  LaunchRunning(Spec("resume"));
  const std::string name = Name("resume");
  engine_.AppendLog(name, false, "a1", t);
  engine_.AppendLog(name, false, "a2", t);
  engine_.AppendLog(name, true, "a3", t);
  ASSERT_TRUE(engine_.WaitUntil([&] { return ReadRecords(runtime_->OutputPath("resume")).size() == 3; }, 5000ms));
  runtime_.reset();                         // the server goes away; the container runs on
  engine_.AppendLog(name, false, "b1", t);  // same second as the recorded ones
  engine_.AppendLog(name, false, "b2", t + 1000);
  Open();
  ASSERT_TRUE(engine_.WaitUntil([&] { return ReadRecords(runtime_->OutputPath("resume")).size() == 5; }, 5000ms));
  engine_.AppendLog(name, false, "c1", t + 1000);
  engine_.AppendLog(name, false, "c2", t + 2000);
  engine_.Exit(name, 0);
  WaitEnded("resume");
  EXPECT_THAT(Tagged(ReadRecords(runtime_->OutputPath("resume"))),
              ElementsAre("o:a1", "o:a2", "e:a3", "o:b1", "o:b2", "o:c1", "o:c2"));
}

TEST_F(DockerRuntimeTest, OutputResumesAfterACrashBeforeTheCursorWasSaved) {
  const int64_t t = (NowMillis() / 1000 - 100) * 1000;
  LaunchRunning(Spec("crash"));
  const std::string name = Name("crash");
  engine_.AppendLog(name, false, "a1", t);
  engine_.AppendLog(name, false, "a2", t + 1000);
  engine_.AppendLog(name, false, std::string(kMaxOutputLineBytes + 1, 'L'), t + 1000);
  ASSERT_TRUE(engine_.WaitUntil([&] { return ReadRecords(runtime_->OutputPath("crash")).size() == 4; }, 5000ms));
  runtime_.reset();
  // A server killed before saving its cursor, in the middle of writing a record: container.json
  // still has the launch's cursor, and the output ends with a torn record.
  const std::string record_path = Dir("crash") + "/container.json";
  nlohmann::json record = nlohmann::json::parse(ReadFile(record_path).value_or("{}"));
  record["log_cursor"] = {{"seconds", 0}, {"lines", 0}, {"output_bytes", 0}};
  ASSERT_TRUE(process_state::WriteFileRenamed(record_path, record.dump()).ok());
  const std::string output_path = Dir("crash") + "/output";
  std::string output = ReadFile(output_path).value_or("");
  output += "1234 o b1-torn";
  ASSERT_TRUE(process_state::WriteFileRenamed(output_path, output).ok());
  engine_.AppendLog(name, false, "b1", t + 1000);
  Open();
  engine_.Exit(name, 0);
  WaitEnded("crash");
  std::vector<std::string> lines = Tagged(ReadRecords(runtime_->OutputPath("crash")));
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0], "o:a1");
  EXPECT_EQ(lines[1], "o:a2");
  EXPECT_EQ(lines[2], "o:" + std::string(kMaxOutputLineBytes, 'L'));
  EXPECT_EQ(lines[3], "o:L");
  EXPECT_EQ(lines[4], "o:b1");
}

TEST_F(DockerRuntimeTest, StopSendsTermAndKillsAtTheDeadline) {
  LaunchRunning(Spec("stop"));
  ASSERT_TRUE(runtime_->Stop("stop", 1s).ok());
  EXPECT_THAT(engine_.signals(Name("stop")), ElementsAre(SIGTERM));  // sh as PID 1 ignores it
  Result<InstanceStatus> st = runtime_->Inspect("stop");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state, InstanceState::kRunning);
  EXPECT_TRUE(st->stop_requested);
  InstanceStatus ended = WaitEnded("stop");
  EXPECT_THAT(engine_.signals(Name("stop")), ElementsAre(SIGTERM, SIGKILL));
  EXPECT_EQ(ended.term_signal, SIGKILL);
  EXPECT_EQ(ended.exit_code, -1);
  EXPECT_TRUE(ended.stop_requested);
  EXPECT_TRUE(runtime_->Stop("stop", 1s).ok());  // idempotent once exited too
}

TEST_F(DockerRuntimeTest, StopOfAContainerThatHandlesTermEndsWithoutKill) {
  FakeEngine::Behavior behavior;
  behavior.exit_on_signal[SIGTERM] = 0;
  engine_.Configure(Name("graceful"), behavior);
  LaunchRunning(Spec("graceful"));
  ASSERT_TRUE(runtime_->Stop("graceful", 30s).ok());
  InstanceStatus ended = WaitEnded("graceful");
  EXPECT_EQ(ended.exit_code, 0);
  EXPECT_TRUE(ended.stop_requested);
  EXPECT_THAT(engine_.signals(Name("graceful")), ElementsAre(SIGTERM));
}

TEST_F(DockerRuntimeTest, AShorterGraceWinsAndTermIsSentOnce) {
  LaunchRunning(Spec("shorter"));
  ASSERT_TRUE(runtime_->Stop("shorter", 3600s).ok());
  ASSERT_TRUE(runtime_->Stop("shorter", 0s).ok());
  InstanceStatus ended = WaitEnded("shorter");
  EXPECT_EQ(ended.term_signal, SIGKILL);
  EXPECT_THAT(engine_.signals(Name("shorter")), ElementsAre(SIGTERM, SIGKILL));
}

TEST_F(DockerRuntimeTest, StopDeadlineSurvivesReopening) {
  LaunchRunning(Spec("persist"));
  ASSERT_TRUE(runtime_->Stop("persist", 2s).ok());
  runtime_.reset();
  nlohmann::json record = nlohmann::json::parse(ReadFile(Dir("persist") + "/container.json").value_or("{}"));
  EXPECT_TRUE(record["stop_requested"].get<bool>());
  EXPECT_GT(record["stop_deadline_millis"].get<int64_t>(), NowMillis());
  EXPECT_FALSE(HasSignal("persist", SIGKILL));
  Open();
  InstanceStatus ended = WaitEnded("persist");
  EXPECT_EQ(ended.term_signal, SIGKILL);
  EXPECT_TRUE(ended.stop_requested);
  EXPECT_THAT(engine_.signals(Name("persist")), ElementsAre(SIGTERM, SIGKILL));
}

TEST_F(DockerRuntimeTest, StopWhileTheEngineIsUnreachableSignalsOnceItIsBack) {
  LaunchRunning(Spec("later"));
  engine_.SetUnreachable(true);
  EXPECT_TRUE(runtime_->Stop("later", 3600s).ok());  // the deadline is on disk; TERM is pending
  engine_.SetUnreachable(false);
  ASSERT_TRUE(engine_.WaitUntil([&] { return HasSignal("later", SIGTERM); }, 5000ms));
  EXPECT_FALSE(HasSignal("later", SIGKILL));
}

TEST_F(DockerRuntimeTest, OomKillIsReported) {
  LaunchRunning(Spec("oom"));
  engine_.OomKill(Name("oom"));
  InstanceStatus ended = WaitEnded("oom");
  EXPECT_EQ(ended.state, InstanceState::kExited);
  EXPECT_TRUE(ended.oom_killed);
  EXPECT_EQ(ended.term_signal, SIGKILL);
}

TEST_F(DockerRuntimeTest, ExitCodeAbove128IsATermSignal) {
  LaunchRunning(Spec("sig"));
  engine_.Exit(Name("sig"), 137);
  InstanceStatus ended = WaitEnded("sig");
  EXPECT_EQ(ended.term_signal, 9);
  EXPECT_EQ(ended.exit_code, -1);
  EXPECT_FALSE(ended.oom_killed);
}

TEST_F(DockerRuntimeTest, SignalReachesTheContainer) {
  LaunchRunning(Spec("hup"));
  ASSERT_TRUE(runtime_->Signal("hup", SIGHUP).ok());
  EXPECT_THAT(engine_.signals(Name("hup")), ElementsAre(SIGHUP));
  engine_.Exit(Name("hup"), 0);
  WaitEnded("hup");
  EXPECT_EQ(runtime_->Signal("hup", SIGHUP).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(runtime_->Signal("nobody", SIGHUP).code(), StatusCode::kNotFound);
}

TEST_F(DockerRuntimeTest, AVanishedContainerIsLost) {
  LaunchRunning(Spec("gone"));
  engine_.Vanish(Name("gone"));
  InstanceStatus st = WaitEnded("gone");
  EXPECT_EQ(st.state, InstanceState::kLost);
  EXPECT_THAT(st.lost_reason, HasSubstr("no longer knows container " + Name("gone")));
  EXPECT_TRUE(runtime_->Remove("gone").ok());
}

TEST_F(DockerRuntimeTest, AnUnreachableEngineGivesTheLastStateThenLost) {
  LaunchRunning(Spec("far"));
  engine_.SetUnreachable(true);
  Result<InstanceStatus> st = runtime_->Inspect("far");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state, InstanceState::kRunning);
  InstanceStatus lost = WaitEnded("far");  // engine_lost_after is 1 s here
  EXPECT_EQ(lost.state, InstanceState::kLost);
  EXPECT_THAT(lost.lost_reason, HasSubstr(engine_.address()));
  EXPECT_THAT(lost.lost_reason, HasSubstr("unreachable"));
  // Launch says what to do.
  Status launch = runtime_->Launch(Spec("meanwhile"));
  EXPECT_EQ(launch.code(), StatusCode::kUnavailable);
  EXPECT_THAT(launch.message(), HasSubstr("start it"));
  EXPECT_FALSE(PathExists(Dir("meanwhile")));
  // Back: running again, and its output still arrives.
  engine_.SetUnreachable(false);
  st = runtime_->Inspect("far");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state, InstanceState::kRunning);
  engine_.AppendLog(Name("far"), false, "still here");
  engine_.Exit(Name("far"), 0);
  EXPECT_EQ(WaitEnded("far").exit_code, 0);
  EXPECT_THAT(Tagged(ReadRecords(runtime_->OutputPath("far"))), ElementsAre("o:still here"));
}

TEST_F(DockerRuntimeTest, AStartFailureFailsLaunchAndLeavesNothing) {
  FakeEngine::Behavior behavior;
  behavior.start_error =
      "crun: executable file not found in $PATH: No such file or directory: OCI runtime attempted to invoke a "
      "command that was not found";
  engine_.Configure(Name("notrain"), behavior);
  Status s = runtime_->Launch(Spec("notrain"));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("executable file not found"));
  EXPECT_THAT(s.message(), HasSubstr(kImage));
  EXPECT_FALSE(engine_.container(Name("notrain")).has_value());
  EXPECT_THAT(engine_.removed(), ElementsAre(Name("notrain")));
  EXPECT_FALSE(PathExists(Dir("notrain")));
  EXPECT_TRUE(runtime_->List().value_or(std::vector<std::string>{"x"}).empty());
  EXPECT_EQ(runtime_->Inspect("notrain").status().code(), StatusCode::kNotFound);
}

TEST_F(DockerRuntimeTest, ANameClashWithAForeignContainerFailsLaunch) {
  engine_.AddContainer(Name("clash"), {{"app", "someone-else"}}, true);
  Status s = runtime_->Launch(Spec("clash"));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr(Name("clash")));
  EXPECT_THAT(s.message(), HasSubstr("remove it"));
  EXPECT_THAT(s.message(), HasSubstr("rename it"));
  ASSERT_TRUE(engine_.container(Name("clash")).has_value());  // untouched
  EXPECT_TRUE(engine_.container(Name("clash"))->state.running);
  EXPECT_FALSE(PathExists(Dir("clash")));
  // Another server's container of the same name is not ours either.
  engine_.AddContainer(Name("other"), {{"kiln.server", "otherlbl"}, {"kiln.instance", "other"}}, false);
  EXPECT_EQ(runtime_->Launch(Spec("other")).code(), StatusCode::kFailedPrecondition);
}

TEST_F(DockerRuntimeTest, OurStaleContainerIsReplaced) {
  std::string stale = engine_.AddContainer(Name("stale"), {{"kiln.server", kLabel}, {"kiln.instance", "stale"}}, false);
  LaunchRunning(Spec("stale"));
  std::optional<FakeEngine::Container> c = engine_.container(Name("stale"));
  ASSERT_TRUE(c.has_value());
  EXPECT_NE(c->id, stale);
  EXPECT_THAT(engine_.removed(), ElementsAre(Name("stale")));
}

TEST_F(DockerRuntimeTest, OpenSweepsOrphansAndHalfMadeLaunches) {
  runtime_.reset();
  // Ours without a state directory: an orphan. Another server's and a foreign one stay.
  engine_.AddContainer(Name("ghost"), {{"kiln.server", kLabel}, {"kiln.instance", "ghost"}}, true);
  engine_.AddContainer("kiln-otherlbl-x", {{"kiln.server", "otherlbl"}, {"kiln.instance", "x"}}, true);
  engine_.AddContainer("unrelated", {}, true);
  // A Launch that died before container.json: its directory and container go.
  ASSERT_TRUE(MakeDirs(Dir("half")).ok());
  engine_.AddContainer(Name("half"), {{"kiln.server", kLabel}, {"kiln.instance", "half"}}, true);
  Open();
  EXPECT_FALSE(PathExists(Dir("half")));
  ASSERT_TRUE(engine_.WaitUntil([&] { return !engine_.container(Name("ghost")).has_value(); }, 5000ms));
  EXPECT_FALSE(engine_.container(Name("half")).has_value());
  EXPECT_TRUE(engine_.container("kiln-otherlbl-x").has_value());
  EXPECT_TRUE(engine_.container("unrelated").has_value());
  EXPECT_TRUE(runtime_->List().value_or(std::vector<std::string>{"x"}).empty());
}

TEST_F(DockerRuntimeTest, RemoveRefusesARunningInstanceThenRemovesEverything) {
  LaunchRunning(Spec("rm"));
  EXPECT_EQ(runtime_->Remove("rm").code(), StatusCode::kFailedPrecondition);
  engine_.Exit(Name("rm"), 0);
  WaitEnded("rm");
  ASSERT_TRUE(runtime_->Remove("rm").ok());
  EXPECT_FALSE(engine_.container(Name("rm")).has_value());
  EXPECT_FALSE(PathExists(Dir("rm")));
  EXPECT_EQ(runtime_->Inspect("rm").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(runtime_->Remove("rm").code(), StatusCode::kNotFound);
  EXPECT_TRUE(runtime_->List().value_or(std::vector<std::string>{"x"}).empty());
}

TEST_F(DockerRuntimeTest, RemoveWhileTheEngineIsDownLeavesTheContainerToTheSweep) {
  LaunchRunning(Spec("down"));
  engine_.Exit(Name("down"), 0);
  WaitEnded("down");
  engine_.SetUnreachable(true);
  ASSERT_TRUE(runtime_->Remove("down").ok());
  EXPECT_FALSE(PathExists(Dir("down")));
  engine_.SetUnreachable(false);
  EXPECT_TRUE(engine_.container(Name("down")).has_value());
  Open();  // the sweep at Open (and every minute)
  EXPECT_TRUE(engine_.WaitUntil([&] { return !engine_.container(Name("down")).has_value(); }, 5000ms));
}

TEST_F(DockerRuntimeTest, UsageComesFromTheEngineStats) {
  InstanceSpec spec = Spec("usage");
  spec.gpus = {1, 3};
  spec.memory_limit_bytes = 1 << 30;
  LaunchRunning(spec);
  engine_.SetStats(Name("usage"), ContainerStats{1234, 5678, 1 << 30});
  Result<InstanceUsage> usage = runtime_->Usage("usage");
  ASSERT_TRUE(usage.ok()) << usage.status().ToString();
  EXPECT_EQ(usage->cpu_usec, 1234u);
  EXPECT_EQ(usage->memory_bytes, 5678u);
  EXPECT_EQ(usage->memory_limit_bytes, 1u << 30);
  EXPECT_THAT(usage->gpus, ElementsAre(1, 3));
  EXPECT_EQ(usage->source, "cgroup");

  // Without a limit of its own, the engine's "limit" (the node's memory) is not reported.
  LaunchRunning(Spec("nolimit"));
  engine_.SetStats(Name("nolimit"), ContainerStats{1, 2, 64ull << 30});
  EXPECT_EQ(runtime_->Usage("nolimit").value_or(InstanceUsage{}).memory_limit_bytes, 0u);

  engine_.Exit(Name("usage"), 0);
  WaitEnded("usage");
  EXPECT_EQ(runtime_->Usage("usage").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(runtime_->Usage("nobody").status().code(), StatusCode::kNotFound);
}

TEST_F(DockerRuntimeTest, AccessGivesTheEnginesPidAndTheSpecsHostname) {
  LaunchRunning(Spec("access"));
  Result<AccessPoint> point = runtime_->Access("access");
  ASSERT_TRUE(point.ok()) << point.status().ToString();
  ASSERT_TRUE(engine_.container(Name("access")).has_value());
  EXPECT_EQ(point->host_pid, engine_.container(Name("access"))->state.pid);
  EXPECT_GT(point->host_pid, 0);
  EXPECT_EQ(point->hostname, "algo-1");
  // Reopened (a server restart): the record still has the hostname.
  Open();
  point = runtime_->Access("access");
  ASSERT_TRUE(point.ok()) << point.status().ToString();
  EXPECT_EQ(point->hostname, "algo-1");

  engine_.Exit(Name("access"), 0);
  WaitEnded("access");
  EXPECT_EQ(runtime_->Access("access").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(runtime_->Access("nobody").status().code(), StatusCode::kNotFound);
}

TEST_F(DockerRuntimeTest, PrepareImageUsesThePresentImage) {
  ContainerImage image{kImage, "", std::nullopt};
  Result<std::string> reference = EngineReference(kImage, ImageSettings{});
  ASSERT_TRUE(reference.ok());
  engine_.AddImage(*reference);
  std::vector<std::string> progress;
  Status s = runtime_->PrepareImage(
      image, [&](const std::string& p) { progress.push_back(p); }, [] { return false; });
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(engine_.pulls().empty());
  ContainerImage missing{"localhost/nowhere:1", "", std::nullopt};
  EXPECT_EQ(runtime_
                ->PrepareImage(
                    missing, [](const std::string&) {}, [] { return false; })
                .code(),
            StatusCode::kNotFound);
}

// ---- Networks: a holder instance builds the namespace the container joins ----------------------

NetworkAttachment Attachment() {
  NetworkAttachment n;
  n.network = "job-net";
  n.bridge = "kb-99";
  n.host_veth = "kv99-2";
  n.address = "10.213.99.2";
  n.gateway = "10.213.99.1";
  return n;
}

TEST_F(DockerRuntimeTest, ANetworkedInstanceJoinsItsHoldersNamespace) {
  InstanceSpec spec = Spec("net");
  spec.network = Attachment();
  LaunchRunning(spec);
  ASSERT_EQ(holders_->launched().size(), 1u);
  const InstanceSpec holder = holders_->launched()[0];
  EXPECT_EQ(holder.instance_id, "net");
  EXPECT_EQ(holder.opt_ml_dir, Dir("net") + "/holder");
  EXPECT_THAT(holder.argv, ElementsAre("/bin/sleep", "infinity"));
  EXPECT_EQ(holder.hostname, "algo-1");
  ASSERT_TRUE(holder.network.has_value());
  EXPECT_EQ(holder.network->address, "10.213.99.2");
  EXPECT_THAT(engine_.container(Name("net"))->body.dump(), HasSubstr("/proc/" + std::to_string(getpid()) + "/ns/net"));

  // The holder stops when the exit is seen and goes with the instance.
  engine_.Exit(Name("net"), 0);
  WaitEnded("net");
  EXPECT_FALSE(holders_->running("net"));
  ASSERT_TRUE(runtime_->Remove("net").ok());
  EXPECT_THAT(holders_->removes(), ElementsAre("net"));
}

TEST_F(DockerRuntimeTest, AStartFailureRemovesTheHolderToo) {
  FakeEngine::Behavior behavior;
  behavior.start_error = "executable file not found in $PATH";
  engine_.Configure(Name("netfail"), behavior);
  InstanceSpec spec = Spec("netfail");
  spec.network = Attachment();
  EXPECT_EQ(runtime_->Launch(spec).code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(holders_->running("netfail"));
  EXPECT_THAT(holders_->removes(), ElementsAre("netfail"));
  EXPECT_FALSE(engine_.container(Name("netfail")).has_value());
}

TEST(DockerRuntimeDockerEngineTest, NetworkedInstancesNeedPodman) {
  char tmpl[] = "/tmp/kiln-h3-docker-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  FakeEngine docker(/*podman=*/false, "unix:///var/run/docker.sock");
  docker.AddImage(kImage);
  FakeHolders holders(root + "/holders");
  DockerRuntimeOptions options;
  options.state_dir = root + "/state";
  options.engine = std::make_unique<ForwardingEngine>(&docker);
  options.container.server_label = kLabel;
  options.network_holders = &holders;
  options.network_holders_state_dir = root + "/holders";
  Result<std::unique_ptr<Runtime>> runtime = OpenDockerRuntime(std::move(options));
  ASSERT_TRUE(runtime.ok());
  InstanceSpec spec;
  spec.instance_id = "dnet";
  spec.opt_ml_dir = root;
  spec.argv = {"train"};
  spec.container = ContainerImage{kImage, kImage, std::nullopt};
  spec.network = Attachment();
  Status s = (*runtime)->Launch(spec);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("Podman"));
  EXPECT_THAT(s.message(), HasSubstr("host"));
  EXPECT_TRUE(holders.launched().empty());
  EXPECT_TRUE(docker.container_names().empty());
  // Without a network the Docker engine is fine.
  spec.network.reset();
  EXPECT_TRUE((*runtime)->Launch(spec).ok());
  runtime->reset();
  RemoveAll(root).ok();
}

// ---- Live: Podman's socket and a locally built image ---------------------------------------------

class DockerRuntimePodmanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* socket = "/run/podman/podman.sock";
    if (access(socket, F_OK) != 0) GTEST_SKIP() << "no Podman socket at " << socket;
    HttpEngineOptions engine_options;
    engine_options.socket = kSocket;
    std::unique_ptr<Engine> engine = OpenHttpEngine(engine_options);
    if (!engine->Version().ok()) GTEST_SKIP() << "Podman does not answer at " << socket;
    if (!engine->InspectImage(kLiveImage).ok()) GTEST_SKIP() << "no image " << kLiveImage;
    char tmpl[] = "/tmp/kiln-h3-podman-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    ASSERT_TRUE(MakeDirs(root_ + "/opt_ml").ok());
    label_ = "h3t" + std::to_string(getpid());
    Open();
  }
  void Open() {
    runtime_.reset();
    HttpEngineOptions engine_options;
    engine_options.socket = kSocket;
    DockerRuntimeOptions options;
    options.state_dir = root_ + "/state";
    options.engine = OpenHttpEngine(engine_options);
    options.container.server_label = label_;
    options.network_holders = network_holders_;
    options.network_holders_state_dir = root_ + "/holders";
    // Within the Podman service's own limits (a test process may have a higher nproc than the
    // service, and crun cannot raise it).
    options.container.ulimits = {Ulimit{"nproc", 4096, 4096}};
    Result<std::unique_ptr<Runtime>> opened = OpenDockerRuntime(std::move(options));
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    runtime_ = std::move(*opened);
  }
  void TearDown() override {
    if (runtime_ != nullptr) {
      std::vector<std::string> ids = runtime_->List().value_or(std::vector<std::string>{});
      for (const std::string& id : ids) {
        runtime_->Stop(id, 0s).ok();
        runtime_->Wait(id, 10s).ok();
        runtime_->Remove(id).ok();
      }
      runtime_.reset();
    }
    if (!root_.empty()) RemoveAll(root_).ok();
  }
  InstanceSpec Spec(const std::string& id, const std::string& script) {
    InstanceSpec spec;
    spec.instance_id = id;
    spec.opt_ml_dir = root_ + "/opt_ml";
    spec.hostname = "algo-1";
    spec.argv = {script};
    spec.container = ContainerImage{kLiveImage, kLiveImage, std::vector<std::string>{"/bin/sh", "-c"}};
    return spec;
  }

  static constexpr char kLiveImage[] = "localhost/kiln-unit-base:latest";
  static constexpr char kSocket[] = "unix:///run/podman/podman.sock";
  std::string root_, label_;
  Runtime* network_holders_ = nullptr;
  std::unique_ptr<Runtime> runtime_;
};

TEST_F(DockerRuntimePodmanTest, RunsAContainerAndCapturesItsOutputAndExitCode) {
  Status launched = runtime_->Launch(Spec("echo", "echo hi; echo oops >&2; exit 4"));
  ASSERT_TRUE(launched.ok()) << launched.ToString();
  Result<InstanceStatus> st = runtime_->Wait("echo", 30s);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->state, InstanceState::kExited);
  EXPECT_EQ(st->exit_code, 4);
  std::vector<std::string> lines = Tagged(ReadRecords(runtime_->OutputPath("echo")));
  EXPECT_THAT(lines, ::testing::UnorderedElementsAre("o:hi", "e:oops"));
  ASSERT_TRUE(runtime_->Remove("echo").ok());
  EXPECT_TRUE(runtime_->List().value_or(std::vector<std::string>{"x"}).empty());
}

// Access: the engine's pid is the container's PID 1 (in its own pid and uts namespaces).
TEST_F(DockerRuntimePodmanTest, AccessGivesTheContainersPid1) {
  Status launched = runtime_->Launch(Spec("access", "exec sleep 600"));
  ASSERT_TRUE(launched.ok()) << launched.ToString();
  Result<AccessPoint> point = runtime_->Access("access");
  ASSERT_TRUE(point.ok()) << point.status().ToString();
  EXPECT_EQ(point->hostname, "algo-1");
  std::string proc = "/proc/" + std::to_string(point->host_pid);
  // The engine reports the pid once the runtime has created the container; its init process shows
  // the OCI runtime's (crun's) command line until it execs the entrypoint, a moment later on a
  // loaded machine.
  std::string cmdline;
  for (int i = 0; i < 100; ++i) {
    cmdline = ReadFile(proc + "/cmdline").value_or("");
    if (cmdline.find("sleep") != std::string::npos) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_THAT(cmdline, HasSubstr("sleep"));
  EXPECT_THAT(ReadFile(proc + "/status").value_or(""),
              HasSubstr("NSpid:\t" + std::to_string(point->host_pid) + "\t1\n"));
  ASSERT_TRUE(runtime_->Stop("access", 0s).ok());
  ASSERT_TRUE(runtime_->Wait("access", 20s).ok());
  EXPECT_EQ(runtime_->Access("access").status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(DockerRuntimePodmanTest, StopKillsAShellThatIgnoresTerm) {
  Status launched = runtime_->Launch(Spec("sleeper", "sleep 30"));
  ASSERT_TRUE(launched.ok()) << launched.ToString();
  ASSERT_TRUE(runtime_->Stop("sleeper", 1s).ok());
  Result<InstanceStatus> st = runtime_->Wait("sleeper", 20s);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->state, InstanceState::kExited);
  EXPECT_EQ(st->term_signal, SIGKILL);
  EXPECT_TRUE(st->stop_requested);
  ASSERT_TRUE(runtime_->Remove("sleeper").ok());
}

TEST_F(DockerRuntimePodmanTest, OutputResumesAcrossAServerRestart) {
  // 20 lines over ~2 s (several per whole-second stamp); the runtime goes away mid-way.
  ASSERT_TRUE(
      runtime_->Launch(Spec("count", "i=0; while [ $i -lt 20 ]; do echo line$i; i=$((i+1)); sleep 0.1; done")).ok());
  std::this_thread::sleep_for(700ms);
  runtime_.reset();
  std::this_thread::sleep_for(500ms);
  Open();
  Result<InstanceStatus> st = runtime_->Wait("count", 30s);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->exit_code, 0);
  std::vector<std::string> expected;
  for (int i = 0; i < 20; ++i) expected.push_back("o:line" + std::to_string(i));
  EXPECT_EQ(Tagged(ReadRecords(runtime_->OutputPath("count"))), expected);
  ASSERT_TRUE(runtime_->Remove("count").ok());
}

// A networked container: the holder is a real process-runtime instance (the test shim) on a bridge
// of this test's own (kh3br77, 10.239.77.0/24), and the container joins its namespace.
class DockerRuntimePodmanNetworkTest : public DockerRuntimePodmanTest {
 protected:
  static constexpr char kBridge[] = "kh3br77";
  static constexpr char kVethPrefix[] = "kh3v77-";
  static constexpr char kNet[] = "10.239.77.";

  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "namespaced networks need root";
    DockerRuntimePodmanTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    CleanLinks();
    Status s = netlink::CreateBridge(kBridge, std::string(kNet) + "1", 24, "kiln docker_runtime_test");
    ASSERT_TRUE(s.ok()) << s.ToString();
    bridge_created_ = true;
    const char* shim = std::getenv("KILN_TEST_SHIM");
    ProcessRuntimeOptions holder_options;
    holder_options.state_dir = root_ + "/holders";
    holder_options.shim_command = {shim != nullptr && *shim != '\0' ? shim : KILN_TEST_SHIM};
    Result<std::unique_ptr<Runtime>> holders = OpenProcessRuntime(holder_options);
    ASSERT_TRUE(holders.ok()) << holders.status().ToString();
    holders_ = std::move(*holders);
    network_holders_ = holders_.get();
    Open();
  }
  void TearDown() override {
    DockerRuntimePodmanTest::TearDown();  // removes the instances (and their holders) first
    holders_.reset();
    if (bridge_created_) CleanLinks();
  }
  void CleanLinks() {
    for (const std::string& veth : netlink::ListLinks(kVethPrefix).value_or({})) netlink::DeleteLink(veth).ok();
    netlink::DeleteLink(kBridge).ok();
  }
  NetworkAttachment Attachment(int octet) {
    NetworkAttachment a;
    a.network = "h3-test-net";
    a.bridge = kBridge;
    a.host_veth = kVethPrefix + std::to_string(octet);
    a.address = kNet + std::to_string(octet);
    a.gateway = std::string(kNet) + "1";
    return a;
  }

  std::unique_ptr<Runtime> holders_;
  bool bridge_created_ = false;
};

TEST_F(DockerRuntimePodmanNetworkTest, AContainerRunsInItsHoldersNetworkNamespace) {
  InstanceSpec spec = Spec("netted", "");
  spec.container->entrypoint = std::vector<std::string>{"/usr/bin/python3", "-c"};
  spec.argv = {
      "import socket\n"
      "print(socket.gethostname())\n"
      "print(' '.join(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:])))\n"
      "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('" +
      std::string(kNet) +
      "1', 9))\n"
      "print(s.getsockname()[0])\n"
      "print(open('/etc/hosts').read().strip())\n"};
  spec.network = Attachment(2);
  spec.hosts_file_lines = {"127.0.0.1 localhost", std::string(kNet) + "2 algo-1"};
  Status launched = runtime_->Launch(spec);
  ASSERT_TRUE(launched.ok()) << launched.ToString();
  Result<InstanceStatus> st = runtime_->Wait("netted", 30s);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->exit_code, 0);
  EXPECT_THAT(Tagged(ReadRecords(runtime_->OutputPath("netted"))),
              ElementsAre("o:algo-1", "o:eth0 lo", "o:" + std::string(kNet) + "2", "o:127.0.0.1 localhost",
                          "o:" + std::string(kNet) + "2 algo-1"));
  // The holder was stopped with the exit, and goes with the instance (its veth with it).
  Result<InstanceStatus> holder = holders_->Wait("netted", 10s);
  ASSERT_TRUE(holder.ok()) << holder.status().ToString();
  EXPECT_NE(holder->state, InstanceState::kRunning);
  ASSERT_TRUE(runtime_->Remove("netted").ok());
  EXPECT_EQ(holders_->Inspect("netted").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(netlink::ListLinks(kVethPrefix).value_or({"?"}).empty());
}

// InstanceSpec::network_namespace: the container joins that namespace (ns:<path>), no holder of
// its own; a spec with a network as well is refused.
TEST_F(DockerRuntimeTest, AContainerJoinsAnExistingNetworkNamespace) {
  InstanceSpec spec = Spec("joined");
  spec.network_namespace = "/proc/4242/ns/net";
  LaunchRunning(spec);
  std::optional<FakeEngine::Container> c = engine_.container(Name("joined"));
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->body["HostConfig"]["NetworkMode"], "ns:/proc/4242/ns/net");
  InstanceSpec both = Spec("both");
  both.network_namespace = "/proc/4242/ns/net";
  both.network = NetworkAttachment{};
  both.network->network = "endpoint-x";
  EXPECT_EQ(runtime_->Launch(both).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::runtime::docker
