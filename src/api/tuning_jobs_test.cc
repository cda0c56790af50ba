#include "api/tuning_jobs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "api/service_model.h"
#include "control/scheduler.h"
#include "store/test_util/temp_database.h"
#include "store/training_job_repository.h"

namespace kiln::api {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr const char* kRole = "arn:aws:iam::123456789012:role/kiln";
constexpr const char* kArnPrefix = "arn:aws:sagemaker:us-east-1:123456789012:";

class FakeClock : public Clock {
 public:
  int64_t NowMillis() const override { return now; }
  int64_t now = 1714557600000;
};

struct Answer {
  int status = 0;
  json body;
  std::string type() const { return body.value("__type", ""); }
  std::string message() const { return body.value("message", ""); }
};

// A definition whose trials report "val:acc", on a shape the test node holds.
json Definition() {
  return {{"AlgorithmSpecification",
           {{"TrainingImage", "local:/bin/true"},
            {"TrainingInputMode", "File"},
            {"MetricDefinitions", {{{"Name", "val:acc"}, {"Regex", "acc=([0-9.]+)"}}}}}},
          {"RoleArn", kRole},
          {"OutputDataConfig", {{"S3OutputPath", "s3://b/out/"}}},
          {"ResourceConfig", {{"InstanceType", "ml.m5.large"}, {"InstanceCount", 1}, {"VolumeSizeInGB", 1}}},
          {"StoppingCondition", {{"MaxRuntimeInSeconds", 3600}}},
          {"StaticHyperParameters", {{"epochs", "9"}}}};
}

json Ranges() {
  return json::parse(R"({
    "ContinuousParameterRanges": [{"Name": "lr", "MinValue": "0.001", "MaxValue": "0.1", "ScalingType": "Logarithmic"}],
    "IntegerParameterRanges": [{"Name": "depth", "MinValue": "2", "MaxValue": "8"}]})");
}

json CategoricalRanges() {
  return json::parse(R"({"CategoricalParameterRanges": [
    {"Name": "opt", "Values": ["sgd", "adam", "rmsprop"]}, {"Name": "act", "Values": ["relu", "tanh"]}]})");
}

json Request(const std::string& name, const std::string& strategy = "Bayesian") {
  return {{"HyperParameterTuningJobName", name},
          {"HyperParameterTuningJobConfig",
           {{"Strategy", strategy},
            {"HyperParameterTuningJobObjective", {{"Type", "Maximize"}, {"MetricName", "val:acc"}}},
            {"ResourceLimits", {{"MaxNumberOfTrainingJobs", 6}, {"MaxParallelTrainingJobs", 2}}},
            {"ParameterRanges", Ranges()}}},
          {"TrainingJobDefinition", Definition()}};
}

class TuningJobsApiTest : public ::testing::Test {
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
    // Never started: only CheckFeasible is used (CreateTrainingJob's capacity check).
    training_ = std::make_unique<control::TrainingController>(control::TrainingControllerOptions{}, deps);
    service_.SetModel(ServiceModel::SageMaker());
    TuningJobsContext ctx;
    ctx.database = db_.get();
    ctx.training = training_.get();
    ctx.on_created = [this](const std::string& name) { created_.push_back(name); };
    ctx.on_stop_requested = [this](const std::string& name) { stop_requested_.push_back(name); };
    ctx.account_id = "123456789012";
    ctx.region = "us-east-1";
    ctx.clock = &clock_;
    ctx.max_parallel_training_jobs = 10;
    ctx.max_number_of_training_jobs = 50;
    RegisterTuningJobOperations(&service_, ctx);
  }

  Answer Call(const std::string& operation, const json& input) {
    aws::RequestContext context;
    context.request_id = "req";
    auto response = service_.Handle(context, operation, input.dump());
    Answer a;
    a.status = response.status;
    a.body = response.body.empty() ? json::object() : json::parse(response.body);
    return a;
  }
  json Ok(const std::string& operation, const json& input) {
    Answer a = Call(operation, input);
    EXPECT_EQ(a.status, 200) << operation << ": " << a.body.dump();
    return a.body;
  }
  // Calls, expects the error `type`, returns its message.
  std::string Error(const std::string& type, const std::string& operation, const json& input) {
    Answer a = Call(operation, input);
    EXPECT_EQ(a.status, 400) << operation << ": " << a.body.dump();
    EXPECT_EQ(a.type(), type) << a.body.dump();
    return a.message();
  }
  std::string Invalid(const json& request) {
    return Error("ValidationException", "CreateHyperParameterTuningJob", request);
  }
  json Describe(const std::string& name) { return Ok("DescribeHyperParameterTuningJob", Named(name)); }
  static json Named(const std::string& name) { return {{"HyperParameterTuningJobName", name}}; }

  // Sets what the controller would have written.
  void SetRow(const std::string& name, store::TuningJobStatus status, std::vector<store::TuningTrial> trials) {
    store::TuningJobRepository repo(db_.get());
    auto r = repo.Mutate(name, [&](store::TuningJobRecord& rec) {
      rec.status = status;
      rec.state.trials = trials;
      if (store::IsTerminal(status)) rec.end_millis = clock_.now + 5000;
      return Status::Ok();
    });
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }

  static store::TuningTrial Trial(int seq, const std::string& status, std::optional<double> objective,
                                  const std::string& tuning = "tune") {
    store::TuningTrial t;
    t.seq = seq;
    char suffix[32];
    std::snprintf(suffix, sizeof(suffix), "-%03d-0000abcd", seq);
    t.name = tuning + suffix;
    t.tuned = {{"lr", "0.01"}, {"depth", std::to_string(seq)}};
    t.creation_millis = 1714557600000 + seq * 1000;
    t.status = status;
    t.objective = objective;
    if (status != "InProgress") {
      t.start_millis = t.creation_millis + 100;
      t.end_millis = t.creation_millis + 900;
    }
    return t;
  }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  std::unique_ptr<control::Scheduler> scheduler_;
  std::unique_ptr<control::TrainingController> training_;
  FakeClock clock_;
  JsonService service_{"SageMaker", "sagemaker", aws::Protocol::kJson11};
  std::vector<std::string> created_, stop_requested_;
};

