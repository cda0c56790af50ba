#include "control/processing_controller.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "base/fs.h"
#include "base/io.h"
#include "control/test_util/controller_fixture.h"
#include "runtime/test_util/fake_networks.h"
#include "store/processing_job_repository.h"

namespace kiln::control {
namespace {

using nlohmann::json;
using runtime::testing::FakeRuntime;
using store::ProcessingJobStatus;
namespace fs = std::filesystem;

constexpr std::chrono::seconds kStopGrace{7};  // distinct from the default, to see it passed on

// ---------------------------------------------------------------------------------------------
// The controller over the fake runtime and clock (control/test_util/controller_fixture.h): what a
// processing job goes through, from waiting for capacity to its terminal status.

class ProcessingControllerTest : public testing::ControllerTest {
 protected:
  void SetUp() override {
    ControllerTest::SetUp();
    MakeScheduler(testing::SmallHost(2, 8));  // fits one ml.m5.large
  }
  void TearDown() override { controller_.reset(); }

  void StartController() {
    ProcessingControllerOptions options;
    options.work_dir = work_dir();
    options.region = "us-east-1";
    options.endpoint_url = "http://127.0.0.1:1";
    options.stop_grace = kStopGrace;
    options.continuous_scan_interval = std::chrono::milliseconds(20);
    options.continuous_quiet_period = std::chrono::milliseconds(0);
    options.capacity_retry_interval = std::chrono::milliseconds(20);
    options.keep_host_dirs = keep_host_dirs_;
    ProcessingControllerDeps deps;
    deps.database = db_.get();
    deps.object_store = object_store_.get();
    deps.log_store = log_store_.get();
    deps.runtime = runtime_.get();
    deps.scheduler = scheduler_.get();
    deps.environments = environments_.get();
    deps.credentials = credentials_.get();
    deps.clock = &clock_;
    deps.networks = networks_.get();
    controller_ = std::make_unique<ProcessingController>(options, deps);
    ASSERT_TRUE(controller_->Start().ok());
  }

  // A server restart: the controller goes (instances keep running), a new one adopts.
  void RestartController() {
    controller_.reset();
    RenewServerState();
    StartController();
  }

  static json BaseRequest(const std::string& name) {
    return {{"ProcessingJobName", name},
            {"RoleArn", "arn:aws:iam::000000000000:role/r"},
            {"AppSpecification", {{"ImageUri", "local:/bin/true"}, {"ContainerArguments", {"--x", "1"}}}},
            {"Environment", {{"MY_SETTING", "on"}}},
            {"ProcessingResources",
             {{"ClusterConfig", {{"InstanceType", "ml.m5.large"}, {"InstanceCount", 1}, {"VolumeSizeInGB", 1}}}}},
            {"ProcessingInputs",
             {{{"InputName", "data"},
               {"S3Input",
                {{"S3Uri", "s3://bkt/in"},
                 {"LocalPath", "/opt/ml/processing/input/data"},
                 {"S3DataType", "S3Prefix"},
                 {"S3InputMode", "File"},
                 {"S3DataDistributionType", "FullyReplicated"}}}}}},
            {"ProcessingOutputConfig",
             {{"Outputs",
               {{{"OutputName", "result"},
                 {"S3Output",
                  {{"S3Uri", "s3://bkt/out/result"},
                   {"LocalPath", "/opt/ml/processing/output/result"},
                   {"S3UploadMode", "EndOfJob"}}}}}}}},
            {"StoppingCondition", {{"MaxRuntimeInSeconds", 3600}}}};
  }

