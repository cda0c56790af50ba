#include "control/training_controller.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <set>
#include <thread>

#include "base/fs.h"
#include "control/test_util/controller_fixture.h"
#include "control/training_launch.h"
#include "control/training_plan.h"
#include "control/training_states.h"
#include "runtime/test_util/fake_networks.h"

namespace kiln::control {
namespace {

using nlohmann::json;
using runtime::testing::FakeRuntime;
using store::SecondaryStatus;

// The state document as the row holds it (what these tests assert on predates the typed state).
json StateJson(const store::TrainingJobRecord& record) { return store::TrainingJobStateToJson(record.state); }

TEST(RecordSecondaryStatusTest, AppendsOnChangeAndReplacesMessageWithinAStatus) {
  store::TrainingJobRecord record;
  RecordSecondaryStatus(record, SecondaryStatus::kStarting, "Starting the training job", 1000);
  RecordSecondaryStatus(record, SecondaryStatus::kStarting, "Preparing the instances for training", 1500);
  RecordSecondaryStatus(record, SecondaryStatus::kDownloading, "Downloading input data", 2000);
  const json t = StateJson(record)["transitions"];
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0]["Status"], "Starting");
  EXPECT_EQ(t[0]["StartTime"], 1000);
  EXPECT_EQ(t[0]["EndTime"], 2000);  // closed when the status changed
  EXPECT_EQ(t[0]["StatusMessage"], "Preparing the instances for training");
  EXPECT_EQ(t[1]["Status"], "Downloading");
  EXPECT_FALSE(t[1].contains("EndTime"));
  EXPECT_EQ(record.secondary_status, SecondaryStatus::kDownloading);
  EXPECT_EQ(StateJson(record)["status_message"], "Downloading input data");
  EXPECT_EQ(record.last_modified_millis, 2000);
}

TEST(MetricDefinitionsFromJsonTest, TakesNameAndRegexAndSkipsJunk) {
  auto defs = MetricDefinitionsFromJson(json::parse(R"j([{"Name":"loss","Regex":"loss=(\\S+)"}, 3, {"Name":"acc"}])j"));
  ASSERT_EQ(defs.size(), 2u);
  EXPECT_EQ(defs[0].name, "loss");
  EXPECT_EQ(defs[0].regex, "loss=(\\S+)");
  EXPECT_EQ(defs[1].name, "acc");
  EXPECT_EQ(defs[1].regex, "");
  EXPECT_TRUE(MetricDefinitionsFromJson(json::object()).empty());
}

// ---------------------------------------------------------------------------------------------
// The controller over a fake runtime and clock (control/test_util/controller_fixture.h): what a
// training job goes through, from queue to terminal status, without processes or a server.

constexpr std::chrono::seconds kStopGrace{7};  // distinct from the default, to see it passed on

class TrainingControllerTest : public testing::ControllerTest {
 protected:
  void SetUp() override {
    ControllerTest::SetUp();
    MakeScheduler(testing::SmallHost(2, 8));  // fits one ml.m5.large
    illegal_before_ = IllegalTrainingTransitions();
  }
  void TearDown() override {
    controller_.reset();
    // Every phase and status change the test drove was one control/training_states.h allows.
    EXPECT_EQ(IllegalTrainingTransitions(), illegal_before_);
  }

  void StartController() {
    TrainingControllerOptions options;
    options.work_dir = work_dir();
    options.region = "us-east-1";
    options.endpoint_url = "http://127.0.0.1:1";
    options.stop_grace = kStopGrace;
    options.spot = spot_options_;
    options.remote_instances = remote_instances_;
    TrainingControllerDeps deps;
    deps.database = db_.get();
    deps.object_store = object_store_.get();
    deps.log_store = log_store_.get();
    deps.metric_store = metric_store_.get();
    deps.runtime = runtime_.get();
    deps.scheduler = scheduler_.get();
    deps.environments = environments_.get();
    deps.credentials = credentials_.get();
    deps.clock = &clock_;
    deps.networks = networks_decorator_ != nullptr ? networks_decorator_ : networks_.get();
    controller_ = std::make_unique<TrainingController>(options, deps);
    ASSERT_TRUE(controller_->Start().ok());
  }

  // A server restart: the controller goes (instances keep running), a new one adopts.
  void RestartController() {
    controller_.reset();
    RenewServerState();
    StartController();
  }

  // Inserts the job as CreateTrainingJob does and submits it.
  // `submit` false: only the row (a job a previous server left behind, for Start() to find).
  void Create(const std::string& name, const json& overrides = json::object(), bool submit = true) {
    json request = {{"TrainingJobName", name},
                    {"RoleArn", "arn:aws:iam::000000000000:role/r"},
                    {"AlgorithmSpecification", {{"TrainingImage", "local:/bin/true"}, {"TrainingInputMode", "File"}}},
                    {"ResourceConfig", {{"InstanceType", "ml.m5.large"}, {"InstanceCount", 1}, {"VolumeSizeInGB", 1}}},
                    {"OutputDataConfig", {{"S3OutputPath", "s3://bkt/out"}}},
                    {"StoppingCondition", {{"MaxRuntimeInSeconds", 3600}}}};
    request.merge_patch(overrides);
    store::TrainingJobRecord record;
    record.name = name;
    record.arn = "arn:aws:sagemaker:us-east-1:000000000000:training-job/" + name;
    record.request = request;
    record.status = store::TrainingJobStatus::kInProgress;  // phase: queued (the default)
    record.creation_millis = clock_.NowMillis();
    RecordSecondaryStatus(record, SecondaryStatus::kStarting, "Starting the training job", clock_.NowMillis());
    store::TrainingJobRepository jobs(db_.get());
    ASSERT_TRUE(jobs.Insert(record).ok());
    if (submit) controller_->Submit(name);
  }

  // StopTrainingJob as the API does it: the row says Stopping, then the controller is told.
  void StopJob(const std::string& name) {
    store::TrainingJobRepository jobs(db_.get());
    auto updated = jobs.Mutate(name, [&](store::TrainingJobRecord& r) {
      r.status = store::TrainingJobStatus::kStopping;
      r.state.stop_requested = store::StopRequest::kUser;
      RecordSecondaryStatus(r, SecondaryStatus::kStopping, "Stopping the training job", clock_.NowMillis());
      return Status::Ok();
    });
    ASSERT_TRUE(updated.ok());
    controller_->RequestStop(name);
  }

  store::TrainingJobRecord Job(const std::string& name) {
    store::TrainingJobRepository jobs(db_.get());
    auto r = jobs.Get(name);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : store::TrainingJobRecord{};
  }

  // Waits for the job's status (and secondary status, when given); returns the row.
  store::TrainingJobRecord WaitForStatus(const std::string& name, const std::string& status,
                                         const std::string& secondary = "") {
    store::TrainingJobRecord last;
    bool reached = WaitFor([&] {
      last = Job(name);
      return store::ToString(last.status) == status &&
             (secondary.empty() || store::ToString(last.secondary_status) == secondary);
    });
    EXPECT_TRUE(reached) << name << " is " << store::ToString(last.status) << "/"
                         << store::ToString(last.secondary_status) << " (" << last.state.failure_reason.value_or("")
                         << "), not " << status << "/" << secondary;
    return last;
  }

  static std::string Instance(const std::string& job) { return "training-" + job + "-algo-1"; }

  bool WaitForLaunch(const std::string& job) { return runtime_->WaitForLaunch(Instance(job), kPatience); }

  // Managed spot: secondary statuses in order, and the lines Kiln wrote into a stream.
  static std::vector<std::string> Secondaries(const store::TrainingJobRecord& record) {
    std::vector<std::string> out;
    for (const auto& t : record.state.transitions) out.emplace_back(store::ToString(t.status));
    return out;
  }
  std::vector<std::string> KilnLines(const std::string& stream) {
    observe::EventsQuery query;
    query.start_from_head = true;
    auto events = log_store_->GetEvents(kTrainingLogGroup, stream, query);
    std::vector<std::string> lines;
    if (!events.ok()) return lines;
    for (const auto& e : events->events) {
      if (e.message.starts_with("[kiln]")) lines.push_back(e.message);
    }
    return lines;
  }
  static json SpotJob(int64_t max_runtime, int64_t max_wait) {
    return {{"EnableManagedSpotTraining", true},
            {"StoppingCondition", {{"MaxRuntimeInSeconds", max_runtime}, {"MaxWaitTimeInSeconds", max_wait}}}};
  }

  SpotOptions spot_options_;
  bool remote_instances_ = false;  // TrainingControllerOptions::remote_instances (a Slurm runtime)
  std::unique_ptr<TrainingController> controller_;
  // Per-job networks; null (the default): hosts share the node's network.
  std::unique_ptr<runtime::FakeNetworks> networks_;
  runtime::InstanceNetworks* networks_decorator_ = nullptr;  // wraps networks_ when set
  int64_t illegal_before_ = 0;
};

// Fails the first `attach_failures` Attach calls, otherwise the fake.
class FailingAttach final : public runtime::InstanceNetworks {
 public:
  FailingAttach(runtime::InstanceNetworks* inner, int attach_failures)
      : inner_(inner), attach_failures_(attach_failures) {}
  Result<runtime::NetworkInfo> Ensure(const std::string& name, bool isolated) override {
    return inner_->Ensure(name, isolated);
  }
  Result<runtime::NetworkAttachment> Attach(const std::string& name, const std::string& id,
                                            const std::vector<int>& forwards) override {
    if (attach_failures_.fetch_sub(1) > 0) return Status::Internal("veth pool exhausted");
    return inner_->Attach(name, id, forwards);
  }
  Status Detach(const std::string& name, const std::string& id) override { return inner_->Detach(name, id); }
  Status Remove(const std::string& name) override { return inner_->Remove(name); }
  Result<std::set<std::string>> Sweep(const std::set<std::string>& live) override { return inner_->Sweep(live); }

 private:
  runtime::InstanceNetworks* const inner_;
  std::atomic<int> attach_failures_;
};

TEST_F(TrainingControllerTest, ExitZeroCompletesWithTheModelUploaded) {
  StartController();
  Create("ok");
  ASSERT_TRUE(WaitForLaunch("ok"));
  auto spec = runtime_->spec(Instance("ok"));
  ASSERT_TRUE(spec.has_value());
  EXPECT_EQ(spec->argv, (std::vector<std::string>{"/bin/true", "train"}));
  EXPECT_EQ(spec->hostname, "algo-1");
  EXPECT_EQ(spec->cpus.size(), 2u);
  EXPECT_EQ(spec->memory_limit_bytes, 8 * testing::kGiB);
  EXPECT_EQ(StateJson(WaitForStatus("ok", "InProgress", "Training")).value("phase", ""), "running");

  ASSERT_TRUE(runtime_->WriteOutput(Instance("ok"), 'o', "epoch 1 done").ok());
  ASSERT_TRUE(runtime_->Exit(Instance("ok"), 0).ok());
  auto done = WaitForStatus("ok", "Completed", "Completed");
  EXPECT_EQ(StateJson(done).value("phase", ""), "done");
  EXPECT_EQ(StateJson(done).value("model_artifacts", json()), "s3://bkt/out/ok/output/model.tar.gz");
  EXPECT_TRUE(object_store_->HeadObject("bkt", "out/ok/output/model.tar.gz").ok());
  // The instance is forgotten and the capacity given back.
  EXPECT_TRUE(WaitFor([&] { return !runtime_->Inspect(Instance("ok")).ok(); }));
  EXPECT_TRUE(WaitFor([&] { return !scheduler_->Granted("ok").has_value(); }));
  // The captured line reached the job's log stream.
  EXPECT_EQ(StateJson(done)["hosts"].size(), 1u);
}