// ---- Create ----

TEST_F(TuningJobsApiTest, CreateStoresTheJobWithAwsDefaultsAndTellsTheController) {
  json request = Request("tune");
  request["Tags"] = {{{"Key", "team"}, {"Value", "ml"}}};
  json created = Ok("CreateHyperParameterTuningJob", request);
  EXPECT_EQ(created["HyperParameterTuningJobArn"], std::string(kArnPrefix) + "hyper-parameter-tuning-job/tune");
  EXPECT_EQ(created_, std::vector<std::string>{"tune"});

  json out = Describe("TUNE");  // names resolve in any case
  EXPECT_EQ(out["HyperParameterTuningJobName"], "tune");
  EXPECT_EQ(out["HyperParameterTuningJobStatus"], "InProgress");
  EXPECT_DOUBLE_EQ(out["CreationTime"].get<double>(), 1714557600.0);
  const json& config = out["HyperParameterTuningJobConfig"];
  EXPECT_EQ(config["Strategy"], "Bayesian");
  EXPECT_EQ(config["TrainingJobEarlyStoppingType"], "Off");
  EXPECT_EQ(config["ResourceLimits"]["MaxNumberOfTrainingJobs"], 6);
  EXPECT_FALSE(config.contains("RandomSeed"));  // only when given (the controller has its own default)
  // The SDK's attach and analytics read all three lists.
  EXPECT_EQ(config["ParameterRanges"]["CategoricalParameterRanges"], json::array());
  EXPECT_EQ(config["ParameterRanges"]["IntegerParameterRanges"][0]["ScalingType"], "Auto");
  EXPECT_EQ(config["ParameterRanges"]["ContinuousParameterRanges"][0]["ScalingType"], "Logarithmic");
  EXPECT_EQ(out["TrainingJobDefinition"]["AlgorithmSpecification"]["TrainingImage"], "local:/bin/true");
  EXPECT_EQ(out["TrainingJobDefinition"]["StaticHyperParameters"]["epochs"], "9");
  // As AWS shows it; the SDK's attach deletes it from here.
  EXPECT_EQ(out["TrainingJobDefinition"]["StaticHyperParameters"]["_tuning_objective_metric"], "val:acc");
  EXPECT_FALSE(out.contains("Tags"));
  EXPECT_EQ(out["TrainingJobStatusCounters"],
            json::parse(R"({"Completed":0,"InProgress":0,"RetryableError":0,"NonRetryableError":0,"Stopped":0})"));
  EXPECT_EQ(out["ObjectiveStatusCounters"], json::parse(R"({"Succeeded":0,"Pending":0,"Failed":0})"));
  EXPECT_FALSE(out.contains("BestTrainingJob"));
  EXPECT_FALSE(out.contains("HyperParameterTuningEndTime"));
  EXPECT_EQ(out["ConsumedResources"]["RuntimeInSeconds"], 0);
  clock_.now += 42500;  // a running job's runtime grows with the clock
  EXPECT_EQ(Describe("tune")["ConsumedResources"]["RuntimeInSeconds"], 42);

  store::TagRepository tags(db_.get());
  auto listed = tags.List(created["HyperParameterTuningJobArn"].get<std::string>());
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].key, "team");
  // The tag table holds them (the controller gives them to every trial), not the request.
  store::TuningJobRepository repo(db_.get());
  EXPECT_FALSE(repo.Get("tune")->request.contains("Tags"));
}

TEST_F(TuningJobsApiTest, ANameTakenInAnyCaseIsResourceInUse) {
  Ok("CreateHyperParameterTuningJob", Request("tune"));
  std::string message = Error("ResourceInUse", "CreateHyperParameterTuningJob", Request("TUNE"));
  EXPECT_THAT(message, HasSubstr("a hyperparameter tuning job with this name already exists"));
  EXPECT_THAT(message, HasSubstr("hyper-parameter-tuning-job/tune"));
  EXPECT_EQ(created_.size(), 1u);
}

