// The transform controller over the fake runtime (control/test_util/controller_fixture.h): its
// instances are endpoint instances made by StandaloneInstances, and each fake instance answers
// every request on its port with 200 "{}" (GET /ping, GET /execution-parameters — defaults then —
// and POST /invocations), so launch, the /ping gate, objects round-robin over instances, output
// names, data-log lines, stop and a failing instance run without processes.

#include "control/transform_controller.h"

#include <gtest/gtest.h>

#include <set>

#include "base/io.h"
#include "control/test_util/controller_fixture.h"
#include "control/transform_job_run.h"

namespace kiln::control {
namespace {

using nlohmann::json;
using runtime::testing::FakeRuntime;

class TransformControllerTest : public testing::ControllerTest {
 protected:
  void SetUp() override {
    ControllerTest::SetUp();
    MakeScheduler(testing::SmallHost(4, 16));
    EndpointControllerOptions options;
    options.work_dir = work_dir() + "/endpoints";
    options.endpoint_url = "http://127.0.0.1:1";
    const uint32_t scatter = static_cast<uint32_t>(::getpid()) * 2654435761u;
    options.port_range_begin = 20000 + static_cast<int>((scatter >> 16) % 90) * 100;
    options.port_range_end = 30000;
    options.stop_grace = std::chrono::seconds(1);
    options.health_interval = std::chrono::milliseconds(50);
    options.default_startup_timeout = std::chrono::seconds(2);
    options.drain_timeout = std::chrono::seconds(2);
    EndpointControllerDeps deps;
    deps.database = db_.get();
    deps.object_store = object_store_.get();
    deps.runtime = runtime_.get();
    deps.scheduler = scheduler_.get();
    deps.environments = environments_.get();
    deps.credentials = credentials_.get();
    deps.log_store = log_store_.get();
    deps.routes = &routes_;
    deps.clock = &clock_;
    endpoints_ = std::make_unique<EndpointController>(options, deps);
    ASSERT_TRUE(endpoints_->Start().ok());
    TransformControllerOptions transform;
    transform.work_dir = work_dir() + "/transform";
    transform.retry_backoff = std::chrono::milliseconds(1);
    TransformControllerDeps transform_deps;
    transform_deps.database = db_.get();
    transform_deps.object_store = object_store_.get();
    transform_deps.log_store = log_store_.get();
    transform_deps.runtime = runtime_.get();
    transform_deps.endpoints = endpoints_.get();
    transform_deps.credentials = credentials_.get();
    transform_deps.clock = &clock_;
    controller_ = std::make_unique<TransformController>(transform, transform_deps);
    ASSERT_TRUE(controller_->Start().ok());
  }
  void TearDown() override {
    controller_.reset();
    endpoints_.reset();
  }

  void Put(const std::string& key, const std::string& body) {
    StringByteSource source(body);
    ASSERT_TRUE(object_store_->PutObject("bkt", key, source, {}).ok());
  }
  std::optional<std::string> Get(const std::string& key) {
    auto reader = object_store_->GetObject("bkt", key, std::nullopt);
    if (!reader.ok()) return std::nullopt;
    std::string out;
    char buffer[4096];
    while (true) {
      auto n = (*reader)->Read(buffer, sizeof(buffer));
      if (!n.ok() || *n == 0) break;
      out.append(buffer, *n);
    }
    return out;
  }

  // A job row as the API inserts it.
  void Create(const std::string& name, int instances, const json& extra = json::object()) {
    store::TransformJobRecord record;
    record.name = name;
    record.arn = "arn:aws:sagemaker:us-east-1:000000000000:transform-job/" + name;
    record.request = {{"TransformJobName", name},
                      {"ModelName", "m"},
                      {"TransformInput",
                       {{"DataSource", {{"S3DataSource", {{"S3DataType", "S3Prefix"}, {"S3Uri", "s3://bkt/in/"}}}}},
                        {"ContentType", "text/csv"},
                        {"SplitType", "Line"}}},
                      {"TransformOutput", {{"S3OutputPath", "s3://bkt/out/" + name}, {"AssembleWith", "Line"}}},
                      {"TransformResources", {{"InstanceType", "ml.m5.large"}, {"InstanceCount", instances}}}};
    record.request.merge_patch(extra);
    record.state.model = {{"ModelName", "m"},
                          {"PrimaryContainer", {{"Image", "local:/bin/true"}, {"Environment", {{"FROM_MODEL", "1"}}}}}};
    store::TransformJobRepository jobs(db_.get());
    ASSERT_TRUE(jobs.Insert(record).ok());
    controller_->Submit(name);
  }
  store::TransformJobRecord WaitEnded(const std::string& name) {
    store::TransformJobRepository jobs(db_.get());
    store::TransformJobRecord last;
    EXPECT_TRUE(WaitFor([&] {
      auto r = jobs.Get(name);
      if (!r.ok()) return false;
      last = *r;
      return !store::IsActive(r->status);
    })) << "job "
        << name << " still " << store::TransformJobStatusName(last.status);
    return last;
  }

