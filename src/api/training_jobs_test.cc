#include "api/training_jobs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "api/service_model.h"
#include "control/scheduler.h"
#include "store/test_util/temp_database.h"

namespace kiln::api {
namespace {

using nlohmann::json;

store::TrainingJobRecord Record() {
  store::TrainingJobRecord r;
  r.name = "Job-1";
  r.arn = "arn:aws:sagemaker:us-east-1:000000000000:training-job/Job-1";
  r.request = json::parse(R"({
    "TrainingJobName": "Job-1", "RoleArn": "arn:aws:iam::000000000000:role/r",
    "AlgorithmSpecification": {"TrainingImage": "local:/bin/true", "TrainingInputMode": "File"},
    "InputDataConfig": [{"ChannelName": "train",
                         "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/t/"}}}],
    "OutputDataConfig": {"S3OutputPath": "s3://b/out/"},
    "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
    "Environment": {"A": "1"}})");
  r.status = store::TrainingJobStatus::kCompleted;
  r.secondary_status = store::SecondaryStatus::kCompleted;
  r.creation_millis = 1714557600123;
  r.last_modified_millis = 1714557700000;
  r.training_end_millis = 1714557650500;
  r.state = *store::TrainingJobStateFromJson(json::parse(R"({"training_start_millis": 1714557640000,
    "transitions": [{"Status": "Training", "StartTime": 1714557640000, "EndTime": 1714557650500,
                     "StatusMessage": "Training image download completed. Training in progress."},
                    {"Status": "Completed", "StartTime": 1714557650500, "StatusMessage": "Training job completed"}],
    "final_metrics": {"loss": {"value": 0.25, "timestamp_millis": 1714557650000}}})"));
  return r;
}

// A queue that has "Job-1" waiting with two jobs ahead.
class FakeQueue : public control::TrainingQueueView {
 public:
  std::string PendingMessage(const std::string& job_name) const override {
    return job_name == queued ? "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB (2 jobs ahead)" : "";
  }
  std::string queued = "Job-1";
};

store::TrainingJobRecord PendingRecord() {
  store::TrainingJobRecord r = Record();
  r.status = store::TrainingJobStatus::kInProgress;
  r.secondary_status = store::SecondaryStatus::kPending;
  r.training_end_millis.reset();
  r.state = *store::TrainingJobStateFromJson(json::parse(R"({"transitions": [
    {"Status": "Starting", "StartTime": 1714557600123, "EndTime": 1714557600200, "StatusMessage": "Starting the training job"},
    {"Status": "Pending", "StartTime": 1714557600200, "StatusMessage": "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB"}]})"));
  return r;
}

TEST(RenderTrainingJobTest, APendingJobShowsItsLivePlaceInLine) {
  FakeQueue queue;
  json out = RenderTrainingJob(PendingRecord(), &queue);
  EXPECT_EQ(out["SecondaryStatus"], "Pending");
  ASSERT_EQ(out["SecondaryStatusTransitions"].size(), 2u);
  EXPECT_EQ(out["SecondaryStatusTransitions"][1]["StatusMessage"],
            "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB (2 jobs ahead)");
  EXPECT_EQ(out["SecondaryStatusTransitions"][0]["StatusMessage"], "Starting the training job");
}

TEST(RenderTrainingJobTest, TheRowsPendingMessageStandsWhenTheQueueHasNotTheJob) {
  FakeQueue queue;
  queue.queued = "someone-else";  // granted meanwhile: its row still says Pending for a moment
  const std::string stored = "Waiting for compute capacity: ml.m5.large needs 2 vCPUs and 8 GiB";
  EXPECT_EQ(RenderTrainingJob(PendingRecord(), &queue)["SecondaryStatusTransitions"][1]["StatusMessage"], stored);
  EXPECT_EQ(RenderTrainingJob(PendingRecord())["SecondaryStatusTransitions"][1]["StatusMessage"], stored);
  // Only a Pending job asks the queue.
  queue.queued = "Job-1";
  json done = RenderTrainingJob(Record(), &queue);
  EXPECT_EQ(done["SecondaryStatusTransitions"][1]["StatusMessage"], "Training job completed");
}