TEST_F(TuningJobsApiTest, ExactlyOneDefinitionFormIsRequired) {
  json neither = Request("t");
  neither.erase("TrainingJobDefinition");
  EXPECT_EQ(Invalid(neither),
            "Exactly one of TrainingJobDefinition or TrainingJobDefinitions is required; this request gives "
            "neither.");
  json both = Request("t");
  json named = Definition();
  named["DefinitionName"] = "a";
  both["TrainingJobDefinitions"] = json::array({named});  // {named} alone is a copy under clang
  EXPECT_THAT(Invalid(both), HasSubstr("this request gives both."));
  EXPECT_TRUE(created_.empty());
}

TEST_F(TuningJobsApiTest, TheObjectiveMustBeAMetricTheAlgorithmDefines) {
  json request = Request("t");
  request["HyperParameterTuningJobConfig"]["HyperParameterTuningJobObjective"]["MetricName"] = "val:loss";
  EXPECT_EQ(Invalid(request),
            "The objective metric 'val:loss' is not defined by "
            "TrainingJobDefinition.AlgorithmSpecification.MetricDefinitions (defined: val:acc). Add a "
            "MetricDefinition named 'val:loss' whose Regex matches the value in the training log, or choose a "
            "defined metric.");
  request["TrainingJobDefinition"]["AlgorithmSpecification"].erase("MetricDefinitions");
  EXPECT_THAT(Invalid(request), HasSubstr("(none are defined)"));
}

TEST_F(TuningJobsApiTest, OnlyRandomAndGridRunWithoutAnObjective) {
  json request = Request("t");
  request["HyperParameterTuningJobConfig"].erase("HyperParameterTuningJobObjective");
  EXPECT_THAT(Invalid(request), StartsWith("TrainingJobDefinition has no objective metric: the Bayesian strategy "
                                           "needs HyperParameterTuningJobConfig.HyperParameterTuningJobObjective"));
  request["HyperParameterTuningJobConfig"]["Strategy"] = "Random";
  Ok("CreateHyperParameterTuningJob", request);
  // Early stopping compares objectives.
  json auto_stop = request;
  auto_stop["HyperParameterTuningJobName"] = "t2";
  auto_stop["HyperParameterTuningJobConfig"]["TrainingJobEarlyStoppingType"] = "Auto";
  EXPECT_THAT(Invalid(auto_stop), HasSubstr("TrainingJobEarlyStoppingType Auto compares training jobs"));
}

TEST_F(TuningJobsApiTest, RangesThatDoNotParseNameWhereTheyAre) {
  json request = Request("t");
  request["HyperParameterTuningJobConfig"]["ParameterRanges"]["IntegerParameterRanges"][0]["MinValue"] = "9";
  std::string message = Invalid(request);
  EXPECT_THAT(message, StartsWith("HyperParameterTuningJobConfig.ParameterRanges: "));
  // A range over a static hyperparameter.
  json clash = Request("t");
  clash["TrainingJobDefinition"]["StaticHyperParameters"]["depth"] = "3";
  EXPECT_THAT(Invalid(clash), StartsWith("HyperParameterTuningJobConfig.ParameterRanges: "));
  json none = Request("t");
  none["HyperParameterTuningJobConfig"].erase("ParameterRanges");
  EXPECT_EQ(Invalid(none),
            "TrainingJobDefinition has no hyperparameter ranges: give "
            "HyperParameterTuningJobConfig.ParameterRanges.");
  json automatic = Request("t");
  automatic["HyperParameterTuningJobConfig"]["ParameterRanges"]["AutoParameters"] = {
      {{"Name", "x"}, {"ValueHint", "1"}}};
  EXPECT_THAT(Invalid(automatic), HasSubstr("AutoParameters is not supported by Kiln"));
}

TEST_F(TuningJobsApiTest, GridTakesCategoricalRangesAndDefaultsToItsSize) {
  json request = Request("grid", "Grid");
  EXPECT_THAT(Invalid(request), HasSubstr("the Grid strategy searches CategoricalParameterRanges only"));
  request["HyperParameterTuningJobConfig"]["ParameterRanges"] = CategoricalRanges();
  request["HyperParameterTuningJobConfig"]["ResourceLimits"]["MaxNumberOfTrainingJobs"] = 7;
  EXPECT_EQ(Invalid(request),
            "HyperParameterTuningJobConfig.ResourceLimits.MaxNumberOfTrainingJobs is 7 but the Grid strategy has "
            "only 6 combinations of the categorical values to try; lower it to at most 6, or leave it out to try "
            "them all.");
  request["HyperParameterTuningJobConfig"]["ResourceLimits"].erase("MaxNumberOfTrainingJobs");
  Ok("CreateHyperParameterTuningJob", request);
  EXPECT_EQ(Describe("grid")["HyperParameterTuningJobConfig"]["ResourceLimits"]["MaxNumberOfTrainingJobs"], 6);
}

