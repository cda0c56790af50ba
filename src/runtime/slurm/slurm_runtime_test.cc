#include "runtime/slurm/slurm_runtime.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>

#include "base/fs.h"
#include "runtime/slurm/test_util/fake_slurm_client.h"

namespace kiln::runtime::slurm {
namespace {

namespace fs = std::filesystem;

class SlurmRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("kiln-slurm-rt-" + std::to_string(getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "opt_ml" / "input");
    fake_ = std::make_shared<FakeSlurmClient>();
    Reopen();
  }
  void TearDown() override {
    runtime_.reset();
    fs::remove_all(root_);
  }
  void Reopen(std::chrono::milliseconds settle = std::chrono::seconds(10)) {
    runtime_.reset();
    SlurmRuntimeOptions o;
    o.state_dir = (root_ / "state").string();
    o.client = fake_;
    o.server_url = "http://10.77.0.1:5456";
    o.node_command = {"/usr/local/bin/kiln"};
    o.placement = {{"partition", "debug"}};
    o.start_poller = false;
    o.exit_settle = settle;
    o.stop_backstop = std::chrono::seconds(0);
    o.finish_grace = finish_grace_;
    o.node_contact_timeout = node_contact_timeout_;
    auto r = OpenSlurmRuntime(std::move(o));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    runtime_ = std::move(r).value();
  }
  InstanceSpec Spec(const std::string& id) {
    InstanceSpec s;
    s.instance_id = id;
    s.opt_ml_dir = (root_ / "opt_ml").string();
    s.argv = {"/usr/bin/python3", "train.py"};
    s.shape_vcpus = 4;
    s.shape_memory_bytes = 16ull << 30;
    s.time_limit_seconds = 120;
    return s;
  }
  InstanceStatus StatusOf(const std::string& id) {
    auto s = runtime_->Inspect(id);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? *s : InstanceStatus{};
  }
  NodeReport Report(const std::string& state) {
    NodeReport r;
    r.state = state;
    r.node = "kn1";
    r.address = "10.77.0.11";
    r.started_millis = 1000;
    if (state == "exited") {
      r.finished_millis = 2000;
      r.exit_code = 0;
    }
    return r;
  }

