#include "api/processing_jobs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "api/service_model.h"
#include "api/training_jobs.h"
#include "store/test_util/temp_database.h"
#include "store/training_job_repository.h"

namespace kiln::api {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr const char* kRole = "arn:aws:iam::123456789012:role/kiln";
constexpr const char* kArnPrefix = "arn:aws:sagemaker:us-east-1:123456789012:processing-job/";

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

// What the SageMaker Python SDK's SKLearnProcessor.run sends (one code input, one data input, one
// output), with explicit AppManaged and the S3Input members the SDK always sets.
json Request(const std::string& name) {
  json request = json::parse(R"({
    "ProcessingInputs": [
      {"InputName": "input-1", "AppManaged": false,
       "S3Input": {"S3Uri": "s3://bucket/raw/", "LocalPath": "/opt/ml/processing/input",
                   "S3DataType": "S3Prefix", "S3InputMode": "File",
                   "S3DataDistributionType": "ShardedByS3Key", "S3CompressionType": "None"}},
      {"InputName": "code",
       "S3Input": {"S3Uri": "s3://bucket/code/preprocess.py", "LocalPath": "/opt/ml/processing/input/code",
                   "S3DataType": "S3Prefix"}}],
    "ProcessingOutputConfig": {"Outputs": [
      {"OutputName": "train", "AppManaged": false,
       "S3Output": {"S3Uri": "s3://bucket/out/train", "LocalPath": "/opt/ml/processing/train",
                    "S3UploadMode": "EndOfJob"}}]},
    "ProcessingResources": {"ClusterConfig": {"InstanceCount": 2, "InstanceType": "ml.m5.xlarge",
                                              "VolumeSizeInGB": 30}},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    "AppSpecification": {"ImageUri": "kiln/sklearn:1.2-1",
                         "ContainerEntrypoint": ["python3", "/opt/ml/processing/input/code/preprocess.py"],
                         "ContainerArguments": ["--split", "0.2"]},
    "Environment": {"MODE": "full"},
    "NetworkConfig": {"EnableNetworkIsolation": false},
    "ExperimentConfig": {"ExperimentName": "exp"},
    "Tags": [{"Key": "team", "Value": "ml"}]
  })");
  request["ProcessingJobName"] = name;
  request["RoleArn"] = kRole;
  return request;
}

// The smallest request the model accepts.
json Minimal(const std::string& name) {
  return {{"ProcessingJobName", name},
          {"RoleArn", kRole},
          {"AppSpecification", {{"ImageUri", "kiln/tool:1"}}},
          {"ProcessingResources",
           {{"ClusterConfig", {{"InstanceCount", 1}, {"InstanceType", "ml.m5.xlarge"}, {"VolumeSizeInGB", 1}}}}}};
}

class ProcessingJobsApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = store::testing::OpenTestDatabase(dir_.path(), /*durable=*/false);
    // ml.m5.large exists but is not offered for processing on this server.
    auto catalog =
        control::InstanceCatalog::FromJson(json{{"instance_types", {{{"type", "ml.m5.large"}, {"processing", false}}}}},
                                           &control::InstanceCatalog::BuiltIn());
    ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
    catalog_ = std::move(catalog).value();
    service_.SetModel(ServiceModel::SageMaker());
    ProcessingJobsContext ctx;
    ctx.database = db_.get();
    ctx.on_created = [this](const std::string& name) { created_.push_back(name); };
    ctx.on_stop_requested = [this](const std::string& name) { stop_requested_.push_back(name); };
    ctx.account_id = "123456789012";
    ctx.region = "us-east-1";
    ctx.clock = &clock_;
    ctx.catalog = &catalog_;
    // This node holds at most 4 x ml.m5.xlarge and never an ml.p3.16xlarge.
    ctx.check_feasible = [](const std::string& type, int count) {
      if (type == "ml.p3.16xlarge") return Status::ResourceExhausted("ml.p3.16xlarge needs 8 GPUs; this node has 0");
      if (count > 4) {
        return Status::ResourceExhausted(std::to_string(count) + " x " + type + " need more CPUs than this node has");
      }
      return Status::Ok();
    };
    RegisterProcessingJobOperations(&service_, ctx);
    // The tag operations live with the training jobs' (they resolve every kind's ARNs).
    TrainingJobsContext training;
    training.database = db_.get();
    training.account_id = "123456789012";
    training.region = "us-east-1";
    training.clock = &clock_;
    RegisterTrainingJobOperations(&service_, training);
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
  std::string Invalid(const json& request) { return Error("ValidationException", "CreateProcessingJob", request); }
  static json Named(const std::string& name) { return {{"ProcessingJobName", name}}; }
  json Describe(const std::string& name) { return Ok("DescribeProcessingJob", Named(name)); }

  // Writes what the controller would have.
  void SetRow(const std::string& name, store::ProcessingJobStatus status,
              const std::function<void(store::ProcessingJobRecord&)>& more = nullptr) {
    store::ProcessingJobRepository repo(db_.get());
    auto r = repo.Mutate(name, [&](store::ProcessingJobRecord& rec) {
      rec.status = status;
      if (store::IsTerminal(status)) rec.end_millis = clock_.now + 5000;
      if (more) more(rec);
      return Status::Ok();
    });
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }

  store::testing::TempDir dir_;
  std::unique_ptr<store::Database> db_;
  control::InstanceCatalog catalog_;
  FakeClock clock_;
  JsonService service_{"SageMaker", "sagemaker", aws::Protocol::kJson11};
  std::vector<std::string> created_, stop_requested_;
};