TEST_F(TrainingControllerTest, NonZeroExitFailsWithTheLastErrorLine) {
  StartController();
  Create("bad");
  ASSERT_TRUE(WaitForLaunch("bad"));
  ASSERT_TRUE(runtime_->WriteOutput(Instance("bad"), 'e', "ValueError: learning rate must be positive").ok());
  ASSERT_TRUE(runtime_->Exit(Instance("bad"), 2).ok());
  auto failed = WaitForStatus("bad", "Failed", "Failed");
  EXPECT_EQ(StateJson(failed).value("failure_reason", ""),
            "AlgorithmError: ValueError: learning rate must be positive, exit code: 2");
}

TEST_F(TrainingControllerTest, TheFailureFileIsTheFailureReason) {
  StartController();
  Create("file");
  ASSERT_TRUE(WaitForLaunch("file"));
  const std::string opt_ml = runtime_->spec(Instance("file"))->opt_ml_dir;
  ASSERT_TRUE(MakeDirs(opt_ml + "/output", 0755).ok());
  std::ofstream(opt_ml + "/output/failure") << "my own reason";
  ASSERT_TRUE(runtime_->Exit(Instance("file"), 1).ok());
  EXPECT_EQ(StateJson(WaitForStatus("file", "Failed")).value("failure_reason", ""), "my own reason");
}

TEST_F(TrainingControllerTest, KilledBySigkillIsOutOfMemory) {
  StartController();
  Create("oom");
  ASSERT_TRUE(WaitForLaunch("oom"));
  ASSERT_TRUE(runtime_->Kill(Instance("oom"), SIGKILL).ok());
  EXPECT_THAT(StateJson(WaitForStatus("oom", "Failed")).value("failure_reason", ""),
              ::testing::StartsWith("OutOfMemory: "));
}

// A SIGKILL the runtime attributes to the kernel's OOM killer (the container engine's OOMKilled)
// says so; a lost instance whose runtime knows why says that (issue 15).
TEST_F(TrainingControllerTest, TheOomKillerAndALostReasonAreNamedInTheFailureReason) {
  StartController();
  Create("oomk");
  ASSERT_TRUE(WaitForLaunch("oomk"));
  ASSERT_TRUE(runtime_->KillByOom(Instance("oomk")).ok());
  EXPECT_EQ(StateJson(WaitForStatus("oomk", "Failed")).value("failure_reason", ""),
            "OutOfMemory: Please use an instance type with more memory, or reduce the memory used by the training "
            "program. The process on algo-1 was killed by the kernel's OOM killer.");
  Create("gone");
  ASSERT_TRUE(WaitForLaunch("gone"));
  ASSERT_TRUE(runtime_->Lose(Instance("gone"), "the container engine no longer knows container kiln-1-x").ok());
  EXPECT_EQ(StateJson(WaitForStatus("gone", "Failed")).value("failure_reason", ""),
            "InternalServerError: the instance algo-1 was lost: the container engine no longer knows container "
            "kiln-1-x.");
}

// ---- Container images (issue 15): images the operator sends to the engine ----

constexpr char kByoImage[] = "registry.local/byo-train:1";

TEST_F(TrainingControllerTest, AContainerImageIsPreparedThenRunsItsEntrypointWithTrain) {
  environments_->SetContainerImages({"registry.local/*"});
  std::atomic<bool> release{false};
  runtime_->SetPrepareImage([&](const runtime::ContainerImage& image,
                                const std::function<void(const std::string&)>& progress,
                                const std::function<bool()>& cancelled) {
    progress("pulling " + image.requested + ": 10%");
    progress("pulling " + image.requested + ": 20%");  // within the second: not written
    const auto give_up = std::chrono::steady_clock::now() + kPatience;
    while (!release.load() && !cancelled() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return Status::Ok();
  });
  StartController();
  Create("byo", {{"AlgorithmSpecification", {{"TrainingImage", kByoImage}}}, {"Environment", {{"MY_VAR", "1"}}}});
  // While it pulls, the job is Downloading with the pull's progress.
  std::string message;
  EXPECT_TRUE(WaitFor([&] {
    auto job = Job("byo");
    message = job.state.status_message;
    return job.secondary_status == SecondaryStatus::kDownloading && message.find("10%") != std::string::npos;
  })) << message;
  EXPECT_EQ(message,
            "Downloading the training image registry.local/byo-train:1: pulling registry.local/byo-train:1: 10%");
  EXPECT_TRUE(runtime_->launches().empty());
  release = true;
  ASSERT_TRUE(WaitForLaunch("byo"));
  ASSERT_EQ(runtime_->prepared_images().size(), 1u);
  EXPECT_EQ(runtime_->prepared_images()[0].requested, kByoImage);
  auto spec = runtime_->spec(Instance("byo"));
  ASSERT_TRUE(spec.has_value());
  ASSERT_TRUE(spec->container.has_value());
  EXPECT_EQ(spec->container->requested, kByoImage);
  EXPECT_EQ(spec->container->reference, "");
  EXPECT_FALSE(spec->container->entrypoint.has_value());
  EXPECT_EQ(spec->argv, (std::vector<std::string>{"train"}));
  EXPECT_EQ(spec->working_dir, "");
  EXPECT_EQ(spec->env.count("PATH"), 0u);
  EXPECT_EQ(spec->env.at("MY_VAR"), "1");
  EXPECT_EQ(spec->env.at("TRAINING_JOB_NAME"), "byo");
  EXPECT_TRUE(spec->extra_mounts.empty());
  EXPECT_EQ(spec->hostname, "algo-1");
  EXPECT_EQ(spec->cpus.size(), 2u);
  WaitForStatus("byo", "InProgress", "Training");
  ASSERT_TRUE(runtime_->Exit(Instance("byo"), 0).ok());
  WaitForStatus("byo", "Completed", "Completed");
}

TEST_F(TrainingControllerTest, AContainerImagesEntrypointAndArgumentsReachTheSpec) {
  environments_->SetContainerImages({"registry.local/*"});
  StartController();
  Create("ep", {{"AlgorithmSpecification",
                 {{"TrainingImage", kByoImage},
                  {"ContainerEntrypoint", {"python3", "-m", "trainer"}},
                  {"ContainerArguments", {"--epochs", "2"}}}}});
  ASSERT_TRUE(WaitForLaunch("ep"));
  auto spec = runtime_->spec(Instance("ep"));
  ASSERT_TRUE(spec.has_value() && spec->container.has_value());
  EXPECT_EQ(spec->container->entrypoint, (std::vector<std::string>{"python3", "-m", "trainer"}));
  EXPECT_EQ(spec->argv, (std::vector<std::string>{"--epochs", "2"}));
}

TEST_F(TrainingControllerTest, LocalImagesNeverGoToTheEngineWhateverThePatterns) {
  environments_->SetContainerImages({"*"});
  StartController();
  Create("host");
  ASSERT_TRUE(WaitForLaunch("host"));
  EXPECT_FALSE(runtime_->spec(Instance("host"))->container.has_value());
  EXPECT_EQ(runtime_->spec(Instance("host"))->argv, (std::vector<std::string>{"/bin/true", "train"}));
  EXPECT_EQ(runtime_->spec(Instance("host"))->env.count("PATH"), 1u);
  EXPECT_TRUE(runtime_->prepared_images().empty());
}

TEST_F(TrainingControllerTest, AMissingContainerImageFailsTheJobBeforeAnythingRuns) {
  environments_->SetContainerImages({"registry.local/*"});
  runtime_->SetPrepareImage([](const runtime::ContainerImage& image, const std::function<void(const std::string&)>&,
                               const std::function<bool()>&) {
    return Status::NotFound("image " + image.requested +
                            " is not in the container engine and registry.local has no such repository");
  });
  StartController();
  Create("missing", {{"AlgorithmSpecification", {{"TrainingImage", "registry.local/nope:1"}}},
                     {"RetryStrategy", {{"MaximumRetryAttempts", 2}}}});
  auto failed = WaitForStatus("missing", "Failed", "Failed");
  EXPECT_EQ(failed.state.failure_reason.value_or(""),
            "ClientError: image registry.local/nope:1 is not in the container engine and registry.local has no such "
            "repository");
  EXPECT_EQ(runtime_->launch_attempts(), 0);
  EXPECT_EQ(runtime_->prepared_images().size(), 1u);  // the user's image: not retried
  EXPECT_TRUE(WaitFor([&] { return !scheduler_->Granted("missing").has_value(); }));
}

TEST_F(TrainingControllerTest, AnUnreachableEngineIsKilnsFailureAndRetried) {
  environments_->SetContainerImages({"registry.local/*"});
  std::atomic<int> calls{0};
  runtime_->SetPrepareImage([&](const runtime::ContainerImage&, const std::function<void(const std::string&)>&,
                                const std::function<bool()>&) {
    if (calls.fetch_add(1) == 0) {
      return Status::Unavailable("the container engine at unix:///run/podman/podman.sock is unreachable");
    }
    return Status::Ok();
  });
  StartController();
  Create("flaky", {{"AlgorithmSpecification", {{"TrainingImage", kByoImage}}},
                   {"RetryStrategy", {{"MaximumRetryAttempts", 1}}}});
  ASSERT_TRUE(WaitForLaunch("flaky"));
  EXPECT_EQ(calls.load(), 2);
  auto job = Job("flaky");
  EXPECT_EQ(StateJson(job).value("retries", 0), 1);
  EXPECT_THAT(StateJson(job).value("last_failure", ""),
              ::testing::StartsWith("InternalServerError: the container engine at unix:///run/podman/podman.sock"));
}

TEST_F(TrainingControllerTest, AStopWhilePullingEndsTheJobStoppedWithNothingLaunched) {
  environments_->SetContainerImages({"registry.local/*"});
  std::atomic<bool> pulling{false};
  runtime_->SetPrepareImage([&](const runtime::ContainerImage&, const std::function<void(const std::string&)>&,
                                const std::function<bool()>& cancelled) {
    pulling = true;
    const auto give_up = std::chrono::steady_clock::now() + kPatience;
    while (!cancelled() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return cancelled() ? Status::Aborted("the pull was cancelled") : Status::Ok();
  });
  StartController();
  Create("halt", {{"AlgorithmSpecification", {{"TrainingImage", kByoImage}}}});
  ASSERT_TRUE(WaitFor([&] { return pulling.load(); }));
  StopJob("halt");
  WaitForStatus("halt", "Stopped", "Stopped");
  EXPECT_EQ(runtime_->launch_attempts(), 0);
}

TEST_F(TrainingControllerTest, LaunchFailureFailsTheJobWithTheRuntimesMessage) {
  FakeRuntime::Behavior broken;
  broken.on_launch = FakeRuntime::Behavior::OnLaunch::kFailLaunch;
  broken.launch_error = "cannot execute /opt/x/train: Permission denied";
  runtime_->AddRule(FakeRuntime::IdStartsWith(Instance("nolaunch")), broken);
  StartController();
  Create("nolaunch");
  auto failed = WaitForStatus("nolaunch", "Failed", "Failed");
  EXPECT_THAT(StateJson(failed).value("failure_reason", ""),
              ::testing::StartsWith("ClientError: the training program could not be started on algo-1: cannot "
                                    "execute /opt/x/train: Permission denied."));
  EXPECT_TRUE(runtime_->launches().empty());
  EXPECT_TRUE(WaitFor([&] { return !scheduler_->Granted("nolaunch").has_value(); }));
}

TEST_F(TrainingControllerTest, ALostInstanceIsRetriedUnderRetryStrategy) {
  StartController();
  Create("retry", {{"RetryStrategy", {{"MaximumRetryAttempts", 1}}}});
  ASSERT_TRUE(WaitForLaunch("retry"));
  ASSERT_TRUE(runtime_->Lose(Instance("retry")).ok());  // InternalServerError: retried
  ASSERT_TRUE(runtime_->WaitForLaunchNumber(2, kPatience).has_value());
  auto job = Job("retry");
  EXPECT_EQ(StateJson(job).value("retries", 0), 1);
  bool restarted = false;
  for (const json& t : json(StateJson(job)["transitions"])) restarted |= t.value("Status", "") == "Restarting";
  EXPECT_TRUE(restarted);
  // The second attempt is lost too: no attempts left.
  ASSERT_TRUE(WaitFor([&] { return runtime_->running(Instance("retry")); }));
  ASSERT_TRUE(runtime_->Lose(Instance("retry")).ok());
  EXPECT_THAT(StateJson(WaitForStatus("retry", "Failed")).value("failure_reason", ""),
              ::testing::StartsWith("InternalServerError: the instance algo-1 was lost"));
  EXPECT_EQ(runtime_->launches().size(), 2u);
}

TEST_F(TrainingControllerTest, AFailingHostStopsItsPeersAndFailsTheJob) {
  MakeScheduler(testing::SmallHost(4, 16));
  StartController();
  Create("peer", {{"ResourceConfig", {{"InstanceCount", 2}}}});
  ASSERT_TRUE(WaitForLaunch("peer"));
  ASSERT_TRUE(runtime_->WaitForLaunch("training-peer-algo-2", kPatience));
  EXPECT_EQ(runtime_->spec("training-peer-algo-2")->hostname, "algo-2");
  // Without networks the hosts share the node's network, as before issue 14.
  EXPECT_FALSE(runtime_->spec("training-peer-algo-2")->network.has_value());
  EXPECT_EQ(runtime_->spec("training-peer-algo-2")->hosts_file_lines, HostsFileLines({"algo-1", "algo-2"}));
  EXPECT_EQ(runtime_->spec(Instance("peer"))->env.at("KILN_RSH_TOKEN").size(), 64u);
  WaitForStatus("peer", "InProgress", "Training");
  ASSERT_TRUE(runtime_->WriteOutput("training-peer-algo-2", 'e', "RuntimeError: rank 1 crashed").ok());
  ASSERT_TRUE(runtime_->Exit("training-peer-algo-2", 1).ok());
  auto failed = WaitForStatus("peer", "Failed");
  auto stops = runtime_->stops();
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].instance_id, Instance("peer"));
  EXPECT_EQ(stops[0].grace, kStopGrace);
  EXPECT_THAT(StateJson(failed).value("failure_reason", ""), ::testing::StartsWith("AlgorithmError: "));
}