  serving::RoutingTable routes_;
  std::unique_ptr<EndpointController> endpoints_;
  std::unique_ptr<TransformController> controller_;
};

TEST_F(TransformControllerTest, ObjectsGoRoundRobinToTheInstancesAndEveryOutputIsWritten) {
  for (int i = 0; i < 5; ++i) Put("in/sub/" + std::to_string(i) + ".csv", "1,2\n3,4\n");
  Create("job", 2, {{"Environment", {{"FROM_JOB", "2"}}}, {"MaxPayloadInMB", 1}});
  store::TransformJobRecord ended = WaitEnded("job");
  EXPECT_EQ(ended.status, store::TransformJobStatus::kCompleted) << ended.state.failure_reason;
  ASSERT_TRUE(ended.state.start_millis.has_value());
  ASSERT_TRUE(ended.end_millis.has_value());
  for (int i = 0; i < 5; ++i) {
    // One MultiRecord request per object; its answer "{}" with a line break added (AssembleWith Line).
    EXPECT_EQ(Get("out/job/sub/" + std::to_string(i) + ".csv.out"), "{}\n") << i;
  }
  // Two instances, launched as serving instances with the batch environment.
  std::vector<std::string> launches = runtime_->launches();
  ASSERT_EQ(launches.size(), 2u);
  for (const std::string& id : launches) {
    EXPECT_TRUE(id.starts_with("transform-job-i-")) << id;
    auto spec = runtime_->spec(id);
    ASSERT_TRUE(spec.has_value());
    EXPECT_EQ(spec->argv.back(), "serve");
    EXPECT_EQ(spec->env.at("SAGEMAKER_BATCH"), "true");
    EXPECT_EQ(spec->env.at("SAGEMAKER_MAX_PAYLOAD_IN_MB"), "1");
    EXPECT_EQ(spec->env.count("SAGEMAKER_BATCH_STRATEGY"), 0u);
    EXPECT_EQ(spec->env.at("FROM_MODEL"), "1");
    EXPECT_EQ(spec->env.at("FROM_JOB"), "2");
  }
  // Objects 0, 2, 4 on one instance, 1 and 3 on the other: each data-log stream says which.
  auto streams =
      log_store_->ListStreams(kTransformLogGroup, "job/", observe::StreamOrder::kLogStreamName, false, 50, "");
  ASSERT_TRUE(streams.ok()) << streams.status().ToString();
  std::set<std::string> shares;
  for (const auto& stream : streams->streams) {
    if (!stream.name.ends_with("/data-log")) continue;
    auto events = log_store_->GetEvents(kTransformLogGroup, stream.name, observe::EventsQuery{});
    ASSERT_TRUE(events.ok());
    std::string share;
    for (const auto& e : events->events) {
      EXPECT_NE(e.message.find(": Completed, written to s3://bkt/out/job/sub/"), std::string::npos) << e.message;
      share += e.message.substr(e.message.find("sub/") + 4, 1);
    }
    std::sort(share.begin(), share.end());
    shares.insert(share);
  }
  EXPECT_EQ(shares, (std::set<std::string>{"024", "13"}));
  // Every instance stopped.
  EXPECT_TRUE(WaitFor([&] {
    for (const std::string& id : launches) {
      auto status = runtime_->Inspect(id);
      if (status.ok() && status->state == runtime::InstanceState::kRunning) return false;
    }
    return true;
  }));
}

TEST_F(TransformControllerTest, AnEmptySelectionFailsTheJob) {
  Create("empty", 1);
  store::TransformJobRecord ended = WaitEnded("empty");
  EXPECT_EQ(ended.status, store::TransformJobStatus::kFailed);
  EXPECT_NE(ended.state.failure_reason.find("ClientError: No S3 objects found"), std::string::npos)
      << ended.state.failure_reason;
}

TEST_F(TransformControllerTest, AnInstanceThatNeverAnswersPingFailsTheJob) {
  Put("in/a.csv", "1\n");
  FakeRuntime::Behavior silent;
  silent.serve_ping = false;
  runtime_->SetDefaultBehavior(silent);
  Create("silent", 1);
  store::TransformJobRecord ended = WaitEnded("silent");
  EXPECT_EQ(ended.status, store::TransformJobStatus::kFailed);
  EXPECT_NE(ended.state.failure_reason.find("did not pass the ping health check"), std::string::npos)
      << ended.state.failure_reason;
  EXPECT_FALSE(Get("out/silent/a.csv.out").has_value());
}

TEST_F(TransformControllerTest, StopEndsStoppedWithoutOutputs) {
  Put("in/a.csv", "1\n");
  FakeRuntime::Behavior silent;
  silent.serve_ping = false;  // held at the /ping gate until the stop
  runtime_->SetDefaultBehavior(silent);
  Create("stopped", 1);
  ASSERT_TRUE(WaitFor([&] { return runtime_->launches().size() == 1; }));
  store::TransformJobRepository jobs(db_.get());
  ASSERT_TRUE(jobs.Mutate("stopped",
                          [](store::TransformJobRecord& r) {
                            r.status = store::TransformJobStatus::kStopping;
                            r.state.stop_requested = true;
                            return Status::Ok();
                          })
                  .ok());
  controller_->RequestStop("stopped");
  store::TransformJobRecord ended = WaitEnded("stopped");
  EXPECT_EQ(ended.status, store::TransformJobStatus::kStopped);
  EXPECT_TRUE(ended.state.failure_reason.empty());
  EXPECT_FALSE(Get("out/stopped/a.csv.out").has_value());
}

}  // namespace
}  // namespace kiln::control