// ---- Create and Describe ----

TEST_F(ProcessingJobsApiTest, CreateStoresTheRequestAndDescribeEchoesIt) {
  const json request = Request("Prep-1");
  json created = Ok("CreateProcessingJob", request);
  EXPECT_EQ(created["ProcessingJobArn"], std::string(kArnPrefix) + "Prep-1");
  EXPECT_EQ(created_, std::vector<std::string>{"Prep-1"});

  json d = Describe("prep-1");  // any case
  EXPECT_EQ(d["ProcessingJobName"], "Prep-1");
  EXPECT_EQ(d["ProcessingJobArn"], created["ProcessingJobArn"]);
  EXPECT_EQ(d["ProcessingJobStatus"], "InProgress");
  EXPECT_DOUBLE_EQ(d["CreationTime"].get<double>(), 1714557600.0);
  EXPECT_DOUBLE_EQ(d["LastModifiedTime"].get<double>(), 1714557600.0);
  for (const char* member : {"AppSpecification", "ProcessingResources", "StoppingCondition", "Environment",
                             "NetworkConfig", "RoleArn", "ExperimentConfig", "ProcessingOutputConfig"}) {
    EXPECT_EQ(d[member], request[member]) << member;
  }
  // Inputs: as given, with AWS's defaults filled in where the request left them out.
  ASSERT_EQ(d["ProcessingInputs"].size(), 2u);
  EXPECT_EQ(d["ProcessingInputs"][0], request["ProcessingInputs"][0]);
  const json code = d["ProcessingInputs"][1];
  EXPECT_EQ(code["AppManaged"], false);
  EXPECT_EQ(code["S3Input"]["S3InputMode"], "File");
  EXPECT_EQ(code["S3Input"]["S3DataDistributionType"], "FullyReplicated");
  EXPECT_EQ(code["S3Input"]["S3CompressionType"], "None");
  EXPECT_EQ(code["S3Input"]["S3Uri"], "s3://bucket/code/preprocess.py");
  // Members the job does not have yet are absent, and the tags are not part of Describe.
  for (const char* member : {"ExitMessage", "FailureReason", "ProcessingStartTime", "ProcessingEndTime", "Tags"}) {
    EXPECT_FALSE(d.contains(member)) << member;
  }

  // The row: the request without Tags, with the defaults, InProgress with an empty state.
  auto row = store::ProcessingJobRepository(db_.get()).Get("Prep-1");
  ASSERT_TRUE(row.ok());
  EXPECT_FALSE(row->request.contains("Tags"));
  EXPECT_EQ(row->request["ProcessingInputs"][1]["S3Input"]["S3InputMode"], "File");
  EXPECT_EQ(row->status, store::ProcessingJobStatus::kInProgress);
  EXPECT_EQ(row->state, store::ProcessingJobState{});
}

TEST_F(ProcessingJobsApiTest, AMinimalRequestIsEnoughAndNullMembersAreAbsent) {
  json request = Minimal("bare");
  request["Environment"] = nullptr;
  request["StoppingCondition"] = nullptr;
  Ok("CreateProcessingJob", request);
  json d = Describe("bare");
  for (const char* member : {"ProcessingInputs", "ProcessingOutputConfig", "Environment", "StoppingCondition",
                             "NetworkConfig", "ExperimentConfig"}) {
    EXPECT_FALSE(d.contains(member)) << member;
  }
  EXPECT_EQ(d["AppSpecification"], request["AppSpecification"]);
  EXPECT_EQ(d["RoleArn"], kRole);
}