// When algo-2 fails Kiln stops algo-1 (SIGTERM): the reason is algo-2's error, not algo-1's exit
// 143 (hosts that ended on their own come first), and it names algo-2 (issue 14).
TEST_F(TrainingControllerTest, TheFailureReasonNamesTheHostThatFailedNotThePeerKilnStopped) {
  MakeScheduler(testing::SmallHost(4, 16));
  StartController();
  Create("peer", {{"ResourceConfig", {{"InstanceCount", 2}}}});
  ASSERT_TRUE(runtime_->WaitForLaunch("training-peer-algo-2", kPatience));
  WaitForStatus("peer", "InProgress", "Training");
  ASSERT_TRUE(runtime_->WriteOutput("training-peer-algo-2", 'e', "RuntimeError: rank 1 crashed").ok());
  ASSERT_TRUE(runtime_->Exit("training-peer-algo-2", 1).ok());
  EXPECT_EQ(StateJson(WaitForStatus("peer", "Failed")).value("failure_reason", ""),
            "AlgorithmError: RuntimeError: rank 1 crashed, exit code: 1 (host algo-2)");
}

// Issue 14: with networks, a job gets network training-<job>, each host an address on it in
// order, /etc/hosts naming every host's address, Kiln's port forwarded; disjoint CPUs, one
// shared rsh token. A host failing fails the job naming it, stops its peer, and removes the network.
TEST_F(TrainingControllerTest, NamespacedHostsGetAddressesOnTheJobsNetworkWhichGoesWithTheJob) {
  networks_ = std::make_unique<runtime::FakeNetworks>();
  MakeScheduler(testing::SmallHost(4, 16));
  StartController();
  Create("dist", {{"ResourceConfig", {{"InstanceCount", 2}}}});
  ASSERT_TRUE(runtime_->WaitForLaunch("training-dist-algo-2", kPatience));
  WaitForStatus("dist", "InProgress", "Training");
  EXPECT_EQ(networks_->calls(), (std::vector<std::string>{"remove training-dist", "ensure training-dist",
                                                          "attach training-dist training-dist-algo-1",
                                                          "attach training-dist training-dist-algo-2"}));
  auto one = runtime_->spec("training-dist-algo-1");
  auto two = runtime_->spec("training-dist-algo-2");
  ASSERT_TRUE(one && two);
  ASSERT_TRUE(one->network.has_value());
  ASSERT_TRUE(two->network.has_value());
  EXPECT_EQ(one->network->network, "training-dist");
  EXPECT_EQ(one->network->address, "127.0.1.2");
  EXPECT_EQ(two->network->address, "127.0.1.3");
  EXPECT_EQ(one->network->interface_name, "eth0");
  EXPECT_FALSE(one->network->isolated);
  EXPECT_EQ(one->network->loopback_forwards, std::vector<int>{1});  // Kiln's endpoint http://127.0.0.1:1
  const std::vector<std::string> hosts = NamespacedHostsFileLines({{"algo-1", "127.0.1.2"}, {"algo-2", "127.0.1.3"}});
  EXPECT_EQ(one->hosts_file_lines, hosts);
  EXPECT_EQ(two->hosts_file_lines, hosts);
  EXPECT_THAT(hosts, ::testing::Contains("127.0.1.3 algo-2"));
  // Gang: both hosts at once, CPU sets disjoint.
  EXPECT_EQ(one->cpus.size(), 2u);
  EXPECT_EQ(two->cpus.size(), 2u);
  for (int cpu : one->cpus) EXPECT_THAT(two->cpus, ::testing::Not(::testing::Contains(cpu)));
  // The MPI remote launch's token: the same on every host of the job.
  EXPECT_EQ(one->env.at("KILN_RSH_TOKEN").size(), 64u);
  EXPECT_EQ(one->env.at("KILN_RSH_TOKEN"), two->env.at("KILN_RSH_TOKEN"));
  EXPECT_EQ(one->env.at("AWS_ENDPOINT_URL"), "http://127.0.0.1:1");  // reached through the forward

  ASSERT_TRUE(runtime_->WriteOutput("training-dist-algo-2", 'e', "RuntimeError: rank 1 crashed").ok());
  ASSERT_TRUE(runtime_->Exit("training-dist-algo-2", 1).ok());
  auto failed = WaitForStatus("dist", "Failed");
  EXPECT_THAT(StateJson(failed).value("failure_reason", ""), ::testing::HasSubstr("algo-2"));
  auto stops = runtime_->stops();
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].instance_id, "training-dist-algo-1");
  EXPECT_TRUE(WaitFor([&] { return !networks_->Exists("training-dist"); }));
  EXPECT_EQ(networks_->calls().back(), "remove training-dist");
}

TEST_F(TrainingControllerTest, AnIsolatedJobsNetworkIsIsolatedAndForwardsNothing) {
  networks_ = std::make_unique<runtime::FakeNetworks>();
  StartController();
  Create("iso", {{"EnableNetworkIsolation", true}});
  ASSERT_TRUE(WaitForLaunch("iso"));
  auto spec = runtime_->spec(Instance("iso"));
  ASSERT_TRUE(spec && spec->network.has_value());
  EXPECT_TRUE(spec->network->isolated);
  EXPECT_TRUE(spec->network->loopback_forwards.empty());
  ASSERT_TRUE(runtime_->Exit(Instance("iso"), 0).ok());
  WaitForStatus("iso", "Completed");
  EXPECT_TRUE(WaitFor([&] { return !networks_->Exists("training-iso"); }));
}

TEST_F(TrainingControllerTest, ANetworkThatCannotBeCreatedFailsTheJobSayingWhatToWiden) {
  networks_ = std::make_unique<runtime::FakeNetworks>();
  networks_->FailNext(Status::ResourceExhausted("no free /24 subnet left in network.cidr 10.213.0.0/16"));
  StartController();
  Create("full");
  auto failed = WaitForStatus("full", "Failed", "Failed");
  const std::string reason = StateJson(failed).value("failure_reason", "");
  EXPECT_THAT(reason, ::testing::StartsWith("InternalServerError: the job's network training-full could not be "
                                            "created: no free /24 subnet"));
  EXPECT_THAT(reason, ::testing::HasSubstr("Widen network.cidr"));
  EXPECT_TRUE(runtime_->launches().empty());
  EXPECT_TRUE(WaitFor([&] { return networks_->calls().back() == "remove training-full"; }));
}

TEST_F(TrainingControllerTest, AHostThatCannotJoinTheNetworkIsRetriedOnAFreshNetwork) {
  networks_ = std::make_unique<runtime::FakeNetworks>();
  FailingAttach failing(networks_.get(), 1);
  networks_decorator_ = &failing;
  StartController();
  // The first Attach fails: Kiln's failure, retried under RetryStrategy on a fresh network.
  Create("flaky", {{"RetryStrategy", {{"MaximumRetryAttempts", 1}}}});
  ASSERT_TRUE(WaitForLaunch("flaky"));
  std::vector<std::string> calls = networks_->calls();
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "ensure training-flaky"), 2);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "remove training-flaky"), 3);  // prepare, cleanup, prepare
  EXPECT_THAT(Job("flaky").state.last_failure.value_or(""),
              ::testing::HasSubstr("algo-1 could not join the job's network training-flaky: veth pool exhausted."));
  ASSERT_TRUE(runtime_->Exit(Instance("flaky"), 0).ok());
  WaitForStatus("flaky", "Completed");
  controller_.reset();  // before `failing` goes
}