TEST(RenderTrainingJobTest, EchoesTheRequestWithAwsDefaults) {
  json out = RenderTrainingJob(Record());
  EXPECT_EQ(out["TrainingJobName"], "Job-1");
  // One '/' between S3OutputPath and the job name, known from creation.
  EXPECT_EQ(out["ModelArtifacts"]["S3ModelArtifacts"], "s3://b/out/Job-1/output/model.tar.gz");
  EXPECT_EQ(out["StoppingCondition"]["MaxRuntimeInSeconds"], 86400);
  EXPECT_EQ(out["OutputDataConfig"]["CompressionType"], "GZIP");
  EXPECT_EQ(out["OutputDataConfig"]["KmsKeyId"], "");  // read unguarded by the SDK's Estimator.attach
  const json& channel = out["InputDataConfig"][0];
  EXPECT_EQ(channel["CompressionType"], "None");
  EXPECT_EQ(channel["RecordWrapperType"], "None");
  EXPECT_EQ(channel["DataSource"]["S3DataSource"]["S3DataDistributionType"], "FullyReplicated");
  EXPECT_EQ(out["Environment"]["A"], "1");
  EXPECT_EQ(out["EnableManagedSpotTraining"], false);
  EXPECT_EQ(out["HyperParameters"], json::object());
}

TEST(RenderTrainingJobTest, KeepsAGivenKmsKeyId) {
  auto r = Record();
  r.request["OutputDataConfig"]["KmsKeyId"] = "arn:aws:kms:us-east-1:000000000000:key/k";
  EXPECT_EQ(RenderTrainingJob(r)["OutputDataConfig"]["KmsKeyId"], "arn:aws:kms:us-east-1:000000000000:key/k");
}

TEST(RenderTrainingJobTest, TimesAreEpochSecondsWithMillis) {
  json out = RenderTrainingJob(Record());
  EXPECT_DOUBLE_EQ(out["CreationTime"].get<double>(), 1714557600.123);
  EXPECT_DOUBLE_EQ(out["TrainingStartTime"].get<double>(), 1714557640.0);
  EXPECT_DOUBLE_EQ(out["TrainingEndTime"].get<double>(), 1714557650.5);
  EXPECT_EQ(out["TrainingTimeInSeconds"], 11);  // 10.5 s rounded up
  EXPECT_EQ(out["BillableTimeInSeconds"], 11);
  const json& transitions = out["SecondaryStatusTransitions"];
  ASSERT_EQ(transitions.size(), 2u);
  EXPECT_TRUE(transitions[0].contains("EndTime"));
  EXPECT_EQ(transitions[1]["StatusMessage"], "Training job completed");
  ASSERT_EQ(out["FinalMetricDataList"].size(), 1u);
  EXPECT_EQ(out["FinalMetricDataList"][0]["MetricName"], "loss");
  EXPECT_DOUBLE_EQ(out["FinalMetricDataList"][0]["Value"].get<double>(), 0.25);
}

TEST(RenderTrainingJobTest, FailureReasonOnlyWhenFailed) {
  auto r = Record();
  EXPECT_FALSE(RenderTrainingJob(r).contains("FailureReason"));
  r.status = store::TrainingJobStatus::kFailed;
  r.state.failure_reason = "AlgorithmError: boom, exit code: 1";
  EXPECT_EQ(RenderTrainingJob(r)["FailureReason"], "AlgorithmError: boom, exit code: 1");
}

// ---- Managed spot (issue 18): TrainingTimeInSeconds is wall time, BillableTimeInSeconds running time ----

