#include "control/tuning_controller.h"

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "store/test_util/temp_database.h"
#include "store/training_job_repository.h"
#include "store/tuning_job_repository.h"

namespace kiln::control {
namespace {

using nlohmann::json;
using store::TrainingJobRecord;
using store::TrainingJobStatus;
using store::TuningJobRecord;
using store::TuningJobStatus;

class ManualClock : public Clock {
 public:
  int64_t NowMillis() const override { return now; }
  int64_t now = 1'700'000'000'000;
};

// Creates the trials' rows directly (as CreateTrainingJob would) and records what it was asked.
class FakeLauncher : public TrialLauncher {
 public:
  explicit FakeLauncher(store::Database* db) : jobs_(db) {}
  Status Create(const Trial& trial) override {
    created.push_back(trial);
    if (fail_creates) return Status::InvalidArgument("ClientError: the image does not exist");
    if (transient_failures > 0) {
      --transient_failures;
      return Status::Unavailable("database is locked");
    }
    TrainingJobRecord record;
    record.name = trial.name;
    record.arn = "arn:aws:sagemaker:us-east-1:000000000000:training-job/" + trial.name;
    record.request = {{"TrainingJobName", trial.name}, {"TuningJobArn", trial.tuning_arn}};
    record.creation_millis = 1;
    return jobs_.Insert(record);
  }
  Status Stop(const std::string& name) override {
    stopped.push_back(name);
    auto updated = jobs_.Mutate(name, [](TrainingJobRecord& r) {
      if (r.status != TrainingJobStatus::kInProgress) return Status::FailedPrecondition("not running");
      r.status = TrainingJobStatus::kStopping;
      return Status::Ok();
    });
    return updated.status();
  }
  std::vector<Trial> created;
  std::vector<std::string> stopped;
  bool fail_creates = false;
  int transient_failures = 0;

 private:
  store::TrainingJobRepository jobs_;
};

class TuningControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    metrics_ = std::make_unique<observe::MetricStore>(db_.get());
    launcher_ = std::make_unique<FakeLauncher>(db_.get());
    TuningControllerOptions options;
    options.region = "us-east-1";
    options.account_id = "000000000000";
    TuningControllerDeps deps;
    deps.database = db_.get();
    deps.metric_store = metrics_.get();
    deps.launcher = launcher_.get();
    deps.clock = &clock_;
    controller_ = std::make_unique<TuningController>(options, deps);
  }

  static json Request(const std::string& strategy, int parallel, int max_jobs, json ranges) {
    json config = {{"Strategy", strategy},
                   {"ResourceLimits", {{"MaxParallelTrainingJobs", parallel}}},
                   {"ParameterRanges", ranges},
                   {"HyperParameterTuningJobObjective", {{"Type", "Minimize"}, {"MetricName", "loss"}}}};
    if (max_jobs > 0) config["ResourceLimits"]["MaxNumberOfTrainingJobs"] = max_jobs;
    return {{"HyperParameterTuningJobName", "tune"},
            {"HyperParameterTuningJobConfig", config},
            {"TrainingJobDefinition",
             {{"AlgorithmSpecification",
               {{"TrainingImage", "local:python3"},
                {"TrainingInputMode", "File"},
                {"MetricDefinitions", json::array({{{"Name", "loss"}, {"Regex", "loss=([0-9.]+)"}}})}}},
              {"RoleArn", "arn:aws:iam::000000000000:role/r"},
              {"OutputDataConfig", {{"S3OutputPath", "s3://b/out"}}},
              {"StoppingCondition", {{"MaxRuntimeInSeconds", 600}}},
              {"StaticHyperParameters", {{"epochs", "9"}}}}}};
  }

  static json IntegerRange() {
    return {{"IntegerParameterRanges",
             json::array({{{"Name", "x"}, {"MinValue", "1"}, {"MaxValue", "100"}, {"ScalingType", "Linear"}}})}};
  }