TEST_F(ProcessingJobsApiTest, DescribeShowsWhatTheControllerWrote) {
  Ok("CreateProcessingJob", Request("done"));
  clock_.now += 60000;
  SetRow("done", store::ProcessingJobStatus::kFailed, [&](store::ProcessingJobRecord& r) {
    r.state.start_millis = 1714557610500;
    r.state.failure_reason = "AlgorithmError: exit code 2";
    r.state.exit_message = "bad split";
    r.last_modified_millis = clock_.now;
  });
  json d = Describe("done");
  EXPECT_EQ(d["ProcessingJobStatus"], "Failed");
  EXPECT_EQ(d["FailureReason"], "AlgorithmError: exit code 2");
  EXPECT_EQ(d["ExitMessage"], "bad split");
  EXPECT_DOUBLE_EQ(d["ProcessingStartTime"].get<double>(), 1714557610.5);
  EXPECT_DOUBLE_EQ(d["ProcessingEndTime"].get<double>(), 1714557665.0);
  EXPECT_DOUBLE_EQ(d["LastModifiedTime"].get<double>(), 1714557660.0);
  EXPECT_DOUBLE_EQ(d["CreationTime"].get<double>(), 1714557600.0);
}

TEST_F(ProcessingJobsApiTest, DescribeOfAMissingJobIsAValidationException) {
  EXPECT_EQ(Error("ValidationException", "DescribeProcessingJob", Named("nope")),
            "Could not find requested job with name nope");
}

TEST_F(ProcessingJobsApiTest, ANameTakenInAnyCaseIsResourceInUse) {
  Ok("CreateProcessingJob", Minimal("Job-A"));
  std::string message = Error("ResourceInUse", "CreateProcessingJob", Minimal("JOB-a"));
  EXPECT_THAT(message, HasSubstr("Processing job names must be unique"));
  EXPECT_THAT(message, HasSubstr(std::string(kArnPrefix) + "Job-A"));
  EXPECT_EQ(created_.size(), 1u);
}

// ---- Create: what the service model checks (before the handler) ----

TEST_F(ProcessingJobsApiTest, TheServiceModelChecksShapesRangesAndLengths) {
  auto with = [](const std::string& pointer, const json& value) {
    json r = Minimal("m");
    r[json::json_pointer(pointer)] = value;
    return r;
  };
  EXPECT_THAT(Invalid(with("/ProcessingJobName", "bad_name")), HasSubstr("processingJobName"));
  EXPECT_THAT(Invalid(with("/ProcessingJobName", std::string(64, 'a'))), HasSubstr("length less than or equal to 63"));
  json no_role = Minimal("m");
  no_role.erase("RoleArn");
  EXPECT_THAT(Invalid(no_role), HasSubstr("roleArn"));
  const std::string cluster = "/ProcessingResources/ClusterConfig/";
  EXPECT_THAT(Invalid(with(cluster + "InstanceCount", 0)), HasSubstr("greater than or equal to 1"));
  EXPECT_THAT(Invalid(with(cluster + "InstanceCount", 101)), HasSubstr("less than or equal to 100"));
  EXPECT_THAT(Invalid(with(cluster + "VolumeSizeInGB", 0)), HasSubstr("greater than or equal to 1"));
  EXPECT_THAT(Invalid(with(cluster + "VolumeSizeInGB", 16385)), HasSubstr("less than or equal to 16384"));
  EXPECT_THAT(Invalid(with(cluster + "InstanceType", "ml.nope.large")), HasSubstr("enum value set"));
  EXPECT_THAT(Invalid(with("/StoppingCondition/MaxRuntimeInSeconds", 0)), HasSubstr("greater than or equal to 1"));
  EXPECT_THAT(Invalid(with("/StoppingCondition/MaxRuntimeInSeconds", 777601)),
              HasSubstr("less than or equal to 777600"));
  json environment = json::object();
  for (int i = 0; i < 101; ++i) environment["K" + std::to_string(i)] = "v";
  EXPECT_THAT(Invalid(with("/Environment", environment)), HasSubstr("length less than or equal to 100"));
  EXPECT_THAT(Invalid(with("/Environment", {{std::string(257, 'K'), "v"}})),
              HasSubstr("Map keys must satisfy constraint: [Member must have length less than or equal to 256"));
  EXPECT_THAT(Invalid(with("/Environment", {{"K", std::string(257, 'v')}})),
              HasSubstr("Map value must satisfy constraint: [Member must have length less than or equal to 256"));
  json eleven = json::array();
  for (int i = 0; i < 11; ++i) {
    eleven.push_back({{"InputName", "i" + std::to_string(i)},
                      {"S3Input",
                       {{"S3Uri", "s3://b/" + std::to_string(i)},
                        {"LocalPath", "/opt/ml/processing/i" + std::to_string(i)},
                        {"S3DataType", "S3Prefix"}}}});
  }
  EXPECT_THAT(Invalid(with("/ProcessingInputs", eleven)), HasSubstr("processingInputs"));
  json outputs = json::array();
  for (int i = 0; i < 11; ++i) {
    outputs.push_back({{"OutputName", "o" + std::to_string(i)},
                       {"S3Output",
                        {{"S3Uri", "s3://b/o"},
                         {"LocalPath", "/opt/ml/processing/o" + std::to_string(i)},
                         {"S3UploadMode", "EndOfJob"}}}});
  }
  EXPECT_THAT(Invalid(with("/ProcessingOutputConfig", {{"Outputs", outputs}})), HasSubstr("outputs"));
  json input = Request("m")["ProcessingInputs"][0];
  input["S3Input"]["S3InputMode"] = "FastFile";
  EXPECT_THAT(Invalid(with("/ProcessingInputs", json::array({input}))), HasSubstr("enum value set: [Pipe, File]"));
  EXPECT_TRUE(created_.empty());
}