// A managed-spot job that ended 100 s after its first start, having run 40.2 s in all.
store::TrainingJobRecord SpotRecord() {
  store::TrainingJobRecord r = Record();
  r.request["EnableManagedSpotTraining"] = true;
  r.request["StoppingCondition"] = {{"MaxRuntimeInSeconds", 3600}, {"MaxWaitTimeInSeconds", 7200}};
  r.state.training_start_millis = 1714557600000;
  r.training_end_millis = 1714557700000;
  r.state.interruptions = 2;
  r.state.billable_millis = 40200;
  return r;
}

TEST(RenderTrainingJobTest, ASpotJobBillsItsRunningTimeAndTrainsForItsWallTime) {
  json out = RenderTrainingJob(SpotRecord());
  EXPECT_EQ(out["EnableManagedSpotTraining"], true);
  EXPECT_EQ(out["TrainingTimeInSeconds"], 100);
  EXPECT_EQ(out["BillableTimeInSeconds"], 41);  // 40.2 s rounded up
  EXPECT_EQ(out["StoppingCondition"]["MaxWaitTimeInSeconds"], 7200);
}

TEST(RenderTrainingJobTest, ASpotJobsBillableTimeIsAtLeastOneSecondAndRoundsUp) {
  auto r = SpotRecord();
  r.state.billable_millis = 1;
  EXPECT_EQ(RenderTrainingJob(r)["BillableTimeInSeconds"], 1);
  r.state.billable_millis = 41000;  // whole seconds stay as they are
  EXPECT_EQ(RenderTrainingJob(r)["BillableTimeInSeconds"], 41);
}

TEST(RenderTrainingJobTest, ASpotRowWithoutBillableMillisShowsItsTrainingTimeAsBillable) {
  auto r = SpotRecord();
  r.state.billable_millis = 0;  // written before billable_millis existed
  json out = RenderTrainingJob(r);
  EXPECT_EQ(out["TrainingTimeInSeconds"], 100);
  EXPECT_EQ(out["BillableTimeInSeconds"], 100);
}

TEST(RenderTrainingJobTest, OnDemandJobsBillTheirTrainingTimeWhateverTheState) {
  auto r = SpotRecord();
  r.request.erase("EnableManagedSpotTraining");
  r.request["StoppingCondition"].erase("MaxWaitTimeInSeconds");
  json out = RenderTrainingJob(r);
  EXPECT_EQ(out["EnableManagedSpotTraining"], false);
  EXPECT_EQ(out["TrainingTimeInSeconds"], 100);
  EXPECT_EQ(out["BillableTimeInSeconds"], 100);  // billable_millis is a spot job's only
  r.request["EnableManagedSpotTraining"] = false;
  EXPECT_EQ(RenderTrainingJob(r)["BillableTimeInSeconds"], 100);
}

TEST(RenderTrainingJobTest, ASpotJobStillRunningHasNeitherTime) {
  auto r = SpotRecord();
  r.status = store::TrainingJobStatus::kInProgress;
  r.training_end_millis.reset();
  json out = RenderTrainingJob(r);
  EXPECT_FALSE(out.contains("TrainingTimeInSeconds"));
  EXPECT_FALSE(out.contains("BillableTimeInSeconds"));
  EXPECT_DOUBLE_EQ(out["TrainingStartTime"].get<double>(), 1714557600.0);  // the first start
}

// ---- CreateTrainingJob's managed-spot checks, through the service (the model's checks first) ----

class FixedClock : public Clock {
 public:
  int64_t NowMillis() const override { return 1714557600000; }
};

class CreateSpotTrainingJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    control::SchedulerOptions options;
    for (int i = 0; i < 8; ++i) options.capacity.cpus.push_back(i);
    options.capacity.memory_bytes = 64ull << 30;
    scheduler_ = std::make_unique<control::Scheduler>(options, &control::InstanceCatalog::BuiltIn());
    control::TrainingControllerDeps deps;
    deps.database = db_.get();
    deps.scheduler = scheduler_.get();
    // Never started: CreateTrainingJob uses CheckFeasible and Submit (which only queues).
    training_ = std::make_unique<control::TrainingController>(control::TrainingControllerOptions{}, deps);
    service_.SetModel(ServiceModel::SageMaker());
    TrainingJobsContext ctx;
    ctx.database = db_.get();
    ctx.controller = training_.get();
    ctx.account_id = "123456789012";
    ctx.region = "us-east-1";
    ctx.clock = &clock_;
    RegisterTrainingJobOperations(&service_, ctx);
  }

  static json Request(const std::string& name) {
    return {{"TrainingJobName", name},
            {"RoleArn", "arn:aws:iam::123456789012:role/kiln"},
            {"AlgorithmSpecification", {{"TrainingImage", "local:/bin/true"}, {"TrainingInputMode", "File"}}},
            {"OutputDataConfig", {{"S3OutputPath", "s3://b/out/"}}},
            {"ResourceConfig", {{"InstanceType", "ml.m5.large"}, {"InstanceCount", 1}, {"VolumeSizeInGB", 1}}},
            {"StoppingCondition", {{"MaxRuntimeInSeconds", 3600}}}};
  }
  static json Spot(const std::string& name, std::optional<int64_t> max_wait) {
    json request = Request(name);
    request["EnableManagedSpotTraining"] = true;
    if (max_wait) request["StoppingCondition"]["MaxWaitTimeInSeconds"] = *max_wait;
    return request;
  }

  // {status, __type, message} of the call.
  std::tuple<int, std::string, std::string> Call(const std::string& operation, const json& input) {
    aws::RequestContext context;
    context.request_id = "req";
    auto response = service_.Handle(context, operation, input.dump());
    json body = response.body.empty() ? json::object() : json::parse(response.body);
    return {response.status, body.value("__type", ""), body.value("message", "")};
  }
  // The ValidationException's message CreateTrainingJob answers; and no job was created.
  std::string Refused(const json& request) {
    auto [status, type, message] = Call("CreateTrainingJob", request);
    EXPECT_EQ(status, 400) << request.dump();
    EXPECT_EQ(type, "ValidationException") << message;
    EXPECT_FALSE(store::TrainingJobRepository(db_.get()).Get(request["TrainingJobName"].get<std::string>()).ok())
        << request.dump();
    return message;
  }
  json Describe(const std::string& name) {
    aws::RequestContext context;
    context.request_id = "req";
    auto response = service_.Handle(context, "DescribeTrainingJob", json{{"TrainingJobName", name}}.dump());
    EXPECT_EQ(response.status, 200) << response.body;
    return json::parse(response.body);
  }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<control::Scheduler> scheduler_;
  std::unique_ptr<control::TrainingController> training_;
  FixedClock clock_;
  JsonService service_{"SageMaker", "sagemaker", aws::Protocol::kJson11};
};

TEST_F(CreateSpotTrainingJobTest, ASpotJobWithAMaxWaitAtLeastItsMaxRuntimeIsCreated) {
  for (auto [name, max_wait] : {std::pair{"spot-longer", 7200}, std::pair{"spot-equal", 3600}}) {
    auto [status, type, message] = Call("CreateTrainingJob", Spot(name, max_wait));
    ASSERT_EQ(status, 200) << name << ": " << type << " " << message;
    json out = Describe(name);
    EXPECT_EQ(out["EnableManagedSpotTraining"], true);
    EXPECT_EQ(out["StoppingCondition"]["MaxWaitTimeInSeconds"], max_wait);
    EXPECT_EQ(out["StoppingCondition"]["MaxRuntimeInSeconds"], 3600);
  }
}

TEST_F(CreateSpotTrainingJobTest, SpotWithoutMaxWaitTimeIsRefused) {
  EXPECT_EQ(Refused(Spot("no-wait", std::nullopt)),
            "Invalid MaxWaitTimeInSeconds. It must be present when EnableManagedSpotTraining is set to true");
}