  void Insert(json request) {
    TuningJobRecord record;
    record.name = request["HyperParameterTuningJobName"];
    record.arn = TuningJobArn("us-east-1", "000000000000", record.name);
    record.request = std::move(request);
    record.status = TuningJobStatus::kInProgress;
    record.creation_millis = clock_.now;
    ASSERT_TRUE(store::TuningJobRepository(db_.get()).Insert(record).ok());
  }

  TuningJobRecord Job() { return store::TuningJobRepository(db_.get()).Get("tune").value(); }

  // Ends training job `name` with `status` and (when given) its final objective.
  void End(const std::string& name, TrainingJobStatus status, std::optional<double> loss,
           const std::string& failure = "") {
    auto done = store::TrainingJobRepository(db_.get()).Mutate(name, [&](TrainingJobRecord& r) {
      r.status = status;
      r.training_end_millis = clock_.now;
      if (loss) r.state.final_metrics["loss"] = {.value = *loss, .timestamp_millis = clock_.now};
      if (!failure.empty()) r.state.failure_reason = failure;
      return Status::Ok();
    });
    ASSERT_TRUE(done.ok()) << done.status().ToString();
  }

  void Report(const std::string& name, const std::vector<double>& values) {
    int64_t t = clock_.now;
    for (double v : values)
      ASSERT_TRUE(metrics_->Put("/aws/sagemaker/TrainingJobs", "loss", {{"Host", name + "/algo-1"}}, ++t, v).ok());
  }

  std::vector<std::string> Running() {
    std::vector<std::string> names;
    for (const auto& trial : Job().state.trials) {
      if (trial.status == "InProgress") names.push_back(trial.name);
    }
    return names;
  }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<observe::MetricStore> metrics_;
  std::unique_ptr<FakeLauncher> launcher_;
  ManualClock clock_;
  std::unique_ptr<TuningController> controller_;
};

TEST_F(TuningControllerTest, LaunchesUpToTheParallelLimitThenRefillsUntilTheBudgetAndCompletes) {
  Insert(Request("Random", 2, 5, IntegerRange()));
  controller_->ReconcileAll();
  ASSERT_EQ(launcher_->created.size(), 2u);
  const std::regex name_pattern("tune-00[12]-[0-9a-f]{8}");
  for (const auto& trial : launcher_->created) {
    EXPECT_TRUE(std::regex_match(trial.name, name_pattern)) << trial.name;
    EXPECT_EQ(trial.objective_metric, "loss");
    EXPECT_EQ(trial.tuning_arn, "arn:aws:sagemaker:us-east-1:000000000000:hyper-parameter-tuning-job/tune");
    ASSERT_EQ(trial.tuned.count("x"), 1u);
    int x = std::stoi(trial.tuned.at("x"));
    EXPECT_GE(x, 1);
    EXPECT_LE(x, 100);
  }
  controller_->ReconcileAll();  // nothing ended: nothing more
  EXPECT_EQ(launcher_->created.size(), 2u);
  double loss = 10;
  while (Job().status == TuningJobStatus::kInProgress) {
    for (const std::string& name : Running()) End(name, TrainingJobStatus::kCompleted, loss--);
    clock_.now += 1000;
    controller_->ReconcileAll();
    ASSERT_LE(launcher_->created.size(), 5u);
  }
  TuningJobRecord job = Job();
  EXPECT_EQ(job.status, TuningJobStatus::kCompleted);
  EXPECT_EQ(job.state.trials.size(), 5u);
  for (const auto& trial : job.state.trials) {
    EXPECT_EQ(trial.status, "Completed");
    EXPECT_TRUE(trial.objective.has_value());
  }
  EXPECT_TRUE(job.end_millis.has_value());
}