// ---- Create: the cross-member rules and Kiln's own ----

class ProcessingCreateRulesTest : public ProcessingJobsApiTest {
 protected:
  // Request("r") with `edit` applied.
  std::string InvalidEdit(const std::function<void(json&)>& edit) {
    json r = Request("r");
    edit(r);
    return Invalid(r);
  }
  static json& Input(json& r, int i) { return r["ProcessingInputs"][i]; }
  static json& Output(json& r, int i) { return r["ProcessingOutputConfig"]["Outputs"][i]; }
};

TEST_F(ProcessingCreateRulesTest, InputAndOutputNamesAreUnique) {
  EXPECT_THAT(InvalidEdit([](json& r) { Input(r, 1)["InputName"] = "input-1"; }),
              HasSubstr("InputName values must be unique within ProcessingInputs; 'input-1'"));
  EXPECT_THAT(InvalidEdit([](json& r) {
                json o = Output(r, 0);
                o["S3Output"]["LocalPath"] = "/opt/ml/processing/other";
                r["ProcessingOutputConfig"]["Outputs"].push_back(o);
              }),
              HasSubstr("OutputName values must be unique within ProcessingOutputConfig.Outputs; 'train'"));
}

TEST_F(ProcessingCreateRulesTest, EachInputIsExactlyOneOfS3InputOrDatasetDefinition) {
  // (Athena's and Redshift's members are the model's to check; the handler refuses the form.)
  const json dataset = {{"LocalPath", "/opt/ml/processing/q"}, {"DataDistributionType", "FullyReplicated"}};
  EXPECT_THAT(InvalidEdit([](json& r) { Input(r, 0).erase("S3Input"); }),
              HasSubstr("ProcessingInput 'input-1' must specify exactly one of S3Input or DatasetDefinition; it "
                        "gives neither."));
  EXPECT_THAT(InvalidEdit([&](json& r) { Input(r, 0)["DatasetDefinition"] = dataset; }), HasSubstr("it gives both."));
  std::string message = InvalidEdit([&](json& r) {
    Input(r, 0).erase("S3Input");
    Input(r, 0)["DatasetDefinition"] = dataset;
  });
  EXPECT_THAT(message, HasSubstr("DatasetDefinition (Athena and Redshift queries) is not supported by Kiln"));
  EXPECT_THAT(message, HasSubstr("give S3Input instead"));
}