TEST_F(CreateSpotTrainingJobTest, AMaxWaitTimeShorterThanTheMaxRuntimeIsRefused) {
  const std::string expected = "Invalid MaxWaitTimeInSeconds. It must be greater than or equal to MaxRuntimeInSeconds";
  EXPECT_EQ(Refused(Spot("short-wait", 3599)), expected);
  // Without MaxRuntimeInSeconds the comparison is with its default, 1 day.
  json no_runtime = Spot("short-wait-default", 3600);
  no_runtime["StoppingCondition"].erase("MaxRuntimeInSeconds");
  EXPECT_EQ(Refused(no_runtime), expected);
  no_runtime["StoppingCondition"]["MaxWaitTimeInSeconds"] = 86400;
  auto [status, type, message] = Call("CreateTrainingJob", no_runtime);
  EXPECT_EQ(status, 200) << type << " " << message;
}

TEST_F(CreateSpotTrainingJobTest, MaxWaitTimeWithoutSpotIsRefusedInAwsWords) {
  // AWS's message, word for word (no final period).
  const std::string expected =
      "Invalid MaxWaitTimeInSeconds. It is only supported when EnableManagedSpotTraining is set to true";
  json absent = Request("wait-no-spot");
  absent["StoppingCondition"]["MaxWaitTimeInSeconds"] = 7200;
  EXPECT_EQ(Refused(absent), expected);
  json off = absent;
  off["EnableManagedSpotTraining"] = false;
  EXPECT_EQ(Refused(off), expected);
}

TEST_F(CreateSpotTrainingJobTest, AMaxWaitTimeBelowOneIsTheModelsRangeError) {
  EXPECT_EQ(Refused(Spot("zero-wait", 0)),
            "1 validation error detected: Value '0' at 'stoppingCondition.maxWaitTimeInSeconds' failed to satisfy "
            "constraint: Member must have value greater than or equal to 1");
  // The range is checked before the cross-member rules, spot or not.
  json no_spot = Request("negative-wait");
  no_spot["StoppingCondition"]["MaxWaitTimeInSeconds"] = -5;
  EXPECT_EQ(Refused(no_spot),
            "1 validation error detected: Value '-5' at 'stoppingCondition.maxWaitTimeInSeconds' failed to satisfy "
            "constraint: Member must have value greater than or equal to 1");
}

TEST_F(CreateSpotTrainingJobTest, TuningTrialsGetTheSameChecks) {
  // CheckTrainingJobRequest: the checks of requests Kiln builds itself (a tuning job's trials).
  TrainingJobsContext ctx;
  ctx.database = db_.get();
  ctx.controller = training_.get();
  EXPECT_FALSE(CheckTrainingJobRequest(Spot("trial", 7200), ctx));
  auto error = CheckTrainingJobRequest(Spot("trial", 60), ctx);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code, "ValidationException");
  EXPECT_EQ(error->message, "Invalid MaxWaitTimeInSeconds. It must be greater than or equal to MaxRuntimeInSeconds");
}

// ---- CreateTrainingJob's distribution checks (issue 14) ----

json DistributedRequest(const std::string& type, const json& hyperparameters) {
  return {{"ResourceConfig", {{"InstanceType", type}, {"InstanceCount", 2}, {"VolumeSizeInGB", 1}}},
          {"HyperParameters", hyperparameters}};
}

// ---- Warm pools (training-contract.md §19) through the service ----

using WarmPoolApiTest = CreateSpotTrainingJobTest;

json WithKeepAlive(json request, int64_t seconds) {
  request["ResourceConfig"]["KeepAlivePeriodInSeconds"] = seconds;
  return request;
}