TEST_F(TrainingControllerTest, AnAdoptedJobsNetworkIsRemovedWhenItEnds) {
  networks_ = std::make_unique<runtime::FakeNetworks>();
  StartController();
  Create("kept");
  ASSERT_TRUE(WaitForLaunch("kept"));
  WaitForStatus("kept", "InProgress", "Training");
  RestartController();  // the networks outlive the server (state on disk)
  EXPECT_TRUE(networks_->Exists("training-kept"));
  ASSERT_TRUE(WaitFor([&] { return scheduler_->Granted("kept").has_value(); }));
  ASSERT_TRUE(runtime_->Exit(Instance("kept"), 0).ok());
  WaitForStatus("kept", "Completed");
  EXPECT_TRUE(WaitFor([&] { return !networks_->Exists("training-kept"); }));
  EXPECT_EQ(networks_->Leases("training-kept").size(), 0u);
}

// Spec §12.2: more MPI processes per host than its GPUs is accepted, with a warning in the
// Training status message; each host gets GPUs of its own.
TEST_F(TrainingControllerTest, MoreMpiProcessesThanGpusIsAcceptedWithAWarning) {
  HostCapacity host = testing::SmallHost(16, 64);
  for (int i = 0; i < 2; ++i)
    host.gpus.push_back({i, "GPU-" + std::to_string(i), "NVIDIA A10G", 24 * testing::kGiB, "", i});
  MakeScheduler(host);
  StartController();
  Create("ppn",
         {{"ResourceConfig", {{"InstanceType", "ml.g5.xlarge"}, {"InstanceCount", 2}}},
          {"HyperParameters", {{"sagemaker_mpi_enabled", "true"}, {"sagemaker_mpi_num_of_processes_per_host", "4"}}}});
  ASSERT_TRUE(runtime_->WaitForLaunch("training-ppn-algo-2", kPatience));
  auto training = WaitForStatus("ppn", "InProgress", "Training");
  EXPECT_THAT(StateJson(training).value("status_message", ""),
              ::testing::HasSubstr("warning: sagemaker_mpi_num_of_processes_per_host is 4 but each host has 1 GPU"));
  EXPECT_EQ(runtime_->spec("training-ppn-algo-1")->gpus, std::vector<int>{0});
  EXPECT_EQ(runtime_->spec("training-ppn-algo-2")->gpus, std::vector<int>{1});
  EXPECT_EQ(runtime_->spec("training-ppn-algo-2")->env.at("CUDA_VISIBLE_DEVICES"), "1");
}

TEST_F(TrainingControllerTest, TwoJobsOnAHostThatFitsOneRunOneAfterTheOther) {
  StartController();
  Create("first");
  ASSERT_TRUE(WaitForLaunch("first"));
  Create("second");
  auto waiting = WaitForStatus("second", "InProgress", "Pending");
  EXPECT_THAT(StateJson(waiting).value("status_message", ""), ::testing::StartsWith("Waiting for compute capacity"));
  EXPECT_EQ(runtime_->launches(), std::vector<std::string>{Instance("first")});

  ASSERT_TRUE(runtime_->Exit(Instance("first"), 0).ok());
  ASSERT_TRUE(WaitForLaunch("second"));
  EXPECT_EQ(WaitForStatus("first", "Completed").status, store::TrainingJobStatus::kCompleted);
  // A job that waited goes from Pending straight to Downloading, then Training.
  auto second = WaitForStatus("second", "InProgress", "Training");
  std::vector<std::string> secondary;
  for (const json& t : json(StateJson(second)["transitions"])) secondary.push_back(t.value("Status", ""));
  EXPECT_EQ(secondary, (std::vector<std::string>{"Starting", "Pending", "Downloading", "Training"}));
  ASSERT_TRUE(runtime_->Exit(Instance("second"), 0).ok());
  WaitForStatus("second", "Completed");
  EXPECT_EQ(runtime_->launches(), (std::vector<std::string>{Instance("first"), Instance("second")}));
}

TEST_F(TrainingControllerTest, AQueuedJobWritesPendingOnceAndItsPlaceInLineIsReadLive) {
  // Issue 11: a pass used to rewrite every queued row with its place in line. Now a waiting
  // job's row is written once as it enters Pending; its place is the queue's, read when rendered.
  StartController();
  Create("runs");
  ASSERT_TRUE(WaitForLaunch("runs"));
  Create("w1");
  Create("w2");
  Create("w3");
  auto w3 = WaitForStatus("w3", "InProgress", "Pending");
  WaitForStatus("w1", "InProgress", "Pending");
  EXPECT_EQ(
      StateJson(w3).value("status_message", ""),
      "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB; 0 of 2 vCPUs free, 0 GiB of 8 GiB free");
  EXPECT_EQ(controller_->PendingMessage("w3"),
            "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB; 0 of 2 vCPUs free, 0 GiB of 8 GiB free "
            "(2 jobs ahead)");
  const int64_t w3_version = w3.version;

  // "runs" ends, w1 is granted: w3 moves up in line without its row being written.
  ASSERT_TRUE(runtime_->Exit(Instance("runs"), 0).ok());
  ASSERT_TRUE(WaitForLaunch("w1"));
  ASSERT_TRUE(WaitFor([&] { return controller_->PendingMessage("w3").ends_with("(1 job ahead)"); }));
  WaitForStatus("runs", "Completed");
  EXPECT_EQ(Job("w3").version, w3_version);
  EXPECT_EQ(Job("w3").secondary_status, SecondaryStatus::kPending);
  EXPECT_EQ(controller_->PendingMessage("w1"), "");  // granted: not queued any more

  ASSERT_TRUE(runtime_->Exit(Instance("w1"), 0).ok());
  ASSERT_TRUE(WaitForLaunch("w2"));
  ASSERT_TRUE(runtime_->Exit(Instance("w2"), 0).ok());
  ASSERT_TRUE(WaitForLaunch("w3"));
  ASSERT_TRUE(runtime_->Exit(Instance("w3"), 0).ok());
  auto done = WaitForStatus("w3", "Completed");
  std::vector<std::string> secondary;
  std::string pending_message;
  for (const json& t : json(StateJson(done)["transitions"])) {
    secondary.push_back(t.value("Status", ""));
    if (t.value("Status", "") == "Pending") pending_message = t.value("StatusMessage", "");
  }
  EXPECT_EQ(secondary,
            (std::vector<std::string>{"Starting", "Pending", "Downloading", "Training", "Uploading", "Completed"}));
  EXPECT_EQ(
      pending_message,
      "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB; 0 of 2 vCPUs free, 0 GiB of 8 GiB free");
}

TEST_F(TrainingControllerTest, MaxPendingTimeStopsAJobStillWaiting) {
  StartController();
  Create("runs");
  ASSERT_TRUE(WaitForLaunch("runs"));
  Create("impatient", {{"StoppingCondition", {{"MaxRuntimeInSeconds", 3600}, {"MaxPendingTimeInSeconds", 7200}}}});
  WaitForStatus("impatient", "InProgress", "Pending");
  clock_.Advance(std::chrono::seconds(7201));
  // Checked on the scheduler's next wake (at most 5 s); a submission wakes it at once.
  Create("later");
  auto stopped = WaitForStatus("impatient", "Stopped", "Stopped");
  EXPECT_EQ(StateJson(stopped)["transitions"].back().value("StatusMessage", ""),
            "Job stopped because max pending time was exceeded");
  EXPECT_FALSE(scheduler_->IsQueued("impatient"));
  EXPECT_TRUE(scheduler_->IsQueued("later"));
}

TEST_F(TrainingControllerTest, ASmallerLaterJobWaitsBehindTheHeadOfTheQueue) {
  MakeScheduler(testing::SmallHost(6, 64));
  StartController();
  Create("big1", {{"ResourceConfig", {{"InstanceType", "ml.m5.xlarge"}}}});  // 4 of 6 vCPUs
  ASSERT_TRUE(WaitForLaunch("big1"));
  Create("big2", {{"ResourceConfig", {{"InstanceType", "ml.m5.xlarge"}}}});  // does not fit now
  WaitForStatus("big2", "InProgress", "Pending");
  Create("small", {{"ResourceConfig", {{"InstanceType", "ml.m5.large"}}}});  // 2 vCPUs: would fit
  // Once it shows Pending, the pass that considered it has granted nothing to it.
  WaitForStatus("small", "InProgress", "Pending");
  EXPECT_EQ(runtime_->launches(), std::vector<std::string>{Instance("big1")});

  ASSERT_TRUE(runtime_->Exit(Instance("big1"), 0).ok());
  ASSERT_TRUE(WaitForLaunch("big2"));
  ASSERT_TRUE(WaitForLaunch("small"));  // granted in the same pass, beside big2 (4 + 2 vCPUs)
  EXPECT_THAT(runtime_->launches(),
              ::testing::UnorderedElementsAre(Instance("big1"), Instance("big2"), Instance("small")));
}

TEST_F(TrainingControllerTest, StopWhilePendingEndsStoppedWithoutLaunching) {
  StartController();
  Create("runs");
  ASSERT_TRUE(WaitForLaunch("runs"));
  Create("waits");
  WaitForStatus("waits", "InProgress", "Pending");
  StopJob("waits");
  auto stopped = WaitForStatus("waits", "Stopped", "Stopped");
  EXPECT_EQ(StateJson(stopped).value("phase", ""), "done");
  EXPECT_FALSE(scheduler_->IsQueued("waits"));
  EXPECT_TRUE(runtime_->stops().empty());
  ASSERT_TRUE(runtime_->Exit(Instance("runs"), 0).ok());
  WaitForStatus("runs", "Completed");
  EXPECT_FALSE(runtime_->Launched(Instance("waits")));
}

TEST_F(TrainingControllerTest, StopWhileTrainingStopsTheInstanceWithTheConfiguredGrace) {
  StartController();
  Create("train");
  ASSERT_TRUE(WaitForLaunch("train"));
  WaitForStatus("train", "InProgress", "Training");
  StopJob("train");
  auto stopped = WaitForStatus("train", "Stopped", "Stopped");
  auto stops = runtime_->stops();
  ASSERT_FALSE(stops.empty());
  EXPECT_EQ(stops[0].instance_id, Instance("train"));
  EXPECT_EQ(stops[0].grace, kStopGrace);
  // A stopped job still uploads what it wrote (training-contract.md §11).
  EXPECT_TRUE(StateJson(stopped).contains("model_artifacts"));
}