TEST_F(TuningJobsApiTest, MaxNumberOfTrainingJobsIsRequiredExceptForGrid) {
  json request = Request("t", "Random");
  request["HyperParameterTuningJobConfig"]["ResourceLimits"].erase("MaxNumberOfTrainingJobs");
  EXPECT_THAT(Invalid(request),
              StartsWith("HyperParameterTuningJobConfig.ResourceLimits.MaxNumberOfTrainingJobs is required for the "
                         "Random strategy"));
}

TEST_F(TuningJobsApiTest, KilnsCapsAreResourceLimitExceeded) {
  json parallel = Request("t");
  parallel["HyperParameterTuningJobConfig"]["ResourceLimits"]["MaxParallelTrainingJobs"] = 11;
  EXPECT_EQ(Error("ResourceLimitExceeded", "CreateHyperParameterTuningJob", parallel),
            "HyperParameterTuningJobConfig.ResourceLimits.MaxParallelTrainingJobs is 11 but Kiln runs at most 10 "
            "training jobs of a tuning job at once; lower it to at most 10.");
  json number = Request("t");
  number["HyperParameterTuningJobConfig"]["ResourceLimits"]["MaxNumberOfTrainingJobs"] = 51;
  EXPECT_EQ(Error("ResourceLimitExceeded", "CreateHyperParameterTuningJob", number),
            "HyperParameterTuningJobConfig.ResourceLimits.MaxNumberOfTrainingJobs is 51 but Kiln launches at most "
            "50 training jobs per tuning job; lower it to at most 50.");
  // A definition no node can run: CreateTrainingJob's capacity check, naming the definition.
  json big = Request("t");
  big["TrainingJobDefinition"]["ResourceConfig"]["InstanceType"] = "ml.m5.24xlarge";
  EXPECT_THAT(Error("ResourceLimitExceeded", "CreateHyperParameterTuningJob", big),
              StartsWith("TrainingJobDefinition: "));
}

TEST_F(TuningJobsApiTest, DefinitionsAreCheckedAsCreateTrainingJobChecksItsRequest) {
  json request = Request("t");
  request["TrainingJobDefinition"]["AlgorithmSpecification"].erase("TrainingImage");
  request["TrainingJobDefinition"]["AlgorithmSpecification"]["AlgorithmName"] = "xgboost";
  EXPECT_THAT(Invalid(request),
              StartsWith("TrainingJobDefinition: AlgorithmSpecification.AlgorithmName is not supported by Kiln"));
  json spot = Request("t");
  spot["TrainingJobDefinition"]["EnableManagedSpotTraining"] = true;
  EXPECT_THAT(Invalid(spot), StartsWith("TrainingJobDefinition: Invalid MaxWaitTimeInSeconds."));
  json no_resources = Request("t");
  no_resources["TrainingJobDefinition"].erase("ResourceConfig");
  EXPECT_THAT(Invalid(no_resources), StartsWith("TrainingJobDefinition: ResourceConfig (or "
                                                "HyperParameterTuningResourceConfig) is required"));
  // The tuning form of the resources is accepted.
  json tuning_rc = Request("t");
  tuning_rc["TrainingJobDefinition"].erase("ResourceConfig");
  tuning_rc["TrainingJobDefinition"]["HyperParameterTuningResourceConfig"] = {
      {"InstanceType", "ml.m5.large"}, {"InstanceCount", 1}, {"VolumeSizeInGB", 1}};
  Ok("CreateHyperParameterTuningJob", tuning_rc);
  json described = Describe("t")["TrainingJobDefinition"];
  EXPECT_TRUE(described.contains("HyperParameterTuningResourceConfig"));
  // What the trials run with, also as ResourceConfig (the SDK's attach reads it).
  EXPECT_EQ(described["ResourceConfig"],
            json({{"InstanceType", "ml.m5.large"}, {"InstanceCount", 1}, {"VolumeSizeInGB", 1}}));
}

TEST_F(TuningJobsApiTest, SeveralDefinitionsNeedUniqueNames) {
  json request = Request("multi");
  request.erase("TrainingJobDefinition");
  json a = Definition(), b = Definition();
  a["DefinitionName"] = "a";
  request["TrainingJobDefinitions"] = {a, b};
  EXPECT_THAT(Invalid(request), StartsWith("TrainingJobDefinitions[1]: DefinitionName is required"));
  b["DefinitionName"] = "a";
  request["TrainingJobDefinitions"] = {a, b};
  EXPECT_EQ(Invalid(request),
            "DefinitionName 'a' is used by more than one of TrainingJobDefinitions; give each definition its own "
            "name.");
  b["DefinitionName"] = "b";
  b["TuningObjective"] = {{"Type", "Maximize"}, {"MetricName", "val:acc"}};
  b["HyperParameterRanges"] = CategoricalRanges();
  request["TrainingJobDefinitions"] = {a, b};
  Ok("CreateHyperParameterTuningJob", request);
  json out = Describe("multi");
  ASSERT_EQ(out["TrainingJobDefinitions"].size(), 2u);
  // What each definition's trials use, as the SDK reads it per definition.
  EXPECT_EQ(out["TrainingJobDefinitions"][0]["TuningObjective"]["MetricName"], "val:acc");
  EXPECT_EQ(out["TrainingJobDefinitions"][0]["HyperParameterRanges"]["CategoricalParameterRanges"], json::array());
  EXPECT_EQ(out["TrainingJobDefinitions"][1]["HyperParameterRanges"]["CategoricalParameterRanges"].size(), 2u);
}