TEST_F(ProcessingCreateRulesTest, LocalPathsAreUnderOptMlProcessingWithoutDotDot) {
  EXPECT_THAT(InvalidEdit([](json& r) { Input(r, 0)["S3Input"]["LocalPath"] = "/data/input"; }),
              HasSubstr("ProcessingInput 'input-1': S3Input.LocalPath '/data/input' must be a path under "
                        "/opt/ml/processing/"));
  EXPECT_THAT(InvalidEdit([](json& r) { Input(r, 0)["S3Input"]["LocalPath"] = "/opt/ml/processing/"; }),
              HasSubstr("must be a path under /opt/ml/processing/"));
  EXPECT_THAT(InvalidEdit([](json& r) { Input(r, 0)["S3Input"]["LocalPath"] = "/opt/ml/processing"; }),
              HasSubstr("must be a path under /opt/ml/processing/"));
  EXPECT_THAT(InvalidEdit([](json& r) { Input(r, 0)["S3Input"]["LocalPath"] = "/opt/ml/processing/../model"; }),
              HasSubstr("must not contain '..'"));
  EXPECT_THAT(InvalidEdit([](json& r) { Input(r, 0)["S3Input"].erase("LocalPath"); }),
              HasSubstr("ProcessingInput 'input-1': S3Input.LocalPath is required"));
  EXPECT_THAT(InvalidEdit([](json& r) { Input(r, 1)["S3Input"]["LocalPath"] = "/opt/ml/processing/input/"; }),
              HasSubstr("is already the LocalPath of another input"));
  EXPECT_THAT(InvalidEdit([](json& r) { Output(r, 0)["S3Output"]["LocalPath"] = "/tmp/out"; }),
              HasSubstr("ProcessingOutput 'train': S3Output.LocalPath '/tmp/out' must be a path under "
                        "/opt/ml/processing/"));
  EXPECT_THAT(InvalidEdit([](json& r) { Output(r, 0)["S3Output"]["LocalPath"] = "/opt/ml/processing/a/../../x"; }),
              HasSubstr("must not contain '..'"));
  EXPECT_THAT(InvalidEdit([](json& r) { Output(r, 0)["S3Output"].erase("LocalPath"); }),
              HasSubstr("ProcessingOutput 'train': S3Output.LocalPath is required"));
  // A name with dots that is no ".." segment is fine.
  json r = Request("dots");
  Input(r, 0)["S3Input"]["LocalPath"] = "/opt/ml/processing/in..put";
  Ok("CreateProcessingJob", r);
}

TEST_F(ProcessingCreateRulesTest, EveryInputAndOutputIsAnS3Uri) {
  EXPECT_THAT(InvalidEdit([](json& r) { Input(r, 0)["S3Input"]["S3Uri"] = "https://bucket.example/raw"; }),
              HasSubstr("ProcessingInput 'input-1': S3Input.S3Uri 'https://bucket.example/raw' must be an s3:// "
                        "URI"));
  EXPECT_THAT(InvalidEdit([](json& r) { Output(r, 0)["S3Output"]["S3Uri"] = "https://bucket.example/out"; }),
              HasSubstr("ProcessingOutput 'train': S3Output.S3Uri 'https://bucket.example/out' must be an s3:// URI"));
  EXPECT_THAT(InvalidEdit([](json& r) { Output(r, 0).erase("S3Output"); }),
              HasSubstr("ProcessingOutput 'train': S3Output is required"));
  EXPECT_THAT(InvalidEdit([](json& r) {
                Output(r, 0)["FeatureStoreOutput"] = {{"FeatureGroupName", "fg"}};
              }),
              HasSubstr("FeatureStoreOutput is not supported by Kiln"));
}

TEST_F(ProcessingCreateRulesTest, AppManagedIsRefused) {
  EXPECT_THAT(InvalidEdit([](json& r) { Input(r, 0)["AppManaged"] = true; }),
              HasSubstr("ProcessingInput 'input-1': AppManaged true is not supported by Kiln"));
  EXPECT_THAT(InvalidEdit([](json& r) { Output(r, 0)["AppManaged"] = true; }),
              HasSubstr("ProcessingOutput 'train': AppManaged true is not supported by Kiln"));
}