TEST_F(TrainingControllerTest, AStopIgnoredUntilTheGraceEndsStaysStopping) {
  FakeRuntime::Behavior stubborn;
  stubborn.hangs_on_stop = true;
  runtime_->SetDefaultBehavior(stubborn);
  StartController();
  Create("hang");
  ASSERT_TRUE(WaitForLaunch("hang"));
  WaitForStatus("hang", "InProgress", "Training");
  StopJob("hang");
  ASSERT_TRUE(WaitFor([&] { return !runtime_->stops().empty(); }));
  EXPECT_TRUE(runtime_->running(Instance("hang")));
  EXPECT_EQ(Job("hang").status, store::TrainingJobStatus::kStopping);
  ASSERT_TRUE(runtime_->ExpireGrace(Instance("hang")).ok());
  WaitForStatus("hang", "Stopped", "Stopped");
}

TEST_F(TrainingControllerTest, MaxRuntimeStopsTheJob) {
  StartController();
  Create("slow", {{"StoppingCondition", {{"MaxRuntimeInSeconds", 60}}}});
  ASSERT_TRUE(WaitForLaunch("slow"));
  WaitForStatus("slow", "InProgress", "Training");
  clock_.Advance(std::chrono::seconds(59));
  clock_.Advance(std::chrono::seconds(2));
  auto stopped = WaitForStatus("slow", "Stopped", "MaxRuntimeExceeded");
  EXPECT_EQ(StateJson(stopped).value("stop_requested", ""), "max_runtime");
  auto stops = runtime_->stops();
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].grace, kStopGrace);
  EXPECT_EQ(StateJson(stopped)["transitions"].back().value("StatusMessage", ""),
            "Job stopped because max runtime was exceeded");
}

// Backends that place instances elsewhere (the Slurm runtime, issue 21).

TEST_F(TrainingControllerTest, SpecCarriesTheGroupShapeTimeLimitAndPlacementTags) {
  StartController();
  Create("placed", {{"ResourceConfig", {{"InstanceCount", 1}}}}, /*submit=*/false);
  ASSERT_TRUE(store::TagRepository(db_.get())
                  .Add("arn:aws:sagemaker:us-east-1:000000000000:training-job/placed",
                       {{"kiln:slurm-partition", "gpu"}, {"kiln:slurm-qos", "high"}, {"team", "x"}})
                  .ok());
  controller_->Submit("placed");
  ASSERT_TRUE(WaitForLaunch("placed"));
  std::optional<runtime::InstanceSpec> spec = runtime_->spec(Instance("placed"));
  ASSERT_TRUE(spec.has_value());
  EXPECT_EQ(spec->group, "placed");
  EXPECT_EQ(spec->group_size, 1);
  EXPECT_EQ(spec->group_index, 0);
  EXPECT_EQ(spec->instance_type, "ml.m5.large");
  EXPECT_EQ(spec->shape_vcpus, 2);
  EXPECT_GT(spec->shape_memory_bytes, 0u);
  EXPECT_EQ(spec->shape_gpus, 0);
  EXPECT_EQ(spec->time_limit_seconds, 3600 + kStopGrace.count() + 300);
  EXPECT_EQ(spec->placement, (std::map<std::string, std::string>{{"partition", "gpu"}, {"qos", "high"}}));
  ASSERT_TRUE(runtime_->Exit(Instance("placed"), 0).ok());
  WaitForStatus("placed", "Completed");
}

TEST_F(TrainingControllerTest, TheBackendsWaitingReasonIsTheMessageAndMaxRuntimeCountsFromTheStart) {
  StartController();
  Create("queued", {{"StoppingCondition", {{"MaxRuntimeInSeconds", 60}}}});
  ASSERT_TRUE(WaitForLaunch("queued"));
  ASSERT_TRUE(runtime_->SetWaiting(Instance("queued"), "Slurm job 7 is pending: Resources").ok());
  ASSERT_TRUE(WaitFor([&] { return Job("queued").state.status_message == "Slurm job 7 is pending: Resources"; }));
  // Queued on the cluster for longer than MaxRuntimeInSeconds: not stopped for it.
  clock_.Advance(std::chrono::seconds(120));
  ASSERT_TRUE(runtime_->SetWaiting(Instance("queued"), "").ok());
  ASSERT_TRUE(WaitFor([&] { return Job("queued").state.status_message == training::kMsgTraining; }));
  EXPECT_TRUE(runtime_->stops().empty());
  EXPECT_EQ(Job("queued").state.attempt_start_millis.value_or(-1), clock_.NowMillis());
  clock_.Advance(std::chrono::seconds(61));
  WaitForStatus("queued", "Stopped", "MaxRuntimeExceeded");
}

TEST_F(TrainingControllerTest, APreemptedSpotJobIsInterruptedAndResumes) {
  StartController();
  Create("pre", SpotJob(3600, 7200));
  ASSERT_TRUE(WaitForLaunch("pre"));
  WaitForStatus("pre", "InProgress", "Training");
  ASSERT_TRUE(runtime_->Preempt(Instance("pre"), "Slurm preempted job 9 (on kn1)").ok());
  ASSERT_TRUE(runtime_->WaitForLaunchNumber(2, kPatience).has_value());
  auto resumed = WaitForStatus("pre", "InProgress", "Training");
  EXPECT_EQ(resumed.state.interruptions, 1);
  ASSERT_TRUE(runtime_->Exit(Instance("pre"), 0).ok());
  WaitForStatus("pre", "Completed");
}

TEST_F(TrainingControllerTest, APreemptedOnDemandJobFailsSayingSo) {
  StartController();
  Create("pre2");
  ASSERT_TRUE(WaitForLaunch("pre2"));
  WaitForStatus("pre2", "InProgress", "Training");
  ASSERT_TRUE(runtime_->Preempt(Instance("pre2"), "Slurm preempted job 9 (on kn1)").ok());
  auto failed = WaitForStatus("pre2", "Failed");
  EXPECT_THAT(failed.state.failure_reason.value_or(""), ::testing::HasSubstr("Slurm preempted job 9 (on kn1)"));
}

TEST_F(TrainingControllerTest, PipeInputModeIsRefusedWhenInstancesRunElsewhere) {
  remote_instances_ = true;
  StartController();
  Create(
      "piped",
      {{"AlgorithmSpecification", {{"TrainingInputMode", "Pipe"}}},
       {"InputDataConfig",
        json::array({{{"ChannelName", "train"},
                      {"DataSource", {{"S3DataSource", {{"S3DataType", "S3Prefix"}, {"S3Uri", "s3://bkt/in"}}}}}}})}});
  auto failed = WaitForStatus("piped", "Failed");
  EXPECT_THAT(failed.state.failure_reason.value_or(""), ::testing::HasSubstr("Pipe input mode"));
  EXPECT_TRUE(runtime_->launches().empty());
}

TEST_F(TrainingControllerTest, ARestartedControllerAdoptsARunningJobAndRequeuesAWaitingOne) {
  StartController();
  Create("adopted");
  ASSERT_TRUE(WaitForLaunch("adopted"));
  WaitForStatus("adopted", "InProgress", "Training");
  Create("queued");
  WaitForStatus("queued", "InProgress", "Pending");
  ASSERT_TRUE(runtime_->WriteOutput(Instance("adopted"), 'o', "before the restart").ok());

  RestartController();
  EXPECT_TRUE(runtime_->running(Instance("adopted")));  // the server going did not stop it
  // The adopted job holds its CPUs again, so the queued one still waits.
  ASSERT_TRUE(WaitFor([&] { return scheduler_->Granted("adopted").has_value(); }));
  ASSERT_TRUE(WaitFor([&] { return scheduler_->IsQueued("queued"); }));
  EXPECT_EQ(runtime_->launches().size(), 1u);

  ASSERT_TRUE(runtime_->WriteOutput(Instance("adopted"), 'e', "boom after the restart").ok());
  ASSERT_TRUE(runtime_->Exit(Instance("adopted"), 3).ok());
  EXPECT_EQ(StateJson(WaitForStatus("adopted", "Failed")).value("failure_reason", ""),
            "AlgorithmError: boom after the restart, exit code: 3");
  ASSERT_TRUE(WaitForLaunch("queued"));
  EXPECT_EQ(runtime_->launches(), (std::vector<std::string>{Instance("adopted"), Instance("queued")}));
}

TEST_F(TrainingControllerTest, OutputReachesTheLogStreamAndMetricsOnceAcrossARestart) {
  StartController();
  Create("logs",
         {{"AlgorithmSpecification", {{"MetricDefinitions", {{{"Name", "loss"}, {"Regex", "loss=([0-9.]+)"}}}}}}});
  ASSERT_TRUE(WaitForLaunch("logs"));
  const std::string stream =
      StateJson(WaitForStatus("logs", "InProgress", "Training"))["hosts"][0].value("log_stream", "");
  EXPECT_THAT(stream, ::testing::StartsWith("logs/algo-1-"));
  ASSERT_TRUE(runtime_->WriteOutput(Instance("logs"), 'o', "epoch 1 loss=0.5").ok());
  RestartController();  // the new pump resumes at the offset the old one reached
  ASSERT_TRUE(runtime_->WriteOutput(Instance("logs"), 'o', "epoch 2 loss=0.25").ok());
  ASSERT_TRUE(runtime_->Exit(Instance("logs"), 0).ok());
  auto done = WaitForStatus("logs", "Completed");
  EXPECT_EQ(StateJson(done)["final_metrics"]["loss"].value("value", 0.0), 0.25);
  observe::EventsQuery query;
  query.start_from_head = true;
  auto events = log_store_->GetEvents(kTrainingLogGroup, stream, query);
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  std::vector<std::string> lines;
  for (const auto& e : events->events) lines.push_back(e.message);
  EXPECT_EQ(lines, (std::vector<std::string>{"epoch 1 loss=0.5", "epoch 2 loss=0.25"}));
}

TEST_F(TrainingControllerTest, ARestartedControllerFinishesAJobWhoseInstanceEndedMeanwhile) {
  StartController();
  Create("ended");
  ASSERT_TRUE(WaitForLaunch("ended"));
  WaitForStatus("ended", "InProgress", "Training");
  controller_.reset();
  ASSERT_TRUE(runtime_->Exit(Instance("ended"), 0).ok());  // while no server runs
  RenewServerState();
  StartController();
  auto done = WaitForStatus("ended", "Completed", "Completed");
  EXPECT_TRUE(StateJson(done).contains("model_artifacts"));
  EXPECT_EQ(runtime_->launches().size(), 1u);
}

// ---- Stop in each phase, and adoption of jobs a previous server left in each phase ----

TEST_F(TrainingControllerTest, AStagingJobLeftByAServerIsQueuedAgainAndRuns) {
  // A server granted the job, then died while staging it (before any instance started).
  Create("staged", json::object(), /*submit=*/false);
  store::TrainingJobRepository jobs(db_.get());
  ASSERT_TRUE(jobs.Mutate("staged",
                          [](store::TrainingJobRecord& r) {
                            r.state.phase = store::TrainingPhase::kStaging;
                            return Status::Ok();
                          })
                  .ok());
  StartController();
  ASSERT_TRUE(WaitForLaunch("staged"));
  ASSERT_TRUE(runtime_->Exit(Instance("staged"), 0).ok());
  EXPECT_EQ(StateJson(WaitForStatus("staged", "Completed", "Completed")).value("phase", ""), "done");
}