  fs::path root_;
  std::shared_ptr<FakeSlurmClient> fake_;
  std::unique_ptr<SlurmRuntime> runtime_;
  std::chrono::milliseconds finish_grace_ = std::chrono::seconds(60);
  std::chrono::milliseconds node_contact_timeout_ = std::chrono::minutes(5);
};

TEST_F(SlurmRuntimeTest, SingleInstanceIsOneJobWithItsShape) {
  ASSERT_TRUE(runtime_->Launch(Spec("e-1")).ok());
  auto submitted = fake_->submitted();
  ASSERT_EQ(submitted.size(), 1u);
  EXPECT_EQ(submitted[0].nodes, 1);
  EXPECT_EQ(submitted[0].cpus_per_task, 4);
  EXPECT_EQ(submitted[0].memory_bytes, 16ull << 30);
  EXPECT_EQ(submitted[0].time_limit_seconds, 120);
  EXPECT_EQ(submitted[0].partition, "debug");
  ASSERT_EQ(submitted[0].env.count("KILN_NODE_TOKEN"), 1u);
  const std::string token = submitted[0].env.at("KILN_NODE_TOKEN");
  EXPECT_EQ(token.size(), 64u);
  EXPECT_TRUE(runtime_->Authenticate("e-1", token).ok());
  EXPECT_EQ(runtime_->Authenticate("e-1", "wrong").code(), StatusCode::kUnauthenticated);
  EXPECT_TRUE(runtime_->Authenticate("nope", token).IsNotFound());
  std::string script = ReadFile(submitted[0].script_path).value_or("");
  EXPECT_NE(script.find("exec srun --ntasks-per-node=1 --kill-on-bad-exit=0 '/usr/local/bin/kiln' node --server "
                        "'http://10.77.0.1:5456' --instances 'e-1' --scratch '/tmp'"),
            std::string::npos)
      << script;
  EXPECT_EQ(script.find(token), std::string::npos);

  InstanceStatus s = StatusOf("e-1");
  EXPECT_EQ(s.state, InstanceState::kRunning);
  EXPECT_EQ(s.started_millis, 0);
  EXPECT_EQ(s.waiting_reason, "Slurm job 100 is submitted");
  runtime_->PollOnce();
  EXPECT_EQ(StatusOf("e-1").waiting_reason, "Slurm job 100 is pending: Priority");
  fake_->SetState("100", "PENDING", "Resources");
  runtime_->PollOnce();
  EXPECT_EQ(StatusOf("e-1").waiting_reason, "Slurm job 100 is pending: Resources");

  fake_->SetState("100", "RUNNING", "None", "kn1");
  ASSERT_TRUE(runtime_->Report("e-1", Report("starting")).ok());
  EXPECT_EQ(StatusOf("e-1").waiting_reason, "Slurm job 100 is running on kn1: the node is preparing /opt/ml");
  NodeReport running = Report("running");
  running.usage = InstanceUsage{10, 20, 30, {}, "proc", 2};
  ASSERT_TRUE(runtime_->Report("e-1", running).ok());
  s = StatusOf("e-1");
  EXPECT_EQ(s.waiting_reason, "");
  EXPECT_EQ(s.started_millis, 1000);
  EXPECT_EQ(s.address, "10.77.0.11");
  EXPECT_EQ(runtime_->Usage("e-1")->memory_bytes, 20u);

  ASSERT_TRUE(runtime_->Report("e-1", Report("exited")).ok());
  s = StatusOf("e-1");
  EXPECT_EQ(s.state, InstanceState::kExited);
  EXPECT_EQ(s.exit_code, 0);
  EXPECT_EQ(s.finished_millis, 2000);
  EXPECT_TRUE(runtime_->Wait("e-1", std::chrono::milliseconds(1))->state == InstanceState::kExited);
  EXPECT_FALSE(runtime_->Usage("e-1").ok());
}

TEST_F(SlurmRuntimeTest, GroupIsSubmittedOnceComplete) {
  InstanceSpec a = Spec("job-algo-1"), b = Spec("job-algo-2");
  a.group = b.group = "job";
  a.group_size = b.group_size = 2;
  a.group_index = 0;
  b.group_index = 1;
  ASSERT_TRUE(runtime_->Launch(b).ok());
  EXPECT_TRUE(fake_->submitted().empty());
  EXPECT_EQ(StatusOf("job-algo-2").waiting_reason, "waiting for 1 more instance(s) of job before submitting to Slurm");
  ASSERT_TRUE(runtime_->Launch(a).ok());
  auto submitted = fake_->submitted();
  ASSERT_EQ(submitted.size(), 1u);
  EXPECT_EQ(submitted[0].nodes, 2);
  std::string script = ReadFile(submitted[0].script_path).value_or("");
  EXPECT_NE(script.find("--instances 'job-algo-1,job-algo-2'"), std::string::npos) << script;
  const std::string token = submitted[0].env.at("KILN_NODE_TOKEN");
  EXPECT_TRUE(runtime_->Authenticate("job-algo-1", token).ok());
  EXPECT_TRUE(runtime_->Authenticate("job-algo-2", token).ok());
  EXPECT_EQ(StatusOf("job-algo-1").waiting_reason, "Slurm job 100 is submitted");
}

TEST_F(SlurmRuntimeTest, RefusedSubmissionLosesTheGroupWithSlurmsWords) {
  fake_->SetSubmitError(Status::InvalidArgument("sbatch: error: invalid partition specified: gpu"));
  InstanceSpec a = Spec("j-1"), b = Spec("j-2");
  a.group = b.group = "j";
  a.group_size = b.group_size = 2;
  b.group_index = 1;
  ASSERT_TRUE(runtime_->Launch(a).ok());
  kiln::Status launched = runtime_->Launch(b);
  ASSERT_FALSE(launched.ok());
  EXPECT_TRUE(launched.IsInvalidArgument());
  EXPECT_NE(launched.message().find("invalid partition specified: gpu"), std::string::npos);
  for (const char* id : {"j-1", "j-2"}) {
    InstanceStatus s = StatusOf(id);
    EXPECT_EQ(s.state, InstanceState::kLost);
    EXPECT_EQ(s.lost_reason, "Slurm refused the job: sbatch: error: invalid partition specified: gpu");
  }
  EXPECT_TRUE(runtime_->Remove("j-1").ok());
  EXPECT_TRUE(fake_->cancelled().empty());
}

TEST_F(SlurmRuntimeTest, AControllerThatIsDownFailsTheLaunchAsUnavailable) {
  fake_->SetSubmitError(Status::Unavailable(
      "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"));
  kiln::Status launched = runtime_->Launch(Spec("down-1"));
  EXPECT_EQ(launched.code(), StatusCode::kUnavailable);
  EXPECT_NE(launched.message().find("Slurm could not be reached: sbatch: error"), std::string::npos)
      << launched.message();
  EXPECT_EQ(StatusOf("down-1").state, InstanceState::kLost);
}

TEST_F(SlurmRuntimeTest, NodeFailureBeforeTheExitReportIsLostNamingTheNode) {
  ASSERT_TRUE(runtime_->Launch(Spec("t-1")).ok());
  ASSERT_TRUE(runtime_->Report("t-1", Report("running")).ok());
  fake_->SetState("100", "NODE_FAIL", "NodeDown", "kn2");
  runtime_->PollOnce();
  EXPECT_EQ(StatusOf("t-1").state, InstanceState::kRunning);  // one more round for a report in flight
  runtime_->PollOnce();
  InstanceStatus s = StatusOf("t-1");
  EXPECT_EQ(s.state, InstanceState::kLost);
  EXPECT_EQ(s.lost_reason, "Slurm node kn1 failed (Slurm job 100 ended NODE_FAIL)");
  EXPECT_FALSE(s.preempted);
}

TEST_F(SlurmRuntimeTest, EndStatesMapToStatuses) {
  struct Case {
    const char* state;
    InstanceState expected;
    const char* reason_part;
    bool preempted, oom;
  };
  const Case cases[] = {
      {"PREEMPTED", InstanceState::kLost, "Slurm preempted job", true, false},
      {"TIMEOUT", InstanceState::kLost, "at its time limit", false, false},
      {"OUT_OF_MEMORY", InstanceState::kExited, "ran out of memory", false, true},
      {"CANCELLED", InstanceState::kLost, "cancelled outside Kiln", false, false},
      {"FAILED", InstanceState::kLost, "ended FAILED (NonZeroExitCode)", false, false},
      {"COMPLETED", InstanceState::kLost, "before the node reported an exit", false, false},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string id = "c-" + std::to_string(n++);
    ASSERT_TRUE(runtime_->Launch(Spec(id)).ok());
    const std::string job = std::to_string(100 + n - 1);
    fake_->SetState(job, c.state, std::string(c.state) == "FAILED" ? "NonZeroExitCode" : "None", "kn1");
    runtime_->PollOnce();
    runtime_->PollOnce();
    InstanceStatus s = StatusOf(id);
    EXPECT_EQ(s.state, c.expected) << c.state;
    EXPECT_NE(s.lost_reason.find(c.reason_part), std::string::npos) << c.state << ": " << s.lost_reason;
    EXPECT_EQ(s.preempted, c.preempted) << c.state;
    EXPECT_EQ(s.oom_killed, c.oom) << c.state;
  }
}

TEST_F(SlurmRuntimeTest, ANodeThatNeverCallsIsLostAndItsJobCancelled) {
  ASSERT_TRUE(runtime_->Launch(Spec("n-1")).ok());
  fake_->SetState("100", "RUNNING", "None", "kn2");
  runtime_->PollOnce();
  EXPECT_EQ(StatusOf("n-1").state, InstanceState::kRunning);  // within the timeout (5 min)
  node_contact_timeout_ = std::chrono::milliseconds(0);
  Reopen();
  runtime_->PollOnce();
  InstanceStatus s = StatusOf("n-1");
  EXPECT_EQ(s.state, InstanceState::kLost);
  EXPECT_NE(s.lost_reason.find("without its node reaching this server at http://10.77.0.1:5456"), std::string::npos)
      << s.lost_reason;
  EXPECT_NE(s.lost_reason.find("on kn2"), std::string::npos) << s.lost_reason;
  EXPECT_EQ(fake_->cancelled(), std::vector<std::string>{"100"});
}

TEST_F(SlurmRuntimeTest, PurgedJobWithoutReportIsLost) {
  ASSERT_TRUE(runtime_->Launch(Spec("p-1")).ok());
  fake_->Forget("100");
  runtime_->PollOnce();
  runtime_->PollOnce();
  InstanceStatus s = StatusOf("p-1");
  EXPECT_EQ(s.state, InstanceState::kLost);
  EXPECT_NE(s.lost_reason.find("Slurm no longer knows job 100"), std::string::npos);
}

TEST_F(SlurmRuntimeTest, SignalledExitWaitsForSlurmsExplanation) {
  ASSERT_TRUE(runtime_->Launch(Spec("s-1")).ok());
  ASSERT_TRUE(runtime_->Report("s-1", Report("running")).ok());
  NodeReport exited = Report("exited");
  exited.exit_code = -1;
  exited.term_signal = SIGTERM;
  ASSERT_TRUE(runtime_->Report("s-1", exited).ok());
  EXPECT_EQ(StatusOf("s-1").state, InstanceState::kRunning);
  fake_->SetState("100", "PREEMPTED", "None", "kn1");
  runtime_->PollOnce();
  InstanceStatus s = StatusOf("s-1");
  EXPECT_EQ(s.state, InstanceState::kExited);
  EXPECT_TRUE(s.preempted);
  EXPECT_EQ(s.term_signal, SIGTERM);
}

TEST_F(SlurmRuntimeTest, SignalledExitSettlesWithoutSlurm) {
  Reopen(std::chrono::milliseconds(0));
  ASSERT_TRUE(runtime_->Launch(Spec("s-2")).ok());
  NodeReport exited = Report("exited");
  exited.term_signal = SIGKILL;
  ASSERT_TRUE(runtime_->Report("s-2", exited).ok());
  fake_->SetState("100", "RUNNING", "None", "kn1");
  runtime_->PollOnce();
  EXPECT_EQ(StatusOf("s-2").state, InstanceState::kExited);
  EXPECT_FALSE(StatusOf("s-2").preempted);
}

TEST_F(SlurmRuntimeTest, StopOfAPendingJobCancelsIt) {
  ASSERT_TRUE(runtime_->Launch(Spec("q-1")).ok());
  ASSERT_TRUE(runtime_->Stop("q-1", std::chrono::seconds(30)).ok());
  ASSERT_EQ(fake_->cancelled(), std::vector<std::string>{"100"});
  runtime_->PollOnce();
  runtime_->PollOnce();
  InstanceStatus s = StatusOf("q-1");
  EXPECT_EQ(s.state, InstanceState::kExited);
  EXPECT_TRUE(s.stop_requested);
  EXPECT_EQ(s.term_signal, SIGKILL);
}

TEST_F(SlurmRuntimeTest, StopOfARunningInstanceGoesThroughTheNodeThenTheBackstop) {
  ASSERT_TRUE(runtime_->Launch(Spec("r-1")).ok());
  ASSERT_TRUE(runtime_->Report("r-1", Report("running")).ok());
  fake_->SetState("100", "RUNNING", "None", "kn1");
  ASSERT_TRUE(runtime_->Stop("r-1", std::chrono::seconds(0)).ok());
  EXPECT_TRUE(fake_->cancelled().empty());
  ASSERT_TRUE(runtime_->Signal("r-1", SIGUSR1).ok());
  Result<NodeReportAnswer> answer = runtime_->Report("r-1", Report("running"));
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(answer->stop_grace_seconds, 0);
  EXPECT_EQ(answer->signals, std::vector<int>{SIGUSR1});
  EXPECT_TRUE(runtime_->Report("r-1", Report("running"))->signals.empty());
  // The node never reports the exit: grace 0 + backstop 0 passed, so the poller cancels the job.
  runtime_->PollOnce();
  EXPECT_EQ(fake_->cancelled(), std::vector<std::string>{"100"});
  runtime_->PollOnce();
  runtime_->PollOnce();
  EXPECT_EQ(StatusOf("r-1").state, InstanceState::kExited);
}

TEST_F(SlurmRuntimeTest, StateSurvivesAReopenAndRemoveCancelsWhatSlurmStillRuns) {
  ASSERT_TRUE(runtime_->Launch(Spec("a-1")).ok());
  const std::string token = fake_->submitted()[0].env.at("KILN_NODE_TOKEN");
  ASSERT_TRUE(runtime_->Report("a-1", Report("running")).ok());
  uint64_t size = 0;
  ASSERT_TRUE(runtime_->AppendOutput("a-1", 0, "1 o hello\n", &size).ok());
  finish_grace_ = std::chrono::milliseconds(0);
  Reopen();
  EXPECT_TRUE(runtime_->Authenticate("a-1", token).ok());
  EXPECT_EQ(StatusOf("a-1").started_millis, 1000);
  EXPECT_EQ(runtime_->AppendOutput("a-1", 0, "again", &size).code(), StatusCode::kAborted);
  EXPECT_EQ(size, 10u);
  EXPECT_EQ(*ReadFile(runtime_->OutputPath("a-1")), "1 o hello\n");
  EXPECT_EQ(runtime_->Remove("a-1").code(), StatusCode::kFailedPrecondition);
  fake_->SetState("100", "RUNNING", "None", "kn1");
  // Lost while Slurm still runs it (e.g. written off by a report error): Remove cancels the job.
  NodeReport broken = Report("exited");
  broken.error = "cannot execute /usr/bin/pythn3: No such file or directory";
  ASSERT_TRUE(runtime_->Report("a-1", broken).ok());
  EXPECT_EQ(StatusOf("a-1").lost_reason, broken.error);
  EXPECT_TRUE(runtime_->Remove("a-1").ok());
  // The node reported its exit: its job gets finish_grace (0 here) to end by itself, then goes.
  EXPECT_TRUE(fake_->cancelled().empty());
  runtime_->PollOnce();
  EXPECT_EQ(fake_->cancelled(), std::vector<std::string>{"100"});
  EXPECT_TRUE(runtime_->Inspect("a-1").status().IsNotFound());
  EXPECT_TRUE(runtime_->List()->empty());
}

TEST_F(SlurmRuntimeTest, RemoveLeavesAJobWhoseNodesReportedTheirExitToEndByItself) {
  ASSERT_TRUE(runtime_->Launch(Spec("d-1")).ok());
  ASSERT_TRUE(runtime_->Report("d-1", Report("exited")).ok());
  fake_->SetState("100", "RUNNING", "None", "kn1");
  ASSERT_TRUE(runtime_->Remove("d-1").ok());
  EXPECT_TRUE(fake_->cancelled().empty());
  runtime_->PollOnce();  // still within finish_grace (60 s)
  EXPECT_TRUE(fake_->cancelled().empty());
  fake_->SetState("100", "COMPLETED", "None", "kn1");
  runtime_->PollOnce();  // ended by itself: nothing to cancel, ever
  fake_->SetState("100", "RUNNING", "None", "kn1");
  runtime_->PollOnce();
  EXPECT_TRUE(fake_->cancelled().empty());
}

TEST_F(SlurmRuntimeTest, IncompleteGroupSurvivesAReopen) {
  InstanceSpec a = Spec("g-1"), b = Spec("g-2");
  a.group = b.group = "g";
  a.group_size = b.group_size = 2;
  b.group_index = 1;
  ASSERT_TRUE(runtime_->Launch(a).ok());
  Reopen();
  ASSERT_TRUE(runtime_->Launch(b).ok());
  ASSERT_EQ(fake_->submitted().size(), 1u);
  EXPECT_EQ(fake_->submitted()[0].nodes, 2);
}

TEST_F(SlurmRuntimeTest, RefusesWhatItCannotRun) {
  InstanceSpec s = Spec("x");
  s.container = ContainerImage{"img:1", "", std::nullopt};
  EXPECT_EQ(runtime_->Launch(s).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(runtime_->Launch(Spec("../x")).IsInvalidArgument());
  ASSERT_TRUE(runtime_->Launch(Spec("y")).ok());
  EXPECT_TRUE(runtime_->Launch(Spec("y")).IsAlreadyExists());
  EXPECT_EQ(runtime_->Access("y").status().code(), StatusCode::kUnimplemented);
}

// A tar of `files` (path -> content), as the node pushes.
std::string Tar(const std::map<std::string, std::string>& files) {
  std::string out;
  struct archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  archive_write_open(
      a, &out, nullptr,
      [](struct archive*, void* o, const void* d, size_t n) -> la_ssize_t {
        static_cast<std::string*>(o)->append(static_cast<const char*>(d), n);
        return static_cast<la_ssize_t>(n);
      },
      nullptr);
  for (const auto& [path, content] : files) {
    archive_entry* e = archive_entry_new();
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
  return out;
}

TEST_F(SlurmRuntimeTest, FilesPushReplacesResultsOnly) {
  ASSERT_TRUE(runtime_->Launch(Spec("f-1")).ok());
  fs::create_directories(root_ / "opt_ml" / "checkpoints");
  ASSERT_TRUE(WriteFileAtomic((root_ / "opt_ml" / "checkpoints" / "c.pt").string(), "old").ok());
  std::string tar = Tar({{"checkpoints/c.pt", "new"},
                         {"model/m.bin", "weights"},
                         {"output/data/x", "1"},
                         {"processing/out/part-0", "p"}});
  StringByteSource body(tar);
  kiln::Status applied = runtime_->ApplyFiles("f-1", body);
  ASSERT_TRUE(applied.ok()) << applied.ToString();
  EXPECT_EQ(*ReadFile((root_ / "opt_ml" / "checkpoints" / "c.pt").string()), "new");
  EXPECT_EQ(*ReadFile((root_ / "opt_ml" / "model" / "m.bin").string()), "weights");
  EXPECT_EQ(*ReadFile((root_ / "opt_ml" / "output" / "data" / "x").string()), "1");
  EXPECT_EQ(*ReadFile((root_ / "opt_ml" / "processing" / "out" / "part-0").string()), "p");
  // A second push of the same file replaces it again.
  std::string again = Tar({{"checkpoints/c.pt", "newer"}});
  StringByteSource body2(again);
  ASSERT_TRUE(runtime_->ApplyFiles("f-1", body2).ok());
  EXPECT_EQ(*ReadFile((root_ / "opt_ml" / "checkpoints" / "c.pt").string()), "newer");

  std::string bad = Tar({{"input/config/hyperparameters.json", "{}"}});
  StringByteSource body3(bad);
  EXPECT_TRUE(runtime_->ApplyFiles("f-1", body3).IsInvalidArgument());
  EXPECT_FALSE(PathExists((root_ / "opt_ml" / "input" / "config").string()));
  std::string escape = Tar({{"../escape", "x"}});
  StringByteSource body4(escape);
  EXPECT_FALSE(runtime_->ApplyFiles("f-1", body4).ok());
  EXPECT_FALSE(PathExists((root_ / "escape").string()));
  // Nothing staged is left beside opt_ml.
  for (const auto& e : fs::directory_iterator(root_)) {
    EXPECT_EQ(e.path().filename().string().find("opt_ml.push-"), std::string::npos) << e.path();
  }
}

TEST_F(SlurmRuntimeTest, QueryFailureKeepsStatesAndSaysSo) {
  ASSERT_TRUE(runtime_->Launch(Spec("u-1")).ok());
  fake_->SetQueryError(Status::Unavailable("squeue failed: Unable to contact slurm controller"));
  runtime_->PollOnce();
  runtime_->PollOnce();
  InstanceStatus s = StatusOf("u-1");
  EXPECT_EQ(s.state, InstanceState::kRunning);
  EXPECT_NE(s.waiting_reason.find("Unable to contact slurm controller"), std::string::npos) << s.waiting_reason;
}

}  // namespace
}  // namespace kiln::runtime::slurm