  // Inserts the job as CreateProcessingJob does and submits it (`submit` false: only the row).
  void Create(const std::string& name, const json& overrides = json::object(), bool submit = true) {
    json request = BaseRequest(name);
    request.merge_patch(overrides);
    store::ProcessingJobRecord record;
    record.name = name;
    record.arn = "arn:aws:sagemaker:us-east-1:000000000000:processing-job/" + name;
    record.request = request;
    record.creation_millis = clock_.NowMillis();
    record.last_modified_millis = clock_.NowMillis();
    store::ProcessingJobRepository jobs(db_.get());
    ASSERT_TRUE(jobs.Insert(record).ok());
    if (submit) controller_->Submit(name);
  }

  // StopProcessingJob as the API does it: the row says Stopping, then the controller is told.
  void StopJob(const std::string& name) {
    store::ProcessingJobRepository jobs(db_.get());
    auto updated = jobs.Mutate(name, [&](store::ProcessingJobRecord& r) {
      r.status = ProcessingJobStatus::kStopping;
      r.state.stop_reason = std::string(store::kProcessingStopRequested);
      return Status::Ok();
    });
    ASSERT_TRUE(updated.ok());
    controller_->RequestStop(name);
  }

  store::ProcessingJobRecord Job(const std::string& name) {
    store::ProcessingJobRepository jobs(db_.get());
    auto r = jobs.Get(name);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : store::ProcessingJobRecord{};
  }

  store::ProcessingJobRecord WaitForStatus(const std::string& name, ProcessingJobStatus status) {
    store::ProcessingJobRecord last;
    bool reached = WaitFor([&] {
      last = Job(name);
      return last.status == status;
    });
    EXPECT_TRUE(reached) << name << " is " << store::ProcessingJobStatusName(last.status) << " ("
                         << last.state.failure_reason << "), not " << store::ProcessingJobStatusName(status);
    return last;
  }

  static std::string Instance(const std::string& job, int host = 1) {
    return "processing-" + job + "-algo-" + std::to_string(host);
  }
  bool WaitForLaunch(const std::string& job, int host = 1) {
    return runtime_->WaitForLaunch(Instance(job, host), kPatience);
  }
  std::string OptMl(const std::string& job, int host = 1) {
    return work_dir() + "/" + job + "/algo-" + std::to_string(host) + "/opt_ml";
  }
  void Put(const std::string& key, const std::string& data) {
    StringByteSource src(data);
    ASSERT_TRUE(object_store_->PutObject("bkt", key, src, objects::PutOptions{}).ok());
  }
  std::string Get(const std::string& key) {
    auto r = object_store_->GetObject("bkt", key, std::nullopt);
    if (!r.ok()) return "<" + r.status().ToString() + ">";
    auto all = ReadAll(**r, 1 << 20);
    return all.ok() ? *all : "<read error>";
  }
  bool Exists(const std::string& key) { return object_store_->HeadObject("bkt", key).ok(); }
  static void Write(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path) << text;
  }
  std::vector<std::string> Lines(const std::string& stream) {
    observe::EventsQuery query;
    query.start_from_head = true;
    auto events = log_store_->GetEvents(kProcessingLogGroup, stream, query);
    std::vector<std::string> lines;
    if (!events.ok()) return lines;
    for (const auto& e : events->events) lines.push_back(e.message);
    return lines;
  }