TEST_F(TrainingControllerTest, StopDuringStagingThatAServerDidNotCarryOutEndsStoppedAtRestart) {
  Create("staged", json::object(), /*submit=*/false);
  store::TrainingJobRepository jobs(db_.get());
  ASSERT_TRUE(jobs.Mutate("staged",
                          [&](store::TrainingJobRecord& r) {
                            r.state.phase = store::TrainingPhase::kStaging;
                            r.status = store::TrainingJobStatus::kStopping;  // StopTrainingJob as the API writes it
                            r.state.stop_requested = store::StopRequest::kUser;
                            RecordSecondaryStatus(r, SecondaryStatus::kStopping, "Stopping the training job",
                                                  clock_.NowMillis());
                            return Status::Ok();
                          })
                  .ok());
  StartController();
  auto stopped = WaitForStatus("staged", "Stopped", "Stopped");
  EXPECT_EQ(StateJson(stopped).value("phase", ""), "done");
  EXPECT_TRUE(runtime_->launches().empty());
  EXPECT_FALSE(scheduler_->IsQueued("staged"));
}

// The server died while uploading: the next one adopts the finishing job and uploads again.
TEST_F(TrainingControllerTest, ARestartedControllerRedoesTheUploadOfAFinishingJob) {
  StartController();
  Create("upload");
  ASSERT_TRUE(WaitForLaunch("upload"));
  WaitForStatus("upload", "InProgress", "Training");
  controller_.reset();
  ASSERT_TRUE(runtime_->Exit(Instance("upload"), 0).ok());
  store::TrainingJobRepository jobs(db_.get());
  ASSERT_TRUE(jobs.Mutate("upload",
                          [&](store::TrainingJobRecord& r) {
                            r.state.phase = store::TrainingPhase::kFinishing;
                            RecordSecondaryStatus(r, SecondaryStatus::kUploading, "Uploading generated training model",
                                                  clock_.NowMillis());
                            return Status::Ok();
                          })
                  .ok());
  RenewServerState();
  StartController();
  auto done = WaitForStatus("upload", "Completed", "Completed");
  EXPECT_EQ(StateJson(done).value("model_artifacts", json()), "s3://bkt/out/upload/output/model.tar.gz");
  EXPECT_TRUE(object_store_->HeadObject("bkt", "out/upload/output/model.tar.gz").ok());
  EXPECT_EQ(runtime_->launches().size(), 1u);
  EXPECT_TRUE(WaitFor([&] { return !scheduler_->Granted("upload").has_value(); }));
}

// A stop that reaches a job while it uploads: the upload still happens (training-contract.md
// §11), and the job ends Stopped, not Completed.
TEST_F(TrainingControllerTest, StopDuringUploadEndsStoppedWithTheModelUploaded) {
  StartController();
  Create("upload");
  ASSERT_TRUE(WaitForLaunch("upload"));
  WaitForStatus("upload", "InProgress", "Training");
  controller_.reset();
  ASSERT_TRUE(runtime_->Exit(Instance("upload"), 0).ok());
  store::TrainingJobRepository jobs(db_.get());
  ASSERT_TRUE(jobs.Mutate("upload",
                          [&](store::TrainingJobRecord& r) {
                            r.state.phase = store::TrainingPhase::kFinishing;
                            RecordSecondaryStatus(r, SecondaryStatus::kUploading, "Uploading generated training model",
                                                  clock_.NowMillis());
                            r.status = store::TrainingJobStatus::kStopping;
                            r.state.stop_requested = store::StopRequest::kUser;
                            RecordSecondaryStatus(r, SecondaryStatus::kStopping, "Stopping the training job",
                                                  clock_.NowMillis());
                            return Status::Ok();
                          })
                  .ok());
  RenewServerState();
  StartController();
  auto stopped = WaitForStatus("upload", "Stopped", "Stopped");
  EXPECT_TRUE(StateJson(stopped).contains("model_artifacts"));
  EXPECT_TRUE(object_store_->HeadObject("bkt", "out/upload/output/model.tar.gz").ok());
  EXPECT_TRUE(runtime_->stops().empty());  // nothing was left to stop
}

// A job adopted while its MaxRuntime stop was under way ends MaxRuntimeExceeded, not Stopped.
TEST_F(TrainingControllerTest, AnAdoptedMaxRuntimeStopEndsMaxRuntimeExceeded) {
  FakeRuntime::Behavior stubborn;
  stubborn.hangs_on_stop = true;
  runtime_->SetDefaultBehavior(stubborn);
  StartController();
  Create("slow", {{"StoppingCondition", {{"MaxRuntimeInSeconds", 60}}}});
  ASSERT_TRUE(WaitForLaunch("slow"));
  WaitForStatus("slow", "InProgress", "Training");
  clock_.Advance(std::chrono::seconds(61));
  WaitForStatus("slow", "Stopping", "Stopping");
  ASSERT_TRUE(WaitFor([&] { return !runtime_->stops().empty(); }));
  RestartController();
  ASSERT_TRUE(runtime_->ExpireGrace(Instance("slow")).ok());
  auto stopped = WaitForStatus("slow", "Stopped", "MaxRuntimeExceeded");
  EXPECT_EQ(StateJson(stopped).value("stop_requested", ""), "max_runtime");
}

// ---- Managed spot (training-contract.md §9, issue 18) ----

TEST_F(TrainingControllerTest, AnInterruptedSpotJobResumesAndBillsOnlyItsRunningTime) {
  StartController();
  Create("spot", SpotJob(3600, 7200));
  ASSERT_TRUE(WaitForLaunch("spot"));
  auto first = WaitForStatus("spot", "InProgress", "Training");
  const int64_t first_start = first.state.training_start_millis.value_or(-1);
  const std::string first_stream = first.state.hosts.at(0).log_stream;
  clock_.Advance(std::chrono::seconds(10));
  ASSERT_TRUE(controller_->Interrupt("spot", "a test reclaims it").ok());
  // SIGTERM with the stop grace, as a spot reclaim; then the job runs again on new instances.
  ASSERT_TRUE(runtime_->WaitForLaunchNumber(2, kPatience).has_value());
  ASSERT_TRUE(WaitFor([&] { return Job("spot").state.phase == store::TrainingPhase::kRunning; }));
  ASSERT_FALSE(runtime_->stops().empty());
  EXPECT_EQ(runtime_->stops()[0].grace, kStopGrace);
  auto resumed = WaitForStatus("spot", "InProgress", "Training");
  EXPECT_EQ(resumed.state.interruptions, 1);
  EXPECT_EQ(resumed.state.billable_millis, 10000);
  EXPECT_FALSE(resumed.state.interrupt_requested.has_value());
  EXPECT_NE(resumed.state.hosts.at(0).log_stream, first_stream);  // a new stream per attempt
  clock_.Advance(std::chrono::seconds(5));
  ASSERT_TRUE(runtime_->Exit(Instance("spot"), 0).ok());
  auto done = WaitForStatus("spot", "Completed", "Completed");
  EXPECT_EQ(Secondaries(done),
            (std::vector<std::string>{"Starting", "Downloading", "Training", "Interrupted", "Starting", "Downloading",
                                      "Training", "Uploading", "Completed"}));
  for (const auto& t : done.state.transitions) {
    if (t.status == SecondaryStatus::kInterrupted) {
      EXPECT_EQ(t.message, "Training job interrupted, waiting for capacity");
    }
  }
  EXPECT_EQ(done.state.billable_millis, 15000);                           // 10 s + 5 s of training
  EXPECT_EQ(done.state.training_start_millis.value_or(-1), first_start);  // wall time counts from the first start
  EXPECT_TRUE(StateJson(done).contains("model_artifacts"));
  const auto lines = KilnLines(first_stream);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], ::testing::HasSubstr("spot interruption: a test reclaims it"));
  EXPECT_THAT(lines[1], ::testing::HasSubstr("resumes from its checkpoints"));
}

TEST_F(TrainingControllerTest, OnlyARunningSpotJobCanBeInterrupted) {
  StartController();
  EXPECT_EQ(controller_->Interrupt("nobody", "x").code(), StatusCode::kNotFound);
  Create("ondemand");
  ASSERT_TRUE(WaitForLaunch("ondemand"));
  WaitForStatus("ondemand", "InProgress", "Training");
  Status refused = controller_->Interrupt("ondemand", "x");
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("EnableManagedSpotTraining"));
  // A spot job waiting for capacity holds nothing to reclaim.
  Create("waiting", SpotJob(3600, 7200));
  WaitForStatus("waiting", "InProgress", "Pending");
  EXPECT_EQ(controller_->Interrupt("waiting", "x").code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(runtime_->Exit(Instance("ondemand"), 0).ok());
  ASSERT_TRUE(WaitForLaunch("waiting"));
  WaitForStatus("waiting", "InProgress", "Training");
  ASSERT_TRUE(runtime_->Exit(Instance("waiting"), 0).ok());
  WaitForStatus("waiting", "Completed");
  EXPECT_EQ(controller_->Interrupt("waiting", "x").code(), StatusCode::kFailedPrecondition);
}

TEST_F(TrainingControllerTest, TheOperatorsScheduleInterruptsEachListedAttemptOnce) {
  spot_options_.interrupt_after_seconds = {5, 8};
  StartController();
  Create("sched", SpotJob(3600, 7200));
  ASSERT_TRUE(WaitForLaunch("sched"));
  WaitForStatus("sched", "InProgress", "Training");
  clock_.Advance(std::chrono::seconds(4));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // a few monitor passes: not yet
  EXPECT_EQ(Job("sched").state.interruptions, 0);
  clock_.Advance(std::chrono::seconds(2));
  ASSERT_TRUE(runtime_->WaitForLaunchNumber(2, kPatience).has_value());
  ASSERT_TRUE(WaitFor([&] { return Job("sched").state.phase == store::TrainingPhase::kRunning; }));
  clock_.Advance(std::chrono::seconds(9));  // the second attempt's entry: 8 s
  ASSERT_TRUE(runtime_->WaitForLaunchNumber(3, kPatience).has_value());
  ASSERT_TRUE(WaitFor([&] { return Job("sched").state.phase == store::TrainingPhase::kRunning; }));
  clock_.Advance(std::chrono::seconds(100));  // beyond the list: runs on
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_EQ(runtime_->launches().size(), 3u);
  ASSERT_TRUE(runtime_->Exit(Instance("sched"), 0).ok());
  auto done = WaitForStatus("sched", "Completed");
  EXPECT_EQ(done.state.interruptions, 2);
  EXPECT_EQ(done.state.billable_millis, (6 + 9 + 100) * 1000);
}