TEST_F(ProcessingCreateRulesTest, GzipOnlyWithPipe) {
  EXPECT_THAT(InvalidEdit([](json& r) { Input(r, 0)["S3Input"]["S3CompressionType"] = "Gzip"; }),
              HasSubstr("S3CompressionType Gzip can only be used when S3InputMode is Pipe"));
  // File is the default mode.
  EXPECT_THAT(InvalidEdit([](json& r) { Input(r, 1)["S3Input"]["S3CompressionType"] = "Gzip"; }),
              HasSubstr("ProcessingInput 'code': S3CompressionType Gzip"));
  json r = Request("piped");
  Input(r, 0)["S3Input"]["S3CompressionType"] = "Gzip";
  Input(r, 0)["S3Input"]["S3InputMode"] = "Pipe";
  Input(r, 0)["S3Input"]["S3DataType"] = "ManifestFile";
  Input(r, 0)["S3Input"]["S3DataDistributionType"] = "FullyReplicated";
  Output(r, 0)["S3Output"]["S3UploadMode"] = "Continuous";
  Ok("CreateProcessingJob", r);
  json d = Describe("piped");
  EXPECT_EQ(d["ProcessingInputs"][0]["S3Input"]["S3InputMode"], "Pipe");
  EXPECT_EQ(d["ProcessingOutputConfig"]["Outputs"][0]["S3Output"]["S3UploadMode"], "Continuous");
}

TEST_F(ProcessingCreateRulesTest, TheInstanceTypeMustBeOfferedForProcessing) {
  std::string message =
      InvalidEdit([](json& r) { r["ProcessingResources"]["ClusterConfig"]["InstanceType"] = "ml.m5.large"; });
  EXPECT_THAT(message, HasSubstr("The instance type ml.m5.large (ProcessingResources.ClusterConfig.InstanceType) is "
                                 "not offered for processing by this Kiln server"));
}

TEST_F(ProcessingCreateRulesTest, AShapeTheNodeCannotHoldIsResourceLimitExceeded) {
  json r = Request("big");
  r["ProcessingResources"]["ClusterConfig"]["InstanceCount"] = 7;
  std::string message = Error("ResourceLimitExceeded", "CreateProcessingJob", r);
  EXPECT_THAT(message, HasSubstr("7 x ml.m5.xlarge need more CPUs"));
  EXPECT_THAT(message, HasSubstr("lower ProcessingResources.ClusterConfig.InstanceCount to at most 4"));
  r["ProcessingResources"]["ClusterConfig"]["InstanceType"] = "ml.p3.16xlarge";
  r["ProcessingResources"]["ClusterConfig"]["InstanceCount"] = 2;
  EXPECT_THAT(Error("ResourceLimitExceeded", "CreateProcessingJob", r), HasSubstr("not even one ml.p3.16xlarge fits"));
  EXPECT_TRUE(created_.empty());
  EXPECT_EQ(Error("ValidationException", "DescribeProcessingJob", Named("big")),
            "Could not find requested job with name big");
}

TEST_F(ProcessingCreateRulesTest, ReservedTagKeysAreRefused) {
  EXPECT_THAT(InvalidEdit([](json& r) {
                r["Tags"] = {{{"Key", "aws:owner"}, {"Value", "x"}}};
              }),
              HasSubstr("Tag keys starting with 'aws:' are reserved"));
}

// ---- List ----

class ProcessingListTest : public ProcessingJobsApiTest {
 protected:
  void SetUp() override {
    ProcessingJobsApiTest::SetUp();
    // Created a second apart, in the order c, A, b; statuses and end times as the controller left them.
    for (const char* name : {"c-job", "A-job", "b-job"}) {
      Ok("CreateProcessingJob", Minimal(name));
      clock_.now += 1000;
    }
    SetRow("A-job", store::ProcessingJobStatus::kFailed, [](store::ProcessingJobRecord& r) {
      r.state.failure_reason = "AlgorithmError: exit code 1";
      r.state.exit_message = "no data";
      r.last_modified_millis += 10000;
    });
    SetRow("b-job", store::ProcessingJobStatus::kCompleted);
  }
  std::vector<std::string> Names(const json& request) {
    std::vector<std::string> names;
    const json out = Ok("ListProcessingJobs", request);
    for (const json& s : out["ProcessingJobSummaries"]) names.push_back(s["ProcessingJobName"]);
    return names;
  }
};