TEST_F(TuningJobsApiTest, NullMembersAreAbsentOnesAndAreNotStored) {
  json request = Request("nulls", "Hyperband");
  request["HyperParameterTuningJobConfig"]["StrategyConfig"] = {
      {"HyperbandStrategyConfig", {{"MinResource", nullptr}, {"MaxResource", 9}}}};
  request["HyperParameterTuningJobConfig"]["RandomSeed"] = nullptr;
  request["WarmStartConfig"] = nullptr;
  request["TrainingJobDefinition"]["TuningObjective"] = nullptr;
  Ok("CreateHyperParameterTuningJob", request);
  json stored = store::TuningJobRepository(db_.get()).Get("nulls")->request;
  EXPECT_FALSE(stored.contains("WarmStartConfig"));
  EXPECT_FALSE(stored["HyperParameterTuningJobConfig"].contains("RandomSeed"));
  EXPECT_FALSE(
      stored["HyperParameterTuningJobConfig"]["StrategyConfig"]["HyperbandStrategyConfig"].contains("MinResource"));
  EXPECT_EQ(Describe("nulls")["HyperParameterTuningJobStatus"], "InProgress");
}

TEST_F(TuningJobsApiTest, HyperbandRules) {
  json request = Request("hb", "Hyperband");
  request["HyperParameterTuningJobConfig"]["TrainingJobEarlyStoppingType"] = "Auto";
  EXPECT_EQ(Invalid(request),
            "TrainingJobEarlyStoppingType must be Off with the Hyperband strategy, which stops training jobs itself.");
  request["HyperParameterTuningJobConfig"].erase("TrainingJobEarlyStoppingType");
  request["TrainingJobDefinition"]["StaticHyperParameters"] = json::object();  // nothing to infer MaxResource from
  EXPECT_THAT(Invalid(request), StartsWith("TrainingJobDefinition: "));
  request["HyperParameterTuningJobConfig"]["StrategyConfig"] = {
      {"HyperbandStrategyConfig", {{"MinResource", 5}, {"MaxResource", 5}}}};
  EXPECT_THAT(Invalid(request), StartsWith("HyperParameterTuningJobConfig.StrategyConfig.HyperbandStrategyConfig: "));
  request["HyperParameterTuningJobConfig"]["StrategyConfig"]["HyperbandStrategyConfig"]["MaxResource"] = 27;
  Ok("CreateHyperParameterTuningJob", request);
  // With the epochs static hyperparameter MaxResource is inferred.
  json inferred = Request("hb2", "Hyperband");
  Ok("CreateHyperParameterTuningJob", inferred);
  json random = Request("r", "Random");
  random["HyperParameterTuningJobConfig"]["StrategyConfig"] = {{"HyperbandStrategyConfig", {{"MaxResource", 9}}}};
  EXPECT_THAT(Invalid(random), StartsWith("HyperParameterTuningJobConfig.StrategyConfig is only for the Hyperband"));
}

TEST_F(TuningJobsApiTest, WarmStartParentsMustExistHaveEndedAndMatch) {
  json request = Request("child");
  request["WarmStartConfig"] = {{"WarmStartType", "IdenticalDataAndAlgorithm"},
                                {"ParentHyperParameterTuningJobs", {{{"HyperParameterTuningJobName", "parent"}}}}};
  EXPECT_EQ(Invalid(request),
            "The parent hyperparameter tuning job 'parent' was not found: "
            "WarmStartConfig.ParentHyperParameterTuningJobs must name existing tuning jobs.");
  Ok("CreateHyperParameterTuningJob", Request("parent"));
  EXPECT_EQ(Invalid(request),
            "The parent hyperparameter tuning job 'parent' is InProgress; a warm-start parent must have ended "
            "(Completed, Failed or Stopped).");
  SetRow("parent", store::TuningJobStatus::kCompleted, {});
  json other_image = request;
  other_image["TrainingJobDefinition"]["AlgorithmSpecification"]["TrainingImage"] = "local:/bin/other";
  EXPECT_EQ(Invalid(other_image),
            "WarmStartType IdenticalDataAndAlgorithm needs the training image and input data of the parent "
            "'parent', but TrainingJobDefinition changes them; use TransferLearning to change them.");
  json other_metric = request;
  other_metric["HyperParameterTuningJobConfig"]["HyperParameterTuningJobObjective"]["MetricName"] = "val:loss";
  other_metric["TrainingJobDefinition"]["AlgorithmSpecification"]["MetricDefinitions"][0]["Name"] = "val:loss";
  EXPECT_EQ(Invalid(other_metric),
            "The objective metric 'val:loss' differs from that of the warm-start parent 'parent' ('val:acc'): a "
            "warm start needs the same objective metric as its parents.");
  other_image["WarmStartConfig"]["WarmStartType"] = "TransferLearning";
  Ok("CreateHyperParameterTuningJob", other_image);
}