TEST_F(TrainingControllerTest, AnInterruptedJobWaitsTheRestartDelay) {
  spot_options_.restart_delay = std::chrono::seconds(60);
  StartController();
  Create("delayed", SpotJob(3600, 7200));
  ASSERT_TRUE(WaitForLaunch("delayed"));
  WaitForStatus("delayed", "InProgress", "Training");
  ASSERT_TRUE(controller_->Interrupt("delayed", "reclaimed").ok());
  auto waiting = WaitForStatus("delayed", "InProgress", "Interrupted");
  EXPECT_EQ(waiting.state.phase, store::TrainingPhase::kQueued);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(runtime_->launches().size(), 1u);
  EXPECT_FALSE(scheduler_->IsQueued("delayed"));  // not in line until capacity returns
  clock_.Advance(std::chrono::seconds(61));
  ASSERT_TRUE(runtime_->WaitForLaunchNumber(2, kPatience).has_value());
  ASSERT_TRUE(runtime_->Exit(Instance("delayed"), 0).ok());
  EXPECT_EQ(Secondaries(WaitForStatus("delayed", "Completed")),
            (std::vector<std::string>{"Starting", "Downloading", "Training", "Interrupted", "Starting", "Downloading",
                                      "Training", "Uploading", "Completed"}));
}

TEST_F(TrainingControllerTest, SpotMaxRuntimeCountsTheRunningTimeOfEveryAttempt) {
  StartController();
  Create("budget", SpotJob(60, 7200));
  ASSERT_TRUE(WaitForLaunch("budget"));
  WaitForStatus("budget", "InProgress", "Training");
  clock_.Advance(std::chrono::seconds(40));
  ASSERT_TRUE(controller_->Interrupt("budget", "reclaimed").ok());
  ASSERT_TRUE(runtime_->WaitForLaunchNumber(2, kPatience).has_value());
  WaitForStatus("budget", "InProgress", "Training");
  clock_.Advance(std::chrono::seconds(21));  // 40 + 21 > 60
  auto stopped = WaitForStatus("budget", "Stopped", "MaxRuntimeExceeded");
  EXPECT_EQ(stopped.state.billable_millis, 61000);
}

TEST_F(TrainingControllerTest, MaxWaitTimeStopsARunningSpotJobWithItsArtifacts) {
  StartController();
  Create("holder");
  ASSERT_TRUE(WaitForLaunch("holder"));
  Create("waitout", SpotJob(3600, 3600));
  WaitForStatus("waitout", "InProgress", "Pending");
  clock_.Advance(std::chrono::seconds(100));  // waiting counts towards MaxWaitTimeInSeconds
  ASSERT_TRUE(runtime_->Exit(Instance("holder"), 0).ok());
  ASSERT_TRUE(WaitForLaunch("waitout"));
  WaitForStatus("waitout", "InProgress", "Training");
  clock_.Advance(std::chrono::seconds(3550));  // 3650 s waited and ran; 3550 s of MaxRuntime's 3600
  auto stopped = WaitForStatus("waitout", "Stopped", "MaxWaitTimeExceeded");
  EXPECT_EQ(StateJson(stopped).value("stop_requested", ""), "max_wait_time");
  EXPECT_EQ(stopped.state.transitions.back().message, "Job stopped because max wait time was exceeded");
  EXPECT_TRUE(StateJson(stopped).contains("model_artifacts"));
  ASSERT_FALSE(runtime_->stops().empty());
  EXPECT_EQ(runtime_->stops().back().grace, kStopGrace);
}

TEST_F(TrainingControllerTest, MaxWaitTimeStopsASpotJobThatNeverGotCapacity) {
  StartController();
  Create("holder");
  ASSERT_TRUE(WaitForLaunch("holder"));
  Create("starved", SpotJob(3600, 3600));
  WaitForStatus("starved", "InProgress", "Pending");
  clock_.Advance(std::chrono::seconds(3601));
  auto stopped = WaitForStatus("starved", "Stopped", "MaxWaitTimeExceeded");
  EXPECT_EQ(Secondaries(stopped), (std::vector<std::string>{"Starting", "Pending", "Stopping", "MaxWaitTimeExceeded"}));
  EXPECT_FALSE(scheduler_->IsQueued("starved"));
  EXPECT_EQ(runtime_->launches(), std::vector<std::string>{Instance("holder")});
}

TEST_F(TrainingControllerTest, MaxWaitTimeEndsAnInterruptedJobStillWaitingToResume) {
  spot_options_.restart_delay = std::chrono::seconds(600);
  StartController();
  Create("never", SpotJob(60, 120));
  ASSERT_TRUE(WaitForLaunch("never"));
  WaitForStatus("never", "InProgress", "Training");
  clock_.Advance(std::chrono::seconds(30));
  ASSERT_TRUE(controller_->Interrupt("never", "reclaimed").ok());
  WaitForStatus("never", "InProgress", "Interrupted");
  clock_.Advance(std::chrono::seconds(91));
  auto stopped = WaitForStatus("never", "Stopped", "MaxWaitTimeExceeded");
  EXPECT_EQ(Secondaries(stopped), (std::vector<std::string>{"Starting", "Downloading", "Training", "Interrupted",
                                                            "Stopping", "MaxWaitTimeExceeded"}));
  EXPECT_EQ(stopped.state.billable_millis, 30000);
  EXPECT_EQ(runtime_->launches().size(), 1u);
}

TEST_F(TrainingControllerTest, AnOnDemandJobReclaimsASpotJobsInstancesAndRunsFirst) {
  StartController();
  Create("spot", SpotJob(3600, 7200));
  ASSERT_TRUE(WaitForLaunch("spot"));
  const std::string stream = WaitForStatus("spot", "InProgress", "Training").state.hosts.at(0).log_stream;
  Create("urgent");  // the node fits one: the spot job is reclaimed for it
  ASSERT_TRUE(WaitForLaunch("urgent"));
  auto interrupted = WaitForStatus("spot", "InProgress", "Interrupted");
  EXPECT_EQ(interrupted.state.interruptions, 1);
  EXPECT_THAT(KilnLines(stream), ::testing::Contains(::testing::HasSubstr("for the on-demand training job urgent")));
  EXPECT_EQ(runtime_->launches(), (std::vector<std::string>{Instance("spot"), Instance("urgent")}));
  // The spot job waits behind the on-demand one, showing Interrupted, and resumes after it.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(Job("spot").secondary_status, SecondaryStatus::kInterrupted);
  ASSERT_TRUE(runtime_->Exit(Instance("urgent"), 0).ok());
  WaitForStatus("urgent", "Completed");
  ASSERT_TRUE(runtime_->WaitForLaunchNumber(3, kPatience).has_value());
  WaitForStatus("spot", "InProgress", "Training");
  ASSERT_TRUE(runtime_->Exit(Instance("spot"), 0).ok());
  WaitForStatus("spot", "Completed");
}

TEST_F(TrainingControllerTest, ARestartedControllerCarriesOutARecordedInterruption) {
  StartController();
  Create("carry", SpotJob(3600, 7200));
  ASSERT_TRUE(WaitForLaunch("carry"));
  WaitForStatus("carry", "InProgress", "Training");
  // The server died right after recording the interruption, before stopping the instance.
  controller_.reset();
  store::TrainingJobRepository jobs(db_.get());
  ASSERT_TRUE(jobs.Mutate("carry",
                          [](store::TrainingJobRecord& r) {
                            r.state.interrupt_requested = "reclaimed before the restart";
                            return Status::Ok();
                          })
                  .ok());
  RenewServerState();
  StartController();
  ASSERT_TRUE(runtime_->WaitForLaunchNumber(2, kPatience).has_value());
  auto resumed = WaitForStatus("carry", "InProgress", "Training");
  EXPECT_EQ(resumed.state.interruptions, 1);
  ASSERT_TRUE(runtime_->Exit(Instance("carry"), 0).ok());
  WaitForStatus("carry", "Completed");
}

TEST_F(TrainingControllerTest, AnInterruptionRecordedBeforeARestartHoldsEvenIfTheHostExitedMeanwhile) {
  StartController();
  Create("exited", SpotJob(3600, 7200));
  ASSERT_TRUE(WaitForLaunch("exited"));
  WaitForStatus("exited", "InProgress", "Training");
  // Interrupt recorded and SIGTERM sent; the server dies; the program exits 143 while none watches.
  controller_.reset();
  store::TrainingJobRepository jobs(db_.get());
  ASSERT_TRUE(jobs.Mutate("exited",
                          [](store::TrainingJobRecord& r) {
                            r.state.interrupt_requested = "reclaimed";
                            return Status::Ok();
                          })
                  .ok());
  ASSERT_TRUE(runtime_->Exit(Instance("exited"), 143).ok());
  RenewServerState();
  StartController();
  // Neither Failed (exit 143) nor Completed: interrupted, and it resumes.
  ASSERT_TRUE(runtime_->WaitForLaunchNumber(2, kPatience).has_value());
  auto resumed = WaitForStatus("exited", "InProgress", "Training");
  EXPECT_EQ(resumed.state.interruptions, 1);
  EXPECT_THAT(Secondaries(resumed), ::testing::Contains("Interrupted"));
  ASSERT_TRUE(runtime_->Exit(Instance("exited"), 0).ok());
  WaitForStatus("exited", "Completed");
}

TEST_F(TrainingControllerTest, AStopWhileWaitingToResumeEndsStoppedWithTheTrainingTimeItHad) {
  spot_options_.restart_delay = std::chrono::seconds(600);
  StartController();
  Create("halted", SpotJob(3600, 7200));
  ASSERT_TRUE(WaitForLaunch("halted"));
  auto training = WaitForStatus("halted", "InProgress", "Training");
  clock_.Advance(std::chrono::seconds(20));
  ASSERT_TRUE(controller_->Interrupt("halted", "reclaimed").ok());
  auto waiting = WaitForStatus("halted", "InProgress", "Interrupted");
  StopJob("halted");
  auto stopped = WaitForStatus("halted", "Stopped", "Stopped");
  EXPECT_EQ(stopped.state.billable_millis, 20000);
  ASSERT_TRUE(stopped.training_end_millis.has_value());
  EXPECT_EQ(*stopped.training_end_millis - *training.state.training_start_millis, 20000);
  clock_.Advance(std::chrono::seconds(601));  // the resume that was due never comes
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(runtime_->launches().size(), 1u);
  EXPECT_EQ(Job("halted").status, store::TrainingJobStatus::kStopped);
  (void)waiting;
}

TEST_F(TrainingControllerTest, MaxPendingTimeDoesNotStopASpotJobQueuedAgainAfterAnInterruption) {
  StartController();
  Create("patient",
         {{"EnableManagedSpotTraining", true},
          {"StoppingCondition",
           {{"MaxRuntimeInSeconds", 86400}, {"MaxWaitTimeInSeconds", 172800}, {"MaxPendingTimeInSeconds", 7200}}}});
  ASSERT_TRUE(WaitForLaunch("patient"));
  WaitForStatus("patient", "InProgress", "Training");
  clock_.Advance(std::chrono::seconds(7300));  // past creation + MaxPendingTime while it trains
  Create("urgent");                            // reclaims the node; the spot job waits behind it
  ASSERT_TRUE(WaitForLaunch("urgent"));
  WaitForStatus("patient", "InProgress", "Interrupted");
  Create("poke");  // a pass and a deadline check
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(Job("patient").status, store::TrainingJobStatus::kInProgress);
  ASSERT_TRUE(runtime_->Exit(Instance("urgent"), 0).ok());
  ASSERT_TRUE(WaitForLaunch("poke"));  // on-demand first
  ASSERT_TRUE(runtime_->Exit(Instance("poke"), 0).ok());
  ASSERT_TRUE(runtime_->WaitForLaunchNumber(4, kPatience).has_value());
  WaitForStatus("patient", "InProgress", "Training");
  ASSERT_TRUE(runtime_->Exit(Instance("patient"), 0).ok());
  WaitForStatus("patient", "Completed");
}