TEST_F(ProcessingListTest, SummariesCarryStatusTimesFailureReasonAndExitMessage) {
  json out = Ok("ListProcessingJobs", json::object());
  ASSERT_EQ(out["ProcessingJobSummaries"].size(), 3u);
  EXPECT_FALSE(out.contains("NextToken"));
  const json& failed = out["ProcessingJobSummaries"][1];
  EXPECT_EQ(failed["ProcessingJobName"], "A-job");
  EXPECT_EQ(failed["ProcessingJobArn"], std::string(kArnPrefix) + "A-job");
  EXPECT_EQ(failed["ProcessingJobStatus"], "Failed");
  EXPECT_EQ(failed["FailureReason"], "AlgorithmError: exit code 1");
  EXPECT_EQ(failed["ExitMessage"], "no data");
  EXPECT_DOUBLE_EQ(failed["CreationTime"].get<double>(), 1714557601.0);
  EXPECT_DOUBLE_EQ(failed["LastModifiedTime"].get<double>(), 1714557611.0);
  EXPECT_TRUE(failed.contains("ProcessingEndTime"));
  const json& running = out["ProcessingJobSummaries"][0];
  EXPECT_EQ(running["ProcessingJobStatus"], "InProgress");
  for (const char* member : {"ProcessingEndTime", "FailureReason", "ExitMessage"}) {
    EXPECT_FALSE(running.contains(member)) << member;
  }
}

TEST_F(ProcessingListTest, SortsFiltersAndPages) {
  // Default: CreationTime, Ascending.
  EXPECT_EQ(Names(json::object()), (std::vector<std::string>{"c-job", "A-job", "b-job"}));
  EXPECT_EQ(Names({{"SortOrder", "Descending"}}), (std::vector<std::string>{"b-job", "A-job", "c-job"}));
  EXPECT_EQ(Names({{"SortBy", "Name"}}), (std::vector<std::string>{"A-job", "b-job", "c-job"}));
  EXPECT_EQ(Names({{"SortBy", "Status"}}), (std::vector<std::string>{"b-job", "A-job", "c-job"}));
  EXPECT_EQ(Names({{"StatusEquals", "Completed"}}), (std::vector<std::string>{"b-job"}));
  EXPECT_EQ(Names({{"NameContains", "A-J"}}), (std::vector<std::string>{"A-job"}));  // case-insensitive
  EXPECT_EQ(Names({{"CreationTimeAfter", 1714557600.5}}), (std::vector<std::string>{"A-job", "b-job"}));
  EXPECT_EQ(Names({{"CreationTimeBefore", 1714557601.5}}), (std::vector<std::string>{"c-job", "A-job"}));
  EXPECT_EQ(Names({{"LastModifiedTimeAfter", 1714557605}}), (std::vector<std::string>{"A-job"}));
  EXPECT_EQ(Names({{"LastModifiedTimeBefore", 1714557605}}), (std::vector<std::string>{"c-job", "b-job"}));

  // Pages of one through NextToken, bound to the filters.
  json request = {{"SortBy", "Name"}, {"MaxResults", 1}};
  std::vector<std::string> names;
  std::string token;
  for (int page = 0; page < 5; ++page) {
    json in = request;
    if (!token.empty()) in["NextToken"] = token;
    json out = Ok("ListProcessingJobs", in);
    for (const json& s : out["ProcessingJobSummaries"]) names.push_back(s["ProcessingJobName"]);
    if (!out.contains("NextToken")) break;
    token = out["NextToken"];
  }
  EXPECT_EQ(names, (std::vector<std::string>{"A-job", "b-job", "c-job"}));
  json first = Ok("ListProcessingJobs", request);
  ASSERT_TRUE(first.contains("NextToken"));
  json other_filters = {{"SortBy", "CreationTime"}, {"MaxResults", 1}, {"NextToken", first["NextToken"]}};
  EXPECT_EQ(Error("ValidationException", "ListProcessingJobs", other_filters), "The provided NextToken is invalid.");
  EXPECT_THAT(Error("ValidationException", "ListProcessingJobs", {{"MaxResults", 101}}),
              HasSubstr("less than or equal to 100"));
}

// ---- Stop and Delete ----

TEST_F(ProcessingJobsApiTest, StopMarksAnInProgressJobStoppingOnce) {
  Ok("CreateProcessingJob", Minimal("s"));
  clock_.now += 2000;
  Ok("StopProcessingJob", Named("S"));
  EXPECT_EQ(stop_requested_, std::vector<std::string>{"s"});
  auto row = store::ProcessingJobRepository(db_.get()).Get("s");
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->status, store::ProcessingJobStatus::kStopping);
  EXPECT_EQ(row->state.stop_reason, "StopRequested");
  EXPECT_EQ(row->last_modified_millis, clock_.now);
  const int64_t version = row->version;
  json d = Describe("s");
  EXPECT_EQ(d["ProcessingJobStatus"], "Stopping");
  EXPECT_FALSE(d.contains("ProcessingEndTime"));

  // Stopping again: accepted, nothing written, the controller not told twice.
  Ok("StopProcessingJob", Named("s"));
  EXPECT_EQ(stop_requested_.size(), 1u);
  EXPECT_EQ(store::ProcessingJobRepository(db_.get()).Get("s")->version, version);
}