TEST_F(WarmPoolApiTest, KeepAliveWithSpotOrInstanceGroupsIsRefused) {
  EXPECT_THAT(Refused(WithKeepAlive(Spot("spot-pool", 7200), 600)),
              ::testing::HasSubstr("Warm pools are not supported with managed spot training"));
  json groups = WithKeepAlive(Request("group-pool"), 600);
  groups["ResourceConfig"].erase("InstanceType");
  groups["ResourceConfig"].erase("InstanceCount");
  groups["ResourceConfig"]["InstanceGroups"] =
      json::array({{{"InstanceGroupName", "a"}, {"InstanceType", "ml.m5.large"}, {"InstanceCount", 1}}});
  EXPECT_THAT(Refused(groups), ::testing::HasSubstr("heterogeneous clusters"));
  // The model's range: at most 21600 s (3600 in older documentation).
  auto [status, type, message] = Call("CreateTrainingJob", WithKeepAlive(Request("too-long"), 21601));
  EXPECT_EQ(type, "ValidationException") << message;
}

// Describe and List show the row's pool; WarmPoolStatusEquals filters on it.
TEST_F(WarmPoolApiTest, DescribeAndListShowTheWarmPoolStatus) {
  for (const char* name : {"kept", "reused", "plain"}) {
    auto [status, type, message] = Call("CreateTrainingJob", WithKeepAlive(Request(name), 600));
    ASSERT_EQ(status, 200) << type << " " << message;
  }
  store::TrainingJobRepository jobs(db_.get());
  ASSERT_TRUE(jobs.Mutate("kept",
                          [](store::TrainingJobRecord& r) {
                            r.status = store::TrainingJobStatus::kCompleted;
                            r.state.warm_pool.status = store::WarmPoolStatus::kAvailable;
                            return Status::Ok();
                          })
                  .ok());
  ASSERT_TRUE(jobs.Mutate("reused",
                          [](store::TrainingJobRecord& r) {
                            r.status = store::TrainingJobStatus::kCompleted;
                            r.state.warm_pool.status = store::WarmPoolStatus::kReused;
                            r.state.warm_pool.retained_millis = 42'900;
                            r.state.warm_pool.reused_by_job = "plain";
                            return Status::Ok();
                          })
                  .ok());
  EXPECT_EQ(Describe("kept")["WarmPoolStatus"], json({{"Status", "Available"}}));
  EXPECT_EQ(Describe("reused")["WarmPoolStatus"],
            json({{"Status", "Reused"}, {"ResourceRetainedBillableTimeInSeconds", 42}, {"ReusedByJob", "plain"}}));
  EXPECT_FALSE(Describe("plain").contains("WarmPoolStatus"));
  EXPECT_EQ(Describe("kept")["ResourceConfig"]["KeepAlivePeriodInSeconds"], 600);

  aws::RequestContext context;
  context.request_id = "req";
  auto list = [&](const json& input) {
    auto response = service_.Handle(context, "ListTrainingJobs", input.dump());
    EXPECT_EQ(response.status, 200) << response.body;
    std::map<std::string, json> out;
    const json body = json::parse(response.body);  // the loop must not iterate a temporary's member
    for (const json& s : body["TrainingJobSummaries"]) {
      out[s["TrainingJobName"].get<std::string>()] = s.value("WarmPoolStatus", json());
    }
    return out;
  };
  auto all = list(json::object());
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all["reused"], Describe("reused")["WarmPoolStatus"]);
  EXPECT_TRUE(all["plain"].is_null());
  EXPECT_EQ(list({{"WarmPoolStatusEquals", "Available"}}).size(), 1u);
  EXPECT_EQ(list({{"WarmPoolStatusEquals", "Reused"}}).count("reused"), 1u);
  EXPECT_TRUE(list({{"WarmPoolStatusEquals", "Terminated"}}).empty());
}