  std::unique_ptr<ProcessingController> controller_;
  std::unique_ptr<runtime::FakeNetworks> networks_;
  bool keep_host_dirs_ = false;
};

TEST_F(ProcessingControllerTest, RunsAJobFromInputsToOutputs) {
  Put("in/a.csv", "1,2,3");
  Put("in/sub/b.csv", "4");
  StartController();
  Create("p1");
  ASSERT_TRUE(WaitForLaunch("p1"));
  const std::string opt_ml = OptMl("p1");

  // The layout was complete before the program started.
  EXPECT_EQ(*ReadFile(opt_ml + "/processing/input/data/a.csv"), "1,2,3");
  EXPECT_EQ(*ReadFile(opt_ml + "/processing/input/data/sub/b.csv"), "4");
  EXPECT_TRUE(fs::is_directory(opt_ml + "/processing/output/result"));
  const json config = json::parse(*ReadFile(opt_ml + "/config/processingjobconfig.json"));
  EXPECT_EQ(config["ProcessingJobArn"], "arn:aws:sagemaker:us-east-1:000000000000:processing-job/p1");
  EXPECT_EQ(config["ProcessingJobName"], "p1");
  EXPECT_TRUE(config.contains("NetworkConfig") && config["NetworkConfig"].is_null());
  const json resource = json::parse(*ReadFile(opt_ml + "/config/resourceconfig.json"));
  EXPECT_EQ(resource, json::parse(R"({"current_host":"algo-1","hosts":["algo-1"]})"));

  // How it was started.
  auto spec = runtime_->spec(Instance("p1"));
  ASSERT_TRUE(spec.has_value());
  EXPECT_EQ(spec->hostname, "algo-1");
  EXPECT_EQ(spec->opt_ml_dir, opt_ml);
  EXPECT_EQ(spec->argv, (std::vector<std::string>{"/bin/true", "--x", "1"}));
  EXPECT_EQ(spec->env.at("MY_SETTING"), "on");
  EXPECT_EQ(spec->env.at("AWS_REGION"), "us-east-1");
  EXPECT_EQ(spec->env.count("TRAINING_JOB_NAME"), 0u);
  EXPECT_FALSE(spec->env.at("AWS_ACCESS_KEY_ID").empty());
  EXPECT_EQ(spec->cpus.size(), 2u);
  EXPECT_TRUE(credentials_->Lookup(spec->env.at("AWS_ACCESS_KEY_ID")).has_value());

  // The hosts are recorded just after their launch.
  ASSERT_TRUE(WaitFor([&] { return Job("p1").state.hosts.size() == 1; }));
  const store::ProcessingJobRecord running = Job("p1");
  EXPECT_EQ(running.status, ProcessingJobStatus::kInProgress);
  ASSERT_EQ(running.state.hosts.size(), 1u);
  EXPECT_EQ(running.state.hosts[0].runtime_id, Instance("p1"));
  EXPECT_EQ(running.state.hosts[0].log_stream, "p1/algo-1-" + std::to_string(clock_.NowMillis() / 1000));
  EXPECT_TRUE(running.state.start_millis.has_value());
  EXPECT_EQ(running.state.allocation_ids, std::vector<std::string>{ProcessingGrantId("p1")});
  EXPECT_TRUE(scheduler_->Granted(ProcessingGrantId("p1")).has_value());

  // The program writes its results (a symlink among them), a message, and a log line; exits 0.
  Write(opt_ml + "/processing/output/result/train.csv", "t");
  Write(opt_ml + "/processing/output/result/nested/val.csv", "v");
  fs::create_symlink("/etc/passwd", opt_ml + "/processing/output/result/link");
  Write(opt_ml + "/output/message", "all good");
  ASSERT_TRUE(runtime_->WriteOutput(Instance("p1"), 'o', "processed 2 files").ok());
  ASSERT_TRUE(runtime_->Exit(Instance("p1"), 0).ok());

  const store::ProcessingJobRecord done = WaitForStatus("p1", ProcessingJobStatus::kCompleted);
  EXPECT_EQ(done.state.failure_reason, "");
  EXPECT_EQ(done.state.exit_message, "all good");
  EXPECT_TRUE(done.end_millis.has_value());
  EXPECT_EQ(done.state.hosts[0].exit_code, 0);
  EXPECT_EQ(Get("out/result/train.csv"), "t");
  EXPECT_EQ(Get("out/result/nested/val.csv"), "v");
  EXPECT_FALSE(Exists("out/result/link"));  // symlinks are not followed
  EXPECT_EQ(Lines(running.state.hosts[0].log_stream), std::vector<std::string>{"processed 2 files"});
  // Everything given back.
  EXPECT_TRUE(WaitFor([&] { return !scheduler_->Granted(ProcessingGrantId("p1")).has_value(); }));
  EXPECT_TRUE(WaitFor([&] { return !fs::exists(work_dir() + "/p1"); }));
  EXPECT_FALSE(credentials_->Lookup(spec->env.at("AWS_ACCESS_KEY_ID")).has_value());
}

TEST_F(ProcessingControllerTest, AFailedProgramFailsTheJobAndStillUploadsEndOfJobOutputs) {
  Put("in/a", "a");
  StartController();
  Create("p2");
  ASSERT_TRUE(WaitForLaunch("p2"));
  Write(OptMl("p2") + "/processing/output/result/partial.csv", "p");
  ASSERT_TRUE(runtime_->WriteOutput(Instance("p2"), 'e', "ValueError: bad column").ok());
  ASSERT_TRUE(runtime_->Exit(Instance("p2"), 3).ok());
  const auto failed = WaitForStatus("p2", ProcessingJobStatus::kFailed);
  EXPECT_EQ(failed.state.failure_reason, "AlgorithmError: ValueError: bad column, exit code: 3");
  EXPECT_EQ(failed.state.hosts[0].exit_code, 3);
  EXPECT_EQ(Get("out/result/partial.csv"), "p");
}

TEST_F(ProcessingControllerTest, FailureFileIsTheReasonAndBadUtf8MessageFailsACleanExit) {
  Put("in/a", "a");
  StartController();
  Create("p3");
  ASSERT_TRUE(WaitForLaunch("p3"));
  Write(OptMl("p3") + "/output/failure", "my own reason");
  ASSERT_TRUE(runtime_->Exit(Instance("p3"), 1).ok());
  EXPECT_EQ(WaitForStatus("p3", ProcessingJobStatus::kFailed).state.failure_reason, "my own reason");

  Create("p4");
  ASSERT_TRUE(WaitForLaunch("p4"));
  Write(OptMl("p4") + "/output/message", "caf\xc3");
  ASSERT_TRUE(runtime_->Exit(Instance("p4"), 0).ok());
  const auto failed = WaitForStatus("p4", ProcessingJobStatus::kFailed);
  EXPECT_EQ(failed.state.failure_reason.rfind("ClientError: /opt/ml/output/message", 0), 0u)
      << failed.state.failure_reason;
}

TEST_F(ProcessingControllerTest, StopSendsSigtermWithTheGraceAndEndsStoppedAfterUploading) {
  Put("in/a", "a");
  StartController();
  Create("p5");
  ASSERT_TRUE(WaitForLaunch("p5"));
  Write(OptMl("p5") + "/processing/output/result/so-far.csv", "s");
  StopJob("p5");
  const auto stopped = WaitForStatus("p5", ProcessingJobStatus::kStopped);
  EXPECT_EQ(stopped.state.stop_reason, "StopRequested");
  EXPECT_EQ(stopped.state.failure_reason, "");
  ASSERT_FALSE(runtime_->stops().empty());
  EXPECT_EQ(runtime_->stops()[0].instance_id, Instance("p5"));
  EXPECT_EQ(runtime_->stops()[0].grace, kStopGrace);
  EXPECT_EQ(Get("out/result/so-far.csv"), "s");  // EndOfJob outputs after a stop too
}

TEST_F(ProcessingControllerTest, MaxRuntimeStopsTheJob) {
  Put("in/a", "a");
  StartController();
  Create("p6", {{"StoppingCondition", {{"MaxRuntimeInSeconds", 60}}}});
  ASSERT_TRUE(WaitForLaunch("p6"));
  clock_.Advance(std::chrono::seconds(61));
  const auto stopped = WaitForStatus("p6", ProcessingJobStatus::kStopped);
  EXPECT_EQ(stopped.state.stop_reason, "MaxRuntimeExceeded");
  EXPECT_EQ(stopped.state.failure_reason, "");
  ASSERT_FALSE(runtime_->stops().empty());
  EXPECT_EQ(runtime_->stops()[0].grace, kStopGrace);
}

TEST_F(ProcessingControllerTest, JobsWaitForCapacityInOrderAndAWaitingJobStopsAtOnce) {
  Put("in/a", "a");
  StartController();
  Create("first");
  ASSERT_TRUE(WaitForLaunch("first"));
  Create("second");
  Create("third");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(runtime_->launches().size(), 1u);  // the node fits one
  StopJob("second");
  EXPECT_EQ(WaitForStatus("second", ProcessingJobStatus::kStopped).state.hosts.size(), 0u);
  ASSERT_TRUE(runtime_->Exit(Instance("first"), 0).ok());
  WaitForStatus("first", ProcessingJobStatus::kCompleted);
  ASSERT_TRUE(WaitForLaunch("third"));
  EXPECT_EQ(runtime_->launches(), (std::vector<std::string>{Instance("first"), Instance("third")}));
  ASSERT_TRUE(runtime_->Exit(Instance("third"), 0).ok());
  WaitForStatus("third", ProcessingJobStatus::kCompleted);
}

TEST_F(ProcessingControllerTest, ATypeThatNeverFitsFailsAtOnce) {
  StartController();
  Create("huge", {{"ProcessingResources", {{"ClusterConfig", {{"InstanceType", "ml.m5.24xlarge"}}}}}});
  const auto failed = WaitForStatus("huge", ProcessingJobStatus::kFailed);
  EXPECT_EQ(failed.state.failure_reason.rfind("ClientError: ", 0), 0u) << failed.state.failure_reason;
  EXPECT_TRUE(runtime_->launches().empty());
}

TEST_F(ProcessingControllerTest, MissingInputAndUnstartableProgramFailAsClientErrors) {
  StartController();
  Create("noinput", {{"ProcessingInputs",
                      {{{"InputName", "data"},
                        {"S3Input",
                         {{"S3Uri", "s3://bkt/missing"},
                          {"LocalPath", "/opt/ml/processing/input/data"},
                          {"S3DataType", "S3Prefix"},
                          {"S3InputMode", "File"}}}}}}});
  const auto failed = WaitForStatus("noinput", ProcessingJobStatus::kFailed);
  EXPECT_NE(failed.state.failure_reason.find("ClientError: No S3 objects found"), std::string::npos)
      << failed.state.failure_reason;

  Put("in/a", "a");
  FakeRuntime::Behavior cannot;
  cannot.on_launch = FakeRuntime::Behavior::OnLaunch::kFailLaunch;
  runtime_->AddRule(FakeRuntime::IdStartsWith(Instance("nolaunch")), cannot);
  Create("nolaunch");
  const auto unstartable = WaitForStatus("nolaunch", ProcessingJobStatus::kFailed);
  EXPECT_EQ(unstartable.state.failure_reason.rfind("ClientError: the processing program could not be started", 0), 0u)
      << unstartable.state.failure_reason;
  EXPECT_TRUE(WaitFor([&] { return !scheduler_->Granted(ProcessingGrantId("nolaunch")).has_value(); }));
}

TEST_F(ProcessingControllerTest, SeveralHostsShareByKeyNetworkAndFailWithTheFailedHost) {
  MakeScheduler(testing::SmallHost(4, 16));
  networks_ = std::make_unique<runtime::FakeNetworks>();
  for (const char* key : {"in/1", "in/2", "in/3", "in/4"}) Put(key, key);
  StartController();
  Create("multi", {{"ProcessingResources", {{"ClusterConfig", {{"InstanceCount", 2}}}}},
                   {"ProcessingInputs",
                    {{{"InputName", "data"},
                      {"S3Input",
                       {{"S3Uri", "s3://bkt/in"},
                        {"LocalPath", "/opt/ml/processing/input/data"},
                        {"S3DataType", "S3Prefix"},
                        {"S3InputMode", "File"},
                        {"S3DataDistributionType", "ShardedByS3Key"}}}}}}});
  ASSERT_TRUE(WaitForLaunch("multi", 1));
  ASSERT_TRUE(WaitForLaunch("multi", 2));
  EXPECT_TRUE(fs::exists(OptMl("multi", 1) + "/processing/input/data/1"));
  EXPECT_FALSE(fs::exists(OptMl("multi", 1) + "/processing/input/data/2"));
  EXPECT_TRUE(fs::exists(OptMl("multi", 2) + "/processing/input/data/2"));
  EXPECT_TRUE(fs::exists(OptMl("multi", 2) + "/processing/input/data/4"));
  const json resource = json::parse(*ReadFile(OptMl("multi", 2) + "/config/resourceconfig.json"));
  EXPECT_EQ(resource["current_host"], "algo-2");
  EXPECT_EQ(resource["hosts"], json({"algo-1", "algo-2"}));
  auto spec1 = runtime_->spec(Instance("multi", 1));
  auto spec2 = runtime_->spec(Instance("multi", 2));
  ASSERT_TRUE(spec1 && spec2);
  ASSERT_TRUE(spec1->network && spec2->network);
  EXPECT_NE(spec1->network->address, spec2->network->address);
  EXPECT_EQ(spec2->hostname, "algo-2");
  EXPECT_NE(
      std::find(spec1->hosts_file_lines.begin(), spec1->hosts_file_lines.end(), spec2->network->address + " algo-2"),
      spec1->hosts_file_lines.end());
  // Both hosts' outputs land under the same prefix.
  Write(OptMl("multi", 1) + "/processing/output/result/from-1", "1");
  Write(OptMl("multi", 2) + "/processing/output/result/from-2", "2");
  ASSERT_TRUE(runtime_->WriteOutput(Instance("multi", 2), 'e', "boom").ok());
  ASSERT_TRUE(runtime_->Exit(Instance("multi", 2), 1).ok());
  const auto failed = WaitForStatus("multi", ProcessingJobStatus::kFailed);
  EXPECT_EQ(failed.state.failure_reason, "AlgorithmError: boom, exit code: 1 (host algo-2)");
  EXPECT_EQ(Get("out/result/from-1"), "1");
  EXPECT_EQ(Get("out/result/from-2"), "2");
  // The healthy host was stopped as a stop does.
  bool stopped_algo1 = false;
  for (const auto& stop : runtime_->stops()) stopped_algo1 |= stop.instance_id == Instance("multi", 1);
  EXPECT_TRUE(stopped_algo1);
  const auto calls = networks_->calls();
  EXPECT_NE(std::find(calls.begin(), calls.end(), "remove processing-multi"), calls.end());
}

TEST_F(ProcessingControllerTest, ContinuousOutputsAreUploadedWhileRunning) {
  Put("in/a", "a");
  StartController();
  Create("cont", {{"ProcessingOutputConfig",
                   {{"Outputs",
                     {{{"OutputName", "live"},
                       {"S3Output",
                        {{"S3Uri", "s3://bkt/live"},
                         {"LocalPath", "/opt/ml/processing/output/live"},
                         {"S3UploadMode", "Continuous"}}}}}}}}});
  ASSERT_TRUE(WaitForLaunch("cont"));
  Write(OptMl("cont") + "/processing/output/live/step-1", "one");
  EXPECT_TRUE(WaitFor([&] { return Exists("live/step-1"); }));
  EXPECT_TRUE(runtime_->running(Instance("cont")));
  Write(OptMl("cont") + "/processing/output/live/step-2", "two");
  ASSERT_TRUE(runtime_->Exit(Instance("cont"), 0).ok());
  WaitForStatus("cont", ProcessingJobStatus::kCompleted);
  EXPECT_EQ(Get("live/step-2"), "two");  // the final pass
}

TEST_F(ProcessingControllerTest, PipeInputsAreFifosBesideLocalPath) {
  Put("in/a", "a");
  keep_host_dirs_ = true;
  StartController();
  Create("pipe", {{"ProcessingInputs",
                   {{{"InputName", "stream"},
                     {"S3Input",
                      {{"S3Uri", "s3://bkt/in"},
                       {"LocalPath", "/opt/ml/processing/input/stream"},
                       {"S3DataType", "S3Prefix"},
                       {"S3InputMode", "Pipe"}}}}}}});
  ASSERT_TRUE(WaitForLaunch("pipe"));
  struct stat st;
  ASSERT_EQ(stat((OptMl("pipe") + "/processing/input/stream_0").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  ASSERT_TRUE(runtime_->Exit(Instance("pipe"), 0).ok());
  WaitForStatus("pipe", ProcessingJobStatus::kCompleted);
}

TEST_F(ProcessingControllerTest, ARestartAdoptsARunningJob) {
  Put("in/a", "a");
  StartController();
  Create("adopt");
  ASSERT_TRUE(WaitForLaunch("adopt"));
  ASSERT_TRUE(runtime_->WriteOutput(Instance("adopt"), 'o', "before").ok());
  ASSERT_TRUE(WaitFor(
      [&] { return !Job("adopt").state.hosts.empty() && Lines(Job("adopt").state.hosts[0].log_stream).size() == 1; }));
  RestartController();
  EXPECT_TRUE(scheduler_->Granted(ProcessingGrantId("adopt")).has_value());  // re-reserved
  ASSERT_TRUE(runtime_->WriteOutput(Instance("adopt"), 'o', "after").ok());
  Write(OptMl("adopt") + "/processing/output/result/r", "r");
  ASSERT_TRUE(runtime_->Exit(Instance("adopt"), 0).ok());
  const auto done = WaitForStatus("adopt", ProcessingJobStatus::kCompleted);
  EXPECT_EQ(runtime_->launches().size(), 1u);  // not started again
  EXPECT_EQ(Lines(done.state.hosts[0].log_stream), (std::vector<std::string>{"before", "after"}));
  EXPECT_EQ(Get("out/result/r"), "r");
}

TEST_F(ProcessingControllerTest, ARestartFailsAJobWhoseInstancesAreGoneAndRequeuesOneThatNeverLaunched) {
  Put("in/a", "a");
  StartController();
  Create("gone");
  ASSERT_TRUE(WaitForLaunch("gone"));
  controller_.reset();
  runtime_->Vanish(Instance("gone"));
  Create("queued", json::object(), /*submit=*/false);  // a row the old server never got to
  RenewServerState();
  StartController();
  const auto failed = WaitForStatus("gone", ProcessingJobStatus::kFailed);
  EXPECT_NE(failed.state.failure_reason.find("Kiln restarted while the job ran"), std::string::npos)
      << failed.state.failure_reason;
  ASSERT_TRUE(WaitForLaunch("queued"));
  ASSERT_TRUE(runtime_->Exit(Instance("queued"), 0).ok());
  WaitForStatus("queued", ProcessingJobStatus::kCompleted);
}

TEST_F(ProcessingControllerTest, AStoppingJobThatNeverLaunchedEndsStoppedAtStart) {
  StartController();
  controller_.reset();
  Create("halted", json::object(), /*submit=*/false);
  store::ProcessingJobRepository jobs(db_.get());
  ASSERT_TRUE(jobs.Mutate("halted",
                          [](store::ProcessingJobRecord& r) {
                            r.status = ProcessingJobStatus::kStopping;
                            return Status::Ok();
                          })
                  .ok());
  RenewServerState();
  StartController();
  WaitForStatus("halted", ProcessingJobStatus::kStopped);
  EXPECT_TRUE(runtime_->launches().empty());
}

}  // namespace
}  // namespace kiln::control