TEST_F(TuningJobsApiTest, KilnTagsAreCheckedAtCreate) {
  // Every trial carries the tuning job's tags: a bad value fails the create, not each trial.
  json request = Request("t");
  request["Tags"] = {{{"Key", "kiln:remote-idle-stop-seconds"}, {"Value", "soon"}}};
  EXPECT_THAT(Invalid(request), HasSubstr("kiln:remote-idle-stop-seconds"));
  request["Tags"][0]["Value"] = "60";
  Ok("CreateHyperParameterTuningJob", request);
}

// ---- Describe: counters and best from the trials ----

TEST_F(TuningJobsApiTest, DescribeCountsTrialsAndPicksTheBest) {
  Ok("CreateHyperParameterTuningJob", Request("tune"));
  store::TuningTrial failed = Trial(4, "Failed", std::nullopt);
  failed.failure_reason = "AlgorithmError: boom";
  store::TuningTrial retryable = Trial(5, "Failed", std::nullopt);
  retryable.failure_reason = "InternalServerError: host lost";
  store::TuningTrial never_created = Trial(7, "Failed", std::nullopt);
  never_created.name = "";
  never_created.failure_reason = "ResourceLimitExceeded: no capacity";
  SetRow("tune", store::TuningJobStatus::kInProgress,
         {Trial(1, "Completed", 0.81), Trial(2, "Completed", 0.93), Trial(3, "Stopped", 0.5), failed, retryable,
          Trial(6, "InProgress", std::nullopt), never_created, Trial(8, "Completed", std::nullopt)});
  json out = Describe("tune");
  EXPECT_EQ(out["TrainingJobStatusCounters"],
            json::parse(R"({"Completed":3,"InProgress":1,"RetryableError":1,"NonRetryableError":2,"Stopped":1})"));
  EXPECT_EQ(out["ObjectiveStatusCounters"], json::parse(R"({"Succeeded":3,"Pending":1,"Failed":4})"));
  const json& best = out["BestTrainingJob"];  // Maximize: 0.93
  EXPECT_EQ(best["TrainingJobName"], "tune-002-0000abcd");
  EXPECT_EQ(best["TrainingJobArn"], std::string(kArnPrefix) + "training-job/tune-002-0000abcd");
  EXPECT_EQ(best["TuningJobName"], "tune");
  EXPECT_EQ(best["ObjectiveStatus"], "Succeeded");
  EXPECT_EQ(best["TunedHyperParameters"], json::parse(R"({"lr": "0.01", "depth": "2"})"));
  EXPECT_EQ(best["FinalHyperParameterTuningJobObjectiveMetric"],
            json::parse(R"({"Type": "Maximize", "MetricName": "val:acc", "Value": 0.93})"));
  EXPECT_DOUBLE_EQ(best["TrainingStartTime"].get<double>(), 1714557602.1);
  EXPECT_FALSE(best.contains("TrainingJobDefinitionName"));
  EXPECT_FALSE(out.contains("OverallBestTrainingJob"));  // no warm start
}

TEST_F(TuningJobsApiTest, MinimizePicksTheLowestAndTheEndIsShown) {
  json request = Request("tune");
  request["HyperParameterTuningJobConfig"]["HyperParameterTuningJobObjective"]["Type"] = "Minimize";
  Ok("CreateHyperParameterTuningJob", request);
  SetRow("tune", store::TuningJobStatus::kCompleted, {Trial(1, "Completed", 0.81), Trial(2, "Stopped", 0.2)});
  json out = Describe("tune");
  EXPECT_EQ(out["HyperParameterTuningJobStatus"], "Completed");
  EXPECT_EQ(out["BestTrainingJob"]["TrainingJobName"], "tune-002-0000abcd");
  EXPECT_DOUBLE_EQ(out["HyperParameterTuningEndTime"].get<double>(), 1714557605.0);
  clock_.now += 600000;  // an ended job's runtime stops at its end
  EXPECT_EQ(Describe("tune")["ConsumedResources"]["RuntimeInSeconds"], 5);
}