// UpdateTrainingJob: KeepAlivePeriodInSeconds while InProgress or while the pool is Available;
// nothing else of a finished job; never a period a spot job cannot have.
TEST_F(WarmPoolApiTest, UpdateChangesThePeriodOfARunningJobOrAnAvailablePool) {
  auto [status, type, message] = Call("CreateTrainingJob", WithKeepAlive(Request("job"), 600));
  ASSERT_EQ(status, 200) << message;
  auto update = [&](const json& extra) {
    json input = {{"TrainingJobName", "job"}};
    input.update(extra);
    return Call("UpdateTrainingJob", input);
  };
  const json period = {{"ResourceConfig", {{"KeepAlivePeriodInSeconds", 1200}}}};
  EXPECT_EQ(std::get<0>(update(period)), 200);
  EXPECT_EQ(Describe("job")["ResourceConfig"]["KeepAlivePeriodInSeconds"], 1200);
  store::TrainingJobRepository jobs(db_.get());
  ASSERT_TRUE(jobs.Mutate("job",
                          [](store::TrainingJobRecord& r) {
                            r.status = store::TrainingJobStatus::kCompleted;
                            r.state.warm_pool.status = store::WarmPoolStatus::kAvailable;
                            return Status::Ok();
                          })
                  .ok());
  EXPECT_EQ(std::get<0>(update({{"ResourceConfig", {{"KeepAlivePeriodInSeconds", 0}}}})), 200);
  EXPECT_EQ(Describe("job")["ResourceConfig"]["KeepAlivePeriodInSeconds"], 0);
  auto [s2, t2, m2] = update({{"RemoteDebugConfig", {{"EnableRemoteDebug", true}}}});
  EXPECT_EQ(t2, "ValidationException");
  EXPECT_THAT(m2, ::testing::HasSubstr("only its warm pool's ResourceConfig.KeepAlivePeriodInSeconds"));
  ASSERT_TRUE(jobs.Mutate("job",
                          [](store::TrainingJobRecord& r) {
                            r.state.warm_pool.status = store::WarmPoolStatus::kTerminated;
                            return Status::Ok();
                          })
                  .ok());
  auto [s3, t3, m3] = update(period);
  EXPECT_EQ(t3, "ValidationException");
  EXPECT_THAT(m3, ::testing::HasSubstr("is Completed"));
}

TEST(CheckDistributionTest, EverySwitchTheSdkSetsIsAccepted) {
  const auto& catalog = control::InstanceCatalog::BuiltIn();
  for (const char* key :
       {"sagemaker_mpi_enabled", "sagemaker_distributed_dataparallel_enabled", "sagemaker_pytorch_ddp_enabled",
        "sagemaker_torch_distributed_enabled", "sagemaker_pytorch_xla_multi_worker_enabled",
        "sagemaker_multi_worker_mirrored_strategy_enabled", "sagemaker_parameter_server_enabled",
        "sagemaker_training_compiler_enabled"}) {
    EXPECT_FALSE(CheckDistributionHyperParameters(DistributedRequest("ml.m5.xlarge", {{key, "true"}}), catalog)) << key;
  }
  // Other reserved keys and user hyperparameters are none of this check's business.
  EXPECT_FALSE(CheckDistributionHyperParameters(
      DistributedRequest("ml.m5.xlarge", {{"sagemaker_program", "\"train.py\""},
                                          {"sagemaker_instance_type", "\"ml.m5.xlarge\""},
                                          {"use_enabled", "true"},
                                          {"sagemaker_mpi_custom_mpi_options", "\"-x A\""}}),
      catalog));
  EXPECT_FALSE(CheckDistributionHyperParameters(json::object(), catalog));
}

TEST(CheckDistributionTest, AnUnknownSwitchIsRefusedNamingItAndTheKnownOnes) {
  auto error = CheckDistributionHyperParameters(
      DistributedRequest("ml.m5.xlarge", {{"sagemaker_horovod_enabled", "true"}}), control::InstanceCatalog::BuiltIn());
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code, "ValidationException");
  EXPECT_THAT(error->message, ::testing::StartsWith("HyperParameters.sagemaker_horovod_enabled is not a distribution "
                                                    "Kiln knows"));
  EXPECT_THAT(error->message, ::testing::HasSubstr("sagemaker_torch_distributed_enabled"));
  EXPECT_THAT(error->message, ::testing::HasSubstr("sagemaker_mpi_enabled"));
}