TEST_F(ProcessingJobsApiTest, StopOfAnEndedOrMissingJobIsAValidationException) {
  Ok("CreateProcessingJob", Minimal("ended"));
  using StatusWord = std::pair<store::ProcessingJobStatus, std::string>;
  for (const auto& [status, word] : {StatusWord{store::ProcessingJobStatus::kCompleted, "Completed"},
                                     StatusWord{store::ProcessingJobStatus::kFailed, "Failed"},
                                     StatusWord{store::ProcessingJobStatus::kStopped, "Stopped"}}) {
    SetRow("ended", status);
    EXPECT_EQ(Error("ValidationException", "StopProcessingJob", Named("ended")),
              "The job status is " + word + "; only InProgress jobs can be stopped.");
  }
  EXPECT_TRUE(stop_requested_.empty());
  EXPECT_EQ(Error("ValidationException", "StopProcessingJob", Named("nope")),
            "Could not find requested job with name nope");
}

TEST_F(ProcessingJobsApiTest, DeleteOnlyEndedJobsAndTheirTags) {
  Ok("CreateProcessingJob", Request("d"));
  const std::string arn = std::string(kArnPrefix) + "d";
  std::string busy = Error("ResourceInUse", "DeleteProcessingJob", Named("d"));
  EXPECT_THAT(busy, HasSubstr("The processing job d is InProgress"));
  EXPECT_THAT(busy, HasSubstr("stop it"));
  SetRow("d", store::ProcessingJobStatus::kStopping);
  EXPECT_THAT(Error("ResourceInUse", "DeleteProcessingJob", Named("d")), HasSubstr("is Stopping"));
  SetRow("d", store::ProcessingJobStatus::kStopped);
  Ok("DeleteProcessingJob", Named("D"));
  EXPECT_EQ(Error("ValidationException", "DescribeProcessingJob", Named("d")),
            "Could not find requested job with name d");
  EXPECT_TRUE(store::TagRepository(db_.get()).List(arn)->empty());
  EXPECT_EQ(Error("ResourceNotFound", "DeleteProcessingJob", Named("d")), "Could not find requested job with name d");
  // The name is free again.
  Ok("CreateProcessingJob", Minimal("d"));
}

// ---- Tags ----

TEST_F(ProcessingJobsApiTest, TagsAreKeptByArnAndResolvedInAnyCase) {
  Ok("CreateProcessingJob", Request("Tagged"));
  const std::string arn = std::string(kArnPrefix) + "Tagged";
  EXPECT_EQ(Ok("ListTags", {{"ResourceArn", arn}})["Tags"], json::parse(R"([{"Key": "team", "Value": "ml"}])"));
  Ok("AddTags", {{"ResourceArn", arn}, {"Tags", {{{"Key", "stage"}, {"Value", "prep"}}}}});
  json tags = Ok("ListTags", {{"ResourceArn", std::string(kArnPrefix) + "tagged"}})["Tags"];  // lower-cased ARN
  EXPECT_EQ(tags.size(), 2u);
  Ok("DeleteTags", {{"ResourceArn", arn}, {"TagKeys", {"team"}}});
  EXPECT_EQ(Ok("ListTags", {{"ResourceArn", arn}})["Tags"], json::parse(R"([{"Key": "stage", "Value": "prep"}])"));
  EXPECT_EQ(Error("ValidationException", "ListTags", {{"ResourceArn", std::string(kArnPrefix) + "missing"}}),
            "Could not find resource \"" + std::string(kArnPrefix) + "missing\".");
  EXPECT_EQ(Error("ValidationException", "AddTags",
                  {{"ResourceArn", std::string(kArnPrefix) + "missing"}, {"Tags", {{{"Key", "k"}, {"Value", "v"}}}}}),
            "Could not find resource \"" + std::string(kArnPrefix) + "missing\".");
}

}  // namespace
}  // namespace kiln::api