TEST_F(TuningJobsApiTest, OverallBestLooksAtTheWarmStartParents) {
  Ok("CreateHyperParameterTuningJob", Request("parent"));
  SetRow("parent", store::TuningJobStatus::kCompleted, {Trial(1, "Completed", 0.99, "parent")});
  json request = Request("child");
  request["WarmStartConfig"] = {{"WarmStartType", "TransferLearning"},
                                {"ParentHyperParameterTuningJobs", {{{"HyperParameterTuningJobName", "parent"}}}}};
  Ok("CreateHyperParameterTuningJob", request);
  SetRow("child", store::TuningJobStatus::kInProgress, {Trial(1, "Completed", 0.9, "child")});
  json out = Describe("child");
  EXPECT_EQ(out["BestTrainingJob"]["TrainingJobName"], "child-001-0000abcd");
  EXPECT_EQ(out["OverallBestTrainingJob"]["TrainingJobName"], "parent-001-0000abcd");
  EXPECT_EQ(out["OverallBestTrainingJob"]["TuningJobName"], "parent");
  EXPECT_EQ(out["WarmStartConfig"]["WarmStartType"], "TransferLearning");
}

TEST_F(TuningJobsApiTest, MissingJobsAreResourceNotFound) {
  for (const char* operation : {"DescribeHyperParameterTuningJob", "StopHyperParameterTuningJob",
                                "DeleteHyperParameterTuningJob", "ListTrainingJobsForHyperParameterTuningJob"}) {
    EXPECT_EQ(Error("ResourceNotFound", operation, Named("nope")),
              "Amazon SageMaker can't find a tuning job with name nope")
        << operation;
  }
}

// ---- ListHyperParameterTuningJobs ----

TEST_F(TuningJobsApiTest, ListSortsByNameByDefaultAndPages) {
  for (const char* name : {"b-tune", "a-tune", "c-other"}) {
    Ok("CreateHyperParameterTuningJob", Request(name));
    clock_.now += 1000;
  }
  SetRow("c-other", store::TuningJobStatus::kCompleted, {Trial(1, "Completed", 0.5, "c-other")});
  json first = Ok("ListHyperParameterTuningJobs", {{"MaxResults", 2}});
  ASSERT_EQ(first["HyperParameterTuningJobSummaries"].size(), 2u);
  EXPECT_EQ(first["HyperParameterTuningJobSummaries"][0]["HyperParameterTuningJobName"], "a-tune");
  EXPECT_EQ(first["HyperParameterTuningJobSummaries"][1]["HyperParameterTuningJobName"], "b-tune");
  ASSERT_TRUE(first.contains("NextToken"));
  json second = Ok("ListHyperParameterTuningJobs", {{"MaxResults", 2}, {"NextToken", first["NextToken"]}});
  ASSERT_EQ(second["HyperParameterTuningJobSummaries"].size(), 1u);
  const json& c = second["HyperParameterTuningJobSummaries"][0];
  EXPECT_EQ(c["HyperParameterTuningJobName"], "c-other");
  EXPECT_EQ(c["HyperParameterTuningJobStatus"], "Completed");
  EXPECT_EQ(c["Strategy"], "Bayesian");
  EXPECT_EQ(c["ResourceLimits"]["MaxNumberOfTrainingJobs"], 6);
  EXPECT_EQ(c["TrainingJobStatusCounters"]["Completed"], 1);
  EXPECT_EQ(c["ObjectiveStatusCounters"]["Succeeded"], 1);
  EXPECT_TRUE(c.contains("HyperParameterTuningEndTime"));
  EXPECT_FALSE(second.contains("NextToken"));

  json by_time = Ok("ListHyperParameterTuningJobs", {{"SortBy", "CreationTime"}, {"SortOrder", "Descending"}});
  EXPECT_EQ(by_time["HyperParameterTuningJobSummaries"][0]["HyperParameterTuningJobName"], "c-other");
  json filtered = Ok("ListHyperParameterTuningJobs", {{"NameContains", "TUNE"}, {"StatusEquals", "InProgress"}});
  EXPECT_EQ(filtered["HyperParameterTuningJobSummaries"].size(), 2u);
  // A token is bound to its filters.
  EXPECT_EQ(Error("ValidationException", "ListHyperParameterTuningJobs",
                  {{"MaxResults", 2}, {"NameContains", "x"}, {"NextToken", first["NextToken"]}}),
            "The provided NextToken is invalid.");
}

// ---- ListTrainingJobsForHyperParameterTuningJob ----