TEST(CheckDistributionTest, ProcessesPerHostMustBeAPositiveIntegerWithinTheCpuTypesVcpus) {
  const auto& catalog = control::InstanceCatalog::BuiltIn();
  const std::string key = "sagemaker_mpi_num_of_processes_per_host";
  for (const char* bad : {"0", "-2", "two", "1.5", "\"\""}) {
    auto error = CheckDistributionHyperParameters(
        DistributedRequest("ml.m5.xlarge", {{"sagemaker_mpi_enabled", "true"}, {key, bad}}), catalog);
    ASSERT_TRUE(error) << bad;
    EXPECT_EQ(error->code, "ValidationException");
    EXPECT_THAT(error->message, ::testing::HasSubstr(key + " must be a positive integer")) << bad;
  }
  // ml.m5.xlarge has 4 vCPUs.
  EXPECT_FALSE(CheckDistributionHyperParameters(DistributedRequest("ml.m5.xlarge", {{key, "4"}}), catalog));
  EXPECT_FALSE(CheckDistributionHyperParameters(DistributedRequest("ml.m5.xlarge", {{key, "\"2\""}}), catalog));
  auto too_many = CheckDistributionHyperParameters(DistributedRequest("ml.m5.xlarge", {{key, "5"}}), catalog);
  ASSERT_TRUE(too_many);
  EXPECT_EQ(too_many->message,
            "HyperParameters.sagemaker_mpi_num_of_processes_per_host is 5 but ml.m5.xlarge has 4 vCPUs: set it to at "
            "most 4, or choose a larger ResourceConfig.InstanceType.");
  // GPU types: more processes than GPUs is accepted (§12.2; the Training status message warns).
  EXPECT_FALSE(CheckDistributionHyperParameters(DistributedRequest("ml.g5.xlarge", {{key, "8"}}), catalog));
}

TEST(CheckCapacityTest, MoreHostsThanTheNodeHoldsIsResourceLimitExceededNamingInstanceCount) {
  control::SchedulerOptions options;
  for (int i = 0; i < 8; ++i) options.capacity.cpus.push_back(i);
  options.capacity.memory_bytes = 64ull << 30;
  control::Scheduler scheduler(options, &control::InstanceCatalog::BuiltIn());
  auto feasible = [&](const std::string& type, int count) { return scheduler.CheckFeasible(type, count); };
  EXPECT_FALSE(CheckCapacity("ml.m5.xlarge", 2, feasible));  // 2 x 4 vCPUs fit in 8
  auto error = CheckCapacity("ml.m5.xlarge", 5, feasible);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code, "ResourceLimitExceeded");
  EXPECT_THAT(error->message, ::testing::StartsWith("no capacity for 5 x ml.m5.xlarge on this host"));
  EXPECT_THAT(error->message,
              ::testing::EndsWith("; or lower ResourceConfig.InstanceCount to at most 2 (2 x ml.m5.xlarge fit on "
                                  "this node)"));
  auto none = CheckCapacity("ml.m5.4xlarge", 3, feasible);  // 16 vCPUs each: not even one
  ASSERT_TRUE(none);
  EXPECT_THAT(none->message, ::testing::HasSubstr("ResourceConfig.InstanceCount 3 cannot run here: not even one "
                                                  "ml.m5.4xlarge fits on this node"));
  // One instance: the scheduler's message alone.
  auto single = CheckCapacity("ml.m5.4xlarge", 1, feasible);
  ASSERT_TRUE(single);
  EXPECT_EQ(single->message, scheduler.CheckFeasible("ml.m5.4xlarge", 1).message());
}

}  // namespace
}  // namespace kiln::api