TEST_F(TuningControllerTest, GridEnumeratesExactlyTheProductOnce) {
  json ranges = {{"CategoricalParameterRanges", json::array({{{"Name", "a"}, {"Values", {"1", "2"}}},
                                                             {{"Name", "b"}, {"Values", {"x", "y", "z"}}}})}};
  Insert(Request("Grid", 4, 0, ranges));
  for (int i = 0; i < 10 && Job().status == TuningJobStatus::kInProgress; ++i) {
    controller_->ReconcileAll();
    for (const std::string& name : Running()) End(name, TrainingJobStatus::kCompleted, 1.0);
  }
  controller_->ReconcileAll();
  std::set<std::pair<std::string, std::string>> seen;
  for (const auto& trial : launcher_->created) seen.insert({trial.tuned.at("a"), trial.tuned.at("b")});
  EXPECT_EQ(launcher_->created.size(), 6u);
  EXPECT_EQ(seen.size(), 6u);
  EXPECT_EQ(Job().status, TuningJobStatus::kCompleted);
}

TEST_F(TuningControllerTest, AStopStopsEveryRunningTrialAndEndsStoppedWhenTheyHaveEnded) {
  Insert(Request("Random", 3, 10, IntegerRange()));
  controller_->ReconcileAll();
  ASSERT_EQ(launcher_->created.size(), 3u);
  ASSERT_TRUE(store::TuningJobRepository(db_.get())
                  .Mutate("tune",
                          [](TuningJobRecord& r) {
                            r.status = TuningJobStatus::kStopping;
                            r.state.stop_requested = true;
                            return Status::Ok();
                          })
                  .ok());
  controller_->ReconcileAll();
  EXPECT_EQ(launcher_->stopped.size(), 3u);
  EXPECT_EQ(launcher_->created.size(), 3u);  // nothing new after a stop
  EXPECT_EQ(Job().status, TuningJobStatus::kStopping);
  for (const auto& trial : launcher_->created) End(trial.name, TrainingJobStatus::kStopped, std::nullopt);
  controller_->ReconcileAll();
  EXPECT_EQ(Job().status, TuningJobStatus::kStopped);
}

TEST_F(TuningControllerTest, ATrialWrittenButNeverCreatedIsCreatedOnTheNextPass) {
  Insert(Request("Random", 1, 3, IntegerRange()));
  ASSERT_TRUE(store::TuningJobRepository(db_.get())
                  .Mutate("tune",
                          [](TuningJobRecord& r) {
                            store::TuningTrial trial;
                            trial.seq = 1;
                            trial.name = "tune-001-0123abcd";
                            trial.tuned = {{"x", "7"}};
                            trial.status = "InProgress";
                            r.state.trials.push_back(trial);
                            return Status::Ok();
                          })
                  .ok());
  controller_->ReconcileAll();
  ASSERT_EQ(launcher_->created.size(), 1u);
  EXPECT_EQ(launcher_->created[0].name, "tune-001-0123abcd");
  EXPECT_EQ(launcher_->created[0].tuned.at("x"), "7");
  EXPECT_TRUE(store::TrainingJobRepository(db_.get()).Get("tune-001-0123abcd").ok());
}

TEST_F(TuningControllerTest, TrialsThatKeepFailingEndTheJobFailedWithTheirReason) {
  Insert(Request("Random", 2, 20, IntegerRange()));
  for (int i = 0; i < 6 && Job().status == TuningJobStatus::kInProgress; ++i) {
    controller_->ReconcileAll();
    for (const std::string& name : Running()) {
      End(name, TrainingJobStatus::kFailed, std::nullopt, "AlgorithmError: exit status 1");
    }
  }
  controller_->ReconcileAll();
  TuningJobRecord job = Job();
  EXPECT_EQ(job.status, TuningJobStatus::kFailed);
  EXPECT_LT(job.state.trials.size(), 20u);
  ASSERT_TRUE(job.state.failure_reason.has_value());
  EXPECT_NE(job.state.failure_reason->find("AlgorithmError: exit status 1"), std::string::npos)
      << *job.state.failure_reason;
}

TEST_F(TuningControllerTest, TrialsThatCannotBeCreatedCountAsFailed) {
  launcher_->fail_creates = true;
  Insert(Request("Random", 1, 2, IntegerRange()));
  for (int i = 0; i < 4; ++i) controller_->ReconcileAll();
  TuningJobRecord job = Job();
  EXPECT_EQ(job.status, TuningJobStatus::kFailed);
  ASSERT_EQ(job.state.trials.size(), 2u);
  EXPECT_EQ(job.state.trials[0].status, "Failed");
  EXPECT_EQ(job.state.trials[0].failure_reason.value_or(""), "ClientError: the image does not exist");
}