TEST_F(TuningJobsApiTest, TrialsListSortsFiltersAndPages) {
  Ok("CreateHyperParameterTuningJob", Request("tune"));
  store::TuningTrial failed = Trial(3, "Failed", std::nullopt);
  failed.failure_reason = "AlgorithmError: boom";
  SetRow("tune", store::TuningJobStatus::kInProgress,
         {Trial(1, "Completed", 0.7), Trial(2, "Completed", 0.9), failed, Trial(4, "InProgress", std::nullopt),
          Trial(5, "Stopped", 0.8)});
  const json name = Named("tune");

  json all = Ok("ListTrainingJobsForHyperParameterTuningJob", name);
  ASSERT_EQ(all["TrainingJobSummaries"].size(), 5u);
  EXPECT_EQ(all["TrainingJobSummaries"][0]["TrainingJobName"], "tune-001-0000abcd");
  EXPECT_EQ(all["TrainingJobSummaries"][2]["FailureReason"], "AlgorithmError: boom");
  EXPECT_EQ(all["TrainingJobSummaries"][2]["ObjectiveStatus"], "Failed");
  EXPECT_EQ(all["TrainingJobSummaries"][3]["ObjectiveStatus"], "Pending");
  EXPECT_FALSE(all["TrainingJobSummaries"][3].contains("FinalHyperParameterTuningJobObjectiveMetric"));

  // Sorted by the objective: trials without one are left out.
  json by_value = name;
  by_value["SortBy"] = "FinalObjectiveMetricValue";
  by_value["SortOrder"] = "Descending";
  json ranked = Ok("ListTrainingJobsForHyperParameterTuningJob", by_value);
  ASSERT_EQ(ranked["TrainingJobSummaries"].size(), 3u);
  EXPECT_EQ(ranked["TrainingJobSummaries"][0]["TrainingJobName"], "tune-002-0000abcd");
  EXPECT_EQ(ranked["TrainingJobSummaries"][1]["TrainingJobName"], "tune-005-0000abcd");
  EXPECT_EQ(ranked["TrainingJobSummaries"][2]["TrainingJobName"], "tune-001-0000abcd");

  json completed = name;
  completed["StatusEquals"] = "Completed";
  EXPECT_EQ(Ok("ListTrainingJobsForHyperParameterTuningJob", completed)["TrainingJobSummaries"].size(), 2u);

  // Pages of two, by status, across the whole list.
  json paged = name;
  paged["SortBy"] = "Status";
  paged["MaxResults"] = 2;
  std::vector<std::string> seen;
  for (int page = 0; page < 5; ++page) {
    json out = Ok("ListTrainingJobsForHyperParameterTuningJob", paged);
    for (const json& s : out["TrainingJobSummaries"]) seen.push_back(s["TrainingJobStatus"].get<std::string>());
    if (!out.contains("NextToken")) break;
    paged["NextToken"] = out["NextToken"];
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"Completed", "Completed", "Failed", "InProgress", "Stopped"}));
}

// ---- Stop and Delete ----

TEST_F(TuningJobsApiTest, StopMarksAnInProgressJobStoppingAndTellsTheController) {
  Ok("CreateHyperParameterTuningJob", Request("tune"));
  clock_.now += 7000;
  Ok("StopHyperParameterTuningJob", Named("Tune"));
  EXPECT_EQ(stop_requested_, std::vector<std::string>{"tune"});
  store::TuningJobRepository repo(db_.get());
  auto record = repo.Get("tune");
  ASSERT_TRUE(record.ok());
  EXPECT_EQ(record->status, store::TuningJobStatus::kStopping);
  EXPECT_TRUE(record->state.stop_requested);
  EXPECT_EQ(record->last_modified_millis, clock_.now);
  EXPECT_EQ(Error("ValidationException", "StopHyperParameterTuningJob", Named("tune")),
            "The hyperparameter tuning job tune is Stopping; only InProgress tuning jobs can be stopped.");
  EXPECT_EQ(stop_requested_.size(), 1u);
}

TEST_F(TuningJobsApiTest, DeleteTakesOnlyJobsThatHaveEnded) {
  json request = Request("tune");
  request["Tags"] = {{{"Key", "team"}, {"Value", "ml"}}};
  json created = Ok("CreateHyperParameterTuningJob", request);
  EXPECT_EQ(Error("ValidationException", "DeleteHyperParameterTuningJob", Named("tune")),
            "The hyperparameter tuning job tune is InProgress. Only tuning jobs that have ended (Completed, Failed, "
            "Stopped) can be deleted; stop it first.");
  SetRow("tune", store::TuningJobStatus::kStopped, {Trial(1, "Stopped", 0.4)});
  Ok("DeleteHyperParameterTuningJob", Named("TUNE"));
  Error("ResourceNotFound", "DescribeHyperParameterTuningJob", Named("tune"));
  store::TagRepository tags(db_.get());
  auto listed = tags.List(created["HyperParameterTuningJobArn"].get<std::string>());
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  // The name is free again.
  Ok("CreateHyperParameterTuningJob", Request("tune"));
}

// ---- RenderTrialSummary alone ----

TEST(RenderTrialSummaryTest, WithoutAnObjectiveACompletedTrialSucceeds) {
  store::TuningJobRecord record;
  record.name = "rand";
  record.request = Request("rand", "Random");
  record.request["HyperParameterTuningJobConfig"].erase("HyperParameterTuningJobObjective");
  store::TuningTrial trial;
  trial.name = "rand-001-00000001";
  trial.status = "Completed";
  trial.objective = 3.0;  // reported, but there is no objective to show it as
  json s = RenderTrialSummary(record, trial, "us-east-1", "123456789012");
  EXPECT_EQ(s["ObjectiveStatus"], "Succeeded");
  EXPECT_FALSE(s.contains("FinalHyperParameterTuningJobObjectiveMetric"));
  trial.status = "Stopped";
  EXPECT_EQ(RenderTrialSummary(record, trial, "us-east-1", "123456789012")["ObjectiveStatus"], "Failed");
}

}  // namespace
}  // namespace kiln::api