// ---------------------------------------------------------------------------------------------
// Warm pools (training-contract.md §19; warm_pools.h).

json KeepAlive(int64_t seconds) { return {{"ResourceConfig", {{"KeepAlivePeriodInSeconds", seconds}}}}; }

class WarmPoolControllerTest : public TrainingControllerTest {
 protected:
  // Runs `name` with this keep-alive period to Completed and waits until its pool holds the grant.
  void RunToAvailablePool(const std::string& name, int64_t seconds) {
    Create(name, KeepAlive(seconds));
    ASSERT_TRUE(WaitForLaunch(name));
    ASSERT_TRUE(runtime_->Exit(Instance(name), 0).ok());
    WaitForStatus(name, "Completed");
    ASSERT_TRUE(WaitFor([&] { return scheduler_->Granted("warm-pool/" + name).has_value(); }));
  }
};

// A finished job with a keep-alive period keeps its grant and its persistent cache; a matching
// job starts on them at once (Reused / InUse), with the cache as the first job left it.
TEST_F(WarmPoolControllerTest, AMatchingJobReusesTheKeptPoolAndItsCache) {
  StartController();
  Create("first", KeepAlive(600));
  ASSERT_TRUE(WaitForLaunch("first"));
  auto spec = runtime_->spec(Instance("first"));
  ASSERT_TRUE(spec.has_value());
  EXPECT_EQ(spec->env.at("SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY"), "/opt/ml/sagemaker/warmpoolcache");
  const std::string cache = spec->opt_ml_dir + "/sagemaker/warmpoolcache";
  ASSERT_TRUE(PathExists(cache));
  ASSERT_TRUE(WriteFileAtomic(cache + "/compiled.bin", "kept").ok());
  ASSERT_TRUE(WriteFileAtomic(spec->opt_ml_dir + "/model/junk", "not kept").ok());
  // Links the job leaves are not kept, even inside what is kept: the next job moves files by path.
  ASSERT_EQ(symlink("/etc", (cache + "/escape").c_str()), 0);
  ASSERT_TRUE(runtime_->Exit(Instance("first"), 0).ok());
  WaitForStatus("first", "Completed");
  ASSERT_TRUE(WaitFor([&] { return scheduler_->Granted("warm-pool/first").has_value(); }));
  EXPECT_FALSE(scheduler_->Granted("first").has_value());
  store::WarmPoolState kept = Job("first").state.warm_pool;
  EXPECT_EQ(kept.status, store::WarmPoolStatus::kAvailable);
  EXPECT_EQ(kept.expires_millis, kept.available_since_millis + 600'000);
  EXPECT_TRUE(PathExists(kept.directory + "/algo-1/opt_ml/sagemaker/warmpoolcache/compiled.bin"));
  EXPECT_FALSE(PathExists(kept.directory + "/algo-1/opt_ml/model/junk"));  // the rest is wiped
  struct stat link_stat;
  EXPECT_NE(lstat((kept.directory + "/algo-1/opt_ml/sagemaker/warmpoolcache/escape").c_str(), &link_stat), 0);

  clock_.Advance(std::chrono::seconds(42));
  json second = KeepAlive(300);
  second["AlgorithmSpecification"] = {{"TrainingImage", "local:/bin/false"}, {"TrainingInputMode", "File"}};
  Create("second", second);
  ASSERT_TRUE(WaitForLaunch("second"));
  EXPECT_FALSE(scheduler_->Granted("warm-pool/first").has_value());
  EXPECT_EQ(scheduler_->Granted("second"), kept.allocations.get<std::vector<Allocation>>());
  auto reused = Job("first").state.warm_pool;
  EXPECT_EQ(reused.status, store::WarmPoolStatus::kReused);
  EXPECT_EQ(reused.reused_by_job, "second");
  EXPECT_EQ(reused.retained_millis, 42'000);
  auto in_use = Job("second");
  EXPECT_EQ(in_use.state.warm_pool.status, store::WarmPoolStatus::kInUse);
  EXPECT_EQ(in_use.state.warm_pool.reused_from_job, "first");
  // Its Starting status said where its hosts came from.
  EXPECT_TRUE(std::any_of(in_use.state.transitions.begin(), in_use.state.transitions.end(), [](const auto& t) {
    return t.status == SecondaryStatus::kStarting &&
           t.message.starts_with("Reusing the warm pool of training job first");
  }));
  auto second_spec = runtime_->spec(Instance("second"));
  ASSERT_TRUE(second_spec.has_value());
  auto carried = ReadFile(second_spec->opt_ml_dir + "/sagemaker/warmpoolcache/compiled.bin");
  EXPECT_EQ(carried.value_or(""), "kept");
  EXPECT_FALSE(PathExists(kept.directory));  // taken

  // The second keeps a pool of its own; the chain keeps the first pool's start.
  ASSERT_TRUE(runtime_->Exit(Instance("second"), 0).ok());
  WaitForStatus("second", "Completed");
  ASSERT_TRUE(WaitFor([&] { return scheduler_->Granted("warm-pool/second").has_value(); }));
  auto second_pool = Job("second").state.warm_pool;
  EXPECT_EQ(second_pool.status, store::WarmPoolStatus::kAvailable);
  EXPECT_EQ(second_pool.chain_start_millis, kept.available_since_millis);
  EXPECT_EQ(second_pool.expires_millis, second_pool.available_since_millis + 300'000);
}

// A matching job queued behind the running job (the node is full) takes that job's pool as soon as
// it is kept, rather than seeing it reclaimed for it.
TEST_F(WarmPoolControllerTest, AMatchingJobWaitingInLineTakesThePoolWhenItIsKept) {
  StartController();
  Create("running", KeepAlive(600));
  ASSERT_TRUE(WaitForLaunch("running"));
  Create("waiting", KeepAlive(600));
  WaitForStatus("waiting", "InProgress", "Pending");
  ASSERT_TRUE(runtime_->Exit(Instance("running"), 0).ok());
  ASSERT_TRUE(WaitForLaunch("waiting"));
  EXPECT_EQ(Job("running").state.warm_pool.status, store::WarmPoolStatus::kReused);
  EXPECT_EQ(Job("running").state.warm_pool.reused_by_job, "waiting");
  EXPECT_EQ(Job("waiting").state.warm_pool.status, store::WarmPoolStatus::kInUse);
}

// A job that does not match waits for the capacity a pool holds only until the pool gives way:
// the pool is terminated for it (Terminated, billed until then).
TEST_F(WarmPoolControllerTest, AQueuedJobThatDoesNotMatchTerminatesThePoolForItsCapacity) {
  StartController();
  RunToAvailablePool("kept", 600);
  clock_.Advance(std::chrono::seconds(5));
  Create("plain");  // no keep-alive period: it does not match
  ASSERT_TRUE(WaitForLaunch("plain"));
  auto ended = Job("kept").state.warm_pool;
  EXPECT_EQ(ended.status, store::WarmPoolStatus::kTerminated);
  EXPECT_EQ(ended.retained_millis, 5000);
  EXPECT_TRUE(ended.directory.empty());
  EXPECT_FALSE(scheduler_->Granted("warm-pool/kept").has_value());
  EXPECT_EQ(Job("plain").state.warm_pool.status, store::WarmPoolStatus::kNone);
}

// The period runs out (Terminated after exactly the period); UpdateTrainingJob to 0 ends a pool
// at once; a longer period counts from the update.
TEST_F(WarmPoolControllerTest, APoolEndsWhenItsPeriodRunsOutOrIsSetToZero) {
  StartController();
  RunToAvailablePool("short", 1);
  clock_.Advance(std::chrono::seconds(3));
  ASSERT_TRUE(WaitFor([&] { return Job("short").state.warm_pool.status == store::WarmPoolStatus::kTerminated; }));
  EXPECT_EQ(Job("short").state.warm_pool.retained_millis, 1000);  // the period, not the late check
  EXPECT_TRUE(WaitFor([&] { return !scheduler_->Granted("warm-pool/short").has_value(); }));

  RunToAvailablePool("updated", 60);
  auto set_period = [&](int64_t seconds) {
    store::TrainingJobRepository jobs(db_.get());
    ASSERT_TRUE(jobs.Mutate("updated",
                            [&](store::TrainingJobRecord& r) {
                              r.request["ResourceConfig"]["KeepAlivePeriodInSeconds"] = seconds;
                              return Status::Ok();
                            })
                    .ok());
    controller_->WarmPoolChanged("updated");
  };
  clock_.Advance(std::chrono::seconds(50));
  set_period(3600);
  EXPECT_EQ(Job("updated").state.warm_pool.expires_millis, clock_.NowMillis() + 3'600'000);
  set_period(0);
  auto ended = Job("updated").state.warm_pool;
  EXPECT_EQ(ended.status, store::WarmPoolStatus::kTerminated);
  EXPECT_EQ(ended.retained_millis, 50'000);
  EXPECT_FALSE(scheduler_->Granted("warm-pool/updated").has_value());
}

// A pool outlives a server restart: its grant is reserved again and a matching job reuses it.
TEST_F(WarmPoolControllerTest, APoolIsKeptAcrossARestart) {
  StartController();
  RunToAvailablePool("kept", 600);
  RestartController();
  EXPECT_TRUE(scheduler_->Granted("warm-pool/kept").has_value());
  Create("next", KeepAlive(600));
  ASSERT_TRUE(WaitForLaunch("next"));
  EXPECT_EQ(Job("kept").state.warm_pool.status, store::WarmPoolStatus::kReused);
  EXPECT_EQ(Job("next").state.warm_pool.status, store::WarmPoolStatus::kInUse);
}

// A job that took a pool and failed before it ran used the pool up (Terminated); it keeps none.
TEST_F(WarmPoolControllerTest, AJobThatTookAPoolAndFailedBeforeRunningKeepsNone) {
  StartController();
  RunToAvailablePool("kept", 600);
  json bad = KeepAlive(600);
  bad["InputDataConfig"] = json::array(
      {{{"ChannelName", "train"},
        {"DataSource", {{"S3DataSource", {{"S3Uri", "s3://bkt/nothing-here/"}, {"S3DataType", "S3Prefix"}}}}}}});
  Create("bad", bad);
  auto failed = WaitForStatus("bad", "Failed");
  EXPECT_EQ(failed.state.warm_pool.status, store::WarmPoolStatus::kTerminated);
  EXPECT_TRUE(WaitFor([&] { return !scheduler_->Granted("bad").has_value(); }));
  EXPECT_FALSE(scheduler_->Granted("warm-pool/bad").has_value());
}

}  // namespace
}  // namespace kiln::control