TEST_F(TuningControllerTest, AutoEarlyStoppingStopsATrialWorseThanTheMedian) {
  json request = Request("Random", 4, 4, IntegerRange());
  request["HyperParameterTuningJobConfig"]["TrainingJobEarlyStoppingType"] = "Auto";
  Insert(request);
  controller_->ReconcileAll();
  ASSERT_EQ(launcher_->created.size(), 4u);
  std::vector<std::string> names;
  for (const auto& trial : launcher_->created) names.push_back(trial.name);
  for (int i = 0; i < 3; ++i) {
    Report(names[i], {1.0, 0.8, 0.6, 0.5});
    End(names[i], TrainingJobStatus::kCompleted, 0.5);
  }
  Report(names[3], {5.0, 4.9, 4.8});
  controller_->ReconcileAll();
  EXPECT_EQ(launcher_->stopped, std::vector<std::string>{names[3]});
  TuningJobRecord job = Job();
  ASSERT_TRUE(job.state.trials[3].early_stopped.has_value());
  End(names[3], TrainingJobStatus::kStopped, 4.8);
  controller_->ReconcileAll();
  EXPECT_EQ(Job().status, TuningJobStatus::kCompleted);
}

TEST_F(TuningControllerTest, ReachingTheTargetObjectiveStopsTheRunningTrialsAndCompletes) {
  json request = Request("Random", 2, 50, IntegerRange());
  request["HyperParameterTuningJobConfig"]["TuningJobCompletionCriteria"] = {{"TargetObjectiveMetricValue", 0.1}};
  Insert(request);
  controller_->ReconcileAll();
  ASSERT_EQ(launcher_->created.size(), 2u);
  End(launcher_->created[0].name, TrainingJobStatus::kCompleted, 0.05);
  controller_->ReconcileAll();
  EXPECT_EQ(launcher_->stopped, std::vector<std::string>{launcher_->created[1].name});
  EXPECT_EQ(launcher_->created.size(), 2u);
  End(launcher_->created[1].name, TrainingJobStatus::kStopped, std::nullopt);
  controller_->ReconcileAll();
  TuningJobRecord job = Job();
  EXPECT_EQ(job.status, TuningJobStatus::kCompleted);
  EXPECT_TRUE(job.state.stop_reason.has_value());
}

TEST_F(TuningControllerTest, MaxRuntimeEndsTheSearch) {
  json request = Request("Random", 1, 50, IntegerRange());
  request["HyperParameterTuningJobConfig"]["ResourceLimits"]["MaxRuntimeInSeconds"] = 120;
  Insert(request);
  controller_->ReconcileAll();
  ASSERT_EQ(launcher_->created.size(), 1u);
  clock_.now += 121'000;
  controller_->ReconcileAll();
  EXPECT_EQ(launcher_->stopped.size(), 1u);
  End(launcher_->created[0].name, TrainingJobStatus::kStopped, 3.0);
  controller_->ReconcileAll();
  EXPECT_EQ(Job().status, TuningJobStatus::kCompleted);
  EXPECT_EQ(launcher_->created.size(), 1u);
}

TEST_F(TuningControllerTest, HyperbandAssignsBracketsAndStopsATrialAtMaxResource) {
  json request = Request("Hyperband", 2, 2, IntegerRange());
  request["HyperParameterTuningJobConfig"]["StrategyConfig"] = {
      {"HyperbandStrategyConfig", {{"MinResource", 1}, {"MaxResource", 3}}}};
  Insert(request);
  controller_->ReconcileAll();
  ASSERT_EQ(launcher_->created.size(), 2u);
  for (const auto& trial : Job().state.trials) EXPECT_GE(trial.bracket, 0);
  const std::string name = launcher_->created[0].name;
  Report(name, {1.0, 0.9, 0.8});
  controller_->ReconcileAll();
  EXPECT_NE(std::find(launcher_->stopped.begin(), launcher_->stopped.end(), name), launcher_->stopped.end());
}

TEST_F(TuningControllerTest, NullMembersInAStoredRequestAreAbsentOnes) {
  json request = Request("Random", 2, 2, IntegerRange());
  request["HyperParameterTuningJobConfig"]["RandomSeed"] = nullptr;
  request["HyperParameterTuningJobConfig"]["ResourceLimits"]["MaxRuntimeInSeconds"] = nullptr;
  request["WarmStartConfig"] = nullptr;
  request["TrainingJobDefinition"]["DefinitionName"] = nullptr;
  request["TrainingJobDefinition"]["HyperParameterRanges"] = nullptr;
  request["TrainingJobDefinition"]["TuningObjective"] = nullptr;
  Insert(request);
  controller_->ReconcileAll();
  ASSERT_EQ(launcher_->created.size(), 2u);
  EXPECT_EQ(launcher_->created[0].objective_metric, "loss");  // the job's objective, not a null one
  EXPECT_EQ(Job().status, TuningJobStatus::kInProgress);
}

TEST_F(TuningControllerTest, ARequestNoCheckForesawFailsItsJobNotTheServer) {
  json request = Request("Random", 2, 2, IntegerRange());
  request["HyperParameterTuningJobConfig"]["ResourceLimits"]["MaxParallelTrainingJobs"] = "two";
  Insert(request);
  controller_->ReconcileAll();  // must not throw
  TuningJobRecord job = Job();
  EXPECT_EQ(job.status, TuningJobStatus::kFailed);
  EXPECT_NE(job.state.failure_reason.value_or("").find("InternalServerError"), std::string::npos);
  EXPECT_TRUE(launcher_->created.empty());
}

TEST_F(TuningControllerTest, ATransientCreateErrorIsRetriedNotCountedAsAFailure) {
  launcher_->transient_failures = 1;
  Insert(Request("Random", 1, 3, IntegerRange()));
  controller_->ReconcileAll();
  ASSERT_EQ(launcher_->created.size(), 1u);
  EXPECT_EQ(Job().state.trials[0].status, "InProgress");
  EXPECT_FALSE(store::TrainingJobRepository(db_.get()).Get(launcher_->created[0].name).ok());
  controller_->ReconcileAll();  // the row is missing: created now
  ASSERT_EQ(launcher_->created.size(), 2u);
  EXPECT_EQ(launcher_->created[1].name, launcher_->created[0].name);
  EXPECT_TRUE(store::TrainingJobRepository(db_.get()).Get(launcher_->created[0].name).ok());
}

TEST_F(TuningControllerTest, TrialsGetTheTuningJobsTagsAsTheyAreWhenLaunched) {
  Insert(Request("Random", 1, 2, IntegerRange()));
  const std::string arn = TuningJobArn("us-east-1", "000000000000", "tune");
  controller_->ReconcileAll();  // launched before any tag was added
  ASSERT_TRUE(store::TagRepository(db_.get()).Add(arn, {{"team", "ml"}}).ok());
  End(launcher_->created[0].name, TrainingJobStatus::kCompleted, 1.0);
  controller_->ReconcileAll();
  ASSERT_EQ(launcher_->created.size(), 2u);
  EXPECT_EQ(launcher_->created[0].tags, json::array());
  EXPECT_EQ(launcher_->created[1].tags, json::parse(R"([{"Key":"team","Value":"ml"}])"));
}

TEST_F(TuningControllerTest, RowsRecordWhenTheyChanged) {
  Insert(Request("Random", 1, 1, IntegerRange()));
  const int64_t created = clock_.now;
  clock_.now += 5000;
  controller_->ReconcileAll();
  EXPECT_EQ(Job().last_modified_millis, created + 5000);
  End(launcher_->created[0].name, TrainingJobStatus::kCompleted, 1.0);
  clock_.now += 5000;
  controller_->ReconcileAll();
  EXPECT_EQ(Job().status, TuningJobStatus::kCompleted);
  EXPECT_EQ(Job().last_modified_millis, created + 10000);
}

}  // namespace
}  // namespace kiln::control
